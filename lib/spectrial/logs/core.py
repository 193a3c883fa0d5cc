"""Registry and driver of spectrial's log parsers.

Output schema of :func:`parse` (one row per recognised record, in input order):

- ``line``: 1-based line of the record's first line; ``engine``: "sglang", "vllm", "llamacpp",
  "profile", "nccl" or "nvidia-smi"; ``kind``; ``timestamp``: as printed, or None.
- then every column of every selected format, NaN (numbers) or None where a record lacks it.
  Units are in the names: ``_ms``, ``_s``, ``_gb``, ``_mib``, ``_w``, ``_c``, ``_mhz``; ``_pct`` is 0..100;
  ``*_rate`` and ``*_usage`` are fractions 0..1 (converted from percent where a log prints ``%``);
  throughputs are tokens per second. Exceptions, as the tools print them: bench_serving's
  ``request_rate`` and ``request_throughput`` are requests per second; results_table's ``latency`` keeps
  the table's own unit; ``system_efficiency`` (vLLM V0) is a fraction.
- ``df.attrs``: ``lines`` (lines read), ``unparsed_lines`` (non-blank lines that no format recognised),
  ``parser_errors`` (at most 20 ``(line, format, error)`` tuples; a bug, never a crash), ``read_error``.

How it is fast: the input is read in large blocks of bytes; one Aho-Corasick pass over a block's bytes
(ahocorasick_rs, optional; else one RE2 union pass, pyarrow) finds each line's leftmost marker and so its
format; each *line format* then extracts its columns from its own lines with one vectorised regex per
pattern, run only on the lines that hold the pattern's fixed text and still lack its columns; *block
formats* (multi-line records: tables, benchmark blocks, dumps) run a small Python function on the lines
they claim: a fast reader over the raw bytes where the format has one and the lines are plain, else the
Window function on the chunk's own lines (or through the stream when the block leaves its chunk). Records
are kept as value tuples and turned into columns once, at the end. During a parse the cyclic GC and
numpy's huge-page hint are off (see :func:`_madvise_hugepage`).

A new format is one small function: see :meth:`Registry.register`.
"""

from __future__ import annotations

import gc
import gzip
import importlib
import itertools
import os
import re
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

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

try:  # optional: finds the marker lines several times faster than the RE2 union
    import ahocorasick_rs
except ImportError:  # pragma: no cover - depends on the environment
    ahocorasick_rs = None

from spectrial.errors import ConfigError

# ---------------------------------------------------------------- regex fragments (RE2 and Python `re`)
NUM = r"(?:[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?(?:inf|Inf|INF|nan|NaN))"
LIST = rf"{NUM}(?:\s*,\s*{NUM})*"
TS_ISO = (r"^\[?(?P<timestamp>[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]+)?"
          r"(?:Z|[+-][0-9]{2}:?[0-9]{2})?)")
ANSI = r"(?:\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\n]*\x07|\?\[[0-9;]+m|\^\[\[[0-9;]*m)"
_ANSI_PY = re.compile(ANSI)
# ASCII bytes on which bytes and str methods differ (str.strip() strips \x1c-\x1f), or that a Window drops
# (a line's \r, ANSI's ESC): "plain" text has none of them, and fast readers read plain text only
_NOT_PLAIN = b"\r\x1b\x1c\x1d\x1e\x1f"
_NUM_PY = re.compile(rf"^\s*({NUM})")

COLUMN_TYPES = ("float", "str", "bool", "list", "object")
ENGINE_ORDER = {e: i for i, e in enumerate(("sglang", "vllm", "llamacpp", "profile", "nccl", "nvidia-smi"))}
RESERVED = ("line", "engine", "kind", "timestamp")
DEFAULT_BLOCK_BYTES = 16 << 20
MAX_BLOCK_LINES = 20000
MAX_LINE_BYTES = 64 << 20
_MAX_ERRORS = 20

Record = dict[str, Any]
BlockResult = tuple[list[tuple[int, Record]], int]


class Rows(NamedTuple):
    """Records that share their fields (e.g. the rows of one table), as a fast reader may return them:
    ``values[j]`` holds the values of `keys` of the record at offset ``offsets[j]`` from the marker line."""

    offsets: Sequence[int]
    keys: tuple[str, ...]
    values: Sequence[Sequence[Any]]


FastResult = tuple["list[tuple[int, Record]] | Rows", int, int]
"""``(records, consumed, examined)``: as BlockResult (records may also be one :class:`Rows`), plus how many
lines from the marker line on were read."""
FastBlock = Callable[["Text", int], "FastResult | None"]
"""``fast(text, i)``: the block whose marker is local line `i` of `text`, or None to leave it to `fn`. It may
read lines ``i - lookback`` to ``text.stop - 1`` (each ends with a newline) and says in `examined` how far
it read; the driver checks that all those lines are plain."""


def num(text: str | None) -> float | None:
    """The number at the start of `text` ("12.5 ms", "inf", "N/A" -> None); never raises."""
    if text is None:
        return None
    if text[-1:].isdigit():  # the common case; "1.64x", "12 ms", "3 %" go to the regex without an exception
        try:
            return float(text)
        except ValueError:
            pass
    m = _NUM_PY.match(text)
    if not m:
        return None
    try:
        return float(m.group(1))
    except ValueError:  # pragma: no cover - the regex only admits floats
        return None


def _strip_ansi_array(lines: pa.Array) -> pa.Array:
    """`lines` without ANSI colour sequences (the regex runs on the lines that have one)."""
    has = pc.match_substring_regex(lines, ANSI)
    if not pc.any(has).as_py():
        return lines
    return pc.replace_with_mask(lines, has, pc.replace_substring_regex(lines.filter(has), ANSI, ""))


def bnum(text: bytes) -> float | None:
    """:func:`num` of plain ASCII bytes (the same value, without decoding the common case)."""
    if text[-1:].isdigit():
        try:
            return float(text)
        except ValueError:
            pass
    return num(text.decode())


def strip_ansi(text: str) -> str:
    """`text` without ANSI colour sequences (also the `?[32m` form a terminal paste leaves)."""
    return _ANSI_PY.sub("", text) if ("\x1b" in text or "?[" in text or "^[[" in text) else text


