"""The in-memory host (a TEST DOUBLE, `spectrial.hosts.memory.MemoryHost`) against the real one.

One contract (commands and their failures, files, a detached process group and its stop, ports) runs against
`LocalHost` (a real shell, real processes) and against `MemoryHost` (with the contract's commands scripted as
the real shell answers them): where the double drifts from the host it stands in for, this test fails.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sshd_plugin import free_port as _free_port

from spectrial.errors import HostError
from spectrial.hosts.fingerprint import GPU_QUERY, compare, fingerprint_key, host_fingerprint, stable_view
from spectrial.hosts.local import Host, LocalHost, to_shell
from spectrial.hosts.memory import MemoryHost

ECHO = ["printf", "%s", "hello world"]
FAIL = ["sh", "-c", "echo out; echo err >&2; exit 3"]
SLEEP = ["sleep", "30"]


def _local(tmp_path: Path) -> Host:
    return LocalHost()


def _memory(tmp_path: Path) -> Host:
    host = MemoryHost()
    host.mkdir(str(tmp_path))
    host.on(ECHO, stdout="hello world")
    host.on(FAIL, stdout="out\n", stderr="err\n", exit_code=3)
    return host



def _wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """The detached process shows its own argv once nohup/setsid/env have exec'd into it (at once in memory)."""
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return check()


@pytest.mark.parametrize("make", [_local, _memory], ids=["LocalHost", "MemoryHost"])
def test_the_host_contract(make: Callable[[Path], Host], tmp_path: Path) -> None:
    host = make(tmp_path)
    root = str(tmp_path)

    # commands: output, exit codes, and the error that keeps the result
    res = host.run(ECHO)
    assert (res.ok, res.exit_code, res.stdout) == (True, 0, "hello world")
    res = host.run(FAIL, check=False)
    assert (res.ok, res.exit_code, res.stdout, res.stderr) == (False, 3, "out\n", "err\n")
    with pytest.raises(HostError) as info:
        host.run(FAIL, hint="a hint")
    assert (info.value.exit_code, info.value.command, info.value.stderr) == (3, to_shell(FAIL), "err\n")
    assert host.counters["commands"] == 3  # the run that raised counts too
    assert host.run(ECHO).ok and host.counters["commands"] == 4

    # files
    assert host.expand("~/x") == host.home() + "/x"
    folder = f"{root}/a/b"
    host.mkdir(folder)
    assert host.exists(folder) and not host.exists(f"{folder}/f.txt")
    host.write_text(f"{folder}/f.txt", "one\ntwo\n")
    assert host.exists(f"{folder}/f.txt") and host.read_text(f"{folder}/f.txt") == "one\ntwo\n"
    assert host.read_text(f"{folder}/f.txt", max_bytes=4) == "two\n"
    assert host.line_count(f"{folder}/f.txt") == 2 and host.line_count(f"{folder}/missing") == 0
    host.remove(f"{folder}/f.txt")
    host.remove(f"{folder}/f.txt")  # removing what is gone is no error
    assert not host.exists(f"{folder}/f.txt")
    local = tmp_path / "local.txt"
    local.write_text("payload\n")
    host.put(local, f"{folder}/up.txt")
    assert host.read_text(f"{folder}/up.txt") == "payload\n"
    host.get(f"{folder}/up.txt", tmp_path / "back.txt")
    assert (tmp_path / "back.txt").read_text() == "payload\n"
    free, _mount = host.free_space([folder, f"{folder}/not/yet"])[f"{folder}/not/yet"]
    assert free > 0

    # a detached process group: found with its argv and env, stopped by TERM, gone after
    log = f"{root}/p.log"
    pid = host.start_detached(SLEEP, env={"CONTRACT_VAR": "x y"}, log_path=log)
    assert _wait_for(lambda: [p.cmdline for p in host.processes(pid)] == [SLEEP])
    (proc,) = host.processes(pid)
    assert (proc.pid, proc.pgid, proc.sid) == (pid, pid, pid)
    assert proc.environ is not None and proc.environ["CONTRACT_VAR"] == "x y"
    assert host.alive(pid) and host.exists(log)
    assert pid in {p.pid for p in host.process_tree(pid)}
    assert host.stop_group(pid, grace_s=5) == "TERM"
    assert not host.alive(pid) and host.processes(pid) == []
    assert host.stop_group(pid, grace_s=1) == "gone"  # (a signal may still reach its zombie until it is reaped)

    # ports
    assert host.port_holders(_free_port()) == []


def test_unscripted_commands_are_refused_by_name() -> None:
    host = MemoryHost().on(re.compile(r"^uname "), stdout="6.8.0\n")
    assert host.run(["uname", "-r"]).stdout == "6.8.0\n"
    with pytest.raises(NotImplementedError, match="no scripted answer for the command 'nvidia-smi -L'"):
        host.run(["nvidia-smi", "-L"])
    assert host.commands == ["uname -r", "nvidia-smi -L"]


def test_a_scripted_drop_is_rerun_only_when_asked() -> None:
    host = MemoryHost().on(["cat", "/x"], lost=True)
    with pytest.raises(HostError) as info:
        host.run(["cat", "/x"])
    assert info.value.lost
    with pytest.raises(HostError):  # still lost on the rerun: the script answers the same each time
        host.run(["cat", "/x"], rerun_if_lost=True)
    assert host.commands == ["cat /x"] * 3


def test_port_holders_and_a_process_that_exits() -> None:
    host = MemoryHost()
    pid = host.start_detached(["server"], env=None, log_path="/home/test/s.log")
    host.listening[8000] = pid
    assert [p.pid for p in host.port_holders(8000)] == [pid]
    host.exit(pid)
    assert host.port_holders(8000) == [] and not host.alive(pid)


def test_a_fingerprint_is_read_from_the_commands_output() -> None:
    """A caller of the host layer tested through the double: the fingerprint's facts and GPU rows (with the
    throttling bits named) come from what the host's commands print, here nvidia-smi's CSV as on an H200."""
    gpu = dict.fromkeys(GPU_QUERY, "1") | {"name": "NVIDIA H200", "uuid": "GPU-1",
                                           "clocks_event_reasons.active": "0x0000000000000004"}
    out = "kernel=6.8.0\nhostname=box\ncpu_count=16\n---gpus---\n" + ", ".join(gpu[f] for f in GPU_QUERY) + "\n"
    host = MemoryHost().on(re.compile(r'echo "kernel='), stdout=out)
    fp = host_fingerprint(host)
    assert (fp.host, fp.kernel, fp.hostname, fp.cpu_count) == ("memory", "6.8.0", "box", "16")
    assert fp.gpus is not None and fp.gpus[0]["name"] == "NVIDIA H200" and fp.gpus[0]["throttle"] == ["sw_power_cap"]
    assert stable_view(fp)["gpus"][0]["uuid"] == "GPU-1" and stable_view(fp)["cuda_version"] is None
    assert compare(fp, fp) == ["GPU 1 throttling: sw_power_cap"]
    assert fingerprint_key(fp) == fingerprint_key(host_fingerprint(host)) and len(host.commands) == 2
