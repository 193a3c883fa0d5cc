"""SGLang log records (every era seen in public logs).

Kinds and columns (engine "sglang"):
- ``decode``: running_req, num_token, token_usage, accept_len, accept_rate, graph (bool), gen_throughput,
  queue_req, mamba_usage, dp_rank, tp_rank. ``Decode batch.`` / ``Decode batch,``; hybrid models'
  ``#full token`` / ``full token usage`` fill num_token / token_usage; ``cuda|npu|cpu graph`` all fill
  graph; clipped lines keep the fields that survived. One row per DP rank (ranks are not samples).
- ``prefill``: new_seq, new_token, cached_token, cache_hit_rate (fraction), token_usage, running_req,
  queue_req, input_throughput, graph, dp_rank, tp_rank.
- ``ready`` (``The server is fired up and ready to roll``), ``kv_cache`` (kv_tokens, k_gb, v_gb, kv_dtype),
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
- ``startup_timings`` (``Engine startup timings (s): load_weight=..., kv_cache_allocation=...,
  scheduler_e2e=..., cuda_graph={prefill=..., decode=..., ...}, tokenizer_e2e=...``): load_weight_s,
  kv_cache_allocation_s, scheduler_e2e_s, tokenizer_e2e_s, cuda_graph_s (the sum of the cuda_graph
  phases); NaN where a value is not a number.
- ``event``: event, message (the line after its prefix). event is one of "graceful_exit"
  (``Gracefully exiting...``: a clean stop, even when the exit status is -9), "scheduler_exception"
  (``Scheduler hit an exception``: a crash), "sigquit" (``SIGQUIT received`` / ``Received sigquit``: a
  child failed), "sigterm" (``SIGTERM received``), "deprecation" (the bold-yellow warning SGLang's
  ``print_deprecated_warning`` prints, e.g. for ``--disable-cuda-graph``; its colour codes stripped).
"""

from __future__ import annotations

import re
import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spectrial.logs import pyrepr
from spectrial.logs.chunks import Chunk, Window
from spectrial.logs.columns import numbers, objects
from spectrial.logs.formats import DECLINE, MORE, BlockFormat, BlockResult, Blocks, LineFormat, Record
from spectrial.logs.native import blocks as compiled
from spectrial.logs.pyrepr import parse_kwargs
from spectrial.logs.registry import registry
from spectrial.logs.text import NUM, TS_ISO, WS, named, num, re2
from spectrial.logs.vector import (
    LAST,
    ROW,
    SKIP,
    STOP,
    first_group,
    float_column,
    head_char,
    last_per,
    lookup,
    np_bool,
    object_column,
    scan,
    split_once,
    texts_at,
    to_str_numpy,
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
     r"dtype: (?P<kv_dtype>[A-Za-z0-9_.]+)",
     r"#tokens: (?P<kv_tokens>[0-9]+)",
     rf"K size: (?P<k_gb>{NUM}) ?GB",
     rf"V size: (?P<v_gb>{NUM}) ?GB"),
    types={"kv_dtype": "str"}, require=("kv_tokens", "k_gb", "v_gb"),
    key_metrics=("kv_tokens", "k_gb", "v_gb"),
))

_TIMINGS = ("load_weight", "kv_cache_allocation", "scheduler_e2e", "tokenizer_e2e")
_PHASE_S = re.compile(rf"=\s*({NUM})")


def _startup_timings(df: Any) -> Any:
    """cuda_graph={prefill=64.55, decode=4.58, ...} -> cuda_graph_s, the sum of its phases."""
    sums = []
    for text in df["cuda_graph"]:
        vals = [num(v) for v in _PHASE_S.findall(text)] if isinstance(text, str) else []
        vals = [v for v in vals if v is not None]
        sums.append(float(sum(vals)) if vals else np.nan)
    df["cuda_graph_s"] = np.array(sums, dtype=float)
    return df.drop(columns=["cuda_graph"])


