"""Sweeps: parameters, the grid, the model, and grid/guided sweeps end to end on a real local llama-server."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from spectrial.analysis import expected_accept_len
from spectrial.errors import ConfigError
from spectrial.hosts.local import LocalHost
from spectrial.record.store import load_record, manifest_json
from spectrial.schema import Manifest
from spectrial.sweep import (
    SweepParams,
    World,
    fit_acceptance,
    fit_sweep_model,
    judge,
    load_sweep_params,
    probe_settings,
    replay,
    run_sweep,
    simulate,
    sweep_command,
)
from spectrial.sweep.model import MeasuredPoint, cv_errors

REPO = Path(__file__).resolve().parents[2]


def sweep_data(tiny: dict[str, Any], **grid: Any) -> dict[str, Any]:
    """A sweep over the tiny pair: the tiny trial's keys (without arms) plus the sweep keys."""
    data = {k: v for k, v in tiny.items() if k not in ("arms", "steps")}
    data.update(name="test-sweep", draft="tiny:eagle3", method="eagle3", repeats=2, max_tokens=16,
                grid={"steps": [1, 2, 4], "concurrency": [1, 2], "synthetic_accept": [0.8], **grid})
    return data


# --- parameters --------------------------------------------------------------------------------------------
def test_both_layouts_give_the_same_sweep(write_params):
    flat = {"name": "s", "model": "tiny:target", "draft": "tiny:eagle3", "repeats": 2,
            "grid": {"steps": [3, 1, 3], "concurrency": [1, 4]}, "strategy": "grid"}
    nested = {"trial": {"name": "s", "model": "tiny:target", "draft": "tiny:eagle3", "repeats": 2},
              "grid": {"steps": [1, 3], "concurrency": [1, 4]}, "strategy": "grid"}
    a = load_sweep_params(write_params(flat, "flat.yaml"), {"grid.steps": [1, 3], "engine_config.threads": 1})
    b = load_sweep_params(data=nested, overrides={"trial.engine_config.threads": 1})
    assert a.model_dump() == b.model_dump()
    assert a.grid.steps == [1, 3] and a.trial.engine_config == {"threads": 1}
    tp = a.trial_params()
    assert [x.name for x in tp.arms] == ["baseline", "eagle3-s1", "eagle3-s3"]
    assert tp.engine_config["parallel"] == 4  # one llama.cpp slot per concurrent stream
    assert [x.steps for x in tp.arms[1:]] == [1, 3] and all(x.method == "eagle3" for x in tp.arms[1:])


@pytest.mark.parametrize("data, words", [
    ({"model": "m", "arms": [{"name": "e", "method": "eagle3"}], "grid": {"steps": [1]}}, ["arms and grid"]),
    ({"model": "m", "arms": [{"name": "e", "method": "eagle3"}, {"name": "d", "method": "draft"}]},
     ["arms", "'draft', 'eagle3'"]),
    ({"model": "m", "stratgy": "grid"}, ["stratgy", "strategy", "repeats"]),
    ({"model": "m", "method": "none"}, ["method", "speculative"]),
    ({"model": "m", "grid": {"topk": [1, 4]}}, ["grid.topk", "chain"]),
    ({"model": "m", "engine": "sglang", "grid": {"synthetic_accept": [1.5]}}, ["synthetic_accept", "[0, 1]"]),
    ({"model": "m", "grid": {"steps": [0, 2]}}, ["grid.steps", ">= 1"]),
    ({"model": "m", "budget_restarts": 1}, ["budget_restarts"]),
    ({"trial": {"model": "m"}, "repeats": 2}, ["repeats", "trial"]),
])
def test_bad_parameters_name_the_parameter(data, words):
    with pytest.raises(ConfigError) as err:
        load_sweep_params(data=data)
    for w in words:
        assert w in str(err.value), str(err.value)


