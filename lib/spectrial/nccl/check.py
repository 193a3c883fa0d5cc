"""Run the NCCL check: per environment set, fresh workers (multiprocessing spawn, one per rank), then the
record: visibility per worker, NCCL's own evidence, latency per size, and a verdict.

Record (RunRecord kind "nccl_check"; four files): `manifest.json` (params, host, steps, `sets`, `verdict`),
`latency.csv` (every timed call), `summary.csv` (percentiles), `nccl.log` (every rank's output, one block
per set, round and rank). manifest `sets[i]`: name, how, env (masked), drop_in_rank, launch_added,
parent_values_replaced, removed_from_launch, status, error, elapsed_s, versions, workers [{round, rank, pid, exit_code,
phase, seen_in_os_environ, seen_in_proc, missing, not_in_proc, values}], nccl [{round, rank, pid, error,
set_by_environment, settings}], effect {status, per_rank}, latency (summary rows, rank 'max'),
comparisons (vs the baseline)."""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import pandas as pd

from spectrial.errors import ConfigError, RankFailure, SetFailed
from spectrial.nccl import evidence as ev
from spectrial.nccl import latency as nccl_latency
from spectrial.nccl.evidence import SettingsRow, Visibility
from spectrial.nccl.params import EnvSet, NcclCheckParams
from spectrial.nccl.worker import Versions, WorkerResult, WorkerSpec, run_worker
from spectrial.record.store import RunRecord, load_record, opened, read_table
from spectrial.schema import GpusSeen, HostInfo, Manifest
from spectrial.secrets import mask_env

_INHERITED_PREFIXES = ("NCCL_", "TORCH_", "NVSHMEM_", "CUDA_VISIBLE_DEVICES", "GLOO_")
_LOG_CAP = 2 << 20  # bytes kept per rank log in nccl.log (its tail)


class WorkerRow(Visibility):
    """manifest `sets[].workers[]`: one rank of one round, what it saw and how it exited."""

    round: int
    exit_code: int | None


class NcclRow(TypedDict):
    """manifest `sets[].nccl[]`: what NCCL said in one rank of one round."""

    round: int
    rank: int
    pid: int | None
    error: str | None
    set_by_environment: dict[str, str]
    settings: list[SettingsRow]  # each with its `round` added


class RankEffect(TypedDict):
    round: int
    rank: int
    pid: int | None
    confirmed: list[str]
    unconfirmed: list[str]
    different: dict[str, str]


class Effect(TypedDict):
    """manifest `sets[].effect`: did NCCL take the set's variables (status), rank by rank."""

    status: str
    per_rank: list[RankEffect]


class LatencyRow(TypedDict):
    """One timed all-reduce (a row of latency.csv, before its `round`)."""

    set: str
    group: str
    size_bytes: int
    role: str
    rank: int
    iter: int
    us: float


class SetEntry(TypedDict, total=False):
    """manifest `sets[i]` (see the module docstring)."""

    name: str
    how: str
    env: dict[str, str]
    drop_in_rank: dict[str, list[str]]
    launch_added: dict[str, str]
    parent_values_replaced: dict[str, str]
    removed_from_launch: list[str]
    status: str
    error: str | None
    elapsed_s: float
    versions: Versions
    workers: list[WorkerRow]
    nccl: list[NcclRow]
    effect: Effect
    latency: list[dict[str, float | str]]  # summary rows of the slowest rank
    comparisons: list[dict[str, float | str]]  # vs the baseline, per size


@dataclass
class NcclCheckResult:
    """A finished (or failed) check: its folder, manifest and per-call latencies."""

    run_dir: Path
    manifest: Manifest
    latency: pd.DataFrame

    @property
    def status(self) -> str:
        return str(self.manifest.status)

    def summary(self, all_ranks: bool = False) -> pd.DataFrame:
        """Latency percentiles per set, group and size; the slowest rank per call unless `all_ranks`."""
        s = nccl_latency.summarize_latency(self.latency)
        return s if all_ranks else s[s["rank"] == "max"].reset_index(drop=True)

    def comparisons(self) -> pd.DataFrame:
        """Each set vs the baseline, per size (ratio of medians, CI, faster/slower/same)."""
        rows = [c for s in self.manifest.get("sets", []) for c in s.get("comparisons", [])]
        return pd.DataFrame(rows, columns=["set", "group", "size_bytes", "size", "role", "base_p50_us", "p50_us",
                                           "ratio", "ci_low", "ci_high", "level", "verdict"])

    def verdict(self) -> str:
        """The verdict paragraph (markdown; `spectrial.nccl.latency.verdict_text`). Its tables and figure are the
        readers' (`spectrial.readers.nccl`, `spectrial.readers.render.plots.nccl_latency_figure`)."""
        return nccl_latency.verdict_text(self.manifest, self.comparisons())


