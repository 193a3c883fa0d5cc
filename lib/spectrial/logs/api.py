"""`parse_tables`, `parse` and `summary`: server logs into pandas DataFrames.

:func:`parse_tables` gives one table per record kind, each with its kind's columns alone
(:class:`~spectrial.logs.result.LogTables`; the columns and dtypes: :mod:`spectrial.logs.result`).
:func:`parse` gives the wide frame, every kind in one table (``parse_tables(...).wide()``).

Output schema of :func:`parse` (one row per recognised record, in input order):

- ``line``: 1-based line of the record's first line; ``engine``: "sglang", "vllm", "llamacpp",
  "profile", "nccl", "nvidia-smi" or "http" (uvicorn access lines); ``kind``; ``timestamp``: as printed,
  or None.
- then every column of every selected format, NaN (numbers) or None where a record lacks it.
  Units are in the names: ``_ms``, ``_s``, ``_gb``, ``_mib``, ``_w``, ``_c``, ``_mhz``; ``_pct`` is 0..100;
  ``*_rate`` and ``*_usage`` are fractions 0..1 (converted from percent where a log prints ``%``);
  throughputs are tokens per second. Exceptions, as the tools print them: bench_serving's
  ``request_rate`` and ``request_throughput`` are requests per second; results_table's ``latency`` keeps
  the table's own unit; ``system_efficiency`` (vLLM V0) is a fraction.
- ``df.attrs``: ``lines`` (lines read), ``unparsed_lines`` (non-blank lines that no format recognised),
  ``parser_errors`` (at most 20 ``(line, format, error)`` tuples; a bug, never a crash), ``read_error``.

How it is fast: the input is read in blocks of whole lines (16 MiB); each block is one arrow string array
over its bytes. One Aho-Corasick pass over the bytes (ahocorasick_rs; else an RE2 union) finds each line's
leftmost marker and so its format. Block formats (tables, benchmark blocks, dumps) are read first, in line
order, each by its vectorised reader over all its marker lines at once (their lines walked and split with
arrow kernels; the format's Python function reads what the reader declines). Meanwhile, in a worker
thread, each line format extracts its columns from its lines with one RE2 pass per pattern (pyarrow
``extract_regex``, which releases the GIL) and one ``key: value`` split; rows inside a block are dropped.
Records stay columns (text as arrow) and become, at the end, one table per kind with its own columns; the
wide frame puts them into two 2D blocks (floats, objects). During a parse the cyclic GC and numpy's
huge-page hint are off (see :func:`madvise_hugepage`). A plain file of 64 MiB and more is read in segments
by worker processes, one per CPU, and joined into the same tables (:mod:`spectrial.logs.parallel`).
Details: docs/LOGS.md.
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Iterable
from functools import cached_property
from typing import Any

import pandas as pd

from spectrial.errors import ConfigError
from spectrial.logs import parallel
from spectrial.logs.driver import Plan
from spectrial.logs.registry import Registry, registry
from spectrial.logs.result import LogTables
from spectrial.logs.source import Source, line_blocks, raw_blocks
from spectrial.logs.table import kind_tables
from spectrial.logs.table import summary as _summary

DEFAULT_BLOCK_BYTES = 16 << 20


def parse_tables(source: Source, kinds: str | Iterable[str] | None = None, *, registry: Registry | None = None,
                 block_bytes: int = DEFAULT_BLOCK_BYTES, workers: int | None = None) -> LogTables:
    """Parse server logs into one table per record kind (:class:`~spectrial.logs.result.LogTables`).

    `source`: a path (plain or gzip), log text, bytes, a binary/text file object, or an iterable of
    lines. `kinds`: keep only these kinds or engines (e.g. "decode", "nccl", "llamacpp:request_timing").
    `registry`: the formats to use (default: all registered). `block_bytes`: how much is read at once.
    `workers`: processes reading a large plain file at once (None: one per CPU for files of 64 MiB and more;
    1: this process alone); the tables are the same either way (:mod:`spectrial.logs.parallel`).
    Unrecognised, truncated or binary lines are counted in ``unparsed_lines``, never fatal.
    """
    reg = registry if registry is not None else _DEFAULT
    wanted = None if kinds is None else ({kinds} if isinstance(kinds, str) else set(kinds))
    plan = Plan(reg.select(kinds))
    if block_bytes < 1:
        raise ConfigError(f"block_bytes: must be positive, got {block_bytes}")
    many = parallel.workers_for(source, workers)
    errors: list[str] = []
    blocks = line_blocks(raw_blocks(source, block_bytes, errors), block_bytes)
    huge = madvise_hugepage(False)
    collect = gc.isenabled()
    gc.disable()  # parse makes many objects and no cycles: the cyclic GC would only rescan them
    try:
        if many is not None:
            parallel.read(plan, many[0], many[1], block_bytes)
        else:
            plan.feed(blocks)
        return kind_tables(plan, wanted, errors[0] if errors else None)
    finally:
        parallel.close(plan)
        if collect:
            gc.enable()
        if huge is not None:
            madvise_hugepage(huge)


def parse(source: Source, kinds: str | Iterable[str] | None = None, *, registry: Registry | None = None,
          block_bytes: int = DEFAULT_BLOCK_BYTES, workers: int | None = None) -> pd.DataFrame:
    """Parse server logs into one wide DataFrame, every kind together (schema: see the module docstring):
    ``parse_tables(...).wide()``, for code that filters one table by ``kind``. The arguments are
    :func:`parse_tables`'s; a big log is lighter and faster read as :func:`parse_tables`."""
    tables = parse_tables(source, kinds, registry=registry, block_bytes=block_bytes, workers=workers)
    huge = madvise_hugepage(False)  # the wide frame's columns are written once (see madvise_hugepage)
    try:
        return tables.wide()
    finally:
        if huge is not None:
            madvise_hugepage(huge)