def test_a_trial_file_is_a_grid_of_its_arms():
    trial = REPO / "params" / "local.yaml"  # baseline, a real draft and a synthetic EAGLE-3 arm: two methods
    with pytest.raises(ConfigError, match="one method and draft"):
        load_sweep_params(trial)
    p = load_sweep_params(trial, {"arms": [{"name": "baseline"}, {"name": "a", "method": "eagle3", "steps": 3},
                                           {"name": "b", "method": "eagle3", "steps": 1, "synthetic_accept": 0.5}]})
    assert p.strategy == "grid" and p.method == "eagle3"  # listed arms are measured as listed unless told
    assert [(s.steps, s.synthetic_accept) for s in p.settings()] == [(3, None), (1, 0.5)]
    assert [a.draft for a in p.trial_params().arms[1:]] == [None, None]  # the trial's own `draft` applies
    assert load_sweep_params(trial, {"arms": [{"name": "a", "method": "eagle3"}], "strategy": "guided"}).strategy \
        == "guided"


def test_grid_settings_and_probes():
    p = load_sweep_params(data={"model": "m", "engine": "sglang", "grid": {
        "steps": [1, 2, 4], "topk": [1], "draft_tokens": [None, 9], "synthetic_accept": [None]}})
    # topk 1 verifies steps + 1 tokens whatever draft_tokens lists: one setting per depth
    assert [(s.steps, s.draft_tokens, s.k) for s in p.settings()] == [(1, 2, 1), (2, 3, 2), (4, 5, 4)]
    assert [s.steps for s in probe_settings(p)] == [4]  # the deepest: the whole acceptance curve at once
    with pytest.raises(ConfigError, match="grid.draft_tokens"):
        load_sweep_params(data={"model": "m", "engine": "sglang", "grid": {"topk": [4]}}).settings()
    tree = load_sweep_params(data={"model": "m", "engine": "sglang",
                                   "grid": {"steps": [3, 5], "topk": [1, 4], "draft_tokens": [8]}})
    assert [s.name("eagle3") for s in tree.settings()] == ["eagle3-s3", "eagle3-s3-t4-n8", "eagle3-s5",
                                                           "eagle3-s5-t4-n8"]
    # synthetic rates are known acceptance: one first probe, the deepest of the highest rate
    two = load_sweep_params(data={"model": "m", "grid": {"steps": [1, 2, 6], "synthetic_accept": [0.6, 0.9, 0.3]}})
    assert [(s.steps, s.synthetic_accept) for s in probe_settings(two)] == [(6, 0.9)]
    # the real draft's acceptance is unknown: its deepest setting first, whatever the synthetic rates
    mixed = load_sweep_params(data={"model": "m", "grid": {"steps": [1, 2, 6], "synthetic_accept": [0.9, None]}})
    assert [(s.steps, s.synthetic_accept) for s in probe_settings(mixed)] == [(6, None)]


# --- the model ---------------------------------------------------------------------------------------------
def _world(steps: int, alpha: float, c: int) -> MeasuredPoint:
    """A point of a known world: cycle = 6 + 1.5 k ms (x c), acceptance alpha per token."""
    cycle = (6.0 + 1.5 * steps) * c
    tau = expected_accept_len(alpha, steps)
    return MeasuredPoint(steps=steps, topk=1, k=steps, scenario=alpha, concurrency=c, tok_s=tau / cycle * 1000,
                         accept_len=tau, cycle_ms=cycle, draft_ms_per_cycle=0.5 * steps, verify_steps=100.0,
                         per_position=tuple(alpha ** (i + 1) for i in range(steps)))


def _depth(depth: int, accept_len: float, per_position: tuple[float, ...] | None = None,
           verify_steps: float | None = None) -> MeasuredPoint:
    return MeasuredPoint(steps=depth, topk=1, k=depth, scenario=None, concurrency=1, tok_s=None,
                         accept_len=accept_len, per_position=per_position, verify_steps=verify_steps)


