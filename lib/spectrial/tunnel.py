"""Local port forwarding through an SSH transport, so local clients reach a server bound to the remote loopback.

`PortForward(transport, remote_host, remote_port)` listens on 127.0.0.1:<free port>. Each accepted local
connection gets its own `direct-tcpip` channel, opened through `transport()` (a callable returning the live
paramiko `Transport`, reconnecting when the previous one dropped), and a thread pumps bytes both ways.

- A forward outlives reconnects: the listening socket is local; only channels belong to a transport, so a
  connection made after a drop goes through the new transport (same local URL for the whole trial).
- When no channel can be opened (nothing listens there yet, or SSH is down and cannot be reconnected),
  the accepted socket is closed at once: the client sees a reset connection, as for a refused one.
- A stream cut by a dropped transport is reported through `on_event` ("forward_broken").
- `check_allowed()` opens one probe channel: sshd answering "administratively prohibited"
  (`AllowTcpForwarding no`) raises a ConfigError instead of every request failing later.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
from collections.abc import Callable

from paramiko import Channel, ChannelException, SSHException, Transport

from spectrial.errors import ConfigError, HostError

OPEN_TIMEOUT_S = 10.0
CHUNK = 1 << 16
ADMIN_PROHIBITED = 1  # RFC 4254 SSH_OPEN_ADMINISTRATIVELY_PROHIBITED

EventFn = Callable[[str, str], None]


class _QuietRefusedOpens(logging.Filter):
    """Drop paramiko's ERROR line for each refused forward ("Secsh channel N open FAILED: ... Connect failed").

    While a server loads, every readiness probe is refused like that; without this filter Python's last-resort
    handler prints each one to stderr (notebook cells fill with them). Other paramiko messages pass.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not ("open FAILED" in msg and "Connect failed" in msg)


logging.getLogger("paramiko.transport").addFilter(_QuietRefusedOpens())


class PortForward:
    """127.0.0.1:<local_port> on this machine -> `remote_host:remote_port` as seen from the SSH server."""

    def __init__(self, transport: Callable[[], Transport], remote_host: str, remote_port: int, *,
                 host_name: str = "ssh", on_event: EventFn | None = None) -> None:
        self._transport, self.remote_host, self.remote_port = transport, remote_host, int(remote_port)
        self.host_name = host_name
        self._on_event = on_event or (lambda kind, detail: None)
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind(("127.0.0.1", 0))
        self._lsock.listen(128)
        self.local_port: int = self._lsock.getsockname()[1]
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._live: set[tuple[socket.socket, Channel]] = set()
        self.stats = {"accepted": 0, "channels": 0, "refused": 0, "broken": 0}
        self.last_error = ""
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name=f"spectrial-forward-{remote_port}")
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def check_allowed(self) -> None:
        """Raise ConfigError when the SSH server forbids TCP forwarding (a refused port is fine: not up yet)."""
        try:
            chan = self._transport().open_channel("direct-tcpip", (self.remote_host, self.remote_port),
                                                  ("127.0.0.1", 0), timeout=OPEN_TIMEOUT_S)
        except ChannelException as exc:
            if exc.code == ADMIN_PROHIBITED:
                raise ConfigError(
                    f"host: sshd on {self.host_name} refuses TCP forwarding ({exc.text}); spectrial reaches the "
                    "server through a local port forward: set `AllowTcpForwarding local` (or yes) in the "
                    "server's sshd_config, or bind the server to an address this machine can reach") from None
            return  # "connect failed": nothing listens there yet, forwarding itself works
        except (SSHException, EOFError, OSError) as exc:
            raise HostError(self.host_name, f"open forward to {self.remote_host}:{self.remote_port}", None,
                            stderr=f"{type(exc).__name__}: {exc}",
                            hint="the SSH connection failed while opening the port forward", lost=True) from exc
        chan.close()

    # --- data path -----------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = self._lsock.accept()
            except OSError:
                return  # listening socket closed
            self.stats["accepted"] += 1
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True,
                             name=f"spectrial-forward-{self.remote_port}-conn").start()

    def _serve(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        try:
            chan = self._transport().open_channel("direct-tcpip", (self.remote_host, self.remote_port), peer,
                                                  timeout=OPEN_TIMEOUT_S)
        except Exception as exc:  # refused, transport down and not reconnectable, ...: the client sees a reset
            self.stats["refused"] += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(OSError):
                conn.close()
            return
        self.stats["channels"] += 1
        pair = (conn, chan)
        with self._lock:
            if self._closed.is_set():
                conn.close()
                chan.close()
                return
            self._live.add(pair)
        try:
            self._pump(conn, chan)
        finally:
            with self._lock:
                self._live.discard(pair)
            transport = chan.get_transport()
            if not self._closed.is_set() and transport is not None and not transport.is_active():
                self.stats["broken"] += 1
                self._on_event("forward_broken", f"a stream to {self.remote_host}:{self.remote_port} was cut "
                                                 "when the SSH connection dropped")
            with contextlib.suppress(Exception):  # closing a channel on a dead transport raises EOFError
                chan.close()
            with contextlib.suppress(OSError):
                conn.close()

    def _pump(self, conn: socket.socket, chan: Channel) -> None:
        """Copy bytes both ways until either side closes (or the forward is closed)."""
        while not self._closed.is_set():
            try:
                ready, _, _ = select.select([conn, chan], [], [], 0.5)
                if conn in ready:
                    data = conn.recv(CHUNK)
                    if not data:
                        return
                    chan.sendall(data)
                if chan in ready:
                    data = chan.recv(CHUNK)
                    if not data:
                        return
                    conn.sendall(data)
                if chan.closed or chan.eof_received and not chan.recv_ready():
                    return
            except (OSError, EOFError, ValueError):
                return

    def close(self) -> None:
        """Stop listening and cut every live stream."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._lsock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        self._lsock.close()
        with self._lock:
            live, self._live = list(self._live), set()
        for conn, chan in live:
            chan.close()
            with contextlib.suppress(OSError):
                conn.close()
        self._thread.join(2)
