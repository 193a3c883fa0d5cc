"""Local port forwarding through an SSH transport, so local clients reach a server bound to the remote loopback.

`PortForward(transport, remote_host, remote_port)` listens on 127.0.0.1:<free port>. Each accepted local
connection gets its own `direct-tcpip` channel, opened through `transport()` (a callable returning the live
paramiko `Transport`, reconnecting when the previous one dropped).

How a stream is pumped, and why (each rule closes a way to kill the whole SSH connection, all seen on loopback):
- Channels are never `select()`ed: `Channel.fileno()` makes a pipe that paramiko's transport thread writes to
  whenever data arrives, and closing the channel closes that pipe without the lock the writer takes. A packet
  arriving as a stream ends then hit a closed (EBADF) or reused (EPIPE, or a stray byte in another stream)
  descriptor and killed the transport (paramiko #2271/#1157: one remote trial in four, two in three aborted
  downloads). Here the channel's buffer signals a `threading.Event` instead (`BufferedPipe.set_event`): no
  descriptor, nothing to race.
- One thread owns each channel and is the only one to send, receive, shut down or close it. paramiko builds a
  channel's messages under its lock but sends them after releasing it, so two threads using one channel can
  put DATA or EOF on the wire after that channel's CLOSE; sshd then disconnects ("ieof packet referred to
  nonexistent channel", "Received data after EOF"). A helper thread only reads the local socket into a queue.
- `close()` wakes the owners and waits for them (bounded); it never touches a live channel itself.
- Both local and SSH sockets use TCP_NODELAY (small HTTP chunks are not held back 40 ms by Nagle).
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
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

from paramiko import Channel, ChannelException, SSHException, Transport

from spectrial.errors import ConfigError, HostError

OPEN_TIMEOUT_S = 10.0
CHUNK = 1 << 16
POLL_S = 0.5  # how often an idle stream looks at the forward's closed flag
WINDOW_POLL_S = 0.005  # how often a stream with bytes waiting for the server's window looks again
LINGER_S = 30.0  # after the client's EOF, how long the server may stay silent before the stream is cut
MAX_QUEUED = 64  # chunks read from a client ahead of the server's window
JOIN_S = 2.0  # how long close() waits for the stream threads
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
        self._live: set[_Stream] = set()
        self._threads: set[threading.Thread] = set()
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
                return  # listening socket shut down by close()
            if self._closed.is_set():
                conn.close()
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.stats["accepted"] += 1
            t = threading.Thread(target=self._serve, args=(conn, peer), daemon=True,
                                 name=f"spectrial-forward-{self.remote_port}-conn")
            with self._lock:
                self._threads = {x for x in self._threads if x.is_alive()} | {t}
            t.start()

    def _serve(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        """Own one local connection and its channel: open, pump both ways, then close both (only here)."""
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
        stream = _Stream(conn, chan)
        with self._lock:
            closing = self._closed.is_set()
            if not closing:
                self._live.add(stream)
        up = threading.Thread(target=stream.read_client, daemon=True,
                              name=f"spectrial-forward-{self.remote_port}-up")
        try:
            if not closing:
                up.start()
                self._pump(stream)
        finally:
            transport = chan.get_transport()
            broken = not self._closed.is_set() and transport is not None and not transport.is_active()
            with contextlib.suppress(Exception):  # on a dead transport closing raises EOFError
                chan.close()
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)  # the client sees the end; wakes `up` blocked in recv()
            if up.is_alive():
                up.join(JOIN_S)
            with self._lock:
                self._live.discard(stream)
            conn.close()
            if broken:
                self.stats["broken"] += 1
                self._on_event("forward_broken", f"a stream to {self.remote_host}:{self.remote_port} was cut "
                                                 "when the SSH connection dropped")

    def _pump(self, stream: _Stream) -> None:
        """Copy both ways until the server ends, the client goes away (or stays silent LINGER_S after its
        EOF), the transport drops, or the forward is closed. Every channel call happens in this thread."""
        conn, chan, wake = stream.conn, stream.chan, stream.wake
        chan.settimeout(0.0)  # recv/send only when ready: never block while the other direction has work
        pending = b""
        eof_sent_at: float | None = None
        while not self._closed.is_set():
            wake.wait(WINDOW_POLL_S if pending else POLL_S)
            wake.reset()  # cleared before looking: a signal arriving from here on is seen next round
            try:
                while chan.recv_ready():  # server -> client
                    conn.sendall(chan.recv(CHUNK))
                if chan.closed or (chan.eof_received and not chan.recv_ready()):
                    return  # the server finished, or the transport is gone
                while True:  # client -> server, as far as the channel's window allows
                    if not pending:
                        if not stream.inbox or stream.inbox[0] is None:
                            break
                        pending = stream.inbox.popleft() or b""
                    if not chan.send_ready():
                        break
                    pending = pending[chan.send(pending):]
            except (OSError, EOFError):  # the client closed its end, or the channel died under us
                return
            if not pending and eof_sent_at is None and stream.inbox and stream.inbox[0] is None:
                chan.shutdown_write()  # the client is done sending; the server may still answer
                eof_sent_at = time.monotonic()
            if eof_sent_at is not None and time.monotonic() - eof_sent_at > LINGER_S:
                return

    def close(self) -> None:
        """Stop listening and cut every live stream; returns once their threads are done (bounded)."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._lsock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        self._thread.join(JOIN_S)
        self._lsock.close()
        with self._lock:
            live, threads = list(self._live), list(self._threads)
        for stream in live:  # their owners close channel and socket; here only wake them
            stream.wake.set()
            with contextlib.suppress(OSError):
                stream.conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + JOIN_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))


class _Wake:
    """The event paramiko's channel buffer signals (`BufferedPipe.set_event`) instead of a pipe: `set` on data,
    EOF or close; its `clear` after a read that emptied the buffer is ignored, since the owner clears before
    it looks (so no wake-up is ever lost)."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        return None

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    def reset(self) -> None:
        self._event.clear()


class _Stream:
    """One forwarded connection: the local socket, its channel, what the client sent (`None` = its EOF)."""

    def __init__(self, conn: socket.socket, chan: Channel) -> None:
        self.conn, self.chan = conn, chan
        self.wake = _Wake()
        self.inbox: deque[bytes | None] = deque()
        chan.in_buffer.set_event(self.wake)  # set at once when data or EOF arrived before this

    def read_client(self) -> None:
        """Client -> inbox, until the client's EOF or an error (then `None`); never touches the channel."""
        try:
            while True:
                while len(self.inbox) > MAX_QUEUED and not self.chan.closed:
                    time.sleep(WINDOW_POLL_S)  # the server reads slower than the client sends
                data = self.conn.recv(CHUNK)
                self.inbox.append(data or None)
                self.wake.set()
                if not data:
                    return
        except OSError:
            self.inbox.append(None)
            self.wake.set()
