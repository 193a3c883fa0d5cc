"""The worker of the NCCL check: one process per rank, started with multiprocessing *spawn*.

Imports only the standard library at module level (torch inside the function), so that spawning stays
cheap. The worker sends its fd 1 and 2 to a per-rank log file (NCCL writes its debug lines to stdout),
applies the set's variables where the set says (`in_worker`, `after_init`), records which requested
variables it sees in `os.environ` and in `/proc/self/environ` at the moment a communicator is created,
times all-reduces, and writes one JSON result file (also on failure, with the error).

Result JSON (`WorkerResult`): rank, pid, ppid, hostname, how, snapshots [{phase, proc_readable, vars: {NAME:
{requested, os_environ, proc}}}], versions {torch, python, nccl, device, cuda}, groups {group: {size_bytes:
[us, ...]}}, error, traceback; the parent adds exit_code.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypedDict

#: Marker lines the worker writes into its own log before a communicator is created ("phase" boundaries).
MARK_PREFIX = "SPECTRIAL-NCCL-CHECK phase="
_LIBC: Any = None


@dataclass(frozen=True)
class WorkerSpec:
    """What one rank runs (picklable: handed to the spawned process)."""

    set: str
    how: str  # launch | in_worker | after_init: where the set's variables are applied
    backend: str  # nccl | gloo
    world_size: int
    init_method: str
    requested: dict[str, str]  # every variable the set asks for (to check what the worker sees)
    worker_env: dict[str, str]  # what the worker itself puts into os.environ (in_worker, after_init)
    sizes: list[int]  # message sizes in bytes
    dtype: str
    iters: int
    warmup: int
    timeout_s: float
    log_path: str
    result_path: str


class VarSeen(TypedDict):
    """One requested variable: its requested value and what this process saw (None: absent)."""

    requested: str
    os_environ: str | None
    proc: str | None


class Snapshot(TypedDict):
    """The requested variables as seen when a communicator is about to be created."""

    phase: str
    proc_readable: bool
    vars: dict[str, VarSeen]


class Versions(TypedDict, total=False):
    torch: str
    python: str
    nccl: str
    device: str
    cuda: str | None


class _WorkerResultKeys(TypedDict):
    rank: int
    pid: int | None
    error: str | None


class WorkerResult(_WorkerResultKeys, total=False):
    """The result file of one rank (the parent adds `exit_code`; a rank that wrote none gets only rank, pid,
    error and exit_code)."""

    ppid: int
    hostname: str
    how: str
    snapshots: list[Snapshot]
    groups: dict[str, dict[str, list[float]]]  # group -> size in bytes (as text) -> us per call
    versions: Versions
    traceback: str
    exit_code: int | None


def _flush_all() -> None:
    """Flush Python's and C's stdio so that marker lines and NCCL's lines keep their order in the log."""
    global _LIBC
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        _LIBC = _LIBC or ctypes.CDLL(None)
        _LIBC.fflush(None)
    except (OSError, AttributeError):  # pragma: no cover - non-glibc platforms
        pass


def _redirect_output(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]


def _proc_environ() -> dict[str, str] | None:
    from spectrial.hosts.local import parse_environ

    try:
        return parse_environ(Path("/proc/self/environ").read_bytes())
    except OSError:
        return None


def snapshot(phase: str, requested: dict[str, str]) -> Snapshot:
    """Which requested variables this process sees now: os.environ and its exec-time /proc environment."""
    _flush_all()
    print(f"{MARK_PREFIX}{phase}", flush=True)
    proc = _proc_environ()
    return {"phase": phase, "proc_readable": proc is not None,
            "vars": {k: {"requested": v, "os_environ": os.environ.get(k),
                         "proc": None if proc is None else proc.get(k)} for k, v in requested.items()}}


