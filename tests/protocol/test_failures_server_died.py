"""Failure: the server of one arm dies mid-benchmark (issue 7, part 3).

The `draft` arm's llama-server gets SIGKILL (as from the OOM killer) while it streams a benchmark request
through SSH. That arm is marked failed with the exit code and its log fetched into the record; the
baseline arm is still reported with its figures; the trial's status is failed; nothing is left running.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest
from sshd_plugin import SshdServer
from test_failures_ssh_drop import requests_in_flight, step_done, wait_for
from test_ssh_trial import ssh_params

from spectrial.errors import RunFailed
from spectrial.hosts.local import LocalHost
from spectrial.params import load_params
from spectrial.protocol.trial import run_trial
from spectrial.record.store import manifest_json
from spectrial.servers.lifecycle import TAG_VAR

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def arm_server_pid(arm: str, port: int) -> int | None:
    """This test's llama-server (its port) whose spectrial tag names `arm` (same machine: read its environment
    directly); another test's servers (a lane beside this one) are never the one."""
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if cmd and cmd[0].endswith("llama-server") and str(port) in cmd and \
                    f":{arm}:" in p.environ().get(TAG_VAR, ""):
                return p.pid
        except psutil.Error:
            continue
    return None


def test_server_killed_mid_benchmark_fails_only_its_arm(sshd: SshdServer, tiny_params: dict[str, Any]) -> None:
    port = tiny_params["port"]
    params = load_params(data=ssh_params(tiny_params, sshd, warmup=0, repeats=3, max_tokens=128,
                                         arms=[{"name": "baseline"}, {"name": "draft", "method": "draft"}]))
    outputs = Path(tiny_params["output_dir"])
    killed: dict[str, int] = {}

    def kill_draft_when_streaming() -> None:
        wait_for(lambda: step_done(outputs, "env_check:draft"), 120, "the draft arm's benchmark")
        wait_for(lambda: requests_in_flight(port) >= 1, 30, "a draft request in flight")
        pid = arm_server_pid("draft", port)
        assert pid
        os.kill(pid, signal.SIGKILL)
        killed["pid"] = pid

    watcher = threading.Thread(target=kill_draft_when_streaming, daemon=True)
    watcher.start()
    with pytest.raises(RunFailed) as info:
        run_trial(params, progress=False)
    watcher.join(5)
    assert killed, "the watcher never killed the draft server"
    m = manifest_json(info.value.result.run_dir)
    assert m["status"] == "failed" and "draft" in m["reason"]
    arms = {a["name"]: a for a in m["arms"]}
    base, draft = arms["baseline"], arms["draft"]
    assert base["status"] == "ok" and base["tok_s"] > 0 and base["requests_ok"] == 3  # still reported
    assert draft["status"] == "failed"
    print("draft arm:", draft["reason"][:400])
    assert "died during the run" in draft["reason"] and "exit code 137" in draft["reason"], draft["reason"]
    (start,) = [s for s in m["starts"] if s["arm"] == "draft"]
    assert start["status"] == "failed" and start["server"]["stop"]["how"] == "gone"
    bench = next(s for s in m["steps"] if s["name"] == "benchmark:draft")
    assert bench["ok"] is False and "ServerError" in bench["error"] and "died during the run" in bench["error"]
    log = (Path(info.value.result.run_dir) / "logs" / "llama-server-draft.log").read_text()
    assert "model loaded" in log  # the log was fetched back from the host although the arm failed
    assert not psutil.pid_exists(killed["pid"]) or psutil.Process(killed["pid"]).status() == psutil.STATUS_ZOMBIE
    assert not LocalHost().port_holders(port)
