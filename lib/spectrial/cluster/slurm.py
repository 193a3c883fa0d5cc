"""Slurm as an executor: one `sbatch` job per unit, tracked with `squeue` / `scontrol`, cancelled with `scancel`.

Slurm does the resource management: the unit's job asks for its CPUs, GPUs (`--gres=gpu:N`; Slurm sets
CUDA_VISIBLE_DEVICES), nodes and time; the batch script `exec`s the unit's spectrial command, so that Slurm's
signals reach it directly: `scancel` and a time limit send SIGTERM (then SIGKILL after KillWait), which the unit
handles as Ctrl-C (servers stopped, record failed and why). Nothing here ssh-es to a node.

Bad input is refused before anything is submitted: `sbatch --test-only` with the unit's own options quotes
Slurm's words for an unknown partition, account or QOS, a GRES or node count no node has, a time limit over
the partition's. Accounting storage is not assumed (`sacct` needs slurmdbd): a finished job is read with
`scontrol show job` (kept for MinJobAge seconds), and a unit's own record says how it ended when Slurm has
forgotten.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from spectrial.cluster.executor import JobState, UnitJob
from spectrial.errors import ConfigError, HostError
from spectrial.params.cluster import ClusterParams

# Pending reasons that no amount of waiting resolves (Slurm's squeue %r): the unit fails at once, with the reason.
NEVER_RUNS = ("PartitionTimeLimit", "PartitionNodeLimit", "BadConstraints", "InvalidAccount", "InvalidQOS",
              "AccountNotAllowed", "QOSNotAllowed", "PartitionConfig", "ReqNodeNotAvail, UnavailableNodes",
              "Nodes_required_for_job_are_DOWN")
_KV = re.compile(r"(\w+)=(\S*)")
_WORDS = {"partition": "partition", "account": "account", "qos": "qos", "gres": "gpus_per_unit",
          "generic resource": "gpus_per_unit", "time limit": "time_limit", "node count": "nodes_per_unit",
          "node configuration": "gpus_per_unit / cpus_per_unit / nodes_per_unit", "memory": "mem"}


def parameter_of(message: str) -> str:
    """The cluster.slurm parameter Slurm's message is about (its best guess; the message itself is quoted)."""
    low = message.lower()
    return "cluster.slurm." + next((p for w, p in _WORDS.items() if w in low), "sbatch_options")


def scontrol_fields(text: str) -> dict[str, str]:
    """`scontrol show ... -o` output (KEY=VALUE pairs on one line) as a mapping."""
    return {k: v for k, v in _KV.findall(text)}


def _duration_s(text: str | None) -> float | None:
    """Slurm's [D-]HH:MM:SS (or MM:SS) as seconds."""
    if not text:
        return None
    days, _, rest = text.rpartition("-")
    parts = [float(x) for x in rest.split(":") if x]
    s = 0.0
    for x in parts:
        s = s * 60 + x
    return s + (int(days) * 86400 if days else 0)


