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
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import free_port
from test_watch import ENV, SPECTRIAL, load, start_llama, stop

from spectrial.watch import changes

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
CONFIG = """global: {scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}
scrape_configs:
  - job_name: llama
    static_configs: [{targets: ["127.0.0.1:%(port)d"]}]
  - job_name: llama-copy
    static_configs: [{targets: ["127.0.0.1:%(port)d"]}]
"""


@pytest.fixture
def prometheus(tmp_path: Path, port: int) -> Iterator[str]:
    """A private Prometheus scraping 127.0.0.1:`port` as two jobs (llama, llama-copy) every second."""
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(binary).exists():
        done = subprocess.run([str(REPO / "scripts" / "ensure-prometheus.sh")], capture_output=True, text=True,
                              timeout=600)
        if not Path(binary).exists():
            pytest.skip(f"no prometheus: {done.stdout[-400:]}{done.stderr[-400:]}")
    web = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(CONFIG % {"port": port})
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{web}"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{web}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "prometheus not ready in 60 s"
            time.sleep(0.2)
        yield url
    finally:
        stop(proc)  # type: ignore[arg-type]
        log.close()


def wait_scraped(prometheus: str, timeout: float = 30) -> None:
    """Until Prometheus holds a sample of the llama-server's counters (its first scrapes after the server is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = httpx.get(f"{prometheus}/api/v1/query", params={"query": 'llamacpp:tokens_predicted_total{job="llama"}'},
                      timeout=5)
        if r.status_code == 200 and r.json()["data"]["result"]:
            return
        time.sleep(0.2)
    raise AssertionError("Prometheus scraped nothing of the llama-server in 30 s")


def watch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPECTRIAL, "watch", *args], capture_output=True, text=True, timeout=300, env=ENV)


def test_the_history_in_prometheus_gives_the_change_the_gap_and_the_restart(
        llama_server: Path, tiny_models: Any, port: int, prometheus: str, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{port}"
    server = start_llama(llama_server, tiny_models, port, tmp_path / "server.log")
    servers = [server]
    out = tmp_path / "out"
    wait_scraped(prometheus)
    # live from Prometheus: a watch that follows its new samples through the whole scenario
    follow = subprocess.Popen([*SPECTRIAL, "watch", "--prometheus", prometheus, "--selector", 'job="llama"', "--since",
                               "3s", "--follow", "--duration", "32", "--interval", "1", "--output-dir", str(out),
                               "--run-id", "live"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=ENV, start_new_session=True)
    try:
        t0 = time.time()
        time.sleep(3)  # a few idle scrapes first
        assert load(url, 7, 0.0) > 0
        switch = time.time()
        assert load(url, 7, 1.5) > 0
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
                f"{t1:.3f}", "--interval", "1", "--output-dir", str(out), "--run-id", "p1")
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


def test_a_server_that_is_not_prometheus_is_named(llama_server: Path, tiny_models: Any, port: int,
                                                    tmp_path: Path) -> None:
    server = start_llama(llama_server, tiny_models, port, tmp_path / "server.log")
    try:
        res = watch("--prometheus", f"http://127.0.0.1:{port}", "--since", "5m")
    finally:
        stop(server)
    assert res.returncode == 2 and "Prometheus' HTTP API" in res.stderr, res.stderr
