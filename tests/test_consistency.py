"""One baseline, one verdict: every committed record, records generated here (a live llama.cpp trial, a simulated
sweep), and arm sets drawn at random all satisfy the comparison's identities (speed-up = tok_s / baseline tok_s,
break-even = accept length / speed-up, accept length above break-even exactly when the speed-up is above 1, pays =
the verdict, the verdict = where the interval lies), and every reader says what the record says."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from consistency import check_arm, check_doctor, check_manifest, check_run
from hypothesis import given, settings
from hypothesis import strategies as st

from spectrial.figures import add_comparisons, pick_baseline
from spectrial.readers.headline import headline
from spectrial.records import as_manifest, load_record
from spectrial.schema import ArmRecord

REPO = Path(__file__).resolve().parents[1]
RECORDS = sorted(p.parent for p in (REPO / "outputs" / "examples").rglob("manifest.json"))
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]


@pytest.mark.parametrize("run", RECORDS, ids=lambda p: p.relative_to(REPO / "outputs" / "examples").as_posix())
def test_committed_records_hold_one_answer(run: Path, tmp_path: Path) -> None:
    m = load_record(run)
    if m.kind == "nccl_check":
        return
    check_manifest(m, run.name)
    check_doctor(run, run.name)
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    check_run(copy)


def test_committed_records_are_written_in_the_current_schema() -> None:
    """The migration was applied to the files themselves: what is committed is what spectrial reads."""
    import json

    from spectrial.schema import SCHEMA_VERSION

    for run in RECORDS:
        raw = json.loads((run / "manifest.json").read_text())
        assert raw.get("schema_version") == SCHEMA_VERSION, run
        assert load_record(run).model_dump(mode="json") == as_manifest(raw).model_dump(mode="json")


rates = st.floats(min_value=20.0, max_value=900.0, allow_nan=False)


@st.composite
def arm_sets(draw: Any) -> list[ArmRecord]:
    """A baseline and 1-4 speculative arms with random rates, spreads, accept lengths and interval choices."""
    def values(center: float) -> list[float]:
        n = draw(st.integers(min_value=0, max_value=6))
        spread = draw(st.floats(min_value=0.0, max_value=0.3))
        return [center * (1 + spread * (i / max(n - 1, 1) - 0.5)) for i in range(n)]

    base_rate = draw(rates)
    arms = [ArmRecord(name="baseline", status="ok", tok_s=base_rate, tok_s_values=values(base_rate))]
    for i in range(draw(st.integers(min_value=1, max_value=4))):
        r = draw(rates)
        k = draw(st.integers(min_value=1, max_value=8))
        al = draw(st.one_of(st.none(), st.floats(min_value=1.0, max_value=k + 1.0)))
        extra: dict[str, Any] = {}
        if draw(st.booleans()):  # an interval recorded by the trial (bootstrap or confidence sequence)
            lo = draw(st.floats(min_value=0.2, max_value=3.0))
            extra = {"speedup_ci_low": lo, "speedup_ci_high": lo * draw(st.floats(min_value=1.0, max_value=1.8))}
        arms.append(ArmRecord(name=f"spec{i}", method="eagle3", status="ok", steps=k, tok_s=r,
                              tok_s_values=values(r), accept_len=al, **extra))
    return arms


@given(arm_sets())
@settings(max_examples=150, deadline=None)
def test_random_arms_hold_the_identities(arms: list[ArmRecord]) -> None:
    base = add_comparisons(arms, None)
    assert base is pick_baseline(arms) or base.name == "baseline"
    for a in arms:
        check_arm(a, arms)
    h = headline(None, arms=arms)
    for line in h.arms:
        a = next(x for x in arms if x.name == line.arm)
        assert line.verdict == a.verdict and line.pays == a.pays


def test_a_simulated_sweep_holds_one_answer(tmp_path: Path) -> None:
    from spectrial.sweep import World, load_sweep_params, simulate

    p = load_sweep_params(data={"name": "world", "model": "world:target", "draft": "world:draft", "repeats": 4,
                                "max_tokens": 64, "grid": {"steps": [1, 3, 6], "synthetic_accept": [0.7, None],
                                                           "concurrency": [1, 2]}},
                          overrides={"strategy": "grid"})
    run = simulate(p, World(fixed_ms=8.0, per_draft_ms=0.9, real_p1=0.7, real_decay=0.8), seed=1,
                   output_dir=tmp_path).run_dir
    m = load_record(run)
    check_manifest(m, "world")
    for pt in m.points:
        if pt.status == "ok" and pt.method != "none":
            base = next(b for b in m.points if b.id == pt.baseline)
            check_arm(pt, [base, pt])


@pytest.mark.slow
def test_a_live_trial_holds_one_answer_and_the_cli_leads_with_it(tiny_params, write_params, tmp_path):
    """spectrial trial on real llama.cpp: the headline comes first, no line wider than the terminal (80 columns
    when not a terminal), the record and its readers agree, report.html opens with the same headline."""
    path = write_params({**tiny_params, "restarts": 2})
    env = {**os.environ, "COLUMNS": "80", "SPECTRIAL_PROGRESS": "line"}
    res = subprocess.run([*SPECTRIAL, "trial", str(path)], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode in (0, 1), res.stderr[-3000:]
    out = res.stdout.splitlines()
    said = [line for line in out if not line.startswith(("run record: ", "report: "))]  # a path is as long as it is
    assert said and max(len(line) for line in said) <= 80, max(said, key=len)
    run = next(p for p in (tmp_path / "outputs").iterdir() if (p / "manifest.json").is_file())
    m = load_record(run)
    assert out[0].startswith(headline(m).title[:40]), out[:3]
    assert all(len(a.starts) == 2 for a in m.arms)
    check_run(run)
    wide = subprocess.run([*SPECTRIAL, "trial", str(path), "--wide", "-p", "arms=[{name: baseline}]"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert "tok_s_ci_low" in wide.stdout  # every figure on request