def _time_allreduce(dist: Any, torch: Any, group: Any, numel: int, dtype: Any, device: Any, iters: int,
                    warmup: int, sync: Any) -> list[float]:
    """`iters` timed all-reduces (us each, incl. a device sync) after `warmup`; ranks are aligned by a
    one-element all-reduce before every timed call."""
    x = torch.zeros(numel, dtype=dtype, device=device)
    tick = torch.zeros(1, dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(x, group=group)
    sync()
    out: list[float] = []
    for _ in range(iters):
        dist.all_reduce(tick, group=group)
        sync()
        t0 = time.perf_counter()
        dist.all_reduce(x, group=group)
        sync()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _versions(torch: Any, backend: str, device: Any) -> Versions:
    out: Versions = {"torch": torch.__version__, "python": sys.version.split()[0]}
    if backend == "nccl":
        try:
            v = torch.cuda.nccl.version()
            out["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception as exc:  # noqa: BLE001 - a version is informative only
            out["nccl"] = f"unknown ({type(exc).__name__})"
        out["device"] = torch.cuda.get_device_name(device)
        out["cuda"] = torch.version.cuda
    return out


def run_worker(rank: int, spec: WorkerSpec) -> None:
    """Entry point of one rank (a multiprocessing spawn target); see the module docstring."""
    _redirect_output(spec.log_path)
    result: WorkerResult = {"rank": rank, "pid": os.getpid(), "ppid": os.getppid(),
                            "hostname": socket.gethostname(), "how": spec.how, "snapshots": [],
                            "groups": {}, "versions": {}, "error": None}
    try:
        _run(rank, spec, result)
    except BaseException as exc:  # the parent reads the error from the result file
        result["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        result["traceback"] = traceback.format_exc()[-6000:]
        print(result["traceback"], file=sys.stderr)
    finally:
        _flush_all()
        tmp = spec.result_path + ".tmp"
        Path(tmp).write_text(json.dumps(result))
        os.replace(tmp, spec.result_path)
    if result["error"]:
        sys.exit(1)


def _run(rank: int, spec: WorkerSpec, result: WorkerResult) -> None:
    how, requested, worker_env = spec.how, spec.requested, spec.worker_env
    if how == "in_worker":
        os.environ.update(worker_env)
    import torch
    import torch.distributed as dist

    backend = spec.backend
    if backend == "nccl":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)

        def sync() -> None:
            torch.cuda.synchronize(device)
    else:
        device = torch.device("cpu")

        def sync() -> None:
            return None
    result["versions"] = _versions(torch, backend, device)
    dtype = getattr(torch, spec.dtype)
    item = torch.tensor([], dtype=dtype).element_size()
    snapshots, timings = result.setdefault("snapshots", []), result.setdefault("groups", {})
    snapshots.append(snapshot("first_communicator", requested))
    dist.init_process_group(backend, init_method=spec.init_method, rank=rank, world_size=spec.world_size,
                            timeout=timedelta(seconds=spec.timeout_s))
    groups: dict[str, dist.ProcessGroup | None] = {"default": None}  # None: the default group
    try:
        first = torch.ones(1, device=device)
        dist.all_reduce(first)  # creates the default group's communicator (NCCL creates it lazily)
        sync()
        if how == "after_init":
            os.environ.update(worker_env)
            snapshots.append(snapshot("new_group", requested))
            groups["new"] = dist.new_group(ranks=list(range(spec.world_size)))
            probe = torch.ones(1, device=device)
            dist.all_reduce(probe, group=groups["new"])
            sync()
        _flush_all()
        print(f"{MARK_PREFIX}measure", flush=True)
        for gname, group in groups.items():
            per_size: dict[str, list[float]] = {}
            for size in spec.sizes:
                per_size[str(size)] = _time_allreduce(dist, torch, group, size // item, dtype, device,
                                                      spec.iters, spec.warmup, sync)
            timings[gname] = per_size
    finally:
        _flush_all()
        dist.destroy_process_group()
