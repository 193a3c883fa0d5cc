"""A grid sweep on a real local Slurm cluster over 1 unit and over N units: wall time, and the same best setting?

Starts the local Slurm cluster of the tests (tests/slurm_plugin.py: munged + slurmctld + slurmd, this machine's
CPUs, 2 placeholder GPUs) in a temp dir, writes a grid sweep with spectrial's tiny llama.cpp models (EAGLE-3
depth x synthetic acceptance, as params/sweep-local.yaml) and runs `spectrial sweep` with
`cluster: {executor: slurm, units: N, max_parallel: N}` for each N. Prints per N: the command's wall clock, the
merged record's cluster.wall_s and unit_s (the units' own time added up: what one host would have taken,
roughly), the best setting per scenario and concurrency, and whether every N found the same best settings.
The cluster is stopped at the end, also on Ctrl-C (the running sweep is interrupted first: it cancels its
units, which write their records).

Each unit is one sbatch job with one CPU (cpus_per_unit 1) and llama.cpp on one thread, so N units fit on an
N-core node; on this 2-core machine N > 2 queues.

    python benchmarks/bench_cluster.py [--units 1 2] [--steps 1 2 3 4] [--accept 0.6 0.9] [--concurrency 1]
                                       [--repeats 4] [--output-dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from spectrial.record.store import load_record
from spectrial.schema import Manifest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from slurm_plugin import SlurmCluster, start_cluster  # noqa: E402  (the tests' local cluster)


def sweep_params(a: argparse.Namespace, units: int, out: Path, engine_bin: str) -> dict[str, Any]:
    """The grid sweep of params/sweep-local.yaml's shape, on `units` Slurm units."""
    return {
        "name": f"bench-cluster-{units}u", "host": "local", "engine": "llamacpp", "engine_bin": engine_bin,
        "model": "tiny:target", "draft": "tiny:eagle3", "method": "eagle3", "repeats": a.repeats, "restarts": 1,
        "warmup": 1, "max_tokens": a.max_tokens, "output_dir": str(out), "state_dir": str(out / "state"),
        "work_dir": str(out / "work"), "engine_config": {"threads": 1, "ctx_size": 1024},
        "strategy": a.strategy,
        "grid": {"steps": a.steps, "synthetic_accept": a.accept, "concurrency": a.concurrency},
        "cluster": {"executor": "slurm", "units": units, "max_parallel": units,
                    "slurm": {"time_limit": a.time_limit, "cpus_per_unit": 1, "poll_s": 0.5}},
    }


