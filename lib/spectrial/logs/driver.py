"""The driver: per chunk, markers -> formats, blocks first (in line order, each claiming its lines), then
every line format over its remaining marker lines at once. Records are kept as columns per format."""

from __future__ import annotations

import functools
import itertools
import os
import re
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spectrial.logs import native
from spectrial.logs.chunks import ANSI, CONTEXT, Chunk, NeedMore, Window
from spectrial.logs.columns import const, floats, objects, to_numpy
from spectrial.logs.formats import DECLINE, MORE, BlockFormat, Blocks, Finalizer, Format, LineFormat, Record
from spectrial.logs.text import ahocorasick_rs, re2

MAX_ERRORS = 20
THREAD_ROWS = 2000  # line-format rows in a chunk from which their extraction runs in the worker thread
_POOL: dict[int, ThreadPoolExecutor] = {}  # per process: a forked child has none of its parent's threads


def pool() -> ThreadPoolExecutor:
    """The one worker thread (line formats run there while the blocks are resolved)."""
    pid = os.getpid()
    if pid not in _POOL:
        _POOL.clear()
        _POOL[pid] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spectrial-logs")
    return _POOL[pid]


Columns = dict[str, pa.Array | np.ndarray]
"""A format's columns for some records: arrow arrays as extracted, numpy arrays once joined."""


@dataclass
class Batch:
    """Records of one format from one chunk: 1-based line numbers and columns (numpy; a text column of a
    compiled block reader arrow, kept so to the tables)."""

    lines: np.ndarray
    columns: dict[str, np.ndarray | pa.Array]

    def take(self, rows: np.ndarray) -> Batch:
        """The records at `rows` (indexes, or a boolean mask)."""
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        idx = pa.array(rows)
        return Batch(self.lines[rows], {c: v.take(idx) if isinstance(v, pa.Array) else v[rows]
                                        for c, v in self.columns.items()})


