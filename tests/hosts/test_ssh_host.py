"""SSHHost against a real OpenSSH sshd on loopback, side by side with LocalHost (no mocks)."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from sshd_plugin import Reaper, SshdServer, free_port

from spectrial.errors import ConfigError, HostError, HostKeyError
from spectrial.hosts.connect import get_host
from spectrial.hosts.local import Host, LocalHost
from spectrial.hosts.ssh import SSHHost, parse_spec

pytest_plugins = ["sshd_plugin"]  # fixtures; harmless once tests/conftest.py registers the plugin too


def wait_for(predicate: Callable[[], object], timeout_s: float = 10.0, what: str = "condition") -> object:
    """Poll `predicate` until it returns something truthy; fail the test with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def live_pids(host: Host, pgid: int) -> list[int]:
    """Pids of group `pgid` that are still running (zombies excluded)."""
    return [p.pid for p in host.processes(pgid) if host.alive(p.pid)]


# --- commands: the same on both transports ----------------------------------------------------------------
RUN_CASES = [
    pytest.param(["printf", "%s|%s", "a b", "c'd\"e"], {}, None, 0, "a b|c'd\"e", "", id="argv-quoting"),
    pytest.param("echo out; echo err >&2; exit 3", {}, None, 3, "out\n", "err\n", id="shell-exit-code"),
    pytest.param("printf %s \"$SPECTRIAL_X\" | tr a-z A-Z", {"SPECTRIAL_X": "mixed Case $HOME"}, None, 0,
                 "MIXED CASE $HOME", "", id="shell-pipe-env"),
    pytest.param(["sh", "-c", 'printf %s "$1:$SPECTRIAL_X"', "sh", "one two"], {"SPECTRIAL_X": "é ✓"}, None, 0,
                 "one two:é ✓", "", id="argv-env-unicode"),
    pytest.param(["pwd"], {}, "/usr/share", 0, "/usr/share\n", "", id="cwd"),
    pytest.param(["ls", "/nonexistent-spectrial"], {}, None, 2, "", None, id="argv-failure"),
]


@pytest.mark.ssh
@pytest.mark.parametrize(("cmd", "env", "cwd", "code", "out", "err"), RUN_CASES)
def test_run_gives_identical_results_locally_and_over_ssh(ssh_host: SSHHost, cmd: list[str] | str,
                                                         env: dict[str, str], cwd: str | None, code: int,
                                                         out: str, err: str | None) -> None:
    local = LocalHost().run(cmd, env=env, cwd=cwd, check=False)
    remote = ssh_host.run(cmd, env=env, cwd=cwd, check=False)
    assert (remote.exit_code, remote.stdout, remote.stderr) == (local.exit_code, local.stdout, local.stderr)
    assert (remote.exit_code, remote.stdout) == (code, out)
    if err is not None:
        assert remote.stderr == err


def test_run_raises_with_the_result_on_failure(any_host: Host) -> None:
    with pytest.raises(HostError) as info:
        any_host.run("echo doomed >&2; exit 7", hint="look here")
    assert info.value.exit_code == 7 and "doomed" in info.value.stderr
    assert any_host.name in str(info.value) and "look here" in str(info.value)


def test_timeout_raises(any_host: Host) -> None:
    argv = ["sleep", "3.14159"]  # distinctive, to find what the timeout left behind
    t0 = time.monotonic()
    try:
        with pytest.raises(HostError, match="timed out"):
            any_host.run(argv, timeout=0.5)
        assert time.monotonic() - t0 < 2.5
        assert any_host.run(["echo", "after"]).stdout == "after\n"  # the host is usable afterwards
    finally:  # over SSH the remote sleep outlives its closed channel: stop it (same machine)
        for p in psutil.process_iter(["cmdline"]):
            if p.info["cmdline"] == argv:
                p.kill()


# --- processes ---------------------------------------------------------------------------------------------
def test_env_reaches_the_detached_process(any_host: Host, reaper: Reaper, tmp_path: Path) -> None:
    env = {"SPECTRIAL_A": "x y", "SPECTRIAL_B": "$HOME;`id` 'q' \"d\"", "SPECTRIAL_EMPTY": ""}
    pid = reaper.add(any_host, any_host.start_detached(["sleep", "30"], env=env,
                                                       log_path=str(tmp_path / "sleep.log")))
    # wait for the last exec to settle: the pid runs nohup, setsid and env before `sleep`, and /proc read during
    # an exec is not atomic (the listing retries, but an exec storm still shows a mixed snapshot now and then:
    # CI once saw `sleep 30` with the launcher's environment); a variable that never arrives still fails here
    def settled() -> list[Any]:
        return [p for p in any_host.processes(pid) if p.cmdline == ["sleep", "30"] and p.environ
                and {k: p.environ.get(k) for k in env} == env]

    procs = wait_for(settled, what="the detached sleep with its environment")
    (proc,) = procs  # type: ignore[misc]
    assert (proc.pid, proc.pgid, proc.cmdline) == (pid, pid, ["sleep", "30"])
    assert proc.environ is not None
    assert {k: proc.environ.get(k) for k in env} == env


