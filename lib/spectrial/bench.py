"""Benchmark client: OpenAI-compatible streaming completions (or chat completions, or SGLang's native
/generate), timed per request.

Each request becomes a record (failures are data, not exceptions) with raw monotonic timestamps;
metrics are derived afterwards:
    ttft_ms        = first content chunk - request start
    itl_ms_median  = median gap between content chunks (speculative servers send several tokens at once)
    client_tok_s   = (tokens - 1) / (last chunk - first chunk)      decode rate seen by the client
    server_*       = the engine's own per-request stats (llama.cpp `timings`), when it reports them
A request that asked for its full length (ignore_eos, no stop strings) and got fewer tokens is an error
("short output"); with ignore_eos off or stop strings, an early end is the model's choice, not an error.
Each record carries its work item's category and source, and the max_tokens it asked.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from spectrial.progress import Progress
from spectrial.schema import RequestRecord
from spectrial.workloads import WorkItem, as_items, request_order


def stream_completion(client: httpx.Client, base_url: str, body: dict[str, Any],
                      stats_fn: Callable[[dict[str, Any]], dict[str, Any]], timeout_s: float,
                      path: str = "/v1/completions") -> RequestRecord:
    """One streaming request; returns a record with timings, token count and server stats, or an error.

    Understands OpenAI completion chunks (`choices[].text`, `usage`) and SGLang's native `/generate`
    chunks (cumulative `text`, `meta_info.completion_tokens`)."""
    rec: dict[str, Any] = {"t_start": time.monotonic(), "error": None}
    chunks: list[float] = []
    final: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    n_text = 0
    seen_len = 0
    max_tokens = body.get("max_tokens") or (body.get("sampling_params") or {}).get("max_new_tokens") or 0
    try:
        with client.stream("POST", f"{base_url}{path}", json=body, timeout=timeout_s) as r:
            if r.status_code != 200:
                rec["error"] = f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:300]}"
                return RequestRecord(**rec)
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    obj = json.loads(data)
                except json.JSONDecodeError:
                    continue
                now = time.monotonic()
                if "choices" in obj:  # completion chunks carry `text`, chat chunks `delta.content`
                    text = "".join(c.get("text") or _delta_text(c.get("delta")) for c in obj.get("choices") or [])
                else:  # native /generate: cumulative text
                    full = obj.get("text") or ""
                    text, seen_len = full[seen_len:], max(seen_len, len(full))
                    if (obj.get("meta_info") or {}).get("completion_tokens"):
                        usage = {"completion_tokens": obj["meta_info"]["completion_tokens"]}
                if text:
                    chunks.append(now)
                    n_text += 1
                if obj.get("usage"):
                    usage = obj["usage"]
                if obj.get("timings") or obj.get("meta_info"):
                    final = obj
    except httpx.HTTPError as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    rec["t_end"] = time.monotonic()
    rec.update(stats_fn(final) if final else {})
    if rec.get("server_prompt_n") is None and isinstance(usage.get("prompt_tokens"), int):
        rec["server_prompt_n"] = usage["prompt_tokens"]  # the prompt as the server tokenized it (chat: templated)
    tokens = usage.get("completion_tokens") or rec.get("server_predicted_n") or n_text
    rec["tokens"] = tokens
    rec["chunks"] = len(chunks)
    if chunks:
        rec["ttft_ms"] = (chunks[0] - rec["t_start"]) * 1000
        gaps = [b - a for a, b in zip(chunks, chunks[1:], strict=False)]
        rec["itl_ms_median"] = statistics.median(gaps) * 1000 if gaps else None
        span = chunks[-1] - chunks[0]
        rec["client_tok_s"] = (tokens - 1) / span if span > 0 and tokens > 1 else None
    if rec["error"] is None and tokens < max_tokens and full_length(body):
        rec["error"] = f"short output: {tokens} of {max_tokens} tokens"
    return RequestRecord(**rec)


def _delta_text(delta: Any) -> str:
    """The text of a chat chunk's delta (content, and reasoning content where a server splits it off)."""
    if not isinstance(delta, dict):
        return ""
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


def full_length(body: dict[str, Any]) -> bool:
    """Whether a request body asks for exactly its max tokens (ignore_eos and no stop strings)."""
    sp = body.get("sampling_params") or {}
    return bool(body.get("ignore_eos", sp.get("ignore_eos"))) and not (body.get("stop") or sp.get("stop"))


def run_requests(base_url: str, prompts: Sequence[WorkItem | dict[str, Any]], *, n: int, max_tokens: int,
                 payload: Callable[[WorkItem, int], dict[str, Any]],
                 stats_fn: Callable[[dict[str, Any]], dict[str, Any]],
                 concurrency: int = 1, timeout_s: float = 300, seed: int = 0, phase: str = "measure",
                 label: str = "", progress: bool = True, path: str = "/v1/completions",
                 tags: dict[str, Any] | None = None, output_len: str = "fixed",
                 counters: tuple[Callable[[], dict[str, float]],
                                 Callable[[dict[str, float], dict[str, float]], dict[str, Any]]] | None = None
                 ) -> list[RequestRecord]:
    """Send `n` requests (work items in a seeded order, categories taking turns: `request_order`),
    `concurrency` at a time; `payload(item, max_tokens)` builds each body. Each request asks `max_tokens`, or
    with `output_len` "dataset" its item's own length capped at `max_tokens`. One record each, carrying `tags`
    (arm, restart, start, concurrency), the item's id, category and source. With `counters` = (snapshot,
    stats) and concurrency 1, the server's counters are read around each request and `stats(before, after)`
    adds the engine's own per-request figures (server_*) to its record."""
    order = request_order(as_items(prompts), n, seed)
    bar = Progress(f"{label} {phase}".strip(), total=n, unit="req", enabled=progress)

    def one(i: int) -> RequestRecord:
        p = order[i]
        mt = min(max_tokens, p.output_len) if output_len == "dataset" and p.output_len else max_tokens
        before = counters[0]() if counters and concurrency == 1 else None
        rec = stream_completion(client, base_url, payload(p, mt), stats_fn, timeout_s, path)
        if before is not None and counters and not rec.error:
            for k, v in counters[1](before, counters[0]()).items():
                setattr(rec, k, v)
        for k, v in {"index": i, "phase": phase, "prompt_id": p.id, "category": p.category, "source": p.source,
                     "max_tokens": mt, "prompt_len": p.prompt_len, **(tags or {})}.items():
            setattr(rec, k, v)
        bar.update(1)
        return rec

    with httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10)) as client:
        if concurrency == 1:
            out = [one(i) for i in range(n)]
        else:
            pool = ThreadPoolExecutor(concurrency)
            try:
                out = list(pool.map(one, range(n)))
            except BaseException:  # an interrupt: do not wait for the streams in flight (the server's stop ends them)
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            pool.shutdown()
    failed = sum(1 for r in out if r.error)
    bar.close(f"{n} request(s){f', {failed} failed' if failed else ''}")
    return out
