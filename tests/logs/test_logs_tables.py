"""`parse_tables`: one table per record kind, each with its kind's columns alone, and the wide frame rebuilt
from them exactly as the one-table parse built it (checked against that algorithm, kept here as the oracle)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from spectrial.logs import LogTables, ParserError, parse, parse_tables, registry, summary
from spectrial.logs.driver import Plan
from spectrial.logs.formats import Format
from spectrial.logs.source import line_blocks, raw_blocks
from spectrial.logs.table import _frames, table_schema

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"
CASES = sorted(p.stem for p in FIXTURES.glob("*.log"))
MIXED = "\n".join((FIXTURES / f"{n}.log").read_text() for n in CASES)


def old_wide(text: str) -> pd.DataFrame:
    """The wide frame as the one-table parse assembled it: every format's rows straight into one float block
    and one object block (NaN / None), sorted by line (stable); object cells of records not read by regexes
    alone get None for NaN (list cells excepted)."""
    plan = Plan(registry.select(None))
    plan.feed(line_blocks(raw_blocks(text, 16 << 20, []), 16 << 20))
    schema = table_schema(plan.formats)
    frames = [fr for _, fr in _frames(plan, None)]
    lines = np.concatenate([fr.lines for fr in frames] or [np.zeros(0, np.int64)])
    pos = np.empty(len(lines), np.int64)
    pos[np.argsort(lines, kind="stable")] = np.arange(len(lines))
    fcols = [c for c, t in schema.items() if t == "float"]
    ocols = ["engine", "kind", *(c for c, t in schema.items() if t != "float")]
    fblock, oblock = np.full((len(fcols), len(lines)), np.nan), np.empty((len(ocols), len(lines)), object)
    a = 0
    for fr in frames:
        where = pos[a:a + len(fr.lines)]
        a += len(fr.lines)
        oblock[0, where], oblock[1, where] = fr.engine, fr.kind
        for j, c in enumerate(fcols):
            if c in fr.cols:
                fblock[j, where] = pd.to_numeric(pd.Series(fr.cols[c]), errors="coerce").to_numpy(np.float64)
        for j, c in enumerate(ocols[2:], start=2):
            if c in fr.cols:
                col = fr.cols[c]  # a line format's text column is arrow: as numpy, None where missing
                vals = (col.to_numpy() if isinstance(col, pa.ChunkedArray) else col).astype(object)
                if schema[c] != "list" and not fr.clean:
                    vals[pd.isna(vals)] = None
                oblock[j, where] = vals
    return pd.concat([pd.DataFrame({"line": np.sort(lines, kind="stable")}),
                      pd.DataFrame(oblock.T, columns=ocols, dtype=object),
                      pd.DataFrame(fblock.T, columns=fcols)], axis=1)


def same_cells(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Equal cell by cell, None and NaN told apart (a list cell the kind does not have is None now: the one-table
    parse left llama.cpp's finalize NaN there)."""
    assert list(got.columns) == list(want.columns)
    assert (got.dtypes == want.dtypes).all()
    assert len(got) == len(want)
    for c in want.columns:
        g, w = got[c].to_numpy(), want[c].to_numpy()
        if w.dtype != object:
            assert np.array_equal(g, w, equal_nan=True), c
            continue
        for i, (x, y) in enumerate(zip(g, w, strict=True)):
            if c == "per_position" and x is None and isinstance(y, float) and y != y:
                continue
            assert type(x) is type(y) and (x == y or (x != x and y != y)), f"{c}[{i}]: {x!r} != {y!r}"


def declared(engine: str, kind: str) -> list[str]:
    """The columns a kind's table must hold: line, timestamp and its formats' columns for that kind."""
    fmts: list[Format] = [f for f in registry.formats if kind in (f.kind, *f.kinds)]
    mine = [f for f in fmts if f.engine == engine] or fmts  # a table's rows may name their engine (vllm's tables)
    cols = {"line": None, "timestamp": None}
    for f in mine:
        cols.update(dict.fromkeys(f.columns_of(kind)))
    return list(cols)