def test_model_recovers_a_known_world():
    measured = [_world(6, 0.6, c) for c in (1, 2)] + [_world(1, 0.9, c) for c in (1, 2)]
    model = fit_sweep_model(measured)
    assert model.cycle[1].fixed_ms == pytest.approx(6.0) and model.cycle[1].per_draft_ms == pytest.approx(1.5)
    assert model.cycle[2].fixed_ms == pytest.approx(12.0) and model.cycle[1].draft_per_token_ms == pytest.approx(0.5)
    assert model.acceptance[(0.6, 1)].alpha == pytest.approx(0.6, abs=1e-4)
    assert model.acceptance[(0.9, 1)].alpha == pytest.approx(0.9, abs=1e-4)  # one position, extrapolated
    for steps in (2, 3, 4, 8):
        for a in (0.6, 0.9):
            truth = _world(steps, a, 2)
            pred = model.predict(steps, 1, steps, a, 2)
            assert pred is not None and pred.tok_s == pytest.approx(truth.tok_s, rel=1e-3)
    assert model.predict(2, 1, 2, 0.7, 1) is None  # no curve for an unmeasured scenario


def test_acceptance_from_mean_lengths_when_no_per_position():
    pts = [_depth(d, expected_accept_len(0.75, d)) for d in (2, 5)]
    curve = fit_acceptance(pts)
    assert curve is not None and curve.source.startswith("mean accept length")
    assert curve.alpha == pytest.approx(0.75, abs=2e-4)
    assert curve.accept_len(3) == pytest.approx(expected_accept_len(0.75, 3), rel=1e-3)
    measured = fit_acceptance([_depth(3, 2.0, (0.6, 0.3, 0.1), 10)])
    assert measured is not None and measured.accept_len(2) == pytest.approx(1.9)  # measured rates where they exist


def test_offsets_anchor_each_scenario_on_its_own_measurements():
    """One cycle model for every scenario; what it misses about one scenario (here: 5 % slower than it says)
    carries over to that scenario's unmeasured settings, and to no other scenario's."""
    slow = _world(3, 0.9, 1)
    measured = [_world(6, 0.6, 1), _world(1, 0.6, 1), dataclasses.replace(slow, tok_s=(slow.tok_s or 0) * 0.95)]
    model = fit_sweep_model(measured)
    assert model.offsets[(0.9, 1, 1)] == pytest.approx(0.95, rel=1e-3)
    for steps in (2, 5):
        slower, same = model.predict(steps, 1, steps, 0.9, 1), model.predict(steps, 1, steps, 0.6, 1)
        assert slower is not None and slower.tok_s == pytest.approx(0.95 * (_world(steps, 0.9, 1).tok_s or 0),
                                                                    rel=2e-3)
        assert same is not None and same.tok_s == pytest.approx(_world(steps, 0.6, 1).tok_s, rel=2e-3)


def test_leave_one_setting_out_errors_find_the_odd_point():
    pts = [_world(s, a, 1) for a in (0.6, 0.9) for s in (1, 3, 6)]
    assert max(map(abs, cv_errors(pts))) < 2e-3  # a world the model describes exactly: no error out of sample
    pts[1] = dataclasses.replace(pts[1], tok_s=(pts[1].tok_s or 0) * 1.2)  # one measurement 20 % off
    errs = cv_errors(pts)
    assert min(errs) == pytest.approx(1 / 1.2 - 1, abs=5e-3)  # left out, the others predict its true value


# --- the guided search on known worlds ---------------------------------------------------------------------
QUIET = World(fixed_ms=8.0, per_draft_ms=0.9, real_p1=0.7, real_decay=0.8, request_sigma=0.03, start_sigma=0.0)


def world_sweep(**grid: Any) -> SweepParams:
    return load_sweep_params(data={"name": "world", "model": "world:target", "draft": "world:draft", "repeats": 4,
                                   "max_tokens": 64, "grid": grid}, overrides={"strategy": "grid"})


