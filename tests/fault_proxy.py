"""A fault proxy for the hostile-server tests: a real HTTP/1.1 proxy in front of a real server (llama-server) that
misbehaves on chosen paths, one fault at a time. It is a test tool, not a double: every answer it does not break
comes from the real server, byte for byte.

    proxy = FaultProxy(upstream_port, {"/metrics": "bomb"}).start()   # proxy.port; proxy.stop()
    python tests/fault_proxy.py --listen P --upstream Q --fault /v1/completions=endless   # the same, as a process

Faults (what a broken or hostile server or proxy does):
    bomb            /metrics: the real text, then 600 MB of comment lines
    trickle         the real headers, then the body one byte every 2 s
    trickle_headers the real answer from its first byte, one byte every second
    endless         a completion stream that never ends: the last real chunk again every 20 ms, no [DONE]
    silence         200 and its headers, then nothing (the connection held open)
    stall           the real stream's first three events, then nothing (the connection held open)
    garbage         200 as an event stream, then lines of invalid JSON and binary bytes, then the end
    slow_first_byte nothing for 30 s, then the real answer
    reset           the real answer, cut by a TCP reset after its first 600 bytes
    wrong_type      the real answer with Content-Type: text/html
    gzip_bomb       200 with Content-Encoding: gzip, a stream of compressed zeros (1,000:1) that never ends
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import struct
import threading
import zlib

FAULTS = ("bomb", "trickle", "trickle_headers", "endless", "stall", "silence", "garbage", "slow_first_byte", "reset", "wrong_type", "gzip_bomb")
CHUNK = 64 << 10


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, str] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    path = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else "/"
    length = 0
    kept = [lines[0]]
    for ln in lines[1:]:
        if not ln:
            continue
        name = ln.split(":", 1)[0].strip().lower()
        if name == "content-length":
            length = int(ln.split(":", 1)[1])
        if name in ("connection", "keep-alive"):
            continue
        kept.append(ln)
    body = await reader.readexactly(length) if length else b""
    kept.append("Connection: close")
    return ("\r\n".join(kept) + "\r\n\r\n").encode("latin-1") + body, path.split("?")[0]


async def _upstream(port: int, request: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(request)
    await w.drain()
    return r, w


def _split(raw: bytes) -> tuple[bytes, bytes]:
    """A whole response as (headers, body), the body de-chunked where it was sent chunked."""
    i = raw.find(b"\r\n\r\n")
    if i < 0:
        return raw, b""
    head, body = raw[:i + 4], raw[i + 4:]
    if b"transfer-encoding: chunked" not in head.lower():
        return head, body
    out, pos = bytearray(), 0
    while pos < len(body):
        end = body.find(b"\r\n", pos)
        if end < 0:
            break
        size = int(body[pos:end].split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += body[end + 2:end + 2 + size]
        pos = end + 2 + size + 2
    return head, bytes(out)


class FaultProxy:
    """The proxy on 127.0.0.1 (a free port unless given), one fault per path prefix; others pass through."""

    def __init__(self, upstream_port: int, faults: dict[str, str], port: int = 0) -> None:
        for mode in faults.values():
            assert mode in FAULTS, mode
        self.upstream, self.faults, self.port = upstream_port, dict(faults), port
        self.loop = asyncio.new_event_loop()
        self.thread: threading.Thread | None = None
        self.served: dict[str, int] = {}
        self.paths: dict[str, int] = {}  # requests per path (query left out), faulted or not

    def fault_of(self, path: str) -> str | None:
        return next((m for p, m in self.faults.items() if path.startswith(p)), None)

    # --- one connection ----------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            got = await _read_request(reader)
            if got is None:
                return
            request, path = got
            mode = self.fault_of(path)
            self.served[mode or "pass"] = self.served.get(mode or "pass", 0) + 1
            bare = path.split("?", 1)[0]
            self.paths[bare] = self.paths.get(bare, 0) + 1
            await getattr(self, f"_{mode or 'pass'}")(request, writer)
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _pass(self, request: bytes, w: asyncio.StreamWriter, transform=None) -> None:
        ur, uw = await _upstream(self.upstream, request)
        try:
            while chunk := await ur.read(CHUNK):
                w.write(transform(chunk) if transform else chunk)
                await w.drain()
        finally:
            uw.close()

    async def _real(self, request: bytes) -> bytes:
        ur, uw = await _upstream(self.upstream, request)
        try:
            return await ur.read()
        finally:
            uw.close()

    async def _bomb(self, request: bytes, w: asyncio.StreamWriter) -> None:
        head, body = _split(await self._real(request))
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nConnection: close\r\n\r\n" + body)
        line = b"# " + b"x" * (CHUNK - 3) + b"\n"
        for _ in range((600 << 20) // CHUNK):
            w.write(line)
            await w.drain()

    async def _trickle(self, request: bytes, w: asyncio.StreamWriter) -> None:
        head, body = _split(await self._real(request))
        w.write(head)
        for b in body:
            w.write(bytes([b]))
            await w.drain()
            await asyncio.sleep(2.0)

    async def _trickle_headers(self, request: bytes, w: asyncio.StreamWriter) -> None:
        for b in await self._real(request):
            w.write(bytes([b]))
            await w.drain()
            await asyncio.sleep(1.0)

    async def _endless(self, request: bytes, w: asyncio.StreamWriter) -> None:
        raw = await self._real(request)
        head, body = _split(raw)
        events = [e for e in body.split(b"\n\n") if e.strip().startswith(b"data:") and b"[DONE]" not in e]
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        w.write(head)
        last = events[-2] if len(events) > 1 else (events[-1] if events else b'data: {"choices":[{"text":"x"}]}')
        for e in events[:-1]:  # the real stream without its closing chunk and [DONE]
            w.write(e + b"\n\n")
        while True:
            w.write(last + b"\n\n")
            await w.drain()
            await asyncio.sleep(0.02)

    async def _stall(self, request: bytes, w: asyncio.StreamWriter) -> None:
        head, body = _split(await self._real(request))
        events = [e for e in body.split(b"\n\n") if e.strip().startswith(b"data:")]
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for e in events[:3]:
            w.write(e + b"\n\n")
        await w.drain()
        await asyncio.sleep(600)

    async def _silence(self, request: bytes, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        await w.drain()
        await asyncio.sleep(600)

    async def _garbage(self, request: bytes, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for i in range(200):
            w.write(b"data: {not json" + str(i).encode() + b"\n\n" if i % 2 else os.urandom(512) + b"\n")
            await w.drain()

    async def _slow_first_byte(self, request: bytes, w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)
        await self._pass(request, w)

    async def _reset(self, request: bytes, w: asyncio.StreamWriter) -> None:
        raw = await self._real(request)
        w.write(raw[:600])
        await w.drain()
        sock = w.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        w.transport.abort()

    async def _wrong_type(self, request: bytes, w: asyncio.StreamWriter) -> None:
        def swap(chunk: bytes) -> bytes:
            return chunk.replace(b"text/event-stream", b"text/html").replace(b"application/json", b"text/html")

        await self._pass(request, w, swap)

    async def _gzip_bomb(self, request: bytes, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
                b"Connection: close\r\n\r\n")
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        zeros = b"\0" * (1 << 20)
        while True:
            w.write(z.compress(zeros))
            w.write(z.flush(zlib.Z_SYNC_FLUSH))
            await w.drain()

    # --- life ----------------------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="fault-proxy")
        self.thread.start()
        fut = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", self.port, limit=1 << 20), self.loop)
        self.server = fut.result(10)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            self.server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self.thread is not None:
            self.thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", type=int, required=True)
    ap.add_argument("--upstream", type=int, required=True)
    ap.add_argument("--fault", action="append", default=[], help="PATH=MODE")
    a = ap.parse_args()
    faults = dict(f.split("=", 1) for f in a.fault)
    proxy = FaultProxy(a.upstream, faults, port=a.listen).start()
    assert proxy.thread is not None
    proxy.thread.join()


if __name__ == "__main__":
    main()