# ---------------------------------------------------------------- formats
@dataclass(frozen=True, eq=False)
class LineFormat:
    """A record printed on one line, extracted by vectorised regexes and `key: value` lists.

    `keys` maps the keys of a ``key: value, key: value`` list (SGLang and vLLM stats lines) to columns;
    the list is split, not searched, so fields may come in any order, be missing or be clipped (a key
    whose head was cut off, like ``token usaccept rate``, still finds ``accept rate``). Values keep their
    leading number; columns named in `percent` are divided by 100 where the value ends with ``%``.
    `patterns` are regexes (RE2 syntax, also valid Python `re`) whose named groups are columns; a group
    `X__pct` next to `X` divides X by 100 when it captured a ``%``. Patterns fill what `keys` left empty,
    the first that matches wins. A line is a record when one of `require` (default: any column but
    `timestamp`) was found; ``require=()`` makes every marker line a record. `finalize` may merge or
    split the rows of the whole input (sorted by line) and set a `kind` column; `output` then names the
    columns it returns.
    """

    engine: str
    kind: str
    markers: tuple[str, ...]
    patterns: tuple[str, ...] = ()
    types: Mapping[str, str] = field(default_factory=dict)
    require: tuple[str, ...] | None = None
    finalize: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    output: Mapping[str, str] | None = None
    kinds: tuple[str, ...] = ()
    key_metrics: tuple[str, ...] = ()
    keys: Mapping[str, str] = field(default_factory=dict)
    percent: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        groups: list[tuple[str, tuple[str, ...]]] = []
        for p in self.patterns:
            try:
                names = tuple(re.compile(p).groupindex)
            except re.error as e:
                raise ConfigError(f"patterns: {p!r} of {self.engine}/{self.kind} is not a valid regex ({e})") from e
            if not names:
                raise ConfigError(f"patterns: {p!r} of {self.engine}/{self.kind} has no named group; "
                                  "name each captured column with (?P<column>...)")
            groups.append((p, names))
        object.__setattr__(self, "_groups", tuple(groups))
        object.__setattr__(self, "_literals", tuple(_required_literal(p) for p in self.patterns))
        cols: dict[str, str] = {}
        for c in self.keys.values():
            cols.setdefault(c, self.types.get(c, "float"))
        for _, names in groups:
            for n in names:
                if not n.endswith("__pct"):
                    cols.setdefault(n, self.types.get(n, "str" if n == "timestamp" else "float"))
        object.__setattr__(self, "_pattern_columns", cols)
        key_list = list(self.keys)
        object.__setattr__(self, "_key_values", pa.array(key_list, pa.string()))
        object.__setattr__(self, "_key_cols", [self.keys[k] for k in key_list])
        _check_types(self.output or cols, self)
        bad = {c: t for c, t in cols.items() if c in self.keys.values() and t not in ("float", "bool", "str")}
        if bad:
            raise ConfigError(f"keys: {self.engine}/{self.kind} maps keys to {bad}; key columns must be "
                              "float, bool or str (use a pattern for lists)")

    @property
    def columns(self) -> dict[str, str]:
        """Output columns (name -> type), without the reserved ones."""
        cols = self.output if self.output is not None else self._pattern_columns  # type: ignore[attr-defined]
        return {k: v for k, v in cols.items() if k not in RESERVED}

    def extract(self, lines: pa.Array) -> dict[str, pa.Array]:
        """Typed columns for `lines` (null where nothing was found)."""
        out: dict[str, pa.Array] = self._extract_keys(lines) if self.keys else {}
        types = self._pattern_columns  # type: ignore[attr-defined]
        n = len(lines)
        for (pattern, names), literal in zip(self._groups, self._literals, strict=True):  # type: ignore[attr-defined]
            # a pattern only fills what is still empty, and only matches lines holding its fixed text:
            # it runs on those lines alone (the others would keep what they have)
            cols = [c for c in names if not c.endswith("__pct")]
            need = None
            if all(c in out for c in cols):
                need = np.zeros(n, dtype=bool)
                for c in cols:
                    need |= pc.is_null(out[c]).to_numpy(zero_copy_only=False)
            if literal is not None:
                has = pc.match_substring(lines, literal).to_numpy(zero_copy_only=False)
                need = has if need is None else need & has
            sub, back = lines, None
            if need is not None:
                idx = np.flatnonzero(need)
                if not len(idx):
                    for c in cols:
                        if c not in out:
                            out[c] = pa.nulls(n, _ARROW_TYPES.get(types[c], pa.string()))
                    continue
                if len(idx) < n:
                    sub = lines.take(pa.array(idx))
                    pos = np.full(n, -1, dtype=np.int64)
                    pos[idx] = np.arange(len(idx))
                    back = pa.array(pos, mask=pos < 0)
            parts = dict(zip(names, pc.extract_regex(sub, pattern=pattern).flatten(), strict=True))
            for name, arr in parts.items():
                if name.endswith("__pct"):
                    continue
                typed = _convert(arr, types[name])
                pct = parts.get(name + "__pct")
                if pct is not None:
                    typed = pc.if_else(pc.is_valid(_blank_to_null(pct)), pc.divide(typed, 100.0), typed)
                if back is not None:
                    typed = typed.take(back)
                prev = out.get(name)
                out[name] = typed if prev is None else pc.coalesce(prev, typed)
        return out

    def _extract_keys(self, lines: pa.Array) -> dict[str, pa.Array]:
        n = len(lines)
        items = pc.split_pattern(lines, ", ")
        row = np.repeat(np.arange(n), pc.list_value_length(items).to_numpy(zero_copy_only=False))
        kv = pc.split_pattern(items.flatten(), ": ")
        klen = pc.list_value_length(kv).to_numpy(zero_copy_only=False)
        ok = klen >= 2
        ends = np.cumsum(klen)[ok]
        flat = kv.flatten()
        row = row[ok]
        key = pc.utf8_trim_whitespace(flat.take(pa.array(ends - 2)))
        val = flat.take(pa.array(ends - 1))
        kid = pc.fill_null(pc.index_in(key, value_set=self._key_values), -1).to_numpy(  # type: ignore[attr-defined]
            zero_copy_only=False).copy()
        unknown = np.flatnonzero(kid < 0)
        if len(unknown):
            kid[unknown] = self._rescue_keys(key.take(pa.array(unknown)))
        cols = self._key_cols  # type: ignore[attr-defined]
        col_of = np.array([cols.index(c) for c in cols] + [-1])[kid]  # first key index of each column
        out: dict[str, pa.Array] = {}
        token = None
        for ci in np.unique(col_of[col_of >= 0]):
            name = cols[ci]
            sel = np.flatnonzero(col_of == ci)
            rows, first = np.unique(row[sel], return_index=True)  # the first occurrence in a line wins
            sel = sel[first]
            if token is None:
                token = _leading_token(val)
            vals = token.take(pa.array(sel))
            typ = self.types.get(name, "float")
            if typ == "float":
                pct = pc.ends_with(vals, "%").to_numpy(zero_copy_only=False)
                f = _to_float(pc.utf8_rtrim(vals, characters="%"))
                if name in self.percent:
                    f = np.where(pct, f / 100.0, f)
                full = np.full(n, np.nan)
                full[rows] = f
                out[name] = pa.array(full, from_pandas=True)
            else:
                full_o = np.full(n, None, object)
                v = vals.to_numpy(zero_copy_only=False)
                full_o[rows] = (v == "True").tolist() if typ == "bool" else v
                out[name] = pa.array(full_o, type=pa.bool_() if typ == "bool" else pa.string())
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

    def _rescue_keys(self, keys: pa.Array) -> np.ndarray:
        """Key ids for keys not found as such: `Decode batch. #running-req` (a head glued on) and
        `token usaccept rate` (clipped mid-line) end with a known key."""
        kid = np.full(len(keys), -1)
        for i, k in enumerate(self._key_values.to_pylist()):  # type: ignore[attr-defined]
            hit = pc.ends_with(keys, k).to_numpy(zero_copy_only=False) & (kid < 0)
            kid[hit] = i
        return kid