class Plan:
    """Per-parse state: the formats, their markers, and what they found so far."""

    def __init__(self, formats: Sequence[Format], *, threads: bool = True, claims: bool = False) -> None:
        self.formats = list(formats)
        self.threads = threads  # False: everything in this thread (a worker process of a parallel parse)
        self.claims: list[tuple[np.ndarray, np.ndarray]] | None = [] if claims else None
        self.nonblank: np.ndarray | None = None  # a segment's: whether each of its own lines is non-blank (feed's)
        self.finalizers: dict[int, Finalizer] = {}  # formats whose rows were fed to their finalize part by part
        self.markers = Markers(self.formats)
        self.is_block = np.array([isinstance(f, BlockFormat) for f in self.formats] + [False], dtype=bool)
        self.line_parts: list[list[tuple[np.ndarray, Columns]]] = [[] for _ in self.formats]
        self.block_parts: list[list[Batch]] = [[] for _ in self.formats]
        self.sinks: list[Sink] = [Sink() for _ in self.formats]
        self.total = self.blank = self.recognised = 0
        self.errors: list[tuple[int, str, str]] = []

    def error(self, line: int, fmt: Format, exc: BaseException) -> None:
        """Note a parser bug (at most MAX_ERRORS), never raise it."""
        if len(self.errors) < MAX_ERRORS:
            self.errors.append((line, f"{fmt.engine}/{fmt.kind}", f"{exc.__class__.__name__}: {exc}"))

    def process(self, ch: Chunk) -> int:
        """Read the chunk's own lines up to the first block that runs past its end; returns that local line
        (``ch.n`` when all were read). Lines from there on are read again with the next chunk.

        The line formats' extraction (arrow kernels, which release the GIL) runs in a worker thread while
        this one resolves the blocks; rows inside a block or past `done` are dropped afterwards."""
        done = ch.n
        idx = fid = np.zeros(0, np.int64)
        if self.formats and ch.n > ch.first:
            idx, fid = self.markers.find(ch)
            keep = idx >= ch.first
            idx, fid = idx[keep], fid[keep]
        blk = self.is_block[fid]
        line_rows = ~blk & (fid >= 0)
        jobs = [(f, idx[line_rows & (fid == f)]) for f in np.unique(fid[line_rows]).tolist()]
        pending = None
        if self.threads and blk.any() and ch.n >= THREAD_ROWS:
            ch.prepare_plain(pool())
        if self.threads and jobs and blk.any() and sum(len(r) for _, r in jobs) >= THREAD_ROWS:
            pending = pool().submit(self._extract_all, ch, jobs)
        starts = ends = np.zeros(0, np.int64)
        try:
            if blk.any():
                done, starts, ends = self._blocks(ch, idx[blk], fid[blk])
        finally:
            found = pending.result() if pending is not None else None
        if found is None:
            found = self._extract_all(ch, jobs)
        for f, rows, cols, ok in found:
            if isinstance(cols, BaseException):
                self.error(ch.start + int(rows[0]) + 1, self.formats[f], cols)
                continue
            ok = ok & (rows < done)
            if len(starts):
                k = np.searchsorted(starts, rows, side="right") - 1
                ok &= ~((k >= 0) & (rows < ends[np.maximum(k, 0)]))
            if ok.all():  # the common case: no row dropped, no column filtered
                self.recognised += len(rows)
                self.line_parts[f].append((ch.start + rows + 1, cols))
            elif ok.any():
                self.recognised += int(ok.sum())
                mask = pa.array(ok)
                self.line_parts[f].append((ch.start + rows[ok] + 1, {c: a.filter(mask) for c, a in cols.items()}))
        self.total += done - ch.first
        self.blank += (done - ch.first) - ch.nonblank(ch.first, done)
        self.recognised += ch.nonblank_ranges(starts, ends)
        if self.claims is not None and len(starts):
            self.claims.append((ch.start + starts, ch.start + ends))
        return done

    def feed(self, blocks: Iterator[bytes], *, context: bytes = b"", context_lines: int = 0, head: bool = True,
             own_lines: int | None = None) -> int:
        """Read `blocks` (whole lines) chunk by chunk; returns the lines handled (numbered from the first line of
        `blocks`; context lines come before it).

        Each chunk holds up to CONTEXT lines handled before, the lines the chunk before left (a block that ran
        past its end, and what follows), then the next input block(s). `context` (`context_lines` whole lines)
        precedes the input: a segment's view of the lines above it (`head`: the context starts at the input's
        first line). With `own_lines`, reading stops once that many lines are handled: a segment reads past its
        end only to finish a block that runs over it."""
        raw = iter(blocks)
        block = next(raw, None)
        ctx, carry = context, b""
        ctx_n, start = context_lines, -context_lines
        zero = -context_lines if head else None  # local index of the input's first line, where the data holds it
        while block is not None or carry:
            new: list[bytes] = []
            size = 0
            while block is not None and (not new or size < len(carry)):  # at least as much new as carried
                new.append(block)
                size += len(block)
                block = next(raw, None)
            data = b"".join((ctx, carry, *new))
            # a chunk cut inside a line (no newline in 64 MiB of binary data) is read as if the input ended
            ch = Chunk(data, start, ctx_n, final=block is None or not data.endswith(b"\n"), head=start == zero)
            if self.nonblank is not None:  # the chunk's lines among a segment's own ones (the chunks overlap)
                lo, hi = max(start, 0), min(start + ch.n, len(self.nonblank))
                if hi > lo:
                    self.nonblank[lo:hi] = np.diff(ch.nonblank_cum()[lo - start:hi - start + 1]) > 0
            done = self.process(ch)
            if block is None or (own_lines is not None and ch.start + done >= own_lines):
                return ch.start + done  # the last chunk is read to its end
            c0 = max(done - CONTEXT, 0)
            a, b = int(ch.offs[c0]), int(ch.offs[done])
            ctx, carry = ch.data[a:b], ch.data[b:]
            ctx_n, start = done - c0, ch.start + c0
        return max(start + ctx_n, 0)

    # ------------------------------------------------------------ line formats
    def _extract_all(self, ch: Chunk, jobs: list[tuple[int, np.ndarray]]) -> list[tuple[Any, ...]]:
        """Each line format's columns for its rows: (format, rows, columns, is-a-record mask)."""
        out: list[tuple[Any, ...]] = []
        for f, rows in jobs:
            fmt = self.formats[f]
            assert isinstance(fmt, LineFormat)
            try:
                colour = ch.ansi(rows)
                if colour.any():  # the lines without their colour codes, copied
                    sel = _strip_ansi_rows(ch.lines.take(pa.array(rows)), colour)
                    cols = native.extract(fmt, sel)  # the compiled line pass, where it can run
                else:  # the compiled pass reads the rows in the chunk's own buffer
                    sel = None
                    cols = native.extract(fmt, ch.lines, rows)
                if cols is None:
                    cols = fmt.extract(ch.lines.take(pa.array(rows)) if sel is None else sel)
                out.append((f, rows, cols, fmt.required(cols, len(rows))))
            except Exception as e:  # a format's bug must not lose the rest of the log
                out.append((f, rows, e, None))
        return out

    # ------------------------------------------------------------ block formats
    def _blocks(self, ch: Chunk, at: np.ndarray, fid: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
        """Resolve the blocks at local lines `at` in order; returns (done, claimed starts, claimed ends)."""
        pos = np.zeros(len(at), np.int64)
        answers: dict[int, tuple[np.ndarray, Blocks, np.ndarray, np.ndarray]] = {}
        for f in np.unique(fid).tolist():
            sel = np.flatnonzero(fid == f)
            pos[sel] = np.arange(len(sel))
            fmt = self.formats[f]
            assert isinstance(fmt, BlockFormat)
            if fmt.vector is None:
                continue
            mine = at[sel]
            try:
                got = fmt.vector(ch, mine)
            except NeedMore:
                raise
            except Exception:  # a vectorised reader's bug: the Python function decides (and reports its own)
                continue
            status = np.zeros(len(mine), np.int64) if got.status is None else np.asarray(got.status, np.int64)
            used = np.asarray(got.used, np.int64).copy()
            if len(got.block):  # a block claims at least the lines of its records
                np.maximum.at(used, got.block, got.offset + 1)
            reach = np.maximum(np.maximum(np.asarray(got.examined, np.int64), used), 1)
            plain = ch.plain(mine - fmt.lookback, mine + reach)
            status = np.where((status != MORE) & ~plain, DECLINE, status)
            answers[f] = (sel, got, status, used)
        kept = {f: np.zeros(len(a[0]), dtype=bool) for f, a in answers.items()}
        status_of = {f: a[2].tolist() for f, a in answers.items()}
        used_of = {f: a[3].tolist() for f, a in answers.items()}
        done = ch.n
        skip = -1
        starts: list[int] = []
        ends: list[int] = []
        for i, f, p in zip(at.tolist(), fid.tolist(), pos.tolist(), strict=True):
            if i < skip:
                continue
            st = status_of[f][p] if f in status_of else DECLINE
            if st == MORE:
                done = i
                break
            if st == DECLINE:
                try:
                    used = self._run_fn(ch, f, i)
                except NeedMore:
                    done = i
                    break
            else:
                used = used_of[f][p]
                if used:
                    kept[f][p] = True
            if used:
                skip = i + used
                starts.append(i)
                ends.append(i + used)
        for f, (sel, got, _, _) in answers.items():
            if kept[f].any():
                self._commit(ch, f, at[sel], got, kept[f])
        return done, np.array(starts, np.int64), np.array(ends, np.int64)

    def _commit(self, ch: Chunk, f: int, at: np.ndarray, got: Blocks, kept: np.ndarray) -> None:
        """Keep the records of the blocks the resolution kept."""
        fmt = self.formats[f]
        assert isinstance(fmt, BlockFormat)
        recs = np.flatnonzero(kept[got.block]) if len(got.block) else np.zeros(0, np.int64)
        if not len(recs):
            return
        local = at[got.block[recs]] + got.offset[recs]
        cols: dict[str, np.ndarray | pa.Array] = {}
        for c, v in got.columns.items():
            if isinstance(v, pa.Array):  # a compiled reader's text: arrow to the tables
                cols[c] = v if len(recs) == len(v) else v.take(pa.array(recs))
                continue
            v = np.asarray(v)[recs]
            if fmt.columns.get(c) == "float":
                cols[c] = v.astype(np.float64) if v.dtype != object else floats(v.tolist())
            else:
                cols[c] = v if v.dtype == object else objects(v.tolist())
        if fmt.timestamps:
            ts = cols.get("timestamp")
            if isinstance(ts, pa.Array):
                ts = np.asarray(ts.to_numpy(zero_copy_only=False), object)
            missing = np.arange(len(recs)) if ts is None else np.flatnonzero(np.equal(ts, None))
            if len(missing):
                found = _timestamps(ch, local[missing], fmt)
                if ts is None:
                    ts = np.empty(len(recs), object)
                ts[missing] = found
            cols["timestamp"] = ts
        self.block_parts[f].append(Batch(ch.start + local + 1, cols))

    def _run_fn(self, ch: Chunk, f: int, i: int) -> int:
        """The format's Python function on the block at local line `i`; returns the lines it claims."""
        fmt = self.formats[f]
        assert isinstance(fmt, BlockFormat)
        w = Window(ch, i)
        try:
            got, used = fmt.fn(w)
            recs = [(int(off), rec) for off, rec in (got or []) if rec]
            used = max(int(used or 0), max((off + 1 for off, _ in recs), default=0))
        except NeedMore:
            raise
        except Exception as e:  # a parser bug must not lose the rest of the log
            self.error(ch.start + i + 1, fmt, e)
            return 0
        if used:
            w[used - 1]  # the lines of the block exist (past a chunk's end: NeedMore)
        if not recs:
            return used
        sink = self.sinks[f]
        has_ts = bool(fmt.timestamps)
        for off, rec in recs:
            if "timestamp" not in rec:
                rec["timestamp"] = fmt.timestamp(w[off]) if has_ts else None
            sink.add(ch.start + i + off + 1, rec)
        return used


class Sink:
    """Records of a format's Python function, kept as value tuples grouped by their field names (turned
    into columns once, at the end)."""

    __slots__ = ("n", "groups")

    def __init__(self) -> None:
        self.n = 0
        self.groups: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}

    def add(self, line: int, rec: Record) -> None:
        """Append one record found at 1-based `line`."""
        key = tuple(rec)
        rows = self.groups.get(key)
        if rows is None:
            rows = self.groups[key] = []
        rows.append((self.n, line, *rec.values()))
        self.n += 1

    def batch(self, types: dict[str, str]) -> Batch:
        """The records in insertion order: line numbers and typed columns (NaN / None where one lacks a
        field); fields not in `types` are left out."""
        n = self.n
        lines = np.empty(n, np.int64)
        parts: dict[str, list[tuple[np.ndarray, Sequence[Any]]]] = {}
        for key, rows in self.groups.items():
            seq, ln, *vals = zip(*rows, strict=True)
            at = np.array(seq, np.int64)
            lines[at] = ln
            for c, v in zip(key, vals, strict=True):
                if c in types:
                    parts.setdefault(c, []).append((at, v))
        cols: dict[str, np.ndarray] = {}
        for c, pieces in parts.items():
            if types[c] == "float":
                arr = np.full(n, np.nan)
                for at, v in pieces:
                    arr[at] = floats(v)
            else:
                arr = np.empty(n, object)
                for at, v in pieces:
                    arr[at] = objects(v)
            cols[c] = arr
        return Batch(lines, cols)


