"""SGLang log records (every era seen in public logs).

Kinds and columns (engine "sglang"):
- ``decode``: running_req, num_token, token_usage, accept_len, accept_rate, graph (bool), gen_throughput,
  queue_req, mamba_usage, dp_rank, tp_rank. ``Decode batch.`` / ``Decode batch,``; hybrid models'
  ``#full token`` / ``full token usage`` fill num_token / token_usage; ``cuda|npu|cpu graph`` all fill
  graph; clipped lines keep the fields that survived. One row per DP rank (ranks are not samples).
- ``prefill``: new_seq, new_token, cached_token, cache_hit_rate (fraction), token_usage, running_req,
  queue_req, input_throughput, graph, dp_rank, tp_rank.
- ``ready`` (``The server is fired up and ready to roll``), ``kv_cache`` (kv_tokens, k_gb, v_gb),
  ``graph_capture`` (phase "begin"/"end", graph_name e.g. "main", "target verify", elapsed_s, mem_gb,
  avail_mem_gb), ``server_args`` (``args``: the ``ServerArgs(...)`` dump as a dict; hard-wrapped pastes
  and fragments are joined and parsed as far as they go).
- ``bench_serving``: one row per ``Serving Benchmark Result`` block, whoever printed it (engine "vllm"
  when the block has no ``Backend:`` row but ``Failed requests:``): backend, successful_requests,
  duration_s, output_throughput, total_throughput, median_ttft_ms, median_tpot_ms, median_itl_ms,
  accept_len, concurrency (measured mean), max_concurrency (the setting; "not set" -> NaN), ...
- ``bench_one_batch``: gen_throughput, accept_len (``last generation throughput: X tok/s``,
  ``acc_length: X``; also ``sglang.test.send_one``'s ``acc_length=X`` / ``speed=X token/s``).
- ``bench_mtbench``: label, questions, gen_throughput, accept_len (``benchmark/mtbench`` output).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from spectrial.logs.core import (
    NUM,
    TS_ISO,
    BlockFormat,
    BlockResult,
    FastResult,
    LineFormat,
    Text,
    Window,
    bnum,
    num,
    registry,
)

TS = (r"\[(?P<timestamp>(?:[0-9]{4}-[0-9]{2}-[0-9]{2}[ T])?[0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]+)?)"
      r"(?: [A-Z]{2,3}[0-9]+)*\]")
# `[2026-01-01 10:00:00 DP1 TP0]`: timestamp and ranks in one pass
PREFIX = (r"\[(?P<timestamp>(?:[0-9]{4}-[0-9]{2}-[0-9]{2}[ T])?[0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]+)?)"
          r"(?: DP(?P<dp_rank>[0-9]+))?(?: [A-Z]{2,3}[0-9]+)*?(?: TP(?P<tp_rank>[0-9]+))?(?: [A-Z]{2,3}[0-9]+)*\]",
          TS_ISO)
GRAPH_KEYS = {f"{d} graph": "graph" for d in ("cuda", "npu", "cpu", "xpu", "hpu", "musa", "mlu", "mps")}
GRAPH_KEYS["graph"] = "graph"  # any other device, found as a key suffix
COMMON_KEYS = {"token usage": "token_usage", "full token usage": "token_usage", "#running-req": "running_req",
               "#queue-req": "queue_req", **GRAPH_KEYS}

registry.add(LineFormat(
    "sglang", "decode", ("Decode batch",), PREFIX,
    keys={"#running-req": "running_req", "#token": "num_token", "#full token": "num_token",
          **COMMON_KEYS, "accept len": "accept_len", "accept rate": "accept_rate",
          "gen throughput (token/s)": "gen_throughput", "gen throughput (tok/s)": "gen_throughput",
          "mamba usage": "mamba_usage"},
    types={"graph": "bool"}, percent=("accept_rate",),
    require=("running_req", "num_token", "token_usage", "accept_len", "accept_rate", "gen_throughput",
             "queue_req"),
    key_metrics=("gen_throughput", "accept_len", "accept_rate", "running_req", "token_usage"),
))

registry.add(LineFormat(
    "sglang", "prefill", ("Prefill batch",), PREFIX,
    keys={"#new-seq": "new_seq", "#new-token": "new_token", "#cached-token": "cached_token",
          "cache hit rate": "cache_hit_rate", **COMMON_KEYS,
          "input throughput (token/s)": "input_throughput", "input throughput (tok/s)": "input_throughput"},
    types={"graph": "bool"}, percent=("cache_hit_rate",),
    require=("new_seq", "new_token", "cached_token", "running_req", "input_throughput"),
    key_metrics=("input_throughput", "new_token", "cache_hit_rate"),
))

registry.add(LineFormat(
    "sglang", "ready", ("The server is fired up and ready to roll",), (TS, TS_ISO), require=(),
))

registry.add(LineFormat(
    "sglang", "kv_cache", ("KV Cache is allocated",),
    (*PREFIX,
     r"#tokens: (?P<kv_tokens>[0-9]+)",
     rf"K size: (?P<k_gb>{NUM}) ?GB",
     rf"V size: (?P<v_gb>{NUM}) ?GB"),
    require=("kv_tokens", "k_gb", "v_gb"),
    key_metrics=("kv_tokens", "k_gb", "v_gb"),
))


def _graph_finalize(df: Any) -> Any:
    df["graph_name"] = df["graph_name"].where(df["graph_name"].notna(), "main")
    df["graph_name"] = df["graph_name"].str.lower()
    return df


registry.add(LineFormat(
    "sglang", "graph_capture", ("Capture cuda graph", "CUDA graph end", "CUDA graph begin", "cuda graph end",
                                "cuda graph begin"),
    (*PREFIX,
     r"Capture (?P<graph_name>(?:[A-Za-z0-9_-]+ )*?)(?:cuda|CUDA|Cuda) graph (?P<phase>begin|end)",
     rf"(?:Time elapsed: |elapsed=)(?P<elapsed_s>{NUM}) ?s",
     rf"mem usage=(?P<mem_gb>{NUM}) ?GB",
     rf"avail mem=(?P<avail_mem_gb>{NUM}) ?GB"),
    types={"graph_name": "str", "phase": "str"},
    require=("phase",),
    finalize=_graph_finalize,
    key_metrics=("elapsed_s", "mem_gb"),
))


# ---------------------------------------------------------------- server_args
_LOG_START = re.compile(r"^\s*(?:\[[0-9]|\(\w+ pid=|(?:INFO|WARNING|ERROR|DEBUG)\b|[0-9]{4}-[0-9]{2}-[0-9]{2}"
                        r"|[0-9]+\.[0-9]{2}\.[0-9]{3}\.[0-9]{3} )")


def _scan_value(text: str, i: int) -> tuple[str, int, bool]:
    """Read one value from text[i:]; returns (value, end, closed) where closed means the dump's ')'."""
    depth: list[str] = []
    quote = ""
    j = i
    while j < len(text):
        c = text[j]
        if quote:
            if c == "\\":
                j += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth.append(c)
        elif c in ")]}":
            if not depth:
                return text[i:j], j, c == ")"
            depth.pop()
        elif c == "," and not depth:
            return text[i:j], j, False
        j += 1
    return text[i:j], j, False


