"""One record, one answer: the checks that every figure of an arm's comparison follows from the same two decode
rates (a decide run: the same paired rounds), and that every reader (the CLI's headline and table, a decide run's
summary line, explain's text and tables, the doctor, report.html, diff, the sweep's verdict, the history rows)
prints what the record says.

`check_readers` reads each reader's *output*, the text a person sees, and parses every speed-up, interval,
break-even and cycle printed near an arm's name: each must be the record's number at the printed precision, and
every cycle printed beside a break-even must imply it (cycle x the baseline's tok/s / 1000 = the break-even: one
clock). So a reader that shows tok_s / baseline tok_s beside a decide run's interval, or a second break-even on the
engine's clock, fails.

Used by tests/record/test_consistency.py (committed records, generated ones, a live llama.cpp trial and sweep), by
tests/protocol/test_decide.py and by tests/engines/test_vllm_real.py (real vLLM records). Not a test module itself.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from html import escape
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spectrial.analysis import validity
from spectrial.analysis.figures import (
    NO_BASELINE,
    NO_SPREAD,
    NOT_DISTINGUISHABLE,
    TOO_FEW,
    is_baseline,
    paired_rounds,
)
from spectrial.readers.diagnose import diagnose
from spectrial.readers.explain import explain
from spectrial.readers.headline import headlines
from spectrial.readers.history import record_rows
from spectrial.record.store import load_record
from spectrial.schema import ArmRecord, Load, Manifest

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
    lo, hi, v = arm.speedup_ci_low, arm.speedup_ci_high, arm.verdict or ""
    if paired_rounds(arm.ci_basis) and lo is not None and hi is not None:
        # a decide run's arm with its interval: the sequence's estimate (checked in check_manifest)
        assert arm.speedup is not None and arm.speedup > 0, f"{where}: a decide arm without its speed-up"
    else:
        assert _close(arm.speedup, arm.tok_s / base.tok_s), f"{where}: speed-up = tok_s / baseline tok_s"
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
    # a decide run: each arm's speed-up and interval are its sequence's estimate and interval, one pair
    for d in (m.decide.arms if m.decide is not None else []):
        a = by.get(d.arm)
        if a is None or a.status != "ok" or not paired_rounds(a.ci_basis) or d.ci_low is None or d.ci_high is None:
            continue  # no interval yet: no pair (its speed-up is tok_s / baseline tok_s, checked in check_arm)
        assert d.estimate is not None and _close(a.speedup, d.estimate), \
            f"{label}: decide arm {a.name}: speed-up {a.speedup} is not its sequence's estimate {d.estimate}"
        if d.ci_low is not None and d.ci_high is not None:
            assert _close(a.speedup_ci_low, d.ci_low) and _close(a.speedup_ci_high, d.ci_high), \
                f"{label}: decide arm {a.name}: interval is not its sequence's"
    # the headline: one line per arm, the record's verdict and speed-up
    for h in headlines(m):
        for line in h.arms:
            a = by.get(line.arm) or next((p for p in m.points if p.name == line.arm), None)
            assert a is not None, f"{label}: headline arm {line.arm}"
            assert line.verdict == a.verdict and _close(line.speedup, a.speedup), f"{label}: headline {line.arm}"
            assert line.pays == a.pays, f"{label}: headline {line.arm}"
    check_readers(m, label)  # what each reader prints, parsed
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
    check_doctor_output(run, m, run.name)  # with the run's logs
    check_diff_output(run, m, run.name)
    html = write_report(run).read_text()
    first = escape(headlines(m)[0].title, quote=False)
    assert first in html, f"{run.name}: report lacks {first!r}"
    assert html.index(first) < html.index("(spectrial doctor)"), f"{run.name}: the headline is not first"
    check_report_output(html, m, run.name)


# ------------------------------------------------------------------ what each reader prints, parsed
NUM = r"(\d+(?:\.\d+)?)"
PAIR = rf"{NUM}(?: \[{NUM}, {NUM}\])?"  # a value and, where printed, its interval: '2.29 [2.21, 2.39]'
SPEEDUP = rf"{NUM}x(?: \[{NUM}, {NUM}\])?"  # a speed-up and its interval: '1.10x [0.87, 1.25]'


def _decimals(printed: str) -> int:
    return len(printed.split(".")[1]) if "." in printed else 0


def said(printed: str | None, value: float | None, what: str) -> None:
    """A number a reader printed is the record's `value` at the printed precision (none printed: none recorded)."""
    if printed is None and value is None:
        return
    assert printed is not None, f"{what}: not printed (the record says {value!r})"
    assert value is not None, f"{what}: printed {printed}, the record has none"
    half = 0.5 * 10 ** -_decimals(printed)
    assert abs(float(printed) - value) <= half + 1e-9, f"{what}: printed {printed}, the record says {value!r}"


