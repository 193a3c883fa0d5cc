"""The compiled chunk pass (``cp_lines`` in native/chunkpass.c) against the numpy/arrow reading of a chunk: the same
lines, plain and colour flags and non-blank counts, on the fixtures, the public corpus and random bytes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectrial.logs import native
from spectrial.logs.chunks import Chunk

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "public_logs.jsonl"
BYTES = [b"\n", b"\r", b"\r\n", b"\x1b[32m", b"?[1m", b"^[[0m", b"?", b"^[", b"\x1c", b"\x1f", b"\t", b"x", b" ",
         "é".encode(), "█".encode(), b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe0\x80\x80", b"\x00"]


def both(data: bytes, final: bool = True, start: int = 0) -> tuple[Chunk, Chunk]:
    compiled = Chunk(data, start, final=final)
    saved = list(native._state)
    native._state[:] = [(None, "off: the reference reading")]
    try:
        reference = Chunk(data, start, final=final)
    finally:
        native._state[:] = saved
    return compiled, reference


def same(data: bytes, final: bool = True) -> None:
    c, r = both(data, final)
    assert c.data == r.data and c.n == r.n and c.offs.tolist() == r.offs.tolist()
    assert c.offs.dtype == r.offs.dtype and c.has_ansi == r.has_ansi
    every = np.arange(c.n + 1)
    for a in (every, np.zeros_like(every)):
        assert c.plain(a[:-1], every[1:]).tolist() == r.plain(a[:-1], every[1:]).tolist()
    assert c.ansi(np.arange(c.n)).tolist() == r.ansi(np.arange(c.n)).tolist()
    assert [c.nonblank(i, i + 1) for i in range(c.n)] == [r.nonblank(i, i + 1) for i in range(r.n)]
    assert [c.line(i) for i in range(c.n)] == [r.line(i) for i in range(r.n)]


@pytest.fixture(autouse=True)
def _on() -> None:
    if not native.status().startswith("on"):
        pytest.skip(f"the compiled passes are off here: {native.status()}")


def test_fixtures_and_corpus_read_alike() -> None:
    texts = [p.read_bytes() for p in sorted(FIXTURES.glob("*.log"))]
    if CORPUS.exists():
        texts += [json.loads(line)["text"].encode() for line in CORPUS.read_text().splitlines() if line.strip()]
    for data in [*texts, b"".join(texts), b"", b"x", b"\n", b"a\nb"]:
        same(data)
        same(data, final=False)


def test_the_pass_is_the_one_used() -> None:
    c, _ = both(b"plain\n\x1b[31mred\n")
    assert c._ansi is not None and c._bad is not None  # set by the compiled pass, not later by numpy


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(BYTES), max_size=40), st.booleans())
def test_random_bytes_read_alike(parts: list[bytes], final: bool) -> None:
    same(b"".join(parts), final)
