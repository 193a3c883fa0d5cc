"""The local Slurm cluster itself (tests/slurm_plugin.py): what Slurm 22.05 does here, which the Slurm executor
relies on. GPUs shared out, srun tasks, Slurm's own messages for requests it cannot satisfy, scancel, and a
slurmd that stops while a job runs (a time limit: tests/cluster/test_cluster_slurm.py, through a real unit). Every observation is printed (run with -s to read them)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from slurm_plugin import SlurmCluster

pytestmark = pytest.mark.slurm

T = TypeVar("T")
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")


def poll(fn: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """fn() until it returns something other than None/False; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def sbatch(cluster: SlurmCluster, *args: str) -> str:
    res = cluster.run("sbatch", "--parsable", *args)
    assert res.returncode == 0, f"sbatch {args} failed ({res.returncode}): {res.stderr}"
    return res.stdout.strip().split(";")[0]


def job_script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return path


def squeue_states(cluster: SlurmCluster) -> dict[str, str]:
    res = cluster.run("squeue", "-h", "-o", "%i %T")
    return dict(line.split() for line in res.stdout.splitlines() if line.strip())


def job_state(cluster: SlurmCluster, job_id: str) -> str:
    return cluster.job_fields(job_id).get("JobState", "GONE")


def wait_final(cluster: SlurmCluster, job_id: str, timeout: float) -> dict[str, str]:
    return poll(lambda: (f := cluster.job_fields(job_id)) and f.get("JobState") in FINAL_STATES and f,
                timeout, f"job {job_id} to end", interval=0.5)


def pid_alive(pid: int) -> bool:
    """A live process (zombies count as dead: orphans re-parented to a pid 1 that does not reap stay Z)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def read_pid(path: Path) -> int:
    """The pid a job script wrote with `echo $$ > FILE`: the file exists from the shell's truncation, a moment
    before the echo writes its line, so wait for the whole line."""
    text = poll(lambda: (t := path.read_text()).endswith("\n") and t, 10, f"a pid in {path}")
    return int(text.split()[0])


@pytest.fixture
def pids_to_reap() -> Iterator[list[int]]:
    """Pids a test saw started by its jobs; any still alive at the end are killed (SIGKILL, by pid)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_cluster_is_up(slurm: SlurmCluster) -> None:
    assert slurm.node_state() == "idle"
    node = slurm.run("scontrol", "show", "node", "-o", slurm.node).stdout
    assert "Gres=gpu:2" in node and f"CPUTot={slurm.cpus}" in node, node
    parts = slurm.run("sinfo", "-h", "-o", "%P %l %a").stdout.split("\n")
    assert f"{slurm.partition}* infinite up" in parts and f"{slurm.tiny_partition} 1:00 up" in parts, parts
    assert slurm.env["SLURM_CONF"] == str(slurm.conf) and "SLURM_CONF" not in os.environ


