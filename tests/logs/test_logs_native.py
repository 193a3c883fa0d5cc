"""The compiled line pass (spectrial.logs.native: PCRE2 in C) gives exactly what arrow's reading gives.

Every registered LineFormat, on every line of the fixtures and of the public corpus holding one of its markers,
and on those lines mutated (odd bytes, cut, doubled separators): ``native.extract`` against
``LineFormat.extract`` (RE2 kernels, the reference), column by column, with the same columns, types and
values. Lines that are not plain ASCII go to arrow inside the pass: the mutations put such lines among plain
ones, so the merge is checked too. The pass must be on here (this machine has cc and libpcre2): a test says so,
and the whole parse of a fixture is the same with the pass off (``SPECTRIAL_LOGS_NATIVE=0``, a fresh process).
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from test_logs_vector import CORPUS, LINES, NOISE, corpus_texts

from spectrial.logs import LineFormat, native, registry

LINE_FORMATS = [f for f in registry.formats if isinstance(f, LineFormat)]
CORPUS_LINES = [ln for text in corpus_texts() for ln in text.splitlines() if ln.strip()]
ALL_LINES = LINES + CORPUS_LINES


def marker_lines(fmt: LineFormat, lines: list[str]) -> list[str]:
    return [ln for ln in lines if any(m in ln for m in fmt.markers)]


def mutate(lines: list[str], seed: int) -> list[str]:
    rnd = random.Random(seed)
    out = []
    for ln in lines:
        k = rnd.randrange(6)
        if k == 0:
            at = rnd.randrange(len(ln) + 1)
            ln = ln[:at] + rnd.choice(NOISE) + ln[at:]
        elif k == 1:
            ln = ln[: rnd.randrange(len(ln) + 1)]
        elif k == 2:
            ln = ln.replace(", ", rnd.choice([", , ", ",  ", ": , ", ", "]), 1)
        elif k == 3:
            ln = ln.replace(": ", rnd.choice([": : ", ":  ", " : ", ": "]), 1)
        out.append(ln)
    return out


def assert_same(fmt: LineFormat, lines: list[str]) -> None:
    # as the driver gives them (each line with its newline) and without
    check_same(fmt, [ln + "\n" for ln in lines])
    check_same(fmt, lines)


def check_same(fmt: LineFormat, lines: list[str]) -> None:
    arr = pa.array(lines, pa.string())
    want = fmt.extract(arr)
    got = native.extract(fmt, arr)
    assert got is not None, f"{fmt.engine}/{fmt.kind}: the compiled pass declined plain string lines"
    assert sorted(got) == sorted(want), f"{fmt.engine}/{fmt.kind}: columns differ"
    for name, w in want.items():
        g = got[name]
        assert g.type == w.type, f"{fmt.engine}/{fmt.kind}.{name}: {g.type} != {w.type}"
        gl, wl = g.to_pylist(), w.to_pylist()
        bad = [(lines[i], a, b) for i, (a, b) in enumerate(zip(gl, wl, strict=True)) if not same(a, b)]
        assert not bad, f"{fmt.engine}/{fmt.kind}.{name}: {len(bad)} rows differ, first {bad[0]!r}"


def same(a: object, b: object) -> bool:
    """Equal values; floats to the bit but NaN's payload (NaN is NaN, -0.0 is not 0.0); None is only None."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def test_the_compiled_pass_is_on_here() -> None:
    # cc and libpcre2-8.so.0 are on every machine make test runs on; off would silently test arrow twice
    assert native.status().startswith("on:"), native.status()


@pytest.mark.parametrize("fmt", LINE_FORMATS, ids=lambda f: f"{f.engine}/{f.kind}")
def test_each_line_format_reads_alike(fmt: LineFormat) -> None:
    # a format no fixture or corpus line shows still reads its bare markers alike
    lines = marker_lines(fmt, ALL_LINES) or [f"x {m} 1.5 y" for m in fmt.markers]
    assert_same(fmt, lines)
    for seed in range(4):
        assert_same(fmt, mutate(lines, seed))


def test_keys_and_patterns_on_made_up_lines() -> None:
    # the key list's edge cases: a key glued to a head, a clipped key, a repeated key, odd spacing, a % value,
    # an empty value, a value with a closing period; and a line of another format among them
    fmt = next(f for f in LINE_FORMATS if f.keys)
    keys = list(fmt.keys)
    k0, k1 = keys[0], keys[-1]
    lines = [f"[x] Decode batch. {k0}: 1, {k1}: 2.5%, {k0}: 9", f"{k0}:  3 ms., {k1}: ,", f"zz{k0[2:]}: 4",
             f"{k0}: : 5, x: {k1}: 6)", f"{k0}:\t7\t, {k1}: 8%%", "no keys here", f"{k0}: 1e3, {k1}: nan"]
    assert_same(fmt, lines)


def test_odd_lines_go_to_arrow_and_come_back_in_place() -> None:
    fmt = next(f for f in LINE_FORMATS if f.patterns and marker_lines(f, ALL_LINES))
    lines = marker_lines(fmt, ALL_LINES)[:50]
    mixed = [ln if i % 3 else ln + " é" for i, ln in enumerate(lines)]
    assert_same(fmt, mixed)