registry.add(LineFormat(
    "sglang", "startup_timings", ("Engine startup timings",),
    (*PREFIX, *(rf"\b{t}=(?P<{t}_s>{NUM})" for t in _TIMINGS), r"\bcuda_graph=\{(?P<cuda_graph>[^}]*)\}"),
    types={"cuda_graph": "str"}, require=(), finalize=_startup_timings, rowwise=True,
    output={"timestamp": "str", "dp_rank": "float", "tp_rank": "float", **{f"{t}_s": "float" for t in _TIMINGS},
            "cuda_graph_s": "float"},
    key_metrics=("load_weight_s", "scheduler_e2e_s", "tokenizer_e2e_s", "cuda_graph_s"),
))

EVENTS = {"Gracefully exiting": "graceful_exit", "Scheduler hit an exception": "scheduler_exception",
          "SIGQUIT received": "sigquit", "Received sigquit": "sigquit", "SIGTERM received": "sigterm"}
_EVENT_RX = "|".join(re.escape(e) for e in EVENTS)


def _events(df: Any) -> Any:
    df["event"] = df["event"].map(EVENTS)
    return df


registry.add(LineFormat(
    "sglang", "event", tuple(EVENTS),
    (*PREFIX, rf"(?P<event>{_EVENT_RX})", rf"(?P<message>(?:{_EVENT_RX}).*?)\s*$"),
    types={"event": "str", "message": "str"}, require=("event",), finalize=_events, rowwise=True,
    output={"timestamp": "str", "dp_rank": "float", "tp_rank": "float", "event": "str", "message": "str"},
))


def _deprecation(df: Any) -> Any:
    df["event"] = "deprecation"
    return df


registry.add(LineFormat(
    "sglang", "event", ("\x1b[1;33m",),  # print_deprecated_warning: logger.warning(f"\033[1;33m{message}\033[0m")
    (*PREFIX, r"^(?:\[[^\]]*\] *)?(?:[A-Z]+:? +)?(?P<message>\S.*?)\s*$"),
    types={"message": "str"}, require=(), finalize=_deprecation, rowwise=True,
    output={"timestamp": "str", "dp_rank": "float", "tp_rank": "float", "event": "str", "message": "str"},
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
    finalize=_graph_finalize, rowwise=True,
    key_metrics=("elapsed_s", "mem_gb"),
))


# ---------------------------------------------------------------- server_args
_LOG_START = re.compile(r"^\s*(?:\[[0-9]|\(\w+ pid=|(?:INFO|WARNING|ERROR|DEBUG)\b|[0-9]{4}-[0-9]{2}-[0-9]{2}"
                        r"|[0-9]+\.[0-9]{2}\.[0-9]{3}\.[0-9]{3} )")


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


_ARGS = compiled.Spec("server_args", (), ("key", "value"), {"kind": ("simple", "bracketed")})


def _args_declined(chunk: Chunk, at: np.ndarray) -> Blocks:
    """Every dump to the Python function (the compiled reader's stand-in where the library is off)."""
    z = np.zeros(0, np.int64)
    return Blocks(np.zeros(len(at), np.int64), np.ones(len(at), np.int64), z, z, {}, np.full(len(at), DECLINE))


