"""Issue 40 for real on llama-server: a sweep of the tiny pair (draft-simple, its own acceptance) over draft depth
and concurrency, read by the crossover, the deploy answer and the calibration export; the deployed setting run again
as a trial (`--verify-params`) and checked against its prediction (`--check`). The committed example record of the
same sweep at full size: outputs/examples/llamacpp-load-crossover/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spectrial.readers.calibration import calibration
from spectrial.readers.crossover import crossovers
from spectrial.readers.deploy import deployment
from spectrial.readers.sweep import verdict
from spectrial.record.store import load_record
from spectrial.sweep.params import load_sweep_params
from spectrial.sweep.run import run_sweep

REPO = Path(__file__).resolve().parents[2]
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]


@pytest.mark.slow
def test_a_real_load_sweep_its_crossover_deploy_answer_and_verification(tiny_params, tmp_path):
    data = yaml.safe_load((REPO / "params" / "examples" / "llamacpp-load-crossover.yaml").read_text())
    data.update({k: tiny_params[k] for k in ("engine_bin", "port", "output_dir", "state_dir", "work_dir")},
                repeats=8, max_tokens=32, grid={"steps": [2], "concurrency": [1, 4]})
    result = run_sweep(load_sweep_params(data=data), progress=False)
    m = load_record(result.run_dir)
    (c,) = crossovers(m)
    points = {p.concurrency: p for p in m.points if p.method != "none"}
    assert [lv.concurrency for lv in c.levels] == [1, 4]
    for lv in c.levels:  # each level's figures are its point's own comparison
        p = points[lv.concurrency]
        assert (lv.speedup, lv.ci, lv.verdict) == (p.speedup, (p.speedup_ci_low, p.speedup_ci_high), p.verdict)
        assert lv.output_tok_s == p.serving.output_tok_s and lv.tok_s == p.tok_s
    pays = [lv.pays for lv in c.levels]
    assert c.stops_at == (4 if pays == [True, False] else None)
    assert c.text() + "." in verdict(m)  # the sweep's verdict paragraph says it
    # the deploy answer for llama.cpp: the one setting that pays, with the measured speed-ups it rests on
    dep = deployment(m)
    assert [lv.concurrency for lv in dep.levels] == [1, 4]
    if any(pays):
        assert dep.args == ["--spec-type", "draft-simple", "--spec-draft-n-max", "2"]
    cal = calibration(m)
    assert len(cal.points) == 2 and {p.concurrency for p in cal.points} == {1, 4}
    assert all(p.cycle_ms == points[p.concurrency].cycle_ms and p.accept_len == points[p.concurrency].accept_len
               for p in cal.points)
    out = subprocess.run([*SPECTRIAL, "calibration", str(result.run_dir), "--out", str(tmp_path / "c.csv")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and (tmp_path / "c.csv").read_text().count("\n") == 3, out.stderr
    if not any(pays):
        return
    # --verify-params writes the trial of the deployed setting; it runs for real; --check reads it back
    vp = tmp_path / "verify.yaml"
    res = subprocess.run([*SPECTRIAL, "deploy", str(result.run_dir), "--verify-params", str(vp), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout[:res.stdout.rindex("}") + 1])["args"] == dep.args
    trial = subprocess.run([*SPECTRIAL, "trial", str(vp), "-p", f"output_dir={tmp_path / 'verify'}", "--quiet"],
                           capture_output=True, text=True, timeout=600)
    assert trial.returncode == 0, trial.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "verify").iterdir() if (p / "manifest.json").is_file()]
    check = subprocess.run([*SPECTRIAL, "deploy", str(result.run_dir), "--check", str(run)],
                           capture_output=True, text=True, timeout=120)
    line = check.stdout.strip().splitlines()[-1]
    first = next(lv.concurrency for lv in c.levels if lv.pays)  # the trial re-measures the lowest paying level
    assert line.startswith(f"deploy-s2 at concurrency {first}: predicted ") and line.endswith(("held", "did not hold"))
    assert check.returncode == (0 if line.endswith(": held") else 1)


def test_the_committed_example_reads_as_recorded():
    """outputs/examples/llamacpp-load-crossover (params/examples/llamacpp-load-crossover.yaml, this VM, 2 cores,
    threads 1): depth 4 pays at concurrency 4 and stops paying at 16; depth 2 pays nowhere; llama.cpp takes one
    setting, depth 4."""
    (run,) = [p.parent for p in (REPO / "outputs" / "examples" / "llamacpp-load-crossover").glob("*/manifest.json")]
    m = load_record(run, settle=False)
    got = {c.setting: c for c in crossovers(m)}
    assert got["s4"].text() == ("s4 (real acceptance): pays at concurrency 4 of concurrency 1-32; stops paying at 16 "
                                "(0.92x [0.83, 0.95]); slower from concurrency 16")
    assert got["s2"].text().startswith("s2 (real acceptance): does not pay at any measured level")
    assert all(c.text() + "." in verdict(m) for c in got.values())
    dep = deployment(m)
    assert [lv.steps for lv in dep.levels] == [None, 4, None, None]
    assert dep.args == ["--spec-type", "draft-simple", "--spec-draft-n-max", "4"]
    cal = calibration(m)
    assert len(cal.points) == 8 and {p.concurrency for p in cal.points} == {1, 4, 16, 32}


def test_the_committed_vllm_policy_example_holds_its_truth():
    """outputs/examples/vllm-cpu-load-policy (params/examples/vllm-cpu-load-policy.yaml, real vLLM 0.32.0 CPU build,
    this VM): the counting EAGLE-3 accepts 4/3 per cycle at any depth; the static depths draft exactly 1 and 3
    tokens per cycle at every level; vLLM's per-batch-size policy drafts 3 at concurrency 1 and ~1 above (a
    batch of one at a window's ramp drafts 3); no per-request rate is a stalled stream's delivery burst."""
    (run,) = [p.parent for p in (REPO / "outputs" / "examples" / "vllm-cpu-load-policy").glob("*/manifest.json")]
    m = load_record(run, settle=False)
    per_cycle = {(p.setting, p.concurrency): p.drafted / p.verify_steps for p in m.points if p.verify_steps}
    for c in (1, 2, 4):
        assert per_cycle[("eagle3-s1", c)] == 1.0 and per_cycle[("eagle3-s3", c)] == 3.0
    assert per_cycle[("per-batch", 1)] == 3.0
    assert all(1.0 <= per_cycle[("per-batch", c)] < 1.25 for c in (2, 4)), per_cycle
    for p in m.points:
        if p.method != "none":
            assert abs(p.accept_len - 4 / 3) < 0.05 and p.per_position[1:] == [0.0] * (len(p.per_position) - 1)
    pol = [p for p in m.points if p.policy is not None]
    assert len(pol) == 3 and all(p.vs_best_static.best_static == "eagle3-s1" for p in pol)
    assert all(b.best != "per-batch" for b in m.best)
    import pandas as pd

    reqs = pd.read_csv(run / "requests.csv")
    reqs = reqs[reqs["phase"] == "measure"]
    assert reqs["client_tok_s"].max() > 10_000  # stalled streams were there (vLLM's CPU build)...
    assert reqs["tok_s"].max() < 400  # ...and none of them is a decode rate
