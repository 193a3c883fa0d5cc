"""vLLM log records (V0 and V1, every era seen in public logs).

Kinds and columns (engine "vllm"; every line kind also has process and pid where V1's prefix
``(APIServer pid=N)`` / ``(EngineCore pid=N)`` / ``(Worker pid=N)`` stands before it: the role and its pid):
- ``throughput`` (``[Engine 000: ]Avg prompt throughput: ...``): prompt_throughput, gen_throughput,
  running_req, waiting_req (V0 "Pending"), swapped_req, kv_cache_usage (fraction; printed in %),
  cache_hit_rate (fraction), dp_rank (the ``Engine NNN`` index).
- ``spec_metrics`` (V1 ``SpecDecoding metrics`` of every era, V0 ``Speculative metrics``): accept_len
  (``Mean acceptance length``; None where not printed), accept_rate (fraction; ``100.0%`` -> 1.0),
  accepted, drafted (also V0's ``Number of draft tokens tokens`` typo), per_position (list of floats),
  num_spec_tokens, system_efficiency, emitted, accepted_throughput, drafted_throughput, dp_rank.
- ``spec_summary`` (``examples/offline_inference/spec_decode.py`` summary): output_tokens, drafts,
  drafted, accepted, accept_len, per_position (from ``acceptance at token i``).
- ``engine_config`` (V1 ``Initializing a V1 LLM engine (v0.32.0) with config: ...``): version, model,
  spec_method, spec_model, num_spec_tokens (from ``speculative_config=SpeculativeConfig(...)``), args (the
  config as a dict; nested reprs such as SpeculativeConfig(...) kept as text).
- ``server_args`` (``non-default args: {...}``): args (the dict; a dump elided with ``...`` is read item by
  item), spec_method, spec_model, num_spec_tokens (from its ``speculative_config``).
- ``aux_layers`` (EAGLE-3 ``Using auxiliary layers from speculative config: (1, 2, 3)``): aux_layers (list).
``vllm bench serve`` result blocks are read by the shared ``bench_serving`` format (engine "vllm").
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spectrial.logs.chunks import Chunk, Window
from spectrial.logs.columns import numbers
from spectrial.logs.formats import MORE, BlockFormat, BlockResult, Blocks, LineFormat, Record
from spectrial.logs.native import blocks as compiled
from spectrial.logs.pyrepr import PyValue, parse_kwargs, parse_mapping
from spectrial.logs.registry import registry
from spectrial.logs.text import LIST, NUM, TS_ISO, num, re2
from spectrial.logs.vector import ROW, SKIP, STOP, first_where, float_column, np_bool, np_int, scan

TS = (r"(?:INFO|WARNING|WARN|DEBUG|ERROR|CRITICAL)\s+(?P<timestamp>[0-9]{2}-[0-9]{2} "
      r"[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?)")
ENGINE = r"Engine (?P<dp_rank>[0-9]+):"
# V1's process prefix: `(APIServer pid=11077)`, `(EngineCore pid=18004)`, `(Worker pid=18112)`,
# `(EngineCore_DP0 pid=...)`: the process role and its pid
PROCESS = r"\((?P<process>[A-Za-z][A-Za-z0-9_]*) pid=(?P<pid>[0-9]+)\)"
PREFIX = (TS, TS_ISO, PROCESS)
_PROC = {"process": "str", "pid": "float"}

registry.add(LineFormat(
    "vllm", "throughput", ("Avg prompt throughput",), (*PREFIX, ENGINE),
    keys={"Avg prompt throughput": "prompt_throughput", "Avg generation throughput": "gen_throughput",
          "Running": "running_req", "Waiting": "waiting_req", "Pending": "waiting_req", "Swapped": "swapped_req",
          "GPU KV cache usage": "kv_cache_usage", "KV cache usage": "kv_cache_usage",
          "Prefix cache hit rate": "cache_hit_rate"},
    types=_PROC, percent=("kv_cache_usage", "cache_hit_rate"),
    require=("prompt_throughput", "gen_throughput", "running_req"),
    key_metrics=("prompt_throughput", "gen_throughput", "running_req", "kv_cache_usage"),
))

registry.add(LineFormat(
    "vllm", "spec_metrics", ("SpecDecoding metrics", "Speculative metrics"),
    (*PREFIX, ENGINE, rf"Per-position acceptance rate: (?P<per_position>{LIST})"),
    keys={"Mean acceptance length": "accept_len", "Draft acceptance rate": "accept_rate",
          "Avg Draft acceptance rate": "accept_rate", "Accepted": "accepted", "Number of accepted tokens": "accepted",
          "Drafted": "drafted", "Number of draft tokens": "drafted", "Number of draft tokens tokens": "drafted",
          "Number of speculative tokens": "num_spec_tokens", "System efficiency": "system_efficiency",
          "Number of emitted tokens": "emitted", "Number of emitted tokens tokens": "emitted",
          "Accepted throughput": "accepted_throughput", "Drafted throughput": "drafted_throughput"},
    types={**_PROC, "per_position": "list"}, percent=("accept_rate",),
    require=("accept_len", "accept_rate", "accepted", "drafted"),
    key_metrics=("accept_len", "accept_rate"),
))

_SPEC = {"spec_method": "str", "spec_model": "str", "num_spec_tokens": "float"}
_SPEC_CONFIG = r"speculative_config=SpeculativeConfig\([^)]*\b"


def _engine_config(df: pd.DataFrame) -> pd.DataFrame:
    """The config dump as a dict (``args``): parsed as far as it goes."""
    df["args"] = pd.Series([parse_kwargs(c)[0] if isinstance(c, str) else None for c in df["config"]],
                           index=df.index, dtype=object)
    return df.drop(columns=["config"])


registry.add(LineFormat(
    "vllm", "engine_config", ("Initializing a V1 LLM engine",),
    (*PREFIX,
     r"Initializing a V1 LLM engine \(v(?P<version>[^)\s]+)\)",
     r"with config: (?P<config>.*?)\s*$",
     r"with config: model='(?P<model>[^']*)'",
     _SPEC_CONFIG + r"method='(?P<spec_method>[^']*)'",
     _SPEC_CONFIG + r"model='(?P<spec_model>[^']*)'",
     _SPEC_CONFIG + r"num_spec_tokens=(?P<num_spec_tokens>[0-9]+)"),
    types={**_PROC, **_SPEC, "version": "str", "model": "str", "config": "str"},
    require=("version",), finalize=_engine_config, rowwise=True,
    output={"timestamp": "str", **_PROC, "version": "str", "model": "str", **_SPEC, "args": "object"},
))


def _non_default_args(df: pd.DataFrame) -> pd.DataFrame:
    """The dict literal as ``args`` (read as far as it goes), its speculative config as columns."""
    args = [parse_mapping(d)[0] if isinstance(d, str) else None for d in df["dump"]]
    specs = [_spec_of(a) for a in args]
    df["args"] = pd.Series(args, index=df.index, dtype=object)
    df["spec_method"] = pd.Series([s.get("method") for s in specs], index=df.index, dtype=object)
    df["spec_model"] = pd.Series([s.get("model") for s in specs], index=df.index, dtype=object)
    df["num_spec_tokens"] = pd.Series([num(str(s["num_speculative_tokens"])) if "num_speculative_tokens" in s
                                       else None for s in specs], index=df.index, dtype=float)
    return df.drop(columns=["dump"])


def _spec_of(args: PyValue) -> dict[str, str | float]:
    """`speculative_config` of non-default args (a dict, or the JSON text given on the command line)."""
    spec = args.get("speculative_config") if isinstance(args, dict) else None
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            spec = None
    return {k: v for k, v in spec.items() if isinstance(v, (str, int, float))} if isinstance(spec, dict) else {}


registry.add(LineFormat(
    "vllm", "server_args", ("non-default args:",),
    (*PREFIX, r"non-default args: (?P<dump>\{.*?)\s*$"),
    types={**_PROC, "dump": "str"}, require=("dump",), finalize=_non_default_args, rowwise=True,
    output={"timestamp": "str", **_PROC, "args": "object", **_SPEC},
))

registry.add(LineFormat(
    "vllm", "aux_layers", ("Using auxiliary layers from speculative config",),
    (*PREFIX, rf"Using auxiliary layers from speculative config: \((?P<aux_layers>{LIST})\)"),
    types={**_PROC, "aux_layers": "list"}, require=("aux_layers",),
))

_SUMMARY = {
    "total_num_output_tokens": "output_tokens", "num_drafts": "drafts", "num_draft_tokens": "drafted",
    "num_accepted_tokens": "accepted", "mean acceptance length": "accept_len",
}
_KV = re.compile(r"^\s*([a-z_ ]+?)\s*:\s*(\S+)\s*$")
_AT = re.compile(rf"^\s*acceptance at token ([0-9]+)\s*:\s*({NUM})")
_RULE = re.compile(r"^\s*-{5,}\s*$")


def spec_summary(w: Window) -> BlockResult:
    """The offline example's summary: `key: value` lines, then `acceptance at token i: x` lines."""
    rec: Record = {}
    pos: list[float] = []
    used = 0
    k = 0
    while (s := w[k]) is not None and k < 200:
        m = _KV.match(s)
        at = _AT.match(s)
        if at:
            pos.append(num(at.group(2)) or 0.0)
        elif m and m.group(1) in _SUMMARY:
            col = _SUMMARY[m.group(1)]
            if col in rec:
                break  # the next summary
            rec[col] = num(m.group(2))
        elif not _RULE.match(s):
            break
        k += 1
        used = k
    if not rec:
        return [], 0
    if pos:
        rec["per_position"] = pos
    return [(0, rec)], used


