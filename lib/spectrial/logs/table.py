"""The records of every format into one table per kind (:class:`~spectrial.logs.result.LogTables`, whose
`wide()` is the one DataFrame of :mod:`spectrial.logs.api`'s schema), and `summary`."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from spectrial.logs.columns import const
from spectrial.logs.driver import THREAD_ROWS, Batch, Plan, line_rows, pool, rows_frame
from spectrial.logs.formats import Format, LineFormat, finalizer
from spectrial.logs.registry import Registry, wants
from spectrial.logs.result import KindTable, LogTables, ParserError, typed_column

ENGINE_ORDER = {e: i for i, e in enumerate(("sglang", "vllm", "llamacpp", "profile", "nccl", "nvidia-smi", "http"))}


@dataclass
class Frame:
    """The rows one format found: line numbers, engine and kind per row (or one for all), typed columns.
    `clean`: its object columns hold None where a value is missing (never NaN)."""

    lines: np.ndarray
    engine: np.ndarray | str
    kind: np.ndarray | str
    cols: dict[str, np.ndarray | pa.ChunkedArray]  # arrow: the text columns of a line format without finalize
    clean: bool = False

    def subset(self, keep: np.ndarray) -> Frame:
        """The rows where `keep` holds."""
        return Frame(self.lines[keep], *(v if isinstance(v, str) else v[keep] for v in (self.engine, self.kind)),
                     {c: v.filter(pa.array(keep)) if isinstance(v, pa.ChunkedArray) else v[keep]
                      for c, v in self.cols.items()}, self.clean)

    def per_row(self, value: np.ndarray | str) -> np.ndarray:
        """Engine or kind as one value per row."""
        return const(len(self.lines), value) if isinstance(value, str) else value


def frame(plan: Plan, i: int) -> Frame | None:
    """The rows format `i` found (after its `finalize`), or None."""
    fmt = plan.formats[i]
    if isinstance(fmt, LineFormat):
        fin = plan.finalizers.get(i)  # fed part by part already (a parallel parse)
        parts = plan.line_parts[i]
        if fin is None and not parts:
            return None
        if fmt.finalize is None:
            lines, cols = line_rows(fmt, parts)
            return Frame(lines, fmt.engine, fmt.kind, cols, clean=True)  # arrow's nulls: None
        try:
            if fin is None:
                fin = finalizer(fmt)
                fin.feed(rows_frame(*line_rows(fmt, parts)))
            df = fin.finish()
        except Exception as e:  # a finalize bug must stay visible, not fatal
            plan.error(int(parts[0][0][0]) if parts else 0, fmt, e)
            return None
        if not len(df):
            return None
        kind = df["kind"].to_numpy(object) if "kind" in df else fmt.kind
        types = fmt.columns
        return Frame(df["line"].to_numpy(np.int64), fmt.engine, kind,
                     {c: _arrow_text(df[c]) if types.get(c) == "str" else df[c].to_numpy()
                      for c in df.columns if c not in ("line", "kind", "engine")})
    types = {"timestamp": "str", "engine": "str", "kind": "str", **fmt.columns}
    batches = list(plan.block_parts[i])
    if plan.sinks[i].n:
        batches.append(plan.sinks[i].batch(types))
    if not batches:
        return None
    lines = np.concatenate([b.lines for b in batches]).astype(np.int64, copy=False)
    types = {"timestamp": "str", **fmt.columns}
    cols = {}
    for c, typ in types.items():
        if not any(c in b.columns for b in batches):  # noqa: SIM110
            continue
        if typ == "float":
            cols[c] = np.concatenate([b.columns[c] if c in b.columns else np.full(len(b.lines), np.nan)
                                      for b in batches])
        else:
            pieces = [b.columns.get(c) for b in batches]
            text = _text(pieces, [len(b.lines) for b in batches]) if typ == "str" else None
            if text is not None:
                cols[c] = text
                continue
            cols[c] = np.concatenate([_objects(v) if v is not None else np.empty(len(b.lines), object)
                                      for v, b in zip(pieces, batches, strict=True)])
    engine = _or([b.columns.get("engine") for b in batches], batches, fmt.engine)
    kind = _or([b.columns.get("kind") for b in batches], batches, fmt.kind)
    if len(batches) > 1:  # batches of the Python function and of the vectorised reader: in line order
        order = np.argsort(lines, kind="stable")
        if (np.diff(order) != 1).any():
            lines = lines[order]
            engine, kind = (v if isinstance(v, str) else v[order] for v in (engine, kind))
            cols = {c: v.take(pa.array(order)) if isinstance(v, pa.ChunkedArray) else v[order] for c, v in cols.items()}
    return Frame(lines, engine, kind, cols)


def _arrow_text(col: pd.Series) -> np.ndarray | pa.ChunkedArray:
    """A finalize's text column: its arrow data where pandas holds it so (the `str` dtype, large_string: the table
    takes it as it is, where Python strings and back cost 0.3 us a value, measured), else numpy."""
    if isinstance(col.array, pd.arrays.ArrowStringArray):
        arr = col.array.__arrow_array__()
        if arr.type in (pa.string(), pa.large_string()):
            return arr
    return col.to_numpy()


def _objects(v: np.ndarray | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A column as numpy (arrow text as an object array of str and None)."""
    if isinstance(v, (pa.Array, pa.ChunkedArray)):
        return np.asarray(v.to_numpy(zero_copy_only=False), object)
    return v