def said_pair(groups: Sequence[str | None], value: float | None, low: float | None, high: float | None,
              what: str) -> None:
    """A printed value with its interval (groups: value, low, high) is the record's pair; an interval the record
    holds is never left out."""
    said(groups[0], value, what)
    if groups[1] is None:
        assert not (low and high), f"{what}: printed {groups[0]} without the record's interval [{low}, {high}]"
        return
    said(groups[1], low, f"{what}, interval's low end")
    said(groups[2], high, f"{what}, interval's high end")


def said_cycle(printed: str | None, arm: ArmRecord, what: str) -> None:
    """A cycle printed beside a break-even is on the verdict's clock: cycle x the baseline's tok/s / 1000 is the
    record's break-even (within the printed cycle's precision), never another clock's."""
    assert printed is not None, f"{what}: no cycle printed"
    rate, be = arm.baseline_tok_s, arm.break_even_accept_len
    assert rate and be, f"{what}: printed a cycle {printed} ms, the record has no break-even to check it with"
    implied = float(printed) * rate / 1000.0
    slack = 0.5 * 10 ** -_decimals(printed) * rate / 1000.0
    assert abs(implied - be) <= slack + 1e-9, (f"{what}: a cycle of {printed} ms is {implied:.4f} baseline tokens, "
                                              f"the record's break-even is {be:.4f}: two clocks")


def _spec(m: Manifest) -> list[ArmRecord]:
    """The speculative arms (a sweep's points) that were compared: what every reader prints a speed-up for."""
    arms = list(m.points) if m.points else list(m.arms)
    return [a for a in arms if a.status == "ok" and a.speculative and a.speedup is not None]


def _arm(name: str) -> str:
    """The arm's name as readers print it: alone, or with its label's '(k=..)' after it."""
    return re.escape(name) + r"(?: \([^)]*\))?"


def check_sentence(text: str, a: ArmRecord, what: str) -> None:
    """An arm's headline sentence ('label: 1.10x [0.87, 1.25] verdict — accept length 2.65 vs break-even 2.29
    [2.21, 2.39]') in `text`, each at the start of a line: the speed-up pair and the break-even pair are the
    record's."""
    found = list(re.finditer(rf"(?m)^{_arm(a.name)}: {SPEEDUP}", text))
    assert found, f"{what}: no sentence for {a.name}"
    for hit in found:
        said_pair(hit.groups(), a.speedup, a.speedup_ci_low, a.speedup_ci_high, f"{what}: {a.name} speed-up")
        rest = text[hit.end():].split("\n", 1)[0]
        be = re.search(rf"vs break-even {PAIR}", rest)
        if a.accept_len is not None and a.break_even_accept_len is not None:
            assert be, f"{what}: {a.name}'s sentence has no break-even: {rest[:200]}"
        if be:
            said_pair(be.groups(), a.break_even_accept_len, a.break_even_ci_low, a.break_even_ci_high,
                      f"{what}: {a.name} break-even")


