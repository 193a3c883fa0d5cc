"""The vectorised paths of spectrial.logs give exactly what the reference paths give.

- every block format's vectorised reader (``BlockFormat.vector``: all of a chunk's blocks at once, with
  column kernels) against its Python function over a Window, block by block, on every fixture, on the public
  corpus and on mutated lines; and the whole table with and without the vectorised readers;
- chunk boundaries: a block cut by a chunk's end is read whole with the next chunk (tiny block sizes);
- the Aho-Corasick marker search (ahocorasick_rs, optional) against the RE2 union;
- the fixed text a LineFormat pattern needs (its prefilter, searched for with Aho-Corasick when a format has
  many), and the process settings parse restores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from spectrial.logs import BlockFormat, LineFormat, Registry, Window, api, driver, native, parse, registry
from spectrial.logs.chunks import Chunk
from spectrial.logs.formats import DECLINE, MORE, Literals, required_literal
from spectrial.logs.native import blocks as compiled

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "public_logs.jsonl"
SNIPPETS = [p.read_text() for p in sorted(FIXTURES.glob("*.log"))]
LINES = [ln for text in SNIPPETS for ln in text.splitlines() if ln.strip()]
NOISE = ["\t", "\r", "\x1b[32m", "?[1m", "\x1c", "\x0b", "é", "█", " ", ":", "|", "-", "=", "+", ",", "/", "x", "9",
         "%", "}", "{", "nan", ""]
# blocks no fixture shows, for the readers' rarer branches (edges/<reader>-<n>.txt: each reader's C code and arrow
# code against its function)
EDGES = [p.read_text() for p in sorted((FIXTURES / "edges").glob("*.txt"))]
VECTOR = [f for f in registry.formats if isinstance(f, BlockFormat) and f.vector is not None]
COMPILED = [f for f in VECTOR if hasattr(f.vector, "arrow")]  # a C reader first, the arrow reader where it is off


@contextlib.contextmanager
def arrow_alone() -> Iterator[None]:
    """The compiled passes off for a while (a hypothesis test cannot take a function-scoped fixture)."""
    saved = list(native._state)
    native._state[:] = [(None, "off: the test reads with arrow alone")]
    try:
        yield
    finally:
        native._state[:] = saved


@pytest.fixture(params=["compiled", "arrow"])
def readers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test twice: with the compiled readers (where the library builds here) and with arrow's alone."""
    if request.param == "compiled":
        if not native.status().startswith("on"):
            pytest.skip(f"the compiled passes are off here: {native.status()}")
    else:
        monkeypatch.setattr(native, "_state", [(None, "off: the test reads with arrow alone")])
    return request.param


def reference_registry() -> Registry:
    """The default formats without their vectorised readers (every block read by its Python function)."""
    reg = Registry()
    for fmt in registry.formats:
        reg.add(dataclasses.replace(fmt, vector=None) if isinstance(fmt, BlockFormat) else fmt)
    return reg


REFERENCE = reference_registry()


def corpus_texts() -> list[str]:
    if not CORPUS.exists():
        return []
    return [json.loads(line)["text"] for line in CORPUS.read_text().splitlines() if line.strip()]


def same_value(a: Any, b: Any) -> bool:
    """None and NaN are both 'absent'; numpy scalars compare as Python values."""
    a = a.item() if isinstance(a, np.generic) else a
    b = b.item() if isinstance(b, np.generic) else b
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b))
    return bool(a == b)


def check_readers(text: str) -> dict[str, int]:
    """Each vectorised reader against its format's function on every line holding one of its markers;
    returns how many blocks each reader answered itself."""
    ch = Chunk(text.encode(), 0)
    lines = [ch.line(i) or "" for i in range(ch.n)]
    answered: dict[str, int] = {}
    for fmt in VECTOR:
        at = np.array([i for i, s in enumerate(lines) if any(m in s for m in fmt.markers)], np.int64)
        if not len(at):
            continue
        got = fmt.vector(ch, at)  # type: ignore[misc]
        status = np.zeros(len(at), np.int64) if got.status is None else np.asarray(got.status)
        used = np.asarray(got.used).copy()
        if len(got.block):
            np.maximum.at(used, got.block, got.offset + 1)
        plain = ch.plain(at - fmt.lookback, at + np.maximum(np.maximum(got.examined, used), 1))
        assert not (status == MORE).any()  # one chunk holds the whole text
        for j, i in enumerate(at.tolist()):
            if status[j] == DECLINE or not plain[j]:
                continue
            recs, n = fmt.fn(Window(ch, i))
            recs = [(off, r) for off, r in (recs or []) if r]
            n = max(int(n or 0), max((off + 1 for off, _ in recs), default=0))
            mine = np.flatnonzero(np.asarray(got.block) == j)
            where = f"{fmt.engine}/{fmt.kind} at line {i + 1}: {lines[i][:120]!r}"
            assert used[j] == n, where
            assert [int(got.offset[k]) for k in mine] == [off for off, _ in recs], where
            for k, (_, rec) in zip(mine, recs, strict=True):
                for col in (*fmt.columns, "engine", "kind"):
                    mine_v = got.columns[col][k] if col in got.columns else None
                    mine_v = mine_v.as_py() if isinstance(mine_v, pa.Scalar) else mine_v  # a C reader's text
                    assert same_value(mine_v, rec.get(col)), f"{where}: {col} {mine_v!r} != {rec.get(col)!r}"
            answered[fmt.kind] = answered.get(fmt.kind, 0) + 1
    return answered


