"""Column types and the conversions between text captures, arrow arrays and numpy columns.

A column type is one of :data:`COLUMN_TYPES`: ``float`` (float64, NaN where absent), ``str``, ``bool``,
``list`` (a list of floats per cell) or ``object`` (any Python value, e.g. a dict); all but ``float`` are
object columns in the DataFrame, None where absent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spectrial.errors import ConfigError
from spectrial.logs.text import NUM, WS, num

COLUMN_TYPES = ("float", "str", "bool", "list", "object")
ARROW_TYPES = {"float": pa.float64(), "str": pa.string(), "bool": pa.bool_(), "list": pa.list_(pa.float64())}
# numbers that float() and arrow's cast (after trimming) read alike; text with a number ahead, as num()'s
# regex reads it; text that float() reads its own way (non-ASCII, \x1c-\x1f, `_`): num() one by one
_SIMPLE_NUMBER = rf"^{WS}*[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$"
_LEADING_NUMBER = rf"^{WS}*(?P<v>{NUM})"
_ODD = r"[^\x00-\x7f]|[\x1c-\x1f_]"
_NUMBERS = frozenset((float, int, bool, type(None)))
_SCALARS = frozenset((str, float, int, bool, type(None)))


def check_types(cols: Mapping[str, str], where: str) -> None:
    """Raise ConfigError naming `where` (``engine/kind``) if a column type is unknown."""
    bad = {k: v for k, v in cols.items() if v not in COLUMN_TYPES}
    if bad:
        raise ConfigError(f"columns: {where} uses unknown column types {bad}; use one of {COLUMN_TYPES}")


def blank_to_null(arr: pa.Array) -> pa.Array:
    """`arr` with "" as null (an optional regex group that did not take part captures "")."""
    return pc.if_else(pc.equal(arr, ""), pa.scalar(None, arr.type), arr)


def merge_captures(out: dict[str, pa.Array], parts: Mapping[str, pa.Array], types: Mapping[str, str]) -> None:
    """One pattern's captures (column -> text, null where it did not match) into `out`: each typed, divided by 100
    where its `X__pct` group captured a ``%``, filling only what `out` still lacks (the first pattern wins)."""
    for name, arr in parts.items():
        if name.endswith("__pct"):
            continue
        typed = convert(arr, types[name])
        pct = parts.get(name + "__pct")
        if pct is not None:
            typed = pc.if_else(pc.is_valid(blank_to_null(pct)), pc.divide(typed, 100.0), typed)
        prev = out.get(name)
        out[name] = typed if prev is None else pc.coalesce(prev, typed)


def convert(arr: pa.Array, typ: str) -> pa.Array:
    """String captures -> a typed arrow array; never raises on odd text."""
    if typ == "float":
        for attempt in (arr, blank_to_null(arr)):
            try:
                return pc.cast(attempt, pa.float64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                continue
        return pa.array([num(s) for s in arr.to_pylist()], type=pa.float64())
    arr = blank_to_null(arr)
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


def to_float(arr: pa.Array) -> np.ndarray:
    """Strings -> float64 by arrow's cast, or by :func:`num` one by one where the cast refuses one."""
    try:
        return pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return np.array([num(s) for s in arr.to_pylist()], dtype=float)


def numbers(arr: pa.Array, fallback: Callable[[str], float | None] = num) -> tuple[np.ndarray, np.ndarray]:
    """:func:`num` (or `fallback`) of every string: (values, found), NaN and False where it gives None.

    With num: plain numbers ("12", " -0.5", "1e5") are cast, and text with a number ahead ("12 ms",
    "1.64x", "inf") reads its leading number, in one go each; only text with non-ASCII characters,
    \\x1c-\\x1f or ``_`` (which float() reads its own way) goes through num() one by one. Another
    `fallback` reads everything but plain numbers one by one."""
    n = len(arr)
    out = np.full(n, np.nan)
    found = np.zeros(n, dtype=bool)
    if n == 0:
        return out, found
    if arr.null_count == 0:
        try:  # every string a number: one cast; a finite result is what float() and so num() read too
            out = pc.cast(pc.ascii_trim_whitespace(arr), pa.float64()).to_numpy(zero_copy_only=False).copy()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        else:
            found[:] = True
            odd = np.flatnonzero(~np.isfinite(out))  # inf / nan: num() reads only some spellings
            for j, text in zip(odd.tolist(), arr.take(pa.array(odd)).to_pylist(), strict=True):
                v = fallback(text)
                out[j] = np.nan if v is None else v
                found[j] = v is not None
            return out, found
    simple = _np_bool(pc.match_substring_regex(arr, _SIMPLE_NUMBER))
    idx = np.flatnonzero(simple)
    if len(idx):
        part = arr if len(idx) == n else arr.take(pa.array(idx))
        out[idx] = pc.cast(pc.ascii_trim_whitespace(part), pa.float64()).to_numpy(zero_copy_only=False)
        found[idx] = True
        if len(idx) == n:
            return out, found
    rest = ~simple & _np_bool(pc.is_valid(arr))
    if fallback is num:
        odd = rest & _np_bool(pc.match_substring_regex(arr, _ODD))
        lead = np.flatnonzero(rest & ~odd)
        if len(lead):
            got = pc.struct_field(pc.extract_regex(arr.take(pa.array(lead)), _LEADING_NUMBER), [0])
            ok = _np_bool(pc.is_valid(got))
            out[lead[ok]] = pc.cast(got.filter(pa.array(ok)), pa.float64()).to_numpy(zero_copy_only=False)
            found[lead[ok]] = True
        rest = odd
    py = np.flatnonzero(rest)
    for j, text in zip(py.tolist(), arr.take(pa.array(py)).to_pylist(), strict=True):
        v = fallback(text)
        if v is not None:
            out[j] = v
            found[j] = True
    return out, found


def _np_bool(arr: pa.Array) -> np.ndarray:
    return pc.fill_null(arr, False).to_numpy(zero_copy_only=False)


def to_numpy(arr: pa.Array, typ: str) -> np.ndarray:
    """An arrow column as the DataFrame holds it (lists as one Python list per cell)."""
    if typ == "list":
        out = np.empty(len(arr), object)
        for j, v in enumerate(arr.to_pylist()):
            out[j] = v
        return out
    return arr.to_numpy(zero_copy_only=False)


def floats(vals: Sequence[Any]) -> np.ndarray:
    """Numbers as float64; None and anything not a number -> NaN."""
    if set(map(type, vals)) <= _NUMBERS:
        try:
            return np.array(vals, dtype=np.float64)
        except (OverflowError, ValueError, TypeError):
            pass
    return np.array([v if isinstance(v, (int, float)) else np.nan for v in vals], dtype=np.float64)


def objects(vals: Sequence[Any]) -> np.ndarray:
    """Values as one object cell each (lists and dicts stay single cells)."""
    arr = np.empty(len(vals), object)
    if set(map(type, vals)) <= _SCALARS:
        arr[:] = vals
    else:
        for j, v in enumerate(vals):
            arr[j] = v
    return arr


def const(n: int, value: Any) -> np.ndarray:
    """An object column of `n` times `value`."""
    return np.full(n, value, dtype=object)