@pytest.mark.parametrize("name", [*CASES, "MIXED"])
def test_wide_frame_is_the_one_table_parse(name: str) -> None:
    text = MIXED if name == "MIXED" else (FIXTURES / f"{name}.log").read_text()
    tables = parse_tables(text)
    same_cells(tables.wide(), old_wide(text))
    wide = parse(text)
    pd.testing.assert_frame_equal(wide, tables.wide())
    assert wide.attrs == {"lines": tables.lines, "unparsed_lines": tables.unparsed_lines, "parser_errors": [],
                          "read_error": None}


def test_each_table_holds_its_kinds_columns_alone() -> None:
    tables = parse_tables(MIXED)
    assert len(tables) >= 30
    for key, df in tables.items():
        engine, kind = key.split(":")
        assert list(df.columns) == declared(engine, kind), key
    assert list(tables["llamacpp:draft_acceptance"].columns) == [
        "line", "timestamp", "slot", "task", "accept_rate", "accepted", "drafted", "accept_len", "per_position",
        "draft_max"]
    assert list(tables["sglang:decode"].columns[:4]) == ["line", "timestamp", "running_req", "num_token"]
    assert "args" in tables["sglang:server_args"] and "args" not in tables["sglang:decode"]


def test_every_value_of_the_wide_frame_is_in_its_kinds_table() -> None:
    """No value is lost by the split: where a wide row has a value, its kind's table has the column and it."""
    tables = parse_tables(MIXED)
    wide = old_wide(MIXED)
    for key, t in tables.kinds.items():
        rows = wide.iloc[t.frame.index.to_numpy()]
        assert (rows["engine"] == t.engine).all() and (rows["kind"] == t.kind).all()
        assert rows["line"].tolist() == t.frame["line"].tolist()
        filled = [c for c in wide.columns[3:] if rows[c].notna().any() and not (
            c == "per_position" and rows[c].map(lambda v: isinstance(v, float)).all())]
        assert set(filled) <= set(t.frame.columns), f"{key}: {sorted(set(filled) - set(t.frame.columns))}"


def test_dtypes_and_memory() -> None:
    tables = parse_tables(MIXED)
    decode = tables["sglang:decode"]
    assert decode["line"].dtype == np.int64 and decode["timestamp"].dtype == "str"
    assert decode["gen_throughput"].dtype == np.float64 and decode["graph"].dtype == "boolean"
    assert tables["llamacpp:request_timing"]["origin"].dtype == "str"
    assert tables["sglang:server_args"]["args"].dtype == object  # dicts stay objects
    wide = tables.wide()
    assert tables.memory_bytes() < int(wide.memory_usage(deep=True).sum()) / 2
    assert tables.records == len(wide) and sum(tables.counts().values()) == len(wide)


def test_lookup_by_kind_and_errors() -> None:
    tables = parse_tables(MIXED)
    assert tables["decode"] is tables["sglang:decode"]
    assert "decode" in tables and "sglang:decode" in tables and "nope" not in tables
    with pytest.raises(KeyError, match="several engines"):
        tables.table("server_args")  # sglang and vllm both print one
    with pytest.raises(KeyError, match="kinds found"):
        tables["verify"]
    assert tables.get("verify") is None
    assert isinstance(tables, LogTables) and "sglang:decode" in repr(tables)


def test_kinds_selection_and_summary() -> None:
    tables = parse_tables(MIXED, kinds=["decode", "nccl"])
    assert {k.split(":")[0] for k in tables} == {"sglang", "nccl"}
    assert "sglang:prefill" not in tables
    pd.testing.assert_frame_equal(summary(tables), summary(tables.wide()))
    empty = parse_tables("nothing to see here\n")
    assert len(empty) == 0 and empty.wide().shape == (0, parse(MIXED).shape[1])
    assert list(summary(empty).columns) == ["engine", "kind", "dp_rank", "count", "metric", "n", "median"]


def test_a_parser_error_is_a_typed_record() -> None:
    err = ParserError(3, "sglang/decode", "ValueError: x")
    assert err == (3, "sglang/decode", "ValueError: x") and err.line == 3
