"""pytest fixtures around real OpenSSH `sshd` instances on loopback (for tests marked `ssh`).

- `sshd` (session): one sshd on 127.0.0.1 and a free port; an `SshdServer` with `spec`, `port`,
  `key_filename`, `known_hosts`, `ssh_config` (alias `spectrial-test`), `host_key_pub` and `host()`.
- `sshd_factory` (session): `sshd_factory(n)` starts n more independent sshd on 127.0.0.2, 127.0.0.3, ...
- `ssh_host` (session): one connected `SSHHost` on `sshd`, shared by tests that do not break connections.
- `any_host` (function, parametrised `local` / `ssh`): the same test on `LocalHost` and on `SSHHost`.
- `reaper` (function): `reaper.add(host, pgid)` registers a started process group; teardown stops it.

Each sshd runs in the foreground (`sshd -D -f CONFIG -E LOG`) under Popen, owned and stopped by the
fixture, with throwaway host and user keys (ed25519) and its own config in a temp dir; the system sshd
config and service are never touched. When /usr/sbin/sshd is missing the fixture runs
scripts/ensure-sshd.sh, and skips with the reason if that cannot provide it.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from spectrial.hosts.local import Host, LocalHost
from spectrial.hosts.ssh import SSHHost

SSHD = Path("/usr/sbin/sshd")
ENSURE_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ensure-sshd.sh"
START_TIMEOUT_S = 10.0
ALIAS = "spectrial-test"

SSHD_CONFIG = """\
# throwaway sshd for spectrial tests; nothing here applies to the system sshd
Port {port}
ListenAddress {address}
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PermitUserEnvironment no
# no AcceptEnv line: the client's environment is never accepted (spectrial puts env on the command line)
X11Forwarding no
PrintMotd no
PrintLastLog no
UseDNS no
# bash sources ~/.bashrc for commands run by sshd unless SHLVL says it is nested; root's .bashrc on a dev
# box (pyenv/conda init) costs ~0.4 s per command, which would time the dev box instead of spectrial
SetEnv SHLVL=1
Subsystem sftp internal-sftp
LogLevel VERBOSE
"""

SSH_CONFIG = """\
Host {alias}
    HostName {address}
    Port {port}
    User {user}
    IdentityFile {key}
    IdentitiesOnly yes
    UserKnownHostsFile {known_hosts}
"""


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


_handed_out: set[int] = set()


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port free on `address` right now (the caller binds it soon after), chosen **outside** the kernel's
    ephemeral range: a port from `bind(0)` is one the kernel also gives to anyone else binding port 0 meanwhile
    (CI saw a papermill kernel's ZMQ socket take the llama-server port the test had just picked), as a server
    port such as 8089 in real use never is. Never the same port twice in one test session."""
    lo, hi = _ephemeral_range()
    pool = range(15000, lo) if lo - 15000 >= 2000 else range(hi + 1, 65536)
    rng = random.SystemRandom()
    for _ in range(500):
        port = rng.choice(pool)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((address, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # a crowded machine: fall back to the kernel's choice
        s.bind((address, 0))
        return s.getsockname()[1]


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)


@dataclass
class SshdServer:
    """One running sshd: where it listens, the client-side files to reach it, and its process."""

    address: str
    port: int
    user: str
    workdir: Path
    key_filename: str
    known_hosts: str
    ssh_config: str
    host_key_pub: str
    log_path: Path
    proc: subprocess.Popen[bytes]
    alias: str = ALIAS
    _hosts: list[SSHHost] = field(default_factory=list)

    @property
    def spec(self) -> str:
        return f"ssh://{self.user}@{self.address}:{self.port}"

    def host(self, connect: bool = True, **options: object) -> SSHHost:
        """An `SSHHost` on this server (key and known_hosts preset; `options` override), closed at teardown."""
        opts: dict[str, object] = {"key_filename": self.key_filename, "known_hosts": self.known_hosts}
        opts.update(options)
        h = SSHHost.from_spec(self.spec, **opts)  # type: ignore[arg-type]
        self._hosts.append(h)
        return h.connect() if connect else h

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no sshd log)"

    def stop(self) -> None:
        """Close the hosts handed out, then stop sshd (TERM, then KILL after 5 s)."""
        for h in self._hosts:
            with contextlib.suppress(Exception):
                h.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _ensure_sshd() -> None:
    """Install sshd through scripts/ensure-sshd.sh when missing; skip the test when it stays missing."""
    if SSHD.exists():
        return
    res = subprocess.run(["bash", str(ENSURE_SCRIPT)], capture_output=True, text=True, timeout=600)
    if not SSHD.exists():
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-5:])
        pytest.skip(f"{SSHD} is missing and scripts/ensure-sshd.sh could not install it:\n{tail}")


def _probe(server: SshdServer) -> int | None:
    """Connect, read sshd's banner and close with nothing unread (sshd then waits for ours and sends nothing
    more): an orderly close, never a reset. The probe's local port, or None while sshd does not answer yet."""
    with contextlib.suppress(OSError), socket.create_connection((server.address, server.port), 0.5) as sock:
        sock.settimeout(2)
        got = b""
        while b"\n" not in got and len(got) < 1024:
            chunk = sock.recv(256)
            if not chunk:
                return None
            got += chunk
        if not got.startswith(b"SSH-"):
            return None
        return sock.getsockname()[1]
    return None


def _logged_close(server: SshdServer, port: int) -> bool:
    """Whether sshd's log has the close of the connection from local `port`."""
    text = server.log_path.read_text(errors="replace") if server.log_path.exists() else ""
    return any("Connection closed by" in ln and f" port {port} " in f"{ln} " for ln in text.splitlines())