def load_nccl_check(run_dir: str | Path) -> NcclCheckResult:
    """A check's result read back from its run folder."""
    run_dir = Path(run_dir)
    csv = run_dir / "latency.csv"
    lat = read_table(csv) if csv.is_file() else pd.DataFrame(columns=_LAT_COLS)
    return NcclCheckResult(run_dir, load_record(run_dir), lat)


_LAT_COLS = ["round", "set", "group", "size_bytes", "role", "rank", "iter", "us"]


def resolve_world_size(params: NcclCheckParams) -> int:
    """Ranks to run: params.world_size, else the GPU count (nccl) or 2 (gloo); checks what nccl needs."""
    if params.backend == "gloo":
        return params.world_size or 2
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        raise ConfigError(f"backend: nccl needs torch with CUDA ({exc}); use backend: gloo on CPU") from None
    n = torch.cuda.device_count()
    if not dist.is_nccl_available() or n < 1:
        raise ConfigError(f"backend: nccl needs torch with NCCL and a GPU (found {n} GPU(s), NCCL "
                          f"{'available' if dist.is_nccl_available() else 'not available'}); "
                          "use backend: gloo to exercise the same code on CPU")
    ws = params.world_size or n
    if ws > n:
        raise ConfigError(f"world_size: {ws} ranks need {ws} GPUs, this machine has {n}; lower world_size")
    return ws


def _check_main_module() -> None:
    """multiprocessing spawn re-imports the parent's main file: `python - < script` (stdin) has none."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(main, "__spec__", None) is None and path and not Path(path).is_file():
        raise ConfigError(f"the main program {path!r} is not a file, so spawned workers cannot start: run the "
                          "check from a file, `python -c`, a notebook or `spectrial nccl-check`, not from stdin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def parent_env(add: Mapping[str, str], remove: set[str]) -> Iterator[None]:
    """Set/unset variables in this process's environment (what a spawned child inherits), then restore."""
    touched = set(add) | set(remove)
    saved = {k: os.environ.get(k) for k in touched}
    try:
        for k in remove - set(add):
            os.environ.pop(k, None)
        os.environ.update(add)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _extras(params: NcclCheckParams, es: EnvSet) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(in force, added by spectrial, parent values replaced): the multicast-off and debug variables put on
    every launch (nccl). They always take spectrial's value; a parent value that differed is reported."""
    in_force = {k: v for k, v in params.launch_extras().items() if k not in es.env}
    added = {k: v for k, v in in_force.items() if os.environ.get(k) != v}
    replaced = {k: os.environ[k] for k in added if k in os.environ}
    return in_force, added, replaced


