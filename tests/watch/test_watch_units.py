"""Fast checks of the watch's parts: the change detector on synthetic series of known truth, the interval
arithmetic (deltas, restart, gap), the engines' readers of one snapshot, and the watch's state machine against a
small local HTTP server that serves Prometheus text we control (a labelled stand-in for an engine: the real
servers are in tests/watch/test_watch.py)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from spectrial.cli.watch import _draw
from spectrial.engines import llamacpp, sglang, vllm
from spectrial.schema import CounterTotals
from spectrial.watch import changes, sampler
from spectrial.watch.record import Watch, WatchOptions


# --- the change detector -------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(20))
def test_a_step_is_found_at_its_index(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(30, 200))
    k = int(rng.integers(8, n - 8))
    x = 2.0 + 0.1 * rng.standard_normal(n)
    x[k:] -= 0.5  # a step of 5 sigma
    found = changes.find_changes(x)
    assert len(found) == 1 and abs(found[0].index - k) <= 1, (k, found)
    c = found[0]
    assert c.before_mean == pytest.approx(2.0, abs=0.1) and c.after_mean == pytest.approx(1.5, abs=0.1)
    assert c.relative_change == pytest.approx(-0.25, abs=0.06)


def test_pure_noise_yields_no_change():
    false = sum(bool(changes.find_changes(5 + np.random.default_rng(s).standard_normal(int(50 + 5 * s))))
                for s in range(50))
    assert false <= 1, f"{false} of 50 noise series had a change"
    assert changes.find_changes([3.0] * 40) == []  # no noise at all: the floor keeps it quiet
    assert changes.find_changes([1.0, 2.0, 3.0]) == []  # too short to say
    steady = [60.0] * 20 + [60.2] * 20  # granularity of a steady series (+0.3 %): below the 1 % noise floor
    assert changes.find_changes(steady) == []
    found = changes.find_changes([60.0] * 20 + [54.0] * 20)  # -10 % in the same steady series
    assert [(c.index, round(c.relative_change, 3)) for c in found] == [(20, -0.1)]


def beat(seed: int, n: int = 1800, rate: float = 130.0, quantum: int = 32, wall: float = 2.0, drop_at: int | None = None,
         rate_after: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A steady server watched every `wall` s whose token counter moves `quantum` tokens at a time (issue 42: 64-token
    requests over 2 s gave 112/128/144/160 tok/s): the true rate wanders by +-2 % and the counter's phase drifts
    against the interval, so the counts run at one level, then another (a beat). Per interval: (tokens, wall_s)."""
    rng = np.random.default_rng(seed)
    walls = wall + 0.005 * rng.standard_normal(n)
    rates = rate * (1 + 0.02 * np.sin(np.arange(n) / rng.uniform(20, 80)))
    if drop_at is not None and rate_after is not None:
        rates[drop_at:] *= rate_after / rate
    cum = rng.uniform(0, quantum) + np.concatenate([[0.0], np.cumsum(rates * walls)])
    return np.diff(quantum * np.floor(cum / quantum)), walls


def test_a_steady_servers_whole_counts_give_no_change_over_an_hour(monkeypatch):
    """Issue 42: an hour of 2 s intervals (1800) of a steady server whose counts come in whole quanta, 20 times:
    no change. The detector before (2-interval segments, no resolution, no minimum effect) found thousands."""
    series = [beat(seed) for seed in range(20)]
    assert sum(len(changes.find_changes(c / w, changes.resolution(c, w))) for c, w in series) == 0
    monkeypatch.setattr(changes, "MIN_SIZE", 2)
    monkeypatch.setattr(changes, "MIN_EFFECT_REL", 0.0)
    assert sum(len(changes.find_changes(c / w)) for c, w in series) > 100  # what the watch reported before


def test_a_real_change_in_whole_counts_is_found_where_it_is():
    for seed in range(10):
        c, w = beat(seed, n=600, drop_at=300, rate_after=100.0)
        found = changes.find_changes(c / w, changes.resolution(c, w))
        assert len(found) == 1 and abs(found[0].index - 300) <= 1, found
        assert found[0].relative_change == pytest.approx(100 / 130 - 1, abs=0.03)