def check_stop_rule(m: Manifest) -> None:
    """A guided record stopped by 'confirmed': no unmeasured setting, at the top of its predicted range, would
    hold the best measured tok/s below its CI, and the model's best of every scenario and level is measured."""
    assert m.budget is not None and m.model is not None and m.model.margin is not None
    assert (m.budget.stopped_by or "").startswith("confirmed"), m.budget.stopped_by
    best = {(b.scenario, b.concurrency): b.tok_s or 0.0 for b in m.best}
    offsets = {(o.scenario, o.topk, o.concurrency): o.offset for o in m.model.offsets}
    spec = [p for p in m.points if p.method != "none"]
    for p in spec:
        assert p.final_prediction is not None, p.id
        if p.status == "not measured":
            err = max(m.model.margin, abs(offsets.get((p.scenario, p.topk or 1, p.concurrency), 1.0) - 1))
            top = p.final_prediction.tok_s * (1 + err) * (1 - m.model.noise[p.concurrency])
            assert top <= best[(p.scenario, p.concurrency)] * (1 + 1e-9), p.id
            assert (p.reason or "").startswith("not needed")
    for key in best:  # and the setting the model calls best is measured
        mine = [p for p in spec if (p.scenario, p.concurrency) == key]
        assert max(mine, key=lambda p: p.final_prediction.tok_s if p.final_prediction else 0.0).status == "ok", key


def test_a_simulated_grid_is_a_grid_record(tmp_path):
    p = world_sweep(steps=[1, 3, 6], synthetic_accept=[0.7], concurrency=[1, 2])
    grid = simulate(p, QUIET, seed=3, output_dir=tmp_path)
    m = manifest_json(grid.run_dir)
    assert m["kind"] == "sweep-world" and m["status"] == "ok" and len(m["starts"]) == 4
    for pt in m["points"]:
        s = next((s for s in p.settings() if p.arm(s).name == pt["setting"]), None)
        assert pt["tok_s"] == pytest.approx(QUIET.tok_s(s, pt["concurrency"]), rel=0.1)
        if s is not None:
            assert pt["accept_len"] == pytest.approx(QUIET.accept_len(s), abs=0.2)
    assert m["model"]["cycle"]["1"]["per_draft_ms"] == pytest.approx(QUIET.per_draft_ms, rel=0.25)
    again = replay(grid.run_dir, {"strategy": "grid"}, output_dir=tmp_path / "again")
    for a, b in zip(m["points"], manifest_json(again.run_dir)["points"], strict=True):
        assert (a["id"], a["tok_s"], a["tok_s_ci_low"], a.get("accept_len")) == \
               (b["id"], b["tok_s"], b["tok_s_ci_low"], b.get("accept_len"))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_guided_probes_each_scenario_once_and_finds_the_best(seed, tmp_path):
    """Four acceptance scenarios, six depths: one cycle model serves all four, so the probes are one setting per
    scenario (four, one of them also the cycle model's second k), and the whole search stays within 40 % of the
    grid's starts while its best is within the grid-best's CI (same measurements) and near the true best."""
    p = world_sweep(steps=[1, 2, 3, 4, 5, 6], synthetic_accept=[None, 0.6, 0.75, 0.9])
    grid = simulate(p, QUIET, seed=seed, output_dir=tmp_path)
    guided = replay(grid.run_dir, output_dir=tmp_path / "guided")
    m = manifest_json(guided.run_dir)
    setting = {p.arm(s).name: s for s in p.settings()}
    starts = m["starts"]
    assert [s["phase"] for s in starts[:5]] == ["baseline", "probe", "probe", "probe", "probe"]
    assert "probe" not in [s["phase"] for s in starts[5:]]
    assert starts[1]["arm"] == "eagle3-s6"  # the real draft's acceptance is unknown: its deepest setting
    assert starts[2]["arm"].endswith("-a0.6")  # the second k: where acceptance is lowest (0.6 < real 0.7)
    assert {setting[s["arm"]].synthetic_accept for s in starts[1:5]} == {None, 0.6, 0.75, 0.9}
    assert len(starts) <= 0.4 * len(manifest_json(grid.run_dir)["starts"])
    rows = judge(grid.manifest, guided.manifest)
    assert len(rows) == 4 and all(r.within_ci for r in rows), rows
    truth = QUIET.best(p)
    for b in m["best"]:
        found = QUIET.tok_s(setting[b["best"]], b["concurrency"])
        assert found >= 0.97 * truth[(b["scenario"], b["concurrency"])][1], b
    check_stop_rule(load_record(guided.run_dir))


