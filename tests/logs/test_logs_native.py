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
import os
import random
import subprocess
import sys
from pathlib import Path

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
        bad = [(lines[i], a, b) for i, (a, b) in enumerate(zip(gl, wl, strict=True)) if a != b]
        assert not bad, f"{fmt.engine}/{fmt.kind}.{name}: {len(bad)} rows differ, first {bad[0]!r}"


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