_KV_V = re2(_KV.pattern.replace("([a-z_ ]+?)", "(?P<key>[a-z_ ]+?)").replace("(\\S+)", "(?P<value>\\S+)"))
_AT_V = re2(_AT.pattern.replace("([0-9]+)", "(?P<i>[0-9]+)").replace(f"({NUM})", f"(?P<x>{NUM})"))
_RULE_V = re2(_RULE.pattern)
_SUMMARY_COLS = list(dict.fromkeys(_SUMMARY.values()))
_SUMMARY_KEYS = pa.array(list(_SUMMARY), pa.string())
_SUMMARY_COL_OF = np.array([_SUMMARY_COLS.index(c) for c in _SUMMARY.values()] + [-1], np.int64)
_AT_ROW, _KV_ROW = 1, 4  # classify codes: ROW (an `acceptance at token` line), and a summary key line


def _summary_classify(text: pa.Array, block: np.ndarray, offset: np.ndarray) -> np.ndarray:
    at = np_bool(pc.match_substring_regex(text, _AT_V))
    key = pc.struct_field(pc.extract_regex(text, _KV_V), "key")
    known = np_bool(pc.is_in(key, value_set=_SUMMARY_KEYS))
    rule = np_bool(pc.match_substring_regex(text, _RULE_V))
    return np.where(at, ROW, np.where(known, ROW, np.where(rule, SKIP, STOP)))


