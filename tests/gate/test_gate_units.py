"""The gate's judgement as pure functions (spectrial.gate.judge) with known answers, and the gate on the committed
reference record (tests/golden/gate/manifest.json: a real llama.cpp trial) against itself and edited copies."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spectrial.errors import ConfigError
from spectrial.gate import GateTolerances, load_tolerances, run_gate
from spectrial.gate.judge import Figure, _accepted_variance, arm_figures, judge
from spectrial.gate.params import FigureTolerance
from spectrial.record.store import as_manifest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "gate" / "manifest.json"
CI_GATE = REPO / "params" / "gate" / "ci-gate.yaml"
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]
REL5 = FigureTolerance(tolerance=0.05)


def test_a_drop_beyond_the_tolerance_with_little_noise_is_a_regression() -> None:
    c = judge("a", "accept_len", REL5, Figure(2.7, 0.01), [Figure(3.0, 0.01)], 0.95)
    assert c.outcome == "regression"
    assert c.change == pytest.approx(-0.1)
    z = 1.959963984540054
    noise = math.sqrt((0.01 / 3.0) ** 2 + (0.01 / 3.0) ** 2)
    assert c.noise == pytest.approx(noise)
    assert c.change_high == pytest.approx(-0.1 + z * noise)


@pytest.mark.parametrize(("cand", "se", "outcome"), [
    (2.985, 0.01, "pass"),          # -0.5 %, tight: within 5 %
    (2.88, 0.06, "inconclusive"),   # -4 % +/- 2 % x 1.96: straddles -5 %
    (3.75, 0.01, "improvement"),    # +25 %
    (2.70, 0.20, "inconclusive"),   # -10 % but the noise is as large: cannot tell
])
def test_outcomes_follow_the_interval_and_the_tolerance(cand: float, se: float, outcome: str) -> None:
    assert judge("a", "accept_len", REL5, Figure(cand, se), [Figure(3.0, 0.0)], 0.95).outcome == outcome


def test_a_latency_is_better_lower() -> None:
    tol = FigureTolerance(tolerance=0.25)
    worse = judge("a", "ttft_ms", tol, Figure(150.0, 1.0), [Figure(100.0, 1.0)], 0.95)
    assert worse.better == "lower" and worse.change == pytest.approx(-0.5) and worse.outcome == "regression"
    better = judge("a", "ttft_ms", tol, Figure(50.0, 1.0), [Figure(100.0, 1.0)], 0.95)
    assert better.change == pytest.approx(0.5) and better.outcome == "improvement"


def test_the_floor_and_a_historys_spread_widen_the_noise() -> None:
    floor = FigureTolerance(tolerance=0.05, noise_floor=0.04)
    c = judge("a", "tok_s", floor, Figure(96.0, 0.0), [Figure(100.0, 0.0)], 0.95)
    assert c.noise == pytest.approx(0.04) and c.outcome == "inconclusive"
    # a history of three runs 90, 100, 110: spread 10 % of the median; the reference's error 10 % / sqrt(3)
    hist = [Figure(90.0), Figure(100.0), Figure(110.0)]
    h = judge("a", "tok_s", FigureTolerance(tolerance=0.05), Figure(99.0, 0.001), hist, 0.95)
    assert h.reference == 100.0
    assert h.noise == pytest.approx(math.sqrt(0.1 ** 2 + (0.1 / math.sqrt(3)) ** 2))
    assert h.outcome == "inconclusive"  # one run of a host that moves 10 % between runs cannot be held to 5 %
    assert "history of 3 runs" in h.noise_basis


def test_absolute_tolerance_for_per_position_acceptance() -> None:
    tol = FigureTolerance(tolerance=0.05, kind="absolute")
    c = judge("a", "per_position[2]", tol, Figure(0.50, 0.005), [Figure(0.60, 0.005)], 0.95)
    assert c.change == pytest.approx(-0.10) and c.outcome == "regression" and c.unit == "acceptance probability"


def test_missing_figures() -> None:
    assert judge("a", "tok_s", REL5, None, [Figure(1.0)], 0.95).outcome == "inconclusive"
    assert judge("a", "tok_s", REL5, Figure(1.0), [], 0.95).outcome == "not gated"
    off = FigureTolerance(tolerance=0.05, gate=False)
    assert judge("a", "tok_s", off, Figure(0.5), [Figure(1.0)], 0.95).outcome == "not gated"
    # a figure reported only cannot make the gate inconclusive by its absence (CI: a coarse vLLM stream, ITL withheld)
    c = judge("a", "itl_ms", off, None, [Figure(2.0)], 0.95)
    assert c.outcome == "not gated" and "not measured" in c.reason and "gate: false" in c.reason


@pytest.mark.parametrize(("per_position", "variance"), [
    ([1.0, 1.0], 0.0),                        # always 2 accepted
    ([0.5], 0.25),                            # Bernoulli(0.5)
    ([0.8, 0.64], 0.8 + 3 * 0.64 - 1.44 ** 2),  # X in {0, 1, 2}: P(X>=1) .8, P(X>=2) .64
])
def test_variance_of_accepted_tokens_per_step(per_position: list[float], variance: float) -> None:
    assert _accepted_variance(per_position) == pytest.approx(variance)


def test_bad_tolerances_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "gate.yaml"
    bad.write_text("figures:\n  accept_length: {tolerance: 0.05}\n")
    with pytest.raises(ConfigError, match="accept_length"):
        load_tolerances(bad)
    with pytest.raises(ConfigError, match="is not a file"):
        load_tolerances(tmp_path / "missing.yaml")
    neg = tmp_path / "neg.yaml"
    neg.write_text("figures:\n  tok_s: {tolerance: -1}\n")
    with pytest.raises(ConfigError, match="tolerance"):
        load_tolerances(neg)


def test_the_golden_reference_against_itself_passes() -> None:
    rec = run_gate(GOLDEN, load_tolerances(CI_GATE), reference=GOLDEN)
    assert rec.comparable and rec.outcome == "pass" and rec.exit_code == 0
    gated = [c for c in rec.checks if c.outcome != "not gated"]
    assert gated and all(c.change == 0 for c in gated)
    assert {c.figure for c in gated} >= {"accept_len", "per_position[1]", "per_position[2]"}


def test_an_invalid_measurement_passes_no_gate(tmp_path: Path) -> None:
    """Issue 39: the gate shows the candidate's failed validity checks from the one place (the arm's validity) and an
    invalid measurement (here a dead drafter: speculation_live failed) is never a pass, even with equal figures."""
    data = json.loads(GOLDEN.read_text())
    arm = next(a for a in data["arms"] if a["name"] == "draft-simple")
    check = {"name": "speculation_live", "ok": False, "severity": "invalid", "value": 1.0097, "limit": 1.02,
             "summary": "dead drafter: accept length 1.010 within 0.02 of 1.0 while drafting"}
    arm["validity"] = {"checks": [*arm["validity"]["checks"], check], "failed": ["speculation_live"], "warnings": []}
    cand = tmp_path / "manifest.json"
    cand.write_text(json.dumps(data))
    rec = run_gate(cand, load_tolerances(CI_GATE), reference=GOLDEN)
    assert rec.outcome == "inconclusive" and rec.exit_code != 0
    assert "candidate arm draft-simple: speculation_live check failed (invalid): dead drafter: accept length 1.010 " \
           "within 0.02 of 1.0 while drafting" in rec.notes
    assert "outcome inconclusive: the candidate's measurement of draft-simple is invalid" in rec.notes


def test_golden_figures_have_noise_where_acceptance_is_random() -> None:
    m = as_manifest(json.loads(GOLDEN.read_text()))
    synthetic = arm_figures(m, m.arm("eagle3-synthetic"))
    greedy = arm_figures(m, m.arm("draft-simple"))
    assert synthetic["accept_len"].se and synthetic["accept_len"].se > 0  # llama.cpp draws synthetic acceptance
    assert greedy["accept_len"].se is None and "greedy" in greedy["accept_len"].basis
    assert "speedup" not in arm_figures(m, m.arm("baseline"))  # 1 by definition


def _edited(tmp_path: Path, edit) -> Path:  # noqa: ANN001
    data = json.loads(GOLDEN.read_text())
    edit(data)
    data["run_id"] = "edited"
    path = tmp_path / "edited" / "manifest.json"
    path.parent.mkdir()
    path.write_text(json.dumps(data))
    return path


def test_a_latency_withheld_for_a_coarse_stream_says_so(tmp_path: Path) -> None:
    def coarse(data: dict) -> None:
        for arm in data["arms"]:
            sv = arm.get("serving")
            if sv:
                sv.update(granularity="coarse", chunks_per_request=3.0, itl_ms=None, itl_chunk_ms=None)
            arm["itl_ms"] = None
    rec = run_gate(_edited(tmp_path, coarse), load_tolerances(CI_GATE), reference=GOLDEN)
    itl = [c for c in rec.checks if c.figure == "itl_ms"]
    assert itl and all("too coarse" in c.reason and "3 chunks per request" in c.reason for c in itl), itl


def test_another_engine_version_is_not_comparable_unless_allowed(tmp_path: Path) -> None:
    path = _edited(tmp_path, lambda d: d["engine"].update(version="version: 9999 (abc)"))
    rec = run_gate(path, GateTolerances(), reference=GOLDEN)
    assert rec.outcome == "not comparable" and rec.exit_code == 2 and not rec.checks
    assert any("engine_version" in w and "9999" in w for w in rec.not_comparable)
    rec = run_gate(path, GateTolerances(allow=["engine_version"]), reference=GOLDEN)
    assert rec.comparable and rec.allowed_differences


def test_an_uncontrolled_candidate_gates_acceptance_only(tmp_path: Path) -> None:
    path = _edited(tmp_path, lambda d: d.update(controlled=False, kind="observe"))
    rec = run_gate(path, GateTolerances(), reference=GOLDEN)
    thr = [c for c in rec.checks if c.figure in ("tok_s", "speedup", "ttft_ms", "itl_ms")]
    assert thr and all(c.outcome == "not gated" and "uncontrolled" in c.reason for c in thr)
    assert [c for c in rec.checks if c.figure == "accept_len" and c.outcome == "pass"]
    assert any("uncontrolled" in n for n in rec.notes)


def test_exit_codes_are_configurable_and_bad_input_exits_2(tmp_path: Path) -> None:
    gate = tmp_path / "gate.yaml"
    gate.write_text("allow: [hardware]\nexit_codes: {not comparable: 0}\n")
    path = _edited(tmp_path, lambda d: d["params"].update(max_tokens=7))
    out = subprocess.run([*SPECTRIAL, "gate", str(path), "-r", str(GOLDEN), "-t", str(gate)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "NOT COMPARABLE" in out.stdout and "max_tokens 64 -> 7" in out.stdout
    out = subprocess.run([*SPECTRIAL, "gate", str(tmp_path / "nope"), "-r", str(GOLDEN)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "CANDIDATE" in out.stderr and "does not exist" in out.stderr
    out = subprocess.run([*SPECTRIAL, "gate", str(GOLDEN)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--reference" in out.stderr and "--history" in out.stderr


# ---------------------------------------------------------------- CI systems' own views (issue 42, item 4)
GH_COMMAND = re.compile(r"^::(?P<level>error|warning|notice)(?: (?P<props>[^:]*))?::(?P<message>.*)$")


def parse_workflow_commands(out: str) -> list[dict[str, str]]:
    """Workflow commands as the GitHub runner reads them from a step's output: `::level k=v,k=v::message`, the
    properties and the message unescaped (%25 %0D %0A, and %3A %2C in properties)."""

    def unescape(s: str) -> str:
        return s.replace("%0D", "\r").replace("%0A", "\n").replace("%3A", ":").replace("%2C", ",").replace("%25", "%")

    found = []
    for line in out.splitlines():
        if not line.startswith("::"):
            continue
        m = GH_COMMAND.match(line)
        assert m, f"not a workflow command GitHub reads: {line!r}"
        props = dict(p.split("=", 1) for p in (m.group("props") or "").split(",") if p)
        found.append({"level": m.group("level"), **{k: unescape(v) for k, v in props.items()},
                      "message": unescape(m.group("message"))})
    return found


def _dropped(data: dict) -> None:  # draft-simple's accept length down by 40 %
    arm = next(a for a in data["arms"] if a["name"] == "draft-simple")
    arm["accept_len"] = arm["accept_len"] * 0.6


def test_github_annotations_parse_as_the_runner_reads_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    cand = _edited(tmp_path, _dropped)
    out = subprocess.run([*SPECTRIAL, "gate", str(cand), "-r", str(GOLDEN), "-t", str(CI_GATE), "--github",
                          "--json", str(tmp_path / "g.json")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    rec = json.loads((tmp_path / "g.json").read_text())
    cmds = parse_workflow_commands(out.stdout)
    head, *rest = cmds
    assert head["level"] == "error" and head["title"] == "spectrial gate: REGRESSION"
    assert head["message"].startswith("gate: REGRESSION (exit 1)")
    # the committed reference lies in the repository: the annotations point at it, relative to the checkout
    assert {c["file"] for c in cmds} == {"tests/golden/gate/manifest.json"}
    shown = {c["title"] for c in rest}
    want = {f"{c['arm']} {c['figure']}: {c['outcome']}" for c in rec["checks"]
            if c["outcome"] in ("regression", "inconclusive", "improvement")}
    assert shown == want and "draft-simple accept_len: regression" in shown
    accept = next(c for c in rest if c["title"] == "draft-simple accept_len: regression")
    assert accept["level"] == "error" and "reference" in accept["message"] and "change -40.0%" in accept["message"]
    # the same gate without --github prints no workflow command; with --json - it refuses (one stdout)
    plain = subprocess.run([*SPECTRIAL, "gate", str(cand), "-r", str(GOLDEN)], capture_output=True, text=True,
                           timeout=120)
    assert not [ln for ln in plain.stdout.splitlines() if ln.startswith("::")]
    both = subprocess.run([*SPECTRIAL, "gate", str(cand), "-r", str(GOLDEN), "--github", "--json", "-"],
                          capture_output=True, text=True, timeout=120)
    assert both.returncode == 2 and "--json" in both.stderr and "--github" in both.stderr


def test_github_escaping_keeps_a_message_on_one_line() -> None:
    from spectrial.gate.report import github

    path = GOLDEN
    rec = run_gate(path, GateTolerances(), reference=GOLDEN)
    rec = rec.model_copy(update={"not_comparable": ["max_tokens 64 -> 7, 100% off\nsecond line: a, b"],
                                 "outcome": "not comparable", "exit_code": 2})
    cmds = parse_workflow_commands(github(rec))
    assert len(github(rec).splitlines()) == len(cmds)
    nc = next(c for c in cmds if c["title"] == "runs not comparable")
    assert nc["message"] == "max_tokens 64 -> 7, 100% off\nsecond line: a, b" and nc["level"] == "error"


CODEQUALITY_SCHEMA = {  # what GitLab reads of a Code Climate issue (docs.gitlab.com: code quality report format)
    "type": "array",
    "items": {"type": "object", "required": ["description", "check_name", "fingerprint", "severity", "location"],
              "properties": {
                  "description": {"type": "string", "minLength": 1}, "check_name": {"type": "string"},
                  "fingerprint": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                  "severity": {"enum": ["info", "minor", "major", "critical", "blocker"]},
                  "location": {"type": "object", "required": ["path", "lines"],
                               "properties": {"path": {"type": "string"},
                                              "lines": {"type": "object", "required": ["begin"],
                                                        "properties": {"begin": {"type": "integer"}}}}}}}}


def test_gitlab_reports_parse_as_gitlab_reads_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jsonschema
    from prometheus_client.parser import text_string_to_metric_families

    monkeypatch.chdir(REPO)
    cand = _edited(tmp_path, _dropped)
    cq, metrics = tmp_path / "gl-code-quality.json", tmp_path / "metrics.txt"
    out = subprocess.run([*SPECTRIAL, "gate", str(cand), "-r", str(GOLDEN), "-t", str(CI_GATE),
                          "--gitlab-codequality", str(cq), "--gitlab-metrics", str(metrics),
                          "--json", str(tmp_path / "g.json")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    rec = json.loads((tmp_path / "g.json").read_text())
    issues = json.loads(cq.read_text())
    jsonschema.validate(issues, CODEQUALITY_SCHEMA)
    assert len({i["fingerprint"] for i in issues}) == len(issues)  # GitLab tells issues apart by it
    regression = [i for i in issues if i["severity"] == "critical"]
    assert [i["check_name"] for i in regression] == ["spectrial-gate/regression"] * len(regression)
    assert any(i["description"].startswith("draft-simple accept_len: regression") for i in regression)
    assert {i["location"]["path"] for i in issues} == {"tests/golden/gate/manifest.json"}
    # the same finding has the same fingerprint in the next run (a merge request shows it as existing, not new)
    again = tmp_path / "again.json"
    subprocess.run([*SPECTRIAL, "gate", str(cand), "-r", str(GOLDEN), "-t", str(CI_GATE),
                    "--gitlab-codequality", str(again)], capture_output=True, text=True, timeout=120)
    assert [i["fingerprint"] for i in json.loads(again.read_text())] == [i["fingerprint"] for i in issues]
    # metrics: OpenMetrics text, read by prometheus_client's parser; every checked value is there, labelled
    fams = {f.name: f for f in text_string_to_metric_families(metrics.read_text())}
    assert [s.value for s in fams["spectrial_gate_exit_code"].samples] == [1]
    cand_vals = {(s.labels["arm"], s.labels["figure"]): s.value for s in fams["spectrial_gate_candidate"].samples}
    want = {(c["arm"], c["figure"]): c["candidate"] for c in rec["checks"] if c["candidate"] is not None}
    assert cand_vals == pytest.approx(want)
    change = {(s.labels["arm"], s.labels["figure"]): s.value for s in fams["spectrial_gate_change"].samples}
    assert change[("draft-simple", "accept_len")] == pytest.approx(-0.4)