def _tail(path: Path, n: int = 20) -> str:
    if not path.is_file():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def _run_set(params: NcclCheckParams, name: str, es: EnvSet, world: int, tested: set[str], work: Path,
             entry: SetEntry) -> list[WorkerResult]:
    """Spawn one worker per rank under set `name`; returns the ranks' results (raises SetFailed)."""
    ctx = mp.get_context("spawn")
    in_force, added, replaced = _extras(params, es)
    entry.update({"launch_added": added, "parent_values_replaced": mask_env(replaced)})
    sizes = [s for s, _ in params.sizes()]
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    procs: list[Any] = []
    removed: set[str] = set()
    for rank in range(world):
        own = {k: v for k, v in es.env.items() if k not in set(es.drop_in_rank.get(rank, []))}
        launch = {**in_force, **(own if es.how == "launch" else {})}
        spec = WorkerSpec(set=name, how=es.how, backend=params.backend, world_size=world,
                          init_method=init_method, requested={**in_force, **es.env},
                          worker_env={} if es.how == "launch" else own, sizes=sizes, dtype=params.dtype,
                          iters=params.iters, warmup=params.warmup, timeout_s=params.timeout_s,
                          log_path=str(work / f"{name}.rank{rank}.log"),
                          result_path=str(work / f"{name}.rank{rank}.json"))
        drop = (tested | set(es.env)) - set(launch)
        removed |= {k for k in drop if k in os.environ}
        with parent_env(launch, drop):
            p = ctx.Process(target=run_worker, args=(rank, spec), name=f"nccl-check-{name}-{rank}")
            p.start()
        procs.append(p)
    entry["removed_from_launch"] = sorted(removed)
    stopped = _wait(procs, params.timeout_s)
    results: list[WorkerResult] = []
    for rank, p in enumerate(procs):
        rp = work / f"{name}.rank{rank}.json"
        why = f"stopped: {stopped}" if stopped else "exited without a result"
        res: WorkerResult = json.loads(rp.read_text()) if rp.is_file() else {"rank": rank, "pid": p.pid, "error": why}
        res["exit_code"] = p.exitcode
        results.append(res)
    bad = [r for r in results if r.get("error") or r["exit_code"] != 0]
    if bad:
        raise SetFailed(name, world, [RankFailure(r["rank"], r.get("pid"), r["exit_code"], r.get("error"),
                                                  _tail(work / f"{name}.rank{r['rank']}.log")) for r in bad])
    return results


def _wait(procs: list[Any], timeout_s: float) -> str:
    """Wait for all workers; when one fails, give the rest 10 s, then stop those still running.
    Returns why workers were stopped ('' when none was)."""
    deadline = time.monotonic() + timeout_s
    failed_at: float | None = None
    while any(p.is_alive() for p in procs):
        now = time.monotonic()
        if failed_at is None and any(p.exitcode not in (None, 0) for p in procs):
            failed_at = now
        if now >= deadline or (failed_at is not None and now - failed_at > 10):
            break
        mp.connection.wait([p.sentinel for p in procs if p.is_alive()], timeout=0.5)
    alive = [p for p in procs if p.is_alive()]
    why = "" if not alive else ("still running 10 s after another rank failed" if failed_at is not None
                                else f"timeout_s={timeout_s:g} s passed")
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(5)
        if p.is_alive():
            p.kill()
        p.join(5)
    return why


def _latency_rows(name: str, results: list[WorkerResult], roles: dict[int, str]) -> list[LatencyRow]:
    rows: list[LatencyRow] = []
    for r in results:
        for group, per_size in (r.get("groups") or {}).items():
            for size, values in per_size.items():
                rows.extend({"set": name, "group": group, "size_bytes": int(size), "role": roles[int(size)],
                             "rank": r["rank"], "iter": i, "us": round(float(us), 3)}
                            for i, us in enumerate(values))
    return rows


def nccl_effect(params: NcclCheckParams, es: EnvSet, nccl: list[NcclRow]) -> Effect:
    """Did NCCL take the set's variables? From its `set by environment` lines, rank by rank (every round)."""
    wanted = {k: v for k, v in es.env.items() if k.startswith("NCCL_")}
    if params.backend != "nccl":
        return {"status": "cannot tell: no NCCL (gloo backend)", "per_rank": []}
    if not wanted:
        return {"status": "no NCCL variables requested", "per_rank": []}
    if not nccl:
        return {"status": "cannot tell: no worker finished", "per_rank": []}
    per_rank: list[RankEffect] = []
    errors: list[str] = []
    for n in nccl:
        if n.get("error"):
            errors.append(n["error"])
        ok, absent, other = ev.confirmed(wanted, n.get("set_by_environment", {}))
        per_rank.append({"round": n.get("round"), "rank": n["rank"], "pid": n.get("pid"), "confirmed": ok,
                         "unconfirmed": absent, "different": other})
    if errors:
        return {"status": f"cannot tell: {errors[0]}", "per_rank": per_rank}
    reported = set().union(*(set(p["confirmed"]) | set(p["different"]) for p in per_rank))
    never = sorted(set(wanted) - reported)
    gaps = [(p, [k for k in p["unconfirmed"] if k not in never]) for p in per_rank]
    gaps = [(p, absent) for p, absent in gaps if absent or p["different"]]
    on_all = sorted(set.intersection(*(set(p["confirmed"]) for p in per_rank)))
    if not gaps and not never:
        status = f"took effect on every rank (NCCL reported {', '.join(on_all)} set by environment)"
    elif not gaps:
        status = (f"partly confirmed: NCCL reported {', '.join(on_all) or 'none'} set by environment on every "
                  f"rank; it never mentioned {', '.join(never)} (read silently, or not at all)")
    else:
        status = "not confirmed: " + "; ".join(
            f"rank {p['rank']} (pid {p['pid']}) " + ", ".join(
                [*(f"{k} not reported" for k in absent),
                 *(f"{k}={v} (requested {wanted[k]})" for k, v in p["different"].items())]) for p, absent in gaps)
        if never:
            status += f"; never mentioned on any rank: {', '.join(never)}"
    return {"status": status, "per_rank": per_rank}