def _text(pieces: list[np.ndarray | pa.Array | pa.ChunkedArray | None], sizes: list[int]) -> pa.ChunkedArray | None:
    """A text column from pieces one of which is arrow (a compiled reader's) as one arrow column (None for a piece
    without it); None where none is arrow, or a piece holds other values than text (the column stays object)."""
    arrow = [v for v in pieces if isinstance(v, (pa.Array, pa.ChunkedArray))]
    if not arrow:
        return None
    # a finalize's text (pandas') is large_string, the table's own type: kept so where a piece has it (_arrow_text)
    typ = pa.large_string() if any(v.type == pa.large_string() for v in arrow) else pa.string()
    chunks: list[pa.Array] = []
    for v, n in zip(pieces, sizes, strict=True):
        if v is None:
            chunks.append(pa.nulls(n, typ))
        elif isinstance(v, pa.ChunkedArray):
            chunks.extend(v.chunks if v.type == typ else v.cast(typ).chunks)
        elif isinstance(v, pa.Array):
            chunks.append(v if v.type == typ else v.cast(typ))
        else:
            try:
                chunks.append(pa.array(v, type=typ, from_pandas=True))
            except (pa.ArrowTypeError, pa.ArrowInvalid):
                return None
    return pa.chunked_array(chunks, typ)


def _or(parts: list[np.ndarray | pa.Array | None], batches: list[Batch], default: str) -> np.ndarray | str:
    """Per-record engine/kind where a record set one, else `default` (for every record: `default` itself)."""
    if all(p is None for p in parts):
        return default
    arr = np.concatenate([_objects(p) if p is not None else const(len(b.lines), None) for p, b in zip(parts, batches,
                                                                                                      strict=True)])
    arr[pd.isna(arr)] = default
    if len(arr) and isinstance(arr[0], str) and (arr == arr[0]).all():
        return str(arr[0])  # one for all (the kind tables need not split the rows)
    return arr


def table_schema(formats: list[Format]) -> dict[str, str]:
    """The table's columns after line, engine and kind: name -> type (a name two formats type differently is
    an object column)."""
    schema: dict[str, str] = {"timestamp": "str"}
    for f in sorted(formats, key=lambda f: ENGINE_ORDER.get(f.engine, len(ENGINE_ORDER))):
        for c, t in f.columns.items():
            schema[c] = t if schema.get(c, t) == t else "object"  # e.g. src: NCCL rank vs "GPU0"
    return schema


