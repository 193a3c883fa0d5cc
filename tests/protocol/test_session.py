"""One protocol, written once (spectrial.protocol.session), typed records (spectrial.schema), the step-wise trial."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spectrial.engines import get_engine
from spectrial.hosts.local import LocalHost
from spectrial.params import load_params
from spectrial.protocol.trial import Trial, run_trial
from spectrial.record.store import as_manifest, load_record, manifest_json
from spectrial.schema import SCHEMA_VERSION, Manifest, StartRecord
from spectrial.sweep.params import load_sweep_params
from spectrial.sweep.run import run_sweep

REPO = Path(__file__).resolve().parents[2]
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]


# --- typed records -----------------------------------------------------------------------------------------
def test_every_committed_record_loads_typed() -> None:
    """The records under outputs/examples (schema 1, written before the typed schema) load as Manifests; a
    version-1 trial start's counters become its one window."""
    paths = sorted((REPO / "outputs" / "examples").rglob("manifest.json"))
    assert len(paths) >= 4
    for p in paths:
        m = load_record(p.parent)
        assert isinstance(m, Manifest) and m.schema_version == SCHEMA_VERSION and m.run_id
    # the H200 notebook-02 record as committed before the typed schema (schema 1), kept as a fixture
    raw = json.loads((REPO / "tests" / "fixtures" / "records" / "v1-h200-8b-nb02.json").read_text())
    m = as_manifest(raw)
    assert "windows" not in raw["starts"][0] and len(m.starts[0].windows) == 1
    for s_raw, s in zip(raw["starts"], m.starts, strict=True):
        assert s.windows[0].counters.verify_steps == s_raw["counters"]["verify_steps"]
        assert s.windows[0].tok_s == s_raw["tok_s"]
    assert [a.name for a in m.arms] == [a["name"] for a in raw["arms"]]
    # schema 3 re-derives the comparison: break-even = accept length / speed-up (it was cycle / the engine's time
    # per token, which could disagree with the speed-up), the engine's cycle kept apart
    spec = m.arms[1]
    assert spec.speedup == pytest.approx(spec.tok_s / m.arms[0].tok_s)
    assert spec.break_even_accept_len == pytest.approx(spec.accept_len / spec.speedup)
    assert spec.engine_cycle_ms == raw["arms"][1]["cycle_ms"]
    assert spec.break_even_accept_len == pytest.approx(raw["arms"][1]["break_even_accept_len"], rel=0.05)


