"""A large file read by several worker processes gives exactly the table of one process.

The segments are made tiny here (a few hundred bytes to a few KB) so that a small file has hundreds of them:
every kind of block is cut by segment boundaries, blocks run over them, and the parent has to read segments
again where a block of the next segment runs across the line where the one before stopped.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from spectrial.errors import ConfigError
from spectrial.logs import BlockFormat, Finalizer, LineFormat, Registry, parallel, parse, registry

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "public_logs.jsonl"
MIXED = "\n".join(p.read_text() for p in sorted(FIXTURES.glob("*.log")))


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> callable:
    """Set the segment size (bytes) for parallel parses in this test."""

    def set_size(size: int, overrun: int = 1 << 16) -> None:
        monkeypatch.setattr(parallel, "SEGMENT_MIN", size)
        monkeypatch.setattr(parallel, "SEGMENT_MAX", size)
        monkeypatch.setattr(parallel, "OVERRUN_FIRST", overrun)

    return set_size


def children() -> set[int]:
    """This process's child processes now (other tests' servers and sshd included: compare before/after)."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def none_left(before: set[int], wait: float = 10) -> bool:
    """Whether every child process started since `before` has gone (waiting up to `wait` seconds)."""
    deadline = time.monotonic() + wait
    while children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    return not children() - before


def same(path: Path, workers: int, **kw: object) -> parallel.Stats:
    ref = parse(path, workers=1, **kw)
    got = parse(path, workers=workers, **kw)
    pd.testing.assert_frame_equal(got, ref)
    assert got.attrs == ref.attrs
    assert parallel.last is not None
    return parallel.last


@pytest.mark.parametrize(("size", "overrun"), [(200, 1 << 16), (1000, 16), (4096, 1), (30000, 1 << 16)])
def test_every_fixture_cut_anywhere_gives_the_sequential_table(tmp_path: Path, tiny: callable, size: int,
                                                               overrun: int) -> None:
    path = tmp_path / "mixed.log"
    path.write_text(MIXED * 2)
    tiny(size, overrun)
    stats = same(path, 3)
    assert stats.workers == 3 and stats.segments >= path.stat().st_size // (4 * size)


def test_the_public_corpus_cut_anywhere(tmp_path: Path, tiny: callable) -> None:
    if not CORPUS.exists():
        pytest.skip(f"no corpus at {CORPUS}")
    import json

    path = tmp_path / "corpus.log"
    path.write_text("\n".join(json.loads(line)["text"] for line in CORPUS.read_text().splitlines() if line.strip()))
    tiny(512, 64)
    same(path, 2)


def _nested_registry() -> Registry:
    """`AAA` blocks run to `END`; a `BBB` line starts a 40-line block of its own, unless it is inside one."""

    def aaa(w: object) -> tuple:
        k = 1
        while (s := w[k]) is not None and s != "END":  # type: ignore[index]
            k += 1
        return [(0, {"a": float(k)})], k + 1

    def bbb(w: object) -> tuple:
        return [(0, {"b": 1.0})], 40

    reg = Registry()
    reg.add(BlockFormat("t", "aaa", ("AAA",), aaa, {"a": "float"}))
    reg.add(BlockFormat("t", "bbb", ("BBB",), bbb, {"b": "float"}))
    reg.add(LineFormat("t", "tick", ("tick ",), (r"tick (?P<tick>[0-9]+)",)))
    return reg


def test_a_block_of_the_next_segment_across_the_join_is_read_again(tmp_path: Path, tiny: callable) -> None:
    # a BBB line inside an AAA block: the segment that starts between them sees a BBB block reaching past the
    # line where the segment before stopped, so the parent reads that segment again from there
    unit = ("AAA\n" + "".join(f"tick {i}\n" for i in range(8)) + "BBB\n" + "".join(f"tick {i}\n" for i in range(3))
            + "END\n" + "".join(f"tick {i}\n" for i in range(60)))
    path = tmp_path / "nested.log"
    path.write_text(unit * 40)
    reg = _nested_registry()
    tiny(500, 8)
    stats = same(path, 2, registry=reg)
    assert stats.reread > 0
    df = parse(path, registry=reg, workers=2)
    assert (df["kind"] == "aaa").sum() == 40 and (df["kind"] == "bbb").sum() == 0  # BBB inside AAA: no block


def test_a_user_format_reaches_the_workers(tmp_path: Path, tiny: callable) -> None:
    reg = Registry()
    for fmt in registry.formats:
        reg.add(fmt)
    reg.add(LineFormat("mine", "step", ("step time:",), (r"step time: (?P<step_ms>[0-9.]+) ms",)))
    path = tmp_path / "mine.log"
    path.write_text((MIXED + "\n" + "".join(f"step time: {i}.5 ms\n" for i in range(50))) * 2)
    tiny(2000)
    same(path, 2, registry=reg)
    assert (parse(path, registry=reg, workers=2)["kind"] == "step").sum() == 100


def _exit_in_workers(parent: int) -> Registry:
    """The default formats plus one that kills any worker process that reads a `DIE` line."""

    def die(w: object) -> tuple:
        if os.getpid() != parent:
            os._exit(3)
        return [], 0

    reg = Registry()
    for fmt in registry.formats:
        reg.add(fmt)
    reg.add(BlockFormat("t", "die", ("DIE",), die, {"x": "float"}))
    return reg


