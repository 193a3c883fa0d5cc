"""llama.cpp log records: llama-server, llama-cli perf blocks, llama-speculative summaries.

Kinds and columns (engine "llamacpp"):
- ``request_timing``: one row per finished request: prompt_ms, prompt_tokens, prompt_throughput, eval_ms,
  eval_tokens, gen_throughput, total_ms, graphs_reused, slot, task, and origin: "print_timing" (a server
  slot), "llama_perf_context_print" / "llama_print_timings" (a whole context's totals, e.g. llama-cli's
  end-of-run print), "speculative" (llama-speculative's encoded/decoded lines) or "timings_json". Built from the ``prompt eval time`` /
  ``eval time`` / ``total time`` lines, merged by slot and task id (``id  0 | task 7 |``, mid-2024
  ``id_slot=0 id_task=7``), or by adjacency where the prefix stands on a line of its own or is absent
  (llama-cli ``llama_perf_context_print``, old ``llama_print_timings``, llama-speculative's
  ``encoded/decoded/generated N tokens in X seconds``). Also the ``timings`` JSON of a response
  (``prompt_n``, ``predicted_ms``, ..., with drafted/accepted from ``draft_n`` / ``draft_n_accepted``).
- ``draft_acceptance``: accept_rate (fraction), accepted, drafted, accept_len, per_position, draft_max, slot,
  task: ``draft acceptance = R (A accepted / G generated), mean len = L`` (new),
  ``draft acceptance rate = R (...)`` (old), ``mean acceptance length = L, acceptance rate per position =
  (...)`` and ``acc per pos = (...)`` (merged into the record above them), llama-speculative's
  ``n_draft / n_drafted / n_accept / accept = P%`` block.
- ``gen_progress``: n_decoded, gen_throughput, gen_throughput_3s (in-flight ``n_decoded|n_gen = N, tg = X
  t/s, tg_3s = X t/s``).
- ``spec_statistics`` (``-lv 4``, cumulative over the server's life): spec_type, calls_begin, calls_draft,
  calls_accept, drafts_gen, drafts_acc, tokens_gen, tokens_acc, accept_len, per_position, begin_ms_total,
  draft_ms_total (the g duration: time spent generating drafts), accept_ms_total.
- ``draft_model``: draft_model (the path in ``loading draft model 'PATH'``, printed at start-up).
- ``speed_bench``: category, base_gen_throughput, gen_throughput, speedup, base_latency_s, latency_s,
  latency_speedup, accept_rate (``server-bench`` speed-bench table).
Timestamps are the elapsed-time prefix as printed (``7.30.031.705`` = 7 min 30.031705 s).
"""

from __future__ import annotations

import math
import re
from collections import namedtuple
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spectrial.logs.chunks import Chunk, Window
from spectrial.logs.columns import numbers
from spectrial.logs.formats import MORE, BlockFormat, BlockResult, Blocks, Finalizer, LineFormat, Record
from spectrial.logs.native import blocks as compiled
from spectrial.logs.registry import registry
from spectrial.logs.text import LIST, NUM, named, num, re2
from spectrial.logs.vector import LAST, ROW, SKIP, STOP, first_group, np_bool, scan, split_ws, to_str_numpy

TS = r"^(?P<timestamp>[0-9]+\.[0-9]{2}\.[0-9]{3}\.[0-9]{3}) "
TS_JSONL = r'"time"\s*:\s*(?P<timestamp>[0-9]+)'

REQUEST_COLUMNS = {
    "origin": "str", "prompt_ms": "float", "prompt_tokens": "float", "prompt_throughput": "float", "eval_ms": "float",
    "eval_tokens": "float", "gen_throughput": "float", "total_ms": "float", "graphs_reused": "float",
    "slot": "float", "task": "float",
}
DRAFT_COLUMNS = {
    "accept_rate": "float", "accepted": "float", "drafted": "float", "accept_len": "float",
    "per_position": "list", "draft_max": "float",
}
PROGRESS_COLUMNS = {"n_decoded": "float", "gen_throughput_3s": "float"}
_EVENTS = ("t_name", "io_name", "da_rate", "ml_len", "pp", "nd_key", "pg_n", "graphs_reused")
_NEAR = 4  # lines: how far apart unkeyed lines of one record may be
Key = tuple[float, float | None] | None  # a record's (slot, task); None where the lines name neither
_REQ_WANTED = ("prompt_ms", "eval_ms", "total_ms")
_DRAFT_WANTED = ("accept_rate", "accepted", "drafted", "accept_len")


