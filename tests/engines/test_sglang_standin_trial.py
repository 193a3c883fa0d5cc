"""The SGLang protocol end to end against the SGLang TEST DOUBLE (tests/standin/sglang): the real
`spectrial trial` CLI and notebook 02 (papermill) with engine sglang, baseline + EAGLE-3 arms, environment
verification in every spawned worker, and NCCL's own evidence (imitated by the double's workers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest
import yaml

from spectrial.errors import ConfigError, MeasurementRejected
from spectrial.hosts.local import LocalHost
from spectrial.params import load_params
from spectrial.protocol.trial import run_trial
from spectrial.record.store import manifest_json
from spectrial.schema import EnvCheckRecord, NcclEvidence

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "params" / "examples" / "sglang-standin.yaml"
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]


def standin_params(tmp_path: Path, port: int, **over: Any) -> dict[str, Any]:
    """The CI example with absolute paths, a free port and every output under tmp_path."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data.update(model=str(REPO / data["model"]), draft=str(REPO / data["draft"]), port=port,
                output_dir=str(tmp_path / "out"), state_dir=str(tmp_path / "state"),
                work_dir=str(tmp_path / "work"), repeats=2, max_tokens=32)
    data["engine_config"] = {**data["engine_config"], "python": sys.executable,
                             "pythonpath": [str(REPO / "tests" / "standin")]}
    engine_config = over.pop("engine_config", {})
    data["engine_config"].update(engine_config)
    data.update(over)
    return data


def only_run(out: Path) -> Path:
    runs = [p for p in out.iterdir() if (p / "manifest.json").is_file()]
    assert len(runs) == 1, runs
    return runs[0]