def test_the_model_error_follows_the_data(tmp_path):
    """The same grid in a quiet and a noisy world: the noisy one's model error (out of sample) and noise (CI
    widths) come out larger, and both searches stop by the same rule."""
    p = world_sweep(steps=[1, 2, 3, 4, 6, 8], synthetic_accept=[0.6, 0.9], concurrency=[1, 2])
    out = {}
    for name, sigma in (("quiet", 0.02), ("noisy", 0.25)):
        world = World(fixed_ms=10, per_draft_ms=2.5, fixed_growth=0.5, draft_growth=1.0, request_sigma=sigma,
                      start_sigma=sigma / 2)
        grid = simulate(p, world, seed=4, output_dir=tmp_path / name)
        out[name] = load_record(replay(grid.run_dir, output_dir=tmp_path / name).run_dir)
    q, n = out["quiet"].model, out["noisy"].model
    assert q is not None and n is not None and q.margin is not None and n.margin is not None
    assert n.margin > 2 * q.margin and min(n.noise.values()) > 2 * max(q.noise.values())
    check_stop_rule(out["quiet"])
    check_stop_rule(out["noisy"])


# --- real servers ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_llamacpp_ignores_per_request_draft_depth(llama_server, tiny_models, port, tmp_path):
    """Premise of the sweep's grouping: this llama-server drafts n_max tokens whatever a request asks.

    If it ever honours `speculative.n_max` per request, one start could serve every depth: revisit
    spectrial.sweep.params (restart fields) then.
    """
    d = tiny_models.dir
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen([str(llama_server), "-m", str(d / "target.gguf"), "-md", str(d / "eagle3.gguf"),
                             "--spec-type", "draft-eagle3", "--spec-draft-n-max", "4", "--spec-synth-rates",
                             "0.9,0.81,0.729,0.6561", "--host", "127.0.0.1", "--port", str(port), "-c", "512",
                             "-np", "1", "--metrics", "--no-webui", "-t", "1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(timeout=60) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.get(f"{url}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None, "llama-server did not start"
                time.sleep(0.2)
            per_step = {}
            for n_max in (1, 4):
                body = {"prompt": "hello world there", "max_tokens": 32, "ignore_eos": True, "temperature": 0,
                        "speculative.n_max": n_max, "speculative.n_min": 0}
                r = client.post(f"{url}/v1/completions", json=body)
                assert r.status_code == 200, r.text
                t = r.json()["timings"]
                steps = t["predicted_n"] - t["draft_n_accepted"]  # one committed token of the target per cycle
                per_step[n_max] = t["draft_n"] / steps
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
    assert per_step[1] > 2.0 and per_step[4] > 2.0, per_step  # a request's n_max 1 still drafts ~4 per cycle


def _check_record(run: Path, levels: list[int], status: str = "ok") -> dict[str, Any]:
    """What every sweep record must hold; returns the manifest."""
    m = manifest_json(run)
    assert m["kind"] == "sweep" and m["status"] == status, m["reason"]
    starts = m["starts"]
    # one start measures every concurrency level: the restart economy of per-request settings
    for s in starts:
        assert s["status"] == "ok" and [w["concurrency"] for w in s["windows"]] == levels
    assert sum(1 for s in starts if s["arm"] == "baseline") == 1
    spec_arms = [s["arm"] for s in starts if s["arm"] != "baseline"]
    assert len(spec_arms) == len(set(spec_arms)) == m["budget"]["settings_measured"] == len(starts) - 1
    assert m["budget"]["restarts"] == len(starts)
    for p in m["points"]:
        assert (p["status"] == "ok") == (p["setting"] in {s["arm"] for s in starts})
        if p["status"] == "ok":
            assert p["tok_s"] > 0 and p["requests_ok"] >= 2 and p["start_orders"]
            assert p["tok_s_ci_low"] <= p["tok_s"] <= p["tok_s_ci_high"]
            if p["method"] != "none":
                assert 1.0 <= p["accept_len"] <= p["steps"] + 1 and p["cycle_ms"] > 0
                assert p["per_position"] and len(p["per_position"]) <= p["steps"]
                assert p["baseline"] == f"baseline@c{p['concurrency']}" and p["speedup"] > 0
    reqs = pd.read_csv(run / "requests.csv")
    assert set(reqs["concurrency"]) == set(levels) and set(reqs["start"]) == {s["order"] for s in starts}
    best = {(b["scenario"], b["concurrency"]): b for b in m["best"]}
    for (sc, c), b in best.items():
        measured = [p for p in m["points"] if p["method"] != "none" and p["status"] == "ok"
                    and p["concurrency"] == c and p["scenario"] == sc]
        assert b["tok_s"] == max(p["tok_s"] for p in measured)
        assert b["verdict"]
    return m


@pytest.mark.slow
def test_guided_sweep_on_local_pair(tiny_params, tmp_path):
    data = sweep_data(tiny_params, steps=[1, 2, 3, 4])
    result = run_sweep(load_sweep_params(data=data), progress=False)
    m = _check_record(result.run_dir, [1, 2])
    starts = m["starts"]
    assert [s["phase"] for s in starts[:3]] == ["baseline", "probe", "probe"]
    # the deepest setting first, then a second depth for the cycle model (the one the line through the
    # baseline's time per token and the first cycle predicts best)
    assert starts[1]["arm"] == "eagle3-s4-a0.8" and starts[2]["arm"] != starts[1]["arm"]
    assert all(s["phase"] == "confirm" for s in starts[3:])
    assert "-np" in m["launch"][0]["argv"] and m["launch"][0]["argv"][m["launch"][0]["argv"].index("-np") + 1] == "2"
    spec = [p for p in m["points"] if p["method"] != "none"]
    assert all(p["final_prediction"]["tok_s"] > 0 for p in spec)
    for p in spec:  # each point measured after a prediction shows the prediction next to the measurement
        if p["phase"] == "confirm":
            assert p["prediction"]["tok_s"] > 0
            assert p["prediction_error"] == pytest.approx(p["prediction"]["tok_s"] / p["tok_s"] - 1)
        else:
            assert p["prediction"] is None
    stopped = m["budget"]["stopped_by"]
    assert stopped.startswith(("confirmed", "every setting"))
    if stopped.startswith("confirmed"):  # the stopping rule, checked on what the record says
        check_stop_rule(load_record(result.run_dir))
    assert len(starts) <= 1 + 4 and not LocalHost().port_holders(tiny_params["port"])


@pytest.mark.slow
def test_cli_grid_sweep_stops_at_the_restart_budget(tiny_params, write_params):
    path = write_params(sweep_data(tiny_params, steps=[1, 2, 3]), "sweep.yaml")
    app = typer.Typer()
    app.command("sweep")(sweep_command)  # mounted as the lead mounts it in spectrial.cli
    app.command("noop")(lambda: None)
    res = CliRunner().invoke(app, ["sweep", str(path), "-p", "strategy=grid", "-p", "budget_restarts=3",
                                   "-p", "grid.concurrency=[1]", "--quiet"])
    assert res.exit_code == 0, res.output
    runs = [p for p in Path(tiny_params["output_dir"]).iterdir() if (p / "manifest.json").is_file()]
    assert len(runs) == 1
    m = _check_record(runs[0], [1], status="partial")  # stopped by its budget: partial, exit 0
    assert [s["arm"] for s in m["starts"]] == ["baseline", "eagle3-s1-a0.8", "eagle3-s2-a0.8"]
    assert m["budget"]["stopped_by"].startswith("restart budget") and m["budget"]["grid_restarts"] == 4
    left = [p for p in m["points"] if p["status"] == "not measured"]
    assert [p["id"] for p in left] == ["eagle3-s3-a0.8@c1"] and "restart budget" in left[0]["reason"]
    assert [x["setting"] for x in m["budget"]["not_measured"]] == ["eagle3-s3-a0.8"] and "eagle3-s3-a0.8" in m["reason"]
    assert "best per scenario and load level" in res.output and "manifest.json" in res.output
    assert res.output.strip().splitlines()[-1].startswith("partial: stopped by the restart budget")
    assert math.isfinite(json.loads((runs[0] / "manifest.json").read_text())["points"][0]["tok_s"])


@pytest.mark.slow
def test_replays_of_a_grid_record_and_of_a_trial(tiny_params):
    grid = run_sweep(load_sweep_params(data=sweep_data(tiny_params, steps=[1, 2, 4], concurrency=[1]),
                                       overrides={"strategy": "grid"}), progress=False)
    # the grid replayed on its own record reproduces every figure: same requests, same counters, same seed
    again = replay(grid.run_dir, {"strategy": "grid"})
    assert manifest_json(again.run_dir)["kind"] == "sweep-replay" and again.run_dir.parent == grid.run_dir / "replays"
    for a, b in zip(manifest_json(grid.run_dir)["points"], manifest_json(again.run_dir)["points"], strict=True):
        assert (a["id"], a.get("tok_s"), a.get("tok_s_ci_low"), a.get("accept_len"), a.get("cycle_ms")) == \
               (b["id"], b.get("tok_s"), b.get("tok_s_ci_low"), b.get("accept_len"), b.get("cycle_ms"))
    guided = replay(grid.run_dir, {"budget_restarts": 3})
    starts = manifest_json(guided.run_dir)["starts"]
    assert [s["arm"] for s in starts[:2]] == ["baseline", "eagle3-s4-a0.8"] and len(starts) == 3
    assert starts[2]["arm"] in ("eagle3-s1-a0.8", "eagle3-s2-a0.8") and starts[2]["phase"] == "probe"
    assert all(s["replayed_from"] is not None for s in starts) and manifest_json(guided.run_dir)["budget"]["restarts"] == 3
    # a trial whose arms form a grid replays too (a depth x acceptance trial from a GPU host, say)
    trial = {**{k: v for k, v in tiny_params.items() if k != "steps"}, "draft": "tiny:eagle3", "repeats": 2,
             "max_tokens": 16, "arms": [{"name": "baseline"}] + [
                 {"name": f"e-k{k}", "method": "eagle3", "steps": k, "synthetic_accept": 0.8} for k in (1, 2, 4)]}
    from spectrial.params import load_params
    from spectrial.protocol.trial import run_trial

    tr = run_trial(load_params(data=trial), progress=False)
    rep = replay(tr.run_dir)
    names = {a["name"]: a for a in manifest_json(tr.run_dir)["arms"]}
    pts = {p["id"]: p for p in manifest_json(rep.run_dir)["points"]}
    assert manifest_json(rep.run_dir)["starts"][0]["arm"] == "baseline"
    assert pts["baseline@c1"]["tok_s"] == pytest.approx(names["baseline"]["tok_s"])
    for s in manifest_json(rep.run_dir)["starts"][1:]:
        k = int(s["arm"].split("-s")[1].split("-")[0])
        assert pts[f"{s['arm']}@c1"]["tok_s"] == pytest.approx(names[f"e-k{k}"]["tok_s"])
        assert pts[f"{s['arm']}@c1"]["accept_len"] == pytest.approx(names[f"e-k{k}"]["accept_len"])