def _literal(value: str) -> Any:
    v = value.strip()
    if len(v) <= 20000:
        try:
            return ast.literal_eval(v)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    return v


# one `key=value`: a simple value (quoted without escapes, or no brackets) up to `,` / `)`, or the start of
# a bracketed / escaped value that _scan_value reads
_ITEM = re.compile(r"""([A-Za-z_][A-Za-z0-9_]*)=(?:('[^'\\\n]*'|"[^"\\\n]*"|[^,()\[\]{}'"\n]*?)\s*(?=[,)]|$)|(?=.))""")
_PAREN = re.compile(r"\s*\)")
_CONST = {"None": None, "True": True, "False": False}


def _simple_value(v: str) -> Any:
    if v in _CONST:
        return _CONST[v]
    if v[:1] in ("'", '"') and len(v) >= 2:
        return v[1:-1]
    if v.isascii() and v.isdigit():  # the common number, without the cost of an exception below
        return int(v)
    try:
        return int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return v


def parse_kwargs(text: str) -> tuple[dict[str, Any], bool]:
    """`a=1, b='x', c=[1, 2]` (a Python repr of keyword arguments) -> (dict, closed by ')')."""
    out: dict[str, Any] = {}
    pos = 0
    while True:
        # simple items follow each other: one finditer (each match starts where the last one ended, as a
        # search from there would) until a bracketed or escaped value, which _scan_value reads
        m = None
        for m in _ITEM.finditer(text, pos):
            value = m.group(2)
            if value is None:
                break
            out[m.group(1)] = _simple_value(value)
            pos = m.end()
            if text[pos:pos + 1] != "," and _PAREN.match(text, pos):
                return out, True
        else:
            return out, False
        value, end, closed = _scan_value(text, m.end())
        out[m.group(1)] = _literal(value)
        if closed:
            return out, True
        pos = max(end, m.end() + 1)