@pytest.mark.ssh
def test_detached_process_survives_the_connection(sshd: SshdServer, reaper: Reaper, tmp_path: Path) -> None:
    host = sshd.host()
    pid = reaper.add(host, host.start_detached(["sleep", "30"], env=None, log_path=str(tmp_path / "s.log")))
    host.close()
    assert not host.connected
    other = sshd.host()
    time.sleep(0.2)  # give a SIGHUP, if one were sent, time to land
    assert other.alive(pid)
    assert [p.pgid for p in other.processes(pid)] == [pid]
    assert LocalHost().alive(pid)  # same machine: cross-check without SSH


def test_signal_group_stops_the_whole_group(any_host: Host, reaper: Reaper, tmp_path: Path) -> None:
    pid = reaper.add(any_host, any_host.start_detached(["sh", "-c", "sleep 100 & sleep 100"], env=None,
                                                       log_path=str(tmp_path / "g.log")))

    def sleeps() -> list[int]:
        return [p.pid for p in any_host.processes(pid) if p.cmdline == ["sleep", "100"]]

    children = wait_for(lambda: len(sleeps()) == 2 and sleeps(), what="two sleeps in the group")
    assert any_host.signal_group(pid, signal.SIGTERM)
    wait_for(lambda: not live_pids(any_host, pid), 5, "the group to exit")
    assert not any(any_host.alive(p) for p in [pid, *children])  # type: ignore[misc]
    # (the group may linger as zombies until init reaps them: alive() ignores zombies, kill -0 does not)


@pytest.mark.ssh
def test_process_listing_is_the_same_with_python_and_with_the_shell(sshd: SshdServer, reaper: Reaper,
                                                                     tmp_path: Path) -> None:
    host = sshd.host()
    pid = reaper.add(host, host.start_detached(["sh", "-c", "sleep 100 & sleep 100 & wait"],
                                               env={"SPECTRIAL_X": "a b\nc"}, log_path=str(tmp_path / "g.log")))
    wait_for(lambda: len(host.processes(pid)) == 3, what="the group of three")

    def view(procs: list) -> dict[int, tuple]:
        return {p.pid: (p.ppid, p.pgid, p.sid, p.start_ticks, p.cmdline, p.environ) for p in procs}

    t0 = time.monotonic()
    fast = view(host.processes(pid)), view(host.process_tree(pid)), view(host.processes())
    fast_s = time.monotonic() - t0
    host.use_python = False
    t0 = time.monotonic()
    slow = view(host.processes(pid)), view(host.process_tree(pid)), view(host.processes())
    slow_s = time.monotonic() - t0
    print(f"listing with python3 {fast_s * 1000:.0f} ms, with the shell loop {slow_s * 1000:.0f} ms")
    assert fast[0] == slow[0] and fast[1] == slow[1] and len(fast[0]) == 3
    assert fast[0][pid][4] == ["sh", "-c", "sleep 100 & sleep 100 & wait"]
    assert all(env is not None and env.get("SPECTRIAL_X") == "a b\nc" for *_, env in fast[0].values())
    assert all(fast[2][p] == slow[2][p] == fast[0][p] for p in fast[0])  # and within the full listing


def test_port_holders_names_the_listener(any_host: Host, reaper: Reaper, tmp_path: Path) -> None:
    port = free_port()
    assert any_host.port_holders(port) == []
    argv = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]
    pid = reaper.add(any_host, any_host.start_detached(argv, env=None, log_path=str(tmp_path / "http.log"),
                                                       cwd=str(tmp_path)))

    def listening() -> bool:
        assert any_host.alive(pid), any_host.read_text(str(tmp_path / "http.log"))
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return False

    wait_for(listening, what="http.server to listen")
    (holder,) = any_host.port_holders(port)
    assert holder.pid == pid and holder.pgid == pid
    assert holder.cmdline == argv


