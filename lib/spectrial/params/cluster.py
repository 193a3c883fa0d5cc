"""Cluster parameters: where a trial's or a sweep's units run (`cluster:` in a params file).

A *unit* is a block of arms (a trial's) or of settings (a sweep's) that carries its own interleaved baseline and
runs on one host as an ordinary trial or sweep (`host: local` on a Slurm node; the pool's host otherwise). Units
run in parallel, up to `max_parallel` at once; the merged record keeps the host as a factor (spectrial.cluster).

    cluster:
      executor: slurm            # or pool: a list of SSH hosts, one unit per host at a time
      units: 2                   # blocks the settings are spread over (default: max_parallel)
      max_parallel: 2            # units running at once
      on_unit_failure: continue  # or stop: cancel the others
      slurm: {partition: gpu, account: lab, time_limit: "00:30:00", gpus_per_unit: 8, cpus_per_unit: 16,
              nodes_per_unit: 1, sbatch_options: ["--exclusive"], pending_timeout_s: 600}
      pool: {hosts: ["ssh://me@gpu1", "ssh://me@gpu2"]}
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def time_limit_s(value: str) -> int:
    """Seconds of a Slurm time limit ("MM", "MM:SS", "HH:MM:SS", "D-HH[:MM[:SS]]"), as `sbatch --time` reads it."""
    m = _TIME_RE.match(value.strip())
    if not m:
        raise ValueError(f"{value!r} is not a Slurm time limit (minutes, MM:SS, HH:MM:SS or D-HH:MM:SS)")
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, mi, s = (parts + [0, 0])[:3]
        return int(days) * 86400 + h * 3600 + mi * 60 + s
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


class SlurmOptions(BaseModel):
    """How each unit asks Slurm for its resources (one `sbatch` job per unit)."""

    model_config = ConfigDict(extra="forbid")

    partition: str | None = Field(None, description="Partition (sbatch -p); default: the cluster's default.")
    account: str | None = Field(None, description="Account (sbatch -A).")
    qos: str | None = Field(None, description="Quality of service (sbatch --qos).")
    time_limit: str = Field("01:00:00", description="Time limit of one unit (sbatch --time: minutes, HH:MM:SS or "
                                                    "D-HH:MM:SS); at least one server start of every arm.")
    gpus_per_unit: int = Field(0, ge=0, description="GPUs per node of a unit (sbatch --gres=gpu:N); Slurm sets "
                                                    "CUDA_VISIBLE_DEVICES to the allocated ones.")
    gres: str | None = Field(None, description="A GRES string instead of gpus_per_unit (e.g. 'gpu:h200:8').")
    cpus_per_unit: int = Field(1, ge=1, description="CPUs of a unit's task (sbatch -c).")
    mem: str | None = Field(None, description="Memory per node (sbatch --mem, e.g. '64G').")
    nodes_per_unit: int = Field(1, ge=1, description="Nodes of a unit; 2+ starts the engine's ranks with srun on "
                                                     "the allocated nodes (trial `hosts:` filled from the "
                                                     "allocation).")
    sbatch_options: list[str] = Field(default_factory=list, description="Extra sbatch options, passed as given "
                                                                        "(each one argument, e.g. '--exclusive').")
    pending_timeout_s: float = Field(600, gt=0, description="A unit still pending after this many seconds is "
                                                            "cancelled and fails with Slurm's pending reason.")
    poll_s: float = Field(2.0, gt=0, description="Seconds between squeue/scontrol polls.")
    python: str | None = Field(None, description="Python on the nodes that has spectrial installed (default: "
                                                 "this one's, which a shared filesystem makes visible there).")

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time_ok(cls, v: object) -> str:
        text = str(v).strip() if isinstance(v, (int, str)) and not isinstance(v, bool) else ""
        time_limit_s(text or repr(v))
        return text

    def time_limit_seconds(self) -> int:
        return time_limit_s(self.time_limit)


class PoolOptions(BaseModel):
    """A plain pool of hosts without a scheduler: one unit per host at a time."""

    model_config = ConfigDict(extra="forbid")

    hosts: list[str] = Field(default_factory=list, description="Hosts of the pool: 'local', "
                                                               "'ssh://user@host:port' or 'ssh:ALIAS'.")
    ports: list[int] | None = Field(None, description="Server port per host (default: the trial's port on "
                                                      "every host; give two when two hosts are one machine).")

    @field_validator("hosts")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        dup = sorted({h for h in v if v.count(h) > 1})
        if dup:
            raise ValueError(f"each host may appear once (a host runs one unit at a time), repeated: {dup}")
        return v


class ClusterParams(BaseModel):
    """Where the units of a trial or sweep run, how many at once, and what a failed unit does."""

    model_config = ConfigDict(extra="forbid")

    executor: Literal["slurm", "pool"] = Field(description="'slurm': one sbatch job per unit; 'pool': the hosts "
                                                           "of `pool.hosts`, one unit per host at a time.")
    units: int | None = Field(None, ge=1, description="Blocks the arms or settings are spread over (default: "
                                                      "max_parallel); each carries its own baseline.")
    max_parallel: int = Field(2, ge=1, description="Units running at once (the pool: at most its hosts).")
    on_unit_failure: Literal["continue", "stop"] = Field(
        "continue", description="'continue': the other units go on and the merged record names what is "
                                "missing; 'stop': cancel the units still running.")
    slurm: SlurmOptions = Field(default_factory=SlurmOptions, description="sbatch resources of each unit.")
    pool: PoolOptions = Field(default_factory=PoolOptions, description="The hosts of a pool.")
    picks_per_unit: int = Field(2, ge=1, description="A guided sweep: settings one unit measures (each unit "
                                                     "carries a baseline start) while the untried settings "
                                                     "outnumber the units that may run; 1 at the end.")
    unit_timeout_s: float | None = Field(None, gt=0, description="The pool's time limit of one unit (Slurm: "
                                                                 "slurm.time_limit).")

    @model_validator(mode="after")
    def _executor_ok(self) -> ClusterParams:
        if self.executor == "pool":
            if not self.pool.hosts:
                raise ValueError("pool.hosts: the pool executor needs at least one host (e.g. "
                                 "['ssh://me@gpu1', 'ssh://me@gpu2'])")
            if self.pool.ports is not None and len(self.pool.ports) != len(self.pool.hosts):
                raise ValueError(f"pool.ports: one port per host ({len(self.pool.hosts)}), got "
                                 f"{len(self.pool.ports)}")
        return self

    def n_units(self) -> int:
        return self.units or self.max_parallel


def blocks(items: list[str], n: int) -> list[list[str]]:
    """`items` spread round-robin over `n` blocks; with fewer items than blocks, items repeat (replicas)."""
    if not items:
        return []
    if len(items) >= n:
        return [items[i::n] for i in range(n)]
    return [[items[i % len(items)]] for i in range(n)]
