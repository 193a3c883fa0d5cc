"""SSH hosts: the `Host` verbs over one fabric `Connection`, with host keys checked against known_hosts.

`SSHHost.from_spec("ssh://user@host:port")` or `SSHHost.from_spec("ssh:ALIAS")` (an alias of the ssh config,
`~/.ssh/config` unless the `ssh_config` option names another file). What it adds to fabric:

- host keys are enforced: fabric's `AutoAddPolicy` is replaced by a policy that refuses unknown keys (or,
  with `strict_host_keys=False`, accepts them with a warning); a refused or changed key raises
  `HostKeyError` (a `ConfigError`) naming the host, key type, SHA256 fingerprint and how to accept it;
- transient connection failures are retried with exponential backoff (tenacity), and a connection that
  dropped between two commands is replaced by a new `Connection` before the next command;
- a connection that dropped and cannot be re-established within the retries (at most `RECONNECT_WINDOW_S`)
  raises `ConnectionLost` (host, since when); from then on commands and forwards fail at once (one new
  attempt at most every `RETRY_LOST_EVERY_S`) instead of each waiting out the retries again;
  `reachable()` tries once, `reconnect()` starts over;
- keepalive on the transport, a connect timeout that also bounds the banner and authentication phases;
  TCP_NODELAY (each command costs ~4 ms on loopback instead of ~45 ms of Nagle + delayed ACK) and
  TCP_USER_TIMEOUT (a peer that stops acknowledging is declared dead after `dead_after_s`);
- Ctrl-C during a command closes its channel and reaches the caller unchanged (fabric would wait on);
- `close()` (also run at interpreter exit for hosts still open) closes the forwards, then says goodbye
  (SSH_MSG_DISCONNECT) and lets sshd close first, so sshd logs a disconnect, not a reset;
- file transfer over SFTP that never leaves the data readable by others (private temp dir, chmod, rename);
- `sudo=True` runs every command through `sudo -n sh -c ...` (never prompts); files still move over SFTP
  as the login user;
- command lines longer than 100 kB (Linux caps one argument at 128 kB, and sshd passes the whole line as one)
  are shipped as a private script file and run with `sh`.

Known hosts, as OpenSSH reads them: /etc/ssh/ssh_known_hosts plus either the `known_hosts` option, or the ssh
config's UserKnownHostsFile, or ~/.ssh/known_hosts. Nothing is ever written to a known_hosts file.

Commands are POSIX shell lines built by `Host` (env goes on the command line as quoted `env K=V`; fabric's
own inline env is never used since it is not quoted). The login shell of the remote user must be POSIX.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import io
import logging
import math
import os
import re
import shlex
import socket
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fabric import Config, Connection
from fabric.runners import Remote
from invoke.exceptions import CommandTimedOut
from paramiko import HostKeys, SFTPClient, Transport
from paramiko.client import MissingHostKeyPolicy, SSHClient
from paramiko.common import cMSG_DISCONNECT
from paramiko.message import Message
from paramiko.pkey import PKey
from paramiko.ssh_exception import AuthenticationException, BadHostKeyException, SSHException
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential

from spectrial.errors import ConfigError, ConnectionLost, HostError, HostKeyError
from spectrial.hosts.local import CommandResult, RemoteShellHost
from spectrial.hosts.tunnel import PortForward
from spectrial.schema import SshIdentity, utc_now

log = logging.getLogger(__name__)
# paramiko's transport thread logs every failed handshake with its traceback ("Exception (client): Error reading
# SSH protocol banner"); with no logging configured Python prints those to stderr, above spectrial's one-line
# error that already says what failed. A NullHandler keeps them out of a terminal; an application that
# configures logging still receives them.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

_URL_SPEC_RE = re.compile(
    r"^ssh://(?:(?P<user>[^@/:\s\[\]]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^@/:\s\[\]]+)(?::(?P<port>\d{1,5}))?/?$"
)
_ALIAS_SPEC_RE = re.compile(r"^ssh:(?!//)(?:(?P<user>[^@/:\s]+)@)?(?P<host>[A-Za-z0-9._-]+)$")
_KNOWN_HOSTS_NAME_RE = re.compile(r"^\[(.+)\]:(\d+)$")
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
USER_KNOWN_HOSTS = "~/.ssh/known_hosts"
MAX_INLINE_COMMAND_BYTES = 100_000  # longer lines go through a script file (Linux MAX_ARG_STRLEN is 128 kB)
RECONNECT_WINDOW_S = 10.0  # after a drop, reconnect attempts stop after this long (or after `retries`)
RETRY_LOST_EVERY_S = 5.0  # once given up: one new attempt at most this often; otherwise ConnectionLost at once
CLOSE_WAIT_S = 1.0  # close(): how long to wait for sshd to close its end after our disconnect message
DISCONNECT_BY_APPLICATION = 11  # RFC 4253 SSH_DISCONNECT_BY_APPLICATION
_OPEN_HOSTS: weakref.WeakSet[SSHHost] = weakref.WeakSet()
SFTP_HINT = ("the SSH server offers no sftp subsystem; spectrial moves files over SFTP (the tiny models and "
             "its llama.cpp build uploaded to the cache folder, launch scripts, server logs and records "
             "fetched back). Enable it in the server's /etc/ssh/sshd_config with the line\n"
             "    Subsystem sftp internal-sftp\n"
             "(or the path of its sftp-server, e.g. `Subsystem sftp /usr/lib/openssh/sftp-server`) and reload "
             "sshd (`sudo systemctl reload ssh` or sshd)")


class _UnknownHostKey(SSHException):
    """Raised inside paramiko's handshake by `_RejectUnknown`; turned into `HostKeyError` by `SSHHost`."""

    def __init__(self, hostname: str, key: PKey) -> None:
        self.hostname, self.key = hostname, key
        super().__init__(f"{key.get_name()} host key of {hostname} is not in known_hosts")


