"""A gate's record for people and CI systems: plain text (the terminal), Markdown (a CI job summary) and JUnit XML
(one test case per arm and figure: a regression is a failure, not comparable an error, inconclusive skipped)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from spectrial.schema import GateCheck, GateRecord

MARK = {"pass": "pass", "improvement": "improvement", "regression": "REGRESSION", "inconclusive": "inconclusive",
        "not comparable": "NOT COMPARABLE", "not gated": "not gated"}


def _num(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


def _change(c: GateCheck) -> str:
    if c.change is None:
        return "-"
    if c.tolerance_kind == "relative":
        text = f"{c.change:+.1%}"
        if c.change_low is not None and c.change_high is not None:
            text += f" [{c.change_low:+.1%}, {c.change_high:+.1%}]"
    else:
        text = f"{c.change:+.3f}"
        if c.change_low is not None and c.change_high is not None:
            text += f" [{c.change_low:+.3f}, {c.change_high:+.3f}]"
    return text


def _tolerance(c: GateCheck) -> str:
    if c.tolerance is None:
        return "-"
    return f"-{c.tolerance:.0%}" if c.tolerance_kind == "relative" else f"-{c.tolerance:g}"


def headline(rec: GateRecord) -> str:
    """One line: the outcome, the exit code, how many checks of each outcome."""
    counts = {}
    for c in rec.checks:
        counts[c.outcome] = counts.get(c.outcome, 0) + 1
    tally = ", ".join(f"{n} {o}" for o, n in counts.items())
    return (f"gate: {MARK[rec.outcome]} (exit {rec.exit_code}) — {rec.candidate_run_id} against "
            f"{', '.join(rec.reference_runs) or rec.reference}" + (f"; {tally}" if tally else ""))


def text(rec: GateRecord) -> str:
    """The terminal's view."""
    lines = [headline(rec)]
    lines += [f"  not comparable: {w}" for w in rec.not_comparable]
    lines += [f"  allowed difference: {w}" for w in rec.allowed_differences]
    lines += [f"  changed: {w}" for w in rec.changed]
    lines += [f"  note: {w}" for w in rec.notes]
    if rec.checks:
        width = max(len(f"{c.arm} {c.figure}") for c in rec.checks)
        for c in rec.checks:
            lines.append(f"  {f'{c.arm} {c.figure}':<{width}}  {_num(c.reference):>8} -> {_num(c.candidate):<8} "
                         f"{_change(c):<26} tol {_tolerance(c):<6} {MARK[c.outcome]}: {c.reason}")
    return "\n".join(lines)


def markdown(rec: GateRecord) -> str:
    """A summary for a CI job (GitHub's $GITHUB_STEP_SUMMARY, GitLab's reports)."""
    icon = {"pass": "✅", "improvement": "🚀", "regression": "❌", "inconclusive": "⚠️", "not comparable": "⛔",
            "not gated": "·"}
    out = [f"## spectrial gate: {icon[rec.outcome]} {MARK[rec.outcome]}", "",
           f"Candidate `{rec.candidate_run_id}` against {', '.join(f'`{r}`' for r in rec.reference_runs) or rec.reference}"
           f" (confidence {rec.confidence:.0%}, exit code {rec.exit_code}).", ""]
    for title, items in (("Not comparable", rec.not_comparable), ("Allowed differences", rec.allowed_differences),
                         ("Changed settings", rec.changed), ("Notes", rec.notes)):
        if items:
            out += [f"**{title}**", ""] + [f"- {w}" for w in items] + [""]
    if rec.checks:
        out += ["| arm | figure | unit | reference | candidate | change [interval] | tolerance | outcome |",
                "|---|---|---|---:|---:|---|---:|---|"]
        for c in rec.checks:
            out.append(f"| {c.arm} | {c.figure} | {c.unit} | {_num(c.reference)} | {_num(c.candidate)} | "
                       f"{_change(c)} | {_tolerance(c)} | {icon[c.outcome]} {c.outcome} |")
        out.append("")
        reasons = [c for c in rec.checks if c.outcome in ("regression", "inconclusive", "not comparable")]
        out += [f"- **{c.arm} {c.figure}** {c.outcome}: {c.reason}" for c in reasons]
    return "\n".join(out).rstrip() + "\n"


def junit(rec: GateRecord) -> str:
    """JUnit XML: a test suite of one test case per check (the comparability check first)."""
    suites = ET.Element("testsuites", name="spectrial gate")
    suite = ET.SubElement(suites, "testsuite", name=f"spectrial gate {rec.candidate_run_id}",
                          timestamp=rec.created_at or "")
    props = ET.SubElement(suite, "properties")
    for name, value in (("candidate", rec.candidate), ("reference", rec.reference),
                        ("reference_runs", " ".join(rec.reference_runs)), ("outcome", rec.outcome),
                        ("exit_code", str(rec.exit_code)), ("confidence", str(rec.confidence))):
        ET.SubElement(props, "property", name=name, value=value)
    cases = [("comparability", "runs", "not comparable" if not rec.comparable else "pass",
              "; ".join(rec.not_comparable) or "comparable" +
              (f" (allowed: {'; '.join(rec.allowed_differences)})" if rec.allowed_differences else ""))]
    cases += [(c.figure, c.arm, c.outcome, _detail(c)) for c in rec.checks]
    failures = errors = skipped = 0
    for name, cls, outcome, detail in cases:
        case = ET.SubElement(suite, "testcase", name=name, classname=f"spectrial.gate.{cls}", time="0")
        if outcome == "regression":
            failures += 1
            ET.SubElement(case, "failure", message=detail[:500], type="regression").text = detail
        elif outcome == "not comparable":
            errors += 1
            ET.SubElement(case, "error", message=detail[:500], type="not comparable").text = detail
        elif outcome in ("inconclusive", "not gated"):
            skipped += 1
            ET.SubElement(case, "skipped", message=f"{outcome}: {detail}"[:500])
        else:
            ET.SubElement(case, "system-out").text = detail
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _detail(c: GateCheck) -> str:
    return (f"{c.arm} {c.figure} ({c.unit}): reference {_num(c.reference)}, candidate {_num(c.candidate)}, change "
            f"{_change(c)}, tolerance {_tolerance(c)}; noise {_num(c.noise, 3)} ({c.noise_basis or 'none'}): "
            f"{c.outcome}: {c.reason}")


def write(path: str | Path, content: str) -> Path:
    """Write a gate output (its folder made)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(content)
    return p