def _nan(v: Any) -> bool:
    return v is None or v != v  # NaN is the only value unequal to itself (rows come with None for NaN)


class _Merger:
    """Turns the per-line captures (sorted by line) into request, draft and progress records."""

    def __init__(self) -> None:
        self.rows: list[Record] = []
        self.req: dict[Key, Record] = {}
        self.draft: dict[Key, Record] = {}
        self.last_req: dict[Key, Record] = {}
        self.hdr_key: Key = None
        self.hdr_line = -100
        self.hdr_ts: str | None = None
        self.hdr_origin: str | None = None

    def key(self, r: Any) -> tuple[Key, str | None]:
        """(slot, task) of the row, or of the bare prefix line just above it; and a fallback timestamp."""
        if not _nan(r.slot):
            return (r.slot, None if _nan(r.task) else r.task), None
        if self.hdr_key is not None and r.line - self.hdr_line <= _NEAR:
            self.hdr_line = r.line
            return self.hdr_key, self.hdr_ts
        return None, None

    def origin(self, r: Any, from_header: bool) -> str:
        """Who printed the timing: a server slot, the whole-context perf print, or llama-speculative."""
        if not _nan(r.origin):
            return "print_timing" if r.origin.startswith("print_timing") else r.origin
        if from_header and self.hdr_origin:
            return self.hdr_origin
        return "speculative" if not _nan(r.io_name) else "unknown"

    @staticmethod
    def near(rec: Record | None, key: Key, line: int) -> bool:
        return rec is not None and (key is not None or line - rec["_last"] <= _NEAR)

    def emit(self, store: dict[Key, Record], key: Key) -> None:
        rec = store.pop(key, None)
        if rec is None:
            return
        wanted = _REQ_WANTED if rec["kind"] == "request_timing" else _DRAFT_WANTED
        if any((v := rec.get(c)) is not None and v == v for c in wanted):
            self.rows.append(rec)
            if rec["kind"] == "request_timing":
                self.last_req[key] = rec

    def open(self, store: dict[Key, Record], key: Key, base: Record, kind: str) -> Record:
        self.emit(store, key)
        rec = store[key] = {**base, "kind": kind}
        return rec

    def get(self, store: dict[Key, Record], key: Key, base: Record, kind: str, free: tuple[str, ...]) -> Record:
        """The open record of `key` if it is near and has none of `free` yet, else a new one."""
        rec = store.get(key)
        if self.near(rec, key, base["line"]) and all(  # type: ignore[union-attr]
                (v := rec.get(c)) is None or v != v for c in free):  # type: ignore[union-attr]
            return rec  # type: ignore[return-value]
        return self.open(store, key, base, kind)

    def row(self, r: Any) -> None:
        if not r.event:  # a bare `slot print_timing: id 0 | task 0 |` line
            if not _nan(r.hdr):
                self.hdr_key = None if _nan(r.slot) else (r.slot, None if _nan(r.task) else r.task)
                self.hdr_line = r.line
                self.hdr_ts = r.timestamp
                self.hdr_origin = "print_timing"
            return
        key, hdr_ts = self.key(r)
        ts = r.timestamp if not _nan(r.timestamp) else hdr_ts
        base = {"line": r.line, "timestamp": ts, "_last": r.line,
                "slot": key[0] if key else math.nan, "task": (key[1] if key and key[1] is not None else math.nan)}
        if r.req:
            self._request(r, key, base, self.origin(r, key is not None and _nan(r.slot)))
        if r.draft:
            self._draft(r, key, base)
        if not _nan(r.pg_n):
            self.rows.append({**base, "kind": "gen_progress", "n_decoded": r.pg_n, "gen_throughput": r.pg_tg,
                              "gen_throughput_3s": r.pg_tg3})

    def _request(self, r: Any, key: Key, base: Record, origin: str) -> None:
        name = r.t_name if not _nan(r.t_name) else r.io_name
        if _nan(name):
            if not _nan(r.graphs_reused):
                last = self.last_req.get(key)
                if last is not None and r.line - last["_last"] <= _NEAR:
                    last["graphs_reused"] = r.graphs_reused
            return
        ms, n, tps = (r.t_ms, r.t_n, r.t_tps) if r.t_name is not None else (
            None if r.io_s is None else r.io_s * 1000.0, r.io_n, r.io_tps)
        if name in ("prompt eval", "encoded"):
            rec = self.open(self.req, key, base, "request_timing")
            rec.update(prompt_ms=ms, prompt_tokens=n, prompt_throughput=tps, origin=origin)
        elif name in ("eval", "generation eval", "decoded", "generated"):
            rec = self.get(self.req, key, base, "request_timing", ("eval_ms",))
            rec.setdefault("origin", origin)
            if _nan(tps) and not _nan(n) and not _nan(ms) and ms > 0:
                tps = n / ms * 1000.0
            rec.update(eval_ms=ms, eval_tokens=n, gen_throughput=tps, _last=r.line)
        elif name == "total":
            rec = self.req.get(key)
            if self.near(rec, key, r.line) and _nan(rec.get("total_ms")):  # type: ignore[union-attr]
                rec["total_ms"] = ms  # type: ignore[index]
                rec["_last"] = r.line  # type: ignore[index]
                self.emit(self.req, key)

    def _draft(self, r: Any, key: Key, base: Record) -> None:
        if not _nan(r.da_rate):
            rec = self.open(self.draft, key, base, "draft_acceptance")
            rec.update(accept_rate=r.da_rate, accepted=r.da_acc, drafted=r.da_gen, accept_len=r.da_len)
        if not _nan(r.ml_len) or not _nan(r.pp):
            free = tuple(c for c, v in (("accept_len", r.ml_len), ("per_position", r.pp)) if not _nan(v))
            rec = self.get(self.draft, key, base, "draft_acceptance", free)
            if not _nan(r.ml_len):
                rec["accept_len"] = r.ml_len
            if not _nan(r.pp):
                rec["per_position"] = list(r.pp)
            rec["_last"] = r.line
        if not _nan(r.nd_key):
            if r.nd_key == "n_draft":
                rec = self.open(self.draft, key, base, "draft_acceptance")
                rec["draft_max"] = r.nd_val
            elif r.nd_key != "n_predict":
                col = {"n_drafted": "drafted", "n_accept": "accepted", "accept": "accept_rate"}[r.nd_key]
                rec = self.get(self.draft, key, base, "draft_acceptance", (col,))
                rec[col] = r.nd_val  # `accept = 32.143%` arrives as 0.32143
                rec["_last"] = r.line

    def finish(self) -> pd.DataFrame:
        for store in (self.req, self.draft):
            for key in list(store):
                self.emit(store, key)
        for rec in self.rows:
            rec.pop("_last", None)
        cols = ["line", "timestamp", "kind", *REQUEST_COLUMNS, *DRAFT_COLUMNS, *PROGRESS_COLUMNS]
        return pd.DataFrame(self.rows, columns=cols)


