"""Property tests: mutated real lines, random bytes and random block sizes never raise or lose records."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectrial.logs import parse

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"
SNIPPETS = [p.read_text() for p in sorted(FIXTURES.glob("*.log"))]
LINES = [ln for text in SNIPPETS for ln in text.splitlines() if ln.strip()]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NOISE = st.sampled_from(["\x1b[32m", "\x1b[0m", "?[1m", "\r", "\x00", "\t", "%", ",", ": ", "=", "(", ")", "[",
                         "]", "|", "█", "\ufffd", "nan", "inf", "-1e309", "99999999999999999999", " "])


@st.composite
def mutated_line(draw: st.DrawFn) -> str:
    line = draw(st.sampled_from(LINES))
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(line)))
        op = draw(st.sampled_from(["cut", "drop", "insert", "glue", "digits"]))
        if op == "cut":
            line = line[:i]
        elif op == "drop":
            line = line[:i] + line[i + draw(st.integers(1, 20)):]
        elif op == "insert":
            line = line[:i] + draw(st.one_of(NOISE, st.text(max_size=8))) + line[i:]
        elif op == "glue":
            line = line[:i] + draw(st.sampled_from(LINES))
        else:
            line = "".join(draw(st.sampled_from("0.-9x%")) if c.isdigit() else c for c in line)
    return line


def check(df: pd.DataFrame, n_lines: int) -> None:
    assert df.attrs["parser_errors"] == []
    assert 0 <= df.attrs["unparsed_lines"] <= df.attrs["lines"]
    assert df["line"].between(1, max(n_lines, 1)).all()
    assert df["line"].is_monotonic_increasing


@SETTINGS
@given(st.lists(mutated_line(), min_size=1, max_size=40))
def test_mutated_real_lines_never_raise(lines: list[str]) -> None:
    text = "\n".join(lines)
    df = parse(text)
    check(df, text.count("\n") + 1)


@SETTINGS
@given(st.binary(max_size=3000))
def test_random_bytes_never_raise(data: bytes) -> None:
    check(parse(data), data.count(b"\n") + 1)


@SETTINGS
@given(st.lists(st.sampled_from(SNIPPETS), min_size=1, max_size=6), st.binary(max_size=40),
       st.integers(min_value=1, max_value=3))
def test_real_snippets_with_binary_noise_between_them(snippets: list[str], noise: bytes, copies: int) -> None:
    data = b"\n".join(s.encode() + b"\n" + noise for s in snippets * copies)
    check(parse(data), data.count(b"\n") + 1)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(SNIPPETS), min_size=1, max_size=8), st.integers(min_value=1, max_value=5000))
def test_block_size_never_changes_the_result(snippets: list[str], block: int) -> None:
    text = "\n".join(snippets)
    ref = parse(text)
    got = parse(text, block_bytes=block)
    pd.testing.assert_frame_equal(got, ref)
    assert got.attrs["unparsed_lines"] == ref.attrs["unparsed_lines"]


def test_corpus_has_all_engines() -> None:
    engines = {json.loads((FIXTURES / p.name).with_suffix(".json").read_text())["engine"]
               for p in FIXTURES.glob("*.log")}
    assert {"sglang", "vllm", "llama.cpp", "nccl", "nvidia-smi"} <= engines
