"""Load on the client: what spectrial's own streaming client costs per token, and whether it keeps up and
stays flat in memory under many concurrent streams.

N streaming requests (`--requests`, default 5,000) at `--concurrency` (64) go through `spectrial.measure.bench.run_requests`,
the code path a trial uses, with an engine adapter's payload and stats functions (`--engine llamacpp`, the
default; `vllm`: cumulative usage in every chunk; `openai`: a minimal completions body), against a fast local
streaming server written here: asyncio in a separate process (its own GIL), POST /v1/completions answered with
`text/event-stream` in OpenAI's completion format, one event per token (the request's `max_tokens`, `--tokens`),
`usage` in the last chunk (llama.cpp's `timings` too when the body is llama.cpp's, usage in every chunk when the
body asks vLLM's `continuous_usage_stats`), `data: [DONE]`, no sleeps. By default the server yields to its
event loop after each event, so the streams interleave as a batched engine's decode steps do (one event per
stream per step); `--burst` writes each stream at once. GET /stats returns what it sent and its own CPU time.

Prints
    client CPU per token   the client process's user+sys CPU (getrusage RUSAGE_SELF: every thread of it) per token
                           received; its CPU / wall says whether it was the bottleneck (~1.0: one core, the GIL's);
                           and the CPU of the client's threads alive before and after the run (e.g. a watchdog)
    wall per token         the run's wall time / tokens received; tok/s and req/s achieved
    server CPU per token   the server's own, for scale: the client, not the server, must be what is measured
    connections            TCP connections the server accepted during the run (reused ones: fewer than requests)
    memory                 the client's RSS sampled every `--sample` s (start, peak, end); RSS once 500 requests
                           were sent against the end, and the slope of RSS over requests, against the records' own
                           size (5,000 RequestRecords with per-event timestamps legitimately grow: their deep size is
                           measured) and what growth is left unexplained by them; and first a leak check: as many
                           requests in `--batches` batches whose records are dropped at once, RSS after each batch
                           (nothing kept: it must stay flat)
    lost events            every request error-free, tokens == max_tokens, events recorded == tokens == the server's
                           events sent; the totals against the server's counters. Exit 1 when any is lost.

`--rates 50,200,1000` measures the open loop instead (a sweep's `grid.request_rate` levels: `run_requests(rate=...)`),
`--requests` per rate (default 2,000 here), at most `--concurrency` in flight: per rate the schedule's own rate, the
rate the client sent at, the send delay behind the schedule (p50, p99, max: the client's timing error; a request
the cap held is counted apart) and the client's CPU / wall. The highest rate whose p99 send delay stays a small
share of the mean gap is the most this client can offer on this machine.

`--drop K` makes the server withhold K token events per request (usage still claims them all) and `--short K`
end K tokens early: both must be reported as lost (tests/measure/test_bench_client_load.py asserts so). `--profile N`
profiles N sequential requests (cProfile, one thread) and prints the client's hot spots per token.

    python benchmarks/bench_client.py [--requests 5000] [--concurrency 64] [--tokens 64] [--quick]
                                      [--engine llamacpp|vllm|openai] [--burst] [--sample 0.5] [--batches 10]
                                      [--profile N] [--drop K] [--short K] [--rates R1,R2,...]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024


# --- the server: a separate process (python bench_client.py --serve), asyncio, no sleeps --------------------------
@dataclass
class ServerOptions:
    drop: int = 0  # token events withheld per request (from its middle); usage still claims every token
    short: int = 0  # tokens fewer than max_tokens generated (and claimed)
    burst: bool = False  # write each stream without yielding to the other streams between events


@dataclass
class _Sent:
    requests: int = 0
    events: int = 0  # token events written
    tokens: int = 0  # tokens claimed in usage
    connections: int = 0  # TCP connections accepted


TEXTS = [f" w{i}".encode() for i in range(16)]
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")


def _chunk(frame: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(frame), frame)


def _usage(prompt: int, completion: int) -> bytes:
    return b'"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (prompt, completion,
                                                                                      prompt + completion)


async def _stream(writer: asyncio.StreamWriter, body: dict[str, Any], opt: ServerOptions, sent: _Sent) -> None:
    """One completion stream: one chunk per token, the last token with finish_reason, usage last, [DONE]."""
    sent.requests += 1
    claimed = max(0, int(body.get("max_tokens") or 16) - opt.short)
    skip = range(claimed // 2, claimed // 2 + opt.drop)
    continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
    prompt = len(str(body.get("prompt", "")).split())
    model = json.dumps(str(body.get("model", "m"))).encode()
    pre = b'data: {"id":"cmpl-%d","object":"text_completion","created":%d,"model":%s,"choices":[{"index":0,"text":"' % (
        sent.requests, int(time.time()), model)
    writer.write(HEAD)
    for i in range(claimed):
        if i in skip:
            continue
        fin = b'"length"' if i == claimed - 1 else b"null"
        usage = b"," + _usage(prompt, i + 1) if continuous else b""
        writer.write(_chunk(pre + TEXTS[i & 15] + b'","logprobs":null,"finish_reason":' + fin + b"}]" + usage + b"}\n\n"))
        sent.events += 1
        if not opt.burst:
            await asyncio.sleep(0)  # a yield, not a wait: the other streams' events go out between this one's
        if writer.transport.get_write_buffer_size() > 256 * 1024:
            await writer.drain()  # the client is behind: wait for the kernel to take it
    last = b'{"id":"cmpl-%d","object":"text_completion","model":%s,"choices":[],' % (sent.requests, model)
    last += _usage(prompt, claimed)
    if "cache_prompt" in body:  # llama.cpp's body: its `timings` in the last chunk, as llama-server sends them
        last += b',"timings":{"prompt_n":%d,"prompt_ms":0.5,"predicted_n":%d,"predicted_ms":%.1f}' % (
            prompt, claimed, claimed * 0.1)
    writer.write(_chunk(b"data: " + last + b"}\n\n") + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    sent.tokens += claimed
    await writer.drain()


async def _connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, opt: ServerOptions,
                      sent: _Sent) -> None:
    """HTTP/1.1 keep-alive: POST /v1/completions streams, GET /stats answers the counters and the CPU used."""
    sent.connections += 1
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                return
            line, *headers = head.decode("latin-1").split("\r\n")
            method, target = line.split(" ")[:2]
            length = next((int(v) for k, _, v in (h.partition(":") for h in headers)
                           if k.strip().lower() == "content-length"), 0)
            body = await reader.readexactly(length) if length else b""
            if method == "POST" and target == "/v1/completions":
                await _stream(writer, json.loads(body), opt, sent)
                continue
            if method == "GET" and target == "/stats":
                ru = resource.getrusage(resource.RUSAGE_SELF)
                status, out = b"200 OK", json.dumps({"requests": sent.requests, "events": sent.events,
                                                      "tokens": sent.tokens, "connections": sent.connections,
                                                      "cpu_s": ru.ru_utime + ru.ru_stime}).encode()
            else:
                status, out = b"404 Not Found", b'{"error": "not found"}'
            writer.write(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (status, len(out), out))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


def serve(opt: ServerOptions) -> None:
    """Listen on 127.0.0.1 (a free port: printed as `PORT n`) until stdin closes (the parent stopped or died)."""
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    sent = _Sent()

    async def main() -> None:
        srv = await asyncio.start_server(lambda r, w: _connection(r, w, opt, sent), "127.0.0.1", 0, backlog=1024)
        print(f"PORT {srv.sockets[0].getsockname()[1]}", flush=True)
        async with srv:
            await srv.serve_forever()

    asyncio.run(main())


@contextmanager
def server(opt: ServerOptions | None = None, start_timeout_s: float = 30) -> Iterator[str]:
    """The server in its own process; yields its base URL; stops it (by its process) whatever happens."""
    opt = opt or ServerOptions()
    argv = [sys.executable, str(Path(__file__).resolve()), "--serve", "--drop", str(opt.drop), "--short", str(opt.short)]
    proc = subprocess.Popen(argv + (["--burst"] if opt.burst else []), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], start_timeout_s)
        line = proc.stdout.readline().decode() if ready else ""
        if not line.startswith("PORT "):
            raise RuntimeError(f"the SSE server did not start (exit {proc.poll()}, said {line!r})")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        if proc.stdin is not None:
            proc.stdin.close()  # its watcher exits it
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()


def server_stats(base: str) -> dict[str, float]:
    import httpx

    return httpx.get(f"{base}/stats", timeout=10).json()


# --- the client's load ------------------------------------------------------------------------------------------
def rss() -> int:
    """This process's resident set, bytes (/proc/self/statm, as psutil reads it)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by thread name (/proc/self/task/<tid>/stat)."""
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for t in threading.enumerate():
        try:
            with open(f"/proc/self/task/{t.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[t.name] = out.get(t.name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def deep_size(obj: Any) -> int:
    """Bytes of `obj` and everything it holds (pydantic models' fields and extras, lists, dicts), each object
    once: what the records themselves occupy (objects they share, such as None or a category string, counted once)."""
    seen: set[int] = set()
    stack, total = [obj], 0
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif hasattr(o, "__pydantic_fields_set__"):
            stack.extend(getattr(o, a, None) for a in ("__dict__", "__pydantic_extra__", "__pydantic_fields_set__",
                                                       "__pydantic_private__"))
    return total


def payload_for(engine: str) -> tuple[str, Callable[..., Any], Callable[..., Any] | None]:
    """Path, payload and stats functions as a trial gets them from its engine adapter (or a minimal body)."""
    if engine == "openai":
        return "/v1/completions", lambda item, n: {"model": "m", "prompt": item.completion_text(), "max_tokens": n,
                                                   "stream": True, "ignore_eos": True,
                                                   "stream_options": {"include_usage": True}}, None
    from spectrial.engines import get_engine
    from spectrial.hosts.local import LocalHost
    from spectrial.params import load_params

    params = load_params(REPO / ("params/local.yaml" if engine == "llamacpp" else "params/examples/vllm-cpu.yaml"))
    adapter = get_engine(engine, params, LocalHost())
    path, payload = adapter.request_target(params.request_format)
    return path, payload, adapter.request_stats


@dataclass
class Load:
    """One measured run: its records, times, CPU, the server's counters and the RSS samples."""

    n: int
    concurrency: int
    tokens: int
    records: list[Any]
    wall_s: float
    cpu_user_s: float
    cpu_sys_s: float
    server: dict[str, float]  # what the server sent during the run, and its CPU seconds
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (s since start, RSS bytes, requests sent)
    rss_start: int = 0
    rss_end: int = 0
    maxrss: int = 0  # the kernel's high-water mark of the process (ru_maxrss), bytes
    records_bytes: int = 0
    events_bytes: int = 0  # of which the per-event lists (events_ms, event_tokens)
    sample_s: float = 0.5
    batches: list[tuple[int, int]] = field(default_factory=list)  # leak check: (requests sent, RSS after the batch)
    threads: dict[str, float] = field(default_factory=dict)  # CPU s during the run of threads alive before and after

    @property
    def received(self) -> int:
        return sum(r.tokens for r in self.records)

    @property
    def events(self) -> int:
        return sum(len(r.events_ms or []) for r in self.records)

    @property
    def cpu_s(self) -> float:
        return self.cpu_user_s + self.cpu_sys_s

    @property
    def rss_peak(self) -> int:
        return max([self.rss_start, self.rss_end, *(s[1] for s in self.samples)])

    def rss_at(self, sent: int) -> tuple[float, int, int]:
        """The first sample taken once `sent` requests had been sent."""
        return next((s for s in self.samples if s[2] >= sent), self.samples[-1])

    def growth(self, after: int) -> tuple[int, int, int]:
        """(RSS growth from the first sample once `after` requests were sent to the end, the part of it the
        records of the requests completed since then explain, the rest), bytes."""
        _, at, sent = self.rss_at(after)
        later = max(0, self.n - max(0, sent - self.concurrency))  # requests completed after that sample, at most
        explained = int(self.records_bytes / max(1, len(self.records)) * later)
        return self.rss_end - at, explained, self.rss_end - at - explained

    def slope(self, after: int) -> float | None:
        """RSS bytes per request sent, least squares over the samples once `after` requests were sent."""
        pts = [(s[2], s[1]) for s in self.samples if s[2] >= after]
        if len(pts) < 3 or pts[-1][0] == pts[0][0]:
            return None
        mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
        return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def measure(base: str, *, n: int, concurrency: int, tokens: int, engine: str = "llamacpp", sample_s: float = 0.5,
            warmup: int | None = None, batches: int = 0,
            wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None) -> Load:
    """`n` requests of `tokens` at `concurrency` through `run_requests` (after `warmup` unmeasured ones, default
    `concurrency`), sampling this process's RSS every `sample_s`. `wrap` wraps the payload function (tests).

    With `batches`, first a leak check: `n` requests more in that many batches, each batch's records dropped
    (RSS read after each): with nothing kept, RSS after the last batch must be that after the first. Before the
    measured run, so that memory its records leave free cannot hide a leak."""
    from spectrial.measure.bench import run_requests
    from spectrial.measure.workloads import bundled_items

    path, payload, stats_fn = payload_for(engine)
    if wrap is not None:
        payload = wrap(payload)
    prompts = bundled_items()
    common = {"max_tokens": tokens, "payload": payload, "stats_fn": stats_fn, "path": path,
              "concurrency": concurrency, "timeout_s": 60, "progress": False}
    if warmup != 0:
        run_requests(base, prompts, n=concurrency if warmup is None else warmup, phase="warmup", **common)
    gc.collect()
    leak: list[tuple[int, int]] = []
    for b in range(batches):
        run_requests(base, prompts, n=n // batches, phase="warmup", seed=b, **common)  # records dropped at once
        gc.collect()
        leak.append(((b + 1) * (n // batches), rss()))
    sent = itertools.count()
    counted = [0]

    def counting(item: Any, mt: int) -> Any:
        counted[0] = next(sent) + 1
        return payload(item, mt)

    common["payload"] = counting
    samples: list[tuple[float, int, int]] = []
    stop = threading.Event()
    before = server_stats(base)
    threads0 = thread_cpu()
    rss_start = rss()
    ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()

    def sampler() -> None:
        while not stop.wait(sample_s):
            samples.append((time.monotonic() - t0, rss(), counted[0]))

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    try:
        records = run_requests(base, prompts, n=n, **common)
    finally:
        stop.set()
        th.join()
    t1, ru1 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    rss_end = rss()
    threads1 = thread_cpu()
    samples.append((t1 - t0, rss_end, counted[0]))
    after = server_stats(base)
    load = Load(n=n, concurrency=concurrency, tokens=tokens, records=records, wall_s=t1 - t0,
                cpu_user_s=ru1.ru_utime - ru0.ru_utime, cpu_sys_s=ru1.ru_stime - ru0.ru_stime,
                server={k: after[k] - before[k] for k in after}, samples=samples, rss_start=rss_start,
                rss_end=rss_end, maxrss=ru1.ru_maxrss * 1024, sample_s=sample_s, batches=leak,
                threads={k: v - threads0[k] for k, v in threads1.items() if k in threads0 and k != "MainThread"})
    load.records_bytes = deep_size(records)
    load.events_bytes = deep_size([(r.events_ms, r.event_tokens) for r in records]) - deep_size([(None, None)] * n)
    return load


def lost_events(load: Load, limit: int = 3) -> list[str]:
    """What was lost, as lines naming examples (empty: nothing): requests, errors, tokens short of max_tokens,
    events the record has not for every token, and the totals against what the server sent."""
    recs, problems = load.records, []

    def check(what: str, bad: list[Any]) -> None:
        if bad:
            problems.append(f"{len(bad)} request(s) {what}: " + "; ".join(map(str, bad[:limit])))

    if len(recs) != load.n:
        problems.append(f"{len(recs)} records for {load.n} requests")
    check("failed", [f"#{r.index} {r.error}" for r in recs if r.error])
    check("short of max_tokens", [f"#{r.index} {r.tokens} of {r.max_tokens}" for r in recs if r.tokens != r.max_tokens])
    check("with events lost", [f"#{r.index} {r.chunks} events, {len(r.events_ms or [])} times, "
                               f"{sum(r.event_tokens or [])} event tokens for {r.tokens} tokens"
                               for r in recs if not r.chunks == len(r.events_ms or []) == sum(r.event_tokens or [])
                               == r.tokens])
    srv = load.server
    if srv.get("requests") != load.n:
        problems.append(f"the server answered {srv.get('requests')} requests, the client recorded {load.n}")
    if srv.get("events") != load.events:
        problems.append(f"the server sent {srv.get('events'):.0f} token events, the client recorded {load.events}")
    if srv.get("tokens") != load.received:
        problems.append(f"the server claimed {srv.get('tokens'):.0f} tokens, the client received {load.received}")
    return problems


def report(load: Load, engine: str, burst: bool) -> list[str]:
    tok, mib = load.received, lambda b: f"{b / MIB:,.1f} MiB"
    lines = [f"{load.n:,} requests x {load.tokens} tokens at concurrency {load.concurrency}, engine payload {engine}, "
             f"server {'bursts' if burst else 'interleaved'}; {os.cpu_count()} CPU(s), load average "
             f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
             f"  client CPU per token   {load.cpu_s / tok * 1e6:7.1f} us  (user {load.cpu_user_s:.2f} s + sys "
             f"{load.cpu_sys_s:.2f} s = {load.cpu_s:.2f} s for {tok:,} tokens; CPU/wall {load.cpu_s / load.wall_s:.2f})",
             *(f"  of which thread        {v:.2f} s: {k}, alive before and after the run "
               f"({v / max(load.cpu_s, 1e-9):.0%} of the client's CPU)"
               for k, v in sorted(load.threads.items(), key=lambda kv: -kv[1]) if v >= 0.01),
             f"  wall per token         {load.wall_s / tok * 1e6:7.1f} us  ({load.wall_s:.2f} s)",
             f"  achieved               {tok / load.wall_s:,.0f} tok/s, {load.n / load.wall_s:,.1f} req/s",
             f"  server CPU per token   {load.server['cpu_s'] / tok * 1e6:7.1f} us  ({load.server['cpu_s']:.2f} s: "
             f"{load.server['cpu_s'] / max(load.cpu_s, 1e-9):.0%} of the client's)",
             f"  connections            {load.server['connections']:,.0f} opened for {load.n:,} requests"
             + (" (one each: a stream left before its body's end is closed, not reused)"
                if load.server["connections"] >= load.n else "")]
    per_rec = load.records_bytes / max(1, len(load.records))
    lines.append(f"  RSS                    start {mib(load.rss_start)}, peak {mib(load.rss_peak)} (sampled every "
                 f"{load.sample_s:g} s; kernel high-water {mib(load.maxrss)}), end {mib(load.rss_end)}")
    lines.append(f"  records                {mib(load.records_bytes)} ({per_rec:,.0f} B per request, of which "
                 f"{load.events_bytes / max(1, len(load.records)):,.0f} B its per-event times and token counts: the "
                 f"RequestRecords a trial keeps, by design)")
    mark = min(500, load.n // 10)
    t, at, sent = load.rss_at(mark)
    grew, explained, rest = load.growth(mark)
    slope = load.slope(mark)
    lines.append(f"  RSS once {sent:,} sent     {mib(at)} at {t:.1f} s -> end {mib(load.rss_end)}: +{mib(grew)}, of which "
                 f"the later records' {mib(explained)}; unexplained {rest / MIB:+,.1f} MiB "
                 f"({rest / max(1, load.n - sent):+,.0f} B per request)")
    if slope is not None:
        lines.append(f"  RSS slope              {slope:+,.0f} B per request sent (the records: {per_rec:,.0f} B; "
                     f"beyond them {slope - per_rec:+,.0f} B)")
    if len(load.batches) > 1:
        (n1, r1), (nk, rk) = load.batches[0], load.batches[-1]
        lines.append(f"  leak check             {len(load.batches)} batches of {n1:,} requests, records dropped after "
                     f"each: RSS after the first {mib(r1)}, after the last {mib(rk)}: {(rk - r1) / MIB:+,.1f} MiB "
                     f"({(rk - r1) / (nk - n1):+,.0f} B per request; "
                     + ", ".join(f"{r / MIB:.1f}" for _, r in load.batches) + ")")
    return lines


def profile(base: str, n: int, tokens: int, engine: str, top: int = 18) -> list[str]:
    """The client's hot spots: `n` sequential requests under cProfile (one thread), functions by own time."""
    import cProfile
    import pstats

    from spectrial.measure.bench import run_requests
    from spectrial.measure.workloads import bundled_items

    path, payload, stats_fn = payload_for(engine)
    prompts = bundled_items()
    run_requests(base, prompts, n=4, max_tokens=tokens, payload=payload, stats_fn=stats_fn, path=path, progress=False)
    prof = cProfile.Profile()
    prof.enable()
    recs = run_requests(base, prompts, n=n, max_tokens=tokens, payload=payload, stats_fn=stats_fn, path=path,
                        progress=False)
    prof.disable()
    tok = sum(r.tokens for r in recs)
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]  # type: ignore[attr-defined]
    total = sum(v[2] for v in st.stats.values())  # type: ignore[attr-defined]
    out = [f"profile: {n} sequential requests, {tok:,} tokens, {total / tok * 1e6:.1f} us per token of own time "
           f"under cProfile (inflated by it; the shares are what matter)"]
    for (file, line, fn), (_cc, calls, own, cum, _) in rows:
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else file
        out.append(f"  {own / total:6.1%} own {own / tok * 1e6:6.2f} us/tok  cum {cum / tok * 1e6:6.2f} us/tok  "
                   f"{calls / tok:5.2f} calls/tok  {fn}  {where}")
    return out


def open_loop(base: str, rates: list[float], n: int, concurrency: int, tokens: int, engine: str) -> list[str]:
    """Per offered rate: `n` requests as an open loop (seeded exponential arrivals), at most `concurrency` in
    flight; how closely the client kept the schedule."""
    import numpy as np

    from spectrial.measure.bench import run_requests
    from spectrial.measure.workloads import bundled_items

    path, payload, stats_fn = payload_for(engine)
    prompts = bundled_items()
    out = [f"open loop: {n:,} requests of {tokens} tokens per rate, at most {concurrency} in flight ({engine} "
           "payload); send delay = sent - scheduled arrival"]
    for rate in rates:
        cpu0, t0 = time.process_time(), time.monotonic()
        recs = run_requests(base, prompts, n=n, max_tokens=tokens, payload=payload, stats_fn=stats_fn, path=path,
                            concurrency=concurrency, rate=rate, progress=False)
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
        free = [r for r in recs if not r.held]
        d = np.array([r.send_delay_ms for r in free if r.send_delay_ms is not None])
        sent = sorted(r.t_start for r in recs if r.t_start is not None)
        last = max(r.arrival_ms or 0.0 for r in recs) / 1000
        out.append(f"  {rate:>8g} req/s  schedule {(n - 1) / last:8.1f} req/s, sent at "
                   f"{(len(sent) - 1) / (sent[-1] - sent[0]):8.1f} req/s; send delay p50 {np.percentile(d, 50):6.2f} "
                   f"ms, p99 {np.percentile(d, 99):7.2f} ms, max {d.max():7.2f} ms (mean gap {1000 / rate:.2f} ms); "
                   f"held by the cap {len(recs) - len(free)}; {sum(1 for r in recs if r.error)} errors; client "
                   f"CPU / wall {cpu / wall:.2f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64, help="max_tokens of each request: the server sends as many")
    ap.add_argument("--quick", action="store_true", help="500 requests (while developing)")
    ap.add_argument("--engine", choices=["llamacpp", "vllm", "openai"], default="llamacpp")
    ap.add_argument("--burst", action="store_true", help="the server writes each stream at once")
    ap.add_argument("--sample", type=float, default=0.5, help="RSS sampling interval, s")
    ap.add_argument("--batches", type=int, default=10, help="leak check first: as many requests again in B "
                    "batches, records dropped after each (0: none)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="also profile N sequential requests")
    ap.add_argument("--drop", type=int, default=0, help="the server withholds K token events per request")
    ap.add_argument("--short", type=int, default=0, help="the server ends K tokens early")
    ap.add_argument("--rates", default="", help="measure the open loop at these request rates (req/s) instead")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    opt = ServerOptions(drop=a.drop, short=a.short, burst=a.burst)
    if a.serve:
        serve(opt)
        return
    if a.quick:
        a.requests = min(a.requests, 500)
    if a.rates:
        with server(opt) as base:
            n = a.requests if "--requests" in sys.argv else 2000
            print("\n".join(open_loop(base, [float(x) for x in a.rates.split(",")], min(n, a.requests), a.concurrency,
                                       a.tokens, a.engine)), flush=True)
        return
    with server(opt) as base:
        load = measure(base, n=a.requests, concurrency=a.concurrency, tokens=a.tokens, engine=a.engine,
                       sample_s=a.sample, batches=a.batches)
        lost = lost_events(load)
        lines = report(load, a.engine, a.burst)
        lines.append(f"  lost events            none: {load.n:,} requests, {load.events:,} token events recorded of "
                     f"{load.server['events']:,.0f} sent, {load.received:,} tokens of {load.n * a.tokens:,} asked, "
                     f"{sum(1 for r in load.records if r.error)} errors"
                     if not lost else "  LOST EVENTS:\n    " + "\n    ".join(lost))
        print("\n".join(lines), flush=True)
        if a.profile:
            print("\n".join(profile(base, a.profile, a.tokens, a.engine)))
    sys.exit(1 if lost else 0)


if __name__ == "__main__":
    main()
