"""The two kinds of format, and how to add one (the extension point of :mod:`spectrial.logs`).

**A record on one line** is a :class:`LineFormat`: data, not code. Marker strings select the lines; regexes
with named groups (RE2 syntax, run by pyarrow over all of a chunk's marker lines at once) and
``key: value`` lists fill the columns; `types` names their types::

    from spectrial.logs import LineFormat, registry
    registry.add(LineFormat("myengine", "step", markers=("step time:",),
                            patterns=(r"step time: (?P<step_ms>[0-9.]+) ms", r"phase=(?P<phase>\\w+)"),
                            types={"phase": "str"}))

**A record over several lines** (a table, a benchmark block, a dump) is a :class:`BlockFormat`: a Python
function `fn(window)` reads the lines from the marker line on (:class:`~spectrial.logs.chunks.Window`) and
returns the records and how many lines the block claims. That is all a new block format needs. For speed,
`vector(chunk, at)` may read all of a chunk's blocks of the format at once with column kernels
(:mod:`spectrial.logs.vector` walks the blocks' lines; :class:`Blocks` is its answer); the driver asks `fn` for any
block the vectorised reader declines or whose lines are not plain ASCII, and tests hold the two to the
same result.

**One function per line** (Python, no vectorisation): :meth:`Registry.register
<spectrial.logs.registry.Registry.register>`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

try:  # the regex parser (for the fixed text every match of a pattern holds)
    import re._constants as re_constants
    import re._parser as re_parser
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_constants as re_constants  # type: ignore[no-redef]
    import sre_parse as re_parser  # type: ignore[no-redef]

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spectrial.errors import ConfigError
from spectrial.logs.chunks import Chunk, Window
from spectrial.logs.columns import ARROW_TYPES, check_types, merge_captures, to_float
from spectrial.logs.pyrepr import PyValue  # noqa: F401  (named in Cell)
from spectrial.logs.text import TS_ISO, ahocorasick_rs

RESERVED = ("line", "engine", "kind", "timestamp")
Cell: TypeAlias = "float | str | bool | list[float] | dict[str, PyValue] | None"
"""One value of a record: a number, text, a flag, a list of numbers, a dump of arguments, or nothing."""
Record: TypeAlias = "dict[str, Cell]"
"""A record's fields (column -> value; may set ``kind``, ``engine``, ``timestamp``)."""
BlockResult = tuple[list[tuple[int, Record]], int]
"""What a block function returns: ``(records, consumed)``; records are ``(offset, fields)`` pairs."""


# ---------------------------------------------------------------- line formats
class Finalizer:
    """A `finalize` that reads a format's rows part by part: `feed` each part (a DataFrame sorted by line; the
    parts in line order), then `finish` gives all the rows, as the format's finalize function would for the
    rows at once. Subclass it and give the class as `finalize`."""

    def feed(self, df: pd.DataFrame) -> None:  # pragma: no cover - the interface
        raise NotImplementedError

    def finish(self) -> pd.DataFrame:  # pragma: no cover - the interface
        raise NotImplementedError


class _WholeInput(Finalizer):
    """A finalize function as a Finalizer: the parts are kept and given to it at once."""

    def __init__(self, fn: Callable[[pd.DataFrame], pd.DataFrame]) -> None:
        self.fn, self.parts = fn, []

    def feed(self, df: pd.DataFrame) -> None:
        self.parts.append(df)

    def finish(self) -> pd.DataFrame:
        return self.fn(self.parts[0] if len(self.parts) == 1 else pd.concat(self.parts, ignore_index=True))


def finalizer(fmt: LineFormat) -> Finalizer:
    """A new Finalizer for the format's `finalize` (a class is instantiated, a function wrapped)."""
    fin = fmt.finalize
    if isinstance(fin, type) and issubclass(fin, Finalizer):
        return fin()
    assert fin is not None
    return _WholeInput(fin)  # type: ignore[arg-type]


