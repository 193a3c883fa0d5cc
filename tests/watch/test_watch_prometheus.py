"""`spectrial watch --prometheus`: a real Prometheus (Debian's `prometheus`, started here on loopback with its own
config and storage, like sshd and Slurm) scrapes a real llama-server every second; the test switches the load's
acceptance mid-run (greedy -> temperature 1.5: accept length ~2.6 -> ~1.05), stops the server and starts it again
on the same port; then the watch reads that history from Prometheus' HTTP API and must find the change near the
switch, the gap and the restart (a reset), as the live watch does. Bad input: a Prometheus that does not answer, a
server that is not Prometheus, a selector that matches nothing, one that matches two servers (the same target
scraped as two jobs): each exits 2 and says which."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import prometheus_server
import pytest
from conftest import free_port
from test_watch import ENV, SPECTRIAL, load, start_llama, stop

from spectrial.watch import changes

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    """A private Pushgateway (Debian's `prometheus-pushgateway`)."""
    with prometheus_server.pushgateway(tmp_path / "pushgateway") as url:
        yield url


@pytest.fixture
def prometheus(tmp_path: Path, port: int, gateway: str) -> Iterator[str]:
    """A private Prometheus scraping 127.0.0.1:`port` as two jobs (llama, llama-copy) and the Pushgateway (its
    series keep their own job label) every second."""
    jobs = {"llama": port, "llama-copy": port, "pushgateway": int(gateway.rsplit(":", 1)[1])}
    with prometheus_server.running(tmp_path / "prometheus", jobs, honor_labels=("pushgateway",)) as url:
        yield url


def wait_scraped(prometheus: str) -> None:
    prometheus_server.wait_scraped(prometheus, 'llamacpp:tokens_predicted_total{job="llama"}')


def watch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPECTRIAL, "watch", *args], capture_output=True, text=True, timeout=300, env=ENV)