def _host_info(params: NcclCheckParams) -> HostInfo:
    info = HostInfo(name=socket.gethostname(), platform=platform.platform(), cpus=os.cpu_count(),
                    python=platform.python_version(),
                    inherited_env=mask_env({k: v for k, v in os.environ.items() if k.startswith(_INHERITED_PREFIXES)}))
    if params.backend == "nccl" and shutil.which("nvidia-smi"):
        from spectrial.hosts.gpu import query
        from spectrial.hosts.local import LocalHost

        info.gpus = GpusSeen.model_validate(query(LocalHost()).as_dict())
        try:
            info.topology = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                                           timeout=30).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            info.topology = f"nvidia-smi topo -m failed: {exc}"
    return info


def _combined_log(parts: list[tuple[str, int, int | None, Path]]) -> str:
    buf = io.StringIO()
    for name, rank, pid, path in parts:
        buf.write(f"===== set {name} rank {rank} pid {pid} =====\n")
        if path.is_file():
            data = path.read_bytes()
            if len(data) > _LOG_CAP:
                buf.write(f"[... first {len(data) - _LOG_CAP} bytes cut ...]\n")
                data = data[-_LOG_CAP:]
            buf.write(data.decode("utf-8", "replace"))
        buf.write("\n")
    return buf.getvalue()


def _set_order(names: list[str], round_i: int) -> list[str]:
    """Round r runs the sets rotated by r, so that no set always runs first (start-up drift)."""
    k = round_i % len(names)
    return names[k:] + names[:k]


def _collect(params: NcclCheckParams, entry: SetEntry, es: EnvSet, round_i: int,
             results: list[WorkerResult], work: Path) -> None:
    """Add one round's workers and NCCL evidence to the set's manifest entry."""
    name = entry["name"]
    entry["workers"].extend({"round": round_i, **ev.visibility(r), "exit_code": r["exit_code"]} for r in results)
    entry.setdefault("versions", results[0].get("versions", {}))
    phases = ev.target_phases(es.how)
    for r in results:
        item: NcclRow = {"round": round_i, "rank": r["rank"], "pid": r.get("pid"),
                                "error": "no NCCL output on gloo", "set_by_environment": {}, "settings": []}
        if params.backend == "nccl":
            evid = ev.parse_rank_log(work / f"{name}.r{round_i}.rank{r['rank']}.log")
            item.update(error=evid["error"], set_by_environment=ev.set_by_environment(evid, phases),
                        settings=[{"round": round_i, **row} for row in ev.settings_rows(name, r["rank"], evid)])
        entry["nccl"].append(item)


def run_nccl_check(params: NcclCheckParams, *, run_id: str | None = None, progress: bool = True) -> NcclCheckResult:
    """Run every environment set in fresh workers (`rounds` times) and write the run record; never raises
    for a failed set (the record says status 'failed' and why); raises ConfigError for parameters this
    machine cannot run."""
    _check_main_module()
    world = resolve_world_size(params)
    for name, es in params.env_sets.items():
        if any(r >= world for r in es.drop_in_rank):
            raise ConfigError(f"env_sets.{name}.drop_in_rank: ranks {sorted(es.drop_in_rank)} but only "
                              f"{world} ranks run (0..{world - 1})")
    with opened(lambda: RunRecord(params.output_dir, params.name, kind="nccl_check", run_id=run_id,
                                  params=params)) as rec:
        return _check(params, rec, world, progress)