def test_a_worker_that_dies_leaves_its_segment_to_the_parent(tmp_path: Path, tiny: callable) -> None:
    path = tmp_path / "die.log"
    path.write_text(MIXED + "\nDIE\n" + MIXED)
    tiny(4000)
    reg = _exit_in_workers(os.getpid())
    before = children()
    stats = same(path, 2, registry=reg)
    assert stats.by_parent >= 1
    assert none_left(before)


def test_no_worker_is_left_when_the_parse_is_interrupted(tmp_path: Path, tiny: callable) -> None:
    # a worker dies at a DIE line; the parent, reading that segment itself, is interrupted there (Ctrl-C)
    parent = os.getpid()

    def die(w: object) -> tuple:
        if os.getpid() != parent:
            os._exit(3)
        raise KeyboardInterrupt

    reg = Registry()
    for fmt in registry.formats:
        reg.add(fmt)
    reg.add(BlockFormat("t", "die", ("DIE",), die, {"x": "float"}))
    path = tmp_path / "big.log"
    path.write_text(MIXED + "\nDIE\n" + MIXED * 4)
    tiny(2000)
    before = children()
    with pytest.raises(KeyboardInterrupt):
        parse(path, registry=reg, workers=2)
    assert none_left(before)


def test_small_compressed_or_in_memory_input_is_read_by_one_process(tmp_path: Path) -> None:
    import gzip

    small = tmp_path / "small.log"
    small.write_text(MIXED)
    gz = tmp_path / "big.log.gz"
    gz.write_bytes(gzip.compress(MIXED.encode() * 50))
    assert parallel.workers_for(small, None) is None  # under MIN_BYTES
    assert parallel.workers_for(gz, 4) is None  # a gzip stream is read from its start
    assert parallel.workers_for(MIXED, 4) is None  # text, not a path
    assert parallel.workers_for(small, 1) is None


@pytest.mark.parametrize("bad", [0, -2, 1.5, "4", True])
def test_workers_must_be_a_positive_whole_number(bad: object) -> None:
    with pytest.raises(ConfigError, match="workers"):
        parse(MIXED, workers=bad)  # type: ignore[arg-type]


class DyingMerge(Finalizer):
    """A Finalizer that kills the helper process it runs in (and counts its rows where it is the parent's)."""

    parent = 0

    def __init__(self) -> None:
        self.rows: list[int] = []

    def feed(self, df: pd.DataFrame) -> None:
        if os.getpid() != DyingMerge.parent:
            os._exit(5)
        self.rows += df["line"].tolist()

    def finish(self) -> pd.DataFrame:
        return pd.DataFrame({"line": self.rows, "n": [float(i) for i in range(len(self.rows))]})


def test_a_finalize_helper_that_dies_leaves_the_finalize_to_the_parent(tmp_path: Path, tiny: callable) -> None:
    DyingMerge.parent = os.getpid()
    reg = Registry()
    reg.add(LineFormat("t", "tick", ("tick ",), (r"tick (?P<tick>[0-9]+)",), finalize=DyingMerge,
                       output={"n": "float"}))
    path = tmp_path / "ticks.log"
    path.write_text("".join(f"tick {i}\nother\n" for i in range(5000)))
    tiny(2000)
    before = children()
    same(path, 2, registry=reg)
    df = parse(path, registry=reg, workers=2)
    assert df["n"].tolist() == [float(i) for i in range(5000)] and df["line"].tolist() == list(range(1, 10000, 2))
    assert none_left(before)


def test_a_failing_rowwise_finalize_is_reported_and_its_rows_left_out(tmp_path: Path, tiny: callable) -> None:
    def broken(df: pd.DataFrame) -> pd.DataFrame:
        raise ValueError("finalize bug")

    reg = Registry()
    reg.add(LineFormat("t", "tick", ("tick ",), (r"tick (?P<tick>[0-9]+)",), finalize=broken, rowwise=True))
    reg.add(LineFormat("t", "tock", ("tock ",), (r"tock (?P<tock>[0-9]+)",)))
    path = tmp_path / "ticks.log"
    path.write_text("".join(f"tick {i}\ntock {i}\n" for i in range(3000)))
    tiny(2000)
    for workers in (1, 2):
        df = parse(path, registry=reg, workers=workers)
        assert set(df["kind"]) == {"tock"} and len(df) == 3000
        assert [e[1:] for e in df.attrs["parser_errors"]] == [("t/tick", "ValueError: finalize bug")]


def test_the_cli_takes_workers(tmp_path: Path, tiny: callable) -> None:
    import io

    from typer.testing import CliRunner

    from spectrial.cli.logs import app

    path = tmp_path / "mixed.log"
    path.write_text(MIXED * 2)
    tiny(3000)
    runner = CliRunner()
    one = runner.invoke(app, ["parse", str(path), "--workers", "1"])
    two = runner.invoke(app, ["parse", str(path), "-j", "2"])
    assert one.exit_code == two.exit_code == 0, two.output
    pd.testing.assert_frame_equal(pd.read_csv(io.StringIO(two.stdout)), pd.read_csv(io.StringIO(one.stdout)))
    assert runner.invoke(app, ["parse", str(path), "--workers", "0"]).exit_code == 2
