"""What a parse gives: :class:`LogTables`, one pandas DataFrame per record kind, and the wide frame on request.

Each kind's table (key ``"engine:kind"``, e.g. ``"sglang:decode"``) holds the columns ``line`` (1-based line of
the record's first line, int64) and ``timestamp`` (as printed; pandas' ``str`` dtype, NaN where none), then the
kind's own columns and no other: ``float`` columns float64 (NaN where absent), ``str`` columns pandas' ``str``
dtype (arrow-backed), ``bool`` columns pandas' nullable ``boolean``, ``list`` and ``object`` columns Python
objects (None where absent). Its index is the record's position among all the log's records (in line order,
every kind together): the row it takes in :meth:`LogTables.wide`, so that kinds can be interleaved again.

:meth:`LogTables.wide` builds the one table of every kind that ``spectrial.logs.parse`` returns (the schema of
:mod:`spectrial.logs.api`): one row per record, a column for every column of every format, object columns with
None where a record lacks a value.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa

FIRST = ("line", "timestamp")  # the columns every kind's table starts with
STR = pd.StringDtype("pyarrow", na_value=np.nan)  # pandas' default `str` dtype


class ParserError(NamedTuple):
    """A format that failed on a record (a bug in spectrial.logs, reported and never raised)."""

    line: int
    format: str  # "engine/kind"
    error: str  # "ExceptionClass: message"


@dataclass(frozen=True)
class KindTable:
    """One kind's records: the table and each column's declared type (``float``, ``str``, ``bool``, ``list``,
    ``object``). `keeps_nan`: its float columns keep NaN (rather than None) where the wide frame holds them as
    objects (records read by regexes alone, as the wide frame always had them)."""

    engine: str
    kind: str
    frame: pd.DataFrame
    types: dict[str, str]
    keeps_nan: bool = False


@dataclass(frozen=True, eq=False, repr=False)
class LogTables(Mapping[str, pd.DataFrame]):
    """The records of a log, one DataFrame per kind (see the module docstring for the columns).

    A mapping ``"engine:kind" -> DataFrame`` in the registry's order; ``tables["decode"]`` (a kind alone) works
    where one engine has that kind. `lines`: lines read; `unparsed_lines`: non-blank lines no format recognised;
    `parser_errors`: at most 20 :class:`ParserError`; `read_error`: why the input stopped early (a cut .gz), or
    None. `wide_columns`: the wide frame's columns after line, engine and kind (name -> type).
    """

    kinds: dict[str, KindTable]
    wide_columns: dict[str, str]
    lines: int = 0
    unparsed_lines: int = 0
    parser_errors: list[ParserError] = field(default_factory=list)
    read_error: str | None = None

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {t.frame.shape[0]}x{t.frame.shape[1]}" for k, t in self.kinds.items())
        return f"LogTables({shapes}; {self.lines} lines, {self.unparsed_lines} unparsed)"

    # ------------------------------------------------------------ the mapping
    def __getitem__(self, key: str) -> pd.DataFrame:
        return self.table(key).frame

    def __iter__(self) -> Iterator[str]:
        return iter(self.kinds)

    def __len__(self) -> int:
        return len(self.kinds)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._key(key) is not None

    def table(self, key: str) -> KindTable:
        """The :class:`KindTable` of ``"engine:kind"`` (or of a kind alone, where one engine has it)."""
        found = self._key(key)
        if found is None:
            same = [k for k in self.kinds if k.split(":", 1)[1] == key]
            hint = (f"{key!r} is printed by several engines: use one of {same}" if same else
                    f"no records of {key!r}; kinds found: {list(self.kinds)}")
            raise KeyError(hint)
        return self.kinds[found]

    def _key(self, key: str) -> str | None:
        if key in self.kinds:
            return key
        same = [k for k, t in self.kinds.items() if t.kind == key]
        return same[0] if len(same) == 1 else None

    # ------------------------------------------------------------ figures
    @property
    def records(self) -> int:
        """Records of every kind."""
        return sum(len(t.frame) for t in self.kinds.values())

    def memory_bytes(self) -> int:
        """The tables' memory: ``DataFrame.memory_usage(deep=True)`` summed over every kind (index included)."""
        return int(sum(t.frame.memory_usage(deep=True).sum() for t in self.kinds.values()))

    def counts(self) -> dict[str, int]:
        """Records per ``"engine:kind"``."""
        return {k: len(t.frame) for k, t in self.kinds.items()}

    # ------------------------------------------------------------ the wide frame
    def wide(self) -> pd.DataFrame:
        """Every record in one DataFrame, in line order: line, engine, kind, then every column of every format
        (the schema of :func:`spectrial.logs.parse`); ``attrs`` hold lines, unparsed_lines, parser_errors and
        read_error."""
        n = self.records
        fcols = [c for c, t in self.wide_columns.items() if t == "float"]
        ocols = ["engine", "kind", *(c for c, t in self.wide_columns.items() if t != "float")]
        fblock = np.full((len(fcols), n), np.nan)
        oblock = np.empty((len(ocols), n), object)  # None throughout
        lines = np.zeros(n, np.int64)
        frow = {c: j for j, c in enumerate(fcols)}
        orow = {c: j for j, c in enumerate(ocols)}
        for t in self.kinds.values():
            where = t.frame.index.to_numpy()
            lines[where] = t.frame["line"].to_numpy()
            oblock[0, where] = t.engine
            oblock[1, where] = t.kind
            for c in t.frame.columns[1:]:
                col = t.frame[c]
                if c in frow:
                    fblock[frow[c], where] = col.to_numpy(np.float64)
                elif t.types.get(c, "str") == "float":  # a float column that another format types otherwise
                    vals = col.to_numpy(np.float64).astype(object)
                    if not t.keeps_nan:
                        vals[np.isnan(col.to_numpy(np.float64))] = None
                    oblock[orow[c], where] = vals
                elif col.dtype == object:
                    oblock[orow[c], where] = col.to_numpy()
                else:
                    oblock[orow[c], where] = col.to_numpy(dtype=object, na_value=None)
        df = pd.concat([pd.DataFrame({"line": lines}),
                        pd.DataFrame(oblock.T, columns=ocols, dtype=object, copy=False),
                        pd.DataFrame(fblock.T, columns=fcols, copy=False)], axis=1)
        df.attrs.update(lines=self.lines, unparsed_lines=self.unparsed_lines,
                        parser_errors=[tuple(e) for e in self.parser_errors], read_error=self.read_error)
        return df