def server_args(w: Window) -> BlockResult:
    """``server_args=ServerArgs(...)`` (joined across hard wraps), or a headless fragment of one."""
    first = w[0] or ""
    at = first.find("ServerArgs(")
    if at < 0 and ("with config:" in first or "non-default args" in first):
        return [], 0
    parts = [first[at + len("ServerArgs("):] if at >= 0 else first.strip()]
    used = 1
    while not parts[-1].rstrip().endswith(")") and used < 200:  # a paste wrapped the one-line dump
        nxt = w[used]
        if nxt is None or not nxt.strip() or _LOG_START.match(nxt):
            break
        parts.append(nxt)
        used += 1
    args, _ = parse_kwargs("".join(parts))
    if len(args) < (1 if at >= 0 else 3):
        return [], 0
    return [(0, {"args": args})], used


registry.add(BlockFormat(
    "sglang", "server_args",
    ("ServerArgs(", "mem_fraction_static=", "cuda_graph_max_bs=", "disable_radix_cache=",
     "chunked_prefill_size=", "enable_torch_compile=", "disable_cuda_graph="),
    server_args, {"args": "object"}, timestamps=(TS, TS_ISO),
))


# ---------------------------------------------------------------- bench_serving blocks
_SECTION = re.compile(r"^\s*-{3,}.*?-{3,}\s*$")
_CLOSE = re.compile(r"^\s*={10,}\s*$")
_LAT = re.compile(r"^(mean|median|p99) (ttft|tpot|itl|e2e latency) \(ms\)$")
BENCH_COLUMNS: dict[str, str] = {
    "backend": "str", "request_rate": "float", "max_concurrency": "float", "successful_requests": "float",
    "failed_requests": "float", "duration_s": "float", "total_input_tokens": "float",
    "total_output_tokens": "float", "request_throughput": "float", "input_throughput": "float",
    "output_throughput": "float", "peak_output_throughput": "float", "peak_concurrency": "float",
    "total_throughput": "float", "concurrency": "float", "accept_len": "float", "accept_rate": "float",
    **{f"{s}_{m}_ms": "float" for m in ("ttft", "tpot", "itl", "e2e") for s in ("mean", "median", "p99")},
}
_LABELS = {
    "backend": "backend", "traffic request rate": "request_rate", "request rate": "request_rate",
    "max request concurrency": "max_concurrency", "maximum request concurrency": "max_concurrency",
    "successful requests": "successful_requests", "failed requests": "failed_requests",
    "benchmark duration (s)": "duration_s", "total input tokens": "total_input_tokens",
    "total generated tokens": "total_output_tokens", "request throughput (req/s)": "request_throughput",
    "input token throughput (tok/s)": "input_throughput", "output token throughput (tok/s)": "output_throughput",
    "peak output token throughput (tok/s)": "peak_output_throughput",
    "peak concurrent requests": "peak_concurrency", "total token throughput (tok/s)": "total_throughput",
    "total throughput (tok/s)": "total_throughput", "concurrency": "concurrency",
    "accept length": "accept_len", "acceptance length": "accept_len", "acceptance rate (%)": "accept_rate",
}


_LABEL_CACHE: dict[str, str | None] = {}


def _bench_label(label: str) -> str | None:
    try:
        return _LABEL_CACHE[label]
    except KeyError:
        pass
    if len(_LABEL_CACHE) > 4096:
        _LABEL_CACHE.clear()
    col = _LABEL_CACHE[label] = _bench_column(label)
    return col


def _bench_column(label: str) -> str | None:
    key = re.sub(r"\s+", " ", label.lower().replace("reqeuest", "request")).strip()
    if key in _LABELS:
        return _LABELS[key]
    m = _LAT.match(key)
    if m:
        metric = "e2e" if m.group(2) == "e2e latency" else m.group(2)
        return f"{m.group(1)}_{metric}_ms"
    return None


def bench_serving(w: Window) -> BlockResult:
    """A ``==== Serving Benchmark Result ====`` block: rows `label: value` up to the closing `=` rule."""
    rec: dict[str, Any] = {}
    k = 1
    while (s := w[k]) is not None:
        head = s.lstrip()[:1]
        if head == "=" and _CLOSE.match(s):
            k += 1
            break
        if head == "-" and _SECTION.match(s):
            k += 1
            continue
        label, sep, rest = s.partition(":")
        value = rest.strip()
        if not sep or not value or len(label) > 80 or len(s) - len(rest.lstrip()) < 30:
            break  # not a `{:<40} {:<10}` row: the block has ended
        col = _bench_label(label)
        if col == "backend":
            rec[col] = value
        elif col is not None:
            v = num(value)
            rec[col] = v / 100 if (col == "accept_rate" and v is not None) else v
        k += 1
    if not any(v is not None for c, v in rec.items() if c != "backend"):
        return [], 0
    engine = "vllm" if "backend" not in rec and "failed_requests" in rec else "sglang"
    return [(0, {"engine": engine, **rec})], k