def same_table(text: str | bytes, block_bytes: int = api.DEFAULT_BLOCK_BYTES) -> None:
    got = parse(text, block_bytes=block_bytes)
    ref = parse(text, registry=REFERENCE, block_bytes=block_bytes)
    pd.testing.assert_frame_equal(got, ref)
    assert got.attrs == ref.attrs


def test_every_vectorised_reader_matches_its_function_on_the_fixtures_and_answers(readers: str) -> None:
    answered: dict[str, int] = {}
    for text in [*SNIPPETS, "\n".join(SNIPPETS), *EDGES]:
        for kind, n in check_readers(text).items():
            answered[kind] = answered.get(kind, 0) + n
    # the readers do answer (so the comparisons compare something)
    assert {"bench_serving", "results_table", "gpu", "tuning", "topology", "speed_bench", "bench_mtbench",
            "bench_one_batch", "spec_summary", "request_timing"} <= set(answered)
    if readers == "compiled":  # the C readers themselves answer (none declines every block)
        assert COMPILED and {f.kind for f in COMPILED} <= set(answered)


def test_the_compiled_readers_answer_where_arrow_does() -> None:
    """On the fixtures and the corpus a C reader declines no block that its arrow reader reads (it would be slower
    for nothing): the blocks each one answers, counted both ways."""
    if not native.status().startswith("on"):
        pytest.skip(f"the compiled passes are off here: {native.status()}")
    texts = [*SNIPPETS, *corpus_texts()]
    for fmt in COMPILED:  # the C file names the columns its Spec names (else arrow would read, unseen)
        assert compiled._function(native.library(), fmt.vector.spec) is not None, fmt.kind  # type: ignore[union-attr]
    for fmt in COMPILED:
        for text in texts:
            ch = Chunk(text.encode(), 0)
            at = np.array([i for i in range(ch.n) if any(m in (ch.line(i) or "") for m in fmt.markers)], np.int64)
            if not len(at):
                continue
            c, a = fmt.vector(ch, at), fmt.vector.arrow(ch, at)  # type: ignore[union-attr]
            declined_c = np.asarray(c.status) == DECLINE
            declined_a = np.zeros(len(at), bool) if a.status is None else np.asarray(a.status) == DECLINE
            assert not (declined_c & ~declined_a).any(), (fmt.kind, at[declined_c & ~declined_a][:5])


def test_every_vectorised_reader_matches_its_function_on_the_public_corpus(readers: str) -> None:
    texts = corpus_texts()
    if not texts:
        pytest.skip(f"no corpus at {CORPUS}")
    for text in texts:
        check_readers(text)
    check_readers("\n".join(texts))


@pytest.mark.parametrize("block", [1 << 24, 4096, 333, 37])
def test_the_table_is_the_same_without_the_vectorised_readers(block: int, readers: str) -> None:
    for text in SNIPPETS:
        same_table(text, block)
    same_table("\n".join(SNIPPETS), block)


def test_the_table_is_the_same_without_them_on_the_public_corpus(readers: str) -> None:
    texts = corpus_texts()
    if not texts:
        pytest.skip(f"no corpus at {CORPUS}")
    same_table("\n".join(texts * 3), 1 << 14)


def test_a_non_plain_block_goes_to_the_function(readers: str) -> None:
    table = (FIXTURES / "specforge_results_table_tp4.log").read_text()
    for bad in ("\t", "\x1c", "é", "\r", "\x0b"):
        text = table.replace("| 795.87 |", f"| 795.87{bad} |")
        same_table(text)
        assert len(parse(text)) == len(parse(table))