def _timestamps(ch: Chunk, local: np.ndarray, fmt: BlockFormat) -> np.ndarray:
    """Each record line's timestamp, as the format's patterns find it: RE2 over the (plain) lines, the
    patterns in order, as Python `re` finds them on a Window's text."""
    uniq, inv = np.unique(local, return_inverse=True)
    text = ch.texts(uniq)
    found = np.empty(len(uniq), object)
    todo = np.arange(len(uniq))
    for pattern in fmt.timestamps:
        if not len(todo):
            break
        sub = text if len(todo) == len(uniq) else text.take(pa.array(todo))
        got = pc.struct_field(pc.extract_regex(sub, _timestamp_pattern(pattern)), "timestamp")
        hit = pc.is_valid(got).to_numpy(zero_copy_only=False)
        found[todo[hit]] = got.filter(pa.array(hit)).to_numpy(zero_copy_only=False)
        todo = todo[~hit]
    return found[inv]


@functools.lru_cache(maxsize=64)
def _timestamp_pattern(pattern: str) -> str:
    """A timestamp pattern for arrow's RE2: only the `timestamp` group named, others made non-capturing."""
    return re2(re.sub(r"\(\?P<(?!timestamp>)[A-Za-z_][A-Za-z0-9_]*>", "(?:", pattern))


