"""The fast paths of spectrial.logs give exactly what the reference paths give.

Three fast paths are checked against the code they shortcut, on every fixture, on the public corpus and
on mutated lines, across block sizes:
- the fast block readers (``BlockFormat.fast``: plain bytes, regexes, rows) against the Window functions;
- a block function reading its chunk's own lines against the same function reading through the stream;
- the Aho-Corasick marker search (ahocorasick_rs, optional) against the RE2 union.
Plus the fixed text a LineFormat pattern needs (its prefilter), and the process settings parse restores.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectrial.logs import BlockFormat, LineFormat, Registry, core, parse, registry

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "public_logs.jsonl"
SNIPPETS = [p.read_text() for p in sorted(FIXTURES.glob("*.log"))]
LINES = [ln for text in SNIPPETS for ln in text.splitlines() if ln.strip()]
NOISE = ["\t", "\r", "\x1b[32m", "?[1m", "\x1c", "é", "█", " ", ":", "|", "-", "=", "+", ",", "x", "9", ""]


def reference_registry() -> Registry:
    """The default formats without their fast readers."""
    reg = Registry()
    for fmt in registry.formats:
        reg.add(dataclasses.replace(fmt, fast=None) if isinstance(fmt, BlockFormat) else fmt)
    return reg


REFERENCE = reference_registry()


@pytest.fixture
def stream_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Block functions read through the stream's Window only (no chunk-local lines)."""

    class Never(core._ChunkLines):
        def line(self, g: int) -> str | None:
            raise core._OutOfChunk

        def lines(self, g: int, count: int) -> list[str]:
            raise core._OutOfChunk

    monkeypatch.setattr(core, "_ChunkLines", Never)
    yield


def same(text: str | bytes, block_bytes: int = core.DEFAULT_BLOCK_BYTES) -> None:
    got = parse(text, block_bytes=block_bytes)
    ref = parse(text, registry=REFERENCE, block_bytes=block_bytes)
    pd.testing.assert_frame_equal(got, ref)
    assert got.attrs == ref.attrs


