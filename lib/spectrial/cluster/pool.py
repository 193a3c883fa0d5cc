"""A pool of hosts without a scheduler: one unit per host at a time, each a local `spectrial` process that drives
its host (over SSH, or this machine for 'local'), in its own session so that it is stopped by its process group.

The scheduling stays small on purpose: a free host takes the next unit; nothing is queued on a host. Where a
scheduler exists, use it (spectrial.cluster.slurm)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass

from spectrial.cluster.executor import JobState, UnitJob
from spectrial.params.cluster import ClusterParams


@dataclass
class _Running:
    unit: UnitJob
    host: str
    proc: subprocess.Popen[bytes]
    t0: float
    cancelled: str | None = None
    cancelled_at: float | None = None


class PoolExecutor:
    """`cluster.executor: pool`: `cluster.pool.hosts`, one unit per host at a time."""

    name = "pool"

    def __init__(self, cluster: ClusterParams, port: int, stop_grace_s: float = 15.0) -> None:
        self.hosts = list(cluster.pool.hosts)
        self.ports = list(cluster.pool.ports or [port] * len(self.hosts))
        self.max_parallel = cluster.max_parallel
        self.grace = stop_grace_s + 15.0  # the unit stops its servers (stop_grace_s each) before it exits
        self.jobs: dict[str, _Running] = {}

    @property
    def slots(self) -> int:
        return min(self.max_parallel, len(self.hosts))

    def check(self, units: list[UnitJob]) -> list[str]:
        return [f"{len(units)} units on {len(self.hosts)} hosts: {len(units) - self.slots} wait for a free host"] \
            if len(units) > self.slots else []

    def _free_host(self) -> int:
        busy = {r.host for r in self.jobs.values() if r.proc.poll() is None}
        return next(i for i, h in enumerate(self.hosts) if h not in busy)

    def submit(self, unit: UnitJob) -> str:
        i = self._free_host()
        unit.host, unit.port = self.hosts[i], self.ports[i]
        unit.overrides.update({"host": unit.host, "port": str(unit.port)})
        unit.log_path.parent.mkdir(parents=True, exist_ok=True)
        with unit.log_path.open("ab") as log:
            proc = subprocess.Popen(unit.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env={**os.environ, **unit.env})
        handle = f"pool-{proc.pid}"
        self.jobs[handle] = _Running(unit, unit.host, proc, time.monotonic())
        return handle

    def poll(self, handle: str) -> JobState:
        r = self.jobs[handle]
        rc = r.proc.poll()
        elapsed = round(time.monotonic() - r.t0, 2)
        if rc is None:
            if r.cancelled_at is not None and time.monotonic() - r.cancelled_at > self.grace:
                with contextlib.suppress(ProcessLookupError):  # it had its grace: as Slurm does after KillWait
                    os.killpg(r.proc.pid, signal.SIGKILL)
            return JobState("running", "RUNNING", host=r.host, elapsed_s=elapsed)
        state = "CANCELLED" if r.cancelled else ("COMPLETED" if rc == 0 else "FAILED")
        return JobState("done", state, reason=r.cancelled, host=r.host, exit_code=rc, elapsed_s=elapsed)

    def cancel(self, handle: str, why: str) -> None:
        """SIGTERM to the unit's process group (it stops its servers and writes its record); `poll` sends SIGKILL
        once the grace is over (the fan-out then stops what it left, by the recorded group: `_stop_what_it_left`)."""
        r = self.jobs[handle]
        if r.proc.poll() is not None or r.cancelled_at is not None:
            return
        r.cancelled, r.cancelled_at = why, time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(r.proc.pid, signal.SIGTERM)

    def close(self) -> None:
        """Nothing of the pool outlives the run: units still running are stopped (SIGTERM, SIGKILL after the
        grace)."""
        live = [h for h, r in self.jobs.items() if r.proc.poll() is None]
        for h in live:
            self.cancel(h, "the cluster run ended")
        deadline = time.monotonic() + self.grace + 10
        while any(self.jobs[h].proc.poll() is None for h in live) and time.monotonic() < deadline:
            for h in live:
                self.poll(h)
            time.sleep(0.2)