def _strip_ansi_rows(lines: pa.Array, rows: np.ndarray) -> pa.Array:
    """`lines` without ANSI colour sequences (the regex runs on the `rows` that may hold one)."""
    mask = pa.array(rows)
    return pc.replace_with_mask(lines, mask, pc.replace_substring_regex(lines.filter(mask), ANSI, ""))


# --- a format's records as columns (for the tables and the worker processes) ------------------------------
def numpy_part(fmt: LineFormat, part: tuple[np.ndarray, Columns]) -> tuple[np.ndarray, Columns]:
    """A line format's records from one chunk as numpy columns, as the tables hold them; text columns of a format
    without finalize stay arrow (a kind's table keeps them so: no Python string per cell)."""
    lines, cols = part
    types = fmt.pattern_columns
    keep = fmt.finalize is None
    return lines, {c: v if not isinstance(v, pa.Array) or (keep and types[c] == "str") else to_numpy(v, types[c])
                   for c, v in cols.items()}


def line_rows(fmt: LineFormat, parts: list[tuple[np.ndarray, Columns]]
              ) -> tuple[np.ndarray, dict[str, np.ndarray | pa.ChunkedArray]]:
    """The records of `parts` together: line numbers and a column for each pattern column one of them holds
    (NaN / None in the parts without it); text columns of a format without finalize as one arrow column."""
    parts = [numpy_part(fmt, p) for p in parts]
    lines = np.concatenate([p[0] for p in parts]).astype(np.int64, copy=False) if parts else np.zeros(0, np.int64)
    cols: dict[str, np.ndarray | pa.ChunkedArray] = {}
    for c, typ in fmt.pattern_columns.items():
        if not any(c in p[1] for p in parts):
            continue
        pieces = [p[1].get(c) for p in parts]
        if fmt.finalize is None and typ == "str":
            cols[c] = pa.chunked_array([v if v is not None else pa.nulls(len(p[0]), pa.string())
                                        for v, p in zip(pieces, parts, strict=True)], type=pa.string())
            continue
        cols[c] = np.concatenate([v if v is not None else  # a chunk without the column contributes NaN / None
                                  (np.full(len(p[0]), np.nan) if typ == "float" else const(len(p[0]), None))
                                  for v, p in zip(pieces, parts, strict=True)])
    return lines, cols