def corpus_texts() -> list[str]:
    if not CORPUS.exists():
        return []
    return [json.loads(line)["text"] for line in CORPUS.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("block", [1 << 24, 4096, 333])
def test_fast_readers_match_the_reference_on_every_fixture(block: int) -> None:
    for text in SNIPPETS:
        same(text, block)
    same("\n".join(SNIPPETS), block)


def test_fast_readers_match_the_reference_on_the_public_corpus() -> None:
    texts = corpus_texts()
    if not texts:
        pytest.skip(f"no corpus at {CORPUS}")
    for text in texts:
        same(text)
    same("\n".join(texts * 3), 1 << 14)


def test_fast_readers_are_used_and_give_rows() -> None:
    """The fast readers do answer on plain blocks (so the comparisons above compare something)."""
    text = "\n".join(SNIPPETS)
    ch = core._Chunk(text.encode(), 0)
    answered = set()
    for i in range(ch.n):
        line = ch.line(i)
        for fmt in registry.formats:
            if isinstance(fmt, BlockFormat) and fmt.fast is not None and i >= fmt.lookback and \
                    any(m in line for m in fmt.markers):
                got = fmt.fast(ch, i)
                if got is not None and got[1]:
                    answered.add(fmt.kind)
    assert {"bench_serving", "results_table", "gpu", "tuning", "topology", "speed_bench", "bench_mtbench"} <= answered


def test_a_non_plain_block_goes_to_the_reference_reader() -> None:
    table = (FIXTURES / "specforge_results_table_tp4.log").read_text()
    for bad in ("\t", "\x1c", "é", "\r"):
        text = table.replace("| 795.87 |", f"| 795.87{bad} |")
        same(text)
        assert len(parse(text)) == len(parse(table))


def test_chunk_lines_match_the_stream_window(stream_only: None) -> None:
    text = "\n".join(SNIPPETS)
    for block in (1 << 24, 2048, 97):
        ref = parse(text, registry=REFERENCE, block_bytes=block)
        got = parse(text, block_bytes=block)
        pd.testing.assert_frame_equal(got, ref)


def test_the_stream_window_is_asked_when_a_block_leaves_its_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "\n".join(SNIPPETS)
    calls = {"stream": 0}
    run_fn = core._Plan._run_fn

    def count(self: core._Plan, i: int, source: object, g: int) -> int:
        calls["stream"] += isinstance(source, core._Stream)
        return run_fn(self, i, source, g)  # type: ignore[arg-type]

    monkeypatch.setattr(core._Plan, "_run_fn", count)
    small = parse(text, registry=REFERENCE, block_bytes=300)
    assert calls["stream"] > 0  # blocks cut by 300-byte chunks are read through the stream
    monkeypatch.undo()
    pd.testing.assert_frame_equal(small, parse(text, registry=REFERENCE))


@pytest.mark.parametrize("automaton", [True, False])
def test_marker_search_matches_the_re2_union(monkeypatch: pytest.MonkeyPatch, automaton: bool) -> None:
    if automaton:
        pytest.importorskip("ahocorasick_rs")
    text = "\n".join(SNIPPETS) + "\nDecode batch Prefill batch\nms/cyc Decode batch\n-|- | x\n"
    ch = core._Chunk(text.encode(), 0)
    plan = core._Plan(registry.formats)
    if not automaton:
        plan.automata = None
    idx, mid = plan._find_markers(ch)
    union = re.compile(plan.union)
    want_idx, want_mid = [], []
    for i in range(ch.n):
        m = union.search(ch.data[ch.starts[i]:ch.starts[i + 1]].decode())
        if m:
            want_idx.append(i)
            want_mid.append(plan.marker_values.to_pylist().index(m.group()))
    assert idx.tolist() == want_idx and mid.tolist() == want_mid


def test_parse_without_the_automaton_gives_the_same_table(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "\n".join(SNIPPETS)
    ref = parse(text)
    monkeypatch.setattr(core, "ahocorasick_rs", None)
    pd.testing.assert_frame_equal(parse(text), ref)


@pytest.mark.parametrize(("pattern", "literal"), [
    (r"#tokens: (?P<kv_tokens>[0-9]+)", "#tokens: "),
    (r"(?P<x>[0-9]+) Bytes -> Algo", " Bytes -> Algo"),
    (r"\bcomm (?P<comm>0x[0-9a-fA-F]+)", "comm 0x"),
    (r"(?:acceptance rate per position|acc per pos)\s*=", "acc"),
    (r"(?:INFO|WARNING)\s+(?P<t>[0-9]+)", None),
    (r"(?P<a>ab)?cd", None),
    (r"(?i)Decode batch (?P<a>x)", None),
    (r"a(?:bcd)*efg(?P<b>h)", "efgh"),
])
def test_required_literal(pattern: str, literal: str | None) -> None:
    assert core._required_literal(pattern) == literal


@st.composite
def mutated_line(draw: st.DrawFn) -> str:
    line = draw(st.sampled_from(LINES))
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(line)))
        op = draw(st.sampled_from(["cut", "drop", "insert", "glue"]))
        if op == "cut":
            line = line[:i]
        elif op == "drop":
            line = line[:i] + line[i + draw(st.integers(1, 12)):]
        elif op == "insert":
            line = line[:i] + draw(st.sampled_from(NOISE)) + line[i:]
        else:
            line = line[:i] + draw(st.sampled_from(LINES))
    return line


PATTERNS = [(p, lit) for f in registry.formats if isinstance(f, LineFormat)
            for (p, _), lit in zip(f._groups, f._literals, strict=True) if lit]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated_line(), min_size=1, max_size=30))
def test_a_pattern_match_always_holds_its_literal(lines: list[str]) -> None:
    for line in lines:
        for pattern, literal in PATTERNS:
            if re.search(pattern, line):
                assert literal in line, (pattern, literal, line)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from(SNIPPETS), mutated_line()), min_size=1, max_size=12),
       st.integers(min_value=1, max_value=6000))
def test_fast_paths_match_the_reference_on_mutated_logs(parts: list[str], block: int) -> None:
    same("\n".join(parts), block)


def test_parse_restores_the_garbage_collector() -> None:
    assert gc.isenabled()
    parse("\n".join(SNIPPETS))
    assert gc.isenabled()
    gc.disable()
    try:
        parse("\n".join(SNIPPETS))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_parse_restores_numpys_huge_page_setting() -> None:
    before = core._madvise_hugepage(True)
    try:
        parse("\n".join(SNIPPETS))
        assert core._madvise_hugepage(True) is True  # parse turned it off and back on
        core._madvise_hugepage(False)
        parse("\n".join(SNIPPETS))
        assert core._madvise_hugepage(False) is False
    finally:
        if before is not None:
            core._madvise_hugepage(before)
    assert np.isnan(parse("Decode batch, #running-req: 1, accept len: nan").loc[0, "accept_len"])
