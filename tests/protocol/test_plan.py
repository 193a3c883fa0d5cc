"""The price before the purchase (issue 36): the plan of a fixed, decide and cluster run (server starts, time and its
basis), a decide budget that cannot decide refused with the smallest that can, and a dry run that shows exactly what
runs (spectrial's own environment, the env probe) without Python warnings. The plan with a history is checked against
real llama.cpp records in tests/protocol/test_decide.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from spectrial.engines.base import engine_class
from spectrial.errors import ConfigError
from spectrial.params import load_params
from spectrial.protocol.plan import ASSUMED_TINY_TOK_S, dry_run, make_plan

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "params" / "local.yaml"
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]


def _params(tmp_path: Path, **over):
    return load_params(LOCAL, {"output_dir": str(tmp_path / "none-here"), **over})


def test_a_fixed_plan_counts_every_start_and_states_its_basis(tmp_path):
    p = _params(tmp_path, restarts=3)
    plan = make_plan(p, launches=False).record
    assert plan.design == "fixed" and plan.starts == 3 * len(p.arms)
    per_start = engine_class("llamacpp").start_s + 10e6 / 1e9 + (p.warmup + p.repeats) * p.max_tokens / ASSUMED_TINY_TOK_S
    assert math.isclose(plan.start_s, per_start, rel_tol=1e-6), plan.start_basis
    assert math.isclose(plan.wall_s[1], plan.starts * per_start, rel_tol=1e-6)
    assert "estimated" in plan.start_basis and "llamacpp" in plan.start_basis
    given = make_plan(_params(tmp_path, expected_start_s=540), launches=False).record
    assert "as given (expected_start_s)" in given.start_basis and given.start_s > 540


def test_a_decide_plan_states_first_expected_and_most_starts(tmp_path):
    p = _params(tmp_path, decide={"max_rounds": 12, "max_minutes": None})
    r = make_plan(p, launches=False).record
    arms = len(p.arms)
    assert r.design == "decide" and r.starts_per_round == arms
    assert r.first_decision_round == 3 and r.first_decision_starts == 3 * arms  # no history here
    assert r.max_rounds == 12 and r.max_starts == 12 * arms
    effects = [e.effect for e in r.expected]
    assert 0.74 in effects and 1.05 in effects
    for e in r.expected:  # starts are whole rounds, at least the first decision, at most the budget
        assert r.first_decision_starts <= e.median <= e.p90 <= r.max_starts
        assert e.median % arms == 0
    big = next(e for e in r.expected if e.effect == 0.74)
    small = next(e for e in r.expected if e.effect == 1.05)
    assert big.median < small.median  # a large effect decides sooner
    assert r.spread == 0.05 and "assumed" in r.spread_basis
    assert r.wall_s[0] <= r.wall_s[1] <= r.wall_s[2]


def test_a_budget_that_cannot_decide_is_refused_with_the_smallest_that_can(tmp_path):
    over = {"decide": {"max_minutes": 30}, "expected_start_s": 540, "arms": [{"name": "baseline"},
                                                                           {"name": "draft", "method": "draft"}]}
    with pytest.raises(ConfigError) as err:
        make_plan(_params(tmp_path, **over), launches=False)
    assert err.value.parameter == "decide.max_minutes"
    text = str(err.value)
    assert "first decision is possible at round 3" in text
    need = int(text.split("-p decide.max_minutes=")[1].split()[0])
    ok = make_plan(_params(tmp_path, **{**over, "decide": {"max_minutes": need}}), launches=False).record
    assert ok.max_rounds >= ok.first_decision_round == 3
    with pytest.raises(ConfigError) as err:
        make_plan(_params(tmp_path, **{**over, "decide": {"max_minutes": need - 1}}), launches=False)
    with pytest.raises(ConfigError) as err:
        make_plan(_params(tmp_path, decide={"max_rounds": 2}), launches=False)
    assert err.value.parameter == "decide.max_rounds" and "decide.max_rounds=3" in str(err.value)


def test_the_dry_run_shows_the_environment_spectrial_adds(tmp_path):
    data = {"engine": "vllm", "model": str(tmp_path), "env": {"NCCL_PROTO": "LL"}, "output_dir": str(tmp_path / "o"),
            "arms": [{"name": "baseline"}]}
    launch = dry_run(load_params(data=data))[0]
    added = launch.added_env
    assert added["SPECTRIAL_TAG"] == "<run-id>:<arm>" and "SPECTRIAL_OWNER" in added
    assert added["SPECTRIAL_ENV_PROBE_NAMES"] == "NCCL_PROTO"
    assert added["PYTHONPATH"].startswith(added["SPECTRIAL_ENV_PROBE"]) and ".envprobe" in added["PYTHONPATH"]
    assert "SPECTRIAL_ENV_PROBE=" in launch.display
    plain = dry_run(load_params(LOCAL))[0].added_env  # llama.cpp: no Python to probe
    assert "SPECTRIAL_ENV_PROBE" not in plain and "SPECTRIAL_TAG" in plain


def test_the_dry_run_cli_prints_the_plan_and_no_python_warning(tmp_path):
    res = subprocess.run([*SPECTRIAL, "trial", "params/h200-sglang-counting.yaml", "--dry-run",
                          "-p", f"output_dir={tmp_path}"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert "Warning" not in res.stderr and ".py:" not in res.stderr, res.stderr
    assert "# note: engine_config.sglang_version unset" in res.stdout  # the engine's warning, as a note
    assert res.stdout.startswith("plan: ")
    res = subprocess.run([*SPECTRIAL, "trial", str(LOCAL), "--dry-run", "--json", "-p", "decide=true",
                          "-p", "decide.max_rounds=9", "-p", f"output_dir={tmp_path}"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["record"]["max_rounds"] == 9 and [a["arm"] for a in plan["launches"]] == [
        "baseline", "draft-simple", "eagle3-synthetic"]
    assert not list(tmp_path.iterdir())  # touched nothing


def test_a_cluster_dry_run_shows_its_units_and_sbatch_scripts(tmp_path):
    res = subprocess.run([*SPECTRIAL, "trial", "params/cluster-slurm.yaml", "--dry-run",
                          "-p", f"output_dir={tmp_path}"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    p = load_params(REPO / "params/cluster-slurm.yaml")
    spec = [a.name for a in p.arms if a.speculative]
    for i, name in enumerate(spec):
        assert f"u{i}: baseline + {name}" in res.stdout
        assert f"# sbatch script of unit u{i}\nsbatch --time " in res.stdout
        assert f"exec {sys.executable} -m spectrial.cli trial " in res.stdout or "-m spectrial.cli trial" in res.stdout
    assert res.stdout.count("#!/bin/bash") == len(spec)
    assert not list(tmp_path.iterdir())


def test_the_plan_says_once_which_check_every_start_would_fail(tmp_path):
    notes = make_plan(_params(tmp_path, repeats=3), launches=False).record.notes
    hits = [n for n in notes if "steady_state" in n]
    assert len(hits) == 1 and "raise repeats to at least 5" in hits[0]
    assert not [n for n in make_plan(_params(tmp_path), launches=False).record.notes if "will fail" in n]


def test_a_sweep_dry_run_states_its_grid_and_budget(tmp_path):
    res = subprocess.run([*SPECTRIAL, "sweep", "params/sweep-local.yaml", "--dry-run", "-p", f"output_dir={tmp_path}",
                          "-p", "budget_restarts=4"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    from spectrial.sweep.params import load_sweep_params

    sw = load_sweep_params(REPO / "params/sweep-local.yaml")
    grid = (1 + len(sw.settings())) * sw.trial_params().restarts
    assert f"the grid is {grid} start(s); the budget allows 4" in res.stdout
    assert res.stdout.startswith("plan: sweep (") and "at most 4 server start(s)" in res.stdout
    assert "# arm baseline on local" in res.stdout and not list(tmp_path.iterdir())
