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
from itertools import compress
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
_COLUMNS = ["line", "timestamp", "kind", *REQUEST_COLUMNS, *DRAFT_COLUMNS, *PROGRESS_COLUMNS]  # of the records' frame
_SETTLE_ROWS = 2048  # settled rows made a frame at once (fewer: they wait for the next part)
_REQ_WANTED = ("prompt_ms", "eval_ms", "total_ms")
_DRAFT_WANTED = ("accept_rate", "accepted", "drafted", "accept_len")


def _nan(v: Any) -> bool:
    return v is None or v != v  # NaN is the only value unequal to itself (rows come with None for NaN)


class _Merger:
    """Turns the per-line captures (sorted by line) into request, draft and progress records."""

    def __init__(self) -> None:
        self.rows: list[Record] = []
        self.settled: list[tuple[list[Record], pd.DataFrame]] = []  # rows no later line changes, and their frame
        self.high = -1  # the last line of the parts so far (settle's)
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
        self.event(r, key, r.timestamp if not _nan(r.timestamp) else hdr_ts, key is not None and _nan(r.slot))

    def event(self, r: Any, key: Key, ts: Any, from_header: bool) -> None:
        """A line with a timing, draft or progress value, of record `key` (from the line or the prefix line
        above it, `from_header`), at timestamp `ts` (the line's, else the prefix line's)."""
        base = {"line": r.line, "timestamp": ts, "_last": r.line,
                "slot": key[0] if key else math.nan, "task": (key[1] if key and key[1] is not None else math.nan)}
        if r.req:
            self._request(r, key, base, self.origin(r, from_header))
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

    def prefixed(self, hdr: np.ndarray, lines: np.ndarray, slots: list[Any], tasks: list[Any], stamps: list[Any],
                 ) -> tuple[np.ndarray, list[Key], list[Any]]:
        """`key` for the lines without a slot, among the bare prefix lines (`hdr`), in line order: which take the
        key of the prefix line above (each within _NEAR lines of it or of the line before that took it: the lines
        after one that is too far take none), and that key and the prefix line's timestamp, for each of those.
        The header moves on as `row` moves it."""
        starts = np.flatnonzero(hdr)
        seg = np.cumsum(hdr)  # which prefix line is above: 0, the one carried from the part before
        keys = [self.hdr_key, *(None if slots[i] is None else (slots[i], tasks[i]) for i in starts.tolist())]
        stamps = [self.hdr_ts, *(stamps[i] for i in starts.tolist())]
        before = np.concatenate(([self.hdr_line], lines[:-1]))
        far = np.cumsum(~hdr & (lines - before > _NEAR))
        take = ~hdr & (far == np.concatenate(([0], far[starts]))[seg]) & np.array([k is not None for k in keys])[seg]
        at = np.flatnonzero(take)
        if len(starts):
            self.hdr_key, self.hdr_ts, self.hdr_origin = keys[-1], stamps[-1], "print_timing"
            self.hdr_line = int(lines[starts[-1]])
        if len(at) and seg[at[-1]] == seg[-1]:
            self.hdr_line = int(lines[at[-1]])
        return take, [keys[i] for i in seg[at].tolist()], [stamps[i] for i in seg[at].tolist()]

    def fast(self, codes: list[int], lines: list[int], slots: list[Any], tasks: list[Any], stamps: list[Any],
             its: dict[int, Any]) -> None:
        """What `event` does with the rows of one part, by what they are (`codes`, see MergeRecords.feed): the
        common lines (a request's timing lines, a draft or progress line of one kind) here, the rest through
        `event`. A row's key is (slot, task), or where the slot is None, what `tasks` holds (the prefix line's
        key, or None); its timestamp is the line's, else the prefix line's. `its` gives each code's values, in
        row order."""
        rows, req, draft, last_req = self.rows, self.req, self.draft, self.last_req
        append, nan, near = rows.append, math.nan, _NEAR
        pe, ev, tot, gr, da, mlpp = its[_PE], its[_EV], its[_TOT], its[_GR], its[_DA], its[_MLPP]
        ndmax, ndcol, pg, generic = its[_NDMAX], its[_NDCOL], its[_PG], its[_GENERIC]
        for code, line, slot, key, ts in zip(codes, lines, slots, tasks, stamps, strict=True):
            if slot is not None:
                key = (slot, key)
            if code == _EV:  # `eval time`: into the open record of the key if near and without eval_ms, else new
                ms, n, tps, origin = next(ev)
                rec = req.get(key)
                if rec is not None and (key is not None or line - rec["_last"] <= near) and (
                        (v := rec.get("eval_ms")) is None or v != v):
                    rec.setdefault("origin", origin)
                else:
                    if rec is not None:  # emit
                        del req[key]
                        if (((v := rec.get("prompt_ms")) is not None and v == v) or
                                ((v := rec.get("eval_ms")) is not None and v == v) or
                                ((v := rec.get("total_ms")) is not None and v == v)):
                            append(rec)
                            last_req[key] = rec
                    rec = req[key] = {
                        "line": line, "timestamp": ts, "_last": line, "slot": nan if key is None else key[0],
                        "task": nan if key is None or key[1] is None else key[1], "kind": "request_timing",
                        "origin": origin}
                rec["eval_ms"], rec["eval_tokens"], rec["gen_throughput"], rec["_last"] = ms, n, tps, line
            elif code == _PE:  # `prompt eval time`: a new record
                ms, n, tps, origin = next(pe)
                rec = req.pop(key, None)
                if rec is not None and (((v := rec.get("prompt_ms")) is not None and v == v) or
                                        ((v := rec.get("eval_ms")) is not None and v == v) or
                                        ((v := rec.get("total_ms")) is not None and v == v)):
                    append(rec)
                    last_req[key] = rec
                req[key] = {"line": line, "timestamp": ts, "_last": line, "slot": nan if key is None else key[0],
                            "task": nan if key is None or key[1] is None else key[1], "kind": "request_timing",
                            "prompt_ms": ms, "prompt_tokens": n, "prompt_throughput": tps, "origin": origin}
            elif code in (_NDCOL, _MLPP, _DA, _NDMAX):
                # draft lines: a new record (draft acceptance, n_draft), or into the open one of the key where it
                # is near and has none of the line's columns yet
                if code == _NDCOL:
                    col, value = next(ndcol)
                    rec = draft.get(key)
                    fresh = rec is None or (key is None and line - rec["_last"] > near) or (
                        (v := rec.get(col)) is not None and v == v)
                elif code == _MLPP:
                    ml, pp = next(mlpp)
                    has_pp = not (pp is None or pp != pp)
                    rec = draft.get(key)
                    fresh = rec is None or (key is None and line - rec["_last"] > near) or (
                        ml is not None and (v := rec.get("accept_len")) is not None and v == v) or (
                        has_pp and (v := rec.get("per_position")) is not None and v == v)
                else:
                    fresh = True
                if fresh:
                    old = draft.pop(key, None)
                    if old is not None and (((v := old.get("accept_rate")) is not None and v == v) or
                                            ((v := old.get("accepted")) is not None and v == v) or
                                            ((v := old.get("drafted")) is not None and v == v) or
                                            ((v := old.get("accept_len")) is not None and v == v)):
                        append(old)  # emit: a record with one of _DRAFT_WANTED
                    rec = draft[key] = {
                        "line": line, "timestamp": ts, "_last": line, "slot": nan if key is None else key[0],
                        "task": nan if key is None or key[1] is None else key[1], "kind": "draft_acceptance"}
                if code == _NDCOL:
                    rec[col] = value
                    rec["_last"] = line
                elif code == _DA:
                    rec["accept_rate"], rec["accepted"], rec["drafted"], rec["accept_len"] = next(da)
                elif code == _NDMAX:
                    rec["draft_max"] = next(ndmax)
                else:
                    if ml is not None:
                        rec["accept_len"] = ml
                    if has_pp:
                        rec["per_position"] = list(pp)
                    rec["_last"] = line
            elif code == _TOT:  # `total time`: closes the open record of the key if near and without a total
                ms = next(tot)
                rec = req.get(key)
                if rec is not None and (key is not None or line - rec["_last"] <= near) and (
                        (v := rec.get("total_ms")) is None or v != v):
                    rec["total_ms"] = ms
                    rec["_last"] = line
                    del req[key]
                    if (ms is not None or ((v := rec.get("prompt_ms")) is not None and v == v) or
                            ((v := rec.get("eval_ms")) is not None and v == v)):
                        append(rec)
                        last_req[key] = rec
            elif code == _GR:  # `graphs reused`: into the last request of the key, if near
                value = next(gr)
                last = last_req.get(key)
                if last is not None and line - last["_last"] <= near:
                    last["graphs_reused"] = value
            elif code == _PG:
                n, tg, tg3 = next(pg)
                append({"line": line, "timestamp": ts, "_last": line, "slot": nan if key is None else key[0],
                        "task": nan if key is None or key[1] is None else key[1], "kind": "gen_progress",
                        "n_decoded": n, "gen_throughput": tg, "gen_throughput_3s": tg3})
            else:  # _GENERIC
                r, fh = next(generic)
                self.event(r, key, ts, fh)

    def settle(self, first: int, after: int) -> None:
        """After a part of lines `first` to `after`: make a frame of the records no later line can change (the
        parts come in line order): the emitted rows from the first on, while each is a draft or progress record
        (never changed once emitted) or a request whose last line is more than _NEAR lines before `after`
        (`graphs reused` reaches no further). A parallel parse's helper does it part by part, while the workers
        read on, so `finish` has only the last rows to make (500 MB log: 0.19 s less after the reading, measured).
        A part out of line order puts the settled rows back, and nothing is settled from then on."""
        if first < self.high:  # a part before the last: its lines may change a settled row
            self.unsettle()
            self.high = math.inf
            return
        self.high = after
        rows, cutoff, k = self.rows, after - _NEAR, 0
        for r in rows:
            if r["kind"] == "request_timing" and r["_last"] >= cutoff:
                break
            k += 1
        if k >= _SETTLE_ROWS:
            done = rows[:k]
            del rows[:k]
            self.settled.append((done, pd.DataFrame(done, columns=_COLUMNS)))

    def unsettle(self) -> None:
        """The settled rows back among the others (the same records: what changes them from now on shows)."""
        self.rows[:0] = [r for done, _ in self.settled for r in done]
        self.settled.clear()

    def finish(self) -> pd.DataFrame:
        for store in (self.req, self.draft):
            for key in list(store):
                self.emit(store, key)
        if not self.settled:
            return pd.DataFrame(self.rows, columns=_COLUMNS)
        frames = [f for _, f in self.settled]
        if self.rows:
            frames.append(pd.DataFrame(self.rows, columns=_COLUMNS))
        if all(list(f.dtypes) == list(frames[0].dtypes) for f in frames):  # each column's type, as one frame of
            return pd.concat(frames, ignore_index=True)  # all the rows would infer it (the same values, typed alike)
        # a column typed differently from part to part (e.g. None only in one, numbers in another): inferred
        # from all its rows at once, as before
        return pd.DataFrame([r for done, _ in self.settled for r in done] + self.rows, columns=_COLUMNS)


