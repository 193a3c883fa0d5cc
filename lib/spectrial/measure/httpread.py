"""Bounded reads: every HTTP exchange with a server has a total deadline, a per-read timeout and a size cap.

Servers can be broken or hostile (a /metrics that answers 600 MB, a body that trickles one byte every two seconds, a
stream that never ends, a gzip bomb). httpx's timeouts are per read, so a server that keeps sending slowly is never
timed out by them, and nothing caps what is read into memory. Every client spectrial opens to a server is
`bounded_client(limits)`: its transport wraps each response body so that

- the whole exchange ends by its deadline (`Limits.deadline_s`, or per request the `DEADLINE` extension), checked
  at every chunk that arrives;
- the body is refused past `Limits.max_bytes` (or the `MAX_BYTES` extension), and a declared Content-Length over
  it before a byte is read;
- the body arrives as asked: the client asks for `Accept-Encoding: identity`, and a compressed body (where a gzip
  bomb would expand a few kB into gigabytes in the decoder) is refused;
- a silent server is cut by the per-read timeout (`Limits.read_s`), and a reader may `arm` an idle limit of its own
  (a stream: seconds without a token); a watchdog thread shuts the socket down when a deadline or an idle limit
  passes, so a body that trickles or a read that blocks ends on time.

A kept connection that the server closed is tried again (at most 3 sends in all): llama-server advertises
`Keep-Alive` on a streamed answer and then closes the connection at its end, so a client that sends its next request
before the close arrives finds it gone ("Server disconnected without sending a response"; seen under load). Only a
request sent on a reused connection and answered by no byte at all is retried (the server never took it up); a new
connection that the server drops fails the request as before.

A crossed bound raises `BoundExceeded`, an `httpx.ReadError` (so every `except httpx.HTTPError` that handled a
dead server handles it too) that carries the endpoint, what the server did and the limit in words.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from spectrial.params import ReadLimits

DEADLINE = "spectrial.deadline_s"  # request extension: seconds the whole exchange may take (headers to last byte)
MAX_BYTES = "spectrial.max_bytes"  # request extension: bytes the body may have
BODY = "spectrial.body"  # response extension: the bounded body, for `arm`
MIB = 1 << 20
STALE_TRIES = 3  # sends of one request while each finds a kept connection closed (the pool may hold more than one)


@dataclass(frozen=True)
class Limits:
    """The bounds of one kind of exchange: total seconds, seconds per read, bytes of body, seconds to connect."""

    deadline_s: float
    read_s: float
    max_bytes: int
    connect_s: float = 10.0

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(min(self.read_s, self.deadline_s), connect=min(self.connect_s, self.deadline_s))


def probe_limits(limits: ReadLimits, seconds: float | None = None) -> Limits:
    """A probe's bounds from `limits:` in params (`seconds` overrides its total)."""
    s = limits.probe_s if seconds is None else seconds
    return Limits(deadline_s=s, read_s=s, max_bytes=limits.body_bytes, connect_s=min(10.0, s))


def metrics_limits(limits: ReadLimits, seconds: float | None = None) -> Limits:
    """A /metrics scrape's bounds from `limits:` in params (`seconds`, e.g. a watch's interval, can only shorten it)."""
    s = limits.metrics_s if seconds is None else min(seconds, limits.metrics_s)
    return Limits(deadline_s=s, read_s=s, max_bytes=limits.metrics_bytes, connect_s=min(10.0, s))


PROBE = Limits(deadline_s=10.0, read_s=10.0, max_bytes=8 * MIB)  # /health, /props, /slots, /v1/models, server info
METRICS = Limits(deadline_s=30.0, read_s=15.0, max_bytes=32 * MIB)  # a Prometheus /metrics scrape


class BoundExceeded(httpx.ReadError):
    """A server crossed a bound while its answer was read: `what` (method and URL), `problem`, `limit`."""

    def __init__(self, request: httpx.Request, problem: str, limit: str) -> None:
        self.what, self.problem, self.limit = f"{request.method} {request.url}", problem, limit
        super().__init__(f"{self.what}: {problem} (limit: {limit})", request=request)


def _size(n: int) -> str:
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n} bytes"