def test_the_parse_is_the_same_with_the_pass_off(tmp_path: Path) -> None:
    log = tmp_path / "mixed.log"
    log.write_text("\n".join(ALL_LINES) + "\n")
    script = ("import sys, pickle; from spectrial.logs import parse_tables, native; "
              "t = parse_tables(sys.argv[1], workers=1); "
              "sys.stdout.buffer.write(pickle.dumps((native.status()[:3], {k: v for k, v in t.items()})))")
    import pickle

    got = {}
    for flag in ("1", "0"):
        env = {**os.environ, "SPECTRIAL_LOGS_NATIVE": flag}
        done = subprocess.run([sys.executable, "-c", script, str(log)], capture_output=True, env=env, timeout=300,
                              check=True)
        got[flag] = pickle.loads(done.stdout)
    assert got["1"][0] == "on:" and got["0"][0] == "off"
    on, off = got["1"][1], got["0"][1]
    assert sorted(on) == sorted(off)
    for kind in on:
        assert on[kind].equals(off[kind]), f"{kind}: the table differs with the compiled pass off"


def test_the_corpus_gives_lines_where_it_is_there() -> None:
    # the parity above is only as good as its lines: the public corpus beside the checkout adds hundreds
    if not CORPUS.exists():
        pytest.skip(f"no corpus at {CORPUS}")
    assert len(CORPUS_LINES) > 500, json.dumps(str(CORPUS))


# --- the numbers the pass reads in C (plain decimals), the rest as arrow does, column by column ----------------
# a made-up format: a float with an X__pct group, a float two patterns fill (the first that matches wins), one
# that takes any text (so an odd value sends its column of the batch to Python), a text column (trimmed, "" null),
# and `key: value` floats (one with percent)
NUMBERS = LineFormat("test", "numbers", markers=("m:",), patterns=(
    r"m: a=(?P<a>[^ %|]*)(?P<a__pct>%?)\|",
    r"b=(?P<b>[-+.0-9eE]+)",
    r"bb=(?P<b>[^ |]*)\| c=(?P<c>[^|]*)\|",
    r"t=(?P<t>[^|]*)\|(?: u=(?P<u>[0-9.]*))?",
    r"c2=(?P<c>\S+)",
), types={"t": "str"}, keys={"k1": "k1", "k2": "k2", "kk": "k2"}, percent=("k1",))
ODD = ["inf", "-inf", "nan", "-NaN", "Infinity", "1_000", " 1", "1 ", "1e400", "-1e400", "1e-400", "4e-320", "0x10",
       "1.2.3", "abc", "+", "-", ".", "1e", ".e5", "1e+", "--1", "1.5.", "1,5", "1e5.5", "9" * 400, "12ms"]


def plain_number(rnd: random.Random, exponents: tuple[int, ...] = (0, 1, 5, 15, 22, 23, 30, 200)) -> str:
    """A random plain decimal: sign, up to 25 digits around a point (or a point first), an exponent (by default
    one that keeps it a normal finite double)."""
    sign = rnd.choice(["", "", "-", "+"])
    whole = "".join(rnd.choice("0123456789") for _ in range(rnd.choice([0, 1, 1, 2, 3, 5, 8, 15, 16, 17, 20, 25])))
    frac = "".join(rnd.choice("0123456789") for _ in range(rnd.choice([0, 0, 1, 2, 3, 6, 10, 17])))
    if not whole and not frac:
        whole = rnd.choice(["0", "7"])
    text = whole + ("." + frac if frac or (whole and rnd.random() < 0.2) else "")
    if rnd.random() < 0.3:
        text += rnd.choice("eE") + rnd.choice(["", "+", "-"]) + str(rnd.choice(exponents))
    return sign + text


def number_lines(rnd: random.Random, count: int, odd: float) -> list[str]:
    def value() -> str:
        return rnd.choice(ODD) if rnd.random() < odd else plain_number(rnd)

    lines = []
    for _ in range(count):
        parts = ["m:"]
        if rnd.random() < 0.8:
            parts.append(f"a={value()}{rnd.choice(['', '%', '%%'])}|")
        if rnd.random() < 0.5:
            parts.append(f"b={value()}")
        if rnd.random() < 0.5:
            parts.append(f"bb={value()}| c={value()}|")
        if rnd.random() < 0.5:
            parts.append(f"t={rnd.choice(['', ' ', 'x', '  y z ', chr(9) + 'w'])}| u={plain_number(rnd)}")
        if rnd.random() < 0.3:
            parts.append(f"c2={value()}")
        if rnd.random() < 0.6:
            keys = [f"{k}: {value()}{rnd.choice(['', '%', ' tok/s', '.'])}" for k in rnd.sample(["k1", "k2", "kk"], 2)]
            parts.append(", ".join(["x: 1", *keys]))
        if rnd.random() < 0.05:
            parts.append("é")  # a line that is not plain ASCII: arrow reads it inside the pass
        lines.append(" ".join(parts))
    return lines