_FIELDS = ("line", "timestamp", "slot", "task", "origin", "t_name", "t_ms", "t_n", "t_tps", "io_name", "io_n",
           "io_s", "io_tps", "da_rate", "da_acc", "da_gen", "da_len", "ml_len", "pp", "nd_key", "nd_val", "pg_n",
           "pg_tg", "pg_tg3", "graphs_reused", "hdr", "event", "req", "draft")
_Row = namedtuple("_Row", _FIELDS)  # type: ignore[misc]  # noqa: PYI024


class MergeRecords(Finalizer):
    """Per-line captures -> request_timing / draft_acceptance / gen_progress rows (fed part by part, in line
    order: the merger's open records carry from one part to the next)."""

    def __init__(self) -> None:
        self.merger = _Merger()

    def feed(self, df: pd.DataFrame) -> None:
        m = self.merger
        df = df.sort_values("line", kind="stable")
        notna = {c: df[c].notna().to_numpy() for c in _EVENTS}
        event = np.logical_or.reduce(list(notna.values()))
        flags = {"event": event, "req": notna["t_name"] | notna["io_name"] | notna["graphs_reused"],
                 "draft": notna["da_rate"] | notna["ml_len"] | notna["pp"] | notna["nd_key"]}
        columns = []
        for c in _FIELDS:
            if c in flags:
                columns.append(flags[c].tolist())
            elif c not in df:
                columns.append([None] * len(df))
            else:
                v = df[c].to_numpy()
                if v.dtype == np.float64:  # NaN (not printed) -> None, as the merger tests for
                    v = np.where(np.isnan(v), None, v.astype(object))
                columns.append(v.tolist())
        for r in map(_Row._make, zip(*columns, strict=True)):
            m.row(r)

    def finish(self) -> pd.DataFrame:
        return self.merger.finish()