def summary(df: pd.DataFrame | LogTables, *, registry: Registry | None = None) -> pd.DataFrame:
    """Per engine and kind (and DP rank where several print): record count and median of key metrics, of a
    wide frame (:func:`parse`) or of the tables of :func:`parse_tables`.

    Long format: one row per (engine, kind[, dp_rank], metric) with `count` (records), `n` (records
    with that metric) and `median`; metrics no record printed are left out, and a kind without any
    gets one row with metric None.
    """
    return _summary(df, registry=registry if registry is not None else _DEFAULT)


def madvise_hugepage(enabled: bool) -> bool | None:
    """Switch numpy's transparent-huge-page hint for new arrays; returns the previous setting (None where
    this numpy has no switch). parse turns it off: the table's columns are written once, and on virtual
    machines that back guest memory lazily a huge page costs several times the 4 KiB pages it replaces
    (measured: 1 GB of new float64 columns 1.8-2.6 s with the hint, 0.6-0.8 s without)."""
    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            module = importlib.import_module(name)
            return bool(module._set_madvise_hugepage(enabled))
        except (ImportError, AttributeError):
            continue
    return None  # pragma: no cover - every numpy >= 1.20 has the switch


_DEFAULT = registry


# --- one server's log, parsed once --------------------------------------------------------------------------
class ServerLog:
    """A server's log, read once per start and shared by every consumer (window statistics, drafting time, NCCL
    evidence, the log summary in the record, the notebooks' log table): its text, and its table parsed lazily,
    at most once (`window(first, last)`: the rows of the lines written during a benchmark window; lines are
    numbered from 1)."""

    def __init__(self, text: str) -> None:
        self.text = text

    @cached_property
    def table(self) -> pd.DataFrame:
        return parse(self.text) if self.text else pd.DataFrame()

    def rows(self, kind: str | None = None, engine: str | None = None, first: int | None = None,
             last: int | None = None) -> pd.DataFrame:
        """Parsed rows of `kind` / `engine` whose line number lies in [first, last] (bounds optional)."""
        df = self.table
        if df.empty or "kind" not in df:
            return df
        mask = pd.Series(True, index=df.index)
        if kind is not None:
            mask &= df["kind"] == kind
        if engine is not None and "engine" in df:
            mask &= df["engine"] == engine
        if first is not None:
            mask &= df["line"] >= first
        if last is not None:
            mask &= df["line"] <= last
        return df[mask]

    def summary(self) -> dict[str, Any]:
        """What the parser found: records per kind and the medians of key metrics (the record's log_summary)."""
        df = self.table
        rows = summary(df).to_dict("records") if not df.empty else []
        return {"lines": df.attrs.get("lines"), "unparsed_lines": df.attrs.get("unparsed_lines"),
                "metrics": [{k: r.get(k) for k in ("engine", "kind", "metric", "n", "median")} for r in rows]}

    def contains(self, needle: str) -> list[tuple[int, str]]:
        """(line number, line) of every line containing `needle`."""
        return [(i, ln) for i, ln in enumerate(self.text.splitlines(), 1) if needle in ln]

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.text.splitlines()[-n:])
