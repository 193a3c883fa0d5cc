"""Benchmark client: OpenAI-compatible streaming completions (or chat completions, or SGLang's native
/generate), timed per request.

Each request becomes a record (failures are data, not exceptions) with raw monotonic timestamps and the
stream as the client saw it: one entry per server-sent event that carried tokens (`events_ms`: arrival, ms
after the request was sent; `event_tokens`: how many tokens it carried). An event carries tokens when
    completion chunk   a choice has a string `text` ("" counts: a token can decode to nothing), except the
                       closing chunk (every choice finished, no text) and the usage-only chunk (no choices)
    chat chunk         a choice's delta has `content` or `reasoning_content` (a string, "" counts), except
                       the header (a delta with `role` and no text) and the closing chunk
    native /generate   `meta_info.completion_tokens` (cumulative) went up
Tokens per event are the server's own where it counts them per chunk (cumulative `usage.completion_tokens`
in every chunk: vLLM's continuous_usage_stats; `meta_info.completion_tokens`): the increase, and an event is
an event only when it increased (`event_tokens_exact`). Otherwise one token per event.
Metrics derived per request (the serving figures over requests: spectrial.analysis.serving):
    tokens         = usage.completion_tokens, else the server's predicted_n, else the sum of event tokens
    chunks         = number of token events
    ttft_ms        = first token event - request sent
    e2el_ms        = stream ended - request sent
    tpot_ms        = (e2el_ms - ttft_ms) / (tokens - 1)                              time per output token
    client_tok_s   = (tokens - tokens of the first event) / (last event - first event)  decode rate seen by
                     the client (tok/s)
    server_*       = the engine's own per-request stats (`ServerRequestStats`: llama.cpp `timings`, SGLang
                     `meta_info`, counters read around the request), when it reports them
A request that asked for its full length (ignore_eos, no stop strings) and got fewer tokens is an error
("short output"); with ignore_eos off or stop strings, an early end is the model's choice, not an error.
Each record carries its work item's category and source, and the max_tokens it asked.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

import httpx
import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from spectrial.measure.httpread import DEADLINE, MAX_BYTES, MIB, BoundExceeded, Limits, arm, bounded_client
from spectrial.measure.workloads import WorkItem, as_items, request_order
from spectrial.progress import Progress
from spectrial.schema import RequestRecord, ServerRequestStats


class Sampling(TypedDict, total=False):
    """The sampling keys of a request body (OpenAI-compatible; SGLang's native `sampling_params` alike)."""

    temperature: float
    ignore_eos: bool
    top_p: float
    top_k: int
    seed: int
    sampling_seed: int  # SGLang native's name of seed
    stop: list[str]
    max_new_tokens: int  # SGLang native's max_tokens


class StreamOptions(TypedDict, total=False):
    include_usage: bool
    continuous_usage_stats: bool  # vLLM: usage in every chunk


class ChatMessage(TypedDict):
    role: str
    content: str


class RequestBody(Sampling, total=False):
    """The JSON body of one streaming request: OpenAI /v1/completions (`prompt`), /v1/chat/completions
    (`messages`), or SGLang's native /generate (`text`, `sampling_params`); engine extras where they apply."""

    model: str
    prompt: str
    messages: list[ChatMessage]
    text: str
    max_tokens: int
    stream: Literal[True]
    stream_options: StreamOptions
    cache_prompt: bool  # llama.cpp: reuse the slot's cached prompt
    sampling_params: Sampling


Payload = Callable[[WorkItem, int], RequestBody]  # (work item, max tokens) -> body
StatsFn = Callable[[dict[str, Any]], ServerRequestStats]  # the stream's last stats chunk -> the engine's figures
CounterStats = Callable[[dict[str, float], dict[str, float]], ServerRequestStats]  # counters before, after


class RequestTags(TypedDict, total=False):
    """Where a request belongs, set on its record (`RequestRecord` fields of the same names)."""

    arm: str
    point: str
    restart: int
    start: int
    concurrency: int
    offered_rate: float
    phase: str


class Usage(BaseModel):
    """An OpenAI `usage` object (what spectrial reads of it)."""

    model_config = ConfigDict(extra="ignore")

    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass
class _Stream:
    """What one stream delivered so far: token events, cumulative counts, the last usage and stats chunks."""

    times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    exact: bool = True  # every token event so far was counted by the server
    counted: int = 0  # the server's cumulative completion tokens at the last event it counted
    usage: Usage = field(default_factory=Usage)
    final: dict[str, Any] = field(default_factory=dict)  # the chunk with the engine's stats, as parsed
    native_len: int = 0  # native /generate: length of the cumulative text seen
    pieces: list[str] = field(default_factory=list)  # the first choice's text as streamed (the lossless check)
    native_text: str = ""  # native /generate: the cumulative text

    total: int = 0  # sum of `tokens`, kept as they arrive

    @property
    def output(self) -> str:
        return self.native_text or "".join(self.pieces)

    def add(self, now: float, n: int, exact: bool) -> None:
        self.times.append(now)
        self.tokens.append(n)
        self.total += n
        self.exact = self.exact and exact

    def feed(self, obj: dict[str, Any], now: float) -> None:
        """Take one parsed SSE event that arrived at `now`."""
        usage = None
        if isinstance(obj.get("usage"), dict):
            try:
                usage = Usage.model_validate(obj["usage"])
            except ValidationError:  # counts of the wrong type: not the server's counts
                usage = None
        if usage is not None:
            self.usage = usage
        if obj.get("timings") or obj.get("meta_info"):
            self.final = obj
        if "choices" in obj:
            raw = obj.get("choices")
            choices = [c for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []
            if not choices:
                return  # usage-only chunk
            self.pieces.append(_text_of(choices[0]))
            cum = usage.completion_tokens if usage is not None else None
            if cum is not None and self.exact:
                # the server counts every chunk (continuous usage): an event when its count went up
                n, self.counted = cum - self.counted, max(cum, self.counted)
                if n > 0:
                    self.add(now, n, True)
                return
            if any(_carries_text(c) for c in choices):
                self.add(now, 1, False)
            return
        if isinstance(obj.get("text"), str):  # native /generate: every chunk carries the text so far
            self.native_text = obj["text"]
        meta = obj.get("meta_info") if isinstance(obj.get("meta_info"), dict) else {}
        cum = meta.get("completion_tokens")
        if isinstance(cum, int) and not isinstance(cum, bool):  # native /generate: cumulative completion tokens
            self.usage = self.usage.model_copy(update={"completion_tokens": cum})
            n, self.counted = cum - self.counted, max(cum, self.counted)
            if n > 0:
                self.add(now, n, True)
            return
        text = obj.get("text")  # native without counts: cumulative text grew
        if isinstance(text, str) and len(text) > self.native_len:
            self.native_len = len(text)
            self.add(now, 1, False)


@dataclass(frozen=True)
class StreamLimits:
    """How long and how much one streaming request may take before the server counts as broken: the first token
    within `first_token_s` of sending, every next one within `idle_s` of the last, the whole stream within
    first_token_s + max_tokens x `per_token_s`, at most max_tokens + `margin` tokens (a stream past that never ends:
    a protocol violation), at most `bytes_per_token` x max_tokens + 1 MiB of body."""

    first_token_s: float = 120.0
    idle_s: float = 60.0
    per_token_s: float = 2.0
    margin: int = 16
    bytes_per_token: int = 64 << 10

    def total_s(self, max_tokens: int) -> float:
        return self.first_token_s + max(max_tokens, 1) * self.per_token_s

    def max_bytes(self, max_tokens: int) -> int:
        return MIB + max(max_tokens, 1) * self.bytes_per_token

    def most_tokens(self, max_tokens: int) -> int:
        return max(max_tokens, 1) + self.margin


VIOLATION = "protocol violation"
STREAM_TYPES = ("text/event-stream", "application/x-ndjson", "application/json")  # SGLang's native stream: json


def server_broke(rec: RequestRecord) -> str | None:
    """Why a request says its server is broken (a protocol violation, or no answer within the first token's limit),
    else None: after it, the requests still to send are not sent (each would wait as long again)."""
    if rec.violation:
        return f"{VIOLATION}: {rec.violation}"
    if rec.error and rec.error.startswith("no answer within") and not rec.chunks:
        return rec.error
    return None


def stream_limits(params: Any) -> StreamLimits:
    """The stream limits of a trial's (or observe's) params: `request_timeout_s` for the first token, `limits:` for
    the rest (spectrial.params.ReadLimits)."""
    lim = params.limits
    return StreamLimits(first_token_s=params.request_timeout_s, idle_s=lim.idle_s, per_token_s=1.0 / lim.min_tok_s,
                        margin=lim.stream_margin)


def _text_of(choice: dict[str, Any]) -> str:
    """The text a completion or chat choice carries ("" when none)."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return "".join(t for t in (delta.get("reasoning_content"), delta.get("content")) if isinstance(t, str))
    text = choice.get("text")
    return text if isinstance(text, str) else ""


def _carries_text(choice: dict[str, Any]) -> bool:
    """Whether a completion or chat choice carries a token (text "" included; header and closing chunks not)."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        texts = [delta.get(k) for k in ("content", "reasoning_content") if isinstance(delta.get(k), str)]
        if not texts or ("role" in delta and not any(texts)):
            return False  # no text key, or the header chunk ({"role": "assistant", "content": ""})
    elif isinstance(choice.get("text"), str):
        texts = [choice["text"]]
    else:
        return False
    return not (choice.get("finish_reason") is not None and not any(texts))  # the closing chunk


def stream_completion(client: httpx.Client, base_url: str, body: RequestBody, stats_fn: StatsFn | None,
                      timeout_s: float, path: str = "/v1/completions",
                      limits: StreamLimits | None = None) -> RequestRecord:
    """One streaming request; returns a record with every token event's arrival, token count and server
    stats (`stats_fn` of the chunk that carried them; None: none read), or an error (kept with what arrived
    before it).

    Understands OpenAI completion and chat chunks (`choices[].text`, `choices[].delta`, `usage`) and SGLang's
    native `/generate` chunks (cumulative `text`, `meta_info.completion_tokens`).

    Bounded (`limits`; `timeout_s` is the first token's limit): a stream that sends no token in time, goes silent,
    trickles past its total limit, sends more than its body cap, or keeps sending tokens past max_tokens + margin
    is cut there, and the request fails as a protocol violation of the server (`violation` says what it did)."""
    lim = limits or StreamLimits(first_token_s=timeout_s)
    t0 = time.monotonic()
    error: str | None = None
    violation: str | None = None
    s = _Stream()
    max_tokens = body.get("max_tokens") or (body.get("sampling_params") or {}).get("max_new_tokens") or 0
    most = lim.most_tokens(max_tokens)
    events = 0
    try:
        with client.stream("POST", f"{base_url}{path}", json=body,  # headers within the first token's limit
                           timeout=httpx.Timeout(lim.total_s(max_tokens), read=lim.first_token_s,
                                                 connect=min(10.0, lim.first_token_s)),
                           extensions={DEADLINE: lim.total_s(max_tokens),
                                       MAX_BYTES: lim.max_bytes(max_tokens)}) as r:
            if r.status_code != 200:
                return RequestRecord(t_start=t0, error=f"HTTP {r.status_code}: "
                                                       f"{r.read()[:300].decode(errors='replace')}")
            kind = r.headers.get("content-type", "text/event-stream").split(";")[0].strip().lower()
            if kind not in STREAM_TYPES:
                raise BoundExceeded(r.request, f"it answered a streaming request with Content-Type {kind!r}, not an "
                                               "event stream", "text/event-stream")
            arm(r, max(lim.first_token_s - (time.monotonic() - t0), 0.001))
            done = False
            for line in r.iter_lines():  # read to the body's end after [DONE]: the connection is kept for the next
                now = time.monotonic()
                if done or not line.startswith("data:"):
                    events += done  # anything after [DONE] counts towards the cut
                    if events > 4 * most + 64:
                        violation = f"the server kept sending after [DONE] ({events} lines)"
                        break
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    continue
                events += 1
                try:
                    obj = json.loads(data)
                except (json.JSONDecodeError, RecursionError):  # not JSON, or nested past any real event
                    continue
                if isinstance(obj, dict):
                    before = len(s.times)
                    try:
                        s.feed(obj, now)
                    except (TypeError, ValueError, AttributeError, KeyError):  # an event of no known shape
                        continue
                    if len(s.times) > before:
                        arm(r, lim.idle_s)
                got = max(s.total, s.usage.completion_tokens or 0)
                if got > most or events > 4 * most + 64:
                    violation = (f"the server kept streaming past max_tokens: {got} tokens in {events} events for "
                                 f"max_tokens {max_tokens} (cut at {most})")
                    break
    except BoundExceeded as exc:
        if not s.times and exc.limit.endswith("without progress"):  # the first token's limit: slow, not a violation
            error = f"no answer within {lim.first_token_s:g} s (request_timeout_s): no token came"
        else:
            violation = f"{exc.problem} (limit: {exc.limit})"
    except httpx.TimeoutException as exc:
        error = (f"no answer within {lim.first_token_s:g} s (request_timeout_s)" if not s.times else
                 f"{type(exc).__name__}: {exc}")
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    if violation is not None:
        error = f"{VIOLATION}: {violation}"
    t_end = time.monotonic()
    stats = stats_fn(s.final) if s.final and stats_fn is not None else ServerRequestStats()
    if stats.server_prompt_n is None and s.usage.prompt_tokens is not None:
        stats.server_prompt_n = s.usage.prompt_tokens  # the prompt as the server tokenized it (chat: templated)
    tokens = s.usage.completion_tokens or stats.server_predicted_n or sum(s.tokens)
    rec = RequestRecord(t_start=t0, t_end=t_end, error=error, violation=violation, tokens=tokens,
                        chunks=len(s.times), e2el_ms=(t_end - t0) * 1000, events_ms=[(t - t0) * 1000 for t in s.times],
                        event_tokens=list(s.tokens), event_tokens_exact=s.exact if s.times else None,
                        output=s.output if s.times else None, **stats.fields())
    if s.times:
        rec.ttft_ms = (s.times[0] - t0) * 1000
        if tokens > 1:
            rec.tpot_ms = ((t_end - t0) * 1000 - rec.ttft_ms) / (tokens - 1)
        span = s.times[-1] - s.times[0]
        rec.client_tok_s = (tokens - s.tokens[0]) / span if span > 0 and tokens > s.tokens[0] else None
    if error is None and tokens < max_tokens and full_length(body):
        rec.error = f"short output: {tokens} of {max_tokens} tokens"
    return rec


def full_length(body: RequestBody) -> bool:
    """Whether a request body asks for exactly its max tokens (ignore_eos and no stop strings)."""
    sp: Sampling = body.get("sampling_params") or {}
    return bool(body.get("ignore_eos", sp.get("ignore_eos"))) and not (body.get("stop") or sp.get("stop"))


def arrivals(n: int, rate: float, seed: int) -> list[float]:
    """An open loop's schedule: `n` arrival times (s after the first, which is at 0) of a Poisson process of `rate`
    requests per second, the gaps drawn exponential from a generator seeded with `seed` (the same seed, the same
    schedule: every arm of a level is offered the same arrivals). `vllm bench serve --request-rate` draws its gaps
    the same way (a gamma distribution of shape 1, its burstiness 1)."""
    if rate <= 0 or not np.isfinite(rate):
        raise ValueError(f"request rate {rate!r}: give a positive number of requests per second")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, max(n - 1, 0))
    return [0.0, *np.cumsum(gaps).tolist()][:n]


def run_requests(base_url: str, prompts: Sequence[WorkItem | dict[str, Any]], *, n: int, max_tokens: int,
                 payload: Payload, stats_fn: StatsFn | None = None,
                 concurrency: int = 1, timeout_s: float = 300, seed: int = 0, phase: str = "measure",
                 label: str = "", progress: bool = True, path: str = "/v1/completions",
                 tags: RequestTags | None = None, output_len: str = "fixed",
                 counters: tuple[Callable[[], dict[str, float]], CounterStats] | None = None,
                 limits: StreamLimits | None = None, rate: float | None = None) -> list[RequestRecord]:
    """Send `n` requests (work items in a seeded order, categories taking turns: `request_order`),
    `concurrency` at a time (a closed loop: the next is sent as one ends), or with `rate` as an open loop: each sent
    at its arrival time (`arrivals`: exponential gaps of mean 1 / `rate` s, seeded with `seed`), at most
    `concurrency` in flight; a request that arrives with the cap full waits in the client for a slot (its record
    says `held`, and `send_delay_ms` how long). `payload(item, max_tokens)` builds each body. Each request asks `max_tokens`, or
    with `output_len` "dataset" its item's own length capped at `max_tokens`. One record each, carrying `tags`
    (arm, restart, start, concurrency), the item's id, category and source. With `counters` = (snapshot,
    stats) and concurrency 1, the server's counters are read around each request and `stats(before, after)`
    adds the engine's own per-request figures (server_*) to its record. Every request is bounded by `limits`
    (default: `timeout_s` for the first token and StreamLimits' defaults; `stream_completion`)."""
    order = request_order(as_items(prompts), n, seed)
    bar = Progress(f"{label} {phase}".strip(), total=n, unit="req", enabled=progress)

    broken: list[str] = []  # the first request that showed the server broken: the rest are not sent

    def one(i: int) -> RequestRecord:
        p = order[i]
        mt = min(max_tokens, p.output_len) if output_len == "dataset" and p.output_len else max_tokens
        before = None
        if broken:
            rec = RequestRecord(t_start=time.monotonic(), error=f"not sent: {broken[0]}")
        else:
            before = counters[0]() if counters and concurrency == 1 and rate is None else None
            rec = stream_completion(client, base_url, payload(p, mt), stats_fn, timeout_s, path, limits)
            if (why := server_broke(rec)) is not None and not broken:
                broken.append(f"an earlier request of this window found the server broken ({why})")
        if not broken and before is not None and counters and not rec.error:
            for k, v in counters[1](before, counters[0]()).fields().items():
                setattr(rec, k, v)
        for k, v in {"index": i, "phase": phase, "prompt_id": p.id, "category": p.category, "turn": p.turn, "source": p.source,
                     "max_tokens": mt, "prompt_len": p.prompt_len, **(tags or {})}.items():
            setattr(rec, k, v)
        bar.update(1)
        return rec

    def open_loop(pool: ThreadPoolExecutor) -> list[RequestRecord]:
        """Each request submitted at its arrival; the pool's `concurrency` workers are the cap."""
        assert rate is not None
        times, lock, active, held = arrivals(n, rate, seed), threading.Lock(), [0], [False] * n

        def timed(i: int, due: float) -> RequestRecord:
            try:
                rec = one(i)
            finally:
                with lock:
                    active[0] -= 1
            rec.offered_rate, rec.held = rate, held[i]
            rec.arrival_ms = round(times[i] * 1000, 3)
            rec.send_delay_ms = round(max(rec.t_start - due, 0.0) * 1000, 3) if rec.t_start is not None else None
            return rec

        t0, futures = time.monotonic(), []
        for i, at in enumerate(times):
            if not broken and (wait := t0 + at - time.monotonic()) > 0:
                time.sleep(wait)
            with lock:
                held[i] = active[0] >= concurrency
                active[0] += 1
            futures.append(pool.submit(timed, i, t0 + at))
        return [f.result() for f in futures]

    lim = limits or StreamLimits(first_token_s=timeout_s)
    pool_limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    with bounded_client(Limits(deadline_s=lim.total_s(max_tokens), read_s=lim.total_s(max_tokens),
                               max_bytes=lim.max_bytes(max_tokens)), pool=pool_limits) as client:
        if concurrency == 1 and rate is None:
            out = [one(i) for i in range(n)]
        else:
            pool = ThreadPoolExecutor(concurrency)
            try:
                out = open_loop(pool) if rate is not None else list(pool.map(one, range(n)))
            except BaseException:  # an interrupt: do not wait for the streams in flight (the server's stop ends them)
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            pool.shutdown()
    failed, held = sum(1 for r in out if r.error), sum(1 for r in out if r.held)
    bar.close(f"{n} request(s){f', {failed} failed' if failed else ''}"
              + (f", {held} held by the cap of {concurrency} in flight" if held else ""))
    return out