class _RejectUnknown(MissingHostKeyPolicy):
    """Refuse a host whose key no known_hosts file lists (OpenSSH `StrictHostKeyChecking yes`)."""

    def missing_host_key(self, client: SSHClient, hostname: str, key: PKey) -> None:
        raise _UnknownHostKey(hostname, key)


class _AcceptWithWarning(MissingHostKeyPolicy):
    """Accept an unknown host key for this connection only, logging its fingerprint (`strict_host_keys=False`)."""

    def missing_host_key(self, client: SSHClient, hostname: str, key: PKey) -> None:
        log.warning("accepting unknown %s host key of %s (%s) without checking it",
                    key.get_name(), hostname, key.fingerprint)
        client.get_host_keys().add(hostname, key.get_name(), key)


class _SessionNotOpened(SSHException):
    """No channel could be opened: the command was never sent, so running it again is safe."""


class _Remote(Remote):
    """fabric's remote runner, except that Ctrl-C closes the command's channel and re-raises at once (fabric
    forwards it only to a pty and otherwise waits for the output threads), and a timeout is recognised even
    when the channel closed before invoke's timer thread finished (invoke then reported exit -1)."""

    fired = False

    def send_interrupt(self, interrupt: KeyboardInterrupt) -> None:
        with contextlib.suppress(Exception):
            self.channel.close()  # the output threads see the end: nothing waits for the remote command
        raise interrupt

    def kill(self) -> None:
        self.fired = True  # set before the channel closes, so `_finish` cannot miss it
        super().kill()

    @property
    def timed_out(self) -> bool:
        return self.fired

    def stop(self) -> None:
        with contextlib.suppress(Exception):  # closing on a dead transport must not mask the real outcome
            super().stop()


class _Connection(Connection):
    """A fabric Connection whose session-open failures are marked as 'command not sent', and that never
    reconnects behind SSHHost's back (fabric's `open()` would, with no retries, tuning or accounting)."""

    opened = False

    def open(self) -> Any:
        if self.opened and not self.is_connected:
            raise _SessionNotOpened("the SSH connection dropped")
        result = super().open()
        self.opened = True
        return result

    def create_session(self) -> Any:
        if not self.is_connected:
            raise _SessionNotOpened("the SSH connection is closed")
        try:
            return super().create_session()
        except (SSHException, EOFError, OSError) as exc:
            raise _SessionNotOpened(f"could not open an SSH channel: {exc}") from exc


def _transient(exc: BaseException) -> bool:
    """True for connection failures worth retrying (refused, reset, timeout, banner); False for auth/keys/DNS."""
    if isinstance(exc, (_UnknownHostKey, BadHostKeyException, AuthenticationException, socket.gaierror)):
        return False
    return isinstance(exc, (OSError, EOFError, SSHException))


def _key_fingerprint(path: str) -> str:
    """SHA256 fingerprint of a key file's public half (its .pub beside it, else the private key when it is not
    encrypted); '' when neither can be read."""
    path = os.path.expanduser(path)
    with contextlib.suppress(OSError, ValueError, SSHException):
        kind, b64 = Path(f"{path}.pub").read_text().split()[:2]
        return PKey.from_type_string(kind, base64.b64decode(b64)).fingerprint
    with contextlib.suppress(OSError, ValueError, SSHException):
        return PKey.from_path(path).fingerprint
    return ""