class _Headers:
    """A request waiting for its response headers: due at its deadline; its socket known once a new connection was
    made for it (httpcore's trace), so that a server trickling its headers is cut too."""

    def __init__(self, started: float, deadline_s: float) -> None:
        self.started, self.deadline_s = started, deadline_s
        self.sock: socket.socket | None = None
        self.fired: str | None = None
        self.connected = False  # a new connection was made for this request (else a kept one was reused)

    def due(self) -> float:
        return self.started + self.deadline_s

    def fire(self, now: float) -> None:
        self.fired = f"its headers were still arriving after {now - self.started:.1f} s"
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)

    def trace(self, name: str, info: dict[str, Any]) -> None:
        if name.startswith("connection.connect_tcp."):
            self.connected = True
        if name == "connection.connect_tcp.complete":
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if isinstance(sock, socket.socket):
                self.sock = sock


class _Watchdog:
    """One thread for every open body: when a body's due time passes (its deadline, or its idle limit since the last
    `arm`), it shuts its socket down, which wakes the read blocked on it (a read timeout cannot: httpcore fixes it for
    the whole body, and a trickle resets it at every byte)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.bodies: set[_BoundedStream | _Headers] = set()
        self.thread: threading.Thread | None = None

    def add(self, body: _BoundedStream | _Headers) -> None:
        with self.cond:
            self.bodies.add(body)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="spectrial-read-watchdog", daemon=True)
                self.thread.start()
            self.cond.notify()

    def remove(self, body: _BoundedStream | _Headers) -> None:
        with self.cond:
            self.bodies.discard(body)

    def nudge(self) -> None:
        with self.cond:
            self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                now = time.monotonic()
                for b in [b for b in self.bodies if b.due() <= now]:
                    self.bodies.discard(b)
                    b.fire(now)
                wait = min((b.due() for b in self.bodies), default=now + 60.0) - now
                self.cond.wait(timeout=max(wait, 0.005))


_WATCHDOG = _Watchdog()


class _BoundedStream(httpx.SyncByteStream):
    """A response body read under a deadline, an idle limit (`arm`) and a size cap."""

    def __init__(self, inner: httpx.SyncByteStream, request: httpx.Request, started: float, deadline_s: float,
                 max_bytes: int, sock: socket.socket | None) -> None:
        self.inner, self.request, self.started = inner, request, started
        self.deadline_s, self.max_bytes, self.sock = deadline_s, max_bytes, sock
        self.read = 0
        self.idle_s: float | None = None
        self.idle_from = started
        self.fired: str | None = None
        self.limit = ""
        if sock is not None:
            _WATCHDOG.add(self)

    def due(self) -> float:
        end = self.started + self.deadline_s
        return end if self.idle_s is None else min(end, self.idle_from + self.idle_s)

    def fire(self, now: float) -> None:
        if now >= self.started + self.deadline_s:
            self.fired = f"the answer was still arriving after {now - self.started:.1f} s ({_size(self.read)} so far)"
            self.limit = f"{self.deadline_s:g} s in all"
        else:
            self.fired = (f"nothing it was waiting for came for {now - self.idle_from:.1f} s "
                          f"({_size(self.read)} so far)")
            self.limit = f"{self.idle_s:g} s without progress"
        try:
            assert self.sock is not None
            self.sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns; the connection is not reused
        except OSError:
            pass

    def arm(self, idle_s: float | None) -> None:
        """From now on, at most `idle_s` seconds until the next `arm` (None: the deadline alone)."""
        before = self.due()
        self.idle_s, self.idle_from = idle_s, time.monotonic()
        if self.due() < before:  # the watchdog sleeps until the earliest due time: wake it only to bring that forward
            _WATCHDOG.nudge()

    def _cut(self) -> BoundExceeded:
        return BoundExceeded(self.request, self.fired or "the read was cut", self.limit)

    def __iter__(self) -> Iterator[bytes]:
        it = iter(self.inner)
        while True:
            try:
                chunk = next(it)
            except StopIteration:
                if self.fired:
                    raise self._cut() from None
                return
            except Exception:
                if self.fired:
                    raise self._cut() from None
                raise
            if self.fired:
                raise self._cut()
            self.read += len(chunk)
            if self.read > self.max_bytes:
                raise BoundExceeded(self.request, f"the body went past {_size(self.max_bytes)} and was cut there",
                                    f"{_size(self.max_bytes)} a body")
            elapsed = time.monotonic() - self.started
            if elapsed > self.deadline_s:
                raise BoundExceeded(self.request, f"the answer was still arriving after {elapsed:.1f} s "
                                                  f"({_size(self.read)} so far)", f"{self.deadline_s:g} s in all")
            yield chunk

    def close(self) -> None:
        _WATCHDOG.remove(self)
        self.inner.close()


def _stale(exc: httpx.HTTPError, waiting: _Headers, request: httpx.Request) -> bool:
    """Whether `exc` is a kept connection found closed: the request went out on a reused connection (no new one was
    made for it), no byte of an answer came, and its body can be sent again."""
    return (isinstance(exc, httpx.RemoteProtocolError) and "without sending a response" in str(exc)
            and not waiting.connected and isinstance(request.stream, httpx.ByteStream))


class BoundedTransport(httpx.BaseTransport):
    """httpx's transport with every response body bounded (see the module docstring)."""

    def __init__(self, limits: Limits, inner: httpx.BaseTransport | None = None) -> None:
        self.limits = limits
        self.inner = inner or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        started = time.monotonic()
        deadline = float(request.extensions.get(DEADLINE, self.limits.deadline_s))
        max_bytes = int(request.extensions.get(MAX_BYTES, self.limits.max_bytes))
        chained = request.extensions.get("trace")
        for attempt in range(1, STALE_TRIES + 1):
            waiting = _Headers(started, deadline)

            def trace(name: str, info: dict[str, Any], waiting: _Headers = waiting) -> None:
                waiting.trace(name, info)
                if chained is not None:
                    chained(name, info)

            request.extensions["trace"] = trace
            _WATCHDOG.add(waiting)
            try:
                response = self.inner.handle_request(request)
                break
            except httpx.HTTPError as exc:
                if waiting.fired:
                    raise BoundExceeded(request, waiting.fired, f"{deadline:g} s in all") from None
                if attempt < STALE_TRIES and _stale(exc, waiting, request):
                    continue  # a kept connection the server had closed: again (another kept one, or a new one)
                raise
            finally:
                _WATCHDOG.remove(waiting)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            response.close()
            raise BoundExceeded(request, f"the server sent a {encoding}-encoded body although the request asked "
                                         "for identity (a compressed body can expand without bound)",
                                "identity encoding")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            response.close()
            raise BoundExceeded(request, f"the server announced a body of {_size(int(declared))}",
                                f"{_size(max_bytes)} a body")
        if time.monotonic() - started > deadline:
            response.close()
            raise BoundExceeded(request, f"its headers took {time.monotonic() - started:.1f} s",
                                f"{deadline:g} s in all")
        network = response.extensions.get("network_stream")
        sock = network.get_extra_info("socket") if network is not None else None
        assert isinstance(response.stream, httpx.SyncByteStream)
        body = _BoundedStream(response.stream, request, started, deadline, max_bytes,
                              sock if isinstance(sock, socket.socket) else None)
        response.stream = body
        response.extensions[BODY] = body  # the client wraps the stream again: `arm` finds it here
        return response

    def close(self) -> None:
        self.inner.close()


def bounded_client(limits: Limits = PROBE, pool: httpx.Limits | None = None, **kwargs: Any) -> httpx.Client:
    """An httpx client whose every exchange is bounded by `limits` (per request: the DEADLINE and MAX_BYTES
    extensions, and `timeout=`); `pool`: its connection pool (httpx's default: 100 connections, 20 kept alive)."""
    headers = {"Accept-Encoding": "identity", **kwargs.pop("headers", {})}
    inner = httpx.HTTPTransport(limits=pool) if pool is not None else None
    return httpx.Client(transport=BoundedTransport(limits, inner), headers=headers,
                        timeout=kwargs.pop("timeout", limits.timeout()), **kwargs)


def arm(response: httpx.Response, idle_s: float | None) -> None:
    """From now on, at most `idle_s` seconds of a response still being read until the next `arm` (a stream: the first
    token may take the prefill's time, each next one only an idle limit); None: its deadline alone."""
    body = response.extensions.get(BODY)
    if isinstance(body, _BoundedStream):
        body.arm(idle_s)