class SlurmExecutor:
    """`cluster.executor: slurm`: each unit one sbatch job with `cluster.slurm`'s resources."""

    name = "slurm"

    def __init__(self, cluster: ClusterParams, env: Mapping[str, str] | None = None) -> None:
        self.opts = cluster.slurm
        self.max_parallel = cluster.max_parallel
        self.env = dict(os.environ if env is None else env)
        self.jobs: dict[str, UnitJob] = {}
        self.cancelled: dict[str, str] = {}
        self.last: dict[str, JobState] = {}

    @property
    def slots(self) -> int:
        return self.max_parallel

    # --- Slurm's commands ------------------------------------------------------------------------------
    def _cmd(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        if shutil.which(argv[0], path=self.env.get("PATH")) is None:
            raise ConfigError(f"cluster.executor: slurm, but {argv[0]} is not on PATH on this machine; run "
                              "spectrial on a Slurm login node (or a host with the Slurm client commands and "
                              "SLURM_CONF), or use executor: pool", parameter="cluster.executor")
        try:
            return subprocess.run(list(argv), env=self.env, text=True, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise HostError("local", shlex.join(argv), None, hint="slurmctld did not answer in time: check "
                                                                   "`scontrol ping`") from exc

    def sbatch_options(self) -> list[str]:
        o = self.opts
        # --no-requeue: a unit whose node fails is over (NODE_FAIL, its record says so), not silently started
        # again minutes later from the beginning while the merged record has moved on
        out = ["--time", o.time_limit, "--cpus-per-task", str(o.cpus_per_unit), "--nodes", str(o.nodes_per_unit),
               "--no-requeue"]
        if o.partition:
            out += ["--partition", o.partition]
        if o.account:
            out += ["--account", o.account]
        if o.qos:
            out += ["--qos", o.qos]
        if o.gres or o.gpus_per_unit:
            out += ["--gres", o.gres or f"gpu:{o.gpus_per_unit}"]
        if o.mem:
            out += ["--mem", o.mem]
        if o.nodes_per_unit > 1:
            out += ["--ntasks-per-node", "1"]
        return out + list(o.sbatch_options)

    def script(self, unit: UnitJob) -> Path:
        """The unit's batch script (kept beside its log: what ran is on disk)."""
        path = unit.log_path.with_suffix(".sbatch")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.script_text(unit))
        return path

    def script_text(self, unit: UnitJob) -> str:
        """The unit's batch script's text (what `script` writes; the dry run shows it)."""
        env = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in unit.env.items())
        python = shlex.quote(self.opts.python or sys.executable)
        # several units may share a node: each takes a port free there (a fixed one could be anybody's)
        port = "" if self.opts.nodes_per_unit > 1 else (
            f"PORT=$({python} -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); "
            f"print(s.getsockname()[1])')\n")
        # several nodes: the head is this batch node, the others its allocation's, reached with srun
        nodes = "" if self.opts.nodes_per_unit < 2 else (
            'NODES=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))\n'
            'HOSTS="[local"; for n in "${NODES[@]:1}"; do HOSTS="$HOSTS, srun:$n"; done; HOSTS="$HOSTS]"\n')
        return ("#!/bin/bash\n"
                f"# spectrial unit {unit.name} ({unit.kind} of {', '.join(unit.arms)})\n"
                f"{env}{port}{nodes}exec {unit.shell(self.opts.python)}"
                + (' -p "port=$PORT"' if port else "") + (' -p "hosts=$HOSTS"' if nodes else "") + "\n")

    def kill_wait_s(self) -> float | None:
        """Slurm's KillWait: the seconds between SIGTERM and SIGKILL on scancel or a time limit."""
        res = self._cmd("scontrol", "show", "config")
        m = re.search(r"^KillWait\s*=\s*(\d+)", res.stdout, re.M)
        return float(m.group(1)) if m else None

    # --- the executor ----------------------------------------------------------------------------------
    def check(self, units: list[UnitJob]) -> list[str]:
        """`sbatch --test-only` with the units' options: Slurm's refusal, quoted, as a ConfigError (nothing is
        submitted); the notes say when units will queue."""
        if not units:
            return []
        self._check_partition()
        res = self._cmd("sbatch", "--test-only", *self.sbatch_options(), str(self.script(units[0])))
        if res.returncode != 0:
            said = (res.stderr or res.stdout).strip()
            param = parameter_of(said)
            raise ConfigError(f"{param}: Slurm refuses the unit's job (nothing was submitted): {said}",
                              parameter=param, hint="check the partition, account, GRES and time limit with "
                                                    "`sinfo -s` and `scontrol show partition`")
        self._check_capacity()
        return [f"{len(units)} units, at most {self.slots} at once: the rest queue"] \
            if len(units) > self.slots else []

    def capacity(self) -> tuple[int, str]:
        """How many units the partition holds at once when nothing else runs (per node: its CPUs over
        cpus_per_unit, its GPUs over gpus_per_unit; nodes_per_unit such nodes a unit), and the nodes it read."""
        o = self.opts
        res = self._cmd("sinfo", "--noheader", "--Node", "--format", "%N|%c|%G|%P",
                        *(["--partition", o.partition] if o.partition else []))
        fits, seen = 0, []
        for line in res.stdout.splitlines():
            name, cpus, gres, part = (line.split("|") + ["", "", "", ""])[:4]
            if not o.partition and not part.endswith("*"):
                continue  # the default partition's nodes only
            gpus = sum(int(m.group(1)) for m in re.finditer(r"gpu(?::[^:,(]+)?:(\d+)", gres))
            n = int(cpus) // o.cpus_per_unit if cpus.isdigit() else 0
            if o.gpus_per_unit:
                n = min(n, gpus // o.gpus_per_unit)
            fits += n
            seen.append(f"{name}: {cpus} CPUs, {gres}")
        return fits // o.nodes_per_unit if o.nodes_per_unit > 1 else fits, "; ".join(dict.fromkeys(seen))

    def _check_capacity(self) -> None:
        """More units at once than the partition can ever hold would pend past pending_timeout_s: refused."""
        fits, nodes = self.capacity()
        if nodes and self.max_parallel > fits > 0:
            raise ConfigError(f"cluster.max_parallel: {self.max_parallel} units at once, but the partition holds "
                              f"at most {fits} such units ({self.opts.cpus_per_unit} CPUs, {self.opts.gpus_per_unit} "
                              f"GPUs, {self.opts.nodes_per_unit} node(s) each; sinfo: {nodes}); lower max_parallel "
                              f"to {fits} (the other units then queue in spectrial, not in Slurm)",
                              parameter="cluster.max_parallel")

    def _check_partition(self) -> None:
        """What `sbatch --test-only` lets through but never runs (the job would pend for good with reason
        PartitionConfig / PartitionTimeLimit): a time limit over the partition's MaxTime, more nodes than it has."""
        res = self._cmd("scontrol", "show", "partition", "--oneliner", *([self.opts.partition] if self.opts.partition
                                                                          else []))
        parts = [scontrol_fields(line) for line in res.stdout.splitlines() if "PartitionName=" in line]
        part = next((f for f in parts if self.opts.partition is None and f.get("Default") == "YES"
                     or f.get("PartitionName") == self.opts.partition), None)
        if res.returncode != 0 or part is None:
            return  # sbatch --test-only says what is wrong with the partition
        name, max_time = part.get("PartitionName"), part.get("MaxTime", "UNLIMITED")
        limit = self.opts.time_limit_seconds()
        most = _duration_s(max_time) if max_time not in ("UNLIMITED", "INFINITE", "NONE") else None
        if most is not None and limit > most:
            raise ConfigError(f"cluster.slurm.time_limit: {self.opts.time_limit!r} ({limit} s) is over partition "
                              f"{name}'s time limit MaxTime={max_time} (scontrol show partition {name}); a job "
                              "asking more pends for good (Reason=PartitionTimeLimit): lower it or choose another "
                              "partition", parameter="cluster.slurm.time_limit")
        nodes = part.get("TotalNodes", "")
        if nodes.isdigit() and self.opts.nodes_per_unit > int(nodes):
            raise ConfigError(f"cluster.slurm.nodes_per_unit: {self.opts.nodes_per_unit} but partition {name} has "
                              f"{nodes} node(s) (scontrol show partition {name})",
                              parameter="cluster.slurm.nodes_per_unit")

    def submit(self, unit: UnitJob) -> str:
        unit.log_path.parent.mkdir(parents=True, exist_ok=True)
        res = self._cmd("sbatch", "--parsable", "--job-name", f"spectrial-{unit.run_id}", "--output",
                        str(unit.log_path), "--open-mode", "append", *self.sbatch_options(), str(self.script(unit)))
        if res.returncode != 0:
            said = (res.stderr or res.stdout).strip()
            param = parameter_of(said)
            raise ConfigError(f"{param}: sbatch refused unit {unit.name}: {said}", parameter=param)
        job = res.stdout.strip().split(";")[0]
        self.jobs[job] = unit
        return job

    def poll(self, handle: str) -> JobState:
        res = self._cmd("squeue", "--noheader", "--jobs", handle, "--format", "%T|%r|%N|%M")
        line = res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else ""
        if line:
            state, reason, nodes, used = (line.split("|") + ["", "", "", ""])[:4]
            if state in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "SUSPENDED"):
                st = JobState("pending", state, reason=reason or None)
            elif state in ("RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"):
                st = JobState("running", state, reason=reason if reason not in ("None", "") else None,
                              host=nodes or None, elapsed_s=_duration_s(used))
            else:
                st = self._finished(handle) or JobState("done", state, reason=reason or None, host=nodes or None)
        else:
            st = self._finished(handle) or JobState("done", None, reason="Slurm no longer knows the job "
                                                                       "(MinJobAge passed)")
        if st.phase == "done" and st.host is None and handle in self.last:
            st.host = self.last[handle].host
        self.last[handle] = st
        return st

    def _finished(self, handle: str) -> JobState | None:
        res = self._cmd("scontrol", "show", "job", "--oneliner", handle)
        if res.returncode != 0 or "JobState=" not in res.stdout:
            return None
        f = scontrol_fields(res.stdout)
        state = f.get("JobState", "")
        if state in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
            phase = "pending" if state in ("PENDING", "CONFIGURING") else "running"
            return JobState(phase, state, reason=f.get("Reason"), host=f.get("NodeList") or None,  # type: ignore[arg-type]
                            elapsed_s=_duration_s(f.get("RunTime")))
        code, _, sig = f.get("ExitCode", "").partition(":")
        exit_code = int(code) if code.isdigit() else None
        if sig.isdigit() and int(sig):
            exit_code = -int(sig)
        reason = f.get("Reason") if f.get("Reason") not in (None, "", "None") else None
        return JobState("done", state, reason=self.cancelled.get(handle) or reason,
                        host=f.get("NodeList") or f.get("BatchHost") or None, exit_code=exit_code,
                        elapsed_s=_duration_s(f.get("RunTime")))

    def cancel(self, handle: str, why: str) -> None:
        """`scancel`: Slurm sends SIGTERM to the unit (which stops its servers and writes its record), SIGKILL
        after KillWait."""
        if handle in self.cancelled:
            return
        self.cancelled[handle] = why
        self._cmd("scancel", handle)

    def close(self) -> None:
        for handle in self.jobs:
            st = self.last.get(handle)
            if st is None or st.phase != "done":
                self.cancel(handle, "the cluster run ended")

    @staticmethod
    def never_runs(reason: str | None) -> bool:
        return bool(reason) and any(reason.startswith(r) for r in NEVER_RUNS)  # type: ignore[union-attr]


def wait(executor: SlurmExecutor, handle: str, timeout_s: float, poll_s: float = 1.0) -> JobState:
    """Poll one job until it is done (tests, tools)."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = executor.poll(handle)
        if st.phase == "done" or time.monotonic() > deadline:
            return st
        time.sleep(poll_s)