def run_sweep(path: Path, run_id: str, env: dict[str, str], timeout_s: float) -> tuple[int, float, str]:
    """`spectrial sweep PATH` in its own session; Ctrl-C here is passed on to it once (it cancels its units and
    writes its record), then re-raised. Returns (exit code, wall seconds, stderr tail)."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "spectrial.cli", "sweep", str(path), "--run-id", run_id],
                            cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=120)
        raise
    wall = time.monotonic() - t0
    return proc.returncode, wall, "\n".join((out + err).strip().splitlines()[-15:])


def best_of(m: Manifest) -> dict[tuple[float | None, int], str]:
    return {(b.scenario, b.concurrency): b.best for b in m.best}


def disagreement(ref: Manifest, m: Manifest) -> list[str]:
    """Where `m` picked another best than `ref`: the reference's pick as `m` measured it (its speed-up against its
    unit's own baseline, the merge's currency) against `m`'s best and its speed-up CI (within it: a tie at this
    noise), and whether speculation pays at all there (every setting slower than the baseline: no answer to get
    wrong but "don't")."""
    out = []
    for b in m.best:
        want = best_of(ref).get((b.scenario, b.concurrency))
        if want is None or want == b.best:
            continue
        pt = next((p for p in m.points if p.arm == want and p.concurrency == b.concurrency and p.speedup), None)
        pays = "" if (b.speedup_ci_low or 0) > 1 else "; here no setting is faster than the baseline (verdict: don't)"
        if pt is None or pt.speedup is None:
            out.append(f"scenario {b.scenario} c={b.concurrency}: {b.best} (ref: {want}, not measured here){pays}")
            continue
        lo, hi = b.speedup_ci_low, b.speedup_ci_high
        inside = lo is not None and hi is not None and lo <= pt.speedup <= hi
        out.append(f"scenario {b.scenario} c={b.concurrency}: {b.best} x{b.speedup or 0:.3f} [{lo or 0:.3f}, "
                   f"{hi or 0:.3f}], ref's {want} here x{pt.speedup:.3f}: "
                   + ("within that CI (a tie at this noise)" if inside else "outside that CI") + pays)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units", type=int, nargs="+", default=[1, 2], help="unit counts to compare (first: reference)")
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 2, 3, 4], help="EAGLE-3 draft depths")
    ap.add_argument("--accept", type=float, nargs="+", default=[0.6, 0.9], help="synthetic acceptance rates")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1], help="concurrency levels")
    ap.add_argument("--repeats", type=int, default=4, help="measured requests per level and start")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--strategy", choices=["grid", "guided"], default="grid", help="the sweep's strategy")
    ap.add_argument("--time-limit", default="30", help="Slurm time limit of one unit (sbatch --time)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one sweep may take before it is stopped")
    ap.add_argument("--output-dir", type=Path, help="where the records go (default: a temp dir, removed unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir with the records and the cluster's logs")
    a = ap.parse_args()

    from spectrial.engines.llamacpp_build import ensure_llama_server
    from spectrial.models import ensure_tiny_models

    engine_bin = str(ensure_llama_server())  # as the tests' llama_server fixture: the cached build
    ensure_tiny_models()
    tmp = Path(tempfile.mkdtemp(prefix="spectrial-bc-"))  # short: munge's socket path must stay under 100 chars
    out_root = a.output_dir or tmp / "out"
    cluster: SlurmCluster | None = None
    results: dict[int, tuple[float, Manifest]] = {}
    try:
        t0 = time.monotonic()
        cluster = start_cluster(tmp / "slurm")
        print(f"Slurm cluster up in {time.monotonic() - t0:.1f} s: node {cluster.node}, {cluster.cpus} CPUs, "
              f"{cluster.gpus} placeholder GPUs (machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f})")
        n_settings = len(a.steps) * len(a.accept)
        print(f"grid: steps {a.steps} x synthetic_accept {a.accept}, concurrency {a.concurrency}: {n_settings} "
              f"settings; repeats {a.repeats}, max_tokens {a.max_tokens}, threads 1, tiny llama.cpp models\n")
        for units in a.units:
            out = out_root / f"{units}u"
            path = tmp / f"sweep-{units}u.yaml"
            path.write_text(yaml.safe_dump(sweep_params(a, units, out, engine_bin), sort_keys=False))
            run_id = f"bench-cluster-{units}u-{os.getpid()}"
            rc, wall, tail = run_sweep(path, run_id, cluster.env, a.timeout)
            if not (out / run_id / "manifest.json").is_file():
                print(f"{units} unit(s): exit {rc}, no record written\n{tail}\n")
                continue
            m = load_record(out / run_id, settle=False)
            c = m.cluster
            if rc != 0 or c is None:
                print(f"{units} unit(s): exit {rc}, {m.status}: {m.reason}\n{tail}\n")
                continue
            results[units] = (wall, m)
            print(f"{units} unit(s): {m.status}, wall {wall:.1f} s (command), cluster.wall_s {c.wall_s:.1f}, "
                  f"unit_s {c.unit_s:.1f} (the units' own time added up); {c.starts} server starts "
                  f"({c.one_host_starts} for the whole grid on one host)")
            for u in c.units:
                base = [f"{pt.tok_s:.1f}" for pt in m.points if pt.unit == u.name and pt.method == "none" and pt.tok_s]
                print(f"  {u.name} {u.state} job {u.job_id} on {u.host}: {u.elapsed_s or 0:.1f} s, its baseline "
                      f"{'/'.join(base) or '-'} tok/s; {', '.join(u.arms)}")
            for b in m.best:
                print(f"  best (scenario {b.scenario}, c={b.concurrency}): {b.best} {b.tok_s or 0:.1f} tok/s, "
                      f"x{b.speedup or 0:.3f} vs its unit's baseline; runner-up {b.runner_up}, "
                      f"best/runner-up x{b.ratio_to_runner_up or 0:.3f}")
            print()
    finally:
        if cluster is not None:
            cluster.stop()
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")

    if len(results) < 2:
        print("fewer than two unit counts finished: nothing to compare")
        return
    ref_n = a.units[0]
    if ref_n not in results:
        print(f"the reference ({ref_n} unit(s)) did not finish")
        return
    ref_wall, ref = results[ref_n]
    print(f"{'units':>5} {'wall_s':>8} {'cluster.wall_s':>15} {'unit_s':>8} {'vs ' + str(ref_n) + 'u':>8}  same best")
    for units, (wall, m) in results.items():
        c = m.cluster
        assert c is not None
        diff = disagreement(ref, m)
        print(f"{units:>5} {wall:>8.1f} {c.wall_s or 0:>15.1f} {c.unit_s or 0:>8.1f} {wall / ref_wall:>8.2f}  "
              f"{'no' if diff else 'yes'}")
        for line in diff:
            print(f"      {line}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted: the running sweep cancelled its units, the cluster is stopped", file=sys.stderr)
        sys.exit(130)