# --- files -------------------------------------------------------------------------------------------------
def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_files_round_trip_with_user_only_modes(any_host: Host, tmp_path: Path) -> None:
    text = "line one\nünïcödé ✓\n" + "x" * 70_000 + "\nend"
    src = tmp_path / "src.txt"
    src.write_text(text)
    os.chmod(src, 0o644)
    remote = tmp_path / "remote" / "put.txt"
    remote.parent.mkdir()
    any_host.put(src, str(remote))
    assert mode_of(remote) == 0o600
    assert any_host.run(["stat", "-c", "%a", str(remote)]).stdout.strip() == "600"
    any_host.put(src, str(remote), mode=0o640)  # overwrite
    assert mode_of(remote) == 0o640
    back = tmp_path / "back.txt"
    any_host.get(str(remote), back)
    assert back.read_text() == text

    wt = tmp_path / "remote" / "written.txt"
    any_host.write_text(str(wt), text)
    assert mode_of(wt) == 0o600 and wt.read_text() == text
    assert any_host.read_text(str(wt)) == text
    assert any_host.read_text(str(wt), max_bytes=3) == "end"
    assert sorted(p.name for p in wt.parent.iterdir()) == ["put.txt", "written.txt"]  # no temp leftovers


@pytest.mark.ssh
def test_ssh_get_creates_a_user_only_file(ssh_host: SSHHost, tmp_path: Path) -> None:
    src = tmp_path / "world.txt"
    src.write_text("secret")
    os.chmod(src, 0o644)
    dst = tmp_path / "copy.txt"
    ssh_host.get(str(src), dst)
    assert dst.read_text() == "secret" and mode_of(dst) == 0o600


