"""One baseline, one verdict: every committed record, records generated here (a live llama.cpp trial, a simulated
sweep), and arm sets drawn at random all satisfy the comparison's identities (speed-up = tok_s / baseline tok_s,
a decide run's: its sequence's estimate with its interval; break-even = accept length / speed-up, accept length
above break-even exactly when the speed-up is above 1, pays = the verdict, the verdict = where the interval lies),
and every reader prints what the record says, on one clock (tests/consistency.py parses their output)."""

from __future__ import annotations

import math
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

from spectrial.analysis.figures import (
    NOT_DISTINGUISHABLE,
    add_comparisons,
    pick_baseline,
    rederive,
    verdict_of,
)
from spectrial.readers.headline import headline
from spectrial.record.store import as_manifest, load_record
from spectrial.schema import ArmRecord, Manifest

REPO = Path(__file__).resolve().parents[2]
RECORDS = sorted(p.parent for p in (REPO / "outputs" / "examples").rglob("manifest.json"))
DECIDE = REPO / "outputs" / "examples" / "vllm-cpu-decide" / "20261202-043943-vllm-cpu-decide-362d"
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]


GOLDEN = sorted(p.parent for p in (REPO / "tests" / "golden").rglob("manifest.json"))
FIXTURES = sorted((REPO / "tests" / "fixtures" / "records").glob("*.json"))  # bare manifests of older schemas


@pytest.mark.parametrize("run", RECORDS + GOLDEN, ids=lambda p: p.relative_to(REPO).as_posix())
def test_committed_records_hold_one_answer(run: Path, tmp_path: Path) -> None:
    m = load_record(run)
    if m.kind == "nccl_check":
        return
    check_manifest(m, run.name)
    check_doctor(run, run.name)
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    check_run(copy)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fixture_records_hold_one_answer(path: Path, tmp_path: Path) -> None:
    """A record of an older schema (read, migrated in memory) in a run folder of its own: the same one answer."""
    run = tmp_path / path.stem
    run.mkdir()
    shutil.copy(path, run / "manifest.json")
    check_run(run)


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


def _decided(m: Manifest, sequences: dict[str, tuple[float | None, float | None, float | None]], rounds: int,
             stopped: str | None = None, first_look: int | None = None) -> Manifest:
    """The real decide record `m` as its trial would have recorded it had each arm's sequence ended at
    (estimate, low, high) after `rounds` rounds: the arms compared by `figures.add_comparisons` with the
    intervals `Trial._run_decide` hands it (the sequence's estimate with its interval), the decide record to
    match (its summary line in `spectrial.analysis.sequential`'s words)."""
    assert m.decide is not None
    intervals, seqs = {}, []
    for d in m.decide.arms:
        est, lo, hi = sequences[d.arm]
        status = "undecided" if lo is None or hi is None else (verdict_of(lo, hi) or "undecided").replace(
            NOT_DISTINGUISHABLE, "undecided")
        intervals[d.arm] = {"low": lo, "high": hi, "level": m.decide.level, "estimate": est if lo is not None else None,
                            "verdict": verdict_of(lo, hi) or NOT_DISTINGUISHABLE,
                            "basis": f"confidence sequence over {rounds} paired rounds"}
        seqs.append(d.model_copy(update={"rounds": rounds, "estimate": est, "ci_low": lo, "ci_high": hi,
                                         "status": status, "first_look": first_look}))
    states = "; ".join(f"{d.arm} {d.status}" + (f" {d.estimate:.3f} [{d.ci_low:.3f}, {d.ci_high:.3f}]"
                                                 if d.ci_low is not None else "") for d in seqs)
    arms = [a.model_copy() for a in m.arms]
    add_comparisons(arms, None, intervals=intervals)
    decide = m.decide.model_copy(update={"arms": seqs, "rounds": rounds, "starts": rounds * len(arms),
                                         "stopped": stopped or f"decided after {rounds} rounds: {states}"})
    return m.model_copy(update={"arms": arms, "decide": decide})