def kind_tables(plan: Plan, wanted: set[str] | None, read_error: str | None = None) -> LogTables:
    """Every format's rows as one table per (engine, kind) with that kind's columns alone (see
    :mod:`spectrial.logs.result`); each table's index is the record's row among all records (by line, stable)."""
    frames = _frames(plan, wanted)
    lines = np.concatenate([fr.lines for _, fr in frames]) if frames else np.zeros(0, np.int64)
    pos = np.empty(len(lines), np.int64)
    pos[np.argsort(lines, kind="stable")] = np.arange(len(lines))
    parts: dict[tuple[str, str], list[Part]] = {}
    a = 0
    for fmt, fr in frames:
        mine = pos[a:a + len(fr.lines)]
        a += len(fr.lines)
        for key, sel in _by_kind(fr):
            parts.setdefault(key, []).append(Part(fmt, fr, sel, mine if sel is None else mine[sel]))
    built = _two().map(lambda item: _kind_table(item[0][0], item[0][1], item[1]), parts.items())
    kinds = {f"{e}:{k}": t for (e, k), t in zip(parts, built, strict=True)}
    return LogTables(kinds, table_schema(plan.formats), plan.total,
                     max(plan.total - plan.blank - plan.recognised, 0),
                     [ParserError(*e) for e in plan.errors], read_error)


@dataclass
class Part:
    """A format's rows of one kind: the frame, which of its rows (None: all) and their rows among all records."""

    fmt: Format
    frame: Frame
    sel: np.ndarray | None
    pos: np.ndarray

    def column(self, name: str, typ: str) -> np.ndarray | pa.ChunkedArray:
        """The rows' values of column `name` (NaN / None where the frame lacks it), as the wide frame took them
        (a line format's text column: arrow)."""
        n = len(self.pos)
        vals = self.frame.cols.get(name)
        if vals is None:
            return np.full(n, np.nan) if typ == "float" else np.empty(n, object)
        if isinstance(vals, pa.ChunkedArray):
            return vals if self.sel is None else vals.take(pa.array(self.sel))
        if self.sel is not None:
            vals = vals[self.sel]
        if typ == "float":
            return vals if vals.dtype == np.float64 else pd.to_numeric(pd.Series(vals), errors="coerce").to_numpy(
                np.float64)
        if vals.dtype != object:
            return vals.astype(object)
        if typ not in ("list", "str") and not self.frame.clean:  # missing is None, never NaN (text: see _kind_table)
            vals = vals.copy()
            vals[pd.isna(vals)] = None
        return vals


_TWO: dict[int, ThreadPoolExecutor] = {}  # per process (a forked child has none of its parent's threads)


def _two() -> ThreadPoolExecutor:
    """Two threads that build the frames and the kinds' tables."""
    pid = os.getpid()
    if pid not in _TWO:
        _TWO.clear()
        _TWO[pid] = ThreadPoolExecutor(max_workers=2, thread_name_prefix="spectrial-tables")
    return _TWO[pid]


def _frames(plan: Plan, wanted: set[str] | None) -> list[tuple[Format, Frame]]:
    """Each format's rows (after its finalize), the kinds not `wanted` left out; formats without rows left out."""
    # a finalize (Python over the whole input, e.g. llama.cpp's merge) runs in the worker meanwhile
    later = {i: pool().submit(frame, plan, i) for i, f in enumerate(plan.formats)
             if isinstance(f, LineFormat) and f.finalize is not None and i not in plan.finalizers
             and sum(len(p[0]) for p in plan.line_parts[i]) >= THREAD_ROWS}
    # formats fed to a finalizer part by part come first: a parallel parse's helper process may still be merging
    # (its finish waits for it in one thread), and the other formats' frames are built meanwhile in the other
    here = sorted((i for i in range(len(plan.formats)) if i not in later), key=lambda i: i not in plan.finalizers)
    done = dict(zip(here, _two().map(lambda i: frame(plan, i), here), strict=True))  # two at once (numpy and arrow
    # copy without the GIL: the machine's other CPU, idle now that the reading is done, takes half)
    done.update({i: f.result() for i, f in later.items()})
    out: list[tuple[Format, Frame]] = []
    for i, fmt in enumerate(plan.formats):
        fr = done[i]
        if fr is None or not len(fr.lines):
            continue
        if wanted is not None:
            keep = np.array([wants(wanted, e, k) for e, k in zip(fr.per_row(fr.engine), fr.per_row(fr.kind),
                                                                   strict=True)], dtype=bool)
            fr = fr.subset(keep)
        if len(fr.lines):
            out.append((fmt, fr))
    return out