@pytest.mark.parametrize("odd", [0.0, 0.002, 0.05, 0.5])
def test_numbers_read_in_c_and_python_alike(odd: float) -> None:
    # batches of plain numbers (every column read in C), one odd value among many (its column of that batch read
    # by convert / to_float), and many odd ones
    rnd = random.Random(int(odd * 1000))
    for _ in range(6):
        assert_same(NUMBERS, number_lines(rnd, 400, odd))


def test_one_odd_number_sends_only_its_column_of_the_batch_to_python() -> None:
    plain = [f"m: a={i}.5%| b={i}e-3 k1: {i}%, k2: 0.{i}" for i in range(1, 50)]
    for value in ["inf", "nan", "1_0", "1e999", ""]:
        for line in [f"m: a={value}| b=1", f"m: a=1| bb={value}| c=x|", f"m: x: 1, k1: {value}%, k2: {value}"]:
            assert_same(NUMBERS, [*plain, line, *plain])


def test_plain_numbers_are_correctly_rounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # halfway cases, long mantissas, exponents near the ends: the C reading (Clinger's exact cases, else strtod) is
    # float()'s and arrow's, bit for bit; numbers that under- or overflow send their column to Python
    rnd = random.Random(7)
    texts = [plain_number(rnd, (0, 1, 5, 15, 16, 21, 22, 23, 24, 30, 100, 290, 300, 307, 308, 320, 330))
             for _ in range(30000)]
    texts += ["9007199254740993", "9007199254740992.5", "1e23", "8.98846567431158e307", "2.2250738585072014e-308",
              "0.1", "-0", "-0.0e5", "+.5", "5.", "123456789012345e-22", "123456789012345e22", "1234567890123456e-5",
              "0." + "0" * 30 + "1", "1" + "0" * 40, "17976931348623157e292", "0e999999999999999999", "000000.5",
              "999999999999999e22", "1.00000000000000011102230246251565404236316680908203125",
              "1.00000000000000011102230246251565404236316680908203124", "1" * 120]
    normal = [t for t in texts if 2.2250738585072014e-308 <= abs(float(t)) < math.inf
              or not any(c in "123456789" for c in t.lower().split("e")[0])]  # zero: 0, -0.0e5
    assert len(texts) - len(normal) > 100  # under- and overflows among them
    lines = [f"m: a={t}|" for t in normal]
    with monkeypatch.context() as m:  # every number of these batches read in C
        m.setattr(native, "convert", lambda *a: pytest.fail("a plain number was read in Python"))
        got = native.extract(NUMBERS, pa.array(lines))
    assert got is not None
    for text, v in zip(normal, got["a"].to_pylist(), strict=True):
        assert v is not None and same(v, float(text)), (text, v, float(text))
    assert_same(NUMBERS, lines)
    for k in range(0, len(texts), 1000):
        assert_same(NUMBERS, [f"m: a={t}|" for t in texts[k:k + 1000]])


def test_rows_are_read_in_place() -> None:
    # the driver's call: the chunk's lines and the rows to read (not copied), against arrow over the rows taken
    rnd = random.Random(3)
    lines = [ln if i % 3 else "other line" for i, ln in enumerate(number_lines(rnd, 600, 0.01))]
    arr = pa.array([ln + "\n" for ln in lines])
    for rows in [np.arange(0, 600, 3) + 1, np.array([5, 1, 1, 599, 0]), np.flatnonzero(np.arange(600) % 3)]:
        rows = rows.astype(np.int64)
        want = NUMBERS.extract(arr.take(pa.array(rows)))
        got = native.extract(NUMBERS, arr, rows)
        assert got is not None and sorted(got) == sorted(want)
        for name, w in want.items():
            assert got[name].type == w.type, name
            assert all(same(x, y) for x, y in zip(got[name].to_pylist(), w.to_pylist(), strict=True)), name
    assert native.extract(NUMBERS, arr, np.array([0, 600])) is None  # a row past the lines: declined, nothing read
    assert native.extract(NUMBERS, arr, np.array([-1])) is None
    part = arr.slice(10, 20)  # an array that starts inside its buffers
    got = native.extract(NUMBERS, part, np.array([19, 0, 7]))
    want = NUMBERS.extract(part.take(pa.array([19, 0, 7])))
    assert got is not None and all(got[c].equals(w) for c, w in want.items())


def test_a_segments_lines_are_counted_as_its_offsets_count_them() -> None:
    """`count_lines` (memchr in C) gives what the line offsets give: a last line without a newline counts, an
    empty input has none; on edge inputs and random bytes with newlines at random places."""
    from spectrial.logs.chunks import line_offsets

    rng = random.Random(5)
    cases = [b"", b"a", b"\n", b"\n\n", b"a\nb", b"a\nb\n", b"\r\n", b"\x00\n\x00", "é\n".encode() * 3]
    for _ in range(200):
        n = rng.randint(0, 300)
        cases.append(bytes(rng.choice(b"ab\n\r\x00\xff") for _ in range(n)))
    for data in cases:
        assert native.count_lines(data) == len(line_offsets(data)) - 1, data