def test_resolution_is_the_counts_quantum_over_the_interval():
    assert changes.resolution([256, 288, 320, 224], [2.0, 2.0, 2.1, 1.9]) == pytest.approx(16.0)
    assert changes.resolution([257, 288, None, 0], [2.0, 2.0, 2.0, 2.0]) == pytest.approx(0.5)  # gcd 1 (None, 0 left out)
    assert changes.resolution([10.5, 12.0], [1.0, 1.0]) == pytest.approx(1.0)  # not whole counts: one unit
    assert changes.resolution([], []) == 0.0


def test_a_change_below_the_minimum_effect_or_resolution_is_not_one():
    quiet = [60.0] * 30 + [58.5] * 30  # -2.5 %: below MIN_EFFECT_REL, though the series has no noise at all
    assert changes.find_changes(quiet) == []
    found = changes.find_changes([60.0] * 30 + [56.0] * 30)  # -6.7 %: a change
    assert [c.index for c in found] == [30]
    assert changes.find_changes([60.0] * 30 + [56.0] * 30, step=8.0) == []  # less than one step of the counts


def test_noise_estimate_ignores_the_step():
    rng = np.random.default_rng(1)
    x = 0.2 * rng.standard_normal(400)
    x[200:] += 10
    assert changes.noise_sigma(x) == pytest.approx(0.2, rel=0.15)


# --- one interval's arithmetic ---------------------------------------------------------------------------------
def sample(t: float, **kw) -> sampler.Sample:
    return sampler.Sample(CounterTotals(engine="vllm", **kw), at=f"2026-01-01T00:00:{int(t):02d}.000+00:00", t=t,
                          read_ms=1.0)


def test_deltas_accept_length_and_per_position():
    a = sample(0, verify_steps=10, drafted=30, accepted=12, tokens=100, accepted_per_pos={"0": 8, "1": 3, "2": 1})
    b = sample(2, verify_steps=40, drafted=120, accepted=42, tokens=180, accepted_per_pos={"0": 26, "1": 12, "2": 4},
               requests_running=3, requests_waiting=1)
    iv = sampler.measure(0, a, b, t0=0)
    assert (iv.verify_steps, iv.drafted, iv.accepted, iv.tokens) == (30, 90, 30, 80)
    assert iv.accept_len == 2.0 and iv.per_position == pytest.approx([18 / 30, 9 / 30, 3 / 30])
    assert iv.tok_s == 40.0 and (iv.requests_running, iv.requests_waiting) == (3, 1) and not iv.reset


@pytest.mark.parametrize("after", [dict(verify_steps=5, drafted=15, accepted=2, tokens=20),  # counters went down
                                   dict(verify_steps=50, drafted=150, accepted=60, tokens=500, start_time_s=2.0)])
def test_a_restart_is_a_reset_without_negative_counts(after):
    a = sample(0, verify_steps=10, drafted=30, accepted=12, tokens=100, start_time_s=1.0)
    iv = sampler.measure(3, a, sample(1, **after), t0=0)
    assert iv.reset and iv.index == 3
    assert iv.verify_steps is iv.accepted is iv.tokens is iv.accept_len is iv.tok_s is None


def test_an_interval_across_a_gap_has_no_counts():
    a = sample(0, verify_steps=10, accepted=5, tokens=50)
    iv = sampler.measure(1, a, sample(9, verify_steps=20, accepted=9, tokens=80), t0=0, after_gap=True)
    assert iv.after_gap and not iv.reset and iv.tokens is None and iv.wall_s == 9


def test_no_speculation_counters_is_throughput_only():
    iv = sampler.measure(0, sample(0, tokens=10), sample(1, tokens=60), t0=0)
    assert iv.accept_len is None and iv.verify_steps is None and iv.tok_s == 50
    assert not CounterTotals(engine="vllm", tokens=3).has_spec


