"""Failure: the process driving the trial is killed (notebook kernel killed) mid-benchmark (issue 7, part 3).

`spectrial trial` runs through SSH in a subprocess and gets SIGKILL while benchmarking: nothing of
spectrial's cleanup runs. The remote llama-server (setsid) keeps running, found only through its state file
on the host. The next trial's kill step reads that file, checks the tag in the processes' environment,
stops the orphan, and its record says so. The killed run's record stays `running`: never marked complete.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from sshd_plugin import SshdServer
from test_failures_ssh_drop import llama_server_pid, requests_in_flight, step_done, wait_for
from test_ssh_trial import ssh_params

from spectrial.hosts.local import LocalHost
from spectrial.params import load_params
from spectrial.protocol.trial import run_trial
from spectrial.record.store import manifest_json
from spectrial.servers.lifecycle import TAG_VAR, read_state, state_path

SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]
pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def test_orphan_of_a_killed_kernel_is_stopped_by_the_next_trial(sshd: SshdServer, tiny_params: dict[str, Any],
                                                                 write_params, tmp_path: Path) -> None:
    port = tiny_params["port"]
    first_out = tmp_path / "first"
    data = ssh_params(tiny_params, sshd, arms=[{"name": "baseline"}], warmup=0, repeats=20, max_tokens=128,
                      output_dir=str(first_out))
    proc = subprocess.Popen([*SPECTRIAL, "trial", str(write_params(data)), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    orphan = None
    try:
        wait_for(lambda: step_done(first_out, "env_check:baseline") or proc.poll() is not None, 120,
                 "the first trial to reach its benchmark")
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
        wait_for(lambda: requests_in_flight(port) >= 1, 30, "a benchmark request in flight")
        orphan = llama_server_pid(port)
        proc.send_signal(signal.SIGKILL)  # the kernel dies: no finally, no context manager runs
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert orphan and psutil.pid_exists(orphan), "the remote server outlives the killed client"
    (run1,) = [p.parent for p in first_out.glob("*/manifest.json")]
    m1 = manifest_json(run1)
    assert m1["status"] == "running" and m1["finished_at"] is None  # never marked complete
    # the state file on the host names the orphan's group, with user-only permissions
    state_dir = tiny_params["state_dir"]
    st = read_state(LocalHost(), state_dir, port)
    assert st and st.run_id == m1["run_id"] and os.getpgid(orphan) == st.pgid
    assert stat.S_IMODE(os.stat(state_path(state_dir, port)).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(state_dir).st_mode) == 0o700
    assert psutil.Process(orphan).environ()[TAG_VAR] == st.tag

    second = run_trial(load_params(data={**data, "repeats": 1, "output_dir": str(tmp_path / "second")}),
                       progress=False)
    m2 = manifest_json(second.run_dir)
    assert m2["status"] == "ok", m2["reason"]
    kill = next(s for s in m2["steps"] if s["name"] == "kill_old_server")["report"]
    print("second trial's kill step:", kill)
    assert kill["previous"]["run_id"] == m1["run_id"] and kill["previous"]["pgid"] == st.pgid
    assert kill["action"].startswith(f"stopped previous spectrial server of run {m1['run_id']} (pgid {st.pgid}: ")
    # the killed run's record is marked abandoned and gets its server log (the evidence of what it was doing)
    m1 = manifest_json(run1)
    assert m1["status"] == "failed" and m1["reason"].startswith("abandoned: pid ") and m1["finished_at"]
    assert "server log copied into it" in kill["abandoned"]["settled"], kill["abandoned"]
    assert (run1 / "logs" / "llama-server-baseline.log").read_text().strip()
    assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
    assert read_state(LocalHost(), state_dir, port) is None
    assert not LocalHost().port_holders(port)
