"""Python reprs printed into logs: keyword arguments (``ServerArgs(a=1, b='x', ...)``, vLLM's engine config)
and dict literals (vLLM's ``non-default args: {...}``), read as far as they go (a dump cut off or elided
with ``...`` keeps what precedes the damage)."""

from __future__ import annotations

import ast
import contextlib
import copy
import itertools
import re
import sys
from typing import Any, TypeAlias

PyValue: TypeAlias = ("None | bool | int | float | complex | str | bytes | list[PyValue] | tuple[PyValue, ...] "
                      "| set[PyValue] | frozenset[PyValue] | dict[PyValue, PyValue]")
"""A Python literal, as ``ast.literal_eval`` reads one (dumps of arguments and configs in logs)."""


def _scan_value(text: str, i: int) -> tuple[str, int, bool]:
    """Read one value from text[i:]; returns (value, end, closed) where closed means the dump's ')'."""
    depth: list[str] = []
    quote = ""
    j = i
    while j < len(text):
        c = text[j]
        if quote:
            if c == "\\":
                j += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth.append(c)
        elif c in ")]}":
            if not depth:
                return text[i:j], j, c == ")"
            depth.pop()
        elif c == "," and not depth:
            return text[i:j], j, False
        j += 1
    return text[i:j], j, False


_LITERALS: dict[str, Any] = {}  # text -> value: dumps repeat the same lists and dicts (copied out: they are mutable)


def _literal(value: str) -> Any:
    v = value.strip()
    got = _LITERALS.get(v, _LITERALS)
    if got is _LITERALS:
        got = v
        if len(v) <= 20000:
            with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                got = ast.literal_eval(v)
        if len(v) <= 2000:
            if len(_LITERALS) > 1024:
                _LITERALS.clear()
            _LITERALS[v] = got
    if isinstance(got, _ATOMS):
        return got
    if isinstance(got, list) and all(isinstance(x, _ATOMS) for x in got):  # the usual list of numbers or names
        return got.copy()
    return copy.deepcopy(got)


_ATOMS = (str, int, float, complex, bytes, bool, type(None))


def values(texts: list[str], bracketed: list[bool]) -> list[PyValue]:
    """The values of a dump's items as parse_kwargs reads them: a bracketed or escaped one with _literal, a simple
    one with _simple_value (its text without trailing whitespace)."""
    out = list(map(_VALUES.get, texts, itertools.repeat(_MISSING)))
    for j, odd in enumerate(bracketed):
        if odd:
            out[j] = _literal(texts[j])
        elif out[j] is _MISSING:
            out[j] = _simple_value(texts[j])
    return out


# one `key=value`: a simple value (quoted without escapes, or no brackets) up to `,` / `)`, or the start of
# a bracketed / escaped value that _scan_value reads
_ITEM = re.compile(r"""([A-Za-z_][A-Za-z0-9_]*)=(?:('[^'\\\n]*'|"[^"\\\n]*"|[^,()\[\]{}'"\n]*?)\s*(?=[,)]|$)|(?=.))""")
_PAREN = re.compile(r"\s*\)")
_CONST = {"None": None, "True": True, "False": False}


_VALUES: dict[str, PyValue] = {}  # value text -> value: dumps repeat the same few (None, False, 1, 'auto')


def _simple_value(v: str) -> Any:
    got = _VALUES.get(v, _VALUES)
    if got is not _VALUES:
        return got
    if len(_VALUES) > 8192:
        _VALUES.clear()
    got = _VALUES[v] = _convert_value(v)
    return got


def _convert_value(v: str) -> Any:
    if v in _CONST:
        return _CONST[v]
    if v[:1] in ("'", '"') and len(v) >= 2:
        return v[1:-1]
    if v.isascii() and v.isdigit():  # the common number, without the cost of an exception below
        return int(v)
    try:
        return int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return v