def _connect_reason(exc: BaseException) -> str:
    """One line on why a connection attempt failed (paramiko's NoValidConnectionsError says "[Errno None]")."""
    errors = getattr(exc, "errors", None)  # NoValidConnectionsError: {(addr, port): OSError}
    if isinstance(errors, dict) and errors:
        return "; ".join(sorted({(e.strerror or str(e)).lower() for e in errors.values()}))
    if isinstance(exc, socket.gaierror):
        return f"the host name does not resolve ({exc.strerror or exc})"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out (no answer)"
    if isinstance(exc, SSHException) and "banner" in str(exc):
        return f"no SSH server answered on that port ({exc})"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _tune_socket(transport: Transport, dead_after_s: float) -> None:
    """TCP_NODELAY and TCP_USER_TIMEOUT on the transport's socket (a proxy/gateway channel is left alone)."""
    sock = transport.sock
    if not isinstance(sock, socket.socket):
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if dead_after_s > 0 and hasattr(socket, "TCP_USER_TIMEOUT"):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(dead_after_s * 1000))


def _close_gracefully(conn: Connection, wait_s: float = CLOSE_WAIT_S) -> None:
    """Close `conn` the way OpenSSH does: SFTP and channels first, then SSH_MSG_DISCONNECT, then let sshd close
    its end and the transport thread read to the end, so no unread byte turns our close into a reset."""
    with contextlib.suppress(Exception):
        if conn._sftp is not None:
            conn._sftp.close()
            conn._sftp = None
    transport = conn.client.get_transport()
    if transport is not None and transport.is_active():
        msg = Message()
        msg.add_byte(cMSG_DISCONNECT)
        msg.add_int(DISCONNECT_BY_APPLICATION)
        msg.add_string("spectrial closing")
        msg.add_string("")
        with contextlib.suppress(Exception):
            transport._send_user_message(msg)  # the thread-safe send path (waits out a key exchange)
            if transport is not threading.current_thread():
                transport.join(wait_s)  # sshd closes on the disconnect; the transport thread then closes the socket
    with contextlib.suppress(Exception):
        conn.close()
    conn.client.close()


@atexit.register
def _close_open_hosts() -> None:
    """At interpreter exit, close the SSH hosts still open (clean disconnect instead of a reset)."""
    for host in list(_OPEN_HOSTS):
        with contextlib.suppress(Exception):
            host.close()


def _split_known_hosts_name(name: str) -> tuple[str, int]:
    """(host, port) of a known_hosts name: `host` (port 22) or `[host]:port`."""
    m = _KNOWN_HOSTS_NAME_RE.match(name)
    return (m[1], int(m[2])) if m else (name, 22)


def parse_spec(spec: str) -> tuple[str | None, str, int | None]:
    """(user, host or alias, port) of `ssh://[user@]host[:port]` or `ssh:[user@]ALIAS`."""
    m = _URL_SPEC_RE.match(spec) or _ALIAS_SPEC_RE.match(spec)
    if not m:
        raise ConfigError(f"host: {spec!r} is not an SSH host spec; use 'ssh://user@host:port' "
                          "or 'ssh:ALIAS' (an alias from ~/.ssh/config)")
    host = m["host"].strip("[]")
    port = int(m["port"]) if m.groupdict().get("port") else None
    if port is not None and not 0 < port < 65536:
        raise ConfigError(f"host: port {port} in {spec!r} is out of range (1-65535)")
    return m["user"], host, port


