"""GPU checks through `nvidia-smi` on the host: what is there, who uses it, and waiting until free."""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from spectrial.errors import ConfigError, ResourceBusyError
from spectrial.hosts.fingerprint import SAMPLE_QUERY, gpu_rows, throttle_reasons
from spectrial.hosts.local import Host

GPU_FIELDS = ("index", "name", "uuid", "memory.used", "memory.total", "utilization.gpu")
APP_FIELDS = ("pid", "used_memory", "gpu_uuid")


@dataclass
class Gpu:
    index: int
    name: str
    uuid: str
    memory_used_mib: float
    memory_total_mib: float
    util_pct: float | None


@dataclass
class GpuApp:
    pid: int
    used_mib: float
    gpu_uuid: str
    command: str = ""


@dataclass
class GpuStatus:
    """The host's GPUs right now; `available` is False where there is no working nvidia-smi."""

    available: bool
    gpus: list[Gpu] = field(default_factory=list)
    apps: list[GpuApp] = field(default_factory=list)
    reason: str = ""

    def busy(self, max_used_mib: float) -> list[str]:
        """Why the GPUs are not free (empty list: free)."""
        why = [f"GPU {g.index} ({g.name}) has {g.memory_used_mib:.0f} MiB in use"
               for g in self.gpus if g.memory_used_mib >= max_used_mib]
        why += [f"pid {a.pid} uses {a.used_mib:.0f} MiB on {a.gpu_uuid}: {a.command or '?'}" for a in self.apps]
        return why

    def as_dict(self) -> dict:
        return {"available": self.available, "reason": self.reason,
                "gpus": [vars(g) for g in self.gpus], "apps": [vars(a) for a in self.apps]}


def _num(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def _rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(text)) if row and any(c.strip() for c in row)]


def query(host: Host) -> GpuStatus:
    """Query GPUs and compute processes; a host without nvidia-smi gives `available=False`."""
    if not host.which("nvidia-smi"):
        return GpuStatus(False, reason="nvidia-smi not found on the host")
    res = host.run(["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"],
                   check=False, timeout=60)
    if not res.ok:
        return GpuStatus(False, reason=f"nvidia-smi failed: {(res.stderr or res.stdout).strip()[:300]}")
    gpus = [Gpu(int(r[0]), r[1], r[2], _num(r[3]) or 0.0, _num(r[4]) or 0.0, _num(r[5]))
            for r in _rows(res.stdout) if len(r) >= 6 and r[0].isdigit()]
    apps_res = host.run(["nvidia-smi", f"--query-compute-apps={','.join(APP_FIELDS)}",
                         "--format=csv,noheader,nounits"], check=False, timeout=60)
    apps = [GpuApp(int(r[0]), _num(r[1]) or 0.0, r[2]) for r in _rows(apps_res.stdout)
            if apps_res.ok and len(r) >= 3 and r[0].isdigit()]
    if apps:
        procs = {p.pid: p for p in host.processes()}
        for a in apps:
            a.command = procs[a.pid].command if a.pid in procs else "(not visible from this host user/namespace)"
    return GpuStatus(True, gpus, apps)


def within(st: GpuStatus, visible: str | None) -> GpuStatus:
    """The GPUs of `st` that CUDA_VISIBLE_DEVICES (`visible`: indexes or UUIDs, comma-separated) gives this run,
    and the processes on them: a Slurm job (or a shared host) judges only its own GPUs, not its neighbours'.
    Entries that match no GPU by index or UUID (a device cgroup renumbers from 0, and nvidia-smi inside it sees
    only the job's GPUs) leave the status whole."""
    if not st.available or not visible or not visible.strip():
        return st
    wanted = {v.strip() for v in visible.split(",") if v.strip()}
    mine = [g for g in st.gpus if str(g.index) in wanted or g.uuid in wanted]
    if not mine or len(mine) < len(wanted):
        return st
    uuids = {g.uuid for g in mine}
    return GpuStatus(True, mine, [a for a in st.apps if a.gpu_uuid in uuids], st.reason)


def wait_gpus_free(host: Host, *, max_used_mib: float = 1024, timeout_s: float = 60, require_gpu: bool = False,
                   poll_s: float = 0.5, visible: str | None = None) -> GpuStatus:
    """Wait until every GPU (of `visible`: CUDA_VISIBLE_DEVICES, see `within`) is below `max_used_mib` and no
    compute process runs on it.

    No GPU: returns the status when `require_gpu` is False, else raises ConfigError.
    Timeout: raises ResourceBusyError naming each busy GPU and process (pid and command line).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        st = within(query(host), visible)
        if not st.available:
            if require_gpu:
                raise ConfigError(f"require_gpu: host {host.name} has no usable GPU ({st.reason}); "
                                  "set require_gpu: false to run on CPU")
            return st
        why = st.busy(max_used_mib)
        if not why:
            return st
        if time.monotonic() >= deadline:
            raise ResourceBusyError(f"GPUs on {host.name} are not free after {timeout_s:.0f} s:\n  - "
                                    + "\n  - ".join(why)
                                    + "\nspectrial stops only servers it started; stop these yourself.")
        time.sleep(poll_s)


class GpuSampler:
    """`nvidia-smi --query-gpu ... -lms N` running detached on the host while an arm is benchmarked.

    Samples clocks, temperature, power, utilisation and throttle reasons at >= 1 Hz; stopped by process
    group with the arm. On a host without nvidia-smi it records nothing and says so.
    """

    def __init__(self, host: Host, log_path: str, interval_ms: int = 500, env: dict[str, str] | None = None,
                 on_start: Callable[[int], None] | None = None) -> None:
        self.host, self.log_path, self.interval_ms = host, log_path, interval_ms
        self.env, self.on_start = env, on_start  # the start's helper tag (found by the next kill step), a hook
        self.pgid: int | None = None
        self.reason = ""

    def start(self) -> GpuSampler:
        if not self.host.which("nvidia-smi"):
            self.reason = "no nvidia-smi on the host: no GPU samples"
            return self
        self.pgid = self.host.start_detached(
            ["nvidia-smi", f"--query-gpu={','.join(SAMPLE_QUERY)}", "--format=csv,noheader,nounits",
             f"-lms={self.interval_ms}"], env=self.env, log_path=self.log_path)
        if self.on_start is not None:
            self.on_start(self.pgid)
        return self

    def stop(self) -> list[dict[str, object]]:
        """Stop sampling; returns the samples (with decoded throttle reasons)."""
        if self.pgid is None:
            return []
        self.host.stop_group(self.pgid, 2)
        self.pgid = None
        text = self.host.read_text(self.log_path) if self.host.exists(self.log_path) else ""
        rows = gpu_rows(text.splitlines(), SAMPLE_QUERY)
        for r in rows:
            r["throttle"] = throttle_reasons(r.get("clocks_event_reasons.active"))  # type: ignore[assignment]
        return rows

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.pgid is not None:
            self.stop()