# --- the engines' readers of one snapshot ---------------------------------------------------------------------
def test_engine_readers_and_detection():
    snap = {"llamacpp:spec_decode_num_drafts_total": 10, "llamacpp:spec_decode_num_draft_tokens_total": 20,
            "llamacpp:spec_decode_num_accepted_tokens_total": 7, "llamacpp:tokens_predicted_total": 30,
            "llamacpp:requests_processing": 1, "llamacpp:requests_deferred": 2}
    t = llamacpp.watch_totals(snap)
    assert (t.verify_steps, t.drafted, t.accepted, t.tokens, t.requests_running, t.requests_waiting) == (10, 20, 7, 30, 1, 2)
    assert sampler.detect_engine(snap) == "llamacpp"
    v = {"vllm:spec_decode_num_drafts_total{engine=0,model_name=m}": 9,
         "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=0,model_name=m,position=0}": 3,
         "vllm:spec_decode_num_accepted_tokens_per_pos_total{engine=0,model_name=m,position=1}": 1,
         "vllm:generation_tokens_total{engine=0,model_name=m}": 40, "vllm:num_requests_running{engine=0,model_name=m}": 2,
         "process_start_time_seconds": 1.7e9}
    t = vllm.watch_totals(v)
    assert (t.verify_steps, t.accepted_per_pos, t.tokens, t.requests_running, t.start_time_s) == (
        9, {"0": 3, "1": 1}, 40, 2, 1.7e9)
    assert sampler.detect_engine(v) == "vllm"
    s = sglang.watch_totals({"sglang:spec_verify_calls_total": 10, "sglang:generation_tokens_total": 25,
                             "sglang:num_requests_total": 2, "sglang:num_running_reqs": 1})
    assert (s.verify_steps, s.accepted, s.tokens, s.requests_running) == (10, 13, 25, 1)
    assert sampler.detect_engine({"process_cpu_seconds_total": 1.0}) is None
    assert sampler.prefixes()["llamacpp"] == llamacpp.METRIC_PREFIX and vllm.PREFIX.startswith(sampler.prefixes()["vllm"])


# --- the state machine: gap, resume, reset ----------------------------------------------------------------------
class _Metrics(BaseHTTPRequestHandler):
    text = ""

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = type(self).text.encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _serve(port: int) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer(("127.0.0.1", port), _Metrics)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _text(drafts: int, accepted: int, tokens: int) -> str:
    return (f"llamacpp:spec_decode_num_drafts_total {drafts}\nllamacpp:spec_decode_num_draft_tokens_total {2 * drafts}\n"
            f"llamacpp:spec_decode_num_accepted_tokens_total {accepted}\nllamacpp:tokens_predicted_total {tokens}\n"
            "llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n")


def test_gap_resume_and_reset(tmp_path: Path, port: int):
    _Metrics.text = _text(10, 10, 30)
    srv = _serve(port)
    w = Watch(WatchOptions(url=f"127.0.0.1:{port}", interval_s=1, output_dir=str(tmp_path)), progress_on=False,
              draw=_draw)
    w.check()
    w.open()
    _Metrics.text = _text(20, 25, 65)
    iv = w.step()
    assert iv is not None and (iv.verify_steps, iv.accepted, iv.tokens, iv.accept_len) == (10, 15, 35, 2.5)
    srv.shutdown()
    srv.server_close()
    assert w.step() is None and w.step() is None  # gone: one gap, two failed reads
    assert len(w.watch.gaps) == 1 and w.watch.gaps[0].polls == 2 and w.watch.gaps[0].end is None
    _Metrics.text = _text(3, 2, 8)  # back, restarted: lower counters
    srv = _serve(port)
    try:
        iv = w.step()
        assert iv is not None and iv.reset and iv.after_gap and iv.tokens is None and w.watch.resets == 1
        assert w.watch.gaps[0].end is not None
        _Metrics.text = _text(5, 4, 14)
        iv = w.step()
        assert iv is not None and not iv.reset and (iv.verify_steps, iv.accepted, iv.tokens) == (2, 2, 6)
        w.finish("ok")
    finally:
        srv.shutdown()
        srv.server_close()
    m = w.record.manifest
    assert (m.kind, m.controlled, m.status) == ("watch", False, "ok")
    assert (w.record.dir / "intervals.csv").read_text().count("\n") == 4  # header + 3 intervals
    assert (w.record.dir / "watch.html").is_file()
