"""Serving figures (spectrial.analysis.serving) on constructed requests whose figures are known: percentiles against
numpy, pooled per-token ITL against the old median of per-request medians, windows and rates at concurrency 1
and 4, goodput under an SLO, bootstrap CIs, the granularity verdicts, old records (the committed SGLang run)
and the requests.csv / stream.csv round trip."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spectrial.analysis.serving import (
    boot_percentiles,
    chunks,
    delivery,
    events_frame,
    from_frames,
    percentiles,
    requests_frame,
    serving_figures,
)
from spectrial.errors import ConfigError
from spectrial.readers.render.plots import latency_figure
from spectrial.schema import RequestRecord

REPO = Path(__file__).resolve().parents[2]
SGLANG_RUN = REPO / "outputs" / "examples" / "h200-sglang" / "h200-sglang-8b-sweep-083946"


def req(events: list[float], counts: list[int] | None = None, *, exact: bool = False, t_start: float = 0.0,
        tail_ms: float = 0.5, **kw: object) -> RequestRecord:
    """A successful request whose token events arrived at `events` (ms after t_start), as bench records it."""
    counts = counts or [1] * len(events)
    tokens = sum(counts)
    e2el = events[-1] + tail_ms
    return RequestRecord(**{"t_start": t_start, "t_end": t_start + e2el / 1000, "tokens": tokens,
                            "chunks": len(events), "ttft_ms": events[0], "e2el_ms": e2el,
                            "tpot_ms": (e2el - events[0]) / (tokens - 1) if tokens > 1 else None,
                            "events_ms": list(events), "event_tokens": list(counts), "event_tokens_exact": exact,
                            "arm": "a", "start": 0, **kw})


def steady(n: int, gap: float, ttft: float = 20.0, **kw: object) -> RequestRecord:
    return req([ttft + gap * i for i in range(n)], **kw)


def test_per_request_percentiles_are_numpys():
    rng = np.random.default_rng(3)
    ttfts = rng.lognormal(3, 0.5, 50)
    reqs = [steady(16, 5.0, ttft=float(t), t_start=float(i)) for i, t in enumerate(ttfts)]
    f = serving_figures(reqs, expected_tokens_per_chunk=1.0)
    assert f.requests == 50 and f.ttft_ms.n == 50
    assert [f.ttft_ms.p50, f.ttft_ms.p90, f.ttft_ms.p99] == pytest.approx(np.percentile(ttfts, [50, 90, 99]))
    assert f.ttft_ms.mean == pytest.approx(ttfts.mean())
    e2el = [r.e2el_ms for r in reqs]
    assert f.e2el_ms.p90 == pytest.approx(np.percentile(e2el, 90))
    assert f.tpot_ms.p50 == pytest.approx(np.percentile([r.tpot_ms for r in reqs], 50))


def test_pooled_itl_per_token_is_not_a_median_of_medians():
    """Two requests stream a token every 5.5 ms, two deliver them in pairs (0.014 ms apart, 11 ms between
    pairs): the old figure, the median of per-request median gaps, says ~2.8 ms; per token it is 5.5 ms."""
    normal = [steady(64, 5.5, t_start=i) for i in range(2)]
    pairs = [req([20 + 11 * (k // 2) + (0.014 if k % 2 else 0) for k in range(64)], t_start=2 + i)
             for i in range(2)]
    reqs = normal + pairs
    old = statistics.median(statistics.median(np.diff(r.events_ms)) for r in reqs)
    assert old < 3.0
    f = serving_figures(reqs, expected_tokens_per_chunk=1.0)
    assert f.itl_ms.p50 == pytest.approx(5.5, abs=0.01) and f.itl_ms.p90 == pytest.approx(5.5, abs=0.01)
    assert f.itl_ms.n == 2 * 63 + 2 * 62  # a bunched request's first pair is its first chunk
    assert f.itl_chunk_ms.p90 == pytest.approx(11.0, abs=0.02)
    assert f.bunched == 2 and f.stalled == 0 and f.granularity == "fine"
    assert [delivery(r, 1.0) for r in reqs] == ["stream", "stream", "bunched", "bunched"]
    assert [n for _, n in chunks(pairs[0])] == [2] * 32
    assert any("2 of 4 requests bunched" in n for n in f.notes)


def test_pooled_itl_matches_numpy_on_exact_counts():
    """Exact per-event counts (vLLM continuous usage): a chunk g ms after the previous one with k tokens gives
    k values g / k."""
    rng = np.random.default_rng(5)
    reqs, expect = [], []
    for i in range(12):
        counts = [1, *rng.integers(1, 5, 30).tolist()]
        gaps = rng.uniform(8, 30, 30)
        events = (25 + np.concatenate([[0], np.cumsum(gaps)])).tolist()
        reqs.append(req(events, counts, exact=True, t_start=i))
        expect += np.repeat(gaps / counts[1:], counts[1:]).tolist()
    f = serving_figures(reqs, expected_tokens_per_chunk=2.5)
    assert f.itl_ms.n == len(expect)
    assert [f.itl_ms.p50, f.itl_ms.p90, f.itl_ms.p99] == pytest.approx(np.percentile(expect, [50, 90, 99]))
    assert f.itl_ms.mean == pytest.approx(np.mean(expect))
    assert f.tokens_per_chunk == pytest.approx(sum(sum(r.event_tokens[1:]) for r in reqs) / (12 * 30))


def test_goodput_counts_the_requests_meeting_every_slo():
    rng = np.random.default_rng(9)
    reqs = [steady(32, float(g), ttft=float(t), t_start=10.0 * i)
            for i, (t, g) in enumerate(zip(rng.uniform(10, 200, 40), rng.uniform(3, 12, 40), strict=True))]
    slo = {"ttft_ms": 100.0, "tpot_ms": 8.0}
    good = sum(r.ttft_ms <= 100 and r.tpot_ms <= 8 for r in reqs)
    assert 0 < good < sum(r.ttft_ms <= 100 for r in reqs) < 40  # the constructed data straddles both limits
    f = serving_figures(reqs, expected_tokens_per_chunk=1.0, slo=slo)
    assert f.good_requests == good and f.goodput_fraction == pytest.approx(good / 40)
    span = reqs[-1].t_end - reqs[0].t_start  # one window: the requests of start 0
    assert f.duration_s == pytest.approx(span) and f.goodput == pytest.approx(good / span)
    assert f.achieved_concurrency == pytest.approx(sum(r.e2el_ms for r in reqs) / 1000 / span)
    assert f.slo == slo
    none = serving_figures(reqs, expected_tokens_per_chunk=1.0)
    assert none.goodput is None and none.good_requests is None
    assert "set slo: {ttft_ms, tpot_ms} to compute goodput" in none.notes
    with pytest.raises(ConfigError) as e:
        serving_figures(reqs, expected_tokens_per_chunk=1.0, slo={"itl_ms": 5})
    assert e.value.parameter == "slo"


def test_windows_rates_and_littles_law_at_concurrency_1_and_4():
    c1 = [req([100.0 + k for k in range(100)], tail_ms=1000 - 199, t_start=float(i), concurrency=1, start=0)
          for i in range(4)]  # four 1-s requests back to back
    assert all(r.e2el_ms == pytest.approx(1000) for r in c1)
    f1 = serving_figures(c1, expected_tokens_per_chunk=1.0, n_boot=0)
    assert f1.duration_s == pytest.approx(4.0) and f1.request_rate == pytest.approx(1.0)
    assert f1.output_tok_s == pytest.approx(100.0) and f1.achieved_concurrency == pytest.approx(1.0)
    assert f1.requested_concurrency == 1
    # four streams at a time, two waves of 2-s requests, 10 s later on the same clock (another start)
    c4 = [req([50.0 + 10 * k for k in range(100)], tail_ms=2000 - 1040, t_start=10 + wave * 2 + 0.1 * i,
              concurrency=4, start=1) for wave in range(2) for i in range(4)]
    f4 = serving_figures(c4, expected_tokens_per_chunk=1.0, n_boot=0)
    assert f4.duration_s == pytest.approx(4.3) and f4.request_rate == pytest.approx(8 / 4.3)
    assert f4.output_tok_s == pytest.approx(800 / 4.3) and f4.achieved_concurrency == pytest.approx(16 / 4.3)
    assert f4.requested_concurrency == 4
    both = serving_figures(c1 + c4, expected_tokens_per_chunk=1.0, concurrency=4, n_boot=0)
    assert both.duration_s == pytest.approx(8.3)  # the idle time between the starts is no window's
    assert both.request_rate == pytest.approx(12 / 8.3) and both.requested_concurrency == 4
    failed = c4[0].model_copy(update={"error": "HTTP 500", "t_end": c4[0].t_start + 5.0})
    f = serving_figures([failed, *c4[1:]], expected_tokens_per_chunk=1.0, n_boot=0)
    assert f.requests == 7 and f.duration_s == pytest.approx(5.0)  # its time still counts in the window


def test_bootstrap_ci_contains_the_estimate_and_narrows_with_more_requests():
    rng = np.random.default_rng(11)
    small = percentiles(rng.lognormal(3, 0.4, 20).tolist(), seed=1)
    large = percentiles(rng.lognormal(3, 0.4, 800).tolist(), seed=1)
    for p in (small, large):
        for q in ("p50", "p90", "p99"):
            low, high = getattr(p, f"{q}_ci")
            assert low <= getattr(p, q) <= high
        assert p.ci_level == 0.95
    width = lambda p, q: getattr(p, f"{q}_ci")[1] - getattr(p, f"{q}_ci")[0]  # noqa: E731
    assert width(large, "p50") < width(small, "p50") / 3 and width(large, "p90") < width(small, "p90") / 2
    assert percentiles([1.0, 2.0, 3.0], seed=4) == percentiles([1.0, 2.0, 3.0], seed=4)  # seeded
    assert percentiles([5.0]).p50_ci is None and percentiles([]).n == 0


def test_bootstrap_percentiles_are_numpys_on_each_resample():
    """Pooled values with repetitions, resampled by group: each replicate equals numpy's percentile of the data
    it stands for (values repeated weight x group count times), for both the one-stage and two-stage paths."""
    rng = np.random.default_rng(2)
    for m in (300, 6000):
        values = rng.gamma(2, 3, m).round(2)  # ties included
        weights = rng.integers(0, 4, m)
        groups = rng.integers(0, 40, m)
        counts = rng.multinomial(40, [1 / 40] * 40, size=60).astype(float)
        reps = boot_percentiles(values, weights, groups, counts)
        for b in range(60):
            data = np.repeat(values, weights * counts[b, groups].astype(int))
            if data.size:
                assert reps[b] == pytest.approx(np.percentile(data, [50, 90, 99]))
            else:
                assert np.isnan(reps[b]).all()


def test_input_records_are_not_changed():
    reqs = [steady(20, 5.0, t_start=i) for i in range(3)] + [req([10.0, 10.01, 10.02, 30.0], t_start=5)]
    before = [r.model_dump() for r in reqs]
    serving_figures(reqs, expected_tokens_per_chunk=1.0, slo={"e2el_ms": 200})
    [chunks(r) for r in reqs], [delivery(r, 1.0) for r in reqs]
    latency_figure({"a": reqs})
    events_frame(reqs), requests_frame(reqs)
    assert [r.model_dump() for r in reqs] == before


def test_a_coarse_stream_withholds_itl_and_a_late_first_chunk_withholds_ttft():
    # 2 chunks for 256 tokens with exact counts: the first carried 200
    reqs = [req([500.0, 800.0], [200, 56], exact=True, t_start=i) for i in range(4)]
    f = serving_figures(reqs, expected_tokens_per_chunk=3.0)
    assert f.granularity == "coarse" and f.itl_ms is None and f.itl_chunk_ms is None
    assert f.ttft_ms is None and f.tpot_ms is None and f.e2el_ms is not None
    assert any(n.startswith("streaming too coarse: 2 chunks per request for 256 tokens (accept length 3.00 "
                            "gives ~85)") for n in f.notes)
    assert any("TTFT and TPOT withheld: the first chunk carried 200 tokens" in n for n in f.notes)
    assert serving_figures(reqs, expected_tokens_per_chunk=3.0, slo={"ttft_ms": 1000}).goodput is None
    # the same timing with a one-token first chunk keeps TTFT (it is the first token's)
    kept = serving_figures([req([500.0, 800.0], [1, 255], exact=True, t_start=i) for i in range(4)],
                           expected_tokens_per_chunk=3.0)
    assert kept.granularity == "coarse" and kept.ttft_ms.p50 == pytest.approx(500.0)


def test_old_records_without_events_use_requests_csv_columns():
    old = [RequestRecord(t_start=float(i), t_end=i + 1.3, tokens=64, chunks=64, ttft_ms=40.0 + i,
                         itl_ms_median=20.0, arm="a", start=0) for i in range(5)]
    f = serving_figures(old, expected_tokens_per_chunk=1.0)
    assert f.granularity == "unknown" and f.itl_ms is None and f.itl_chunk_ms is None
    assert f.ttft_ms.p50 == pytest.approx(42.0) and f.e2el_ms.p50 == pytest.approx(1300.0)
    assert f.tpot_ms.p50 == pytest.approx((1300 - 42) / 63)
    assert any("no per-event timings" in n for n in f.notes)
    assert f.chunks_per_request == 64


def test_the_committed_sglang_run_comes_out_coarse():
    """The real SGLang sweep (forced acceptance): 2 chunks per request for 256 tokens on the EAGLE-3 points."""
    df = pd.read_csv(SGLANG_RUN / "requests.csv")
    accept = {p["id"]: p["accept_len"] for p in json.loads((SGLANG_RUN / "manifest.json").read_text())["points"]}
    recs = from_frames(df)
    assert len(recs) == len(df) and all(r.events_ms is None for r in recs)
    by = {p: [r for r in recs if r.point == p] for p in accept}
    base = serving_figures(by["baseline@c1"], expected_tokens_per_chunk=accept["baseline@c1"])
    assert base.granularity == "unknown" and base.chunks_per_request == 256 and base.bunched == 0
    for point in ("eagle3-s1-a0.9@c1", "eagle3-s3-a0.9@c1", "eagle3-s6-a0.9@c1"):
        f = serving_figures(by[point], expected_tokens_per_chunk=accept[point])
        assert f.granularity == "coarse" and f.itl_ms is None and f.bunched == len(by[point]) == 3
        assert f.chunks_per_request == 2 and f.ttft_ms is not None and f.stalled == 0
        assert f.request_rate == pytest.approx(3 / sum(r.t_end - r.t_start for r in by[point]), rel=0.01)
    f = serving_figures(by["eagle3-s3-a0.9@c1"], expected_tokens_per_chunk=accept["eagle3-s3-a0.9@c1"])
    assert "streaming too coarse: 2 chunks per request for 256 tokens (accept length 3.46 gives ~74): ITL " \
           "measures delivery, not decoding" in f.notes


def test_stalled_majority_withholds_ttft():
    stalled = [req([600.0 + 0.02 * k for k in range(32)], t_start=i) for i in range(3)]
    f = serving_figures([*stalled, steady(32, 5.0, t_start=9)], expected_tokens_per_chunk=1.0)
    assert f.stalled == 3 and f.granularity == "coarse" and f.ttft_ms is None
    assert [len(chunks(r)) for r in stalled] == [1, 1, 1]


def test_requests_and_stream_tables_round_trip(tmp_path):
    reqs = [steady(5, 3.0, t_start=i, restart=0, concurrency=2, index=i, point="p@c2") for i in range(3)]
    reqs += [req([10.0, 20.0], [1, 3], exact=True, t_start=5, index=0, start=1, restart=1, server_predicted_n=4)]
    reqs += [RequestRecord(index=9, error="HTTP 500: boom", arm="a", start=1)]
    requests_frame(reqs).to_csv(tmp_path / "requests.csv", index=False)
    events_frame(reqs).to_csv(tmp_path / "stream.csv", index=False)
    rdf, edf = pd.read_csv(tmp_path / "requests.csv"), pd.read_csv(tmp_path / "stream.csv")
    assert "events_ms" not in rdf.columns and "event_tokens" not in rdf.columns
    assert len(edf) == 3 * 5 + 2 and list(edf.columns[-3:]) == ["event", "t_ms", "tokens"]
    back = from_frames(rdf, edf)
    for a, b in zip(reqs, back, strict=True):
        assert b.events_ms == (pytest.approx(a.events_ms) if a.events_ms else None)
        assert b.event_tokens == a.event_tokens and b.error == a.error and b.tokens == a.tokens
    assert back[3].get("server_predicted_n") == 4 and back[3].event_tokens_exact is True
    assert serving_figures(back, expected_tokens_per_chunk=1.0, n_boot=50) == \
        serving_figures(reqs, expected_tokens_per_chunk=1.0, n_boot=50)
    assert all(r.events_ms is None for r in from_frames(rdf))  # an old folder: no stream.csv


def test_latency_figure_has_an_arm_per_colour_units_and_stable_values():
    fine = [steady(40, 5.0 + 0.37 * i, t_start=i) for i in range(6)]
    coarse = [req([50.0, 400.0], [1, 255], exact=True, t_start=i) for i in range(6)]
    fig = latency_figure({"baseline": fine, "sglang": coarse},
                         expected_tokens_per_chunk={"baseline": 1.0, "sglang": 3.0})
    names = [(t.name, t.xaxis) for t in fig.data]
    assert ("baseline", "x3") in names and ("sglang", "x3") not in names  # coarse: no ITL curve
    assert [t.name for t in fig.data if t.showlegend] == ["baseline", "sglang"]
    assert len({t.line.color for t in fig.data if t.name == "baseline"}) == 1
    assert all("ms" in fig.layout[f"xaxis{i if i > 1 else ''}"].title.text for i in range(1, 5))
    xs = [x for t in fig.data for x in t.x]
    assert xs and all(round(x, 4) == x for x in xs)
    itl = next(t for t in fig.data if t.name == "baseline" and t.xaxis == "x3")
    assert itl.y[50] == 50 and itl.x[50] == pytest.approx(
        np.percentile([g for r in fine for g in np.diff(r.events_ms)], 50), abs=1e-4)


def test_engine_figures_are_declared_fields_that_survive_requests_csv(tmp_path: Path) -> None:
    """The engine's per-request figures are typed `server_*` fields: only those reported become columns (after
    the client's), and they read back as the same numbers with their types."""
    from spectrial.schema import ServerRequestStats

    reqs = [RequestRecord(index=i, tokens=64, arm="a", **ServerRequestStats(
        server_predicted_n=64, server_spec_verify_ct=20.0 + i).fields()) for i in range(3)]
    reqs.append(RequestRecord(index=3, tokens=64, arm="a"))  # one request without the engine's figures
    frame = requests_frame(reqs)
    assert list(frame.columns)[-2:] == ["server_predicted_n", "server_spec_verify_ct"]
    assert "server_draft_n" not in frame.columns  # nobody reported it: no empty column
    frame.to_csv(tmp_path / "requests.csv", index=False)
    back = from_frames(pd.read_csv(tmp_path / "requests.csv"))
    assert [r.server_spec_verify_ct for r in back] == [20.0, 21.0, 22.0, None]
    assert back[0].server_predicted_n == 64 and isinstance(back[0].server_predicted_n, int)
    with pytest.raises(ValueError, match="server_spec_verify_count"):
        ServerRequestStats(server_spec_verify_count=3)  # a misspelt figure is refused, not kept as an extra


def test_a_damaged_token_count_is_not_spread_over_the_events() -> None:
    """A requests.csv whose tokens column was damaged to 10^23 (found by tests/record/test_fuzz_loaders.py under
    pytest-xdist): the events keep their own counts instead of an overflow in the spread."""
    from spectrial.analysis.serving import event_counts

    r = RequestRecord(tokens=10**23, events_ms=[1.0, 2.0, 3.0], event_tokens=[1, 1, 1], event_tokens_exact=False)
    assert event_counts(r).tolist() == [1, 1, 1]
    r = RequestRecord(tokens=7, events_ms=[1.0, 2.0, 3.0], event_tokens=[1, 1, 1], event_tokens_exact=False)
    assert event_counts(r).tolist() == [1, 3, 3]
    # and a stream.csv event count damaged to 10^23 (the fuzzer again): capped at MAX_TOKENS, not an OverflowError
    r = RequestRecord(tokens=3, events_ms=[1.0, 2.0, 3.0], event_tokens=[10**23, 1, -5], event_tokens_exact=True)
    assert event_counts(r).tolist() == [2**40, 1, 0]