def typed_column(vals: np.ndarray | pa.ChunkedArray, typ: str) -> pd.api.extensions.ExtensionArray | np.ndarray:
    """A column of `typ` as a kind's table holds it (see the module docstring); values that do not fit the
    type (a str column holding a number) keep an object column. Arrow text is taken as it is."""
    if isinstance(vals, pa.ChunkedArray):
        return pd.arrays.ArrowStringArray(vals, dtype=STR)
    if typ == "float":
        return vals if vals.dtype == np.float64 else pd.to_numeric(pd.Series(vals), errors="coerce").to_numpy(np.float64)
    if typ == "str":
        try:
            arr = pa.array(vals, type=pa.large_string(), from_pandas=True)  # pandas keeps text so
        except (pa.ArrowTypeError, pa.ArrowInvalid):
            return vals
        return pd.arrays.ArrowStringArray(arr, dtype=STR)
    if typ == "bool":
        return pd.array(vals, dtype="boolean") if _only(vals, bool) else vals
    return vals


def _only(vals: np.ndarray, kind: type) -> bool:
    """Whether every value is of `kind` or missing (None / NaN)."""
    if vals.dtype != object:
        return False
    present = vals[~pd.isna(vals)]
    return all(type(v) is kind for v in present.tolist()) if len(present) < 64 else bool(
        pd.Series(present).map(type).eq(kind).all())
