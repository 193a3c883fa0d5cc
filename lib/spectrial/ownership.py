"""Who owns a run, and is it still alive: the controller identity every run record and every process spectrial
starts carries, so that nothing it started can outlive it unseen.

The controller is the spectrial process that drives a run: this machine's host name and boot id, its pid and
its start time. It goes into

- the run record (`Manifest.controller`): a record still `running` whose controller is gone was abandoned (a
  SIGKILL, a dead kernel, a killed papermill); `records.settle_record` marks it `failed` ("abandoned: process N gone") the next
  time spectrial reads it;
- the server's state file and the environment of every process spectrial launches (`SPECTRIAL_OWNER`, beside the
  start's `SPECTRIAL_TAG`): the kill step stops a leftover whose controller is gone, and refuses to touch one whose
  controller is alive (another run still using the port), naming that run and its pid.

A controller on another machine cannot be checked from here (`unknown`): its leftovers are refused unless the
trial says `takeover: true`.
"""

from __future__ import annotations

import functools
import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import psutil

from spectrial.schema import Controller, SchedulerJob

OWNER_VAR = "SPECTRIAL_OWNER"
State = Literal["alive", "gone", "self", "unknown"]
_TIME_SLACK_S = 0.05  # psutil's create_time is rounded to clock ticks


@functools.lru_cache(maxsize=1)
def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def controller() -> Controller:
    """This process as a run's controller: host name, boot id, pid, start time (s since the epoch), command."""
    p = psutil.Process()
    return Controller(host=socket.gethostname(), boot_id=boot_id(), pid=os.getpid(),
                      create_time=round(p.create_time(), 2), command=" ".join(p.cmdline())[:300],
                      job=scheduler_job())


def scheduler_job(env: Mapping[str, str] | None = None) -> SchedulerJob | None:
    """The Slurm job this process runs in, from the variables Slurm sets on the node (None outside a job)."""
    env = os.environ if env is None else env
    if not env.get("SLURM_JOB_ID"):
        return None
    return SchedulerJob(job_id=env.get("SLURM_JOB_ID"), node=env.get("SLURMD_NODENAME"),
                        nodelist=env.get("SLURM_JOB_NODELIST"), partition=env.get("SLURM_JOB_PARTITION"),
                        gpus=env.get("CUDA_VISIBLE_DEVICES"),
                        cpus=env.get("SLURM_CPUS_PER_TASK") or env.get("SLURM_CPUS_ON_NODE"),
                        unit=env.get("SPECTRIAL_UNIT"))


def owner_env(c: Controller | None = None) -> str:
    """The controller as one environment value (JSON without the command)."""
    c = c or controller()
    return json.dumps({"host": c.host, "boot_id": c.boot_id, "pid": c.pid, "create_time": c.create_time},
                      separators=(",", ":"))


def parse_owner(value: str | None) -> Controller | None:
    """A controller from `owner_env`'s value (None when absent or unreadable)."""
    if not value:
        return None
    try:
        out = json.loads(value)
    except ValueError:
        return None
    return Controller.model_validate(out) if isinstance(out, dict) and "pid" in out else None


def _as_controller(owner: Controller | Mapping[str, str | int | float] | None) -> Controller | None:
    """A controller as a record or a server's state file keeps it (a mapping there), as the model."""
    return Controller.model_validate(dict(owner)) if isinstance(owner, Mapping) else owner


def owner_state(owner: Controller | Mapping[str, str | int | float] | None) -> State:
    """alive: the controller runs (on this machine, this boot); gone: it does not; self: it is this process;
    unknown: no controller recorded, or one on another machine (or before a reboot of this one: gone)."""
    owner = _as_controller(owner)
    if owner is None or not owner.pid:
        return "unknown"
    if owner.host != socket.gethostname():
        return "unknown"
    if owner.boot_id and boot_id() and owner.boot_id != boot_id():
        return "gone"
    pid = owner.pid
    created = owner.create_time or 0.0
    if pid == os.getpid() and abs(psutil.Process().create_time() - created) <= _TIME_SLACK_S + 0.01:
        return "self"
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE or (created and abs(p.create_time() - created) > _TIME_SLACK_S + 0.01):
            return "gone"
    except psutil.Error:
        return "gone"
    return "alive"


def describe(owner: Controller | Mapping[str, str | int | float] | None) -> str:
    owner = _as_controller(owner)
    if owner is None or not owner.model_fields_set:
        return "an unrecorded controller"
    return f"pid {owner.pid} on {owner.host}"


def papermill_output_path() -> Path | None:
    """The output notebook of the papermill process running this kernel, if there is one (papermill is then the
    controller's parent: the run record keeps a copy of that notebook, and progress stays one quiet line)."""
    try:
        proc = psutil.Process().parent()
        for _ in range(3):
            if proc is None:
                return None
            argv = proc.cmdline()
            if any("papermill" in a for a in argv[:3]):
                args = [a for a in argv[1:] if not a.startswith("-") and a.endswith(".ipynb")]
                if len(args) >= 2:
                    return (Path(proc.cwd()) / args[1]).resolve()
                return None
            proc = proc.parent()
    except psutil.Error:
        return None
    return None