def _by_kind(fr: Frame) -> list[tuple[tuple[str, str], np.ndarray | None]]:
    """The frame's rows per (engine, kind), in order of first appearance (None: all its rows)."""
    if isinstance(fr.engine, str) and isinstance(fr.kind, str):
        return [((fr.engine, fr.kind), None)]
    ecode, engines = pd.factorize(fr.per_row(fr.engine))
    kcode, kinds = pd.factorize(fr.per_row(fr.kind))
    code = ecode.astype(np.int64) * (len(kinds) + 1) + kcode
    uniq, first = np.unique(code, return_index=True)
    if len(uniq) == 1:
        return [((str(engines[ecode[0]]), str(kinds[kcode[0]])), None)]
    return [((str(engines[ecode[j]]), str(kinds[kcode[j]])), np.flatnonzero(code == c))
            for c, j in sorted(zip(uniq.tolist(), first.tolist(), strict=True), key=lambda cj: cj[1])]


def _kind_table(engine: str, kind: str, parts: list[Part]) -> KindTable:
    """One kind's table from its parts (several formats, or one format's rows of several kinds)."""
    types: dict[str, str] = {"timestamp": "str"}
    for p in parts:
        for c, t in p.fmt.columns_of(kind).items():
            types[c] = t if types.get(c, t) == t else "object"
    pos = parts[0].pos if len(parts) == 1 else np.concatenate([p.pos for p in parts])
    order = None if len(parts) == 1 or (np.diff(pos) > 0).all() else np.argsort(pos, kind="stable")

    def gather(pieces: list[np.ndarray | pa.ChunkedArray], typ: str) -> np.ndarray | pa.ChunkedArray:
        if any(isinstance(p, pa.ChunkedArray) for p in pieces):
            if len(pieces) > 1 and typ == "str":  # text of several formats: arrow where each piece is text
                text = _text(pieces, [len(p) for p in pieces])  # type: ignore[arg-type]
                pieces = [text] if text is not None else pieces
            if len(pieces) == 1:
                return pieces[0] if order is None else pieces[0].take(pa.array(order))
            pieces = [p.to_numpy() if isinstance(p, pa.ChunkedArray) else p for p in pieces]  # with numpy ones
        arr = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return arr if order is None else arr[order]

    cols: dict[str, object] = {"line": gather([p.frame.lines if p.sel is None else p.frame.lines[p.sel]
                                              for p in parts], "int")}
    for c, t in types.items():
        col = typed_column(gather([p.column(c, t) for p in parts], t), t)
        if t == "str" and isinstance(col, np.ndarray) and col.dtype == object:  # text with other values: an object
            col = col.copy()  # column, missing as None (never NaN); where it is all text, arrow's nulls already
            col[pd.isna(col)] = None
        cols[c] = col
    index = pd.Index(pos if order is None else pos[order], name="record")
    return KindTable(engine, kind, pd.DataFrame(cols, index=index, copy=False), types,
                     keeps_nan=all(p.frame.clean for p in parts))


SUMMARY_COLUMNS = ["engine", "kind", "dp_rank", "count", "metric", "n", "median"]


def summary(data: pd.DataFrame | LogTables, *, registry: Registry) -> pd.DataFrame:
    """Per engine and kind (and DP rank where several print): record count and median of key metrics, of the
    wide frame or of the tables per kind."""
    if isinstance(data, LogTables):
        kinds = [(t.engine, t.kind, t.frame) for t in sorted(data.kinds.values(), key=lambda t: t.frame.index[0])]
    else:
        kinds = [(str(e), str(k), g) for (e, k), g in data.groupby(["engine", "kind"], sort=False, observed=True)]
    rows: list[tuple[str, str, float | None, int, str | None, int, float]] = []
    for engine, kind, g in kinds:
        metrics = [m for m in registry.key_metrics(engine, kind) if m in g]
        groups: list[tuple[float | None, pd.DataFrame]] = [(None, g)]
        if "dp_rank" in g and g["dp_rank"].nunique() > 1:
            groups = list(g.groupby("dp_rank", sort=True))
        for rank, sub in groups:
            found = [(m, vals) for m in metrics if (vals := pd.to_numeric(sub[m], errors="coerce")).notna().any()]
            if not found:
                rows.append((engine, kind, rank, len(sub), None, 0, np.nan))
            for m, vals in found:
                rows.append((engine, kind, rank, len(sub), m, int(vals.notna().sum()), vals.median()))
    if not rows:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