_FIELDS = ("line", "timestamp", "slot", "task", "origin", "t_name", "t_ms", "t_n", "t_tps", "io_name", "io_n",
           "io_s", "io_tps", "da_rate", "da_acc", "da_gen", "da_len", "ml_len", "pp", "nd_key", "nd_val", "pg_n",
           "pg_tg", "pg_tg3", "graphs_reused", "hdr", "event", "req", "draft")
_Row = namedtuple("_Row", _FIELDS)  # type: ignore[misc]  # noqa: PYI024
_TEXT = ("timestamp", "origin", "t_name", "io_name", "pp", "nd_key", "hdr")  # object columns; the rest float64
# What the fast merge does with a row (_Merger.fast); GENERIC rows go through _Merger.row
(_HDR, _NOOP, _PE, _EV, _TOT, _GR, _DA, _MLPP, _NDMAX, _NDCOL, _PG, _GENERIC) = range(12)  # > _NOOP: records
_ND_COL = {"n_drafted": "drafted", "n_accept": "accepted", "accept": "accept_rate"}
_NAMES = {"prompt eval": _PE, "encoded": _PE, "eval": _EV, "generation eval": _EV, "decoded": _EV, "generated": _EV,
          "total": _TOT}  # what _request does with a line of this name (others: nothing)