@given(st.floats(min_value=0.5, max_value=2.0), st.floats(min_value=1.02, max_value=1.6))
@settings(max_examples=25, deadline=None)
def test_a_decide_runs_pair_is_one_answer_everywhere(scale: float, width: float) -> None:
    """A decide run's arm: whatever its sequence's estimate (the real record's moved by `scale`, an interval of
    `width` around it), the record's speed-up, interval, break-even and pays, and every number a reader prints for
    it (headline, CLI table, decide line, explain, the doctor, history), are that one pair; read back (`rederive`:
    the migration) it stays that pair, never tok_s / baseline tok_s beside the sequence's interval."""
    m = load_record(DECIDE)
    assert m.decide is not None
    seqs = {d.arm: (est, est / width, est * width) for d in m.decide.arms
            if (est := d.estimate * scale)}  # type: ignore[operator]
    judged = _decided(m, seqs, m.decide.rounds)
    for a in judged.arms:
        if a.name in seqs:
            est, lo, hi = seqs[a.name]
            assert (a.speedup, a.speedup_ci_low, a.speedup_ci_high) == (est, lo, hi)
            assert a.break_even_accept_len == pytest.approx(a.accept_len / est, rel=1e-12)
    check_manifest(judged, "decide")
    back = rederive(as_manifest(judged.model_dump(mode="json")))
    for a, b in zip(judged.arms, back.arms, strict=True):
        assert (b.speedup, b.speedup_ci_low, b.speedup_ci_high, b.break_even_accept_len, b.verdict, b.pays) == \
            (a.speedup, a.speedup_ci_low, a.speedup_ci_high, a.break_even_accept_len, a.verdict, a.pays), a.name
    check_manifest(back, "decide read back")


def test_a_decide_run_stopped_undecided_advises_rounds_not_requests() -> None:
    """A decide run only adds rounds (one start of every arm): an undecided arm is told how many more rounds (and
    starts) a fixed design would need, from its sequence's interval with the rounds as the unit; an arm whose
    interval is still unbounded is told why (fewer rounds than its first possible decision), never 'requests'."""
    from statistics import NormalDist

    m = load_record(DECIDE)
    assert m.decide is not None
    looks = {d.arm: d.looks for d in m.decide.arms}
    # after round 5 of the real record: no interval yet (its design's first look was round 6)
    early = _decided(m, {arm: (ls[4]["estimate"], None, None) for arm, ls in looks.items()}, 5,
                     stopped="start budget: 5 of 5 rounds used; undecided: eagle3, draft-model", first_look=6)
    h = headline(early)
    for line in h.arms:
        if line.arm in looks:
            assert line.needs is not None and "request" not in line.needs, line.needs
            assert line.needs.startswith("no interval yet: its first possible decision is at round 6; 5 round(s) "
                                         "measured"), line.needs
    check_manifest(early, "decide, no interval yet")
    # round 6 with a wide interval: undecided; the rounds a fixed design would need, worked out here
    lo, hi, rounds = 0.9, 1.25, m.decide.rounds
    wide = _decided(m, {arm: (1.06, lo, hi) for arm in looks}, rounds,
                    stopped=f"start budget: {rounds} of {rounds} rounds used; undecided: eagle3, draft-model")
    z, zp = NormalDist().inv_cdf(0.975), NormalDist().inv_cdf(0.8)
    total = math.ceil(rounds * (math.log(hi / lo) / 2 / (math.log(1.05) * z / (z + zp))) ** 2 - 1e-9)
    more = total - rounds
    for line in headline(wide).arms:
        if line.arm in looks:
            assert line.pays == "undecided" and line.needs is not None
            assert line.needs.startswith(f"needs ~{more} more rounds ({more * len(m.arms)} starts"), line.needs
    check_manifest(wide, "decide, undecided")


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