def no_leftovers(port: int, pids: list[int]) -> None:
    assert not LocalHost().port_holders(port)
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_cli_trial_against_the_standin(tmp_path, port, write_params):
    path = write_params(standin_params(tmp_path, port))
    res = subprocess.run([*SPECTRIAL, "trial", str(path), "--quiet"], capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    run = only_run(tmp_path / "out")
    m = manifest_json(run)
    assert m["status"] == "ok" and m["engine"]["sglang_version"] == "0.5.17+standin"
    arms = {a["name"]: a for a in m["arms"]}
    base, eagle = arms["baseline"], arms["eagle3"]
    for a in (base, eagle):
        assert a["status"] == "ok" and a["argv"][1:3] == ["-m", "sglang.launch_server"]
        assert a["argv"][a["argv"].index("--tp-size") + 1] == "2"
    assert eagle["argv"][eagle["argv"].index("--speculative-algorithm") + 1] == "EAGLE3"
    starts = m["starts"]
    pids = []
    for s in starts:  # every process of the server tree carries the requested variables, workers included
        chk = s["env_check"]
        assert chk["ok"] and not chk["unverified"], (chk["problems"], chk["unverified"])
        # the scheduler and detokenizer renamed themselves (setproctitle): /proc shows a blanked environment,
        # the probe in their interpreter shows what they inherited
        workers = [p for p in chk["processes"] if any(a.startswith("sglang::") for a in p["cmdline"])]
        assert len(workers) >= 3 and all(p["environ"] == "blanked" for p in workers)
        assert all({"NCCL_PROTO", "NCCL_ALGO", "PYTHONPATH"} <= set(p["present"]) for p in workers)
        assert all(p["verified_by"]["NCCL_PROTO"] == "probe" for p in workers)
        pids += [p["pid"] for p in chk["processes"]]
    # what the double simulates: 5 ms/token, 12 ms/verify cycle, chain acceptance 0.7 over 2 steps
    # (baseline cycle_ms = its ms per token; the manifest masks the key `ms_per_token` as a secret name)
    assert base["cycle_ms"] == pytest.approx(5.0, abs=1.5) and base["accept_len"] == 1.0
    assert eagle["stats_source"].startswith("metrics") and eagle["stats_scoped"] is True
    assert 1.5 < eagle["accept_len"] < 2.8 and eagle["verify_steps"] > 0
    assert eagle["cycle_ms"] == pytest.approx(12.0, abs=3.0)
    assert eagle["break_even_accept_len"] == pytest.approx(eagle["cycle_ms"] / base["cycle_ms"])
    assert eagle["drafted"] == pytest.approx(2 * eagle["verify_steps"])
    notes = " ".join(n for s in starts for n in s["notes"])
    assert "NCCL_PROTO=LL confirmed by NCCL in 2/2 rank(s)" in notes
    stops = [s["report"] for s in m["steps"] if s["name"].startswith("stop:")]
    # SGLang drains, logs `Gracefully exiting`, then SIGKILLs its own tree: status 137 is a clean stop
    assert stops and all(r["how"] == "TERM" and r["port_free"] and r["clean"] for r in stops), stops
    assert all(r["exit_code"] == 137 and "Gracefully exiting" in r["evidence"][0] for r in stops)
    log = (run / "logs" / "sglang-eagle3.log").read_text()
    assert "The server is fired up and ready to roll!" in log and "accept len:" in log
    no_leftovers(port, pids)


def test_env_check_fails_naming_the_variable_and_the_worker(tmp_path, port):
    data = standin_params(tmp_path, port, engine_config={
        "nccl_debug": False, "extra_args": ["--standin-drop-worker-env", "NCCL_PROTO"]})
    with pytest.raises(MeasurementRejected, match=r"NCCL_PROTO missing from pid \d+") as e:
        run_trial(load_params(data=data), progress=False)
    assert e.value.check == "env_check" and e.value.arm == "baseline"  # a measurement outcome, not bad input
    assert isinstance(e.value.result, EnvCheckRecord) and e.value.result.ok is False
    assert not isinstance(e.value, ConfigError)
    m = manifest_json(only_run(tmp_path / "out"))
    assert m["status"] == "failed" and "NCCL_PROTO missing" in m["reason"]
    procs = m["starts"][0]["env_check"]["processes"]
    launcher = [p for p in procs if "sglang.launch_server" in p["cmdline"]]
    workers = [p for p in procs if any(a.startswith("sglang::scheduler") for a in p["cmdline"])]
    assert launcher and "NCCL_PROTO" in launcher[0]["present"]
    # the renamed schedulers' /proc is blanked; their probe records say the variable did not reach them
    assert len(workers) == 2 and all("NCCL_PROTO" in p["missing"] and p["verified_by"]["NCCL_PROTO"] == "probe"
                                     for p in workers)
    assert any(f"pid {p['pid']}" in str(e.value) for p in workers)
    assert not any(s["name"].startswith("launch:eagle3") for s in m["steps"])
    no_leftovers(port, [p["pid"] for p in procs])


def test_cli_exits_1_on_a_rejected_measurement_saying_what_to_do(tmp_path, port, write_params):
    """A rejected measurement is a failed run (exit 1, the record says why), not bad input (exit 2)."""
    path = write_params(standin_params(tmp_path, port, repeats=1, arms=[{"name": "baseline"}], engine_config={
        "nccl_debug": False, "extra_args": ["--standin-drop-worker-env", "NCCL_PROTO"]}))
    res = subprocess.run([*SPECTRIAL, "trial", str(path), "--quiet"], capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "env_check: requested variables did not reach the server of arm baseline" in res.stderr
    assert "hint: see the record's env_check per process; set env_check: warn" in res.stderr
    m = manifest_json(only_run(tmp_path / "out"))
    assert m["status"] == "failed" and "MeasurementRejected: env_check" in m["starts"][0]["reason"]
    no_leftovers(port, [])


def test_nccl_evidence_sees_what_proc_cannot(tmp_path, port):
    """A variable assigned inside the running workers: absent from /proc/<pid>/environ, yet NCCL used it."""
    extra = ["--standin-drop-worker-env", "NCCL_PROTO", "--standin-worker-setenv", "NCCL_PROTO=LL"]
    data = standin_params(tmp_path, port, env_check="warn", repeats=1, arms=[{"name": "baseline"}],
                          engine_config={"extra_args": extra})
    result = run_trial(load_params(data=data), progress=False)
    assert result.status == "ok"
    start = manifest_json(result.run_dir)["starts"][0]
    assert not start["env_check"]["ok"] and "NCCL_PROTO missing from pid" in " ".join(start["env_check"]["problems"])
    assert "NCCL_PROTO=LL confirmed by NCCL in 2/2 rank(s)" in " ".join(start["notes"])

    data = standin_params(tmp_path / "second", port, env_check="warn", repeats=1, arms=[{"name": "baseline"}],
                          engine_config={"extra_args": ["--standin-worker-setenv", "NCCL_PROTO=Simple"],
                                         "nccl_evidence_check": "fail"})
    with pytest.raises(MeasurementRejected, match="NCCL_PROTO: NCCL in pid \\d+ .device 0. used 'Simple', "
                                                  "requested 'LL'") as e:
        run_trial(load_params(data=data), progress=False)
    ev = e.value.result
    assert e.value.check == "nccl_evidence" and isinstance(ev, NcclEvidence) and ev.ok is False
    assert [v.different for v in ev.variables.values()] and set(ev.variables["NCCL_PROTO"].different.values()) == {
        "Simple"}
    no_leftovers(port, [])


@pytest.mark.notebook
def test_notebook_02_runs_against_the_standin(tmp_path, port, write_params):
    params_file = write_params(standin_params(tmp_path, port))
    out = tmp_path / "out.ipynb"
    res = subprocess.run([sys.executable, "-m", "papermill", str(REPO / "notebooks" / "02_eagle3.ipynb"), str(out),
                          "-p", "params_file", str(params_file), "-p", "steps", "2", "-p", "repeats", "2",
                          "--cwd", str(REPO)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    nb = nbformat.read(out, as_version=4)
    text = "\n".join(json.dumps(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code")
    assert "engine `sglang`" in text and "all 5 requested variables present" in text
    m = manifest_json(only_run(tmp_path / "out"))
    assert m["status"] == "ok" and [a["name"] for a in m["arms"]] == ["baseline", "eagle3"]
    assert all(a["status"] == "ok" for a in m["arms"])



def test_native_generate_path_gives_per_request_spec_stats(tmp_path, port):
    """client_api native: the benchmark streams SGLang's /generate and reads meta_info per request."""
    data = standin_params(tmp_path, port, engine_config={"client_api": "native"})
    result = run_trial(load_params(data=data), progress=False)
    spec = result.requests[result.requests["arm"] == "eagle3"]
    assert len(spec) == 2 and spec["error"].isna().all()
    assert (spec["tokens"] == 32).all()
    stat_cols = [c for c in spec.columns if "verify" in c or "accept" in c]
    assert stat_cols and spec[stat_cols].notna().all().all(), stat_cols
    eagle = next(a for a in result.arms if a.name == "eagle3")
    assert eagle.status == "ok" and 1.0 < eagle.accept_len <= 3.0
    no_leftovers(port, [])


def test_synthetic_acceptance_is_forced_and_labelled(tmp_path, port):
    """synthetic_accept reaches SGLang as SGLANG_SIMULATE_ACC_LEN (verified in the scheduler by the probe), the
    window's counters measure the forced length, and the record labels the arm synthetic."""
    data = standin_params(tmp_path, port, repeats=2, arms=[{"name": "forced", "method": "eagle3",
                                                             "synthetic_accept": 0.9}])
    result = run_trial(load_params(data=data), progress=False)
    arm = result.arms[0]
    want = 1 + 0.9 + 0.81
    assert arm.synthetic and arm.synthetic_accept == 0.9
    assert arm.env["SGLANG_SIMULATE_ACC_LEN"] == f"{want:.6g}"
    assert arm.accept_len == pytest.approx(want, abs=0.35), arm.accept_len
    start = manifest_json(result.run_dir)["starts"][0]
    sched = [p for p in start["env_check"]["processes"] if any(a.startswith("sglang::scheduler") for a in p["cmdline"])]
    assert sched and all(p["verified_by"]["SGLANG_SIMULATE_ACC_LEN"] == "probe" for p in sched)
    no_leftovers(port, [])


BLIND = ["--standin-drop-worker-env", "NCCL_PROTO", "--standin-drop-worker-env", "PYTHONPATH"]  # workers spawned
# without NCCL_PROTO and without the probe's PYTHONPATH: renamed (setproctitle), so neither /proc nor the probe can
# see what they hold; NCCL's own lines (nccl_debug) show the variable did not reach them


def test_a_worker_that_lacks_nccl_variables_fails_a_multi_gpu_run_unless_told(tmp_path, port, write_params):
    """tp_size 2 with NCCL_* requested (issue 36): a worker that lacks NCCL_PROTO where nothing can verify it fails
    the run (the record says failed and why, exit 1); with env_check: warn, NCCL's own evidence fails it; with both
    relaxed it runs, and its headline says what was not verified."""
    def run(name: str, **over: Any) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]:
        data = standin_params(tmp_path / name, port, repeats=1, arms=[{"name": "baseline"}], **over)
        res = subprocess.run([*SPECTRIAL, "trial", str(write_params(data, f"{name}.yaml")), "--quiet"],
                             capture_output=True, text=True, timeout=300, cwd=REPO)
        run_dir = only_run(tmp_path / name / "out")
        return res, manifest_json(run_dir), run_dir

    res, m, _ = run("strict", engine_config={"extra_args": BLIND})
    assert res.returncode == 1, res.stderr[-3000:]
    assert m["status"] == "failed" and "env_check" in m["reason"], m["reason"]
    assert "NCCL_PROTO" in m["reason"] and "not verifiable in 3 of 5 server processes" in m["reason"]
    assert "needs them verified in every server process" in m["reason"]
    assert "hint: see the record's env_check per process; set env_check: warn" in res.stderr
    chk = m["starts"][0]["env_check"]
    assert chk["ok"] is False and not chk["unverified"]  # counted as a problem, not merely listed
    workers = [p for p in chk["processes"] if any(a.startswith("sglang::scheduler") for a in p["cmdline"])]
    assert len(workers) == 2 and all("NCCL_PROTO" in p["unverified"] and not p["probe"] for p in workers)

    res, m, _ = run("evidence", env_check="warn", engine_config={"extra_args": BLIND})
    assert res.returncode == 1, res.stderr[-3000:]
    assert m["status"] == "failed" and "NCCL did not use the requested values" in m["reason"], m["reason"]
    assert "NCCL_PROTO: NCCL in pid" in m["reason"] and "nccl_evidence_check: warn" in res.stderr

    res, m, run_dir = run("relaxed", env_check="warn", engine_config={"extra_args": BLIND,
                                                                       "nccl_evidence_check": "warn"})
    assert res.returncode == 0 and m["status"] == "ok", res.stderr[-3000:]
    from spectrial.readers.headline import headline
    from spectrial.record.store import load_record

    env = headline(load_record(run_dir)).environment or ""
    assert env.startswith("environment NOT verified: NCCL_* 0 of 4") and "in 5 server processes (1 start" in env
    assert "NCCL_PROTO" in env and "in 0 of 2 rank(s)" in env
    no_leftovers(port, [])


def test_the_headline_says_what_the_environment_check_verified(tmp_path, port):
    """tp_size 2, NCCL_* on the launch, NCCL's evidence on: every process verified (the renamed ones by the probe),
    and the headline (so report.html) says how many variables in how many processes, and what NCCL confirmed."""
    data = standin_params(tmp_path, port, repeats=1, arms=[{"name": "baseline"}])
    result = run_trial(load_params(data=data), progress=False)
    from spectrial.readers.headline import headline

    h = headline(result.manifest)
    assert h.environment == ("environment verified: NCCL_* 4 of 4, other variables 1 of 1 in 5 server processes "
                             "(1 start; by probe); NCCL's own log: all requested NCCL_* in 2 of 2 rank(s)")
    assert h.environment in h.text() and h.environment.replace("_", r"\_").replace("*", r"\*") in h.markdown()
    from spectrial.readers.render.report import headline_cells

    assert "environment verified: NCCL" in headline_cells(result.manifest)[0].source  # report.html opens with it
    no_leftovers(port, [])


def test_the_doctor_names_a_speculative_arm_that_ran_without_graphs_where_the_baseline_had_them(tmp_path, port):
    """Issue 39 item 5 on the SGLang double (real SGLang's decode lines, `cuda graph: True/False`): the EAGLE-3 arm
    launched with --disable-cuda-graph logs its decode intervals without graphs while the baseline's had them; the
    doctor counts both and calls it a cause of the cycle cost (critical), with the baseline's count beside."""
    from spectrial.readers.diagnose import diagnose

    data = standin_params(tmp_path, port, repeats=2, max_tokens=48,
                          arms=[{"name": "baseline"},
                                {"name": "eagle3", "method": "eagle3", "extra_args": ["--disable-cuda-graph"]}])
    data["engine_config"]["decode_log_interval"] = 4
    result = run_trial(load_params(data=data), progress=False)
    found = [f for f in diagnose(result.run_dir).of("cuda_graph") if f.arm == "eagle3" and "intervals" in f.title]
    assert len(found) == 1, [f.title for f in diagnose(result.run_dir).findings]
    (f,) = found
    assert f.severity == "critical" and "; the baseline: 0 of " in f.title, f.title
    assert f.detail.startswith("Speculation ran more of its steps without graphs than the baseline did")
    # the record's own figure per arm, from the decode lines inside its benchmark windows
    m = result.manifest
    assert m.arm("eagle3").graph_off_share == 1.0 and m.arm("baseline").graph_off_share == 0.0
    no_leftovers(port, [])


# issue 39 item 1: SGLang 0.5.17 resets max running requests to 48 for speculative decoding (the double does the
# same): read back from /server_info, it cannot hold 64 streams, and the arm fails before it is measured
def test_sglang_resetting_max_running_requests_below_the_concurrency_fails_the_arm(tmp_path, port):
    data = standin_params(tmp_path, port, concurrency=64, repeats=1, engine_config={"nccl_debug": False},
                          arms=[{"name": "eagle3", "method": "eagle3"}])
    with pytest.raises(MeasurementRejected, match=r"max running requests \(its own choice; the concurrency needs\): "
                                                  r"asked >= 64, resolved 48 \(GET /server_info max_running_requests\)"):
        run_trial(load_params(data=data), progress=False)
    m = manifest_json(only_run(tmp_path / "out"))
    got = {s["key"]: s for s in m["starts"][0]["config_check"]["settings"]}
    assert got["steps"]["state"] == "match" and got["draft_tokens"]["resolved"] == 3 and got["tp"]["resolved"] == 2
    assert got["method"]["resolved"] == "EAGLE3" and got["draft_model"]["state"] == "match"