def test_the_history_in_prometheus_gives_the_change_the_gap_and_the_restart(
        llama_server: Path, tiny_models: Any, port: int, prometheus: str, gateway: str, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{port}"
    server = start_llama(llama_server, tiny_models, port, tmp_path / "server.log")
    servers = [server]
    out = tmp_path / "out"
    wait_scraped(prometheus)
    # live from Prometheus: a watch that follows its new samples through the whole scenario
    follow = subprocess.Popen([*SPECTRIAL, "watch", "--prometheus", prometheus, "--selector", 'job="llama"', "--since",
                               "3s", "--follow", "--duration", "32", "--interval", "1", "--output-dir", str(out),
                               "--run-id", "live", "--push-gateway", gateway], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=ENV, start_new_session=True)
    try:
        t0 = time.time()
        time.sleep(3)  # a few idle scrapes first
        assert load(url, 7, 0.0) > 0
        switch = time.time()
        assert load(url, 7, 1.5) > 0
        hot = time.time()
        time.sleep(3)
        stop(server)  # the server disappears: Prometheus' scrapes fail, its series go stale
        time.sleep(4)
        server = start_llama(llama_server, tiny_models, port, tmp_path / "server2.log")  # a restart, same port
        servers.append(server)
        assert load(url, 3, 0.0) > 0
        time.sleep(3)  # the last scrapes
        t1 = time.time()
    finally:
        for s in servers:
            stop(s)
        try:
            followed, _ = follow.communicate(timeout=90)
        finally:
            if follow.poll() is None:
                os.killpg(follow.pid, signal.SIGKILL)
    begin = time.monotonic()
    res = watch("--prometheus", prometheus, "--selector", 'job="llama"', "--start", f"{t0:.3f}", "--end",
                f"{t1:.3f}", "--interval", "1", "--output-dir", str(out), "--run-id", "p1", "--push-gateway", gateway)
    took = time.monotonic() - begin
    assert res.returncode == 0, res.stdout + res.stderr
    m = json.loads((out / "p1" / "manifest.json").read_text())
    w = m["watch"]
    assert (m["kind"], m["controlled"], m["status"], w["engine"], w["source"]) == (
        "watch", False, "ok", "llamacpp", "prometheus")
    assert 'job="llama"' in w["selector"] and any("was not contacted" in n for n in w["notes"])
    # the change: accept length falls at the switch; its first interval starts within a scrape or two of it
    drops = [c for c in w["changes"] if c["series"] == "accept_len" and c["relative_change"] < -0.2]
    assert drops, w["changes"]
    delay = min((dt.datetime.fromisoformat(c["at"]).timestamp() - switch for c in drops), key=abs)
    assert -2.0 <= delay <= 2.5, (delay, w["changes"])
    biggest = min(drops, key=lambda c: c["relative_change"])
    assert biggest["before_mean"] > 1.8 and biggest["after_mean"] < 1.5
    # the server's absence is a gap, its return a reset; no figure is negative
    assert len(w["gaps"]) >= 1 and "no sample in Prometheus" in w["gaps"][0]["error"]
    down = w["gaps"][0]["end_s"] - w["gaps"][0]["start_s"]
    assert 2 <= down <= 10, w["gaps"]
    ivs = w["intervals"]
    assert any(iv["after_gap"] or iv["reset"] for iv in ivs)
    assert all((iv[k] or 0) >= 0 for iv in ivs for k in ("verify_steps", "drafted", "accepted", "tokens", "tok_s"))
    after = [iv for iv in ivs if iv["start_s"] >= w["gaps"][0]["end_s"] and iv["tokens"]]
    assert after, "the intervals go on after the restart"
    assert (out / "p1" / "intervals.csv").is_file() and (out / "p1" / "watch.html").is_file()
    print(f"prometheus history: {len(ivs)} intervals read in {took:.1f} s; drop placed {delay:+.2f} s from the switch "
          f"({biggest['before_mean']:.2f} -> {biggest['after_mean']:.2f}); gap {down:.1f} s; resets {w['resets']}; "
          f"min segment {changes.MIN_SIZE} intervals")

    # the live one saw the same: the drop near the switch, reported as it followed, the outage as a gap
    assert follow.returncode == 0, followed
    lw = json.loads((out / "live" / "manifest.json").read_text())["watch"]
    assert lw["source"] == "prometheus" and "following" in followed and "change in accept_len" in followed, followed
    ldrops = [c for c in lw["changes"] if c["series"] == "accept_len" and c["relative_change"] < -0.2]
    assert ldrops, lw["changes"]
    ldelay = min((dt.datetime.fromisoformat(c["at"]).timestamp() - switch for c in ldrops), key=abs)
    assert -2.0 <= ldelay <= 2.5, (ldelay, lw["changes"])
    assert lw["gaps"] and len([iv for iv in lw["intervals"] if iv["tokens"]]) >= 10, lw["gaps"]
    print(f"followed live: drop placed {ldelay:+.2f} s from the switch; {len(lw['intervals'])} intervals")

    # the change points both watches pushed are in Prometheus, where the dashboard's annotation query finds each at
    # its own time (its value; Grafana's useValueForTime)
    annotation = next(q for title, _, q in prometheus_server.dashboard_queries("llama", "5s")
                      if title == "spectrial change points")
    want = {(run, c["series"], str(c["index"])): 1000 * dt.datetime.fromisoformat(c["at"]).timestamp()
            for run, ww in (("p1", w), ("live", lw)) for c in ww["changes"]}
    deadline, got = time.monotonic() + 15, {}
    while time.monotonic() < deadline and set(got) != set(want):
        r = prometheus_server.query(prometheus, annotation)
        assert r.status_code == 200, r.text
        got = {(x["metric"]["run_id"], x["metric"]["series"], x["metric"]["index"]): float(x["value"][1])
               for x in r.json()["data"]["result"]}
        time.sleep(0.5)
    assert set(got) == set(want) and all(abs(got[k] - want[k]) < 1.0 for k in want), (got, want)
    # every query of the dashboard is valid PromQL for all three engines; llama.cpp's show the switch and agree
    at_greedy, at_hot = {}, {}
    for title, legend, q in prometheus_server.dashboard_queries("llama", "5s"):
        for at, into in ((switch, at_greedy), (hot, at_hot)):
            r = prometheus_server.query(prometheus, q, at)
            assert r.status_code == 200 and r.json()["status"] == "success", (title, q, r.text)
            if "(llamacpp)" in legend:
                into.setdefault(title, []).extend(float(x["value"][1]) for x in r.json()["data"]["result"])
    accept = "Accept length (tokens per verify step)"
    assert at_greedy[accept] and at_greedy[accept][0] > 1.8 and at_hot[accept][0] < 1.5, (at_greedy, at_hot)
    assert sum(at_greedy["Per-position acceptance"]) == pytest.approx(at_greedy[accept][0] - 1, rel=1e-6)
    assert at_greedy["Generated tokens/s"][0] > 0
    print(f"dashboard at the switch: accept length {at_greedy[accept][0]:.3f}, 7 s later {at_hot[accept][0]:.3f}; "
          f"{len(want)} change points pushed and read back as annotations")

    # bad input: each exits 2 and names the problem
    res = watch("--prometheus", prometheus, "--since", "5m", "--interval", "1")
    assert res.returncode == 2 and "2 servers" in res.stderr and 'job="llama"' in res.stderr \
        and 'job="llama-copy"' in res.stderr, res.stderr
    res = watch("--prometheus", prometheus, "--selector", 'job="nope"', "--since", "5m")
    assert res.returncode == 2 and "matches no series" in res.stderr, res.stderr
    res = watch("--prometheus", f"http://127.0.0.1:{free_port()}", "--selector", 'job="llama"', "--since", "5m")
    assert res.returncode == 2 and "does not answer" in res.stderr, res.stderr
    res = watch("--prometheus", prometheus, "--selector", 'job="llama"', "--since", "soon")
    assert res.returncode == 2 and "--since" in res.stderr and "not a duration" in res.stderr, res.stderr
    res = watch(url, "--prometheus", prometheus, "--since", "5m")
    assert res.returncode == 2 and "give one" in res.stderr, res.stderr
    res = watch(url, "--follow")
    assert res.returncode == 2 and "--follow" in res.stderr, res.stderr
    res = watch("--prometheus", prometheus, "--selector", 'job="llama"', "--since", "5m", "--push-gateway",
                f"http://127.0.0.1:{free_port()}")
    assert res.returncode == 2 and "--push-gateway" in res.stderr and "does not answer" in res.stderr, res.stderr


def test_a_server_that_is_not_prometheus_is_named(llama_server: Path, tiny_models: Any, port: int,
                                                    tmp_path: Path) -> None:
    server = start_llama(llama_server, tiny_models, port, tmp_path / "server.log")
    try:
        res = watch("--prometheus", f"http://127.0.0.1:{port}", "--since", "5m")
    finally:
        stop(server)
    assert res.returncode == 2 and "Prometheus' HTTP API" in res.stderr, res.stderr