def test_two_gpu_jobs_share_the_node_with_their_own_gpu(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Two `-c1 --gres=gpu:1` jobs run at once, each with its own placeholder GPU in CUDA_VISIBLE_DEVICES."""
    script = job_script(tmp_path, r"""
env | grep -E '^(CUDA_VISIBLE_DEVICES|SLURM_JOB_GPUS|SLURM_STEP_GPUS|GPU_DEVICE_ORDINAL|SLURM_GPUS_ON_NODE)=' \
    | sort > "$1/env-$SLURM_JOB_ID.tmp" && mv "$1/env-$SLURM_JOB_ID.tmp" "$1/env-$SLURM_JOB_ID"
for _ in $(seq 600); do [ -e "$1/release" ] && exit 0; sleep 0.1; done
exit 3
""")
    jobs = [sbatch(slurm, "-c1", "--gres=gpu:1", "-o", str(tmp_path / "%j.out"), str(script), str(tmp_path))
            for _ in range(2)]
    both = poll(lambda: (q := squeue_states(slurm)) and all(q.get(j) == "RUNNING" for j in jobs) and q,
                30, "both GPU jobs RUNNING at the same time")
    print(f"\nsqueue while both run: {both}")
    envs = {}
    for j in jobs:
        f = poll(lambda j=j: (p := tmp_path / f"env-{j}").exists() and p, 30, f"job {j}'s environment")
        envs[j] = dict(line.split("=", 1) for line in f.read_text().splitlines())
        print(f"job {j} environment from Slurm: {envs[j]}")
    (tmp_path / "release").touch()
    for j in jobs:
        fields = wait_final(slurm, j, 30)
        assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), fields
    a, b = (envs[j] for j in jobs)
    assert a["SLURM_GPUS_ON_NODE"] == b["SLURM_GPUS_ON_NODE"] == "1"
    # no device cgroup here: indices are the node's (0 and 1), not renumbered to 0 inside each job
    assert {a["CUDA_VISIBLE_DEVICES"], b["CUDA_VISIBLE_DEVICES"]} == {"0", "1"}
    assert {a["SLURM_JOB_GPUS"], b["SLURM_JOB_GPUS"]} == {"0", "1"}
    assert all(e["CUDA_VISIBLE_DEVICES"] == e["SLURM_JOB_GPUS"] == e["GPU_DEVICE_ORDINAL"] for e in (a, b))


def test_srun_runs_two_tasks(slurm: SlurmCluster) -> None:
    res = slurm.run("srun", "-n2", "-c1", "bash", "-c", "echo $SLURM_PROCID/$SLURM_NTASKS/$SLURM_STEP_ID $$")
    assert res.returncode == 0, res.stderr
    lines = sorted(res.stdout.split("\n")[:-1])
    print(f"\nsrun -n2: {lines}")
    assert [line.split()[0] for line in lines] == ["0/2/0", "1/2/0"]
    assert lines[0].split()[1] != lines[1].split()[1]  # two processes


# (sbatch arguments, --test-only: (exit code, stderr), plain sbatch: (exit code, stderr) or the pending Reason)
# EnforcePartLimits is Slurm's default (NO): partition limits are not checked at submit; the job pends forever.
BAD_REQUESTS = {
    "unknown partition": (
        ["-p", "nosuch"],
        (1, "sbatch: error: invalid partition specified: nosuch\n"
            "allocation failure: Invalid partition name specified\n"),
        (1, "sbatch: error: invalid partition specified: nosuch\n"
            "sbatch: error: Batch job submission failed: Invalid partition name specified\n")),
    "unknown account (accounting none: accepted)": (
        ["-A", "nosuch"],
        (0, "sbatch: Job {job} to start at {time} using 1 processors on nodes {node} in partition debug\n"),
        "runs"),
    "more GPUs than the node has": (
        ["--gres=gpu:9"],
        (1, "allocation failure: Requested node configuration is not available\n"),
        (1, "sbatch: error: Batch job submission failed: Requested node configuration is not available\n")),
    "an unknown GRES": (
        ["--gres=nosuch:1"],
        (1, "sbatch: error: Invalid generic resource (gres) specification\n"),
        (1, "sbatch: error: Invalid generic resource (gres) specification\n")),
    "more nodes than exist": (
        ["-N", "2"],
        (1, "allocation failure: Requested node configuration is not available\n"),
        "PartitionNodeLimit"),
    "more CPUs than the node has": (
        ["-c", "999"],
        (1, "allocation failure: Requested node configuration is not available\n"),
        "PartitionConfig"),
    "a time over the partition's MaxTime": (
        ["-p", "tiny", "--time=2"],
        (0, "sbatch: Job {job} to start at {time} using 1 processors on nodes {node} in partition tiny\n"),
        "PartitionTimeLimit"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_slurm_messages_for_impossible_requests(slurm: SlurmCluster, case: str) -> None:
    """Slurm's exact words for requests it cannot satisfy, from `sbatch --test-only` and from a plain sbatch."""
    args, (test_rc, test_err), submit = BAD_REQUESTS[case]
    res = slurm.run("sbatch", "--test-only", *args, "--wrap", "true")
    print(f"\n{case}: sbatch --test-only {' '.join(args)} -> rc {res.returncode}, stderr {res.stderr!r}")
    if "{job}" in test_err:  # "Job 12 to start at 2026-12-02T13:55:33 ...": the id and time vary
        head, tail = test_err.split("{job}")[0], test_err.split("{time}")[1].format(node=slurm.node)
        assert res.returncode == test_rc and res.stderr.startswith(head) and res.stderr.endswith(tail), res.stderr
    else:
        assert (res.returncode, res.stderr) == (test_rc, test_err)
    res = slurm.run("sbatch", "--parsable", "-o", "/dev/null", *args, "--wrap", "sleep 1")
    print(f"{case}: sbatch {' '.join(args)} -> rc {res.returncode}, stdout {res.stdout!r}, stderr {res.stderr!r}")
    if isinstance(submit, tuple):
        assert (res.returncode, res.stdout, res.stderr) == (submit[0], "", submit[1])
        return
    assert res.returncode == 0 and res.stderr == "", res.stderr
    job = res.stdout.strip()
    if submit == "runs":
        assert wait_final(slurm, job, 30)["JobState"] == "COMPLETED"
        return
    time.sleep(3)  # several scheduler passes (sched_min_interval=2 s): it stays pending with the same reason
    squeue = slurm.run("squeue", "-h", "-j", job, "-o", "%T|%r").stdout.strip()
    print(f"{case}: squeue %T|%r -> {squeue}")
    assert squeue == f"PENDING|{submit}"


def test_scancel_sends_sigterm_and_detached_processes_escape(slurm: SlurmCluster, tmp_path: Path,
                                                            pids_to_reap: list[int]) -> None:
    """scancel: the batch script gets SIGTERM (its trap runs); its children die, also one in its own session
    (setsid) that is still its child; a process that detached (setsid -f: new session, parent gone) survives
    (proctrack/linuxproc follows the parent chain; a cgroup-tracked cluster would catch it)."""
    script = job_script(tmp_path, r"""
trap 'echo TERM > "$1/term"; exit 143' TERM
sleep 300 & echo $! > "$1/child"
setsid sleep 301 & echo $! > "$1/setsid_child"
setsid -f bash -c 'echo $$ > "$0/detached.tmp"; mv "$0/detached.tmp" "$0/detached"; exec sleep 302' "$1"
echo $$ > "$1/pid"
while true; do sleep 0.2; done
""")
    job = sbatch(slurm, "-c1", "-o", str(tmp_path / "out"), str(script), str(tmp_path))
    poll(lambda: all((tmp_path / f).exists() for f in ("pid", "child", "setsid_child", "detached")), 30,
         "the job's processes")
    pids = {name: read_pid(tmp_path / name) for name in ("pid", "child", "setsid_child", "detached")}
    pids_to_reap.extend(pids.values())
    sessions = {name: os.getsid(pid) for name, pid in pids.items()}
    print(f"\nscancel: job {job} processes {pids}, sessions {sessions}")
    t0 = time.monotonic()
    assert slurm.run("scancel", job).returncode == 0
    fields = wait_final(slurm, job, 30)
    gone = poll(lambda: job not in squeue_states(slurm), 30, "the job to leave squeue")
    elapsed = time.monotonic() - t0
    time.sleep(1)
    alive = {name: pid_alive(pid) for name, pid in pids.items()}
    print(f"scancel: {fields['JobState']} (ExitCode {fields.get('ExitCode')}) after {elapsed:.1f} s, out of "
          f"squeue: {gone}; trap file: {(tmp_path / 'term').exists()}; still alive: {alive}")
    assert fields["JobState"] == "CANCELLED"
    assert (tmp_path / "term").read_text().strip() == "TERM"
    assert alive == {"pid": False, "child": False, "setsid_child": False, "detached": True}


@pytest.mark.slow
def test_stopped_slurmd_fails_the_job_and_restart_cleans_up(slurm: SlurmCluster, tmp_path: Path,
                                                           pids_to_reap: list[int]) -> None:
    """slurmd stopped while two jobs run (one default, one --no-requeue): what squeue/scontrol say over time,
    whether the jobs' processes survive, and what a restarted slurmd does with them."""
    script = job_script(tmp_path, r"""
d="$1/$SLURM_JOB_ID"; mkdir -p "$d"
trap 'echo TERM >> "$d/term"; exit 143' TERM
echo $$ > "$d/pid"
while true; do date +%s > "$d/beat"; sleep 0.5; done
""")
    jobs = {"default": sbatch(slurm, "-c1", "-o", str(tmp_path / "%j.out"), str(script), str(tmp_path)),
            "no-requeue": sbatch(slurm, "-c1", "--no-requeue", "-o", str(tmp_path / "%j.out"), str(script),
                                 str(tmp_path))}
    pids = {k: read_pid(poll(lambda j=j: (p := tmp_path / j / "pid").exists() and p, 30, f"job {j}"))
            for k, j in jobs.items()}
    pids_to_reap.extend(pids.values())

    def snapshot(t0: float) -> tuple[float, str, dict[str, tuple[str, str, bool]]]:
        q = squeue_states(slurm)
        per_job = {}
        for k, j in jobs.items():
            f = slurm.job_fields(j)
            per_job[k] = (f"{q.get(j, '-')}/{f.get('JobState')}/{f.get('Reason')}", f.get("Restarts", "?"),
                          pid_alive(pids[k]))
        return round(time.monotonic() - t0, 1), slurm.node_state(), per_job

    def watch(t0: float, until: Callable[[dict[str, tuple[str, str, bool]], str], bool], timeout: float,
              log: list[object]) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            t, node, per_job = snapshot(t0)
            if (node, per_job) != last:  # only the changes
                log.append((t, node, per_job))
                print(f"  {t:5.1f} s node {node:10s} " + "  ".join(
                    f"{k}: squeue/scontrol/Reason {s}, restarts {r}, process {'alive' if a else 'gone'}"
                    for k, (s, r, a) in per_job.items()))
                last = (node, per_job)
            if until(per_job, node):
                return
            time.sleep(1)

    print(f"\nslurmd stop: jobs {jobs}, batch script pids {pids}")
    t0 = time.monotonic()
    slurm.stop_slurmd()
    before: list[object] = []
    watch(t0, lambda per_job, node: "NODE_FAIL" in per_job["no-requeue"][0] and node.startswith("down"), 60,
          before)
    t_down = time.monotonic() - t0
    _, node, per_job = snapshot(t0)
    print(f"slurmd stop: node {node} and the no-requeue job NODE_FAIL after {t_down:.1f} s")
    assert node.startswith("down") and "NODE_FAIL" in per_job["no-requeue"][0], per_job
    assert per_job["no-requeue"][2], "the job's processes survive a stopped slurmd (slurmstepd keeps them)"

    t1 = time.monotonic()
    state = slurm.start_slurmd()
    print(f"slurmd start: node {state} {time.monotonic() - t1:.1f} s after the restart")
    after: list[object] = []
    watch(t0, lambda per_job, node: not per_job["no-requeue"][2], 30, after)
    _, node, per_job = snapshot(t0)
    fields = slurm.job_fields(jobs["no-requeue"])
    default = slurm.job_fields(jobs["default"])
    terms = {k: (tmp_path / j / "term").exists() for k, j in jobs.items()}
    out = (tmp_path / f"{jobs['no-requeue']}.out").read_text().strip().splitlines()
    print(f"slurmd start: no-requeue job {fields.get('JobState')} ExitCode {fields.get('ExitCode')}, its output "
          f"{out}; default job requeued: {per_job['default'][0]}, Restarts {default.get('Restarts')}, "
          f"EligibleTime {default.get('EligibleTime')} (now {time.strftime('%H:%M:%S')}); SIGTERM trap ran: {terms}")
    assert fields["JobState"] == "NODE_FAIL"
    assert any("DUE TO NODE FAILURE" in line for line in out), out
    # the default (JobRequeue=1) puts a batch job back in the queue, to run again from the start
    assert default["JobState"] == "PENDING" and default["Restarts"] == "1"
    # the restarted slurmd kills what is left of both jobs (the controller ended or requeued them)
    assert not per_job["no-requeue"][2] and not per_job["default"][2]
