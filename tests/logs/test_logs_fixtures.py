"""Every fixture pair in tests/fixtures/logs/ (a real pasted log and the values read off it by hand)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from spectrial.logs import parse

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"
CASES = sorted(p.stem for p in FIXTURES.glob("*.json"))


def same(actual: Any, expected: Any) -> bool:
    """Expected null means absent (NaN/None); "inf" is infinity; numbers compare to 1e-9."""
    if expected is None:
        return actual is None or (isinstance(actual, float) and math.isnan(actual))
    if expected == "inf":
        return actual == math.inf
    if isinstance(expected, (bool, str)):
        return actual == expected
    if isinstance(expected, (int, float)):
        return actual is not None and actual == pytest.approx(expected, rel=1e-9, abs=1e-12)
    if isinstance(expected, list):
        return (isinstance(actual, list) and len(actual) == len(expected)
                and all(a == pytest.approx(e, rel=1e-9) for a, e in zip(actual, expected, strict=True)))
    return actual == expected


def test_fixtures_are_paired() -> None:
    logs = {p.stem for p in FIXTURES.glob("*.log")}
    assert logs == set(CASES) and len(CASES) >= 60


@pytest.mark.parametrize("name", CASES)
def test_fixture(name: str) -> None:
    exp = json.loads((FIXTURES / f"{name}.json").read_text())
    assert exp["source"].startswith(("https://", "synthetic:"))
    df = parse(FIXTURES / f"{name}.log")
    assert df.attrs["parser_errors"] == []
    if "total" in exp["counts"]:
        assert len(df) == exp["counts"]["total"]
    else:
        assert df["kind"].value_counts().to_dict() == exp["counts"]
    for row in exp["rows"]:
        got = df[df["kind"] == row["kind"]].iloc[row["nth"]]
        for col, want in row["values"].items():
            assert same(got[col], want), f"{row['kind']}[{row['nth']}].{col} = {got[col]!r}, expected {want!r}"
    if "unparsed_lines" in exp:
        assert df.attrs["unparsed_lines"] == exp["unparsed_lines"]
    for kind, want in exp.get("args", {}).items():
        args = df[df["kind"] == kind]["args"].iloc[0]
        for key, value in want.items():
            assert args[key] == value, f"args[{key!r}] = {args.get(key)!r}, expected {value!r}"