def spec_summary_vector(chunk: Chunk, at: np.ndarray) -> Blocks:
    """:func:`spec_summary` of all the chunk's marker lines at once."""
    nb = len(at)
    sc = scan(chunk, at, _summary_classify, start=0, first=16)
    end = np.minimum(sc.end, 200)  # `k < 200`
    rows = sc.rows(ROW)
    text = sc.text.take(pa.array(rows))
    blk, off = sc.block[rows], sc.offset[rows]
    is_at = np_bool(pc.match_substring_regex(text, _AT_V))
    kv = pc.extract_regex(text, _KV_V)
    col = _SUMMARY_COL_OF[np_int(pc.index_in(pc.struct_field(kv, "key"), value_set=_SUMMARY_KEYS))]
    col = np.where(is_at, -1, col)
    # a summary key seen twice in a block: the next summary begins at the second one
    kvs = np.flatnonzero(col >= 0)
    dup = np.zeros(len(rows), dtype=bool)
    if len(kvs):
        order = np.lexsort((off[kvs], col[kvs], blk[kvs]))
        b, c = blk[kvs][order], col[kvs][order]
        again = np.zeros(len(order), dtype=bool)
        again[1:] = (b[1:] == b[:-1]) & (c[1:] == c[:-1])
        dup[kvs[order][again]] = True
    end = np.minimum(end, first_where(blk, off, dup, nb))
    live = off < end[blk]
    values = numbers(pc.struct_field(kv, "value"))[0]
    x = numbers(pc.struct_field(pc.extract_regex(text, _AT_V), "x"))[0]  # NUM always reads: `or 0.0` never acts
    has = np.zeros(nb, dtype=bool)
    has[blk[live & (col >= 0)]] = True
    recs = np.flatnonzero(has)
    pos = np.full(nb, -1, np.int64)
    pos[recs] = np.arange(len(recs))
    cols: dict[str, np.ndarray] = {}
    for ci, name in enumerate(_SUMMARY_COLS):
        sel = np.flatnonzero(live & (col == ci))
        if len(sel):
            cols[name] = float_column(len(recs), pos[blk[sel]], values[sel])
    per = np.empty(len(recs), object)
    asel = np.flatnonzero(live & is_at & has[blk])
    for b, group in zip(*_groups(blk[asel], x[asel]), strict=True):
        per[pos[b]] = group
    cols["per_position"] = per
    used = np.where(has, end, 0)
    more = sc.more & (end == sc.end) & (sc.end < 200)
    return Blocks(used, np.minimum(sc.examined, end + 1), recs, np.zeros(len(recs), np.int64), cols,
                  np.where(more, MORE, 0))