def server_args_compiled(chunk: Chunk, at: np.ndarray) -> Blocks:
    """:func:`server_args` of all the chunk's dumps: cut into items by the compiled reader (native/server_args.c),
    each dict built here from its items' text as parse_kwargs builds it (_simple_value or _literal per value)."""
    got = compiled.read(_ARGS, chunk, at)
    if got is None:
        return _args_declined(chunk, at)
    used = np.asarray(got.used, np.int64).copy()
    status = np.asarray(got.status, np.int64).copy()
    block = np.asarray(got.block, np.int64)
    if not len(block):
        return Blocks(used, got.examined, block, block, {"args": objects([])}, status)
    # an item that runs across a hard wrap holds the newline between its lines (the dump joins them without it)
    keys = pc.replace_substring(got.columns["key"], "\n", "").to_pylist()
    texts = pc.replace_substring(got.columns["value"], "\n", "").to_pylist()
    bracketed = (got.columns["kind"] == "bracketed").tolist()
    starts = np.searchsorted(block, np.arange(len(at) + 1)).tolist()
    lines, claimed = at.tolist(), -1
    recs, dicts = [], []
    for b in np.unique(block).tolist():
        if lines[b] < claimed:  # inside the dump before (its continuation lines hold markers): the driver skips it,
            status[b] = DECLINE  # so it is not read here (and never answered wrong)
            continue
        i0, i1 = starts[b], starts[b + 1]
        args = dict(zip(map(sys.intern, keys[i0:i1]), pyrepr.values(texts[i0:i1], bracketed[i0:i1]), strict=True))
        if len(args) < (1 if "ServerArgs(" in (chunk.line(lines[b]) or "") else 3):
            used[b] = 0
            continue
        recs.append(b)
        dicts.append(args)
        if status[b] == 0:
            claimed = lines[b] + int(used[b])
    return Blocks(used, got.examined, np.array(recs, np.int64), np.zeros(len(recs), np.int64),
                  {"args": objects(dicts)}, status)


server_args_compiled.arrow = _args_declined  # type: ignore[attr-defined]  # (no arrow reader: the function reads)
server_args_compiled.spec = _ARGS  # type: ignore[attr-defined]

