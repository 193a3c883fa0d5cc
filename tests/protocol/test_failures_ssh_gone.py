"""Failure: sshd itself goes away mid-run (listener and sessions killed), and Ctrl-C while SSH is down (issue 26).

Before: nothing for two minutes (every request through the forward waited out the reconnect retries on its
own), then 36 of 40 requests failed and paramiko's NoValidConnectionsError surfaced; Ctrl-C during a remote
command waited for that command to end; during the retries it came out as connection failures.
Now: the first command after the drop retries for a few seconds, then raises `ConnectionLost` naming the host
and saying the remote server may still be running; later commands and forwarded requests fail at once;
`reachable()` answers in a moment; once sshd is back, `reachable()` reconnects and the server is stopped.
Ctrl-C reaches the caller unchanged and at once, whatever the connection is doing.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from sshd_plugin import SSHD, SshdPool, SshdServer
from test_ssh_trial import ssh_params

from spectrial.engines import get_engine
from spectrial.errors import ConnectionLost, HostError
from spectrial.hosts.local import LocalHost
from spectrial.measure.bench import run_requests
from spectrial.measure.workloads import bundled_items
from spectrial.params import load_params
from spectrial.servers.lifecycle import Server

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def kill_sshd(server: SshdServer) -> None:
    """SIGKILL the sshd listener and every per-connection sshd process under it (not what they started). The
    listener first: killed after its sessions, it could take a reconnect in between (a loaded machine showed it),
    and the host would look up again for a moment, which is not what a dead sshd does."""
    listener = psutil.Process(server.proc.pid)
    sessions = [c for c in listener.children(recursive=True) if c.name().startswith("sshd")]
    for p in [listener, *sessions]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            continue
    server.proc.wait(5)


def restart_sshd(server: SshdServer) -> None:
    """Start sshd again with the same config, port and keys (the fixture stops it at the end)."""
    config = server.workdir / "sshd_config"
    server.proc = subprocess.Popen([str(SSHD), "-D", "-f", str(config), "-E", str(server.log_path)],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert not SshdPool._wait_ready(server), server.log_tail()


def interrupt_main_after(delay_s: float) -> threading.Timer:
    """SIGINT to this process's main thread after `delay_s` (what Ctrl-C does)."""
    timer = threading.Timer(delay_s, lambda: signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT))
    timer.start()
    return timer


@pytest.fixture
def own_sshd(sshd_factory: Callable[[int], list[SshdServer]]) -> Iterator[SshdServer]:
    """An sshd of this test alone (it gets killed), running again at the end for the fixture's stop."""
    (server,) = sshd_factory(1)
    yield server
    if server.proc.poll() is not None:
        restart_sshd(server)


def test_sshd_gone_is_noticed_in_seconds_and_named(own_sshd: SshdServer, tiny_params: dict[str, Any]) -> None:
    server = own_sshd
    host = server.host()  # default retries (3) and backoff (0.5 s): what a user gets
    params = load_params(data=ssh_params(tiny_params, server, arms=[{"name": "baseline"}]))
    engine = get_engine("llamacpp", params, host)
    engine.prepare()
    srv = Server(host, engine.launch_spec(params.arms[0]), work_dir=str(Path(tiny_params["work_dir"]) / "gone"),
                 state_dir=params.state_dir, tag="sshd-gone", grace_s=5)
    srv.start()
    try:
        srv.wait_ready(120, progress=False)
        pid = srv.pid
        path, payload = engine.request_target(params.request_format)
        box: dict[str, Any] = {}

        def bench() -> None:
            box["records"] = run_requests(srv.base_url, bundled_items(), n=40, max_tokens=32, payload=payload,
                                          path=path, stats_fn=engine.request_stats, progress=False, timeout_s=30)
            box["ended"] = time.monotonic()

        t = threading.Thread(target=bench)
        t.start()
        time.sleep(1.0)  # some requests done, one streaming
        kill_sshd(server)
        killed = time.monotonic()
        with pytest.raises(ConnectionLost) as info:
            host.run(["true"])
        noticed = time.monotonic() - killed
        err = info.value
        print(f"ConnectionLost after {noticed:.2f} s: {err}")
        assert noticed < 10  # default retries: 0.5 + 1 + 2 s of backoff
        assert isinstance(err, HostError) and err.lost and err.host == host.name and err.since
        assert host.name in str(err) and "may still be running" in str(err) and err.attempts >= 1
        assert host.lost is not None and not host.connected
        t1 = time.monotonic()
        with pytest.raises(ConnectionLost):
            host.processes(pid)  # given up: at once, not another round of retries
        assert time.monotonic() - t1 < 0.5
        t1 = time.monotonic()
        assert not host.reachable(timeout_s=2)
        assert time.monotonic() - t1 < 3
        t.join(60)
        assert not t.is_alive()
        recs = box["records"]
        failed = [r for r in recs if r.error]
        print(f"requests: {len(recs)}, failed {len(failed)}, the last ended {box['ended'] - killed:.1f} s after the kill")
        assert failed and box["ended"] - killed < 15  # the rest failed fast, not after minutes
        assert pid is not None and LocalHost().alive(pid)  # the server runs on (setsid): what the message warns of
        events = [e["event"] for e in host.take_events()]
        assert "connection_given_up" in events, events
    finally:
        if server.proc.poll() is not None:
            restart_sshd(server)
        t1 = time.monotonic()
        assert host.reachable(timeout_s=5)  # back: a single attempt reconnects
        print(f"reconnected {time.monotonic() - t1:.2f} s after sshd came back")
        srv.stop()
    assert srv.stop_report is not None and srv.stop_report.how in ("TERM", "KILL") and srv.stop_report.port_free
    assert not LocalHost().port_holders(params.port)