def test_schema_command_prints_the_json_schema() -> None:
    res = subprocess.run([*SPECTRIAL, "schema", "--json"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    schema = json.loads(res.stdout)
    assert schema["title"] == "Manifest" and "schema_version" in schema["properties"]
    assert {"ArmRecord", "StartRecord", "WindowRecord"} <= set(schema["$defs"])
    bad = subprocess.run([*SPECTRIAL, "schema", "nope"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "not one of" in bad.stderr


@pytest.mark.parametrize("engine,config", [
    ("llamacpp", {}), ("vllm", {}), ("sglang", {"sglang_version": "0.5.17", "cuda_graph_max_bs": 8})])
def test_launch_spec_is_pure(tmp_path: Path, engine: str, config: dict[str, Any]) -> None:
    """The same arm gives the same command every time and asking changes nothing in the adapter."""
    data = {"engine": engine, "model": str(tmp_path / "m"), "draft": str(tmp_path / "d"), "steps": 3,
            "engine_config": config, "arms": [{"name": "baseline"}, {"name": "e", "method": "eagle3"}]}
    eng = get_engine(engine, load_params(data=data), LocalHost())
    with pytest.raises(Exception, match="prepare"):
        eng.launch_spec(eng.params.arms[0])  # nothing resolved yet: an error, not a hidden prepare()
    eng.resolve_dry()
    state = {k: repr(v) for k, v in vars(eng).items()}
    first = [eng.launch_spec(a) for a in eng.params.arms]
    second = [eng.launch_spec(a) for a in reversed(eng.params.arms)][::-1]
    assert [(s.argv, s.env) for s in first] == [(s.argv, s.env) for s in second]
    assert {k: repr(v) for k, v in vars(eng).items()} == state


# --- one start, written once ---------------------------------------------------------------------------------
class ProbedStart(StartRecord):
    """A start record with one more field, as a later change to spectrial.protocol.session would add."""

    probe_field: str = "added in one place"


@pytest.mark.slow
def test_a_field_added_to_the_start_record_reaches_trial_and_sweep_records(tiny_params, monkeypatch) -> None:
    """Trials and sweeps share the one start (spectrial.protocol.session): a field added to its record appears in both
    records, sweep code untouched; and the sweep's starts carry what only the trial's used to (env check
    with its processes, log summary, connection events, windows with their log lines)."""
    import spectrial.protocol.session

    monkeypatch.setattr(spectrial.protocol.session, "StartRecord", ProbedStart)
    trial = run_trial(load_params(data={**tiny_params, "arms": [{"name": "baseline"}]}), progress=False)
    sweep_data = {**tiny_params, "name": "sw", "arms": [{"name": "baseline"}], "draft": "tiny:eagle3",
                  "grid": {"steps": [1], "synthetic_accept": [0.8], "concurrency": [1]}}
    sweep = run_sweep(load_sweep_params(data=sweep_data, overrides={"strategy": "grid"}), progress=False)
    for result in (trial, sweep):
        m = manifest_json(result.run_dir)
        assert m["status"] == "ok", m["reason"]
        assert m["starts"]
        for s in m["starts"]:
            assert s["probe_field"] == "added in one place"
            assert set(StartRecord.model_fields) <= set(s)
            assert s["env_check"]["ok"] and s["env_check"]["processes"] and s["log_summary"]["lines"] > 0
            assert s["windows"] and all(w["log_lines"][0] >= 1 for w in s["windows"])
    sweep_m = manifest_json(sweep.run_dir)
    assert [s["arm"] for s in sweep_m["starts"]] == ["baseline", "eagle3-s1-a0.8"]
    reqs = (sweep.run_dir / "requests.csv").read_text().splitlines()
    assert "point" in reqs[0].split(",") and "arm" in reqs[0].split(",")


# --- the step-wise trial ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_step_wise_trial_reruns_an_arm_into_the_same_record(tiny_params) -> None:
    params = load_params(data={**tiny_params, "arms": tiny_params["arms"][:2]})
    with Trial(params, progress=False) as t:
        assert t.kill_old_server().action == "none"
        t.verify_gpus_free()
        first = t.run_arm("baseline")
        assert first.status == "ok" and first.tok_s > 0
        again = t.run_arm("baseline")  # re-run in the same kernel: replaces the earlier start
        assert again.status == "ok" and len(again.starts) == 1
        t.run_arm("draft")
        table = t.compare()
    assert list(table["arm"]) == ["baseline", "draft"] and table["speedup"].notna().all()
    m = manifest_json(t.run_dir)
    assert m["status"] == "ok", m["reason"]
    base_starts = [s for s in m["starts"] if s["arm"] == "baseline"]
    assert [s["superseded"] for s in base_starts] == [True, False]
    names = [s["name"] for s in m["steps"]]
    assert names[:4] == ["prepare", "kill_old_server", "verify_gpus_free", "fingerprint"]
    assert names.count("launch:baseline") == 2 and names[-1] == "compare"
    draft = next(a for a in m["arms"] if a["name"] == "draft")
    assert draft["baseline_arm"] == "baseline" and draft["verdict"]
    requests = (t.run_dir / "requests.csv").read_text().splitlines()
    assert len(requests) == 1 + 2 * tiny_params["repeats"]  # the superseded start's requests are not counted
    with pytest.raises(Exception, match="no arm named 'nope'"):
        t.run_arm("nope")
    assert not LocalHost().port_holders(tiny_params["port"])


@pytest.mark.slow
def test_interrupt_inside_an_arm_stops_its_server_and_records_why(tiny_params) -> None:
    """KeyboardInterrupt (Ctrl-C, a notebook's interrupt) while an arm runs: the server is stopped, the record
    says failed and why, and the kernel's Trial can run the arm again."""
    params = load_params(data={**tiny_params, "arms": [{"name": "baseline"}], "repeats": 50, "max_tokens": 64})

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    t = Trial(params, progress=False)
    try:
        t.verify_gpus_free()
        signal.setitimer(signal.ITIMER_REAL, 2.5)
        with pytest.raises(KeyboardInterrupt):
            t.run_arm("baseline")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not LocalHost().port_holders(tiny_params["port"])
    m = manifest_json(t.run_dir)
    assert m["status"] == "failed" and "interrupted by Ctrl-C" in m["reason"]
    assert m["reason"].startswith("arm baseline: benchmark:baseline: ")  # the arm and the step it was in
    assert m["arms"][0]["status"] == "failed" and m["starts"][0]["status"] == "failed"
    assert m["starts"][0]["server"]["stop"]["how"] in ("TERM", "KILL")
    t.params.repeats = 2
    assert t.run_arm("baseline").status == "ok"
    t.compare()
    t.close()
    assert manifest_json(t.run_dir)["status"] == "ok"
