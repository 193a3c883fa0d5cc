"""One record, one answer: the checks that every figure of an arm's comparison follows from the same two decode
rates, and that every reader (headline, explain, history, the doctor, report.html) says what the record says.

Used by tests/test_consistency.py (committed records, generated ones, a live llama.cpp trial and sweep) and by
tests/test_vllm_real.py (real vLLM records). Not a test module itself.
"""

from __future__ import annotations

import math
import re
from html import escape
from pathlib import Path

import pytest

from spectrial import validity
from spectrial.diagnose import diagnose
from spectrial.figures import NO_BASELINE, NO_SPREAD, NOT_DISTINGUISHABLE, TOO_FEW, is_baseline
from spectrial.readers.explain import explain
from spectrial.readers.headline import headlines
from spectrial.readers.history import record_rows
from spectrial.records import load_record
from spectrial.schema import ArmRecord, Manifest

REL = 1e-9


def _close(a: float | None, b: float | None, rel: float = REL) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def check_arm(arm: ArmRecord, arms: list[ArmRecord]) -> None:
    """The invariants of one arm's comparison (figures.judged) and derived figures (figures.derived_figures)."""
    where = f"arm {arm.name}"
    if arm.status != "ok":
        return
    if arm.tok_s and arm.ms_per_token is not None:
        assert _close(arm.ms_per_token, 1000.0 / arm.tok_s), where
    if arm.speculative and arm.accept_len and arm.tok_s and arm.cycle_ms is not None and not arm.derived:
        assert _close(arm.cycle_ms, arm.accept_len / arm.tok_s * 1000.0), where
    if arm.baseline_arm is None:
        assert arm.speedup is None and arm.pays is None, where
        return
    base = next(a for a in arms if a.name == arm.baseline_arm)
    assert is_baseline(base) and base.status == "ok", where
    assert _close(arm.baseline_tok_s, base.tok_s), f"{where}: baseline rate"
    if not arm.tok_s:
        assert arm.speedup is None and arm.pays is None, where
        if arm.break_even_accept_len is not None:  # a profiled cycle without a decode rate
            assert _close(arm.break_even_accept_len, arm.cycle_ms * base.tok_s / 1000.0), where
        return
    assert _close(arm.speedup, arm.tok_s / base.tok_s), f"{where}: speed-up = tok_s / baseline tok_s"
    lo, hi, v = arm.speedup_ci_low, arm.speedup_ci_high, arm.verdict or ""
    if arm.speculative and arm.accept_len:
        be = arm.break_even_accept_len
        assert _close(be, arm.accept_len / arm.speedup), f"{where}: break-even = accept length / speed-up"
        assert (arm.accept_len > be) == (arm.speedup > 1) or _close(arm.speedup, 1.0), where
        if lo and hi:
            assert _close(arm.break_even_ci_low, arm.accept_len / hi) and \
                _close(arm.break_even_ci_high, arm.accept_len / lo), f"{where}: break-even interval"
    if lo is not None and hi is not None:
        assert lo <= hi, where
        if v == "faster":
            assert lo > 1, where
        elif v == "slower":
            assert hi < 1, where
        elif v == NOT_DISTINGUISHABLE:
            assert lo <= 1 <= hi, where
        elif v.startswith("equivalent"):
            assert lo <= 1 <= hi or lo > 1 or hi < 1, where
    # an invalid measurement (a failed check of the arm or its baseline) is never called faster or slower
    bad = validity.invalid_names(arm, base)
    assert bool(bad) == validity.is_invalid(v) or not v or v == NO_BASELINE, f"{where}: {bad} vs verdict {v!r}"
    expected = {"faster": "yes", "slower": "no"}.get(v)
    if v in (NO_SPREAD, TOO_FEW):
        expected = "yes" if arm.speedup > 1 else "no" if arm.speedup < 1 else "undecided"
    elif v == NO_BASELINE or not v:
        expected = None
    elif expected is None:
        expected = "undecided"
    if arm.name != base.name:
        assert arm.pays == expected, f"{where}: pays {arm.pays} vs verdict {v!r}"
    for c in arm.categories:
        if c.speedup is not None and c.accept_len and arm.speculative:
            assert _close(c.break_even_accept_len, c.accept_len / c.speedup), f"{where}/{c.category}"
        cv = c.verdict or ""
        if cv in ("faster", "slower"):
            assert c.pays == {"faster": "yes", "slower": "no"}[cv], f"{where}/{c.category}"


