"""The SSH connection is closed cleanly (issue 26): sshd logs a disconnect, never `Connection reset by peer`.

paramiko's `close()` just closes the socket, and unread bytes in it (a keepalive reply, a window adjust)
turn that into a TCP reset: sshd logged "Read error ...: Connection reset by peer" at every exit of the CLI.
`SSHHost.close()` now says goodbye (SSH_MSG_DISCONNECT) and lets sshd close first, with port forwards and
their streams closed before; hosts still open at interpreter exit are closed the same way.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sshd_plugin import Reaper, SshdServer, free_port

pytestmark = pytest.mark.ssh


def sshd_says(server: SshdServer, client_port: str, timeout_s: float = 5.0) -> list[str]:
    """The sshd log lines about the connection from `client_port`, once it logged its end."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [ln for ln in server.log_path.read_text(errors="replace").splitlines()
                 if f"port {client_port}:" in ln or ln.endswith(f"port {client_port}")]
        ended = any("Disconnected from" in ln or "reset by peer" in ln or "Connection closed" in ln for ln in lines)
        if ended or time.monotonic() > deadline:
            return lines


def test_close_says_goodbye_with_a_stream_open(sshd: SshdServer, reaper: Reaper, tmp_path: Path) -> None:
    host = sshd.host()
    client_port = host.run('printf %s "$SSH_CONNECTION"').stdout.split()[1]
    (tmp_path / "big.bin").write_bytes(b"\0" * (16 << 20))
    port = free_port()
    argv = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]
    reaper.add(host, host.start_detached(argv, env=None, log_path=str(tmp_path / "http.log"), cwd=str(tmp_path)))
    url = host.client_url(port)
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{url}/", timeout=2)
            break
        except httpx.HTTPError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    with httpx.Client(timeout=10) as client, client.stream("GET", f"{url}/big.bin") as r:
        next(r.iter_raw())  # a download in flight, megabytes still to come
        host.write_text(str(tmp_path / "via-sftp.txt"), "an SFTP session is open too")
        t0 = time.monotonic()
        host.close()
        took = time.monotonic() - t0
    lines = sshd_says(sshd, client_port)
    print(f"close took {took:.3f} s; sshd: ", *lines[-3:], sep="\n  ")
    assert any("Received disconnect" in ln and ":11: spectrial closing" in ln for ln in lines), lines
    assert not any("reset by peer" in ln for ln in lines), lines
    assert took < 3 and not host.connected and not host.forwards()
    assert host.run(["echo", "again"]).stdout == "again\n"  # closing is not the end: the next command reconnects
    host.close()


def test_interpreter_exit_says_goodbye(sshd: SshdServer) -> None:
    code = ("import sys; from spectrial.hosts.ssh import SSHHost\n"
            f"h = SSHHost.from_spec({sshd.spec!r}, key_filename={sshd.key_filename!r}, known_hosts={sshd.known_hosts!r})\n"
            "h.client_url(1)\n"  # a forward open too
            "print(h.run('printf %s \"$SSH_CONNECTION\"').stdout.split()[1])\n")  # and never closed
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = sshd_says(sshd, res.stdout.strip())
    assert any("Received disconnect" in ln and "spectrial closing" in ln for ln in lines), lines
    assert not any("reset by peer" in ln for ln in lines), lines