_ND_CODES = {"n_draft": _NDMAX, "n_predict": _NOOP, "n_drafted": _NDCOL, "n_accept": _NDCOL, "accept": _NDCOL}


def _category(v: np.ndarray, table: dict[str, int], other: int) -> tuple[np.ndarray, np.ndarray]:
    """Code of each value of a text column by `table` (`other` where not in it), and where it is not None/NaN."""
    at, uniques = pd.factorize(v)
    lut = np.array([table.get(u, other) for u in uniques.tolist()] + [-1], dtype=np.int8)
    return lut[at], at >= 0


def _listed(v: np.ndarray) -> list[Any]:
    """Values as the merger reads them: NaN of a float column as None."""
    if v.dtype != np.float64:
        return v.tolist()
    nan = np.isnan(v)
    if not nan.any():
        return v.tolist()
    if nan.all():
        return [None] * len(v)
    out = v.tolist()
    for i in np.flatnonzero(nan).tolist():
        out[i] = None
    return out


def _plain(df: pd.DataFrame) -> bool:
    """Whether the columns are of the types the parser gives (line integers, text as objects, the rest float64):
    the fast merge reads only such; other frames take the row-by-row way."""
    if df["line"].dtype.kind not in "iu":
        return False
    return all(c not in df or df[c].dtype == (object if c in _TEXT else np.float64) for c in _FIELDS[2:26])