def check_title(title: str, arms: Sequence[ArmRecord], what: str) -> None:
    """The headline's title names an arm's speed-up pair ('X is 1.10x faster [..]', 'best: X 1.10x [..]')."""
    for a in arms:
        for hit in re.finditer(rf"(?:: | best: ){_arm(a.name)}(?: is)? {NUM}x(?: faster)?(?: \[{NUM}, {NUM}\])?",
                               title):
            said_pair(hit.groups(), a.speedup, a.speedup_ci_low, a.speedup_ci_high, f"{what}: title, {a.name}")


def check_decided(line: str | None, m: Manifest, what: str) -> None:
    """A decide run's summary line ('eagle3 slower 0.556 [0.443, 0.696]') holds each arm's record pair."""
    if not line or m.decide is None:
        return
    by = {a.name: a for a in m.arms}
    for d in m.decide.arms:
        a = by.get(d.arm)
        if a is None or not paired_rounds(a.ci_basis):
            continue
        for hit in re.finditer(rf"(?<![\w-]){re.escape(d.arm)}(?![\w-])[a-z :,=]*?{PAIR}", line):
            said_pair(hit.groups(), a.speedup, a.speedup_ci_low, a.speedup_ci_high, f"{what}: {a.name}")


def _rich_text(renderable: object) -> str:
    from rich.console import Console

    console = Console(width=200, record=True, color_system=None, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def check_rich_table(text: str, arms: Sequence[ArmRecord], what: str) -> None:
    """The CLI's table (rich, 200 columns): each arm's row shows the record's speed-up and break-even pairs in
    the columns headed 'speed-up' and 'break-even' (right-aligned: a value ends where its header ends)."""
    if not arms:
        return
    lines = text.splitlines()
    header = next((i for i, ln in enumerate(lines) if "speed-up" in ln and "break-even" in ln), None)
    assert header is not None, f"{what}: the CLI table has no 'speed-up' and 'break-even' columns:\n{text[:600]}"
    head = lines[header]
    sp = re.search(r"speed-up(?: \[CI\])?", head)
    assert sp is not None
    be_end = head.index("break-even") + len("break-even")
    for a in arms:
        row = next((ln for ln in lines[header + 1:] if re.match(rf"{_arm(a.name)}\s", ln)), None)
        assert row is not None, f"{what}: no table row for {a.name}"
        hit = re.search(rf"{SPEEDUP}$", row[:sp.end()].rstrip())
        assert hit, f"{what}: {a.name}'s row has no speed-up under its header: {row!r}"
        said_pair(hit.groups(), a.speedup, a.speedup_ci_low, a.speedup_ci_high, f"{what}: table {a.name} speed-up")
        if a.break_even_accept_len is not None:
            hit = re.search(rf"(?<![\d.x]){PAIR}$", row[:be_end].rstrip())
            assert hit, f"{what}: {a.name}'s row has no break-even under its header: {row!r}"
            said_pair(hit.groups(), a.break_even_accept_len, a.break_even_ci_low, a.break_even_ci_high,
                      f"{what}: table {a.name} break-even")


def check_headline_output(m: Manifest, label: str) -> None:
    """The CLI's headline as printed (plain text; rich: the table and the sentences) and a decide run's line."""
    by = {a.name: a for a in _spec(m)}
    for h in headlines(m):
        mine = [by[x.arm] for x in h.arms if x.arm in by and not x.baseline]
        text = h.text()
        check_title(h.title, mine, f"{label}: headline")
        check_decided(h.decided, m, f"{label}: decide line")
        for a in mine:
            check_sentence(text, a, f"{label}: headline text")
            line = next(x for x in h.arms if x.arm == a.name)
            if m.decide is not None and any(d.arm == a.name for d in m.decide.arms) and line.needs:
                assert "request" not in line.needs, f"{label}: a decide run adds rounds, not requests: {line.needs}"
        rich = _rich_text(h.rich())
        check_rich_table(rich, mine, f"{label}: CLI table")
        bullets = re.sub(r" *\n(?!• ) *", " ", rich).replace("• ", "\n")  # a long sentence is wrapped at spaces
        for a in mine:
            check_sentence(bullets, a, f"{label}: CLI sentence")


def _rows(table: pd.DataFrame | None, key: str) -> list[dict[str, object]]:
    return [] if table is None or table.empty or key not in table else table.to_dict("records")


def _num(x: object, nd: int = 3) -> str | None:
    """A table cell as shown (explain rounds its tables: 3 decimals, alpha 4)."""
    if x is None or isinstance(x, str) or (isinstance(x, float) and math.isnan(x)):
        return None
    return f"{float(x):.{nd}f}"  # type: ignore[arg-type]


def check_explain_output(m: Manifest, label: str) -> None:
    """explain's break-even text and table, the cost model's table, the acceptance-needed table and text: the
    record's pair and break-even, every cycle on the verdict's clock, and the alpha needed at an arm's own depth
    the one that reaches its break-even."""
    from spectrial.analysis import formulas

    def level(a: ArmRecord) -> tuple[object, object, object]:  # as notebook 05 reads a sweep: one load level at a time
        return a.session, a.get("concurrency"), a.get("offered_rate")

    for group in dict.fromkeys(level(a) for a in m.arms):
        sub = m.model_copy(update={"arms": [a for a in m.arms if level(a) == group],
                                   "points": []})
        by = {a.name: a for a in _spec(sub)}
        ex = explain(sub)
        where = f"{label}: explain"
        sec = ex.section("Break-even")
        for a in by.values():
            if a.break_even_accept_len is None:
                continue
            bullet = re.search(rf"- \*\*{re.escape(a.name)}\*\* \([^)]*\): a cycle costs (?:at least )?{NUM} ms, "
                               rf"the time of \*\*{NUM}\*\*(?: \[{NUM}, {NUM}\])? baseline tokens[^\n]*? "
                               rf"{SPEEDUP} the baseline", sec.text)
            assert bullet, f"{where}: no break-even sentence for {a.name}"
            g = bullet.groups()
            said_cycle(g[0], a, f"{where}: {a.name}'s cycle")
            said_pair(g[1:4], a.break_even_accept_len, a.break_even_ci_low, a.break_even_ci_high,
                      f"{where}: {a.name}'s break-even")
            said_pair(g[4:7], a.speedup, a.speedup_ci_low, a.speedup_ci_high, f"{where}: {a.name}'s speed-up")
        for row in _rows(sec.table, "arm"):
            a = by.get(str(row["arm"]))
            if a is None:
                continue
            said_pair((_num(row["speedup"]), _num(row["speedup_ci_low"]), _num(row["speedup_ci_high"])),
                      a.speedup, a.speedup_ci_low, a.speedup_ci_high, f"{where}: table, {a.name}'s speed-up")
            said_pair((_num(row["break_even_accept_len"]), _num(row["break_even_ci_low"]),
                       _num(row["break_even_ci_high"])), a.break_even_accept_len, a.break_even_ci_low,
                      a.break_even_ci_high, f"{where}: table, {a.name}'s break-even")
            if _num(row["cycle_ms"]) is not None and a.break_even_accept_len is not None:
                said_cycle(_num(row["cycle_ms"]), a, f"{where}: table, {a.name}'s cycle_ms")
        model = ex.section("Cycle-cost model")
        for row in _rows(model.table, "arm"):
            a = by.get(str(row["arm"]))
            if a is not None and a.break_even_accept_len is not None:
                said_cycle(_num(row["cycle_ms"]), a, f"{where}: cost model, {a.name}'s cycle_ms")
        for method, fit in ex.numbers.models.items():  # fitted on the verdict's clock: the cycles its break-evens are
            mine = [by[n] for n in fit.fitted_on if n in by and by[n].break_even_accept_len and by[n].baseline_tok_s]
            if len(mine) == len(fit.fitted_on) and len({a.steps for a in mine}) >= 2:
                cycles = [a.break_even_accept_len * 1000.0 / a.baseline_tok_s for a in mine]  # type: ignore[operator]
                slope, fixed = np.polyfit([float(a.steps) for a in mine], cycles, 1)  # type: ignore[arg-type]
                assert math.isclose(fit.fixed_ms, fixed, abs_tol=1e-6) and \
                    math.isclose(fit.per_draft_ms, slope, abs_tol=1e-6), \
                    f"{where}: the {method} cost model is not fitted on its arms' break-even cycles"
            said_line = re.search(rf"\*\*{re.escape(method)}\*\*: cycle = (-?{NUM[1:-1]}) ms \+ (-?{NUM[1:-1]}) ms x k",
                                  model.text)
            assert said_line, f"{where}: the {method} cost model is not stated"
            said(said_line.group(1), fit.fixed_ms, f"{where}: {method} fixed ms")
            said(said_line.group(2), fit.per_draft_ms, f"{where}: {method} ms per draft")
        needed = ex.section("Acceptance needed")
        for row in _rows(needed.table, "source"):
            a = by.get(str(row["source"]))  # an arm's own row (a fitted model's rows are named by its condition)
            if a is None or a.break_even_accept_len is None:
                continue
            said_cycle(_num(row["cycle_ms"]), a, f"{where}: acceptance needed, {a.name}'s cycle_ms")
            said(_num(row["accept_len_break_even"]), a.break_even_accept_len,
                 f"{where}: acceptance needed, {a.name}'s break-even")
            k, alpha = int(row["k"]), _num(row.get("alpha_break_even"), 4)  # type: ignore[call-overload]
            if alpha is not None and 1 < a.break_even_accept_len < k + 1:
                said(alpha, formulas.required_alpha(a.break_even_accept_len, k),
                     f"{where}: acceptance needed, {a.name}'s alpha at its break-even")
        for hit in re.finditer(rf"k=\d+ \(([^,()]+), [^,()]+, cycle {NUM} ms\)", needed.text):
            a = by.get(hit.group(1))
            if a is not None and a.break_even_accept_len is not None:
                said_cycle(hit.group(2), a, f"{where}: acceptance needed text, {a.name}'s cycle")


def check_doctor_output(source: Manifest | Path, m: Manifest, label: str) -> None:
    """The doctor's text (`spectrial doctor`): every speed-up, break-even and cycle it prints for an arm is the
    record's."""
    by = {a.name: a for a in _spec(m)}
    d = diagnose(source)
    text = d.text(evidence=10)
    for f in d.findings:
        a = by.get(f.arm or "")
        if a is None:
            continue
        said_text = f.text(evidence=10)
        assert said_text.split("\n", 1)[0] in text, f"{label}: doctor"
        where = f"{label}: doctor on {a.name} ({f.kind})"
        for hit in re.finditer(rf"{SPEEDUP} the baseline|the speed-up {SPEEDUP}", said_text):
            g = hit.groups()
            said_pair(g[0:3] if g[0] else g[3:6], a.speedup, a.speedup_ci_low, a.speedup_ci_high,
                      f"{where}: speed-up")
        for hit in re.finditer(rf"break-even {NUM}(?![\d.])", said_text):
            said(hit.group(1), a.break_even_accept_len, f"{where}: break-even")
        for hit in re.finditer(rf"A cycle takes {NUM} ms, the time of {NUM} baseline tokens", said_text):
            said_cycle(hit.group(1), a, f"{where}: cycle")
            said(hit.group(2), a.break_even_accept_len, f"{where}: break-even")


def _html_text(html: str) -> tuple[str, list[list[list[str]]]]:
    """report.html as text (tags stripped, entities decoded, no scripts or styles) and its tables (rows of cells)."""
    from html.parser import HTMLParser

    class Reader(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.text: list[str] = []
            self.tables: list[list[list[str]]] = []
            self.skip = 0
            self.cell: list[str] | None = None

        def handle_starttag(self, tag: str, attrs: object) -> None:
            if tag in ("script", "style"):
                self.skip += 1
            elif tag == "table":
                self.tables.append([])
            elif tag == "tr" and self.tables:
                self.tables[-1].append([])
            elif tag in ("td", "th"):
                self.cell = []
            if tag in ("p", "li", "br", "h1", "h2", "h3", "h4", "div", "tr", "pre"):
                self.text.append("\n")

        def handle_endtag(self, tag: str) -> None:
            if tag in ("script", "style"):
                self.skip -= 1
            elif tag in ("td", "th") and self.cell is not None and self.tables and self.tables[-1]:
                self.tables[-1][-1].append("".join(self.cell).strip())
                self.cell = None

        def handle_data(self, data: str) -> None:
            if self.skip:
                return
            if self.cell is not None:
                self.cell.append(data)
            self.text.append(data)

    r = Reader()
    r.feed(html)
    return "".join(r.text), r.tables


def check_report_output(html: str, m: Manifest, label: str) -> None:
    """report.html's text (tags stripped): the headline's title and sentences, explain's break-even sentences, the
    doctor's; its tables (the headline's, the arms table, explain's): every speed-up, break-even and cycle of an
    arm is the record's, on one clock."""
    text, tables = _html_text(html)
    spec = _spec(m)
    by = {a.name: a for a in spec}
    where = f"{label}: report.html"
    for a in spec:
        check_sentence(text, a, where)
        for hit in re.finditer(rf"{re.escape(a.name)} \([^)]*\): a cycle costs (?:at least )?{NUM} ms, the time of "
                               rf"{PAIR} baseline tokens", text):
            said_cycle(hit.group(1), a, f"{where}: {a.name}'s cycle")
            said_pair(hit.groups()[1:4], a.break_even_accept_len, a.break_even_ci_low, a.break_even_ci_high,
                      f"{where}: {a.name}'s break-even")
        for hit in re.finditer(rf"{re.escape(a.name)}: accept length {NUM} below the break-even {NUM} \({SPEEDUP}"
                               rf"(?:[^\n]*?A cycle takes {NUM} ms, the time of {NUM} baseline tokens)?", text):
            g = hit.groups()
            said(g[1], a.break_even_accept_len, f"{where}: doctor, {a.name}'s break-even")
            said_pair(g[2:5], a.speedup, a.speedup_ci_low, a.speedup_ci_high, f"{where}: doctor, {a.name}'s speed-up")
            if g[5] is not None:
                said_cycle(g[5], a, f"{where}: doctor, {a.name}'s cycle")
                said(g[6], a.break_even_accept_len, f"{where}: doctor, {a.name}'s cycle in baseline tokens")
    for h in headlines(m):
        check_title(h.title, [a for a in spec if any(x.arm == a.name for x in h.arms)], where)
    for t in tables:
        if len(t) < 2 or "category" in t[0]:  # a category's own comparison is not the arm's
            continue
        head, rows = t[0], t[1:]
        key = "arm" if "arm" in head else "source" if "source" in head else None
        if key is None:
            continue
        col = {c: i for i, c in enumerate(head)}
        for row in rows:
            if len(row) != len(head):
                continue
            a = by.get(re.sub(r" \([^)]*\)$", "", row[col[key]]))
            if a is None:
                continue

            def cell(c: str, row: list[str] = row, col: dict[str, int] = col) -> str | None:
                v = row[col[c]] if c in col else ""
                return v if re.match(r"\d", v) else None

            tw = f"{where}: table ({', '.join(head[:5])}, ...), {a.name}"
            if cell("speed-up [CI]"):
                said_pair(re.match(SPEEDUP, cell("speed-up [CI]")).groups(),  # type: ignore[arg-type, union-attr]
                          a.speedup, a.speedup_ci_low, a.speedup_ci_high, f"{tw}: speed-up")
            if cell("break-even"):
                said_pair(re.match(PAIR, cell("break-even")).groups(),  # type: ignore[arg-type, union-attr]
                          a.break_even_accept_len, a.break_even_ci_low, a.break_even_ci_high, f"{tw}: break-even")
            for c, v in (("speedup", a.speedup), ("speedup_ci_low", a.speedup_ci_low),
                         ("speedup_ci_high", a.speedup_ci_high), ("break_even_accept_len", a.break_even_accept_len),
                         ("accept_len_break_even", a.break_even_accept_len),
                         ("break_even_ci_low", a.break_even_ci_low), ("break_even_ci_high", a.break_even_ci_high)):
                if cell(c):
                    said(cell(c), v, f"{tw}: {c}")
            if cell("cycle_ms") and a.break_even_accept_len is not None:
                said_cycle(cell("cycle_ms"), a, f"{tw}: cycle_ms")


def check_diff_output(run: Path, m: Manifest, label: str) -> None:
    """`spectrial diff RUN RUN`: the change it states ('arm: speed-up against its own run's baseline 1.10x [0.87,
    1.25] -> ...') is the record's pair on both sides."""
    from spectrial.readers.diff import diff_runs, format_findings

    text = format_findings(diff_runs(run, run))
    by = {a.name: a for a in _spec(m)}
    for hit in re.finditer(rf"(\S+): speed-up against its own run's baseline {SPEEDUP} -> {SPEEDUP}", text):
        a = by.get(hit.group(1))
        assert a is not None, f"{label}: diff names {hit.group(1)}"
        g = hit.groups()
        said_pair(g[1:4], a.speedup, a.speedup_ci_low, a.speedup_ci_high, f"{label}: diff, before")
        said_pair(g[4:7], a.speedup, a.speedup_ci_low, a.speedup_ci_high, f"{label}: diff, after")


def check_sweep_output(m: Manifest, label: str) -> None:
    """A sweep's verdict paragraph: each best setting's speed-up is its point's."""
    from spectrial.readers.points import scenario_label
    from spectrial.readers.sweep import verdict

    if not m.points:
        return
    text = verdict(m)
    by = {p.id: p for p in m.points}
    for row in m.best:
        load = Load(row.concurrency, row.offered_rate)
        p = by.get(f"{row.best}@{load.id}") if row.best else None
        if p is None or p.speedup is None:
            continue
        where = f"{scenario_label(row.scenario)}, {load.text()}: best **{row.best}**"
        hit = re.search(rf"{re.escape(where)} at [^;]*?, {NUM}x the baseline", text)
        assert hit, f"{label}: the sweep's verdict has no speed-up for {where}"
        said(hit.group(1), p.speedup, f"{label}: sweep verdict, {p.id}")


def check_history_rows(m: Manifest, label: str) -> None:
    """The history's rows (notebook 04, the report's arms table): the record's pair, its break-even, and a cycle
    on the verdict's clock."""
    by = {a.name: a for a in _spec(m)}
    rows, _ = record_rows(m, label or "run")
    for r in rows:
        a = by.get(r.arm)
        if a is None:
            continue
        assert _close(r.speedup, a.speedup), f"{label}: history speed-up {a.name}"
        assert _close(r.speedup_ci_low, a.speedup_ci_low) and _close(r.speedup_ci_high, a.speedup_ci_high), label
        assert _close(r.break_even_accept_len, a.break_even_accept_len), f"{label}: history break-even {a.name}"
        if r.cycle_ms is not None and a.break_even_accept_len is not None:
            said_cycle(f"{r.cycle_ms:.9f}", a, f"{label}: history cycle_ms {a.name}")


def check_readers(m: Manifest, label: str = "") -> None:
    """Every reader's output for a record that needs no run folder: what each prints for an arm is the record's one
    comparison (`check_run` adds the doctor on the folder's logs, diff and report.html)."""
    check_headline_output(m, label)
    check_history_rows(m, label)
    check_sweep_output(m, label)
    check_explain_output(m, label)
    check_doctor_output(m, m, label)