@pytest.mark.ssh
def test_ssh_file_errors_name_the_path(ssh_host: SSHHost, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "f.txt"
    with pytest.raises(HostError, match="no-such-dir"):
        ssh_host.write_text(str(missing), "x")
    with pytest.raises(HostError, match="f.txt"):
        ssh_host.get(str(missing), tmp_path / "out.txt")
    assert not (tmp_path / "out.txt").exists() and list(tmp_path.iterdir()) == []


# --- connection: host keys, config, reconnects, failures ---------------------------------------------------
def fingerprint(pub_line: str, tmp_path: Path) -> str:
    """SHA256 fingerprint of a public key as OpenSSH's own ssh-keygen prints it."""
    f = tmp_path / "key.pub"
    f.write_text(pub_line + "\n")
    return subprocess.run(["ssh-keygen", "-lf", str(f)], check=True, capture_output=True,
                          text=True).stdout.split()[1]


@pytest.mark.ssh
def test_unknown_host_key_is_refused_with_its_fingerprint(sshd: SshdServer, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = sshd.host(connect=False, known_hosts=str(empty))
    t0 = time.monotonic()
    with pytest.raises(HostKeyError) as info:
        host.run(["true"])
    assert time.monotonic() - t0 < 2  # refused at once, not retried
    fp = fingerprint(sshd.host_key_pub, tmp_path)
    msg = str(info.value)
    assert isinstance(info.value, ConfigError)
    assert (info.value.fingerprint, info.value.key_type) == (fp, "ssh-ed25519")
    assert fp in msg and "ssh-ed25519" in msg and f"[{sshd.address}]:{sshd.port}" in msg
    assert f"ssh-keyscan -p {sshd.port} {sshd.address} >> {empty}" in msg  # the file given, not ~/.ssh's
    assert "known_hosts" in msg and not host.connected


@pytest.mark.ssh
def test_changed_host_key_is_refused(sshd: SshdServer, tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    other = (tmp_path / "other.pub").read_text().split()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{sshd.address}]:{sshd.port} {other[0]} {other[1]}\n")
    with pytest.raises(HostKeyError, match="CHANGED") as info:
        sshd.host(known_hosts=str(kh))
    assert info.value.fingerprint == fingerprint(sshd.host_key_pub, tmp_path)
    assert fingerprint(" ".join(other), tmp_path) in str(info.value)


@pytest.mark.ssh
def test_lenient_host_keys_connect_when_asked(sshd: SshdServer, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = sshd.host(known_hosts=str(empty), strict_host_keys=False)
    assert host.run(["echo", "ok"]).stdout == "ok\n"
    assert empty.read_text() == ""  # nothing is written to known_hosts


@pytest.mark.ssh
def test_ssh_config_alias(sshd: SshdServer) -> None:
    # key, user, port and known_hosts all come from the generated ssh config (UserKnownHostsFile)
    host = get_host(f"ssh:{sshd.alias}", ssh_config=sshd.ssh_config)
    assert isinstance(host, SSHHost) and host.name == f"ssh:{sshd.alias}"
    try:
        conn = host.run('printf %s "$SSH_CONNECTION"').stdout.split()
        assert conn[2:] == [sshd.address, str(sshd.port)]
        assert host.run(["id", "-un"]).stdout.strip() == sshd.user
    finally:
        host.close()


@pytest.mark.ssh
def test_reconnects_after_the_client_closed(sshd: SshdServer) -> None:
    host = sshd.host()
    first = host._conn
    assert host.run(["echo", "1"]).stdout == "1\n"
    assert first is not None
    first.close()
    assert host.run(["echo", "2"]).stdout == "2\n"
    assert host._conn is not first and host.connects == 2


@pytest.mark.ssh
def test_reconnects_after_the_server_dropped_the_connection(sshd: SshdServer, tmp_path: Path) -> None:
    host = sshd.host()
    session_pid = int(host.run('printf %s "$PPID"').stdout)  # the per-connection sshd process
    assert "sshd" in " ".join(psutil.Process(session_pid).cmdline())  # same machine: check it is sshd
    host.start_detached(["sh", "-c", f"sleep 0.3; kill {session_pid}"], env=None, log_path=str(tmp_path / "k"))
    wait_for(lambda: not host.connected, 5, "the server to drop the connection")
    assert host.run(["echo", "back"]).stdout == "back\n"
    assert host.connects == 2


@pytest.mark.ssh
def test_closed_port_fails_after_the_retries(sshd: SshdServer) -> None:
    port = free_port()
    host = SSHHost.from_spec(f"ssh://root@127.0.0.1:{port}", key_filename=sshd.key_filename,
                             known_hosts=sshd.known_hosts, retries=2, backoff_s=0.1)
    t0 = time.monotonic()
    with pytest.raises(HostError) as info:
        host.run(["true"])
    elapsed = time.monotonic() - t0
    assert 0.3 <= elapsed < 5  # waited 0.1 + 0.2 s between three attempts
    msg = str(info.value)
    assert "3 attempt(s)" in msg and f"127.0.0.1:{port}" in msg and "is sshd running" in msg


@pytest.mark.ssh
def test_silent_server_times_out(sshd: SshdServer) -> None:
    with socket.socket() as silent:  # accepts TCP (kernel backlog) but never sends an SSH banner
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        host = SSHHost.from_spec(f"ssh://root@127.0.0.1:{port}", key_filename=sshd.key_filename,
                                 known_hosts=sshd.known_hosts, connect_timeout=0.5, retries=1, backoff_s=0.05)
        t0 = time.monotonic()
        with pytest.raises(HostError, match=r"2 attempt\(s\)"):
            host.connect()
        assert 1.0 <= time.monotonic() - t0 < 4


@pytest.mark.ssh
def test_authentication_failure_names_the_key_option(sshd: SshdServer, tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "stranger")], check=True)
    empty_config = tmp_path / "ssh_config"
    empty_config.write_text("")  # keep ~/.ssh/config out of it
    host = SSHHost.from_spec(sshd.spec, key_filename=str(tmp_path / "stranger"), known_hosts=sshd.known_hosts,
                             ssh_config=str(empty_config))
    with pytest.raises(ConfigError, match="key_filename"):
        host.connect()


@pytest.mark.ssh
def test_several_servers_are_independent(sshd_factory: Callable[[int], list[SshdServer]]) -> None:
    servers = sshd_factory(2)
    hosts = [s.host() for s in servers]
    seen = [h.run('printf %s "$SSH_CONNECTION"').stdout.split()[2:] for h in hosts]
    assert seen == [[s.address, str(s.port)] for s in servers]
    assert len({s.address for s in servers}) == 2
    servers[0].stop()
    with pytest.raises(HostError):
        SSHHost.from_spec(servers[0].spec, key_filename=servers[0].key_filename,
                          known_hosts=servers[0].known_hosts, retries=0).connect()
    assert hosts[1].run(["echo", "still"]).stdout == "still\n"


@pytest.mark.ssh
def test_sudo_prefixes_commands(sshd: SshdServer) -> None:
    host = sshd.host(sudo=True)
    res = host.run(["id", "-u"], check=False)
    assert res.command.startswith("sudo -n sh -c ")
    if LocalHost().which("sudo"):
        assert res.ok and res.stdout.strip() == "0"
    else:
        assert res.exit_code == 127 and "sudo" in res.stderr


@pytest.mark.parametrize(("spec", "expected"), [
    ("ssh://alice@gpu-1.example.org:2222", ("alice", "gpu-1.example.org", 2222)),
    ("ssh://10.0.0.5", (None, "10.0.0.5", None)),
    ("ssh://bob@[::1]:22", ("bob", "::1", 22)),
    ("ssh:gpubox", (None, "gpubox", None)),
    ("ssh:carol@gpubox", ("carol", "gpubox", None)),
])
def test_parse_spec(spec: str, expected: tuple[str | None, str, int | None]) -> None:
    assert parse_spec(spec) == expected


@pytest.mark.parametrize("spec", ["ssh://", "ssh://host:99999", "ssh:a b", "ssh://u@h:p", "ssh:x;rm"])
def test_bad_specs_are_config_errors(spec: str) -> None:
    with pytest.raises(ConfigError, match="host"):
        SSHHost.from_spec(spec)