def rows_frame(lines: np.ndarray, cols: dict[str, np.ndarray]) -> pd.DataFrame:
    """Line numbers and columns as the DataFrame a finalize reads."""
    return pd.DataFrame({"line": lines, **{c: pd.Series(v, dtype=object if v.dtype == object else None, copy=False)
                                          for c, v in cols.items()}})


def cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


# --- markers: which line starts which format ------------------------------------------------------------
# The leftmost (at a tie, the longest) marker string on a line decides. One Aho-Corasick pass per group of
# markers over a chunk's bytes (ahocorasick_rs: a SIMD prefilter for groups of up to ~40 strings), or, without
# that package, one RE2 union pass over the chunk's lines.

# ahocorasick_rs (optional) finds the marker lines several times faster than the RE2 union
GROUP = 42  # markers per automaton: small sets get its fast SIMD prefilter (measured: 2 x 41 beat 1 x 82 by 2.4x)


class Markers:
    """The markers of `formats`, and a search for the first one on each line of a chunk."""

    def __init__(self, formats: Sequence[Format]) -> None:
        pairs = [(m, i) for i, f in enumerate(formats) for m in f.markers]
        pairs.sort(key=lambda mi: -len(mi[0]))  # longer markers win at the same position
        self.strings = [m for m, _ in pairs]
        self.union = "|".join(re.escape(m) for m in self.strings)
        self.values = pa.array(self.strings, pa.string())
        self.format_of = np.array([i for _, i in pairs] + [-1], dtype=np.int64)  # [-1]: no marker
        self.automata = _automata(self.strings) if pairs else None
        encoded = [m.encode() for m in self.strings]
        # the compiled search takes markers of 2 ASCII bytes and more (all of the registry's)
        self.blob = b"".join(encoded) if all(len(m) >= 2 and m.isascii() for m in encoded) else None
        self.blob_offs = np.concatenate(([0], np.cumsum([len(m) for m in encoded]))).astype(np.int32)

    def find(self, ch: Chunk) -> tuple[np.ndarray, np.ndarray]:
        """Local lines holding a marker, and the format of each line (its first marker's)."""
        if not self.strings or not ch.n:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        lib = native.library()
        if lib is not None and self.blob is not None and ch.offs.dtype == np.int32:
            line = np.empty(ch.n, np.int64)
            which = np.empty(ch.n, np.int32)
            raw = np.frombuffer(ch.data, np.uint8)
            got = lib.cp_markers(raw.ctypes.data, ch.offs.ctypes.data, ch.n, 0, self.blob, self.blob_offs.ctypes.data,
                                 len(self.strings), line.ctypes.data, which.ctypes.data)
            if got >= 0:
                return line[:got], self.format_of[which[:got]]
        if self.automata is None:
            mask = pc.match_substring_regex(ch.lines, self.union).to_numpy(zero_copy_only=False)
            idx = np.flatnonzero(mask)
            which = pc.extract_regex(ch.lines.take(pa.array(idx)), f"(?P<m>{self.union})").flatten()[0]
            mid = pc.fill_null(pc.index_in(which, value_set=self.values), -1).to_numpy(zero_copy_only=False)
            return idx, self.format_of[mid]
        found = []
        for automaton, ids in self.automata:
            hits = automaton.find_matches_as_indexes(ch.data)
            arr = np.fromiter(itertools.chain.from_iterable(hits), np.int64, 3 * len(hits)).reshape(-1, 3)
            arr[:, 0] = ids[arr[:, 0]]
            found.append(arr)
        hits = np.concatenate(found) if len(found) > 1 else found[0]
        if len(found) > 1:  # by position; the longest first at a tie
            hits = hits[np.lexsort((hits[:, 1] - hits[:, 2], hits[:, 1]))]
        line = np.searchsorted(ch.offs, hits[:, 1], side="right") - 1
        first = np.ones(len(line), dtype=bool)
        first[1:] = line[1:] != line[:-1]  # a line's leftmost (longest) marker decides its format
        return line[first], self.format_of[hits[first, 0]]


def _automata(markers: list[str]) -> list[tuple[Any, np.ndarray]] | None:
    """Leftmost-longest Aho-Corasick automata over `markers`, each with the indexes of its markers in
    `markers`; None without the package (the RE2 union is used instead)."""
    if ahocorasick_rs is None:
        return None
    groups = -(-len(markers) // GROUP)
    size = -(-len(markers) // groups)
    out = []
    for a in range(0, len(markers), size):
        part = markers[a:a + size]
        automaton = ahocorasick_rs.BytesAhoCorasick([m.encode() for m in part],
                                                   matchkind=ahocorasick_rs.MatchKind.LeftmostLongest)
        out.append((automaton, np.arange(a, a + len(part), dtype=np.int64)))
    return out