def merge_records(df: pd.DataFrame) -> pd.DataFrame:
    """Per-line captures -> request_timing / draft_acceptance / gen_progress rows (all at once)."""
    m = MergeRecords()
    m.feed(df)
    return m.finish()


registry.add(LineFormat(
    "llamacpp", "request_timing",
    ("print_timing", "prompt eval time", "eval time", "total time", " tokens in ", "draft acceptance",
     "mean acceptance length =", "acc per pos", "n_draft", "n_accept", "n_predict", "accept    =",
     "graphs reused", "n_decoded =", "n_gen ="),
    (TS, TS_JSONL,
     r"\bid +(?P<slot>[0-9]+) \| task (?P<task>-?[0-9]+)",
     r"id_slot=(?P<slot>[0-9]+)",
     r"id_task=(?P<task>[0-9]+)",
     rf"(?P<t_name>prompt eval|generation eval|eval|total|load|sampling|sample) time\s*=\s*(?P<t_ms>{NUM}) ms"
     rf"(?:\s*/\s*(?P<t_n>[0-9]+) (?:tokens|runs))?"
     rf"(?:\s*\(\s*{NUM} ms per token,\s*(?P<t_tps>{NUM}) tokens per second)?",
     rf"(?P<io_name>encoded|decoded|generated)\s+(?P<io_n>[0-9]+) tokens in\s+(?P<io_s>{NUM}) seconds"
     rf"(?:, speed:\s*(?P<io_tps>{NUM}) t/s)?",
     rf"draft acceptance(?: rate)?\s*=\s*(?P<da_rate>{NUM})\s*\(\s*(?P<da_acc>[0-9]+) accepted\s*/\s*"
     rf"(?P<da_gen>[0-9]+) generated\)(?:,\s*mean len\s*=\s*(?P<da_len>{NUM}))?",
     rf"mean acceptance length\s*=\s*(?P<ml_len>{NUM})",
     rf"(?:acceptance rate per position|acc per pos)\s*=\s*\(\s*(?P<pp>{LIST})\s*\)",
     rf"(?:^|\s|\])(?P<nd_key>n_drafted|n_draft|n_predict|n_accept|accept)\s*=\s*(?P<nd_val>{NUM})"
     r"(?P<nd_val__pct>\s*%)?",
     rf"n_(?:decoded|gen)\s*=\s*(?P<pg_n>[0-9]+),\s*tg\s*=\s*(?P<pg_tg>{NUM}) t/s"
     rf"(?:,\s*tg_3s\s*=\s*(?P<pg_tg3>{NUM}) t/s)?",
     r"graphs reused\s*=\s*(?P<graphs_reused>[0-9]+)",
     r"(?P<hdr>print_timing):",
     r"(?P<origin>print_timings?|llama_perf_context_print|llama_print_timings)"),
    types={"t_name": "str", "io_name": "str", "nd_key": "str", "hdr": "str", "pp": "list", "origin": "str"},
    require=(*_EVENTS, "hdr"),
    finalize=MergeRecords,
    output={"kind": "str", **REQUEST_COLUMNS, **DRAFT_COLUMNS, **PROGRESS_COLUMNS},
    kinds=("draft_acceptance", "gen_progress"),
    kind_columns={"request_timing": tuple(REQUEST_COLUMNS),
                  "draft_acceptance": ("slot", "task", *DRAFT_COLUMNS),
                  "gen_progress": ("slot", "task", "gen_throughput", *PROGRESS_COLUMNS)},
    key_metrics=("gen_throughput", "eval_ms", "prompt_ms", "accept_rate", "accept_len"),
))

registry.add(LineFormat(
    "llamacpp", "draft_model", ("loading draft model",),
    (TS, r"loading draft model '(?P<draft_model>.*)'\s*$"),
    types={"draft_model": "str"}, require=("draft_model",),
))

