"""Regex fragments the formats share (RE2 syntax, also valid Python `re`) and scalar text helpers.

Fragments: :data:`NUM` (a number as logs print it, ``inf``/``nan`` included), :data:`LIST` (comma-separated
numbers), :data:`TS_ISO` (an ISO-8601 timestamp at the start of a line, optionally in ``[...]``; the group
is named ``timestamp``), (ANSI colour sequences: `spectrial.logs.chunks.ANSI`).
"""

from __future__ import annotations

import re

try:  # optional: Aho-Corasick searches for many strings at once (marker lines, patterns' fixed text)
    import ahocorasick_rs
except ImportError:  # pragma: no cover - depends on the environment
    ahocorasick_rs = None

NUM = r"(?:[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?(?:inf|Inf|INF|nan|NaN))"
LIST = rf"{NUM}(?:\s*,\s*{NUM})*"
TS_ISO = (r"^\[?(?P<timestamp>[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]+)?"
          r"(?:Z|[+-][0-9]{2}:?[0-9]{2})?)")
WS = r"[ \t\n\r\f\v]"  # Python's ASCII whitespace (RE2's \s lacks \v): for patterns that must agree with str.strip()


_NUM_PY = re.compile(rf"^\s*({NUM})")


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


def bnum(text: bytes) -> float | None:
    """:func:`num` of plain ASCII bytes (the same value, without decoding the common case)."""
    if text[-1:].isdigit():
        try:
            return float(text)
        except ValueError:
            pass
    return num(text.decode())




def re2(pattern: str) -> str:
    """`pattern` (Python `re` syntax) for RE2 on plain text: ``\\s`` and ``\\S`` as Python's ASCII whitespace
    (RE2's lacks ``\\v``). Other constructs the formats use mean the same to both engines on plain text."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt == "s":
                out.append(r"\t\n\v\f\r " if in_class else WS)
            elif nxt == "S" and not in_class:
                out.append(r"[^\t\n\v\f\r ]")
            else:
                out.append(c + nxt)
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
            out.append(c)
            if pattern[i + 1:i + 2] == "^":
                out.append("^")
                i += 1
            if pattern[i + 1:i + 2] == "]":  # a ']' first in a class is a literal
                out.append("]")
                i += 1
        elif c == "]" and in_class:
            in_class = False
            out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


def named(pattern: str, name: str = "v") -> str:
    """`pattern` with its first unnamed capturing group named `name` (arrow's RE2 wants every group named)."""
    return re.sub(r"(?<!\\)\((?!\?)", f"(?P<{name}>", pattern, count=1)