def test_a_block_cut_by_the_chunk_end_is_read_whole(readers: str) -> None:
    bench = (FIXTURES / "sglang_bench_serving_ngram.log").read_text()
    whole = parse(bench)
    assert (whole["kind"] == "bench_serving").sum() == 1
    for block in (1, 64, 200, 1000):  # the block starts in one chunk and ends several chunks later
        got = parse(bench, block_bytes=block)
        pd.testing.assert_frame_equal(got, whole)
        assert got.attrs["unparsed_lines"] == whole.attrs["unparsed_lines"]


@pytest.mark.parametrize("search", ["compiled", "automaton", "re2"])
def test_marker_search_matches_a_python_search(monkeypatch: pytest.MonkeyPatch, search: str) -> None:
    if search == "compiled":
        if not native.status().startswith("on"):
            pytest.skip(f"the compiled passes are off here: {native.status()}")
    else:
        monkeypatch.setattr(native, "_state", [(None, "off: the test searches another way")])
    if search == "automaton":
        pytest.importorskip("ahocorasick_rs")
    elif search == "re2":
        monkeypatch.setattr(driver, "ahocorasick_rs", None)
    text = "\n".join(SNIPPETS) + "\nDecode batch Prefill batch\nms/cyc Decode batch\n-|- | x\n"
    ch = Chunk(text.encode(), 0)
    found = driver.Markers(registry.formats)
    idx, fmt = found.find(ch)
    union = re.compile("|".join(re.escape(m) for m in found.strings))  # longest first: ties go to the longest
    owner = {m: i for i, f in enumerate(registry.formats) for m in f.markers}
    want_idx, want_fmt = [], []
    for i in range(ch.n):
        m = union.search(ch.data[ch.starts[i]:ch.starts[i + 1]].decode())
        if m:
            want_idx.append(i)
            want_fmt.append(owner[m.group()])
    assert idx.tolist() == want_idx and fmt.tolist() == want_fmt


MARKERS = sorted({m for f in registry.formats for m in f.markers})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.one_of(st.sampled_from(MARKERS), st.sampled_from(MARKERS).map(lambda m: m[:-1]),
                                   st.sampled_from(MARKERS).map(lambda m: m[1:]), st.sampled_from(NOISE)),
                         max_size=6).map("".join), min_size=1, max_size=20))
def test_the_compiled_marker_search_finds_the_leftmost_longest(lines: list[str]) -> None:
    """Lines made of markers, their halves and noise: the compiled search against a Python search per line."""
    if not native.status().startswith("on"):
        pytest.skip(f"the compiled passes are off here: {native.status()}")
    ch = Chunk("\n".join(lines).encode(), 0)
    found = driver.Markers(registry.formats)
    idx, fmt = found.find(ch)
    union = re.compile("|".join(re.escape(m) for m in found.strings))
    owner = {m: i for i, f in enumerate(registry.formats) for m in f.markers}
    want = [(i, owner[m.group()]) for i in range(ch.n)
            if (m := union.search(ch.data[ch.starts[i]:ch.starts[i + 1]].decode()))]
    assert list(zip(idx.tolist(), fmt.tolist(), strict=True)) == want


def test_at_a_tie_the_longest_marker_wins() -> None:
    """Markers one of which begins another (none of the registry's do; a user's may): the longest at the leftmost
    position decides, in the compiled search as in the others."""
    fmts = [types.SimpleNamespace(markers=("ab1",)), types.SimpleNamespace(markers=("ab12", "zz")),
            types.SimpleNamespace(markers=("b12x",))]
    ch = Chunk(b"x ab12x\nab1 ab12\nzab12\nb12x ab1\nnone\n", 0)
    assert [f.tolist() for f in driver.Markers(fmts).find(ch)] == [[0, 1, 2, 3], [1, 0, 1, 2]]


def test_parse_without_the_automaton_gives_the_same_table(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "\n".join(SNIPPETS)
    ref = parse(text)
    monkeypatch.setattr(driver, "ahocorasick_rs", None)
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
    assert required_literal(pattern) == literal


@st.composite
def mutated_line(draw: st.DrawFn) -> str:
    line = draw(st.sampled_from(LINES))
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(line)))
        op = draw(st.sampled_from(["cut", "drop", "insert", "glue", "dup"]))
        if op == "cut":
            line = line[:i]
        elif op == "drop":
            line = line[:i] + line[i + draw(st.integers(1, 12)):]
        elif op == "insert":
            line = line[:i] + draw(st.sampled_from(NOISE)) + line[i:]
        elif op == "dup":
            line = line + "\n" + line
        else:
            line = line[:i] + draw(st.sampled_from(LINES))
    return line