def _check(params: NcclCheckParams, rec: RunRecord, world: int, progress: bool) -> NcclCheckResult:
    """Every set, every round, into `rec` (run_nccl_check's body; its guard marks the record failed on an
    interrupt)."""
    roles = dict(params.sizes())
    tested = {k for es in params.env_sets.values() for k in es.env}
    rec.set(host=_host_info(params), world_size=world, enforced_env=params.launch_extras(),
            enforced_note=("multicast-off variables (and NCCL_DEBUG) are put on every set's launch"
                           if params.backend == "nccl" else "gloo: no variables added"),
            sets=[{"name": name, "how": es.how, "env": mask_env(es.env),
                   "drop_in_rank": {str(k): v for k, v in es.drop_in_rank.items()}, "status": "pending",
                   "error": None, "elapsed_s": 0.0, "workers": [], "nccl": []}
                  for name, es in params.env_sets.items()])
    entries = {e["name"]: e for e in rec.manifest.sets}
    lat_rows: list[dict[str, float | str]] = []
    logs: list[tuple[str, int, int | None, Path]] = []
    with tempfile.TemporaryDirectory(prefix="spectrial-nccl-") as tmp:
        work = Path(tmp)
        for round_i in range(params.rounds):
            for name in _set_order(list(params.env_sets), round_i):
                es, entry = params.env_sets[name], entries[name]
                if progress:
                    print(f"nccl-check: round {round_i + 1}/{params.rounds}, set {name} ({es.how}), "
                          f"{world} ranks ...", flush=True)
                t0 = time.monotonic()
                tag = f"{name}.r{round_i}"
                try:
                    with rec.step(f"set:{name}", round=round_i):
                        results = _run_set(params, tag, es, world, tested, work, entry)
                    if entry["status"] != "failed":
                        entry["status"] = "ok"
                except SetFailed as exc:
                    entry["status"] = "failed"
                    entry["error"] = ((entry["error"] or "") + f"round {round_i}: {exc}")[:6000]
                    results = []
                entry["elapsed_s"] = round(entry["elapsed_s"] + time.monotonic() - t0, 3)
                for rank in range(world):
                    pid = next((r.get("pid") for r in results if r.get("rank") == rank), None)
                    logs.append((f"{name} round {round_i}", rank, pid, work / f"{tag}.rank{rank}.log"))
                if results:
                    _collect(params, entry, es, round_i, results, work)
                    lat_rows.extend({"round": round_i, **row} for row in _latency_rows(name, results, roles))
                rec.save()
        with rec.step("compare"):
            latency = pd.DataFrame(lat_rows, columns=_LAT_COLS)
            summary = nccl_latency.summarize_latency(latency)
            cmp = nccl_latency.compare_sets(latency, params.baseline, level=params.level, seed=params.seed)
            for entry in rec.manifest.sets:
                es = params.env_sets[entry["name"]]
                entry["effect"] = nccl_effect(params, es, entry["nccl"])
                entry["latency"] = summary[(summary["set"] == entry["name"]) & (summary["rank"] == "max")
                                           ].to_dict(orient="records")
                entry["comparisons"] = cmp[cmp["set"] == entry["name"]].to_dict(orient="records")
            latency.to_csv(rec.add_file("latency.csv"), index=False)
            summary.to_csv(rec.add_file("summary.csv"), index=False)
            rec.write_text("nccl.log", _combined_log(logs))
    result = NcclCheckResult(rec.dir, rec.manifest, latency)
    rec.set(verdict=result.verdict())
    failures = [e["name"] for e in rec.manifest.sets if e["status"] != "ok"]
    if failures:
        rec.finish("failed", f"sets failed: {', '.join(failures)} (see sets[].error and nccl.log)")
    else:
        rec.finish("ok")
    return result
