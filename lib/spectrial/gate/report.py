"""A gate's record for people and CI systems: plain text (the terminal), Markdown (a CI job summary), JUnit XML
(one test case per arm and figure: a regression is a failure, not comparable an error, inconclusive skipped), and
CI's own views: GitHub Actions annotations (workflow commands), a GitLab code-quality report and a GitLab metrics
report."""

from __future__ import annotations

import hashlib
import json
import re
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


# ---------------------------------------------------------------- CI systems' own views
# what each outcome is in GitHub's annotation levels and GitLab's code-quality severities (a pass is neither)
GITHUB_LEVEL = {"regression": "error", "not comparable": "error", "inconclusive": "warning", "improvement": "notice"}
GITLAB_SEVERITY = {"regression": "critical", "not comparable": "major", "inconclusive": "minor", "improvement": "info"}


def annotated_file(rec: GateRecord) -> str:
    """The file CI annotations point at: the reference's manifest where the reference is a record (a committed
    golden one lies in the repository), else the candidate's; relative to the working folder when inside it."""
    for where in (rec.reference, rec.candidate):
        p = Path(where)
        if p.is_dir():
            p = p / "manifest.json"
        if p.is_file():
            try:
                return p.resolve().relative_to(Path.cwd().resolve()).as_posix()
            except ValueError:
                return p.as_posix()
    return rec.candidate


def _gh_data(text: str) -> str:
    """A workflow command's message, escaped as GitHub's toolkit does (`%`, CR, LF)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_property(text: str) -> str:
    """A workflow command's property (file, title), escaped as GitHub's toolkit does (also `:` and `,`)."""
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


def _findings(rec: GateRecord) -> list[tuple[str, str, str]]:
    """What CI should show: (outcome, title, detail) for each reason the runs are not comparable and each check
    that is not a pass (nor not gated)."""
    out = [("not comparable", "runs not comparable", w) for w in rec.not_comparable]
    out += [(c.outcome, f"{c.arm} {c.figure}: {c.outcome}", _detail(c)) for c in rec.checks
            if c.outcome in GITHUB_LEVEL]
    return out


def github(rec: GateRecord) -> str:
    """GitHub Actions workflow commands (print them in a step: GitHub turns each into an annotation on the run and,
    where the file is in the pull request, on the file): the outcome first, then one per finding. GitHub shows at
    most 10 errors and 10 warnings per step; the Markdown summary and JUnit hold the rest."""
    file = _gh_property(annotated_file(rec))
    level = GITHUB_LEVEL.get(rec.outcome, "notice")
    lines = [f"::{level} file={file},title={_gh_property('spectrial gate: ' + MARK[rec.outcome])}::"
             f"{_gh_data(headline(rec))}"]
    lines += [f"::{GITHUB_LEVEL[o]} file={file},title={_gh_property(title)}::{_gh_data(detail)}"
              for o, title, detail in _findings(rec)]
    return "\n".join(lines) + "\n"


def gitlab_codequality(rec: GateRecord) -> str:
    """A GitLab code-quality report (`artifacts: reports: codequality:`; the Code Climate issue subset GitLab reads):
    one issue per finding, with a fingerprint stable across runs of the same arm, figure and outcome (so a merge
    request shows a new regression as new, and a fixed one as resolved)."""
    path = annotated_file(rec)
    issues = []
    for outcome, title, detail in _findings(rec):
        key = f"spectrial-gate|{path}|{title}"
        issues.append({
            "type": "issue", "check_name": f"spectrial-gate/{outcome.replace(' ', '-')}",
            "description": f"{title} — {detail}", "categories": ["Performance"],
            "fingerprint": hashlib.md5(key.encode()).hexdigest(),  # noqa: S324 (an id, not a secret)
            "severity": GITLAB_SEVERITY[outcome], "location": {"path": path, "lines": {"begin": 1}}})
    return json.dumps(issues, indent=2, ensure_ascii=False) + "\n"


_METRIC_LABEL = re.compile(r'["\\\n]')


def _label(value: str) -> str:
    return _METRIC_LABEL.sub(lambda m: {'"': '\\"', "\\": "\\\\", "\n": "\\n"}[m.group()], value)


def gitlab_metrics(rec: GateRecord) -> str:
    """A GitLab metrics report (`artifacts: reports: metrics:`, OpenMetrics text): the gate's exit code and, per
    arm and figure, the candidate's value, the reference's and the change (relative for relative tolerances);
    GitLab shows each beside the target branch's."""
    lines = ["# TYPE spectrial_gate_exit_code gauge", f"spectrial_gate_exit_code {rec.exit_code}"]
    series = (("candidate", lambda c: c.candidate), ("reference", lambda c: c.reference),
              ("change", lambda c: c.change))
    for name, value in series:
        lines.append(f"# TYPE spectrial_gate_{name} gauge")
        for c in rec.checks:
            v = value(c)
            if v is not None:
                labels = f'arm="{_label(c.arm)}",figure="{_label(c.figure)}",unit="{_label(c.unit)}"'
                lines.append(f"spectrial_gate_{name}{{{labels}}} {float(v)!r}")
    return "\n".join(lines) + "\n# EOF\n"


def write(path: str | Path, content: str) -> Path:
    """Write a gate output (its folder made)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(content)
    return p