class SshdPool:
    """Starts sshd instances in one temp dir and stops them all at the end of the session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.servers: list[SshdServer] = []
        self.user = getpass.getuser()
        _ensure_sshd()
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)  # sshd's privilege-separation dir
        self.key = root / "id_ed25519"
        _keygen(self.key, "spectrial-test-user")
        (root / "authorized_keys").write_text((root / "id_ed25519.pub").read_text())

    def start(self, address: str = "127.0.0.1", alias: str = ALIAS) -> SshdServer:
        """One more sshd on `address` (a free port); raises with the log tail when it does not come up."""
        last_error = ""
        for _ in range(3):  # a free port can be taken between probing it and sshd binding it
            server = self._launch(address, free_port(address), alias)
            last_error = self._wait_ready(server)
            if not last_error:
                self.servers.append(server)
                return server
            server.stop()
        raise RuntimeError(f"sshd on {address} did not start: {last_error}")

    def _launch(self, address: str, port: int, alias: str) -> SshdServer:
        d = self.root / f"sshd-{address}-{port}"
        d.mkdir(mode=0o700)
        host_key = d / "ssh_host_ed25519_key"
        _keygen(host_key, f"spectrial-test-host-{address}")
        pub = (d / "ssh_host_ed25519_key.pub").read_text().split()
        known_hosts = d / "known_hosts"
        known_hosts.write_text(f"[{address}]:{port} {pub[0]} {pub[1]}\n")
        config = d / "sshd_config"
        config.write_text(SSHD_CONFIG.format(port=port, address=address, host_key=host_key,
                                             pid_file=d / "sshd.pid", authorized_keys=self.root / "authorized_keys"))
        ssh_config = d / "ssh_config"
        ssh_config.write_text(SSH_CONFIG.format(alias=alias, address=address, port=port, user=self.user,
                                                key=self.key, known_hosts=known_hosts))
        log_path = d / "sshd.log"
        proc = subprocess.Popen([str(SSHD), "-D", "-f", str(config), "-E", str(log_path)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return SshdServer(address, port, self.user, d, str(self.key), str(known_hosts), str(ssh_config),
                          f"{pub[0]} {pub[1]}", log_path, proc, alias)

    @staticmethod
    def _wait_ready(server: SshdServer) -> str:
        """'' once sshd answers with its SSH banner and has logged the probe's close; else why not (exit code or
        timeout, with the log tail).

        The probe reads the banner before closing: a probe that closed with the banner unread
        reset the connection, and sshd's child logged "kex_exchange_identification: read: Connection reset by
        peer", late under load, after a test had taken the log's length to look for complaints (seen in CI). The
        probe's close is waited for in the log for the same reason."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                return f"sshd exited with code {server.proc.returncode}\n{server.log_tail()}"
            port = _probe(server)
            if port is not None:
                while time.monotonic() < deadline:
                    if _logged_close(server, port):
                        return ""
                    time.sleep(0.05)
                return f"sshd never logged the probe's close within {START_TIMEOUT_S} s\n{server.log_tail()}"
            time.sleep(0.05)
        return f"sshd not listening after {START_TIMEOUT_S} s\n{server.log_tail()}"

    def stop_all(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture(scope="session")
def sshd_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdPool]:
    """The session's sshd instances (started on demand by `sshd` and `sshd_factory`)."""
    pool = SshdPool(tmp_path_factory.mktemp("sshd"))
    yield pool
    pool.stop_all()


@pytest.fixture(scope="session")
def sshd(sshd_pool: SshdPool) -> SshdServer:
    """A real sshd on 127.0.0.1 with throwaway keys."""
    return sshd_pool.start("127.0.0.1")


@pytest.fixture(scope="session")
def sshd_factory(sshd_pool: SshdPool) -> Callable[[int], list[SshdServer]]:
    """`sshd_factory(n)`: n new independent sshd, each on its own loopback address (127.0.0.2, ...)."""
    counter = iter(range(2, 255))

    def make(n: int) -> list[SshdServer]:
        return [sshd_pool.start(f"127.0.0.{next(counter)}", alias=f"{ALIAS}-{i}") for i in range(n)]

    return make


@pytest.fixture(scope="session")
def ssh_host(sshd: SshdServer) -> SSHHost:
    """A connected SSHHost on `sshd`, shared across the session (do not close it in a test)."""
    return sshd.host()


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def any_host(request: pytest.FixtureRequest) -> Host:
    """The same test on this machine (`LocalHost`) and over SSH (`SSHHost` on loopback)."""
    if request.param == "local":
        return LocalHost()
    return request.getfixturevalue("ssh_host")


class Reaper:
    """Process groups started by a test; `stop()` sends TERM then KILL to each group that still exists."""

    def __init__(self) -> None:
        self.groups: list[tuple[Host, int]] = []

    def add(self, host: Host, pgid: int) -> int:
        self.groups.append((host, pgid))
        return pgid

    def stop(self) -> None:
        for host, pgid in self.groups:
            with contextlib.suppress(Exception):
                if host.signal_group(pgid, signal.SIGTERM):
                    deadline = time.monotonic() + 3
                    while time.monotonic() < deadline and any(host.alive(p.pid) for p in host.processes(pgid)):
                        time.sleep(0.05)
                    host.signal_group(pgid, signal.SIGKILL)  # zombies ignore it; a straggler does not


@pytest.fixture
def reaper() -> Iterator[Reaper]:
    """Register started process groups with `reaper.add(host, pgid)`; they are stopped at teardown."""
    r = Reaper()
    yield r
    r.stop()
