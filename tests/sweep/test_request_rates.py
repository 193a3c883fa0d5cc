"""Issue 40 item 1, request rates: open-loop levels of a sweep (`grid.request_rate`), each request sent at its seeded
exponential arrival time with at most `grid.max_inflight` in flight. The schedule against its known truths (seeded,
exponential with mean 1 / rate), a real llama-server sweep over two rates (one the server keeps up with, one it cannot
at a cap of 2 in flight: the arrivals check calls that level invalid), the readers on given records (the crossover in
req/s, the deploy answer keeping rates out of vLLM's per-batch-size table), and the params' errors."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from spectrial.errors import ConfigError
from spectrial.measure.bench import arrivals
from spectrial.readers.crossover import crossovers
from spectrial.readers.deploy import deployment
from spectrial.readers.render.sweep import pareto_figure
from spectrial.readers.sweep import verdict
from spectrial.record.store import load_record
from spectrial.schema import BestRecord, Manifest, PointRecord
from spectrial.sweep.params import load_sweep_params
from spectrial.sweep.run import run_sweep

REPO = Path(__file__).resolve().parents[2]


def test_the_arrival_schedule_is_seeded_and_exponential():
    a, b = arrivals(20_000, 4.0, seed=7), arrivals(20_000, 4.0, seed=7)
    assert a == b and a[0] == 0.0 and arrivals(20_000, 4.0, seed=8) != a
    gaps = np.diff(a)
    # a Poisson process of 4 req/s: gaps exponential with mean 0.25 s, so sd = mean and P(gap > mean) = 1/e
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() == pytest.approx(0.25, rel=0.05)
    assert (gaps > 0.25).mean() == pytest.approx(np.exp(-1), abs=0.02)
    assert len(arrivals(1, 4.0, 0)) == 1 and arrivals(0, 4.0, 0) == []
    with pytest.raises(ValueError, match="request rate"):
        arrivals(3, 0.0, 0)


def _params(tmp_path, **grid):
    data = yaml.safe_load((REPO / "params" / "examples" / "llamacpp-load-crossover.yaml").read_text())
    data.update(output_dir=str(tmp_path / "out"), grid={"steps": [2], **grid})
    return data


def test_rate_levels_need_an_open_loop_and_positive_rates(tmp_path):
    with pytest.raises(ConfigError, match=r"grid.max_inflight"):  # the cap defaults to the highest concurrency: 1
        load_sweep_params(data=_params(tmp_path, concurrency=[1], request_rate=[2]))
    with pytest.raises(ConfigError, match=r"grid.request_rate.*requests per second"):
        load_sweep_params(data=_params(tmp_path, request_rate=[0, 2]))
    sp = load_sweep_params(data=_params(tmp_path, concurrency=[1, 4], request_rate=[8, 2, 2]))
    assert sp.rate_levels() == [2.0, 8.0] and sp.inflight_cap() == 4
    assert [x.id for x in sp.loads()] == ["c1", "c4", "r2", "r8"]
    sp = load_sweep_params(data=_params(tmp_path, concurrency=[1], request_rate=[2], max_inflight=6))
    assert sp.trial_params().engine_config["parallel"] == 6  # llama.cpp -np follows the cap


@pytest.mark.slow
def test_a_real_open_loop_sweep_on_llama_server(tiny_params, tmp_path):
    """Two rates at a cap of 4 in flight: 2 req/s, which the tiny pair serves in ~0.1 s a request (sent on arrival:
    five arrivals within a request's time are rare), and 400 req/s, whose 8 requests arrive within ~20 ms (the last
    four wait for the cap: the level is invalid)."""
    data = _params(tmp_path, concurrency=[1], request_rate=[2, 400], max_inflight=4)
    data.update({k: tiny_params[k] for k in ("engine_bin", "port", "output_dir", "state_dir", "work_dir")},
                repeats=8, max_tokens=32)
    result = run_sweep(load_sweep_params(data=data), progress=False, raise_on_failure=False)
    m = load_record(result.run_dir)
    pts = {p.id: p for p in m.points}
    assert set(pts) == {"baseline@c1", "baseline@r2", "baseline@r400", "draft-s2@c1", "draft-s2@r2", "draft-s2@r400"}
    assert m.grid.request_rate == [2.0, 400.0] and m.grid.max_inflight == 4
    reqs = result.requests[result.requests["phase"] == "measure"]
    for pid in ("baseline@r2", "draft-s2@r2", "baseline@r400", "draft-s2@r400"):
        p, rows = pts[pid], reqs[reqs["point"] == pid].sort_values("index")
        assert p.offered_rate == float(pid.split("@r")[1]) and p.concurrency == 4
        assert len(rows) == 8 and (rows["offered_rate"] == p.offered_rate).all()
        # every arm is offered the same schedule: the level's seeded arrivals, as recorded
        seed = m.params.seed + 100_000 + round(p.offered_rate * 1000)
        assert rows["arrival_ms"].tolist() == pytest.approx([t * 1000 for t in arrivals(8, p.offered_rate, seed)],
                                                            abs=1e-3)
        sent = rows["t_start"] - rows["t_start"].iloc[0]  # the client's clock: sent when they arrived, or held
        late = sent * 1000 - rows["arrival_ms"]
        assert (late > -5).all()  # never before its arrival
        check = next(c for c in p.validity.checks if c.name == "arrivals")
        assert check.evidence["held"] == int(rows["held"].sum())
        if p.offered_rate == 2.0:
            assert check.ok is True and not rows["held"].any(), check.summary
        else:  # 8 arrivals within ~20 ms at a cap of 4: the first four went on arrival
            assert rows["held"].sum() >= 3 and check.ok is False and "did not keep up with 400 req/s" in check.summary
            assert "arrivals" in p.validity.failed
            assert p.method == "none" or p.verdict.startswith("invalid measurement (arrivals")
            held = rows[rows["held"]]
            assert (held["send_delay_ms"] > 10).all()  # a held request waited for a stream to end
    rate = next(c for c in crossovers(m) if c.axis == "request rate")
    assert [lv.offered_rate for lv in rate.levels] == [2.0, 400.0] and rate.levels[1].invalid
    assert rate.text().endswith("; invalid measurement at 400 req/s (left out)")
    assert rate.text() + "." in verdict(m)
    assert {(b.concurrency, b.offered_rate) for b in m.best} == {(1, None), (4, 2.0), (4, 400.0)}
    dep = deployment(m)
    assert [lv.offered_rate for lv in dep.rates] == [2.0, 400.0] and "invalid measurement" in dep.rates[1].why
    assert dep.rates[1].steps is None  # nothing is deployed on an invalid level
    assert "2 request rate(s) (2, 400 req/s, at most 4 in flight" in " ".join(m.plan.notes)


def _rate_sweep(engine: str) -> Manifest:
    """Concurrency 1 and three rates: s2 pays at 1 and 2 req/s and stops paying at 8 req/s."""
    levels = {None: (1.4, 1.2, 1.6), 1.0: (1.5, 1.3, 1.7), 2.0: (1.3, 1.1, 1.5), 8.0: (1.0, 0.9, 1.1)}
    points, best = [], []
    for rate, (s, lo, hi) in levels.items():
        c = 1 if rate is None else 8
        points.append(PointRecord(id=f"baseline@{rate}", method="none", status="ok", concurrency=c, offered_rate=rate,
                                  tok_s=100.0))
        points.append(PointRecord(id=f"s2@{rate}", setting="s2", method="eagle3", steps=2, topk=1, draft_tokens=3,
                                  status="ok", concurrency=c, offered_rate=rate, tok_s=100 * s, speedup=s,
                                  speedup_ci_low=lo, speedup_ci_high=hi, verdict="faster" if lo > 1 else "tied"))
        best.append(BestRecord(concurrency=c, offered_rate=rate, best="s2", steps=2, topk=1, draft_tokens=3,
                               speedup=s, speedup_ci_low=lo, speedup_ci_high=hi))
    return Manifest.model_validate({"run_id": "r", "kind": "sweep", "points": [p.model_dump() for p in points],
                                    "best": [b.model_dump() for b in best], "engine": {"name": engine},
                                    "params": {"engine": engine, "model": "/m/t", "draft": "/m/d", "method": "eagle3",
                                               "name": "s"}})


def test_the_readers_on_rate_levels():
    m = _rate_sweep("vllm")
    conc, rate = crossovers(m)
    assert (conc.axis, rate.axis) == ("concurrency", "request rate")
    assert (rate.pays_until, rate.stops_at, rate.slower_from) == (2.0, 8.0, None)
    assert rate.text() == ("s2 (real acceptance): pays at 1, 2 req/s of 1-8 req/s; stops paying at 8 req/s "
                           "(1.00x [0.90, 1.10])")
    assert crossovers(m, axis="request rate") == [rate]
    # vLLM: the per-batch-size table from the concurrency levels only; the rates beside it
    dep = deployment(m)
    assert [lv.concurrency for lv in dep.levels] == [1] and [lv.offered_rate for lv in dep.rates] == [1.0, 2.0, 8.0]
    assert dep.schedule_config["num_speculative_tokens_per_batch_size"] == [[1, 1, 2]]
    assert any("not folded into the per-batch-size table" in n for n in dep.notes)
    assert "  8 req/s: speculation off; measured 1.00x [0.90, 1.10]" in dep.text()
    # llama.cpp takes one setting: the one that pays at the most levels, rates counted
    dep = deployment(_rate_sweep("llamacpp"))
    assert dep.args[-2:] == ["--spec-draft-n-max", "2"]
    assert dep.notes == ["llama.cpp takes one setting for every load: at 8 req/s another setting (or none) was "
                         "measured best"]
    names = [t.name for t in pareto_figure(m).data]
    assert names == ["baseline", "baseline (request rates)", "s2 (real acceptance)",
                     "s2 (real acceptance, request rates)"]


def test_the_committed_rate_example_reads_as_recorded():
    """outputs/examples/llamacpp-rate-crossover (params/examples/llamacpp-rate-crossover.yaml, this VM, 2 cores,
    threads 1, a cap of 16 in flight): both depths pay at 8 and 16 req/s and not at 2 req/s (nor at concurrency 1);
    at 32 req/s the server completed ~12 req/s and half the requests waited for the cap, so that level is invalid
    for every arm and nothing is deployed on it; llama.cpp takes one setting, depth 4."""
    (run,) = [p.parent for p in (REPO / "outputs" / "examples" / "llamacpp-rate-crossover").glob("*/manifest.json")]
    m = load_record(run, settle=False)
    got = {(c.setting, c.axis): c for c in crossovers(m)}
    for s in ("s2", "s4"):
        assert got[(s, "request rate")].text() == (f"{s} (real acceptance): pays at 8, 16 req/s of 2-16 req/s; "
                                                   "invalid measurement at 32 req/s (left out)")
    for p in m.points:
        if p.offered_rate == 32.0:
            arr = next(c for c in p.validity.checks if c.name == "arrivals")
            assert arr.ok is False and arr.evidence["held"] == 16 and arr.evidence["completed_rate"] < 13
        elif p.offered_rate is not None:
            assert "arrivals" not in p.validity.failed and p.concurrency == 16
    dep = deployment(m)
    assert [(lv.offered_rate, lv.steps) for lv in dep.rates] == [(2.0, None), (8.0, 4), (16.0, 4), (32.0, None)]
    assert dep.args == ["--spec-type", "draft-simple", "--spec-draft-n-max", "4"]


@pytest.mark.slow
def test_a_ctrl_c_between_arrivals_stops_the_sweep(tiny_params, write_params, tmp_path):
    """An aimed SIGINT while the open loop waits for its next arrival (0.5 req/s: ~14 s of arrivals for 8 requests,
    after a ~1 s concurrency window): the sweep exits 130 at once, not at the schedule's end; its record says failed
    and why; its server is stopped."""
    import json
    import signal
    import subprocess
    import sys
    import time

    from spectrial.hosts.local import LocalHost

    out = tmp_path / "out"
    data = _params(tmp_path, concurrency=[1], request_rate=[0.5], max_inflight=2)
    data.update({k: tiny_params[k] for k in ("engine_bin", "port", "state_dir", "work_dir")}, output_dir=str(out),
                repeats=8, max_tokens=16)
    path = write_params(data, "rates.yaml")
    proc = subprocess.Popen([sys.executable, "-m", "spectrial.cli", "sweep", str(path), "--quiet"], cwd=REPO,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    t = time.monotonic()
    manifest = None
    while time.monotonic() - t < 120:  # the first server up (its ready step passed), then into the rate window
        manifest = next(iter(out.glob("*/manifest.json")), None) if out.exists() else None
        try:
            m = json.loads(manifest.read_text()) if manifest else {}
        except ValueError:  # caught mid-write
            m = {}
        if any(st.get("name", "").startswith("ready:") and st.get("ok") for st in m.get("steps") or []):
            break
        time.sleep(0.05)
    time.sleep(5.0)
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    rc = proc.wait(60)
    took = time.monotonic() - sent
    stderr = proc.stderr.read() if proc.stderr else ""
    assert rc in (130, -signal.SIGINT), stderr[-2000:]
    assert took < 10, f"the exit waited {took:.1f} s: for the arrival schedule?"
    assert manifest is not None
    m = json.loads(manifest.read_text())
    assert m["status"] == "failed" and "interrupted by Ctrl-C" in (m["reason"] or "")
    assert not LocalHost().port_holders(tiny_params["port"])


def test_the_committed_sglang_rate_example_holds_its_truth():
    """outputs/examples/h100-sglang-rate-crossover (params/examples/sglang-rate-crossover.yaml, real SGLang 0.5.17 on
    the lent H100, docs/DEVICE.md): the counting pair's EAGLE-3 accepts 4/3 per cycle at any depth and load, far
    below depth 3's break-even, so it is slower at every level the server kept up with (concurrency 1, 4 and 16
    req/s); at 64 and 256 req/s half of the 32 requests waited for the cap of 16 in flight for both arms: invalid,
    named, left out of the crossover and the deploy answer."""
    (run,) = [p.parent for p in (REPO / "outputs" / "examples" / "h100-sglang-rate-crossover").glob("*/manifest.json")]
    m = load_record(run, settle=False)
    assert m.engine.name == "sglang" and m.engine.version == "0.5.17" and m.status == "ok"
    for p in m.points:
        if p.method != "none":
            assert abs(p.accept_len - 4 / 3) < 0.02
        arr = next((c for c in p.validity.checks if c.name == "arrivals"), None)
        if p.offered_rate in (64.0, 256.0):
            assert arr.ok is False and arr.evidence["held"] == 16 and "arrivals" in p.validity.failed
        elif p.offered_rate is not None:
            assert arr.ok is True and arr.evidence["held"] == 0 and not p.validity.failed
    rate = next(c for c in crossovers(m) if c.axis == "request rate")
    assert rate.text() == ("s3 (real acceptance): does not pay at any measured level (4-16 req/s); slower from "
                           "4 req/s; invalid measurement at 64, 256 req/s (left out)")
    dep = deployment(m)
    assert not dep.args and dep.notes == ["speculation pays at no measured level: deploy SGLang without speculative "
                                          "flags"]
