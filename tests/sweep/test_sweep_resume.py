"""Resuming a sweep its budget stopped (issue 41: a device call that cannot finish says what is left and the next
call finishes it), on a real llama-server: the measured starts are taken over, not started again; only the rest
start a server; the new record is the whole sweep; a host of another fingerprint gets a baseline of its own; a
different plan or a stale record is refused."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from spectrial.errors import ConfigError
from spectrial.record.store import manifest_json, read_requests
from spectrial.sweep import load_sweep_params, sweep_command
from spectrial.sweep.resume import load_resumable
from spectrial.sweep.run import run_sweep


def sweep_data(tiny: dict[str, Any]) -> dict[str, Any]:
    data = {k: v for k, v in tiny.items() if k not in ("arms", "steps")}
    data.update(name="test-resume", draft="tiny:eagle3", method="eagle3", repeats=2, max_tokens=16, strategy="grid",
                grid={"steps": [1, 2, 4], "concurrency": [1], "synthetic_accept": [0.8]})
    return data


def cli(*args: str) -> Any:
    app = typer.Typer()
    app.command("sweep")(sweep_command)
    app.command("noop")(lambda: None)
    return CliRunner().invoke(app, ["sweep", *args])


def runs_in(folder: Path) -> list[Path]:
    return sorted((p for p in folder.iterdir() if (p / "manifest.json").is_file()), key=lambda p: p.stat().st_mtime)


@pytest.mark.slow
def test_a_resumed_sweep_starts_only_what_is_left(tiny_params, write_params, tmp_path: Path) -> None:
    path = write_params(sweep_data(tiny_params), "sweep.yaml")
    out = Path(tiny_params["output_dir"])
    first = cli(str(path), "-p", "budget_restarts=2", "--quiet")
    assert first.exit_code == 0, first.output
    (earlier,) = runs_in(out)
    m1 = manifest_json(earlier)
    assert m1["status"] == "partial" and [s["arm"] for s in m1["starts"]] == ["baseline", "eagle3-s1-a0.8"]

    plan = cli(str(path), "--resume", str(earlier), "--dry-run")
    said = " ".join(plan.output.split())
    assert plan.exit_code == 0 and "2 of the plan's server starts are taken over" in said
    # the estimate counts only what will start, as the budget does (the grid is 4: the baseline and 3 settings)
    assert f"plan: sweep (grid), resuming {m1['run_id']}: at most 2 server start(s)" in said, said
    assert f"the grid is 4 start(s), 2 of them taken over from {m1['run_id']} (not started again): 2 to start" in said
    fresh = " ".join(cli(str(path), "--dry-run").output.split())
    assert "plan: sweep (grid): at most 4 server start(s)" in fresh and "taken over" not in fresh, fresh
    again = cli(str(path), "--resume", str(earlier), "--quiet")
    assert again.exit_code == 0, again.output
    resumed = next(p for p in runs_in(out) if p != earlier)
    m2 = manifest_json(resumed)
    assert m2["status"] == "ok" and m2["resumed_from"] == m1["run_id"]
    starts = m2["starts"]
    assert [(s["arm"], s["replayed_from"]) for s in starts] == [
        ("baseline", 0), ("eagle3-s1-a0.8", 1), ("eagle3-s2-a0.8", None), ("eagle3-s4-a0.8", None)]
    assert m2["budget"]["restarts"] == 4 and "2 taken over from " + m1["run_id"] in " ".join(again.output.split())
    assert any(d["phase"] == "resume" and m1["run_id"] in d["reason"] for d in m2["decisions"])
    # the taken-over points are the earlier record's measurements, to the request
    p1 = {p["id"]: p for p in m1["points"]}
    for p in m2["points"]:
        if p["id"] in ("baseline@c1", "eagle3-s1-a0.8@c1"):
            assert (p["tok_s"], p["accept_len"], p["tok_s_ci_low"]) == (p1[p["id"]]["tok_s"], p1[p["id"]]["accept_len"],
                                                                       p1[p["id"]]["tok_s_ci_low"])
        assert p["status"] == "ok", p
    before, after = read_requests(earlier, key="point"), read_requests(resumed, key="point")
    assert [r.tokens for r in after["eagle3-s1-a0.8@c1"]] == [r.tokens for r in before["eagle3-s1-a0.8@c1"]]
    assert sum(map(len, after.values())) == 4 * 2  # every point's requests, old and new
    for s in starts[:2]:  # their server logs came with them
        assert (resumed / "logs" / Path(s["server"]["log"]).name).is_file()
    # one baseline: the host resumed on is the one the earlier starts ran on
    assert {s["fingerprint_key"] for s in starts} == {m1["fingerprint_key"]}
    assert [p["setting"] for p in m2["points"] if p["method"] == "none"] == ["baseline"]

    # another plan is refused, naming what differs and what may
    bad = cli(str(path), "--resume", str(earlier), "-p", "grid.steps=[1,2]", "--quiet")
    assert bad.exit_code == 2 and "differs from" in bad.output and "grid" in bad.output, bad.output
    done = cli(str(path), "--resume", str(resumed), "--quiet")
    assert done.exit_code == 2 and "nothing is left to measure" in done.output


@pytest.mark.slow
def test_a_resume_on_another_host_state_measures_its_own_baseline(tiny_params, tmp_path: Path) -> None:
    params = load_sweep_params(data=sweep_data(tiny_params), overrides={"budget_restarts": 2})
    earlier = run_sweep(params, progress=False).run_dir
    m = json.loads((earlier / "manifest.json").read_text())
    real = m["fingerprint_key"]
    text = (earlier / "manifest.json").read_text().replace(real, "elsewhere0000")  # as if measured on another host
    (earlier / "manifest.json").write_text(text)
    result = run_sweep(load_sweep_params(data=sweep_data(tiny_params)), progress=False, resume=earlier)
    m2 = manifest_json(result.run_dir)
    arms = [(s["arm"], s["replayed_from"] is not None, s["fingerprint_key"]) for s in m2["starts"]]
    assert arms[:2] == [("baseline", True, "elsewhere0000"), ("eagle3-s1-a0.8", True, "elsewhere0000")]
    live = arms[2:]
    assert ("baseline-2", False, real) in live and all(fp == real for _, taken, fp in live if not taken)
    assert any("resumed on another host state" in d["reason"] for d in m2["decisions"] if d["phase"] == "fingerprint")
    pts = {p["id"]: p for p in m2["points"]}
    # every live point is judged against the live baseline, the taken-over one against its own
    assert m2["baselines"] == {"elsewhere0000": "baseline", real: "baseline-2"}
    for pid in ("eagle3-s2-a0.8@c1", "eagle3-s4-a0.8@c1"):
        assert pts[pid]["fingerprint_key"] == real and pts[pid]["baseline"] == "baseline-2@c1", pts[pid]
    assert pts["eagle3-s1-a0.8@c1"]["baseline"] == "baseline@c1"


def test_a_stale_or_foreign_record_is_not_resumed(tiny_params, tmp_path: Path) -> None:
    params = load_sweep_params(data=sweep_data(tiny_params))
    run = tmp_path / "old"
    run.mkdir()
    with pytest.raises(ConfigError, match="holds no manifest.json"):
        load_resumable(run, params)
    examples = Path(__file__).resolve().parents[2] / "outputs" / "examples" / "h200-sglang"
    with pytest.raises(ConfigError, match="measured its whole plan"):
        load_resumable(examples / "h200-sglang-8b-sweep-083946", params)
    src = examples / "h200-sglang-8b-sweep-082758"  # failed: resumable, if it were recent and the same sweep
    m = json.loads((src / "manifest.json").read_text())
    soon = dt.datetime.fromisoformat(m["finished_at"]) + dt.timedelta(minutes=5)
    with pytest.raises(ConfigError, match="differs from h200-sglang-8b-sweep-082758's in arms, .*engine.* and [0-9]+ more"):
        load_resumable(src, params, now=soon)
    with pytest.raises(ConfigError, match=r"finished 2\.0 h ago; its baseline would be stale"):
        load_resumable(src, params, now=soon + dt.timedelta(minutes=115))


H100 = Path(__file__).resolve().parents[2] / "outputs" / "examples" / "h100-sglang" / "h100-sxm-sglang-8b-sweep-174223"


def test_the_h100_sweep_finished_across_device_calls() -> None:
    """The committed record of real SGLang on a lent H100 (2026-12-06): the depth sweep measured over three device
    calls, each resuming what the last left (the record of the third holds the whole sweep: 5 starts taken over,
    the 2 deepest settings started live); the GPU named from the device; the figures docs/DEVICE.md gives."""
    from spectrial.record.store import load_record

    m = load_record(H100, settle=False)
    assert m.status == "ok" and m.resumed_from == "h100-sxm-sglang-8b-sweep-173241"
    assert [(s.arm, s.replayed_from) for s in m.starts] == [
        ("baseline", 0), ("eagle3-s1-a0.6", 1), ("eagle3-s1-a0.9", 2), ("eagle3-s3-a0.6", 3), ("eagle3-s3-a0.9", 4),
        ("eagle3-s6-a0.6", None), ("eagle3-s6-a0.9", None)]
    assert {g.name for g in m.host.gpus.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert m.budget.settings_measured == m.budget.settings == 6 and not m.budget.partial and m.budget.stopped_by is None
    base = next(p for p in m.points if p.method == "none")
    speedup = {p.setting: round(p.tok_s / base.tok_s, 2) for p in m.points if p.method != "none"}
    assert round(base.tok_s, 1) == 164.9
    assert speedup == {"eagle3-s1-a0.6": 1.32, "eagle3-s3-a0.6": 1.66, "eagle3-s6-a0.6": 1.64,
                       "eagle3-s1-a0.9": 1.61, "eagle3-s3-a0.9": 2.63, "eagle3-s6-a0.9": 3.51}
    assert [(b.scenario, b.best, b.verdict) for b in m.best] == [
        (0.6, "eagle3-s3-a0.6", "confirmed: faster than the runner-up"),
        (0.9, "eagle3-s6-a0.9", "confirmed: faster than the runner-up")]
    roof = json.loads((H100 / "verify_wall.json").read_text())["roofline"]  # notebook 05, on the device
    assert roof["gpu"] == "h100_sxm" and round(roof["roofline_tok_s"], 1) == 222.9
    assert round(roof["baseline_share_of_roofline"] * 100, 1) == 74.0
