"""The figure catalogue: every figure of the record's types declared once (unit, rate, better direction,
definition), docs/FIGURES.md showing exactly it, and the gate reading its units and directions from it."""

from __future__ import annotations

import types
import typing
from pathlib import Path

import pytest

from spectrial import schema
from spectrial.analysis.catalogue import CATALOGUE, FIGURES, figure, markdown_table
from spectrial.gate.judge import GATED, judge
from spectrial.gate.params import DEFAULT_FIGURES

ROOT = Path(__file__).resolve().parents[2]
NUMBERS = (int, float)


def _numeric_fields(model: type, prefix: str = "") -> list[str]:
    """Fields holding a number, a list of numbers or percentiles (a figure), by record name."""
    found = []
    for name, field in model.model_fields.items():
        args = set(typing.get_args(field.annotation)) or {field.annotation}
        flat = set()
        for a in args:
            flat |= set(typing.get_args(a)) if typing.get_origin(a) in (list, types.UnionType) else {a}
        if flat & set(NUMBERS) or schema.Percentiles in flat:
            found.append(prefix + name)
    return found


@pytest.mark.parametrize("model,prefix", [(schema.ArmFigures, ""), (schema.Comparison, ""),
                                          (schema.ServingFigures, "serving.")])
def test_every_figure_of_the_record_is_declared(model: type, prefix: str) -> None:
    missing = [n for n in _numeric_fields(model, prefix) if n not in CATALOGUE]
    assert not missing, f"figures of {model.__name__} not in spectrial.analysis.catalogue: {missing}"


def test_the_field_check_can_fail() -> None:
    from pydantic import BaseModel

    class Made(BaseModel):
        new_ms: float | None = None
        label: str = ""

    assert _numeric_fields(Made) == ["new_ms"] and "new_ms" not in CATALOGUE


def test_each_name_once_and_units_agree_with_the_schema() -> None:
    assert len(CATALOGUE) == len(FIGURES)
    for model, prefix in ((schema.ArmFigures, ""), (schema.Comparison, ""), (schema.ServingFigures, "serving.")):
        for name, field in model.model_fields.items():
            desc = (field.description or "").rstrip()
            f = CATALOGUE.get(prefix + name)
            if f is None:
                continue
            if desc.endswith(", tok/s"):
                assert "tok/s" in f.unit, (name, f.unit)
            if desc.endswith(", ms"):
                assert f.unit.startswith("ms"), (name, f.unit)
            if f.rate == "aggregate" and "tok/s" in f.unit:
                assert "all streams" in f.unit  # never mistaken for a per-request rate


def test_figure_names_indexed_and_percentile_forms() -> None:
    assert figure("per_position[2]") is CATALOGUE["per_position"]
    assert figure("serving.ttft_ms.p90") is CATALOGUE["serving.ttft_ms"]
    assert figure("speedup").better == "higher" and figure("serving.e2el_ms").better == "lower"
    with pytest.raises(KeyError, match="no figure"):
        figure("tok_per_s")


def test_docs_show_the_catalogue() -> None:
    text = (ROOT / "docs" / "FIGURES.md").read_text()
    start = text.index("<!-- catalogue:")
    body = text[text.index("\n", start) + 1:text.index("<!-- /catalogue -->")].strip()
    assert body == markdown_table(), "docs/FIGURES.md: run `python -m spectrial.analysis.catalogue` and paste"


@pytest.mark.parametrize("name", GATED)
def test_the_gate_reads_units_and_directions_from_the_catalogue(name: str) -> None:
    check = judge("a", name, DEFAULT_FIGURES[name], None, [], confidence=0.95)
    assert (check.unit, check.better) == (CATALOGUE[name].unit, CATALOGUE[name].better)