def _required_literal(pattern: str) -> str | None:
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


def _leading_token(vals: pa.Array) -> pa.Array:
    """`0.0 tokens/s` -> `0.0`, `0.0%.` -> `0.0%` (first word, without a closing period)."""
    first = pc.list_element(pc.split_pattern(pc.utf8_trim_whitespace(vals), " ", max_splits=1), 0)
    return pc.utf8_rtrim(first, characters=".,;)")


def _to_float(arr: pa.Array) -> np.ndarray:
    try:
        return pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return np.array([num(s) for s in arr.to_pylist()], dtype=float)


@dataclass(frozen=True, eq=False)
class BlockFormat:
    """Records read by a Python function from a marker line and the lines after (or before) it.

    `fn(window)` returns ``(records, consumed)``: records are ``(offset, fields)`` pairs (offset from the
    marker line; fields may set `kind`, `engine`, `timestamp`) and `consumed` is how many lines from the
    marker line on belong to the block (they are not offered to other formats).

    `fast(text, i)` is an optional second reader of the same records, for speed: it reads the raw bytes
    of a block of plain lines (printable ASCII) with regexes instead of a Window; see :data:`FastBlock`.
    It must give what `fn` gives wherever it answers; the driver offers it only blocks whose lines are
    all plain and asks `fn` otherwise (tests compare the two on every fixture). `lookback` is how many
    lines above the marker line `fast` reads.
    """

    engine: str
    kind: str
    markers: tuple[str, ...]
    fn: Callable[[Window], BlockResult]
    columns: Mapping[str, str]
    kinds: tuple[str, ...] = ()
    key_metrics: tuple[str, ...] = ()
    timestamps: tuple[str, ...] = (TS_ISO,)
    fast: FastBlock | None = None
    lookback: int = 0

    def __post_init__(self) -> None:
        _check_types(self.columns, self)
        object.__setattr__(self, "_ts", tuple(re.compile(p) for p in self.timestamps))

    def timestamp(self, text: str | None) -> str | None:
        """The record timestamp found in `text` by this format's timestamp patterns."""
        if text:
            for rx in self._ts:  # type: ignore[attr-defined]
                m = rx.search(text)
                if m:
                    return m.group("timestamp")
        return None


Format = LineFormat | BlockFormat


def _check_types(cols: Mapping[str, str], fmt: Any) -> None:
    bad = {k: v for k, v in cols.items() if v not in COLUMN_TYPES}
    if bad:
        raise ConfigError(f"columns: {fmt.engine}/{fmt.kind} uses unknown column types {bad}; "
                          f"use one of {COLUMN_TYPES}")


def _blank_to_null(arr: pa.Array) -> pa.Array:
    return pc.if_else(pc.equal(arr, ""), pa.scalar(None, arr.type), arr)