def check_manifest(m: Manifest, label: str = "") -> None:
    """Every arm's invariants, then every reader against the record."""
    arms = list(m.arms)
    for a in arms:
        check_arm(a, arms)
    by = {a.name: a for a in arms}
    # the headline: one line per arm, the record's verdict and speed-up
    for h in headlines(m):
        for line in h.arms:
            a = by.get(line.arm) or next((p for p in m.points if p.name == line.arm), None)
            assert a is not None, f"{label}: headline arm {line.arm}"
            assert line.verdict == a.verdict and _close(line.speedup, a.speedup), f"{label}: headline {line.arm}"
            assert line.pays == a.pays, f"{label}: headline {line.arm}"
    if m.points:
        return
    # explain's break-even section: the same verdict, pays, speed-up and break-even, and one baseline rate
    sessions = list(dict.fromkeys(a.session for a in arms))
    for s in sessions:
        mine = [a for a in arms if a.session == s]
        ex = explain(m.model_copy(update={"arms": mine}))
        try:
            sec = ex.section("Break-even")
        except KeyError:
            continue
        if ex.numbers.baseline_tok_s and ex.numbers.baseline_ms_per_token:
            assert _close(ex.numbers.baseline_ms_per_token, 1000.0 / ex.numbers.baseline_tok_s), label
            said = re.search(r"The baseline takes ([0-9.]+) ms per token \(([0-9.]+) tok/s", sec.text)
            if said:
                ms, rate = said.groups()
                assert float(ms) == pytest.approx(1000.0 / float(rate), rel=2e-3), f"{label}: {ms} ms, {rate} tok/s"
        if sec.table is None or sec.table.empty:
            continue
        for _, row in sec.table.iterrows():
            a = by[row["arm"]]
            assert row["verdict"] == (a.verdict or "n/a"), f"{label}: explain verdict of {a.name}"
            assert row["pays"] == (a.pays or "not judged"), f"{label}: explain pays of {a.name}"
            if a.speedup is not None:
                assert row["speedup"] == pytest.approx(a.speedup, abs=6e-4), f"{label}: explain speed-up"
            if a.break_even_accept_len is not None:
                assert row["break_even_accept_len"] == pytest.approx(a.break_even_accept_len, abs=6e-4), label
    # the history table: the record's comparison, never recomputed
    rows, _ = record_rows(m, label or "run")
    for r in rows:
        a = by[r.arm]
        if a.status == "ok" and a.speculative:
            assert r.verdict == a.verdict and r.pays == a.pays, f"{label}: history {a.name}"
            assert _close(r.speedup, a.speedup), f"{label}: history speed-up {a.name}"


def check_doctor(m: Manifest | Path, label: str = "") -> None:
    """The doctor's break-even findings follow the record: only arms below their break-even, critical only when
    the arm is slower (or a single value below 1), a warning when undecided."""
    manifest = load_record(m) if isinstance(m, Path) else m
    by = {a.name: a for a in manifest.arms}
    for f in diagnose(m).of("below_break_even"):
        if f.arm is None or f.arm not in by:
            continue
        a = by[f.arm]
        assert a.accept_len < a.break_even_accept_len, f"{label}: {f.title}"
        if f.severity == "critical":
            assert a.pays == "no", f"{label}: critical but pays {a.pays}: {f.title}"
        elif f.severity == "warning":
            assert a.pays == "undecided", f"{label}: {f.title}"


def check_run(run: Path) -> None:
    """A run folder: the record, its readers, the doctor, and report.html carries the headline."""
    from spectrial.readers.render.report import write_report

    m = load_record(run)
    check_manifest(m, run.name)
    check_doctor(run, run.name)
    html = write_report(run).read_text()
    first = escape(headlines(m)[0].title, quote=False)
    assert first in html, f"{run.name}: report lacks {first!r}"
    assert html.index(first) < html.index("(spectrial doctor)"), f"{run.name}: the headline is not first"