class SSHHost(RemoteShellHost):
    """A machine reached over SSH (fabric/paramiko), known_hosts enforced, reconnecting between commands."""

    def __init__(self, host: str, *, user: str | None = None, port: int | None = None, name: str | None = None,
                 key_filename: str | Sequence[str] | None = None, known_hosts: str | Sequence[str] | None = None,
                 ssh_config: str | None = None, connect_timeout: float = 10, keepalive_s: int = 15,
                 retries: int = 3, backoff_s: float = 0.5, sudo: bool = False,
                 strict_host_keys: bool = True, dead_after_s: float = 10) -> None:
        """Describe the host; nothing connects before `connect()` or the first command.

        `dead_after_s`: a connection whose sent data stays unacknowledged this long is closed (TCP_USER_TIMEOUT;
        0: the kernel's default, many minutes).
        """
        if retries < 0:
            raise ConfigError(f"retries: {retries} must be >= 0 (extra connection attempts)")
        if connect_timeout <= 0:
            raise ConfigError(f"connect_timeout: {connect_timeout} must be > 0 seconds")
        self.name = name or f"ssh://{user + '@' if user else ''}{host}{f':{port}' if port else ''}"
        self._target, self._user, self._port = host, user, port
        self.key_filename = [key_filename] if isinstance(key_filename, str) else list(key_filename or [])
        self.known_hosts = [known_hosts] if isinstance(known_hosts, str) else (
            list(known_hosts) if known_hosts is not None else None)
        self.connect_timeout, self.keepalive_s, self.dead_after_s = connect_timeout, keepalive_s, dead_after_s
        self.retries, self.backoff_s = retries, backoff_s
        self.sudo, self.strict_host_keys = sudo, strict_host_keys
        self._config = self._load_config(ssh_config)
        self._ssh_config_path = os.path.expanduser(ssh_config) if ssh_config else None
        self._is_alias = bool(name and name.startswith("ssh:") and not name.startswith("ssh://"))
        self._conn: _Connection | None = None
        self._home: str | None = None
        self._known_hosts_loaded: list[str] = []
        self._last_target: tuple[str, int] | None = None  # (host, port) of the last connection attempt
        self.connects = 0  # how many connections this host opened (reconnects included)
        self._lock = threading.RLock()  # (re)connecting happens from forward threads too
        self._forwards: dict[tuple[str, int], PortForward] = {}
        self._dropped_at: str | None = None  # when a drop was noticed (UTC), until a reconnect succeeds
        self._dropped_mono = 0.0
        self._lost: ConnectionLost | None = None  # set once reconnecting after a drop failed
        self._lost_tried = 0.0
        self._closed_on_purpose = False  # close() was called: the next connect is not a reconnect
        _OPEN_HOSTS.add(self)

    @classmethod
    def from_spec(cls, spec: str, *, key_filename: str | Sequence[str] | None = None,
                  known_hosts: str | Sequence[str] | None = None, connect_timeout: float = 10,
                  keepalive_s: int = 15, retries: int = 3, sudo: bool = False, strict_host_keys: bool = True,
                  ssh_config: str | None = None, backoff_s: float = 0.5, dead_after_s: float = 10) -> SSHHost:
        """Host from `ssh://[user@]host[:port]` or `ssh:[user@]ALIAS`; `name` is the spec itself."""
        user, host, port = parse_spec(spec)
        return cls(host, user=user, port=port, name=spec, key_filename=key_filename, known_hosts=known_hosts,
                   ssh_config=ssh_config, connect_timeout=connect_timeout, keepalive_s=keepalive_s,
                   retries=retries, backoff_s=backoff_s, sudo=sudo, strict_host_keys=strict_host_keys,
                   dead_after_s=dead_after_s)

    # --- connection ----------------------------------------------------------------------------------
    @staticmethod
    def _load_config(ssh_config: str | None) -> Config:
        overrides = {"run": {"encoding": "utf-8"}, "runners": {"remote": _Remote}}
        if ssh_config is None:
            return Config(overrides=overrides)
        path = os.path.expanduser(ssh_config)
        if not os.path.isfile(path):
            raise ConfigError(f"ssh_config: {ssh_config!r} is not a file; give the path of an ssh config "
                              "file or leave it unset to read ~/.ssh/config")
        return Config(runtime_ssh_path=path, overrides=overrides)

    def _known_hosts_files(self, conn: Connection) -> list[str]:
        """The global file, plus `known_hosts` if given, else the ssh config's UserKnownHostsFile or ~/.ssh/."""
        if self.known_hosts is not None:
            user_files = self.known_hosts
            for path in user_files:
                if not os.path.isfile(os.path.expanduser(path)):
                    raise ConfigError(f"known_hosts: {path!r} is not a file; create it with "
                                      f"`ssh-keyscan -p {conn.port} {conn.host} > {path}` after checking "
                                      "the fingerprint, or leave known_hosts unset to use ~/.ssh/known_hosts")
        else:
            configured = conn.ssh_config.get("userknownhostsfile")
            user_files = shlex.split(configured) if configured else [USER_KNOWN_HOSTS]
        files = [os.path.expanduser(p) for p in [GLOBAL_KNOWN_HOSTS, *user_files]]
        return [p for p in files if os.path.isfile(p)]

    def _harden(self, conn: Connection) -> None:
        """Swap fabric's AutoAddPolicy for ours and load known_hosts, on `conn` and any gateway."""
        conn.client.set_missing_host_key_policy(_RejectUnknown() if self.strict_host_keys
                                                else _AcceptWithWarning())
        self._known_hosts_loaded = self._known_hosts_files(conn)
        for path in self._known_hosts_loaded:
            conn.client.load_system_host_keys(path)
        if isinstance(conn.gateway, Connection):
            self._harden(conn.gateway)

    def _new_connection(self) -> _Connection:
        kwargs: dict[str, float | list[str]] = {"banner_timeout": self.connect_timeout, "auth_timeout": self.connect_timeout,
                                  "channel_timeout": self.connect_timeout}
        if self.key_filename:
            kwargs["key_filename"] = [os.path.expanduser(k) for k in self.key_filename]
        # fabric keeps whole seconds for the TCP connect; banner and auth above take the exact value
        conn = _Connection(self._target, user=self._user, port=self._port, config=self._config,
                           connect_timeout=max(1, math.ceil(self.connect_timeout)), connect_kwargs=kwargs)
        self._harden(conn)
        return conn

    def _open_once(self) -> _Connection:
        conn = self._new_connection()
        self._last_target = (conn.host, int(conn.port or 22))  # as fabric resolved them (ssh config included)
        try:
            conn.open()
        except BaseException:
            with contextlib.suppress(Exception):
                conn.close()
            conn.client.close()
            raise
        conn.transport.set_keepalive(int(self.keepalive_s))
        _tune_socket(conn.transport, self.dead_after_s)
        return conn

    def connect(self) -> SSHHost:
        """Open the connection now (retrying transient failures); returns self. Commands call it as needed."""
        with self._lock:
            return self._connect_locked()

    def _connect_locked(self) -> SSHHost:
        if self._conn is not None and self._conn.is_connected:
            return self
        if self._conn is not None:
            self.note_event("connection_lost", "the SSH connection was found closed (server, network or keepalive)")
        dropped = self._conn is not None or (self.connects and not self._closed_on_purpose)
        if dropped and self._dropped_at is None:  # a drop, not a first connect (or one after close())
            self._dropped_at, self._dropped_mono = utc_now(), time.monotonic()
        self._drop()
        if self._lost is not None and time.monotonic() - self._lost_tried < RETRY_LOST_EVERY_S:
            raise self._lost_error()  # given up a moment ago: fail at once instead of waiting out retries again
        target = f"{self._user + '@' if self._user else ''}{self._target}:{self._port or 'default port'}"
        t0 = time.monotonic()
        if self._lost is not None:
            stop: Any = stop_after_attempt(1)
        elif self._dropped_at is not None:
            stop = stop_after_attempt(self.retries + 1) | stop_after_delay(RECONNECT_WINDOW_S)
        else:
            stop = stop_after_attempt(self.retries + 1)
        retrying = Retrying(stop=stop, retry=retry_if_exception(_transient),
                            wait=wait_exponential(multiplier=self.backoff_s, max=30), reraise=True)
        try:
            self._conn = retrying(self._open_once)
        except _UnknownHostKey as exc:
            raise self._unknown_key_error(exc) from None
        except BadHostKeyException as exc:
            raise self._changed_key_error(exc) from None
        except AuthenticationException as exc:
            raise ConfigError(f"key_filename: authentication as {self._user or 'the default user'} on "
                              f"{self.name} failed ({exc}); give key_filename=PATH of a key listed in the "
                              "server's authorized_keys, or load it into ssh-agent") from exc
        except (OSError, EOFError, SSHException) as exc:
            attempts = retrying.statistics.get("attempt_number", 1)
            if self._dropped_at is not None:  # it was up before: the connection is lost
                previous = self._lost.attempts if self._lost is not None else 0
                self._lost = ConnectionLost(self.name, since=self._dropped_at,
                                            down_s=time.monotonic() - self._dropped_mono,
                                            attempts=previous + attempts,
                                            last_error=f"{type(exc).__name__}: {exc}")
                self._lost_tried = time.monotonic()
                if not previous:
                    self.note_event("connection_given_up", str(self._lost).splitlines()[0])
                raise self._lost_error() from exc
            if isinstance(exc, socket.gaierror) and self._is_alias:
                raise self._alias_error(exc) from None
            hint = "cannot resolve the host name" if isinstance(exc, socket.gaierror) else (
                f"gave up after {attempts} attempt(s) over {time.monotonic() - t0:.1f} s; is sshd running "
                "there and the port reachable (firewall, VPN)? raise retries/connect_timeout for slow links")
            raise HostError(self.name, f"ssh connect {target}: {_connect_reason(exc)}", None,
                            hint=hint) from exc
        self.connects += 1
        if self._dropped_at is not None:
            self.note_event("reconnected", f"connection #{self.connects} opened in {time.monotonic() - t0:.2f} s, "
                                           f"{time.monotonic() - self._dropped_mono:.2f} s after the drop")
        self._dropped_at, self._lost, self._closed_on_purpose = None, None, False
        return self

    def _lost_error(self) -> ConnectionLost:
        """A fresh ConnectionLost like the stored one, its `down_s` brought up to now."""
        lost = self._lost
        assert lost is not None
        return ConnectionLost(self.name, since=lost.since, down_s=time.monotonic() - self._dropped_mono,
                              attempts=lost.attempts, last_error=lost.last_error)

    @property
    def lost(self) -> ConnectionLost | None:
        """The ConnectionLost this host gave up with (None while connected or not yet given up)."""
        return self._lost

    def reachable(self, timeout_s: float | None = None) -> bool:
        """Whether the host answers now: True while connected (the transport notices a closed or silent peer
        by itself); otherwise one connection attempt, no retries, bounded by `timeout_s` (default
        connect_timeout). A success becomes the connection (and ends the `lost` state)."""
        with self._lock:
            if self.connected:
                return True
            saved = self.connect_timeout
            self.connect_timeout = timeout_s or saved
            try:
                conn = self._open_once()
            except (OSError, EOFError, SSHException):
                return False
            finally:
                self.connect_timeout = saved
            self._drop()
            self._conn = conn
            self.connects += 1
            if self._dropped_at is not None:
                self.note_event("reconnected", f"connection #{self.connects} opened by a reachability check")
            self._dropped_at, self._lost, self._closed_on_purpose = None, None, False
            return True

    def reconnect(self) -> SSHHost:
        """Forget an earlier give-up and connect again with the full retries (raises as `connect`)."""
        with self._lock:
            self._lost = None
            return self._connect_locked()

    def _config_files(self) -> list[str]:
        """The ssh config files aliases are looked up in (as fabric reads them): the `ssh_config` option, else
        ~/.ssh/config and /etc/ssh/ssh_config."""
        if self._ssh_config_path:
            return [self._ssh_config_path]
        return [os.path.expanduser("~/.ssh/config"), "/etc/ssh/ssh_config"]

    def _alias_error(self, exc: socket.gaierror) -> ConfigError:
        """`ssh:ALIAS` whose alias no ssh config defines and that is no resolvable host name either."""
        files = self._config_files()
        read = [f for f in files if os.path.isfile(f)]
        where = " or ".join(files) if read else f"{' or '.join(files)} (no such file)"
        return ConfigError(
            f"host: host alias {self._target!r} not found in {where}, and it is not a host name this machine "
            f"resolves ({exc.strerror or exc})", parameter="host",
            hint=f"add a `Host {self._target}` entry (HostName, User, Port, IdentityFile) to "
                 f"{self._ssh_config_path or '~/.ssh/config'}, give your own config file with -p "
                 "ssh.ssh_config=PATH, or name the host directly: ssh://user@host:port")

    def _user_known_hosts(self) -> str:
        """The known_hosts file a user would add keys to: the `known_hosts` option, else the ssh config's
        UserKnownHostsFile, else ~/.ssh/known_hosts."""
        if self.known_hosts:
            return self.known_hosts[0]
        user_files = [f for f in self._known_hosts_loaded if f != GLOBAL_KNOWN_HOSTS]
        return user_files[0] if user_files else USER_KNOWN_HOSTS

    def _file_listing(self, name: str) -> str:
        """The loaded known_hosts file that lists `name` (the one to correct), else the user's file."""
        for path in self._known_hosts_loaded:
            with contextlib.suppress(OSError, SSHException, ValueError):
                keys = HostKeys(path)
                if keys.lookup(name) is not None:
                    return path
        return self._user_known_hosts()

    def _unknown_key_error(self, exc: _UnknownHostKey) -> HostKeyError:
        host, port = _split_known_hosts_name(exc.hostname)  # the target, or a gateway on the way
        key_type, fp = exc.key.get_name(), exc.key.fingerprint
        files = ", ".join(self._known_hosts_loaded) or "no known_hosts file found"
        return HostKeyError(
            f"{self.name}: the {key_type} host key of {exc.hostname} is not in known_hosts ({files}); "
            f"its fingerprint is {fp}.\nIf that is the key the server really has (ask its admin, or run "
            "`ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` on it), accept it with\n"
            f"    ssh-keyscan -p {port} {shlex.quote(host)} >> {shlex.quote(self._user_known_hosts())}\n"
            "or pass known_hosts=PATH naming a file that lists it (strict_host_keys=False skips the check).",
            host=host, port=port, key_type=key_type, fingerprint=fp)

    def _changed_key_error(self, exc: BadHostKeyException) -> HostKeyError:
        name, key = exc.hostname, exc.key
        host, port = _split_known_hosts_name(name)
        if self._last_target is not None and self._last_target[0] == name and self._last_target[1] != 22:
            port = self._last_target[1]  # paramiko names the host without its port; known_hosts has [host]:port
            name = f"[{host}]:{port}"
        path = self._file_listing(name)
        return HostKeyError(
            f"{self.name}: the host key of {name} CHANGED: the server offers {key.get_name()} {key.fingerprint}"
            f" but known_hosts has {exc.expected_key.get_name()} {exc.expected_key.fingerprint}. Someone may be "
            "intercepting the connection, or the server was reinstalled. Once you have checked the new "
            "fingerprint with its admin, replace the old entry:\n"
            f"    ssh-keygen -f {shlex.quote(path)} -R {shlex.quote(name)} && ssh-keyscan -p {port} "
            f"{shlex.quote(host)} >> {shlex.quote(path)}",
            host=host, port=port, key_type=key.get_name(), fingerprint=key.fingerprint)

    def ssh_identity(self) -> SshIdentity:
        """The host key this connection verified and the client keys given (SHA256 fingerprints), for the
        record. Connects if needed."""
        key = self._connection().transport.get_remote_server_key()
        return SshIdentity(host_key_type=key.get_name(), host_key_sha256=key.fingerprint,
                           key_filenames=list(self.key_filename),
                           key_sha256=[_key_fingerprint(k) for k in self.key_filename],
                           known_hosts=list(self._known_hosts_loaded))

    def _drop(self) -> None:
        """Forget the connection (closing it: gracefully while it still works, else at once)."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            _close_gracefully(conn, CLOSE_WAIT_S if conn.is_connected else 0)

    def _drop_if_dead(self, conn: _Connection) -> None:
        """Forget `conn` when its transport is gone (a live one keeps serving the forwards' streams)."""
        if not conn.is_connected:
            with self._lock:
                if self._conn is conn:
                    self._drop()

    def _connection(self) -> _Connection:
        """The open connection, replaced by a new one when the previous one dropped."""
        with self._lock:
            if self._conn is None or not self._conn.is_connected:
                self._connect_locked()
            assert self._conn is not None
            return self._conn

    def _transport(self) -> Any:
        """The live paramiko Transport (reconnecting if needed), for port-forward channels."""
        self.counters["channels"] += 1
        return self._connection().transport

    @property
    def address(self) -> str:
        """The host name or address this host's connections go to (an ssh config alias resolved to HostName)."""
        return str(Connection(self._target, config=self._config).host)

    def client_url(self, port: int, bind: str = "127.0.0.1") -> str:
        """A local URL forwarded through this host's SSH connection to `bind:port` there (kept until close()).

        A wildcard bind (0.0.0.0, ::) is reached at the host's 127.0.0.1. The forward survives reconnects.
        """
        target = "127.0.0.1" if bind in ("", "0.0.0.0", "::", "*") else bind
        key = (target, int(port))
        with self._lock:
            fwd = self._forwards.get(key)
            if fwd is None or fwd.closed:
                fwd = PortForward(self._transport, target, int(port), host_name=self.name, on_event=self.note_event)
                try:
                    fwd.check_allowed()
                except BaseException:
                    fwd.close()
                    raise
                self._forwards[key] = fwd
        return fwd.url

    def forwards(self) -> list[PortForward]:
        """The local port forwards open now."""
        return [f for f in self._forwards.values() if not f.closed]

    @property
    def connected(self) -> bool:
        """Whether the transport is open now (no round trip)."""
        return self._conn is not None and self._conn.is_connected

    def close(self) -> None:
        """Close the port forwards, the SFTP session and the connection (a clean SSH disconnect: sshd logs
        "Received disconnect", not a reset); the next command opens a new one."""
        with self._lock:
            forwards, self._forwards = list(self._forwards.values()), {}
            self._dropped_at, self._lost = None, None  # closed on purpose: the next connect is a first one
        for fwd in forwards:
            fwd.close()
        self._drop()
        with self._lock:
            self._dropped_at, self._lost, self._closed_on_purpose = None, None, True

    def __enter__(self) -> SSHHost:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- commands ------------------------------------------------------------------------------------
    def _exec(self, line: str, timeout: float | None) -> CommandResult:
        if len(line.encode()) <= MAX_INLINE_COMMAND_BYTES:
            return self._exec_inline(line, timeout)
        # sshd hands the line to the login shell as one argument, which Linux caps at 128 kB (E2BIG):
        # ship a long line as a private script file instead and run that
        script = f".spectrial-cmd-{uuid.uuid4().hex[:12]}.sh"  # relative: the user's home, like commands
        self._upload(io.BytesIO(line.encode()), script, 0o600)
        q = shlex.quote(script)
        res = self._exec_inline(f"sh {q} < /dev/null; rc=$?; rm -f {q}; exit $rc", timeout)
        return CommandResult(line, res.exit_code, res.stdout, res.stderr, res.elapsed_s)

    def _exec_inline(self, line: str, timeout: float | None) -> CommandResult:
        full = f"sudo -n sh -c {shlex.quote(line)}" if self.sudo else line
        t0 = time.monotonic()
        for attempt in (1, 2):
            conn = self._connection()
            try:
                r = conn.run(full, hide=True, warn=True, timeout=timeout, in_stream=False)
                break
            except _SessionNotOpened as exc:
                # the command was never sent: reconnect once (if the connection is gone) and send it
                self._drop_if_dead(conn)
                if attempt == 2:
                    raise HostError(self.name, full, None, stderr=str(exc),
                                           hint="could not open an SSH channel on a fresh connection "
                                                "(server MaxSessions reached or shutting down?)") from exc
            except (SSHException, EOFError, OSError) as exc:
                self._drop_if_dead(conn)
                self.note_event("connection_lost", f"while sending a command: {type(exc).__name__}: {exc}")
                raise HostError(self.name, full, None, stderr=f"{type(exc).__name__}: {exc}",
                                hint="the SSH connection failed while sending the command; it may or "
                                     "may not have run (the next command reconnects)", lost=True) from exc
            except CommandTimedOut as exc:  # its channel is closed; the connection (and its forwards) stays
                res = exc.result
                raise HostError(self.name, full, None, res.stdout, res.stderr,
                                       f"timed out after {timeout} s; the remote command may still be "
                                       "running (start long jobs with start_detached)") from exc
        if r.exited == -1 and not conn.is_connected:
            self._drop_if_dead(conn)
            self.note_event("connection_lost", f"while a command ran: {full[:120]}")
            raise HostError(self.name, full, None, r.stdout, r.stderr,
                            "the SSH connection dropped while the command ran; it may or may not "
                            "have completed (the next command reconnects)", lost=True)
        return CommandResult(full, r.exited, r.stdout, r.stderr, time.monotonic() - t0)

    # --- files ---------------------------------------------------------------------------------------
    def home(self) -> str:
        if self._home is None:
            self._home = super().home()
        return self._home

    def _forget_sftp(self) -> None:
        """Drop the cached SFTP session after it failed (a dead connection is replaced by `_connection`)."""
        conn = self._conn
        if conn is not None and conn._sftp is not None:
            with contextlib.suppress(Exception):
                conn._sftp.close()
            conn._sftp = None

    def _sftp(self) -> SFTPClient:
        self.counters["sftp"] += 1
        for attempt in (1, 2):
            conn = self._connection()
            try:
                return conn.sftp()
            except (SSHException, EOFError, OSError) as exc:  # opening the session sent nothing: safe to retry
                self._drop_if_dead(conn)
                if conn.is_connected:  # the server refused the subsystem: no retry helps
                    raise HostError(self.name, "open an SFTP session", None,
                                    stderr=f"{type(exc).__name__}: {exc}", hint=SFTP_HINT) from exc
                if attempt == 2:
                    raise HostError(self.name, "open an SFTP session", None,
                                    stderr=f"{type(exc).__name__}: {exc}",
                                    hint="the SSH connection dropped (the next command reconnects)",
                                    lost=True) from exc
        raise AssertionError("unreachable")

    def _upload(self, src: io.BufferedIOBase | io.BytesIO, remote: str, mode: int) -> None:
        """Write `src` to `remote` so that no one else can read it at any point, then rename into place."""
        path = self.expand(remote)
        parent = os.path.dirname(path) or "."
        tmpdir = f"{parent}/.spectrial-put-{uuid.uuid4().hex[:12]}"
        sftp = self._sftp()
        try:
            sftp.mkdir(tmpdir, mode=0o700)
        except OSError as exc:
            raise HostError(self.name, f"sftp mkdir {tmpdir}", None, stderr=str(exc),
                                   hint=f"cannot write into {parent!r} (missing or not writable)") from exc
        except (SSHException, EOFError) as exc:
            self._forget_sftp()
            raise HostError(self.name, f"sftp mkdir {tmpdir}", None, stderr=f"{type(exc).__name__}: {exc}",
                            hint="the SSH connection dropped (the next command reconnects)", lost=True) from exc
        tmp = f"{tmpdir}/data"
        failure: OSError | None = None
        try:
            sftp.putfo(src, tmp, confirm=True)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except OSError as exc:
            failure = exc
        except (SSHException, EOFError) as exc:  # the connection (or the SFTP session) dropped mid-transfer
            self._forget_sftp()
            raise HostError(self.name, f"sftp put {path}", None, stderr=f"{type(exc).__name__}: {exc}",
                            hint="the SSH connection dropped during the upload (the next command reconnects)",
                            lost=True) from exc
        finally:
            with contextlib.suppress(Exception):  # OSError, or SSHException/EOFError on a dropped connection
                sftp.remove(tmp)
            with contextlib.suppress(Exception):
                sftp.rmdir(tmpdir)
        if failure is not None:  # measured after the partial file is gone: the space the caller really has
            free = self.free_space([parent]).get(parent)
            where = f"{free[0] / 2**20:.1f} MiB free on {free[1]}" if free else "free space unknown"
            raise HostError(self.name, f"sftp put {path}", None, stderr=str(failure),
                                   hint=f"check the path and free space on the host ({where})") from failure

    def put(self, local: str | Path, remote: str, mode: int = 0o600) -> None:
        """Copy a local file to the host over SFTP, with `mode` (user-only by default), atomically."""
        with open(local, "rb") as fh:
            self._upload(fh, remote, mode)

    def write_text(self, path: str, text: str, mode: int = 0o600) -> None:
        """Write a file atomically over SFTP (no command line, so no size limit), `mode` user-only by default."""
        self._upload(io.BytesIO(text.encode()), path, mode)

    def get(self, remote: str, local: str | Path) -> None:
        """Copy a file from the host over SFTP into `local`, created readable by the user only."""
        path = self.expand(remote)
        local = Path(local)
        fd, tmp = tempfile.mkstemp(dir=local.parent, prefix=f".{local.name}.", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as fh:
                self._sftp().getfo(path, fh)
            os.replace(tmp, local)
        except (OSError, SSHException, EOFError) as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            lost = not isinstance(exc, OSError) or not self.connected
            if lost:
                self._forget_sftp()
            raise HostError(self.name, f"sftp get {path}", None, stderr=str(exc) or type(exc).__name__,
                            hint="the SSH connection dropped during the download (the next command reconnects)"
                            if lost else "check that the remote file exists and is readable", lost=lost) from exc