PATTERNS = [(p, lit) for f in registry.formats if isinstance(f, LineFormat)
            for p, lit in ((p, required_literal(p)) for p in f.patterns) if lit]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated_line(), min_size=1, max_size=30))
def test_a_pattern_match_always_holds_its_literal(lines: list[str]) -> None:
    for line in lines:
        for pattern, literal in PATTERNS:
            if re.search(pattern, line):
                assert literal in line, (pattern, literal, line)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated_line(), min_size=1, max_size=30), st.integers(0, 5))
def test_the_literal_search_finds_what_arrow_finds(lines: list[str], skip: int) -> None:
    """Literals.rows (one Aho-Corasick pass) against pc.match_substring per text, on a slice of the lines
    (offsets not from 0), as string and large_string; a text occurring twice, overlapping or none."""
    pytest.importorskip("ahocorasick_rs")
    texts = sorted({lit for _, lit in PATTERNS} | {"é", "acc", "accept", "xx"})
    found = Literals(texts)
    for typ in (pa.string(), pa.large_string()):
        arr = pa.array(["x" * skip, *(ln + "\n" for ln in lines), "xx"], typ).slice(1, len(lines))
        got = found.rows(arr)
        assert got is not None
        want = np.array([pc.match_substring(arr, t).to_numpy(zero_copy_only=False) for t in texts])
        assert (got == want).all()
    assert found.rows(pa.array(["acc", None])) is None  # nulls: arrow's per-text search
    assert Literals(["a\nb", "acc"]).rows(pa.array(["acc"])) is None  # a line break: likewise


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from(SNIPPETS), mutated_line()), min_size=1, max_size=12))
# found by this test (2026-12-01): an NCCL tuning-table header with no row under it (IndexError in the reader)
@example(["n129-118-012:1802:1851 [0] NCCL INFO Latency/AlgBw |    Tree/    LL |    Tree/ LL128 |    Tree/Simple "
          "|    Ring/    LL |    Ring/ LL128 |    Ring/Simple | CollNet/    LL | CollNet/ LL128 | CollNet/Simple |"])
def test_vectorised_readers_match_their_functions_on_mutated_logs(parts: list[str]) -> None:
    check_readers("\n".join(parts))
    with arrow_alone():
        check_readers("\n".join(parts))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from(SNIPPETS), mutated_line()), min_size=1, max_size=12),
       st.integers(min_value=1, max_value=6000))
def test_vectorised_paths_match_the_reference_on_mutated_logs(parts: list[str], block: int) -> None:
    text = "\n".join(parts).encode()  # bytes: one line without a newline that looks like a path is still text
    same_table(text, block)  # (found by this test, 2026-12-07: ["/+---...---+"] read as a missing file's name)
    with arrow_alone():
        same_table(text, block)


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
    before = api.madvise_hugepage(True)
    try:
        parse("\n".join(SNIPPETS))
        assert api.madvise_hugepage(True) is True  # parse turned it off and back on
        api.madvise_hugepage(False)
        parse("\n".join(SNIPPETS))
        assert api.madvise_hugepage(False) is False
    finally:
        if before is not None:
            api.madvise_hugepage(before)
    assert np.isnan(parse("Decode batch, #running-req: 1, accept len: nan").loc[0, "accept_len"])


def test_the_worker_thread_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "\n".join(SNIPPETS * 4)
    monkeypatch.setattr(driver, "THREAD_ROWS", 10**12)  # everything in this thread
    alone = parse(text)
    monkeypatch.setattr(driver, "THREAD_ROWS", 1)  # line formats (and finalize, fills) in the worker
    pd.testing.assert_frame_equal(parse(text), alone)
    assert parse(text).attrs == alone.attrs


def test_one_function_per_line_formats_match_their_function() -> None:
    """`register`-ed functions (profile phases, nvidia-smi -L) read by their vectorised path."""
    text = ("[2026-01-02 03:04:07 TP0] Target verify: 30.63 ms/cyc ( 96.9%)\n"
            "EAGLE3 profile | Draft: 0.52 ms/cyc (2.6%), Target verify: 19.14 ms/cycle (95.3%), Accept/other: 0.40 ms/cyc\n"
            "GPU 0: NVIDIA H200 (UUID: GPU-aaaa-bbbb)\nGPU 1: NVIDIA H200 (UUID: GPU-cccc-dddd)\nms/cyc without a phase\n")
    assert {"verify", "gpu"} <= set(check_readers(text))
    same_table(text)