# a run of `key=value, ` items whose values hold no bracket, comma or escape: split with str.split (the
# regex loop below reads them the same way, one by one)
_PLAIN_ITEMS = re.compile(r"""(?:[A-Za-z_][A-Za-z0-9_]*=(?:'[^',\\\n]*'|"[^",\\\n]*"|[^,()\[\]{}'"\n]*), )*""")


_MISSING = object()


def _plain_items(run: str, out: dict[str, PyValue]) -> None:
    """`key=value, key=value` (a run _PLAIN_ITEMS matched, without its last ", ") into `out`, each value as
    _simple_value reads it (rstripped), later keys winning: the loop ``for item in run.split(", "): key, _, value =
    item.partition("="); out[key] = _simple_value(value.rstrip())``, its steps done by C-level maps (a dump holds
    ~90 of them, and the values repeat: the cache answers most)."""
    pairs = dict(map(str.split, run.split(", "), itertools.repeat("="), itertools.repeat(1)))
    texts = list(map(str.rstrip, pairs.values()))
    values = list(map(_VALUES.get, texts, itertools.repeat(_MISSING)))
    if _MISSING in values:
        values = [_simple_value(t) if v is _MISSING else v for v, t in zip(values, texts, strict=True)]
    out.update(zip(map(sys.intern, pairs), values, strict=True))  # one key object per name: pickled once


def parse_kwargs(text: str) -> tuple[dict[str, PyValue], bool]:
    """`a=1, b='x', c=[1, 2]` (a Python repr of keyword arguments) -> (dict, closed by ')')."""
    out: dict[str, PyValue] = {}
    pos = 0
    while True:
        start = pos + 2 if text.startswith(", ", pos) else pos  # a search from `pos` starts its match there
        end = _PLAIN_ITEMS.match(text, start).end()  # type: ignore[union-attr]  # (matches "" at least)
        if end > start:
            _plain_items(text[start:end - 2], out)
            pos = end
        # the next item, wherever it starts: a simple one (then the run above again: a search from its end finds
        # what the run reads, item by item), or a bracketed or escaped value, which _scan_value reads
        m = _ITEM.search(text, pos)
        if m is None:
            return out, False
        value = m.group(2)
        if value is not None:
            out[m.group(1)] = _simple_value(value)
            pos = m.end()
            if text[pos:pos + 1] != "," and _PAREN.match(text, pos):
                return out, True
            continue
        value, end, closed = _scan_value(text, m.end())
        out[m.group(1)] = _literal(value)
        if closed:
            return out, True
        pos = max(end, m.end() + 1)


def parse_mapping(text: str) -> tuple[dict[Any, Any], bool]:
    """`{'a': 1, 'b': {'c': 2}}` (a dict literal) -> (dict, complete). A literal that does not evaluate (cut
    off, or elided with ``...``) is read item by item: each `key: value` pair at the top level whose key
    evaluates, nested dicts the same way, other unreadable values as text."""
    t = text.strip()
    if t.startswith("{") and len(t) <= 200000:
        try:
            got = ast.literal_eval(t)
            if isinstance(got, dict):
                return got, True
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    return _items(t[1:] if t.startswith("{") else t), False


def _items(text: str) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    i = 0
    while i < len(text):
        item, end, closed = _scan_value(text, i)
        key, sep, value = _split_pair(item)
        if sep:
            try:
                k = ast.literal_eval(key.strip())
                hash(k)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                k = None
            if k is not None:
                v = value.strip()
                out[k] = parse_mapping(v)[0] if v.startswith("{") else _literal(v)
        if closed or end >= len(text):
            break
        i = end + 1
    return out


def _split_pair(item: str) -> tuple[str, str, str]:
    """`'k': v` -> ('k', ':', v), splitting at the first top-level colon (not inside quotes or brackets)."""
    quote = ""
    depth = 0
    j = 0
    while j < len(item):
        c = item[j]
        if quote:
            if c == "\\":
                j += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == ":" and depth == 0:
            return item[:j], ":", item[j + 1:]
        j += 1
    return item, "", ""

