"""Trials and sweeps fanned out over a real local Slurm cluster (tests/slurm_plugin.py: slurmctld + slurmd +
munged, 2 CPUs, 2 placeholder GPUs) with real llama-server units: the answer, the units in parallel, and the
faults (scancel, a time limit, a job that cannot start, bad input, Ctrl-C of the controller): each leaves a
failed unit record that says why, nothing running, and a merged record that names what is missing."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from spectrial.record.store import load_record
from spectrial.servers.lifecycle import TAG_VAR

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]
REPO = Path(__file__).resolve().parents[2]


def leftovers(run_id: str) -> list[str]:
    """Processes a run (or its units: run ids that start with it) left behind, by their spectrial tag."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE and str(p.environ().get(TAG_VAR, "")).startswith(run_id):
                out.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:200]}")
    return out


def cluster_params(tiny_params: dict[str, Any], **cluster: Any) -> dict[str, Any]:
    slurm = {"time_limit": "10", "gpus_per_unit": 1, "poll_s": 0.5, **cluster.pop("slurm", {})}
    return {**tiny_params, "cluster": {"executor": "slurm", "units": 2, "max_parallel": 2, **cluster,
                                       "slurm": slurm}}


def start(path: Path, cluster, *extra: str, kind: str = "trial") -> subprocess.Popen[str]:
    return subprocess.Popen([*SPECTRIAL, kind, str(path), *extra], cwd=REPO, env=cluster.env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def merged(out: Path) -> Any:
    (run,) = [p for p in out.iterdir() if "cluster" in p.name and (p / "manifest.json").is_file()]
    return load_record(run, settle=False), run


def wait_running(cluster, n: int = 1, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = cluster.run("squeue", "-h", "-t", "RUNNING", "-o", "%i")
        jobs = res.stdout.split()
        if len(jobs) >= n:
            return sorted(jobs, key=int)
        time.sleep(0.3)
    raise AssertionError(f"fewer than {n} jobs running after {timeout} s: {cluster.run('squeue').stdout}")


def wait_units_started(out: Path, n: int, timeout: float = 120) -> None:
    """Until `n` units' records show a server start begun (a fixed sleep after RUNNING was not enough on a loaded
    machine: a unit's Python had not written its record yet when the fault came, so there was no record to fail)."""
    deadline = time.monotonic() + timeout
    begun = 0
    while time.monotonic() < deadline:
        begun = 0
        for f in out.glob("*/units/*/manifest.json"):
            with contextlib.suppress(OSError, ValueError):  # a record being written: read it next time
                begun += bool(json.loads(f.read_text()).get("starts"))
        if begun >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"{begun} of {n} units began a server start within {timeout} s")


def test_a_trial_runs_as_two_parallel_units_each_with_its_own_baseline(slurm, tiny_params, write_params, tmp_path):
    path = write_params(cluster_params(tiny_params))
    proc = start(path, slurm)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    m, run = merged(tmp_path / "outputs")
    c = m.cluster
    assert m.kind == "cluster-trial" and m.status == "ok" and c is not None and c.executor == "slurm"
    assert [u.state for u in c.units] == ["ok", "ok"] and [u.arms for u in c.units] == [["draft"], ["eagle3"]]
    jobs, gpus = set(), set()
    for u in c.units:
        um = load_record(run / "units" / u.run_id)
        assert um.status == "ok" and [a.name for a in um.arms] == ["baseline", *u.arms]  # its own baseline
        job = um.controller.job
        assert job is not None and job.job_id == u.job_id and job.node == slurm.node == u.host
        assert job.partition == slurm.partition and job.unit == u.name
        jobs.add(job.job_id)
        gpus.add(job.gpus)
        arm = um.arm(u.arms[0])
        comp = next(x for x in c.comparisons if x.unit == u.name)
        assert (comp.speedup, comp.speedup_ci_low, comp.verdict) == (arm.speedup, arm.speedup_ci_low, arm.verdict)
    assert len(jobs) == 2 and len(gpus) == 2, "each unit its own job and its own GPU (CUDA_VISIBLE_DEVICES)"
    assert sorted(p.arm for p in c.pooled) == ["draft", "eagle3"] and c.comparable and not c.missing
    assert (c.unit_s or 0) > (c.wall_s or 0) * 1.2, "the two units did not overlap in time"
    assert "cluster-trial" in out and "u0 ok" in out and "u1 ok" in out
    assert not leftovers(m.run_id) and not slurm.job_ids()


def _sweep(tiny_params: dict[str, Any], units: int, strategy: str = "grid") -> dict[str, Any]:
    p = {k: v for k, v in tiny_params.items() if k not in ("arms", "draft")}
    return {**p, "draft": "tiny:eagle3", "method": "eagle3", "repeats": 4, "max_tokens": 32,
            "engine_config": {"threads": 1, "ctx_size": 1024},
            "grid": {"steps": [1, 4] if strategy == "grid" else [1, 2, 4],
                     "synthetic_accept": [0.1, 0.9] if strategy == "grid" else [0.9]},
            "strategy": strategy,
            "cluster": {"executor": "slurm", "units": units, "max_parallel": units,
                        "slurm": {"time_limit": "10", "poll_s": 0.5}}}


def test_a_grid_sweep_over_two_units_finds_the_same_best_as_over_one(slurm, tiny_params, write_params, tmp_path):
    best = {}
    for units in (1, 2):
        out = tmp_path / f"out{units}"
        path = write_params({**_sweep(tiny_params, units), "output_dir": str(out)}, f"sweep{units}.yaml")
        proc = start(path, slurm, kind="sweep")
        stdout, stderr = proc.communicate(timeout=400)
        assert proc.returncode == 0, stdout + stderr
        m, _ = merged(out)
        states = [(u.name, u.state, u.reason) for u in m.cluster.units]
        assert m.kind == "cluster-sweep" and m.status == "ok" and len(m.cluster.units) == units, (
            m.status, m.reason, states, m.cluster.missing, stdout + stderr)
        assert sorted(a for u in m.cluster.units for a in u.arms) == [
            "eagle3-s1-a0.1", "eagle3-s1-a0.9", "eagle3-s4-a0.1", "eagle3-s4-a0.9"]
        for b in m.best:
            pt = next(p for p in m.points if p.arm == b.best)
            assert b.tok_s == pt.tok_s and b.speedup == pt.speedup and b.unit == pt.unit  # one number, one place
            ok = [p for p in m.points if p.scenario == b.scenario and p.status == "ok" and p.method != "none"]
            assert b.speedup == max(p.speedup or 0 for p in ok), "the best is the highest speed-up measured"
        best[units] = {b.scenario: b.best for b in m.best}
        acc = {p.arm: p.accept_len for p in m.points}
        # synthetic acceptance per token: expected tokens a cycle 1 + 0.9 = 1.9 at depth 1, 1 + 0.9 + ... + 0.9^4
        # = 4.1 at depth 4 (cut by the 32-token end); at 0.1 both ~1.1
        assert acc["eagle3-s4-a0.9"] > 3.0 and 1.7 < acc["eagle3-s1-a0.9"] <= 2, acc
        print(f"{units} unit(s): best {best[units]}, speed-ups "
              f"{ {p.arm: round(p.speedup or 0, 3) for p in m.points} }, wall {m.cluster.wall_s} s")
    # at acceptance 0.1 depth 4 drafts three more tokens a cycle that are almost never kept: x0.28-0.37 against
    # x0.45-0.63 for depth 1 on this CPU (a decisive truth, over one unit or two). At 0.9 depth 4 is ahead by
    # x1.1-1.4 but the tiny draft costs about what the target does, so the two intervals can overlap: the test
    # asks only that the best there be the highest speed-up measured (above). benchmarks/bench_cluster.py: wall times
    assert best[1][0.1] == best[2][0.1] == "eagle3-s1-a0.1", best


def test_a_guided_sweep_asks_the_search_whenever_a_unit_is_free(slurm, tiny_params, write_params, tmp_path):
    path = write_params(_sweep(tiny_params, 2, "guided"), "guided.yaml")
    proc = start(path, slurm, kind="sweep")
    stdout, stderr = proc.communicate(timeout=400)
    assert proc.returncode == 0, stdout + stderr
    m, _ = merged(tmp_path / "outputs")
    phases = [d.phase for d in m.decisions]
    assert phases[0] == "probe" and phases[-1] == "stop", phases
    measured = [a for u in m.cluster.units for a in u.arms]
    assert len(measured) == len(set(measured)), "a setting in flight counts as tried: never measured twice"
    (b,) = [b for b in m.best if b.scenario == 0.9]
    # acceptance 0.9 per token: a cycle yields at most 2 tokens at depth 1, 2.71 expected at depth 2, 4.10 at 4,
    # but the tiny draft costs about what the target does, so on 2 shared cores any depth can come out ahead
    # (the grid test above holds the decisive truth at acceptance 0.1): the best is the measured fastest
    assert b.best in measured, (b.best, [(p.arm, p.speedup) for p in m.points])
    ok = [p for p in m.points if p.scenario == 0.9 and p.status == "ok" and p.method != "none"]
    assert b.speedup == max(p.speedup or 0 for p in ok), "across units the best is the highest speed-up measured"
    assert not slurm.job_ids()


def test_scancel_of_a_unit_leaves_its_record_failed_and_the_merge_naming_what_is_missing(
        slurm, tiny_params, write_params, tmp_path):
    path = write_params(cluster_params({**tiny_params, "repeats": 30, "max_tokens": 48}))
    proc = start(path, slurm)
    first = wait_running(slurm, 2)[0]
    wait_units_started(tmp_path / "outputs", 2)  # inside the unit's run (its servers up)
    time.sleep(1)
    slurm.run("scancel", first, check=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err  # a trial with an arm missing did not answer its question
    m, run = merged(tmp_path / "outputs")
    u = next(u for u in m.cluster.units if u.job_id == first)
    assert u.state == "cancelled" and u.scheduler_state == "CANCELLED", u
    um = load_record(run / "units" / u.run_id)
    assert um.status == "failed" and "interrupted by SIGTERM" in (um.reason or ""), um.reason
    assert m.status == "partial" and any(u.arms[0] in x and "cancelled" in x for x in m.cluster.missing)
    other = next(x for x in m.cluster.units if x is not u)
    assert other.state == "ok", "the other unit goes on (on_unit_failure: continue)"
    assert not leftovers(m.run_id) and not slurm.job_ids()


def test_a_unit_over_its_time_limit_is_stopped_by_slurm_and_says_so(slurm, tiny_params, write_params, tmp_path):
    p = cluster_params({**tiny_params, "repeats": 400, "max_tokens": 64}, units=1, max_parallel=1,
                       slurm={"time_limit": "1", "partition": slurm.tiny_partition})
    proc = start(write_params(p), slurm)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    m, run = merged(tmp_path / "outputs")
    (u,) = m.cluster.units
    assert u.state == "timeout" and u.scheduler_state == "TIMEOUT", u
    um = load_record(run / "units" / u.run_id)
    assert um.status == "failed" and "interrupted by SIGTERM" in (um.reason or ""), um.reason
    assert m.status == "failed" and m.cluster.missing
    assert not leftovers(m.run_id) and not slurm.job_ids()


def test_a_unit_that_cannot_start_fails_with_slurms_reason_not_a_hang(slurm, tiny_params, write_params, tmp_path):
    # somebody else's job holds both GPUs for 12 s: the units pend (Resources) past pending_timeout_s. It ends
    # by itself (on this one-node cluster a running batch job cancelled by scancel sometimes leaves the node
    # `mixed`: slurmctld never hears that its epilog completed)
    other = slurm.run("sbatch", "--parsable", "--gres=gpu:2", "-c", "1", "-o", str(tmp_path / "other.out"),
                      "--wrap", "exec sleep 12", check=True)
    other_id = other.stdout.strip().split(";")[0]
    wait_running(slurm, 1)
    p = cluster_params(tiny_params, slurm={"pending_timeout_s": 4})
    proc = start(write_params(p), slurm)
    out, err = proc.communicate(timeout=120)
    deadline = time.monotonic() + 30
    while other_id in slurm.job_ids() and time.monotonic() < deadline:
        time.sleep(0.5)
    while "IDLE" not in slurm.run("scontrol", "show", "node", "--oneliner").stdout and time.monotonic() < deadline:
        time.sleep(0.5)
    m, _ = merged(tmp_path / "outputs")
    assert [u.state for u in m.cluster.units] == ["pending_timeout", "pending_timeout"], (out, err)
    for u in m.cluster.units:  # the first waits for the GPUs, the second behind it
        assert "pending" in (u.reason or "") and ("Resources" in u.reason or "Priority" in u.reason), u.reason
    assert "Resources" in (m.cluster.units[0].reason or "")
    assert m.status == "failed" and len(m.cluster.missing) == 2 and "Resources" in m.cluster.missing[0]
    assert proc.returncode == 1 and "Resources" in err



def test_on_unit_failure_stop_cancels_the_rest(slurm, tiny_params, write_params, tmp_path):
    arms = [{"name": "baseline"}, {"name": "draft", "method": "draft", "extra_args": ["--no-such-flag"]},
            {"name": "eagle3", "method": "eagle3", "draft": "tiny:eagle3", "synthetic_accept": 0.8}]
    p = cluster_params({**tiny_params, "arms": arms}, max_parallel=1, on_unit_failure="stop")
    proc = start(write_params(p), slurm)
    out, err = proc.communicate(timeout=200)
    assert proc.returncode == 1, out + err
    m, _ = merged(tmp_path / "outputs")
    u0, u1 = m.cluster.units
    assert u0.state == "failed" and "--no-such-flag" in (u0.reason or "") or "draft" in (u0.reason or ""), u0
    assert u1.state == "not run" and "on_unit_failure: stop" in (u1.reason or ""), u1
    assert u1.job_id is None, "the unit after the failure was never submitted"
    assert [x.split(" (")[0] for x in m.cluster.missing] == ["draft", "eagle3"]


@pytest.mark.parametrize(("slurm_opts", "param", "said"), [
    ({"partition": "nosuch"}, "cluster.slurm.partition", "invalid partition"),
    ({"gpus_per_unit": 9}, "cluster.slurm.gpus_per_unit", "Requested node configuration is not available"),
    ({"nodes_per_unit": 2}, "cluster.slurm.nodes_per_unit", "node"),
    ({"time_limit": "5", "partition": "tiny"}, "cluster.slurm.time_limit", "time limit"),
    ({"gpus_per_unit": 2}, "cluster.max_parallel", "holds at most 1"),
])
def test_bad_slurm_input_is_refused_before_anything_is_submitted(slurm, tiny_params, write_params, tmp_path,
                                                                  slurm_opts, param, said):
    before = slurm.run("squeue", "-h", "-o", "%i").stdout.split()
    proc = start(write_params(cluster_params(tiny_params, slurm=slurm_opts)), slurm)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, out + err
    assert param in err and said.lower() in err.lower(), err
    assert slurm.run("squeue", "-h", "-o", "%i").stdout.split() == before
    m, run = merged(tmp_path / "outputs")
    assert m.status == "failed" and param in (m.reason or "")
    assert not any((run / "units").glob("*/manifest.json")), "a unit record was written: something ran"


def test_ctrl_c_of_the_controller_cancels_every_unit(slurm, tiny_params, write_params, tmp_path):
    path = write_params(cluster_params({**tiny_params, "repeats": 30, "max_tokens": 48}))
    proc = start(path, slurm)
    wait_running(slurm, 2)
    wait_units_started(tmp_path / "outputs", 2)
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    m, run = merged(tmp_path / "outputs")
    assert m.status == "failed" and "interrupted by Ctrl-C" in (m.reason or "")
    for u in m.cluster.units:
        assert u.state == "cancelled", u
        um = json.loads((run / "units" / u.run_id / "manifest.json").read_text())
        assert um["status"] == "failed" and "interrupted by SIGTERM" in um["reason"], um["reason"]
    assert not slurm.job_ids() and not leftovers(m.run_id)


def test_a_node_that_fails_mid_unit_fails_the_unit_and_nothing_is_left_once_it_returns(
        slurm, tiny_params, write_params, tmp_path):
    p = cluster_params({**tiny_params, "repeats": 300, "max_tokens": 48}, units=1, max_parallel=1)
    proc = start(write_params(p), slurm)
    wait_running(slurm, 1)
    wait_units_started(tmp_path / "outputs", 1)
    time.sleep(1)
    slurm.stop_slurmd()  # the node stops answering; its processes go on for now (linuxproc, no slurmd)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, out + err
    m, run = merged(tmp_path / "outputs")
    (u,) = m.cluster.units
    assert u.state == "node_fail" and u.scheduler_state == "NODE_FAIL", u
    assert "node stopped answering" in (u.reason or "") and m.status == "failed" and m.cluster.missing
    slurm.start_slurmd()  # the node is back: Slurm stops the job's orphans (SIGTERM), the unit writes its record
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (leftovers(m.run_id) or
                                           load_record(run / "units" / u.run_id, settle=False).status == "running"):
        time.sleep(0.5)
    um = load_record(run / "units" / u.run_id, settle=False)
    assert um.status == "failed" and "interrupted by SIGTERM" in (um.reason or ""), (um.status, um.reason)
    assert not leftovers(m.run_id)
