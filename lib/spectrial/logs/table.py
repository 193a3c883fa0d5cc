"""The records of every format into one DataFrame (schema: see :mod:`spectrial.logs.api`), and `summary`."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from spectrial.logs.columns import const, to_numpy
from spectrial.logs.driver import THREAD_ROWS, Plan, pool
from spectrial.logs.formats import LineFormat, finalizer
from spectrial.logs.registry import Registry, wants

ENGINE_ORDER = {e: i for i, e in enumerate(("sglang", "vllm", "llamacpp", "profile", "nccl", "nvidia-smi", "http"))}


@dataclass
class Frame:
    """The rows one format found: line numbers, engine and kind per row (or one for all), typed columns.
    `clean`: its object columns hold None where a value is missing (never NaN)."""

    lines: np.ndarray
    engine: np.ndarray | str
    kind: np.ndarray | str
    cols: dict[str, np.ndarray]
    clean: bool = False

    def subset(self, keep: np.ndarray) -> Frame:
        """The rows where `keep` holds."""
        return Frame(self.lines[keep], *(v if isinstance(v, str) else v[keep] for v in (self.engine, self.kind)),
                     {c: v[keep] for c, v in self.cols.items()}, self.clean)

    def per_row(self, value: np.ndarray | str) -> np.ndarray:
        """Engine or kind as one value per row."""
        return const(len(self.lines), value) if isinstance(value, str) else value


def numpy_part(fmt: LineFormat, part: tuple[np.ndarray, dict[str, Any]]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A line format's records from one chunk as numpy columns, as the DataFrame holds them."""
    lines, cols = part
    types = fmt.pattern_columns
    return lines, {c: to_numpy(v, types[c]) if isinstance(v, pa.Array) else v for c, v in cols.items()}


def line_rows(fmt: LineFormat, parts: list[tuple[np.ndarray, dict[str, Any]]]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The records of `parts` together: line numbers and a column for each pattern column one of them holds
    (NaN / None in the parts without it)."""
    parts = [numpy_part(fmt, p) for p in parts]
    lines = np.concatenate([p[0] for p in parts]).astype(np.int64) if parts else np.zeros(0, np.int64)
    cols: dict[str, np.ndarray] = {}
    for c, typ in fmt.pattern_columns.items():
        if any(c in p[1] for p in parts):  # a chunk without the column contributes NaN / None
            cols[c] = np.concatenate([p[1][c] if c in p[1] else
                                      (np.full(len(p[0]), np.nan) if typ == "float" else const(len(p[0]), None))
                                      for p in parts])
    return lines, cols


def rows_frame(lines: np.ndarray, cols: dict[str, np.ndarray]) -> pd.DataFrame:
    """Line numbers and columns as the DataFrame a finalize reads."""
    return pd.DataFrame({"line": lines, **{c: pd.Series(v, dtype=object if v.dtype == object else None, copy=False)
                                          for c, v in cols.items()}})


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
        return Frame(df["line"].to_numpy(np.int64), fmt.engine, kind,
                     {c: df[c].to_numpy() for c in df.columns if c not in ("line", "kind", "engine")})
    types = {"timestamp": "str", "engine": "str", "kind": "str", **fmt.columns}
    batches = list(plan.block_parts[i])
    if plan.sinks[i].n:
        batches.append(plan.sinks[i].batch(types))
    if not batches:
        return None
    lines = np.concatenate([b.lines for b in batches]).astype(np.int64)
    types = {"timestamp": "str", **fmt.columns}
    cols = {}
    for c, typ in types.items():
        if not any(c in b.columns for b in batches):  # noqa: SIM110
            continue
        if typ == "float":
            cols[c] = np.concatenate([b.columns[c] if c in b.columns else np.full(len(b.lines), np.nan)
                                      for b in batches])
        else:
            cols[c] = np.concatenate([b.columns[c] if c in b.columns else np.empty(len(b.lines), object)
                                      for b in batches])
    engine = _or([b.columns.get("engine") for b in batches], batches, fmt.engine)
    kind = _or([b.columns.get("kind") for b in batches], batches, fmt.kind)
    if len(batches) > 1:  # batches of the Python function and of the vectorised reader: in line order
        order = np.argsort(lines, kind="stable")
        if (np.diff(order) != 1).any():
            lines, engine, kind = lines[order], engine[order], kind[order]
            cols = {c: v[order] for c, v in cols.items()}
    return Frame(lines, engine, kind, cols)


def _or(parts: list[np.ndarray | None], batches: list[Any], default: str) -> np.ndarray:
    """Per-record engine/kind where a record set one, else `default`."""
    n = sum(len(b.lines) for b in batches)
    if all(p is None for p in parts):
        return const(n, default)
    arr = np.concatenate([p if p is not None else const(len(b.lines), None) for p, b in zip(parts, batches,
                                                                                            strict=True)])
    arr[pd.isna(arr)] = default
    return arr


def table_schema(formats: list[Any]) -> dict[str, str]:
    """The table's columns after line, engine and kind: name -> type (a name two formats type differently is
    an object column)."""
    schema: dict[str, str] = {"timestamp": "str"}
    for f in sorted(formats, key=lambda f: ENGINE_ORDER.get(f.engine, len(ENGINE_ORDER))):
        for c, t in f.columns.items():
            schema[c] = t if schema.get(c, t) == t else "object"  # e.g. src: NCCL rank vs "GPU0"
    return schema


def assemble(plan: Plan, wanted: set[str] | None) -> pd.DataFrame:
    """One DataFrame of every format's rows, sorted by line (stable), with the full schema."""
    schema = table_schema(plan.formats)
    frames: list[Frame] = []
    # a finalize (Python over the whole input, e.g. llama.cpp's merge) runs in the worker meanwhile
    later = {i: pool().submit(frame, plan, i) for i, f in enumerate(plan.formats)
             if isinstance(f, LineFormat) and f.finalize is not None and i not in plan.finalizers
             and sum(len(p[0]) for p in plan.line_parts[i]) >= THREAD_ROWS}
    done = {i: frame(plan, i) for i in range(len(plan.formats)) if i not in later}
    done.update({i: f.result() for i, f in later.items()})
    for i in range(len(plan.formats)):
        fr = done[i]
        if fr is None or not len(fr.lines):
            continue
        if wanted is not None:
            keep = np.array([wants(wanted, e, k) for e, k in zip(fr.per_row(fr.engine), fr.per_row(fr.kind),
                                                                   strict=True)], dtype=bool)
            fr = fr.subset(keep)
        if len(fr.lines):
            frames.append(fr)
    n = sum(len(fr.lines) for fr in frames)
    lines = np.concatenate([fr.lines for fr in frames]) if frames else np.zeros(0, np.int64)
    order = np.argsort(lines, kind="stable")
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    starts = np.cumsum([0] + [len(fr.lines) for fr in frames])
    # two 2D blocks (floats, objects) filled column by column: no per-column pandas overhead, no copies
    fcols = [c for c, t in schema.items() if t == "float"]
    ocols = ["engine", "kind", *(c for c, t in schema.items() if t != "float")]
    fblock, oblock = _blocks(len(fcols), len(ocols), n)
    for fr, a in zip(frames, starts[:-1], strict=True):
        where = pos[a:a + len(fr.lines)]
        oblock[0, where] = fr.engine
        oblock[1, where] = fr.kind
    for j, col in enumerate(fcols):
        for fr, a in zip(frames, starts[:-1], strict=True):
            vals = fr.cols.get(col)
            if vals is not None:
                if vals.dtype != np.float64:
                    vals = pd.to_numeric(pd.Series(vals), errors="coerce").to_numpy(np.float64)
                fblock[j, pos[a:a + len(vals)]] = vals
    for j, col in enumerate(ocols[2:], start=2):
        for fr, a in zip(frames, starts[:-1], strict=True):
            vals = fr.cols.get(col)
            if vals is None:
                continue
            vals = vals.astype(object) if vals.dtype != object else vals.copy()
            if schema[col] != "list" and not fr.clean:
                vals[pd.isna(vals)] = None
            oblock[j, pos[a:a + len(vals)]] = vals
    df = pd.concat([pd.DataFrame({"line": lines[order]}),
                    pd.DataFrame(oblock.T, columns=ocols, dtype=object, copy=False),
                    pd.DataFrame(fblock.T, columns=fcols, copy=False)], axis=1)
    df.attrs["lines"] = plan.total
    df.attrs["unparsed_lines"] = max(plan.total - plan.blank - plan.recognised, 0)
    df.attrs["parser_errors"] = list(plan.errors)
    return df


