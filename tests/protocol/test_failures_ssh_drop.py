"""Failure: the SSH connection drops while benchmark requests stream through the tunnel (issue 7, part 3; 26).

The per-connection sshd processes are killed (the TCP connection goes away, as when a VPN or NAT drops it)
while llama-server is generating a request. The server was started with setsid, so it keeps running;
spectrial reconnects, the cut request is recorded as failed, the other requests go through the new
connection, the trial finishes and the record lists what happened to the connection. A window that lost a
request is never silently `ok`: the record says `failed` and names the lost request (issue 26).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import psutil
import pytest
from sshd_plugin import SshdServer
from test_ssh_trial import ssh_params

from spectrial.hosts.local import LocalHost
from spectrial.params import load_params
from spectrial.protocol.trial import TrialResult, run_trial
from spectrial.record.store import manifest_json

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


def step_done(outputs: Path, name: str) -> bool:
    """True once the (single) run under `outputs` has finished step `name` successfully."""
    runs = [p for p in outputs.glob("*/manifest.json")]
    if not runs:
        return False
    try:
        steps = manifest_json(runs[0].parent)["steps"]
    except ValueError:  # caught mid-rename
        return False
    return any(s["name"] == name and s["ok"] for s in steps)


def requests_in_flight(port: int) -> float:
    """llama-server's own gauge of requests being processed (read directly: same machine, not through SSH)."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text
    except httpx.HTTPError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("llamacpp:requests_processing "):
            return float(line.split()[1])
    return 0.0


def llama_server_pid(port: int) -> int | None:
    holders = LocalHost().port_holders(port)
    return holders[0].pid if holders else None


def cut_connections(sshd: SshdServer) -> list[int]:
    """SIGKILL the per-connection processes of this sshd (not the listener, not the commands they started)."""
    killed = []
    for child in psutil.Process(sshd.proc.pid).children(recursive=True):
        try:
            if child.name().startswith("sshd"):
                child.send_signal(signal.SIGKILL)
                killed.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return killed


def test_ssh_drop_mid_benchmark_reconnects_and_finishes(sshd_factory: Callable[[int], list[SshdServer]],
                                                        tiny_params: dict[str, Any]) -> None:
    (server,) = sshd_factory(1)  # its own sshd: cutting its connections disturbs no other test
    port = tiny_params["port"]
    params = load_params(data=ssh_params(tiny_params, server, arms=[{"name": "baseline"}], warmup=0, repeats=4,
                                         max_tokens=256, ssh={"key_filename": server.key_filename,
                                                              "known_hosts": server.known_hosts,
                                                              "retries": 5, "backoff_s": 0.2}))
    outputs = Path(tiny_params["output_dir"])
    box: dict[str, Any] = {}

    def trial() -> None:
        try:
            box["result"] = run_trial(params, progress=False, raise_on_failure=False)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
            box["error"] = exc

    t = threading.Thread(target=trial)
    t.start()
    try:
        wait_for(lambda: step_done(outputs, "env_check:baseline"), 120, "the benchmark to start")
        wait_for(lambda: requests_in_flight(port) >= 1, 30, "a request streaming through the tunnel")
        pid = llama_server_pid(port)
        killed = cut_connections(server)
        assert killed, "no sshd connection process found to kill"
        time.sleep(0.3)
        assert pid and psutil.pid_exists(pid), "the server must survive the dropped connection (setsid)"
    finally:
        t.join(300)
    assert not t.is_alive() and "error" not in box, box.get("error")
    result: TrialResult = box["result"]
    m = manifest_json(result.run_dir)
    assert m["status"] == "failed" and "request" in m["reason"], (m["status"], m["reason"])  # lost: not `ok`
    (start,) = m["starts"]
    print("connection events:", *(f"{e['event']}: {e['detail']}" for e in start["connection_events"]), sep="\n  ")
    events = [e["event"] for e in start["connection_events"]]
    assert "reconnected" in events and ("connection_lost" in events or "forward_broken" in events), events
    reqs = pd.read_csv(Path(result.run_dir) / "requests.csv")
    measured = reqs[reqs["phase"] == "measure"]
    assert len(measured) == 4
    cut = measured[measured["error"].notna()]
    print("requests:", measured[["index", "error", "tokens"]].to_string(), sep="\n")
    assert len(cut) >= 1, "the streaming request should have been cut by the drop"
    assert cut["error"].str.contains("RemoteProtocolError|ReadError|incomplete|closed", regex=True).all()
    assert measured["error"].isna().sum() >= 1  # requests after the drop went through the new connection
    assert start["server"]["stop"]["how"] in ("TERM", "KILL")  # torn down by spectrial, not by the drop
    assert not LocalHost().port_holders(port)