def _convert(arr: pa.Array, typ: str) -> pa.Array:
    """String captures -> typed arrow array; never raises on odd text."""
    if typ == "float":
        for attempt in (arr, _blank_to_null(arr)):  # "" where an optional group did not take part
            try:
                return pc.cast(attempt, pa.float64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                continue
        return pa.array([num(s) for s in arr.to_pylist()], type=pa.float64())
    arr = _blank_to_null(arr)
    if typ == "bool":
        return pc.equal(pc.utf8_lower(arr), "true")
    if typ == "list":
        parts = pc.split_pattern_regex(pc.utf8_trim_whitespace(arr), r"\s*,\s*")
        try:
            return parts.cast(pa.list_(pa.float64()))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return pa.array([None if v is None else [num(x) for x in v] for v in parts.to_pylist()],
                            type=pa.list_(pa.float64()))
    return pc.utf8_trim_whitespace(arr)


# ---------------------------------------------------------------- registry
class Registry:
    """The known formats; each marker string selects exactly one format."""

    def __init__(self) -> None:
        self._formats: list[Format] = []
        self._markers: dict[str, Format] = {}

    @property
    def formats(self) -> tuple[Format, ...]:
        """Registered formats, in registration order."""
        return tuple(self._formats)

    def add(self, fmt: Format) -> Format:
        """Register a LineFormat or BlockFormat; markers must be new and non-empty."""
        if not fmt.markers or any(not m for m in fmt.markers):
            raise ConfigError(f"markers: {fmt.engine}/{fmt.kind} needs at least one non-empty marker string")
        for m in fmt.markers:
            if m in self._markers:
                other = self._markers[m]
                raise ConfigError(f"markers: {m!r} of {fmt.engine}/{fmt.kind} is already used by "
                                  f"{other.engine}/{other.kind}; pick a more specific marker")
        for m in fmt.markers:
            self._markers[m] = fmt
        self._formats.append(fmt)
        return fmt

    def register(self, engine: str, kind: str, markers: Sequence[str],
                 columns: Mapping[str, str] | Sequence[str], *, kinds: Sequence[str] = (),
                 key_metrics: Sequence[str] = (), timestamps: Sequence[str] = (TS_ISO,)
                 ) -> Callable[[Callable[[str], Any]], Callable[[str], Any]]:
        """Decorator: register `fn(line) -> dict | list[dict] | None` for lines holding a marker.

        The dicts hold the record's columns (`columns`: names, all float, or name -> type); they may set
        `kind` and `timestamp`. Example::

            @register("myengine", "step", markers=["step time"], columns=["step_ms"])
            def step(line):
                m = re.search(r"step time: ([0-9.]+) ms", line)
                return {"step_ms": float(m.group(1))} if m else None
        """
        cols = dict(columns) if isinstance(columns, Mapping) else {c: "float" for c in columns}

        def deco(fn: Callable[[str], Any]) -> Callable[[str], Any]:
            def block(w: Window) -> BlockResult:
                got = fn(w[0] or "")
                recs = [got] if isinstance(got, dict) else list(got or [])
                return [(0, r) for r in recs if r], (1 if recs else 0)

            self.add(BlockFormat(engine, kind, tuple(markers), block, cols, kinds=tuple(kinds),
                                 key_metrics=tuple(key_metrics), timestamps=tuple(timestamps)))
            return fn

        return deco

    def kinds(self) -> list[tuple[str, str]]:
        """(engine, kind) pairs the formats can produce."""
        seen: dict[tuple[str, str], None] = {}
        for f in self._formats:
            for k in (f.kind, *f.kinds):
                seen[(f.engine, k)] = None
        return list(seen)

    def select(self, kinds: str | Iterable[str] | None) -> list[Format]:
        """Formats producing any of `kinds` (a kind, an engine, or "engine:kind"); all when None."""
        if kinds is None:
            return list(self._formats)
        wanted = {kinds} if isinstance(kinds, str) else set(kinds)
        known = {n for e, k in self.kinds() for n in (e, k, f"{e}:{k}")}
        unknown = sorted(wanted - known)
        if unknown:
            raise ConfigError(f"kinds: unknown {unknown}; known kinds: "
                              f"{sorted({k for _, k in self.kinds()})} and engines "
                              f"{sorted({e for e, _ in self.kinds()})}")
        return [f for f in self._formats if any(_wants(wanted, f.engine, k) for k in (f.kind, *f.kinds))]

    def key_metrics(self, engine: str, kind: str) -> tuple[str, ...]:
        """The metrics `summary` reports for (engine, kind)."""
        for f in self._formats:
            if f.engine == engine and kind in (f.kind, *f.kinds) and f.key_metrics:
                return f.key_metrics
        return ()


def _wants(wanted: set[str], engine: str, kind: str) -> bool:
    return bool(wanted & {engine, kind, f"{engine}:{kind}"})


registry = Registry()
register = registry.register
_DEFAULT = registry


# ---------------------------------------------------------------- input
def _is_path(s: str) -> bool:
    if "\n" in s or len(s) > 4096:
        return False
    if os.path.isfile(s):
        return True
    looks = not re.search(r"\s", s) and ("/" in s or os.sep in s or
                                          bool(re.search(r"\.(log|txt|gz|out|err|jsonl)$", s)))
    if looks:
        raise ConfigError(f"source: no such file {s!r}; pass an existing path, or log text with a newline")
    return False


def _file_blocks(path: Path, size: int, errors: list[str]) -> Iterator[bytes]:
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as e:
        raise ConfigError(f"source: cannot read {str(path)!r} ({e.strerror or e}); check the path") from e
    with fh:
        stream: Any = gzip.GzipFile(fileobj=fh) if fh.read(2) == b"\x1f\x8b" else fh
        fh.seek(0)
        try:
            while block := stream.read(size):
                yield block
        except (OSError, EOFError, zlib.error) as e:  # truncated / half-written .gz
            errors.append(f"{path}: {e.__class__.__name__}: {e}")


def _raw_blocks(source: Any, size: int, errors: list[str]) -> Iterator[bytes]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        for i in range(0, len(data), size):
            yield data[i:i + size]
    elif isinstance(source, os.PathLike) or (isinstance(source, str) and _is_path(source)):
        yield from _file_blocks(Path(source), size, errors)
    elif isinstance(source, str):
        for i in range(0, len(source), size):
            yield source[i:i + size].encode("utf-8", "replace")
    elif hasattr(source, "read"):
        while block := source.read(size):
            yield block.encode("utf-8", "replace") if isinstance(block, str) else bytes(block)
    elif isinstance(source, Iterable):
        buf: list[bytes] = []
        n = 0
        for item in source:
            s = bytes(item) if isinstance(item, (bytes, bytearray)) else str(item).encode("utf-8", "replace")
            if not s.endswith(b"\n"):
                s += b"\n"
            buf.append(s)
            n += len(s)
            if n >= size:
                yield b"".join(buf)
                buf, n = [], 0
        if buf:
            yield b"".join(buf)
    else:
        raise ConfigError(f"source: expected a path, log text, bytes or an iterable of lines, "
                          f"got {type(source).__name__}")


def _line_blocks(raw: Iterator[bytes], size: int) -> Iterator[bytes]:
    """Re-cut raw blocks so that each ends with a newline (the last may not)."""
    rest = b""
    longest = max(4 * size, MAX_LINE_BYTES)
    for block in raw:
        cut = block.rfind(b"\n")  # `rest` has no newline: the block's last one ends the lines
        if cut < 0:
            data = rest + block if rest else block
            if len(data) < longest:
                rest = data
                continue
            yield data  # no newline in 64 MiB (binary data): split it, the line count is off by one then
            rest = b""
            continue
        if rest:
            yield b"".join((rest, memoryview(block)[:cut + 1]))  # one copy
        else:
            yield block if cut == len(block) - 1 else block[:cut + 1]
        rest = block[cut + 1:]
    if rest:
        yield rest


class Text(Protocol):
    """What a fast block reader sees: one chunk of the input, as bytes, with its line starts."""

    data: bytes  # valid UTF-8
    starts: list[int]  # byte offset of each local line, and the end of the last one
    stop: int  # local lines before `stop` are complete (end with a newline)

    def line(self, i: int) -> str:
        """Local line `i` as text, as a Window gives it."""

    def lines_at(self, i: int, count: int) -> list[bytes]:
        """Up to `count` complete local lines from `i` on, as bytes without the newline."""

    def iter_lines(self, i: int, first: int = 16) -> Iterator[bytes]:
        """Complete local lines from `i` on, as bytes without the newline."""


class _Chunk:
    """One block of whole lines as an arrow string array (zero-copy over the bytes)."""

    __slots__ = ("data", "offs", "start", "n", "lines", "has_ansi", "_offl", "_nb")

    def __init__(self, data: bytes, start: int) -> None:
        offs = _line_offsets(data)
        lines = pa.Array.from_buffers(pa.string(), len(offs) - 1, [None, pa.py_buffer(offs), pa.py_buffer(data)])
        try:
            lines.validate(full=True)
        except pa.ArrowInvalid:  # invalid UTF-8 (binary noise): replace, keep the line structure
            data = data.decode("utf-8", "replace").encode("utf-8")
            offs = _line_offsets(data)
            lines = pa.Array.from_buffers(pa.string(), len(offs) - 1,
                                          [None, pa.py_buffer(offs), pa.py_buffer(data)])
        self.data, self.offs, self.start, self.n, self.lines = data, offs, start, len(offs) - 1, lines
        self.has_ansi = b"\x1b" in data or b"?[" in data or b"^[[" in data
        self._offl: list[int] | None = None
        self._nb: np.ndarray | None = None

    @property
    def starts(self) -> list[int]:
        """Byte offsets of the local lines (and of the end), as a list."""
        if self._offl is None:
            self._offl = self.offs.tolist()
        return self._offl

    @property
    def stop(self) -> int:
        """Local lines before this one end with a newline."""
        return self.n if self.data.endswith(b"\n") else self.n - 1

    def lines_at(self, i: int, count: int) -> list[bytes]:
        """Up to `count` complete local lines from `i` on (fewer at `stop`), as bytes without the newline."""
        j = min(i + count, self.stop)
        if j <= i:
            return []
        offl = self.starts
        return self.data[offl[i]:offl[j] - 1].split(b"\n")

    def iter_lines(self, i: int, first: int = 16) -> Iterator[bytes]:
        """Complete local lines from `i` on, as bytes without the newline, read in growing batches."""
        count = first
        while True:
            got = self.lines_at(i, count)
            yield from got
            if len(got) < count:
                return
            i += count
            count *= 4

    def plain(self, a: int, b: int) -> bool:
        """Whether local lines a..b-1 are printable ASCII only (what Window gives is then the bytes as they
        are), within this chunk and complete."""
        if a < 0 or b > self.stop:
            return False
        offl = self.starts
        region = self.data[offl[a]:offl[b]]
        if not region.isascii() or len(region.translate(None, _NOT_PLAIN)) != len(region):
            return False
        return not self.has_ansi or (b"?[" not in region and b"^[[" not in region)

    def line(self, i: int) -> str:
        """Local line `i` as text, without its line ending and ANSI colour codes."""
        if self._offl is None:
            self._offl = self.offs.tolist()
        s = self.data[self._offl[i]:self._offl[i + 1]].decode("utf-8", "replace").rstrip("\r\n")
        return strip_ansi(s) if self.has_ansi else s

    def lines_from(self, i: int, count: int) -> list[str]:
        """Up to `count` local lines from `i` on, decoded in one go."""
        if self._offl is None:
            self._offl = self.offs.tolist()
        j = min(i + count, self.n)
        if j <= i:
            return []
        text = self.data[self._offl[i]:self._offl[j]].decode("utf-8", "replace")
        if self.has_ansi:
            text = strip_ansi(text)
        out = text.split("\n")
        if len(out) > j - i:  # the text ended with a newline
            out.pop()
        if "\r" in text:
            out = [x.rstrip("\r") for x in out]
        return out

    def _nonblank_cum(self) -> np.ndarray:
        if self._nb is None:
            lens = np.diff(self.offs)
            nonblank = lens > 1
            two = np.flatnonzero(lens == 2)
            if len(two):
                nonblank[two] = np.frombuffer(self.data, np.uint8)[self.offs[two]] != 13
            self._nb = np.concatenate(([0], np.cumsum(nonblank)))
        return self._nb

    def blank_count(self) -> int:
        """Lines that are empty (or only CR)."""
        return self.n - int(self._nonblank_cum()[-1])

    def nonblank(self, a: int, b: int) -> int:
        """Non-blank lines among local lines a..b-1."""
        cum = self._nonblank_cum()
        return int(cum[min(b, self.n)] - cum[max(a, 0)])


def _line_offsets(data: bytes) -> np.ndarray:
    a = np.frombuffer(data, np.uint8)
    step = 1 << 20
    parts = [np.flatnonzero(a[i:i + step] == 10) + (i + 1) for i in range(0, len(a), step)]
    ends = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if len(a) and a[-1] != 10:
        ends = np.append(ends, len(a))
    offs = np.zeros(len(ends) + 1, np.int32)
    offs[1:] = ends
    return offs


class _Stream:
    """Chunks in order, with read-ahead so that a block format may look past a chunk's end."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self._blocks = blocks
        self._ahead: deque[_Chunk] = deque()
        self._prev: deque[_Chunk] = deque()  # enough passed chunks to look 64 lines back
        self._next_start = 0

    def __iter__(self) -> Iterator[_Chunk]:
        while self._ahead or self._load():
            yield self._ahead[0]
            self._prev.append(self._ahead.popleft())
            while len(self._prev) > 1 and sum(c.n for c in list(self._prev)[1:]) >= 64:
                self._prev.popleft()

    def _load(self) -> bool:
        for data in self._blocks:
            if data:
                ch = _Chunk(data, self._next_start)
                self._next_start += ch.n
                self._ahead.append(ch)
                return True
        return False

    def _chunk_of(self, g: int) -> _Chunk | None:
        if self._ahead and self._ahead[0].start <= g < self._ahead[0].start + self._ahead[0].n:
            return self._ahead[0]
        if g < 0:
            return None
        while g >= self._next_start:
            if not self._load():
                return None
        for ch in (*self._prev, *self._ahead):
            if ch.start <= g < ch.start + ch.n:
                return ch
        return None

    def line(self, g: int) -> str | None:
        """Global 0-based line `g`, or None when it is not available."""
        ch = self._chunk_of(g)
        return None if ch is None else ch.line(g - ch.start)

    def lines(self, g: int, count: int) -> list[str]:
        """Up to `count` global lines from `g` on (fewer at the end of the input)."""
        out: list[str] = []
        while len(out) < count:
            ch = self._chunk_of(g + len(out))
            if ch is None:
                break
            out += ch.lines_from(g + len(out) - ch.start, count - len(out))
        return out

    def nonblank(self, g0: int, g1: int) -> int:
        """Non-blank lines among global lines g0..g1-1 (all read already)."""
        total = 0
        for ch in (*self._prev, *self._ahead):
            if ch.start < g1 and g0 < ch.start + ch.n:
                total += ch.nonblank(g0 - ch.start, g1 - ch.start)
        return total


class _OutOfChunk(BaseException):  # noqa: N818 - a signal, not an error; BaseException passes `except Exception`
    """A chunk's own lines were asked for a line of another chunk."""


class _ChunkLines:
    """The lines of one chunk, for a Window: a block that stays within its chunk is read without the
    stream's read-ahead; asking for a line outside raises _OutOfChunk (the stream's Window reads it then)."""

    __slots__ = ("_ch",)

    def __init__(self, ch: _Chunk) -> None:
        self._ch = ch

    def line(self, g: int) -> str | None:
        i = g - self._ch.start
        if not 0 <= i < self._ch.n:
            raise _OutOfChunk
        return self._ch.line(i)

    def lines(self, g: int, count: int) -> list[str]:
        i = g - self._ch.start
        if i < 0 or i + count > self._ch.n:
            raise _OutOfChunk
        return self._ch.lines_from(i, count)

    def nonblank(self, g0: int, g1: int) -> int:
        return self._ch.nonblank(g0 - self._ch.start, g1 - self._ch.start)


class Window:
    """Lines around a marker line: ``w[0]`` is that line, ``w[1]`` the next, ``w[-1]`` the previous.

    Lines come without line ending and ANSI codes; outside the input (or too far away) they are None.
    """

    __slots__ = ("_stream", "_g", "_buf", "_end")

    def __init__(self, stream: _Stream, g: int) -> None:
        self._stream, self._g = stream, g
        self._buf: list[str] = []
        self._end = False

    @property
    def line(self) -> int:
        """1-based line number of the marker line."""
        return self._g + 1

    def __getitem__(self, k: int) -> str | None:
        buf = self._buf
        if 0 <= k < len(buf):
            return buf[k]
        if k < 0:
            return self._stream.line(self._g + k) if k >= -64 else None
        if self._end or k >= MAX_BLOCK_LINES:
            return None
        want = max(k + 1 - len(buf), 16, len(buf))  # read ahead, doubling
        more = self._stream.lines(self._g + len(buf), min(want, MAX_BLOCK_LINES - len(buf)))
        self._end = len(more) < want
        buf += more
        return buf[k] if k < len(buf) else None


# ---------------------------------------------------------------- the driver
_AUTOMATON_SIZE = 40  # markers per Aho-Corasick automaton: small sets get its fast SIMD prefilter


def _automata(markers: list[str]) -> list[tuple[Any, np.ndarray]] | None:
    """Leftmost-longest Aho-Corasick automata over `markers` (ahocorasick_rs, optional), each with the
    indexes of its markers in `markers`; None without the package (the RE2 union is used instead)."""
    if ahocorasick_rs is None:
        return None
    out = []
    for a in range(0, len(markers), _AUTOMATON_SIZE):
        part = markers[a:a + _AUTOMATON_SIZE]
        automaton = ahocorasick_rs.BytesAhoCorasick([m.encode() for m in part],
                                                   matchkind=ahocorasick_rs.MatchKind.LeftmostLongest)
        out.append((automaton, np.arange(a, a + len(part), dtype=np.int64)))
    return out


class _Plan:
    """Per-parse state: the union marker regex, the formats, and what they found."""

    def __init__(self, formats: Sequence[Format]) -> None:
        self.formats = list(formats)
        markers = [(m, i) for i, f in enumerate(self.formats) for m in f.markers]
        markers.sort(key=lambda mi: -len(mi[0]))  # longer markers win at the same position
        alt = "|".join(re.escape(m) for m, _ in markers)
        self.union = alt
        self.union_named = f"(?P<m>{alt})"
        self.marker_values = pa.array([m for m, _ in markers], pa.string())
        self.marker_fmt = np.array([i for _, i in markers] + [-1], dtype=np.int64)  # [-1] for "no marker"
        self.automata = _automata([m for m, _ in markers]) if markers else None
        self.is_block = np.array([isinstance(f, BlockFormat) for f in self.formats] + [False], dtype=bool)
        self.line_parts: list[list[tuple[np.ndarray, dict[str, pa.Array]]]] = [[] for _ in self.formats]
        self.block_recs: list[_Sink] = [_Sink() for _ in self.formats]
        self.total = self.blank = self.recognised = 0
        self.skip_until = 0
        self.errors: list[tuple[int, str, str]] = []

    def process(self, ch: _Chunk, stream: _Stream) -> None:
        self.total += ch.n
        self.blank += ch.blank_count()
        if not self.formats or ch.n == 0:
            return
        idx, mid = self._find_markers(ch)
        keep = idx + ch.start >= self.skip_until
        idx, mid = idx[keep], mid[keep]
        if not len(idx):
            return
        g = idx + ch.start
        fid = self.marker_fmt[mid]
        is_block = self.is_block[fid]
        starts: list[int] = []
        ends: list[int] = []
        for j in np.flatnonzero(is_block):
            gj = int(g[j])
            if gj < self.skip_until:
                continue
            used = self._run_block(int(fid[j]), stream, gj, ch)
            if used:
                starts.append(gj)
                ends.append(gj + used)
                self.skip_until = gj + used
        line_ok = ~is_block & (fid >= 0)
        if starts:
            k = np.searchsorted(np.array(starts), g, side="right") - 1
            inside = (k >= 0) & (g < np.array(ends)[np.maximum(k, 0)])
            line_ok &= ~inside
        for k in np.unique(fid[line_ok]):
            sel_j = np.flatnonzero(line_ok & (fid == k))
            fmt = self.formats[int(k)]
            sel = ch.lines.take(pa.array(idx[sel_j]))
            if ch.has_ansi:
                sel = _strip_ansi_array(sel)
            cols = fmt.extract(sel)  # type: ignore[union-attr]
            ok = fmt.required(cols, len(sel))  # type: ignore[union-attr]
            if not ok.any():
                continue
            self.recognised += int(ok.sum())
            keep = pa.array(ok)
            self.line_parts[int(k)].append((g[sel_j][ok] + 1, {c: a.filter(keep) for c, a in cols.items()}))

    def _find_markers(self, ch: _Chunk) -> tuple[np.ndarray, np.ndarray]:
        """Local lines holding a marker, and the index (in `marker_values`) of each line's first marker."""
        if self.automata is None:
            mask = pc.match_substring_regex(ch.lines, self.union).to_numpy(zero_copy_only=False)
            idx = np.flatnonzero(mask)
            which = pc.extract_regex(ch.lines.take(pa.array(idx)), self.union_named).flatten()[0]
            mid = pc.fill_null(pc.index_in(which, value_set=self.marker_values), -1).to_numpy(zero_copy_only=False)
            return idx, mid
        found = []
        for automaton, ids in self.automata:
            hits = automaton.find_matches_as_indexes(ch.data)
            arr = np.fromiter(itertools.chain.from_iterable(hits), np.int64, 3 * len(hits)).reshape(-1, 3)
            arr[:, 0] = ids[arr[:, 0]]
            found.append(arr)
        hits = np.concatenate(found)
        order = np.lexsort((hits[:, 1] - hits[:, 2], hits[:, 1]))  # by position; the longest first at a tie
        hits = hits[order]
        line = np.searchsorted(ch.offs, hits[:, 1], side="right") - 1
        first = np.ones(len(line), dtype=bool)
        first[1:] = line[1:] != line[:-1]  # a line's leftmost (longest) marker decides its format
        return line[first], hits[first, 0]

    def _run_fast(self, i: int, ch: _Chunk, g: int) -> int | None:
        """The block at global line `g` read by the format's fast reader, or None where it leaves it to `fn`."""
        fmt = self.formats[i]
        loc = g - ch.start
        if loc < fmt.lookback:  # type: ignore[union-attr]
            return None  # the lines above are in the chunk before
        try:
            got = fmt.fast(ch, loc)  # type: ignore[union-attr,misc]
        except Exception:  # the reference reader decides (and reports a bug)
            return None
        if got is None:
            return None
        got_recs, used, examined = got
        sink = self.block_recs[i]
        if isinstance(got_recs, Rows):
            if got_recs.offsets:
                used = max(used, max(got_recs.offsets) + 1)
            if not ch.plain(loc - fmt.lookback, loc + max(examined, used, 1)):  # type: ignore[union-attr]
                return None
            if got_recs.offsets:
                if fmt.timestamps and "timestamp" not in got_recs.keys:  # type: ignore[union-attr]
                    stamps = {off: fmt.timestamp(ch.line(loc + off))  # type: ignore[union-attr]
                              for off in dict.fromkeys(got_recs.offsets)}
                    got_recs = Rows(got_recs.offsets, (*got_recs.keys, "timestamp"),
                                    [(*v, stamps[off]) for off, v in zip(got_recs.offsets, got_recs.values, strict=True)])
                sink.add_rows([g + off + 1 for off in got_recs.offsets], got_recs)
        else:
            recs = [(off, rec) for off, rec in got_recs if rec]
            used = max(used, max((off + 1 for off, _ in recs), default=0))
            if not ch.plain(loc - fmt.lookback, loc + max(examined, used, 1)):  # type: ignore[union-attr]
                return None
            has_ts = bool(fmt.timestamps)  # type: ignore[union-attr]
            for off, rec in recs:
                if "timestamp" not in rec:
                    rec["timestamp"] = fmt.timestamp(ch.line(loc + off)) if has_ts else None  # type: ignore[union-attr]
                sink.add(g + off + 1, rec)
        if used:
            self.recognised += ch.nonblank(loc, loc + used)
        return used

    def _run_block(self, i: int, stream: _Stream, g: int, ch: _Chunk | None = None) -> int:
        """Run format `i` on the block at global line `g`; returns the lines it claims."""
        fmt = self.formats[i]
        if ch is not None:
            if fmt.fast is not None:  # type: ignore[union-attr]
                used = self._run_fast(i, ch, g)
                if used is not None:
                    return used
            try:  # the same function on the chunk's own lines: no read-ahead through the stream
                return self._run_fn(i, _ChunkLines(ch), g)
            except _OutOfChunk:
                pass
        return self._run_fn(i, stream, g)

    def _run_fn(self, i: int, source: _Stream | _ChunkLines, g: int) -> int:
        fmt = self.formats[i]
        w = Window(source, g)  # type: ignore[arg-type]
        try:
            got, used = fmt.fn(w)  # type: ignore[union-attr]
            recs = [(int(off), rec) for off, rec in (got or []) if rec]
            used = max(int(used or 0), max((off + 1 for off, _ in recs), default=0))
        except Exception as e:  # a parser bug must not lose the rest of the log
            if len(self.errors) < _MAX_ERRORS:
                self.errors.append((g + 1, f"{fmt.engine}/{fmt.kind}", f"{e.__class__.__name__}: {e}"))
            return 0
        if used:
            w[used - 1]  # make sure the lines of the block are loaded (a chunk's own lines may raise here)
        if fmt.timestamps:  # type: ignore[union-attr]
            stamps = [fmt.timestamp(w[off]) if "timestamp" not in rec else None  # type: ignore[union-attr]
                      for off, rec in recs]
            for (_, rec), ts in zip(recs, stamps, strict=True):
                rec.setdefault("timestamp", ts)
        sink = self.block_recs[i]
        for off, rec in recs:
            rec.setdefault("timestamp", None)
            sink.add(g + off + 1, rec)
        if used:
            self.recognised += source.nonblank(g, g + used)
        return used

    # ------------------------------------------------------------ assembly
    def _columns(self, i: int) -> _Cols | None:
        """The rows format `i` found: line numbers, engine and kind per row, typed column arrays."""
        fmt = self.formats[i]
        if isinstance(fmt, LineFormat):
            parts = self.line_parts[i]
            if not parts:
                return None
            lines = np.concatenate([p[0] for p in parts]).astype(np.int64)
            cols: dict[str, np.ndarray] = {}
            for c, typ in fmt._pattern_columns.items():  # type: ignore[attr-defined]
                if any(c in p[1] for p in parts):  # a block without the column contributes nulls
                    arrs = [p[1][c] if c in p[1] else pa.nulls(len(p[0]), _ARROW_TYPES[typ]) for p in parts]
                    cols[c] = _to_numpy(pa.concat_arrays(arrs), typ)
            if fmt.finalize is None:
                n = len(lines)
                return _Cols(lines, _const(n, fmt.engine), _const(n, fmt.kind), cols)
            df = pd.DataFrame({"line": lines, **{c: pd.Series(v, dtype=object if v.dtype == object else None,
                                                              copy=False) for c, v in cols.items()}})
            try:
                df = fmt.finalize(df)
            except Exception as e:  # a finalize bug must stay visible, not fatal
                self.errors.append((int(lines[0]), f"{fmt.engine}/{fmt.kind}", f"{e.__class__.__name__}: {e}"))
                return None
            n = len(df)
            kind = df["kind"].to_numpy(object) if "kind" in df else _const(n, fmt.kind)
            return _Cols(df["line"].to_numpy(np.int64), _const(n, fmt.engine), kind,
                         {c: df[c].to_numpy() for c in df.columns if c not in ("line", "kind", "engine")})
        sink = self.block_recs[i]
        if not sink.n:
            return None
        n = sink.n
        lines, cols = sink.columns({"timestamp": "str", "engine": "str", "kind": "str", **fmt.columns})
        return _Cols(lines, _or(cols.pop("engine", None), fmt.engine, n), _or(cols.pop("kind", None), fmt.kind, n), cols)

    def result(self, wanted: set[str] | None) -> pd.DataFrame:
        schema: dict[str, str] = {"timestamp": "str"}
        for f in sorted(self.formats, key=lambda f: ENGINE_ORDER.get(f.engine, len(ENGINE_ORDER))):
            for c, t in f.columns.items():
                schema[c] = t if schema.get(c, t) == t else "object"  # e.g. src: NCCL rank vs "GPU0"
        frames: list[_Cols] = []
        for i in range(len(self.formats)):
            fr = self._columns(i)
            if fr is None or not len(fr.lines):
                continue
            if wanted is not None:
                keep = np.array([_wants(wanted, e, k) for e, k in zip(fr.engine, fr.kind, strict=True)], dtype=bool)
                fr = fr.subset(keep)
            if len(fr.lines):
                frames.append(fr)
        n = sum(len(fr.lines) for fr in frames)
        lines = np.concatenate([fr.lines for fr in frames]) if frames else np.zeros(0, np.int64)
        order = np.argsort(lines, kind="stable")
        pos = np.empty(n, np.int64)
        pos[order] = np.arange(n)
        starts = np.cumsum([0] + [len(fr.lines) for fr in frames])
        # two 2D blocks (floats, objects) filled row by row: no per-column pandas overhead, no copies
        fcols = [c for c, t in schema.items() if t == "float"]
        ocols = ["engine", "kind", *(c for c, t in schema.items() if t != "float")]
        fblock = np.full((len(fcols), n), np.nan)
        oblock = np.empty((len(ocols), n), object)  # numpy fills object arrays with None
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
                if schema[col] != "list":
                    vals[pd.isna(vals)] = None
                oblock[j, pos[a:a + len(vals)]] = vals
        df = pd.concat([pd.DataFrame({"line": lines[order]}),
                        pd.DataFrame(oblock.T, columns=ocols, dtype=object, copy=False),
                        pd.DataFrame(fblock.T, columns=fcols, copy=False)], axis=1)
        df.attrs["lines"] = self.total
        df.attrs["unparsed_lines"] = max(self.total - self.blank - self.recognised, 0)
        df.attrs["parser_errors"] = list(self.errors)
        return df


@dataclass
class _Cols:
    lines: np.ndarray
    engine: np.ndarray
    kind: np.ndarray
    cols: dict[str, np.ndarray]

    def subset(self, keep: np.ndarray) -> _Cols:
        return _Cols(self.lines[keep], self.engine[keep], self.kind[keep], {c: v[keep] for c, v in self.cols.items()})


_ARROW_TYPES = {"float": pa.float64(), "str": pa.string(), "bool": pa.bool_(), "list": pa.list_(pa.float64())}


_NUMBERS = frozenset((float, int, bool, type(None)))
_SCALARS = frozenset((str, float, int, bool, type(None)))


class _Sink:
    """The records of one block format, kept as value tuples grouped by their field names (filled while
    the records are fresh; turned into columns once, at the end)."""

    __slots__ = ("n", "groups", "batches")

    def __init__(self) -> None:
        self.n = 0
        self.groups: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
        self.batches: dict[tuple[str, ...], list[tuple[int, Sequence[int], Sequence[Sequence[Any]]]]] = {}

    def add(self, line: int, rec: Record) -> None:
        """Append one record found at 1-based `line`."""
        key = tuple(rec)
        rows = self.groups.get(key)
        if rows is None:
            rows = self.groups[key] = []
        rows.append((self.n, line, *rec.values()))
        self.n += 1

    def add_rows(self, lines: Sequence[int], rows: Rows) -> None:
        """Append records that share their field names: `rows.values[j]` found at 1-based `lines[j]`."""
        self.batches.setdefault(rows.keys, []).append((self.n, lines, rows.values))
        self.n += len(lines)

    def columns(self, types: Mapping[str, str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Line numbers and typed columns (NaN / None where a record lacks the field), in insertion order."""
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
        for key, batches in self.batches.items():
            at = np.concatenate([np.arange(s0, s0 + len(ln), dtype=np.int64) for s0, ln, _ in batches])
            lines[at] = list(itertools.chain.from_iterable(ln for _, ln, _ in batches))
            vals = list(zip(*itertools.chain.from_iterable(v for _, _, v in batches), strict=True))
            for c, v in zip(key, vals, strict=True):
                if c in types:
                    parts.setdefault(c, []).append((at, v))
        cols: dict[str, np.ndarray] = {}
        for c, pieces in parts.items():
            if types[c] == "float":
                arr = np.full(n, np.nan)
                for at, v in pieces:
                    arr[at] = _floats(v)
            else:
                arr = np.empty(n, object)  # None-filled
                for at, v in pieces:
                    arr[at] = _objects(v)
            cols[c] = arr
        return lines, cols


def _floats(vals: Sequence[Any]) -> np.ndarray:
    """Numbers as float64; None and anything not a number -> NaN."""
    if set(map(type, vals)) <= _NUMBERS:
        try:
            return np.array(vals, dtype=np.float64)
        except (OverflowError, ValueError, TypeError):
            pass
    return np.array([v if isinstance(v, (int, float)) else np.nan for v in vals], dtype=np.float64)


def _objects(vals: Sequence[Any]) -> np.ndarray:
    """Values as one object cell each (lists and dicts stay single cells)."""
    arr = np.empty(len(vals), object)
    if set(map(type, vals)) <= _SCALARS:
        arr[:] = vals
    else:
        for j, v in enumerate(vals):
            arr[j] = v
    return arr


def _or(arr: np.ndarray | None, default: str, n: int) -> np.ndarray:
    """`arr` with `default` where it has None (a record that did not set its own engine / kind)."""
    if arr is None:
        return _const(n, default)
    arr[pd.isna(arr)] = default
    return arr


def _const(n: int, value: str) -> np.ndarray:
    return np.full(n, value, dtype=object)


def _to_numpy(arr: pa.Array, typ: str) -> np.ndarray:
    if typ == "list":
        out = np.empty(len(arr), object)
        for j, v in enumerate(arr.to_pylist()):
            out[j] = v
        return out
    return arr.to_numpy(zero_copy_only=False)


def parse(source: Any, kinds: str | Iterable[str] | None = None, *, registry: Registry | None = None,
          block_bytes: int = DEFAULT_BLOCK_BYTES) -> pd.DataFrame:
    """Parse server logs into one DataFrame (schema: see the module docstring).

    `source`: a path (plain or gzip), log text, bytes, a binary/text file object, or an iterable of
    lines. `kinds`: keep only these kinds or engines (e.g. "decode", "nccl", "llamacpp:request_timing").
    `registry`: the formats to use (default: all registered). `block_bytes`: how much is read at once.
    Unrecognised, truncated or binary lines are counted in ``df.attrs["unparsed_lines"]``, never fatal.
    """
    reg = registry if registry is not None else _DEFAULT
    wanted = None if kinds is None else ({kinds} if isinstance(kinds, str) else set(kinds))
    plan = _Plan(reg.select(kinds))
    if block_bytes < 1:
        raise ConfigError(f"block_bytes: must be positive, got {block_bytes}")
    errors: list[str] = []
    stream = _Stream(_line_blocks(_raw_blocks(source, block_bytes, errors), block_bytes))
    huge = _madvise_hugepage(False)
    collect = gc.isenabled()
    gc.disable()  # parse makes millions of objects and no cycles: the cyclic GC would only rescan them
    try:
        for ch in stream:
            plan.process(ch, stream)
        df = plan.result(wanted)
    finally:
        if collect:
            gc.enable()
        if huge is not None:
            _madvise_hugepage(huge)
    df.attrs["read_error"] = errors[0] if errors else None
    return df


def _madvise_hugepage(enabled: bool) -> bool | None:
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


def summary(df: pd.DataFrame, *, registry: Registry | None = None) -> pd.DataFrame:
    """Per engine and kind (and DP rank where several print): record count and median of key metrics.

    Long format: one row per (engine, kind[, dp_rank], metric) with `count` (records), `n` (records
    with that metric) and `median`; metrics no record printed are left out, and a kind without any
    gets one row with metric None.
    """
    reg = registry if registry is not None else _DEFAULT
    rows: list[dict[str, Any]] = []
    if df.empty:
        return pd.DataFrame(columns=["engine", "kind", "dp_rank", "count", "metric", "n", "median"])
    for (engine, kind), g in df.groupby(["engine", "kind"], sort=False, observed=True):
        metrics = [m for m in reg.key_metrics(str(engine), str(kind)) if m in g]
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