@dataclass(frozen=True, eq=False)
class LineFormat:
    """A record printed on one line, extracted by vectorised regexes and `key: value` lists.

    `markers`: fixed strings; a line belongs to the format whose marker comes first on it.
    `keys` maps the keys of a ``key: value, key: value`` list (SGLang and vLLM stats lines) to columns;
    the list is split, not searched, so fields may come in any order, be missing or be clipped (a key
    whose head was cut off, like ``token usaccept rate``, still finds ``accept rate``). Values keep their
    leading number; columns named in `percent` are divided by 100 where the value ends with ``%``.
    `patterns` are regexes (RE2 syntax, also valid Python `re`) whose named groups are columns; a group
    `X__pct` next to `X` divides X by 100 when it captured a ``%``. Patterns fill what `keys` left empty,
    the first that matches wins. `types` gives column types (default float; ``timestamp`` str). A line is a
    record when one of `require` (default: any column but `timestamp`) was found; ``require=()`` makes
    every marker line a record. `finalize` may merge or split the rows of the whole input (sorted by
    line) and set a `kind` column; `output` then names the columns it returns. It is a function of all the
    rows (a DataFrame) or a :class:`Finalizer` class, whose instances take the rows part by part, in line
    order, and give the same result (a parallel parse feeds it each segment's rows as they come).
    `rowwise`: the finalize function maps each row on its own, keeping every row (any part of the rows may be
    finalized alone: a parallel parse finalizes each segment in its worker). `kinds` lists the other kinds
    finalize makes; `kind_columns` names, per kind, the columns its records hold where a format makes several
    kinds (default: every kind holds every column); `key_metrics` are what :func:`~spectrial.logs.summary` reports.
    """

    engine: str
    kind: str
    markers: tuple[str, ...]
    patterns: tuple[str, ...] = ()
    types: Mapping[str, str] = field(default_factory=dict)
    require: tuple[str, ...] | None = None
    finalize: Callable[[pd.DataFrame], pd.DataFrame] | type[Finalizer] | None = None
    output: Mapping[str, str] | None = None
    kinds: tuple[str, ...] = ()
    key_metrics: tuple[str, ...] = ()
    keys: Mapping[str, str] = field(default_factory=dict)
    percent: tuple[str, ...] = ()
    rowwise: bool = False
    kind_columns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        groups: list[tuple[str, tuple[str, ...], str | None]] = []
        for p in self.patterns:
            try:
                names = tuple(re.compile(p).groupindex)
            except re.error as e:
                raise ConfigError(f"patterns: {p!r} of {self.engine}/{self.kind} is not a valid regex ({e})") from e
            if not names:
                raise ConfigError(f"patterns: {p!r} of {self.engine}/{self.kind} has no named group; "
                                  "name each captured column with (?P<column>...)")
            groups.append((p, names, required_literal(p)))
        object.__setattr__(self, "_groups", tuple(groups))
        literals = sorted({lit for _, _, lit in groups if lit is not None})
        object.__setattr__(self, "_literals", Literals(literals) if len(literals) >= Literals.MIN else None)
        cols: dict[str, str] = {}
        for c in self.keys.values():
            cols.setdefault(c, self.types.get(c, "float"))
        for _, names, _ in groups:
            for n in names:
                if not n.endswith("__pct"):
                    cols.setdefault(n, self.types.get(n, "str" if n == "timestamp" else "float"))
        object.__setattr__(self, "_pattern_columns", cols)
        key_list = list(self.keys)
        object.__setattr__(self, "_key_values", pa.array(key_list, pa.string()))
        key_cols = [self.keys[k] for k in key_list]
        object.__setattr__(self, "_key_cols", key_cols)
        object.__setattr__(self, "_key_col_of", np.array([key_cols.index(c) for c in key_cols] + [-1]))
        check_types(self.output or cols, f"{self.engine}/{self.kind}")
        check_kind_columns(self)
        bad = {c: t for c, t in cols.items() if c in self.keys.values() and t not in ("float", "bool", "str")}
        if bad:
            raise ConfigError(f"keys: {self.engine}/{self.kind} maps keys to {bad}; key columns must be "
                              "float, bool or str (use a pattern for lists)")

    @property
    def columns(self) -> dict[str, str]:
        """Output columns (name -> type), without the reserved ones."""
        cols = self.output if self.output is not None else self.pattern_columns
        return {k: v for k, v in cols.items() if k not in RESERVED}

    def columns_of(self, kind: str) -> dict[str, str]:
        """The columns of `kind`'s records (name -> type): those `kind_columns` names for it, else all."""
        return kind_columns_of(self, kind)

    @property
    def pattern_columns(self) -> dict[str, str]:
        """Columns the patterns and keys capture (name -> type), before `finalize`."""
        return self._pattern_columns  # type: ignore[attr-defined,no-any-return]

    def extract(self, lines: pa.Array) -> dict[str, pa.Array]:
        """Typed columns for `lines` (null where nothing was found)."""
        out: dict[str, pa.Array] = self._extract_keys(lines) if self.keys else {}
        types = self.pattern_columns
        n = len(lines)
        literals: Literals | None = self._literals  # type: ignore[attr-defined]
        present = literals.rows(lines) if literals is not None else None
        for pattern, names, literal in self._groups:  # type: ignore[attr-defined]
            # a pattern only fills what is still empty, and only matches lines holding its fixed text:
            # it runs on those lines alone (the others would keep what they have)
            cols = [c for c in names if not c.endswith("__pct")]
            need = None
            if all(c in out for c in cols):
                need = np.zeros(n, dtype=bool)
                for c in cols:
                    need |= pc.is_null(out[c]).to_numpy(zero_copy_only=False)
            if literal is not None:
                has = (present[literals.index[literal]] if present is not None and literals is not None
                       else pc.match_substring(lines, literal).to_numpy(zero_copy_only=False))
                need = has if need is None else need & has
            idx = np.flatnonzero(need) if need is not None else None
            if idx is not None and not len(idx):
                for c in cols:
                    if c not in out:
                        out[c] = pa.nulls(n, ARROW_TYPES.get(types[c], pa.string()))
                continue
            merge_captures(out, _search(lines, idx, n, pattern, names), types)
        return out

    def required(self, cols: Mapping[str, pa.Array], n: int) -> np.ndarray:
        """Boolean mask of the lines that are records."""
        names = self.require if self.require is not None else [c for c in cols if c != "timestamp"]
        if not names:
            return np.ones(n, dtype=bool)
        mask = np.zeros(n, dtype=bool)
        for c in names:
            if c in cols:
                mask |= pc.is_valid(cols[c]).to_numpy(zero_copy_only=False)
        return mask

    def _extract_keys(self, lines: pa.Array) -> dict[str, pa.Array]:
        n = len(lines)
        items = pc.split_pattern(lines, ", ")
        row = np.repeat(np.arange(n), np.diff(items.offsets.to_numpy(zero_copy_only=False)))
        # the key is the text between an item's last two ": " (or its start), the value what follows the last
        kv = pc.split_pattern(items.values, ": ")
        offs = kv.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        klen = np.diff(offs)
        ok = np.flatnonzero(klen >= 2)
        ends = offs[1:][ok]
        flat = kv.values
        row = row[ok]
        key = pc.utf8_trim_whitespace(flat.take(pa.array(ends - 2)))
        kid = pc.fill_null(pc.index_in(key, value_set=self._key_values), -1).to_numpy(  # type: ignore[attr-defined]
            zero_copy_only=False).copy()
        unknown = np.flatnonzero(kid < 0)
        if len(unknown):
            kid[unknown] = self._rescue_keys(key.take(pa.array(unknown)))
        col_of = self._key_col_of[kid]  # type: ignore[attr-defined]  # first key index of each column
        keep = np.flatnonzero(col_of >= 0)
        out: dict[str, pa.Array] = {}
        if not len(keep):
            return out
        cols = self._key_cols  # type: ignore[attr-defined]
        col_of, row = col_of[keep], row[keep]
        # one value per (line, column): the first occurrence in a line wins
        _, first = np.unique(row * (len(cols) + 1) + col_of, return_index=True)
        first.sort()
        keep, col_of, row = keep[first], col_of[first], row[first]
        token = _leading_token(flat.take(pa.array(ends[keep] - 1)))
        pct = pc.ends_with(token, "%").to_numpy(zero_copy_only=False)
        bare = pc.utf8_rtrim(token, characters="%")
        try:  # every value a number: one cast (else column by column, as to_float does)
            numeric: np.ndarray | None = pc.cast(bare, pa.float64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            numeric = None
        for ci in np.unique(col_of).tolist():
            name = cols[ci]
            sel = np.flatnonzero(col_of == ci)
            rows = row[sel]
            typ = self.types.get(name, "float")
            if typ == "float":
                f = numeric[sel] if numeric is not None else to_float(bare.take(pa.array(sel)))
                if name in self.percent:
                    f = np.where(pct[sel], f / 100.0, f)
                full = np.full(n, np.nan)
                full[rows] = f
                out[name] = pa.array(full, from_pandas=True)
            else:
                full_o = np.full(n, None, object)
                v = token.take(pa.array(sel)).to_numpy(zero_copy_only=False)
                full_o[rows] = (v == "True").tolist() if typ == "bool" else v
                out[name] = pa.array(full_o, type=pa.bool_() if typ == "bool" else pa.string())
        return out

    def _rescue_keys(self, keys: pa.Array) -> np.ndarray:
        """Key ids for keys not found as such: `Decode batch. #running-req` (a head glued on) and
        `token usaccept rate` (clipped mid-line) end with a known key."""
        kid = np.full(len(keys), -1)
        for i, k in enumerate(self._key_values.to_pylist()):  # type: ignore[attr-defined]
            hit = pc.ends_with(keys, k).to_numpy(zero_copy_only=False) & (kid < 0)
            kid[hit] = i
        return kid


class Literals:
    """The fixed texts of a format's patterns, searched for all at once: one Aho-Corasick pass over the
    lines' bytes instead of one arrow pass per text (from :data:`MIN` texts on, where that is faster)."""

    MIN = 6  # measured on 12k lines: 12 texts 4.9 ms vs 14.6 ms; 2-5 texts about even

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.index = {t: i for i, t in enumerate(texts)}
        encoded = [t.encode() for t in texts]
        # a text with a line break could match across two lines of the buffer: those go to arrow
        self.automaton = (ahocorasick_rs.BytesAhoCorasick(encoded) if ahocorasick_rs is not None
                          and not any(b"\n" in t for t in encoded) else None)

    def rows(self, lines: pa.Array) -> np.ndarray | None:
        """Per text, per line: whether the line holds it (a bool matrix); None where this cannot be answered
        so (no automaton, nulls, or a type other than string / large_string)."""
        if self.automaton is None or lines.null_count or not len(lines):
            return None
        if lines.type == pa.string():
            width = np.int32
        elif lines.type == pa.large_string():
            width = np.int64
        else:
            return None
        _, offsets, data = lines.buffers()
        offs = np.frombuffer(offsets, width, len(lines) + 1, lines.offset * np.dtype(width).itemsize)
        a, b = int(offs[0]), int(offs[-1])
        out = np.zeros((len(self.texts), len(lines)), dtype=bool)
        if data is None or b <= a:
            return out
        hits = self.automaton.find_matches_as_indexes(np.frombuffer(data, np.uint8)[a:b], overlapping=True)
        if hits:
            found = np.fromiter(itertools.chain.from_iterable(hits), np.int64, 3 * len(hits)).reshape(-1, 3)
            out[found[:, 0], np.searchsorted(offs, found[:, 1] + a, side="right") - 1] = True
        return out


def _search(lines: pa.Array, idx: np.ndarray | None, n: int, pattern: str, names: tuple[str, ...]
            ) -> dict[str, pa.Array]:
    """The named groups of `pattern`'s leftmost match in each of `lines` (only rows `idx` searched; the
    others null)."""
    sub = lines if idx is None or len(idx) == n else lines.take(pa.array(idx))
    fields = dict(zip(names, pc.extract_regex(sub, pattern=pattern).flatten(), strict=True))
    if sub is lines:
        return fields
    back = np.full(n, -1, dtype=np.int64)
    back[idx] = np.arange(len(idx))
    where = pa.array(back, mask=back < 0)
    return {k: v.take(where) for k, v in fields.items()}


def _leading_token(vals: pa.Array) -> pa.Array:
    """`0.0 tokens/s` -> `0.0`, `0.0%.` -> `0.0%` (first word, without a closing period)."""
    first = pc.list_element(pc.split_pattern(pc.utf8_trim_whitespace(vals), " ", max_splits=1), 0)
    return pc.utf8_rtrim(first, characters=".,;)")


def required_literal(pattern: str) -> str | None:
    """The longest run of plain characters (3 or more) that every match of `pattern` contains, or None:
    read off the top level of the parsed regex (and the groups there), where nothing is optional."""
    try:
        parsed = re_parser.parse(pattern)
    except re.error:  # pragma: no cover - LineFormat compiled it already
        return None
    if parsed.state.flags & (re.IGNORECASE | re.VERBOSE):
        return None
    best = run = ""

    def walk(items: Any) -> None:
        nonlocal best, run
        for op, av in items:
            if op is re_constants.LITERAL:
                run += chr(av)
                continue
            if op is re_constants.SUBPATTERN and not av[1] and not av[2]:  # a group without inline flags
                walk(av[3])
                continue
            best, run = max(best, run, key=len), ""

    walk(parsed)
    best = max(best, run, key=len)
    return best if len(best) >= 3 else None


# ---------------------------------------------------------------- block formats
DECLINE = 1  # Blocks.status: leave this block to the format's Python function
MORE = 2  # Blocks.status: the block runs past the chunk (the driver reads it with the next one)


@dataclass
class Blocks:
    """What a vectorised block reader found at its marker lines (`at`, local line indexes of a chunk).

    Per marker: `used` (lines the block claims from its marker line on; 0: no block there), `examined`
    (lines from the marker line on that the reader looked at: the driver checks they are plain), `status`
    (0, or :data:`DECLINE` / :data:`MORE`; None: all 0). Per record: `block` (index into `at`), `offset`
    (from the marker line) and `columns` (float64 with NaN, object with None, or for a text column an arrow
    string array with nulls; may hold ``engine``, ``kind``, ``timestamp``; a None timestamp is read off the
    record's line by the format's patterns).
    Records come in line order, several on one line in their order.
    """

    used: np.ndarray
    examined: np.ndarray
    block: np.ndarray
    offset: np.ndarray
    columns: Mapping[str, np.ndarray | pa.Array]
    status: np.ndarray | None = None

    @staticmethod
    def none(count: int) -> Blocks:
        """No block at any of `count` markers."""
        z = np.zeros(count, np.int64)
        return Blocks(z, np.ones(count, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), {})


VectorBlock = Callable[[Chunk, np.ndarray], Blocks]


@dataclass(frozen=True, eq=False)
class BlockFormat:
    """Records read by a Python function from a marker line and the lines after (or before) it.

    `fn(window)` returns ``(records, consumed)``: records are ``(offset, fields)`` pairs (offset from the
    marker line; fields may set `kind`, `engine`, `timestamp`) and `consumed` is how many lines from the
    marker line on belong to the block (they are not offered to other formats). Records without a
    timestamp get the one `timestamps` (regexes with a ``timestamp`` group) find on their line.

    `vector(chunk, at)` is an optional second reader of the same records, for speed: all of a chunk's
    marker lines of this format at once, with column kernels (see :mod:`spectrial.logs.vector`), answering
    :class:`Blocks`. It must give what `fn` gives wherever it answers; the driver offers it only blocks
    whose lines (from `lookback` lines above the marker to the last line it examined) are plain ASCII,
    and asks `fn` otherwise (tests compare the two on every fixture).
    """

    engine: str
    kind: str
    markers: tuple[str, ...]
    fn: Callable[[Window], BlockResult]
    columns: Mapping[str, str]
    kinds: tuple[str, ...] = ()
    key_metrics: tuple[str, ...] = ()
    timestamps: tuple[str, ...] = (TS_ISO,)
    vector: VectorBlock | None = None
    lookback: int = 0
    kind_columns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_types(self.columns, f"{self.engine}/{self.kind}")
        check_kind_columns(self)
        object.__setattr__(self, "_ts", tuple(re.compile(p) for p in self.timestamps))

    def columns_of(self, kind: str) -> dict[str, str]:
        """The columns of `kind`'s records (name -> type): those `kind_columns` names for it, else all."""
        return kind_columns_of(self, kind)

    def timestamp(self, text: str | None) -> str | None:
        """The record timestamp found in `text` by this format's timestamp patterns."""
        if text:
            for rx in self._ts:  # type: ignore[attr-defined]
                m = rx.search(text)
                if m:
                    return m.group("timestamp")
        return None


Format = LineFormat | BlockFormat


def kind_columns_of(fmt: Format, kind: str) -> dict[str, str]:
    """`fmt`'s columns that records of `kind` hold (name -> type, in the format's order)."""
    cols = fmt.columns
    names = fmt.kind_columns.get(kind)
    return dict(cols) if names is None else {c: t for c, t in cols.items() if c in names}


def check_kind_columns(fmt: Format) -> None:
    """Raise ConfigError where `kind_columns` names a kind the format does not make or a column it lacks."""
    where = f"{fmt.engine}/{fmt.kind}"
    for kind, names in fmt.kind_columns.items():
        if kind not in (fmt.kind, *fmt.kinds):
            raise ConfigError(f"kind_columns: {where} makes no kind {kind!r}; its kinds are {(fmt.kind, *fmt.kinds)}")
        missing = sorted(set(names) - set(fmt.columns))
        if missing:
            raise ConfigError(f"kind_columns: {where} names columns {missing} for {kind!r} that are not among its "
                              f"columns {sorted(fmt.columns)}")