def _groups(keys: np.ndarray, values: np.ndarray) -> tuple[list[int], list[list[float]]]:
    """Consecutive runs of equal `keys` (sorted): each key and its values as a list."""
    if not len(keys):
        return [], []
    cut = np.flatnonzero(np.diff(keys)) + 1
    return keys[np.concatenate(([0], cut))].tolist(), [v.tolist() for v in np.split(values, cut)]


# the C reader (native/spec_summary.c): each block's record (`_row` "summary"), then its positions as records
# of their own (`_row` "position", the value in `_position`): _summary_positions makes them per_position lists
_SUMMARY_SPEC = compiled.Spec("spec_summary", (*_SUMMARY_COLS, "_position"), (),
                              {"_row": ("summary", "position")})


def _summary_positions(got: Blocks) -> Blocks:
    """The C reader's answer with each block's position records as its record's per_position list."""
    if not len(got.block):
        return Blocks(got.used, got.examined, got.block, got.offset, {}, got.status)
    position = got.columns["_row"] == "position"
    main = np.flatnonzero(~position)
    cols: dict[str, np.ndarray] = {c: got.columns[c][main] for c in _SUMMARY_COLS}
    per = np.empty(len(main), object)
    psel = np.flatnonzero(position)
    if len(psel):
        keys, groups = _groups(got.block[psel], got.columns["_position"][psel])
        per[np.searchsorted(got.block[main], keys)] = groups
    cols["per_position"] = per
    return Blocks(got.used, got.examined, got.block[main], got.offset[main], cols, got.status)


def spec_summary_compiled(chunk: Chunk, at: np.ndarray) -> Blocks:
    """The compiled reader bp_spec_summary, else spec_summary_vector."""
    got = compiled.read(_SUMMARY_SPEC, chunk, at)
    return spec_summary_vector(chunk, at) if got is None else _summary_positions(got)


spec_summary_compiled.arrow = spec_summary_vector  # type: ignore[attr-defined]  # (the tests hold both)
spec_summary_compiled.spec = _SUMMARY_SPEC  # type: ignore[attr-defined]

registry.add(BlockFormat(
    "vllm", "spec_summary",
    ("num_drafts:", "num_accepted_tokens:", "total_num_output_tokens:", "num_draft_tokens:",
     "mean acceptance length:"),
    spec_summary,
    {"output_tokens": "float", "drafts": "float", "drafted": "float", "accepted": "float",
     "accept_len": "float", "per_position": "list"},
    key_metrics=("accept_len",), vector=spec_summary_compiled,
))