registry.add(LineFormat(
    "llamacpp", "spec_statistics", ("#calls(b,g,a)", "#gen drafts"),
    (TS,
     r"statistics\s+(?P<spec_type>[A-Za-z0-9_.-]+)\s*:",
     r"#calls\(b,g,a\)\s*=\s*(?P<calls_begin>[0-9]+)\s+(?P<calls_draft>[0-9]+)\s+(?P<calls_accept>[0-9]+)",
     r"#gen drafts\s*=\s*(?P<drafts_gen>[0-9]+)",
     r"#acc drafts\s*=\s*(?P<drafts_acc>[0-9]+)",
     r"#gen tokens\s*=\s*(?P<tokens_gen>[0-9]+)",
     r"#acc tokens\s*=\s*(?P<tokens_acc>[0-9]+)",
     rf"#mean acc len\s*=\s*(?P<accept_len>{NUM})",
     rf"#acc rate/pos\s*=\s*\(\s*(?P<per_position>{LIST})\s*\)",
     rf"dur\(b,g,a\)\s*=\s*(?P<begin_ms_total>{NUM}),\s*(?P<draft_ms_total>{NUM}),\s*(?P<accept_ms_total>{NUM})"
     r"\s*ms"),
    types={"spec_type": "str", "per_position": "list"},
    require=("drafts_gen", "tokens_gen", "calls_draft"),
    key_metrics=("accept_len", "draft_ms_total", "tokens_acc"),
))

_JSON_KEYS = {
    "prompt_n": "prompt_tokens", "prompt_ms": "prompt_ms", "prompt_per_second": "prompt_throughput",
    "predicted_n": "eval_tokens", "predicted_ms": "eval_ms", "predicted_per_second": "gen_throughput",
    "draft_n": "drafted", "draft_n_accepted": "accepted",
}
_JSON_RX = {k: re.compile(rf'"{k}"\s*:\s*({NUM})') for k in _JSON_KEYS}


def timings_json(w: Window) -> BlockResult:
    """A response's ``timings`` object, on one line or pretty-printed over several."""
    text = ""
    used = 0
    for k in range(40):
        s = w[k]
        if s is None:
            break
        text += s + "\n"
        used = k + 1
        if "}" in s:
            break
    rec = {col: num(m.group(1)) for key, col in _JSON_KEYS.items() if (m := _JSON_RX[key].search(text))}
    if rec.get("eval_tokens") is None and rec.get("prompt_tokens") is None:
        return [], 0
    return [(0, {"origin": "timings_json", **rec})], used


_JSON_V = {k: re2(named(rx.pattern)) for k, rx in _JSON_RX.items()}


def _timings_classify(text: pa.Array, block: np.ndarray, offset: np.ndarray) -> np.ndarray:
    return np.where(np_bool(pc.match_substring(text, "}")), LAST, ROW)


def timings_json_vector(chunk: Chunk, at: np.ndarray) -> Blocks:
    """:func:`timings_json` of all the chunk's marker lines at once (each object's lines joined)."""
    nb = len(at)
    sc = scan(chunk, at, _timings_classify, start=0, first=4)
    end = np.minimum(sc.end, 40)
    live = np.flatnonzero(sc.offset < end[sc.block])
    blk = sc.block[live]
    counts = np.bincount(blk, minlength=nb)
    lists = pa.ListArray.from_arrays(pa.array(np.concatenate(([0], np.cumsum(counts))).astype(np.int32)),
                                     sc.text.take(pa.array(live)))
    text = pc.binary_join(lists, "\n")
    cols: dict[str, np.ndarray] = {}
    found: dict[str, np.ndarray] = {}
    for key, col in _JSON_KEYS.items():
        v, ok = numbers(first_group(text, _JSON_V[key]))
        cols[col], found[col] = v, ok
    valid = found["eval_tokens"] | found["prompt_tokens"]
    recs = np.flatnonzero(valid)
    out = {c: v[recs] for c, v in cols.items() if found[c][recs].any()}
    out["origin"] = np.full(len(recs), "timings_json", dtype=object)
    more = sc.more & (end == sc.end) & (sc.end < 40)
    return Blocks(np.where(valid, end, 0), np.minimum(sc.examined, end), recs, np.zeros(len(recs), np.int64),
                  out, np.where(more, MORE, 0))


registry.add(BlockFormat(
    "llamacpp", "request_timing", ('"prompt_n"', '"predicted_n"', '"predicted_ms"'), timings_json,
    {"origin": "str", "prompt_tokens": "float", "prompt_ms": "float", "prompt_throughput": "float", "eval_tokens": "float",
     "eval_ms": "float", "gen_throughput": "float", "drafted": "float", "accepted": "float"},
    timestamps=(TS, TS_JSONL),
    vector=compiled.reader(compiled.Spec("timings_json", tuple(_JSON_KEYS.values()), (),
                                         {"origin": ("timings_json",)}), timings_json_vector),
))

