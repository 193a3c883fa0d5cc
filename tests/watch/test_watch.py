"""`spectrial watch` against real servers it did not start: a llama-server (and a vLLM CPU server) started here,
in their own process groups, by the test; the watch runs as its own process.

The truth: the server's own counters, read by the test before the load and after it (the server idle in
between), equal the sum of the watch's per-interval deltas exactly. The tiny draft-simple predicts the tiny
target well under greedy decoding (accept length ~2.6 at 2 steps) and badly at temperature 1.5 (~1.05),
so switching the load from one to the other is a change the watch must find, near the switch, downward.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import prometheus_server
import pytest

from spectrial.measure import metrics
from spectrial.watch import changes

pytestmark = pytest.mark.slow
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]
ENV = {**os.environ, "SPECTRIAL_PROGRESS": "line"}
SPEC_COUNTERS = ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total", "tokens_predicted_total")


def start_llama(binary: Path, models: Any, port: int, log: Path, metrics_on: bool = True) -> subprocess.Popen[bytes]:
    """A llama-server of the tiny target + tiny draft-simple (2 draft steps), in its own process group."""
    argv = [str(binary), "-m", str(models.target), "--host", "127.0.0.1", "--port", str(port), "--no-webui",
            "-t", "1", "-c", "1024", "-np", "1", "--spec-type", "draft-simple", "--spec-draft-n-max", "2",
            "-md", str(models.draft_simple), *(["--metrics"] if metrics_on else [])]
    proc = subprocess.Popen(argv, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"llama-server exited {proc.returncode}: {log.read_text()[-2000:]}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop(proc)
    raise AssertionError(f"llama-server not ready in 60 s: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the test's own server: its process group, by pgid."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def totals(url: str) -> dict[str, float]:
    with httpx.Client(timeout=10) as c:
        snap = metrics.snapshot(c, url)
    return {k: metrics.total(snap, "llamacpp:" + k) or 0.0 for k in SPEC_COUNTERS}


def load(url: str, seconds: float, temperature: float) -> int:
    """Sequential completions for `seconds` at `temperature`; returns how many."""
    n, t = 0, time.monotonic()
    with httpx.Client(timeout=60) as c:
        while time.monotonic() - t < seconds:
            r = c.post(f"{url}/completion", json={"prompt": f"The quick brown fox {n}", "n_predict": 48,
                                                   "temperature": temperature, "seed": n})
            assert r.status_code == 200, r.text
            n += 1
    return n


def start_watch(url: str, out: Path, run_id: str, *extra: str) -> subprocess.Popen[str]:
    interval = () if "--interval" in extra else ("--interval", "1")
    return subprocess.Popen([*SPECTRIAL, "watch", url, *interval, "--output-dir", str(out), "--run-id", run_id,
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
                            start_new_session=True)


def wait_for_manifest(path: Path, proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        if path.is_file():
            data = json.loads(path.read_text())
            if data.get("watch"):
                return data
        time.sleep(0.1)
    raise AssertionError(f"no record at {path}")


def test_watch_finds_the_change_records_the_gap_and_the_restart(llama_server, tiny_models, port, tmp_path):
    url, out = f"http://127.0.0.1:{port}", tmp_path / "out"
    server = start_llama(llama_server, tiny_models, port, tmp_path / "server.log")
    servers = [server]
    watch = None
    try:
        before = totals(url)  # the server is idle until the load below: the watch's first read sees the same
        watch = start_watch(url, out, "w1", "--duration", "26")
        manifest = out / "w1" / "manifest.json"
        wait_for_manifest(manifest, watch)
        assert load(url, 6, 0.0) > 0
        switch = time.time()
        assert load(url, 6, 1.5) > 0
        time.sleep(2.5)  # idle: the watch reads the last of the load
        after = totals(url)
        stop(server)  # the watched server disappears mid-watch
        time.sleep(3)
        server = start_llama(llama_server, tiny_models, port, tmp_path / "server2.log")  # same port: a restart
        servers.append(server)
        load(url, 2.5, 0.0)
        assert watch.poll() is None, "the watch (--duration 26) ended before the load after the restart"
        stdout, _ = watch.communicate(timeout=60)
        assert watch.returncode == 0, stdout
        assert server.poll() is None, "the watch must never stop the server"
    finally:
        if watch is not None and watch.poll() is None:
            os.killpg(watch.pid, signal.SIGKILL)
        for s in servers:
            stop(s)
    m = json.loads(manifest.read_text())
    w = m["watch"]
    assert (m["kind"], m["controlled"], m["status"], w["engine"]) == ("watch", False, "ok", "llamacpp")
    ivs = w["intervals"]
    # the watch's deltas add up to the server's own counters, exactly (intervals before the kill; the rest is 0)
    assert len(w["gaps"]) == 1, w["gaps"]
    pre = [iv for iv in ivs if iv["end_s"] <= w["gaps"][0]["start_s"]]
    assert not any(iv["reset"] or iv["after_gap"] for iv in pre)
    for key, name in (("verify_steps", "spec_decode_num_drafts_total"), ("drafted", "spec_decode_num_draft_tokens_total"),
                      ("accepted", "spec_decode_num_accepted_tokens_total"), ("tokens", "tokens_predicted_total")):
        assert sum(iv[key] or 0 for iv in pre) == after[name] - before[name], key
    for iv in pre:
        if iv["verify_steps"]:
            assert iv["accept_len"] == pytest.approx(1 + iv["accepted"] / iv["verify_steps"])
            assert iv["tok_s"] == pytest.approx(iv["tokens"] / iv["wall_s"], rel=1e-3)  # wall_s rounded to 0.1 ms
    # the change: accept length falls near the switch (greedy -> temperature 1.5)
    drops = [c for c in w["changes"] if c["series"] == "accept_len" and c["relative_change"] < -0.2]
    assert drops, w["changes"]
    # delay: the first interval of the new level starts this long after the switch (the record's UTC times)
    delay = min((dt.datetime.fromisoformat(c["at"]).timestamp() - switch for c in drops), key=abs)
    assert -1.5 <= delay <= 2.5, (delay, w["changes"])
    biggest = min(drops, key=lambda c: c["relative_change"])
    assert biggest["before_mean"] > 1.8 and biggest["after_mean"] < 1.5
    # the gap, then the restart: recorded, never a negative figure
    assert w["gaps"][0]["end"] is not None and "ConnectError" in w["gaps"][0]["error"]
    assert w["resets"] >= 1 and any(iv["reset"] for iv in ivs)
    assert all((iv[k] or 0) >= 0 for iv in ivs for k in ("verify_steps", "drafted", "accepted", "tokens", "tok_s"))
    after_restart = [iv for iv in ivs if iv["start_s"] >= w["gaps"][0]["end_s"] and iv["tokens"]]
    assert after_restart, "the watch resumes after the restart"
    assert (out / "w1" / "intervals.csv").is_file() and (out / "w1" / "watch.html").is_file()
    assert "[spectrial] watch: #0" in stdout and "server not answering" in stdout
    reported = first_report(stdout, biggest["index"])
    assert reported is not None, stdout
    live = dt.datetime.fromisoformat(ivs[reported]["end"]).timestamp() - switch  # when the watch first said so
    placed = dt.datetime.fromisoformat(biggest["at"]).timestamp() - switch
    # reported once MIN_SIZE intervals of the new level are in (one more where counting noise hides it at first),
    # counted in intervals: a loaded machine stretches them (make test's other lanes delay the watch's reads)
    assert reported - biggest["index"] <= changes.MIN_SIZE, (reported, biggest, stdout)
    # in seconds: from the change's first interval, those intervals at 1 s each, 1.5 s allowed under load (CI once
    # saw 5.0 s from the switch against the old bound of MIN_SIZE + 1.5 s from it, placement unknown)
    assert live - placed <= 1.5 * (changes.MIN_SIZE + 1), (live, placed, stdout)
    print(f"live: drop first reported {live:.2f} s after the switch (after interval {reported}); change placed "
          f"{delay:+.2f} s from the switch, the biggest drop {placed:+.2f} s (interval 1 s); changes {[(c['series'], c['index'], round(c['relative_change'], 3)) for c in w['changes']]}; "
          f"one /metrics read {w['read_ms_median']} ms (median)")


def first_report(stdout: str, index: int) -> int | None:
    """The interval after whose read the watch first printed a drop of accept length at `index` - 1 or later
    (each change is printed when a re-run on the growing series first finds it)."""
    last = -1
    for line in stdout.splitlines():
        m = re.search(r"watch: #(\d+) ", line)
        if m:
            last = int(m.group(1))
        m = re.search(r"change in accept_len at interval (\d+) .*\(-", line)
        if m and int(m.group(1)) >= index - 1:
            return last
    return None


def test_a_signal_writes_the_record_and_leaves_the_server(llama_server, tiny_models, port, tmp_path, tiny_params,
                                                          write_params):
    """SIGTERM and Ctrl-C end a watch with the record written (exit 143 / 130); the SIGTERM one drives its own load
    (--drive-rate with the tiny params' workload), the Ctrl-C one watches the test's."""
    url, out = f"http://127.0.0.1:{port}", tmp_path / "out"
    params = write_params(tiny_params)
    server = start_llama(llama_server, tiny_models, port, tmp_path / "server.log")
    try:
        for sig, code, name in ((signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")):
            drive = ("--drive-rate", "2", "--params", str(params)) if sig == signal.SIGTERM else ()
            watch = start_watch(url, out, f"sig{code}", *drive)
            manifest = out / f"sig{code}" / "manifest.json"
            wait_for_manifest(manifest, watch)
            if drive:
                time.sleep(3)
            else:
                load(url, 2.5, 0.0)
            os.kill(watch.pid, sig)
            stdout, _ = watch.communicate(timeout=30)
            assert watch.returncode == code, stdout
            m = json.loads(manifest.read_text())
            assert m["status"] == "failed" and m["reason"] == f"interrupted by {name}", m["reason"]
            ivs = m["watch"]["intervals"]
            assert ivs and sum(iv["tokens"] or 0 for iv in ivs) > 0 and (out / f"sig{code}" / "intervals.csv").is_file()
            assert (out / f"sig{code}" / "watch.html").is_file() and "not touched" in stdout
            if drive:
                assert m["params"]["drive_rate"] == 2 and any("driven load" in n for n in m["watch"]["notes"])
            assert server.poll() is None, "the watch must never stop the server"
    finally:
        stop(server)


def test_a_steady_driven_server_shows_no_change(llama_server, tiny_models, port, tmp_path, tiny_params, write_params):
    """Issue 42: a steady llama-server under the watch's own paced load (2 requests/s of 64 tokens, greedy), watched
    every 2 s for 40 s as the issue's report did: its tok/s jumps between levels a request apart (the counter moves
    when a request ends), and no change is reported in it or in accept length."""
    url, out = f"http://127.0.0.1:{port}", tmp_path / "out"
    params = write_params({**tiny_params, "max_tokens": 64})
    server = start_llama(llama_server, tiny_models, port, tmp_path / "server.log")
    try:
        watch = start_watch(url, out, "steady", "--duration", "40", "--interval", "2", "--drive-rate", "2",
                            "--params", str(params))
        stdout, _ = watch.communicate(timeout=120)
        assert watch.returncode == 0, stdout
    finally:
        stop(server)
    w = json.loads((out / "steady" / "manifest.json").read_text())["watch"]
    worked = [iv for iv in w["intervals"] if iv["tokens"]]
    assert len(worked) >= 15, w["intervals"]
    levels = sorted({round(iv["tok_s"]) for iv in worked})
    print(f"steady: {len(worked)} intervals with tokens, tok/s levels {levels}; changes {w['changes']}")
    assert w["changes"] == [], (levels, w["changes"])


def test_bad_inputs(llama_server, tiny_models, port, tmp_path):
    out = tmp_path / "out"
    dead = subprocess.run([*SPECTRIAL, "watch", f"http://127.0.0.1:{port}", "--output-dir", str(out)],
                          capture_output=True, text=True, env=ENV, timeout=60)
    assert dead.returncode == 2 and "does not answer" in dead.stderr, dead.stderr
    server = start_llama(llama_server, tiny_models, port, tmp_path / "server.log", metrics_on=False)
    try:
        res = subprocess.run([*SPECTRIAL, "watch", f"http://127.0.0.1:{port}", "--output-dir", str(out)],
                             capture_output=True, text=True, env=ENV, timeout=60)
        assert res.returncode == 2 and "no /metrics" in res.stderr and "--metrics" in res.stderr, res.stderr
        assert server.poll() is None
    finally:
        stop(server)
    assert not out.exists() or not any(out.iterdir()), "bad input leaves no record"


@pytest.mark.vllm
def test_watch_a_real_vllm_cpu_server(tmp_path, vllm_counting_eagle3):
    """A real vLLM CPU server (the counting target + its EAGLE-3 draft, 3 steps: the session's shared one,
    tests/shared_servers.py, up before the watch starts, as a user's server is); the watch's per-position
    acceptance against the counting truth for the requests sent while it watches."""
    from tokenizers import Tokenizer

    from spectrial.models.hf import ensure_hf_models, simulate_counting

    server = vllm_counting_eagle3
    url, out, model = server.url, tmp_path / "out", "target"
    prom = contextlib.ExitStack()
    prometheus = prom.enter_context(prometheus_server.running(tmp_path / "prometheus", {"vllm": server.port}))
    watch = start_watch(url, out, "v1", "--duration", "14")
    try:
        prometheus_server.wait_scraped(prometheus, 'vllm:spec_decode_num_drafts_total{job="vllm"}')
        t0 = time.time()
        wait_for_manifest(out / "v1" / "manifest.json", watch)
        tok = Tokenizer.from_file(str(ensure_hf_models(kind="counting").target / "tokenizer.json"))
        drafts, accepted, max_tokens = 0, [0, 0, 0], 32
        with httpx.Client(timeout=120) as c:
            for i in range(4):
                prompt = f"Count with me: {i} {i + 1} {i + 2}"
                r = c.post(f"{url}/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                          "temperature": 0, "ignore_eos": True})
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["completion_tokens"] == max_tokens
                d, a = simulate_counting("eagle3", tok.encode(prompt).ids[-1], max_tokens, 3)
                drafts, accepted = drafts + d, [x + y for x, y in zip(accepted, a, strict=True)]
        time.sleep(2.5)  # Prometheus' scrapes after the last request
        t1 = time.time()
        stdout, _ = watch.communicate(timeout=120)
        assert watch.returncode == 0, stdout
        assert server.alive(), "the watch must never stop the server"
        # the same requests read back from Prometheus' history of the same server (issue 42, item 2)
        res = subprocess.run([*SPECTRIAL, "watch", "--prometheus", prometheus, "--selector", 'job="vllm"', "--start",
                              f"{t0:.3f}", "--end", f"{t1:.3f}", "--interval", "1", "--output-dir", str(out),
                              "--run-id", "p1"], capture_output=True, text=True, timeout=300, env=ENV)
        assert res.returncode == 0, res.stdout + res.stderr
        # the Grafana dashboard's queries (spectrial.watch.grafana) over the same window: valid for every engine,
        # vLLM's giving the counting truth
        window, board = f"{int(t1 - t0) + 2}s", {}
        for title, legend, q in prometheus_server.dashboard_queries("vllm", f"{int(t1 - t0) + 2}s"):
            r = prometheus_server.query(prometheus, q, t1)
            assert r.status_code == 200 and r.json()["status"] == "success", (title, q, r.text)
            if "(vllm)" in legend:
                board.setdefault(title, []).extend(float(x["value"][1]) for x in r.json()["data"]["result"])
    finally:
        if watch.poll() is None:
            os.killpg(watch.pid, signal.SIGKILL)
        prom.close()
    w = json.loads((out / "v1" / "manifest.json").read_text())["watch"]
    assert w["engine"] == "vllm" and w["speculation"] and not w["gaps"] and not w["resets"]
    ivs = [iv for iv in w["intervals"] if iv["verify_steps"]]
    steps = sum(iv["verify_steps"] for iv in ivs)
    assert steps == drafts  # the counting truth, exactly
    per_pos = [sum(iv["per_position"][k] * iv["verify_steps"] for iv in ivs) for k in range(3)]
    assert per_pos == pytest.approx(accepted, abs=1e-6)
    assert [x / steps for x in per_pos] == pytest.approx([accepted[0] / drafts, 0, 0])
    assert 1 + sum(per_pos) / steps == pytest.approx(4 / 3, abs=4 / drafts + 0.02)
    assert sum(iv["tokens"] or 0 for iv in w["intervals"]) == 4 * max_tokens
    pw = json.loads((out / "p1" / "manifest.json").read_text())["watch"]
    assert (pw["engine"], pw["source"], pw["speculation"], pw["resets"]) == ("vllm", "prometheus", True, 0), pw
    pivs = [iv for iv in pw["intervals"] if iv["verify_steps"]]
    assert sum(iv["verify_steps"] for iv in pivs) == drafts  # the counting truth again, from Prometheus
    ppos = [sum(iv["per_position"][k] * iv["verify_steps"] for iv in pivs) for k in range(3)]
    assert ppos == pytest.approx(accepted, abs=1e-6)
    assert sum(iv["tokens"] or 0 for iv in pw["intervals"]) == 4 * max_tokens
    accept = board["Accept length (tokens per verify step)"]
    truth = 1 + sum(accepted) / drafts
    assert len(accept) == 1 and accept[0] == pytest.approx(truth, rel=0.03), (accept, truth)  # rate() extrapolates
    assert sum(board["Per-position acceptance"]) == pytest.approx(accept[0] - 1, rel=1e-6)
    print(f"vLLM on the dashboard ({window}): accept length {accept[0]:.4f} (truth {truth:.4f})")
    print(f"vLLM from Prometheus: {len(pw['intervals'])} intervals, {sum(iv['verify_steps'] for iv in pivs)} verify "
          f"steps (truth {drafts}), per position {[round(x / drafts, 3) for x in ppos]}")
    print(f"vLLM watch: {len(w['intervals'])} intervals, accept length {1 + sum(per_pos) / steps:.3f}, "
          f"per position {[round(x / steps, 3) for x in per_pos]}, one /metrics read {w['read_ms_median']} ms")