def test_ctrl_c_while_ssh_is_down_reraises_at_once(own_sshd: SshdServer) -> None:
    host = own_sshd.host(retries=5, backoff_s=2)  # retrying would take 2 + 4 + 8 + 16 + 30 s
    assert host.run(["true"]).ok
    kill_sshd(own_sshd)
    timer = interrupt_main_after(0.5)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        host.run(["true"])
    timer.join()
    assert time.monotonic() - t0 < 1.5


def test_ctrl_c_during_a_remote_command_reraises_at_once(ssh_host: Any) -> None:
    argv = ["sleep", "7.123"]  # distinctive, to stop what the interrupt left on the host
    timer = interrupt_main_after(0.5)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            ssh_host.run(argv)
        timer.join()
        assert time.monotonic() - t0 < 1.5  # fabric waited for the command to end (7 s)
        assert ssh_host.run(["echo", "after"]).stdout == "after\n"  # the connection is still good
    finally:
        for p in psutil.process_iter(["cmdline"]):
            if p.info["cmdline"] == argv:
                p.kill()


def _cli_remote_trial(server: SshdServer, tiny_params: dict[str, Any], write_params: Any, out: Path
                      ) -> tuple[subprocess.Popen[str], Path]:
    import json
    import sys

    data = ssh_params(tiny_params, server, output_dir=str(out), repeats=40, max_tokens=48,
                      arms=[{"name": "baseline"}, {"name": "draft", "method": "draft"}])
    proc = subprocess.Popen([sys.executable, "-m", "spectrial.cli", "trial", str(write_params(data)), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        runs = list(out.glob("*/manifest.json"))
        if runs:
            try:
                if any(s["name"].startswith("benchmark:baseline") for s in json.loads(runs[0].read_text())["steps"]):
                    return proc, runs[0].parent
            except ValueError:
                pass
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.1)
    raise AssertionError("the remote trial never reached its benchmark")


def test_cli_when_sshd_goes_away_mid_run(own_sshd: SshdServer, tiny_params: dict[str, Any], write_params: Any,
                                         tmp_path: Path) -> None:
    """The whole CLI: sshd dies mid-benchmark; the trial ends within seconds (not minutes), exit 1, the record says
    the connection was lost and that the remote server (pid N) may still run there; the second arm is not tried.
    Once sshd is back, the next trial's kill step stops the leftover."""
    from spectrial.protocol.trial import run_trial
    from spectrial.record.store import manifest_json

    proc, run = _cli_remote_trial(own_sshd, tiny_params, write_params, tmp_path / "out")
    time.sleep(1.0)
    kill_sshd(own_sshd)
    t0 = time.monotonic()
    rc = proc.wait(60)
    took = time.monotonic() - t0
    print(f"the CLI ended {took:.1f} s after sshd went away, exit {rc}")
    assert rc == 1 and took < 20, proc.stderr.read()[-3000:] if proc.stderr else rc
    m = manifest_json(run)
    reason = m["reason"]
    assert m["status"] == "failed" and "lost the connection to" in reason and "may still be running" in reason, reason
    assert "server (pid " in m["starts"][0]["reason"], m["starts"][0]["reason"]
    assert not any(s["arm"] == "draft" for s in m["starts"]), "the second arm was tried on a host that is gone"
    leftover = [p for p in psutil.process_iter(["cmdline"]) if str(tiny_params["port"]) in " ".join(
        p.info["cmdline"] or []) and "llama-server" in " ".join(p.info["cmdline"] or [])]
    assert leftover, "the remote server runs on (its own session): what the record warns of"
    restart_sshd(own_sshd)
    nxt = run_trial(load_params(data=ssh_params(tiny_params, own_sshd, output_dir=str(tmp_path / "next"),
                                                arms=[{"name": "baseline"}], repeats=1)), progress=False)
    kill = next(s for s in nxt.manifest.steps if s.name == "kill_old_server").report
    assert nxt.manifest.status == "ok" and kill.previous.run_id == m["run_id"], kill
    assert not LocalHost().port_holders(tiny_params["port"])


def test_cli_ctrl_c_while_ssh_is_down_exits_130(own_sshd: SshdServer, tiny_params: dict[str, Any],
                                                write_params: Any, tmp_path: Path) -> None:
    """Ctrl-C right after sshd went away: exit 130 at once, the record says it was interrupted."""
    from spectrial.protocol.trial import run_trial
    from spectrial.record.store import manifest_json

    proc, run = _cli_remote_trial(own_sshd, tiny_params, write_params, tmp_path / "out")
    time.sleep(1.0)
    kill_sshd(own_sshd)
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(60)
    took = time.monotonic() - t0
    print(f"exit {rc} {took:.1f} s after Ctrl-C")
    assert rc == 130 and took < 15, proc.stderr.read()[-3000:] if proc.stderr else rc
    m = manifest_json(run)
    assert m["status"] == "failed" and ("interrupted by Ctrl-C" in m["reason"] or "lost the connection" in
                                        m["reason"]), m["reason"]
    restart_sshd(own_sshd)
    # the server Ctrl-C could not reach over the dead link: the next trial's kill step stops it (none left behind)
    nxt = run_trial(load_params(data=ssh_params(tiny_params, own_sshd, output_dir=str(tmp_path / "next"),
                                                arms=[{"name": "baseline"}], repeats=1)), progress=False)
    assert nxt.manifest.status == "ok", nxt.manifest.reason
    assert not LocalHost().port_holders(tiny_params["port"])