def _blocks(nf: int, no: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The float block (NaN) and the object block (None) of the table. A big float block is filled by several
    threads (up to one per CPU, at most 8): new memory is mostly page faults, which numpy's fill takes without
    the GIL."""
    fblock = np.empty((nf, n))
    threads = min(cpus(), 8, max(nf * n // (2 * THREAD_ROWS * 1000), 1), max(nf, 1))
    if threads > 1:
        cuts = np.linspace(0, nf, threads + 1).astype(int)
        with ThreadPoolExecutor(threads - 1, thread_name_prefix="spectrial-fill") as ex:
            later = [ex.submit(fblock[a:b].fill, np.nan) for a, b in zip(cuts[1:-1], cuts[2:], strict=True)]
            fblock[:cuts[1]].fill(np.nan)
            for f in later:
                f.result()
    else:
        fblock.fill(np.nan)
    return fblock, np.empty((no, n), object)  # numpy fills object arrays with None


def cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def summary(df: pd.DataFrame, *, registry: Registry) -> pd.DataFrame:
    """Per engine and kind (and DP rank where several print): record count and median of key metrics."""
    rows: list[dict[str, Any]] = []
    if df.empty:
        return pd.DataFrame(columns=["engine", "kind", "dp_rank", "count", "metric", "n", "median"])
    for (engine, kind), g in df.groupby(["engine", "kind"], sort=False, observed=True):
        metrics = [m for m in registry.key_metrics(str(engine), str(kind)) if m in g]
        groups: list[tuple[Any, pd.DataFrame]] = [(None, g)]
        if "dp_rank" in g and g["dp_rank"].nunique() > 1:
            groups = list(g.groupby("dp_rank", sort=True))
        for rank, sub in groups:
            base = {"engine": engine, "kind": kind, "dp_rank": rank, "count": len(sub)}
            found = [(m, vals) for m in metrics if (vals := pd.to_numeric(sub[m], errors="coerce")).notna().any()]
            if not found:
                rows.append({**base, "metric": None, "n": 0, "median": np.nan})
            for m, vals in found:
                rows.append({**base, "metric": m, "n": int(vals.notna().sum()), "median": vals.median()})
    return pd.DataFrame(rows)