registry.add(BlockFormat(
    "sglang", "server_args",
    ("ServerArgs(", "mem_fraction_static=", "cuda_graph_max_bs=", "disable_radix_cache=",
     "chunked_prefill_size=", "enable_torch_compile=", "disable_cuda_graph="),
    server_args, {"args": "object"}, timestamps=(TS, TS_ISO), vector=server_args_compiled,
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
    rec: Record = {}
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


_CLOSE_V = rf"^{WS}*={{10,}}{WS}*$"
_SECTION_V = rf"^{WS}*-{{3,}}.*-{{3,}}{WS}*$"
_BENCH_NAMES = list(BENCH_COLUMNS)
_BACKEND = _BENCH_NAMES.index("backend")
_ACCEPT_RATE = _BENCH_NAMES.index("accept_rate")
_FAILED = _BENCH_NAMES.index("failed_requests")


def _bench_row(text: pa.Array) -> np.ndarray:
    """Whether each (plain) line is a `{:<40} {:<10}` row as bench_serving reads it: a `:` within the first
    81 characters, a value after it, and the value starting at character 30 or later."""
    colon = pc.find_substring(text, ":").to_numpy(zero_copy_only=False)
    head = pc.utf8_length(pc.ascii_rtrim_whitespace(pc.utf8_slice_codeunits(text, 0, 30))).to_numpy(
        zero_copy_only=False)
    end = pc.utf8_length(pc.ascii_rtrim_whitespace(text)).to_numpy(zero_copy_only=False)
    # text[colon + 1:30] is whitespace (or the colon is at 29 or later), and something follows the colon
    return (colon >= 0) & (colon <= 80) & ((head <= colon + 1) | (colon >= 29)) & (end > colon + 1)


def _bench_classify(text: pa.Array, block: np.ndarray, offset: np.ndarray) -> np.ndarray:
    row = _bench_row(text)
    code = np.where(row, ROW, STOP)
    head = head_char(text)
    for char, pattern, value in (("=", _CLOSE_V, LAST), ("-", _SECTION_V, SKIP)):
        cand = np.flatnonzero(np_bool(pc.equal(head, char)))
        if len(cand):
            hit = np_bool(pc.match_substring_regex(text.take(pa.array(cand)), pattern))
            code[cand[hit]] = value
    return code


def bench_serving_vector(chunk: Chunk, at: np.ndarray) -> Blocks:
    """:func:`bench_serving` of all the chunk's blocks at once."""
    # a whole result block, its latency sections included, is ~35 lines: one window reads most blocks entire
    sc = scan(chunk, at, _bench_classify, first=40)
    nb = len(at)
    rows = sc.rows(ROW)
    label, rest = split_once(sc.text.take(pa.array(rows)), ":")
    value = pc.ascii_trim_whitespace(rest)
    col = lookup(label, _bench_label, _BENCH_NAMES)
    sel = np.flatnonzero(col >= 0)
    blk, col = sc.block[rows][sel], col[sel]
    value = value.take(pa.array(sel))
    last = last_per(blk, col)  # a label printed twice: the later value
    blk, col = blk[last], col[last]
    value = value.take(pa.array(last))
    nums, found = numbers(value)
    nums = np.where(col == _ACCEPT_RATE, nums / 100, nums)
    present = np.zeros((len(_BENCH_NAMES), nb), dtype=bool)
    present[col, blk] = True
    valid = np.zeros(nb, dtype=bool)
    valid[blk[found & (col != _BACKEND)]] = True
    recs = np.flatnonzero(valid)
    pos = np.full(nb, -1, np.int64)
    pos[recs] = np.arange(len(recs))
    cols: dict[str, np.ndarray] = {}
    for c in np.unique(col).tolist():
        sel = np.flatnonzero((col == c) & valid[blk])
        if not len(sel):
            continue
        if c == _BACKEND:
            cols["backend"] = object_column(len(recs), pos[blk[sel]], to_str_numpy(value.take(pa.array(sel))))
        else:
            cols[_BENCH_NAMES[c]] = float_column(len(recs), pos[blk[sel]], nums[sel])
    vllm = ~present[_BACKEND] & present[_FAILED]
    cols["engine"] = np.where(vllm[recs], "vllm", "sglang").astype(object)
    used = np.where(valid, sc.end, 0)
    status = np.where(sc.more, MORE, 0)
    return Blocks(used, sc.examined, recs, np.zeros(len(recs), np.int64), cols, status)


registry.add(BlockFormat(
    "sglang", "bench_serving", ("Serving Benchmark Result",), bench_serving, BENCH_COLUMNS,
    vector=compiled.reader(compiled.Spec("bench_serving", tuple(c for c in BENCH_COLUMNS if c != "backend"),
                                         ("backend",), {"engine": ("sglang", "vllm")}), bench_serving_vector),
    key_metrics=("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms", "accept_len"),
))


# ---------------------------------------------------------------- bench_one_batch / send_one / mtbench
_ONE = {
    "gen_throughput": re.compile(rf"(?:last generation throughput:\s*|^\s*speed=)({NUM})\s*tok(?:en)?/s"),
    "accept_len": re.compile(rf"acc_length\s*[:=]\s*({NUM})"),
}


def bench_one_batch(w: Window) -> BlockResult:
    """`last generation throughput` / `acc_length` (and send_one's `speed=`) lines, grouped."""
    rec: Record = {}
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


_ONE_V = {c: re2(named(rx.pattern)) for c, rx in _ONE.items()}


def bench_one_batch_vector(chunk: Chunk, at: np.ndarray) -> Blocks:
    """:func:`bench_one_batch` of all the chunk's marker lines at once (its 8-line loop over columns)."""
    nb = len(at)
    rec = {c: np.full(nb, np.nan) for c in _ONE}
    have = {c: np.zeros(nb, dtype=bool) for c in _ONE}
    used = np.zeros(nb, np.int64)
    active = np.ones(nb, dtype=bool)
    more = np.zeros(nb, dtype=bool)
    for k in range(8):
        text, inside = texts_at(chunk, at, k)
        if not chunk.final:
            more |= active & (at + k >= chunk.n)
        active &= inside
        found = {c: numbers(first_group(text, rx)) for c, rx in _ONE_V.items()}
        hit = {c: active & found[c][1] for c in _ONE}
        clash = np.logical_or.reduce([hit[c] & have[c] for c in _ONE])
        active &= ~clash
        any_hit = np.zeros(nb, dtype=bool)
        for c in _ONE:
            upd = active & hit[c]
            rec[c] = np.where(upd, found[c][0], rec[c])
            have[c] |= upd
            any_hit |= upd
        used = np.where(any_hit, k + 1, used)
        full = np.logical_and.reduce([have[c] for c in _ONE])
        blank = np_bool(pc.equal(pc.ascii_trim_whitespace(text), ""))
        active &= ~(~any_hit & ~blank & full)
    recs = np.flatnonzero(np.logical_or.reduce([have[c] for c in _ONE]))
    cols = {c: rec[c][recs] for c in _ONE}
    return Blocks(np.where(np.isin(np.arange(nb), recs), used, 0), np.full(nb, 8), recs,
                  np.zeros(len(recs), np.int64), cols, np.where(more, MORE, 0))


registry.add(BlockFormat(
    "sglang", "bench_one_batch", ("last generation throughput", "acc_length"), bench_one_batch,
    {"gen_throughput": "float", "accept_len": "float"}, key_metrics=("gen_throughput", "accept_len"),
    # the C reader (native/bench_one_batch.c): the columns in _ONE's order
    vector=compiled.reader(compiled.Spec("bench_one_batch", tuple(_ONE)), bench_one_batch_vector),
))

_MT = {
    "questions": re.compile(r"#questions:\s*([0-9]+)"),
    "gen_throughput": re.compile(rf"Throughput:\s*({NUM})\s*tok"),
    "accept_len": re.compile(rf"Accept(?:ance)? length:\s*({NUM})"),
}


def bench_mtbench(w: Window) -> BlockResult:
    """``#questions: 80, Throughput: X token/s, Acceptance length: X`` with the label line above it."""
    s = w[0] or ""
    rec: Record = {c: num(m.group(1)) for c, rx in _MT.items() if (m := rx.search(s))}
    if not rec.get("gen_throughput") and not rec.get("accept_len"):
        return [], 0
    for k in (-1, -2):
        prev = (w[k] or "").strip()
        if prev:
            rec["label"] = prev[:-1].strip() if prev.endswith(":") else None
            break
    return [(0, rec)], 1


_MT_V = {c: re2(named(rx.pattern)) for c, rx in _MT.items()}


def bench_mtbench_vector(chunk: Chunk, at: np.ndarray) -> Blocks:
    """:func:`bench_mtbench` of all the chunk's marker lines at once."""
    nb = len(at)
    text = chunk.texts(at)
    vals = {c: numbers(first_group(text, rx)) for c, rx in _MT_V.items()}
    gt, al = vals["gen_throughput"], vals["accept_len"]
    valid = (gt[1] & (gt[0] != 0)) | (al[1] & (al[0] != 0))  # `not rec.get(...)`: NaN counts, 0 does not
    recs = np.flatnonzero(valid)
    label = np.empty(nb, object)
    seen = np.zeros(nb, dtype=bool)
    for k in (-1, -2):
        prev, inside = texts_at(chunk, at, k)
        prev = pc.ascii_trim_whitespace(prev)
        here = inside & ~seen & np_bool(pc.not_equal(prev, ""))
        colon = np_bool(pc.ends_with(prev, ":"))
        name = to_str_numpy(pc.ascii_trim_whitespace(pc.utf8_slice_codeunits(prev, 0, -1)))
        label[here & colon] = name[here & colon]
        seen |= here
    cols = {c: v[0][recs] for c, v in vals.items() if c != "questions"}
    cols["questions"] = np.where(vals["questions"][1], vals["questions"][0], np.nan)[recs]
    cols["label"] = label[recs]
    return Blocks(valid.astype(np.int64), np.ones(nb, np.int64), recs, np.zeros(len(recs), np.int64), cols)


registry.add(BlockFormat(
    "sglang", "bench_mtbench", ("#questions:",), bench_mtbench,
    {"label": "str", "questions": "float", "gen_throughput": "float", "accept_len": "float"},
    key_metrics=("gen_throughput", "accept_len"), lookback=2,
    # the C reader (native/bench_mtbench.c): the float columns in _MT's order, then `label`
    vector=compiled.reader(compiled.Spec("bench_mtbench", tuple(_MT), ("label",)), bench_mtbench_vector),
))