_SPEED_BENCH = {
    "category": "category", "base_avg_pred_t/s": "base_gen_throughput", "spec_avg_pred_t/s": "gen_throughput",
    "decode_speedup": "speedup", "base_avg_latency": "base_latency_s", "spec_avg_latency": "latency_s",
    "latency_speedup": "latency_speedup", "accept_rate": "accept_rate",
}


def speed_bench(w: Window) -> BlockResult:
    """The server-bench speed-bench table: a header of names, a dashed rule, rows of values."""
    header = (w[0] or "").split()
    cols = [_SPEED_BENCH.get(h) for h in header]
    recs: list[tuple[int, Record]] = []
    k = 1
    while (s := w[k]) is not None:
        cells = s.split()
        if cells and set(s.strip()) <= set("- "):
            k += 1
            continue
        if len(cells) != len(header):
            break
        rec: Record = {}
        for col, cell in zip(cols, cells, strict=True):
            if col == "category":
                rec[col] = cell
            elif col:
                rec[col] = num(cell)
        recs.append((k, rec))
        k += 1
    return (recs, k) if recs else ([], 0)


def speed_bench_vector(chunk: Chunk, at: np.ndarray) -> Blocks:
    """:func:`speed_bench` of all the chunk's tables at once."""
    nb = len(at)
    heads = [tuple(h.split()) for h in to_str_numpy(chunk.texts(at)).tolist()]
    plan_ids: dict[tuple[str, ...], int] = {}
    plan = np.array([plan_ids.setdefault(h, len(plan_ids)) for h in heads], np.int64)
    width = np.array([len(h) for h in heads], np.int64)

    def classify(text: pa.Array, block: np.ndarray, offset: np.ndarray) -> np.ndarray:
        _, counts, _ = split_ws(text)
        rule = (counts > 0) & np_bool(pc.match_substring_regex(pc.ascii_trim_whitespace(text), r"^[- ]+$"))
        return np.where(rule, SKIP, np.where(counts == width[block], ROW, STOP))

    sc = scan(chunk, at, classify, first=16)
    rows = sc.rows(ROW)
    blk = sc.block[rows]
    tokens, _, first = split_ws(sc.text.take(pa.array(rows)))
    n = len(rows)
    cols: dict[str, np.ndarray] = {}
    for head, pid in plan_ids.items():
        mine = np.flatnonzero(plan[blk] == pid)
        if not len(mine):
            continue
        for j, name in enumerate(head):
            col = _SPEED_BENCH.get(name)
            if col is None:
                continue
            vals = tokens.take(pa.array(first[mine] + j))
            if col == "category":
                cols.setdefault(col, np.empty(n, object))[mine] = to_str_numpy(vals)
            else:
                cols.setdefault(col, np.full(n, np.nan))[mine] = numbers(vals)[0]
    has = np.zeros(nb, dtype=bool)
    has[blk] = True
    # a row under a header naming no column is an empty record: it claims its line, it is no record
    named = np.array([any(_SPEED_BENCH.get(h) for h in head) for head in plan_ids], dtype=bool)
    keep = np.flatnonzero(named[plan[blk]]) if len(named) else np.zeros(0, np.int64)
    return Blocks(np.where(has, sc.end, 0), sc.examined, blk[keep], sc.offset[rows][keep],
                  {c: v[keep] for c, v in cols.items()}, np.where(sc.more, MORE, 0))


# the C reader (native/speed_bench.c): the float columns in _SPEED_BENCH's order, then `category`
_SPEED_BENCH_SPEC = compiled.Spec("speed_bench", tuple(c for c in _SPEED_BENCH.values() if c != "category"),
                                  ("category",))

registry.add(BlockFormat(
    "llamacpp", "speed_bench", ("spec_avg_pred_t/s",), speed_bench,
    {"category": "str", "base_gen_throughput": "float", "gen_throughput": "float", "speedup": "float",
     "base_latency_s": "float", "latency_s": "float", "latency_speedup": "float", "accept_rate": "float"},
    key_metrics=("gen_throughput", "speedup", "accept_rate"), timestamps=(),
    vector=compiled.reader(_SPEED_BENCH_SPEC, speed_bench_vector),
))