_CLOSE_B = re.compile(_CLOSE.pattern.encode())
_SECTION_B = re.compile(_SECTION.pattern.encode())
_BLABEL: dict[bytes, str | None] = {}


def bench_serving_fast(text: Text, i: int) -> FastResult | None:
    """:func:`bench_serving` over the plain bytes of the block."""
    rec: dict[str, Any] = {}
    k = 1
    labels = _BLABEL
    for s in text.iter_lines(i + 1, 24):
        if s[:1] in (b" ", b"=", b"-"):
            head = s.lstrip()[:1]
            if head == b"=" and _CLOSE_B.match(s):
                k += 1
                examined = k
                break
            if head == b"-" and _SECTION_B.match(s):
                k += 1
                continue
        label, sep, rest = s.partition(b":")
        value = rest.strip()
        if not sep or not value or len(label) > 80 or len(s) - len(rest.lstrip()) < 30:
            examined = k + 1
            break
        col = labels.get(label, "")
        if col == "":
            col = labels[label] = _bench_label(label.decode())
        if col == "backend":
            rec[col] = value.decode()
        elif col is not None:
            v = bnum(value)
            rec[col] = v / 100 if (col == "accept_rate" and v is not None) else v
        k += 1
    else:
        return None  # the block goes on past what was read
    if not any(v is not None for c, v in rec.items() if c != "backend"):
        return [], 0, examined
    engine = "vllm" if "backend" not in rec and "failed_requests" in rec else "sglang"
    return [(0, {"engine": engine, **rec})], k, examined


registry.add(BlockFormat(
    "sglang", "bench_serving", ("Serving Benchmark Result",), bench_serving, BENCH_COLUMNS, fast=bench_serving_fast,
    key_metrics=("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms", "accept_len"),
))


# ---------------------------------------------------------------- bench_one_batch / send_one / mtbench
_ONE = {
    "gen_throughput": re.compile(rf"(?:last generation throughput:\s*|^\s*speed=)({NUM})\s*tok(?:en)?/s"),
    "accept_len": re.compile(rf"acc_length\s*[:=]\s*({NUM})"),
}


def bench_one_batch(w: Window) -> BlockResult:
    """`last generation throughput` / `acc_length` (and send_one's `speed=`) lines, grouped."""
    rec: dict[str, Any] = {}
    used = 0
    for k in range(0, 8):
        s = w[k]
        if s is None:
            break
        found = {col: num(m.group(1)) for col, rx in _ONE.items() if (m := rx.search(s))}
        if any(col in rec for col in found):
            break  # the next record begins
        if found:
            rec.update(found)
            used = k + 1
        elif s.strip() and len(rec) == len(_ONE):
            break
    return ([(0, rec)], used) if rec else ([], 0)


registry.add(BlockFormat(
    "sglang", "bench_one_batch", ("last generation throughput", "acc_length"), bench_one_batch,
    {"gen_throughput": "float", "accept_len": "float"}, key_metrics=("gen_throughput", "accept_len"),
))

_MT = {
    "questions": re.compile(r"#questions:\s*([0-9]+)"),
    "gen_throughput": re.compile(rf"Throughput:\s*({NUM})\s*tok"),
    "accept_len": re.compile(rf"Accept(?:ance)? length:\s*({NUM})"),
}


def bench_mtbench(w: Window) -> BlockResult:
    """``#questions: 80, Throughput: X token/s, Acceptance length: X`` with the label line above it."""
    s = w[0] or ""
    rec: dict[str, Any] = {c: num(m.group(1)) for c, rx in _MT.items() if (m := rx.search(s))}
    if not rec.get("gen_throughput") and not rec.get("accept_len"):
        return [], 0
    for k in (-1, -2):
        prev = (w[k] or "").strip()
        if prev:
            rec["label"] = prev[:-1].strip() if prev.endswith(":") else None
            break
    return [(0, rec)], 1


def bench_mtbench_fast(text: Text, i: int) -> FastResult | None:
    """:func:`bench_mtbench` on the chunk's own (plain) lines."""
    s = text.line(i)
    rec: dict[str, Any] = {c: num(m.group(1)) for c, rx in _MT.items() if (m := rx.search(s))}
    if not rec.get("gen_throughput") and not rec.get("accept_len"):
        return [], 0, 1
    for k in (-1, -2):
        prev = text.line(i + k).strip()
        if prev:
            rec["label"] = prev[:-1].strip() if prev.endswith(":") else None
            break
    return [(0, rec)], 1, 1


registry.add(BlockFormat(
    "sglang", "bench_mtbench", ("#questions:",), bench_mtbench,
    {"label": "str", "questions": "float", "gen_throughput": "float", "accept_len": "float"},
    key_metrics=("gen_throughput", "accept_len"), fast=bench_mtbench_fast, lookback=2,
))
