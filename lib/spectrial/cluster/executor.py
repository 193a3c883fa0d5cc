"""The executor interface: what a cluster (Slurm, a pool of hosts, a Kubernetes Job one day) must do for a unit.

    check(units)     bad input before anything is submitted (ConfigError quoting the scheduler's own words)
    submit(unit)     start the unit's command (`spectrial trial|sweep PARAMS --run-id ID --quiet`); a handle
    poll(handle)     where it is: pending (with the scheduler's reason), running (on which host), done (how)
    cancel(handle)   stop it the scheduler's way (Slurm: SIGTERM, SIGKILL after KillWait); the unit's own
                     interrupt handling stops its servers and writes its record `failed` and why

The unit itself runs the same session code as a trial on one host: kill old server, GPUs free, fingerprint,
env check. The executor never reaches around the scheduler (no ssh to a Slurm node).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

Phase = Literal["pending", "running", "done"]


@dataclass
class UnitJob:
    """One unit as submitted: its params file, its run id and where its record and log go."""

    name: str
    run_id: str
    kind: Literal["trial", "sweep"]
    params_path: Path
    output_dir: Path  # the unit's record is output_dir / run_id
    log_path: Path
    arms: list[str]
    host: str = "local"  # where its servers run (the pool's host; a Slurm node runs them locally)
    port: int = 0
    round: int = 0
    env: dict[str, str] = field(default_factory=dict)  # put on the unit's command (SPECTRIAL_UNIT, ...)
    overrides: dict[str, str] = field(default_factory=dict)  # `-p NAME=VALUE` the executor adds (the pool's host)

    def argv(self, python: str | None = None) -> list[str]:
        """The command the unit runs (the same CLI as a trial or sweep on one host)."""
        over = [x for k, v in self.overrides.items() for x in ("-p", f"{k}={v}")]
        return [python or sys.executable, "-m", "spectrial.cli", self.kind, str(self.params_path),
                "--run-id", self.run_id, "--quiet", *over]

    def shell(self, python: str | None = None) -> str:
        return " ".join(shlex.quote(a) for a in self.argv(python))

    @property
    def run_dir(self) -> Path:
        return self.output_dir / self.run_id


@dataclass
class JobState:
    """A unit's job as the executor sees it now."""

    phase: Phase
    scheduler_state: str | None = None  # Slurm: PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, NODE_FAIL, ...
    reason: str | None = None  # Slurm's reason (pending: Resources, Priority, ...; done: NonZeroExitCode, ...)
    host: str | None = None  # the node or host it runs on
    exit_code: int | None = None
    elapsed_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.phase == "done" and self.exit_code == 0 and self.scheduler_state in (None, "COMPLETED")


class Executor(Protocol):
    """Slurm, a pool of hosts (spectrial.cluster.slurm, spectrial.cluster.pool)."""

    name: str

    @property
    def slots(self) -> int:
        """Units that may run at once."""
        ...

    def check(self, units: list[UnitJob]) -> list[str]:
        """Raise ConfigError for what can never run; return notes (e.g. units that will queue)."""
        ...

    def submit(self, unit: UnitJob) -> str:
        ...

    def poll(self, handle: str) -> JobState:
        ...

    def cancel(self, handle: str, why: str) -> None:
        ...

    def close(self) -> None:
        ...