class MergeRecords(Finalizer):
    """Per-line captures -> request_timing / draft_acceptance / gen_progress rows (fed part by part, in line
    order: the merger's open records carry from one part to the next)."""

    def __init__(self) -> None:
        self.merger = _Merger()

    def feed(self, df: pd.DataFrame) -> None:
        """The part's rows as `_Merger.row` takes them one by one, sorted out first: the columns as arrays, what
        each row is (a code), the values of each code's rows listed together."""
        if not len(df) or "line" not in df or not _plain(df):
            self.feed_rows(df)
            return
        n = len(df)
        line = df["line"].to_numpy()
        order = None if bool(np.all(line[1:] >= line[:-1])) else np.argsort(line, kind="stable")
        cols: dict[str, np.ndarray] = {}
        for c in _FIELDS[1:26]:
            if c not in df:
                cols[c] = np.full(n, None, dtype=object) if c in _TEXT else np.full(n, np.nan)
            else:
                v = df[c].to_numpy()
                cols[c] = v if order is None else v[order]
        if order is not None:
            line = line[order]
        isna = pd.isna
        tc, t = _category(cols["t_name"], _NAMES, _NOOP)
        ic, io = _category(cols["io_name"], _NAMES, _NOOP)
        nc, nd = _category(cols["nd_key"], _ND_CODES, _GENERIC)  # another key: a KeyError in _draft
        gr, pg, da = ~np.isnan(cols["graphs_reused"]), ~np.isnan(cols["pg_n"]), ~np.isnan(cols["da_rate"])
        mlpp = ~(np.isnan(cols["ml_len"]) & isna(cols["pp"]))
        req, draft = t | io | gr, da | mlpp | nd
        event = req | draft | pg
        code = np.full(n, _GENERIC, dtype=np.int8)
        code[~event] = -1
        code[~event & ~isna(cols["hdr"])] = _HDR
        # request lines, named by t_name (`prompt eval time = ...`) or io_name (`encoded N tokens in ...`); where
        # t_name is NaN rather than None, `_request` reads the t_* values for an io line: such a row goes by `row`
        lone = ~gr & ~draft & ~pg
        t_only = t & ~io & lone
        code[t_only] = tc[t_only]
        io_only = np.flatnonzero(io & ~t & lone)
        io_only = io_only[cols["t_name"][io_only] == None]  # noqa: E711
        code[io_only] = ic[io_only]
        code[gr & ~t & ~io & ~draft & ~pg] = _GR
        lone = ~req & ~pg  # draft lines of one kind
        code[lone & da & ~mlpp & ~nd] = _DA
        code[lone & mlpp & ~da & ~nd] = _MLPP
        nd &= lone & ~da & ~mlpp
        code[nd] = nc[nd]
        code[pg & ~req & ~draft] = _PG

        # keys and timestamps of the rows that make or change records: each row's own (`fast` makes the key
        # of a slot and task); where a prefix line (_HDR) is or was, the lines without a slot take its key line
        # after line (`prefixed`): `tasks` holds that key, `slots` None
        m = self.merger
        sel = np.flatnonzero(code > _NOOP)
        stamps = cols["timestamp"][sel]
        stamps = np.where(isna(stamps), None, stamps).tolist() if stamps.dtype == object else _listed(stamps)
        slot = cols["slot"][sel]
        slots, tasks = _listed(slot), _listed(np.where(np.isnan(slot), np.nan, cols["task"][sel]))
        fh = np.zeros(len(sel), dtype=bool)  # the key is a prefix line's (then hdr_origin is set: print_timing)
        if m.hdr_key is not None or (code == _HDR).any():
            seq = np.flatnonzero((code == _HDR) | ((code >= _NOOP) & np.isnan(cols["slot"])))
            take, got, hts = m.prefixed(code[seq] == _HDR, line[seq], _listed(cols["slot"][seq]),
                                        _listed(cols["task"][seq]), _listed(cols["timestamp"][seq]))
            busy = (code[seq] > _NOOP)[take]  # of the lines taking the key, those making or changing records
            at = np.searchsorted(sel, seq[take][busy])
            for i, k, t in zip(at.tolist(), compress(got, busy), compress(hts, busy), strict=True):
                tasks[i] = k
                if stamps[i] is None:  # the line's own timestamp, else the prefix line's
                    stamps[i] = t
            fh[at] = True
        code = code[sel]

        def values(c: str, k: int) -> list[Any]:
            return _listed(cols[c][sel[code == k]])

        def each(k: int, *cs: str) -> Any:
            return zip(*(values(c, k) for c in cs), strict=True)

        # a request line's values: t_* of a `... time =` line, io_* of an `encoded N tokens in S seconds` one
        tl = t_only[sel]
        with np.errstate(all="ignore"):
            ms = np.where(tl, cols["t_ms"][sel], cols["io_s"][sel] * 1000.0)
            tn = np.where(tl, cols["t_n"][sel], cols["io_n"][sel])
            tps = np.where(tl, cols["t_tps"][sel], cols["io_tps"][sel])
            fix = (code == _EV) & np.isnan(tps) & ~np.isnan(tn) & ~np.isnan(ms) & (ms > 0)  # eval without a rate
            tps = np.where(fix, tn / ms * 1000.0, tps)
        # origin (see `origin`): the line's, else print_timing under a prefix line, else by the line's form
        origin = cols["origin"][sel]
        has = ~isna(origin)
        for o in set(origin[has].tolist()):
            if isinstance(o, str) and o.startswith("print_timing") and o != "print_timing":
                origin[has & (origin == o)] = "print_timing"
        if not has.all():
            by_form = np.array(["unknown", "speculative", "print_timing"], dtype=object)
            origin[~has] = by_form[np.where(fh, 2, io[sel])[~has]]

        def request(k: int) -> Any:
            at = code == k
            return zip(_listed(ms[at]), _listed(tn[at]), _listed(tps[at]), origin[at].tolist(), strict=True)

        g = code == _GENERIC
        rows = zip(_listed(line[sel[g]]), *(_listed(cols[c][sel[g]]) for c in _FIELDS[1:26]),
                   *(x[sel[g]].tolist() for x in (event, req, draft)), strict=True)
        m.fast(code.tolist(), line[sel].tolist(), slots, tasks, stamps,
               {_PE: request(_PE), _EV: request(_EV), _TOT: iter(_listed(ms[code == _TOT])),
                _GR: iter(values("graphs_reused", _GR)), _DA: each(_DA, "da_rate", "da_acc", "da_gen", "da_len"),
                _MLPP: each(_MLPP, "ml_len", "pp"), _NDMAX: iter(values("nd_val", _NDMAX)),
                _NDCOL: zip([_ND_COL[k] for k in values("nd_key", _NDCOL)], values("nd_val", _NDCOL), strict=True),
                _PG: each(_PG, "pg_n", "pg_tg", "pg_tg3"),
                _GENERIC: zip(map(_Row._make, rows), fh[g].tolist(), strict=True)})
        if n:
            m.settle(int(line[0]), int(line[-1]))

    def feed_rows(self, df: pd.DataFrame) -> None:
        """The rows one by one through `_Merger.row` (any column types)."""
        m = self.merger
        m.unsettle()  # lines of any type, in any order: nothing is settled from here on
        m.high = math.inf
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
