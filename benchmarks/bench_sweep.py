"""Grid against guided on the same grid: server restarts, wall time, best tok/s found and its gap to the grid's.

Live (default, the local llama.cpp pair of params/sweep-local.yaml): runs the grid sweep, then the guided
sweep, then replays guided on the grid's own record (same decisions code, each "start" read from the grid
record: the search judged on identical measurements, free of drift between the two live runs).
With --replay RUN_DIR [RUN_DIR ...] (finished grid sweep records, e.g. from a GPU host) it only replays.
With --worlds N it runs known worlds (spectrial.sweep.world: cost, acceptance and noise fixed, the true best
known) N seeds each: a simulated grid, guided replayed on it, and the gap of guided's pick to the TRUE best.

For each scenario (acceptance) and concurrency level: the grid's best setting with its CI; the setting the
guided search calls best, its tok/s in the grid record and the gap to the grid's best; whether that lies
within the grid-best's CI. Target: within the CI everywhere, with <= 40 % of the grid's server starts.

    python benchmarks/bench_sweep.py [--params params/sweep-local.yaml] [-p NAME=VALUE] [--replay RUN_DIR ...]
                                     [--worlds SEEDS] [--output-dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from spectrial.params import parse_overrides
from spectrial.record.store import load_record
from spectrial.schema import Manifest, SweepBudget
from spectrial.sweep import load_sweep_params, replay, run_sweep
from spectrial.sweep.replayer import judge
from spectrial.sweep.world import World, simulate

TARGET_SHARE = 0.40


def _grid(steps: list[int], **grid: Any) -> dict[str, Any]:
    return {"name": "world", "model": "world:target", "draft": "world:draft", "repeats": 3, "max_tokens": 64,
            "grid": {"steps": steps, **grid}}


# Known worlds: GPU-like (the H200 record's shape and a batch-sensitive one), CPU-like (large noise), SGLang-
# like (real acceptance only, ten depths), deep-optimum, large start-to-start noise, cycles that grow with
# accepted tokens, an expensive draft, and an engine that accepts less than its synthetic rate says.
WORLDS: dict[str, tuple[dict[str, Any], World]] = {
    "gpu-4-scenarios": (_grid([1, 2, 3, 4, 5, 6], synthetic_accept=[None, 0.9, 0.6, 0.75]),
                        World(fixed_ms=8.4, per_draft_ms=0.85, accepted_ms=0.3, fixed_growth=0, draft_growth=0,
                              real_p1=0.75, real_decay=0.85, request_sigma=0.03, start_sigma=0.02)),
    "gpu-batch": (_grid([1, 2, 3, 4, 6, 8], synthetic_accept=[0.5, 0.7, 0.85, 0.95], concurrency=[1, 4]),
                  World(fixed_ms=6, per_draft_ms=0.5, accepted_ms=0.1, fixed_growth=0.2, draft_growth=0.8,
                        request_sigma=0.04, start_sigma=0.03)),
    "cpu-noisy": (_grid([1, 2, 3, 4, 6, 8], synthetic_accept=[0.6, 0.9], concurrency=[1, 2]),
                  World(fixed_ms=10, per_draft_ms=2.5, fixed_growth=0.5, draft_growth=1.0, base_ms=4,
                        request_sigma=0.25, start_sigma=0.15)),
    "sglang-real": (_grid(list(range(1, 11)), concurrency=[1, 2]),
                    World(fixed_ms=6, per_draft_ms=1.0, fixed_growth=0.05, draft_growth=0.05, real_p1=0.7,
                          real_decay=0.7, request_sigma=0.08, start_sigma=0.03)),
    "deep-optimum": (_grid([1, 2, 3, 4, 5, 6, 7, 8], synthetic_accept=[None, 0.8]),
                     World(fixed_ms=12, per_draft_ms=0.4, real_p1=0.9, real_decay=0.92, request_sigma=0.02,
                           start_sigma=0.02)),
    "start-noise": (_grid([1, 2, 3, 4, 5, 6], synthetic_accept=[None, 0.9, 0.6, 0.75]),
                    World(fixed_ms=8.4, per_draft_ms=0.85, accepted_ms=0.3, fixed_growth=0, draft_growth=0,
                          real_p1=0.75, real_decay=0.85, request_sigma=0.03, start_sigma=0.08)),
    "accept-cost": (_grid([1, 2, 3, 4, 6, 8], synthetic_accept=[0.5, 0.8, 0.95], concurrency=[1, 2]),
                    World(fixed_ms=7, per_draft_ms=0.6, accepted_ms=1.0, request_sigma=0.04, start_sigma=0.03)),
    "draft-bound": (_grid([1, 2, 3, 4, 5, 6], synthetic_accept=[None, 0.7, 0.9]),
                    World(fixed_ms=5, per_draft_ms=3, real_p1=0.85, real_decay=0.9, request_sigma=0.05,
                          start_sigma=0.03)),
    "prior-off": (_grid([1, 2, 3, 4, 6, 8], synthetic_accept=[0.6, 0.75, 0.9], concurrency=[1, 2]),
                  World(fixed_ms=8, per_draft_ms=0.8, synthetic_scale=0.85, request_sigma=0.04, start_sigma=0.03)),
}


def _f(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def _budget(m: Manifest) -> SweepBudget:
    if m.budget is None:
        raise SystemExit(f"run {m.run_id} is not a finished sweep (no budget in its record)")
    return m.budget


def report(label: str, grid: Manifest, other: Manifest, wall_s: float | None) -> bool:
    b, gb = _budget(other), _budget(grid)
    share = b.restarts / gb.restarts
    rows = judge(grid, other)
    within = bool(rows) and all(r.within_ci for r in rows)
    print(f"\n== {label}: {b.restarts} server starts = {share:.0%} of the grid's {gb.restarts}; "
          f"wall {_f(wall_s if wall_s is not None else b.wall_s, '.0f')} s (grid {gb.wall_s:.0f} s); "
          f"stopped by: {b.stopped_by}")
    print(f"{'scenario':>9} {'c':>2} {'grid best':>18} {'tok/s [CI]':>26} {'found':>18} {'own tok/s':>10} "
          f"{'in grid':>8} {'gap':>7} {'within CI':>9}")
    for r in rows:
        ci = f"{_f(r.grid_tok_s)} [{_f(r.grid_ci[0])}, {_f(r.grid_ci[1])}]"
        print(f"{_f(r.scenario, 'g') if r.scenario is not None else 'real':>9} {r.c:>2} {r.grid_best:>18} "
              f"{ci:>26} {r.found:>18} {_f(r.found_own_tok_s):>10} {_f(r.found_in_grid_tok_s):>8} "
              f"{_f(None if r.gap is None else r.gap * 100, '.1f') + '%':>7} {'yes' if r.within_ci else 'NO':>9}")
    met = within and share <= TARGET_SHARE
    print(f"target (within the grid-best's CI everywhere, <= {TARGET_SHARE:.0%} of the starts): "
          f"{'MET' if met else 'NOT MET'}")
    return met


def worlds(seeds: int, output_dir: Path, over: dict[str, Any]) -> None:
    """Every known world, `seeds` seeds each: share of the grid's starts, cells within the grid-best's CI, and
    the gap of guided's pick to the true best (and of the grid's own pick, the noise floor)."""
    print(f"{'world':>16} {'starts (share of grid)':>24} {'within CI':>10} {'runs all within':>15} "
          f"{'true gap mean/max':>18} {'grid true gap':>14}")
    for name, (data, world) in WORLDS.items():
        share, cells, within, runs_ok, gaps, grid_gaps, starts = [], 0, 0, 0, [], [], []
        for seed in range(seeds):
            p = load_sweep_params(data=data, overrides={"strategy": "grid", "seed": seed})
            grid = simulate(p, world, seed=seed, output_dir=output_dir)
            guided = replay(grid.run_dir, over, output_dir=output_dir, raise_on_failure=False).manifest
            rows = judge(grid.manifest, guided)
            truth = world.best(p)
            arms = {p.arm(s).name: s for s in p.settings()}
            for b, g in ((guided, gaps), (grid.manifest, grid_gaps)):
                g.append(max(1 - world.tok_s(arms[x.best], x.concurrency) / truth[(x.scenario, x.concurrency)][1]
                             for x in b.best if x.best))
            starts.append(_budget(guided).restarts)
            share.append(_budget(guided).restarts / _budget(grid.manifest).restarts)
            cells += len(rows)
            within += sum(r.within_ci for r in rows)
            runs_ok += all(r.within_ci for r in rows)
        print(f"{name:>16} {f'{statistics.mean(starts):.1f} ({statistics.mean(share):.0%}, max {max(share):.0%})':>24} "
              f"{f'{within}/{cells}':>10} {f'{runs_ok}/{seeds}':>15} "
              f"{f'{statistics.mean(gaps):.1%} / {max(gaps):.1%}':>18} {f'{statistics.mean(grid_gaps):.1%}':>14}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params/sweep-local.yaml")
    ap.add_argument("-p", "--param", action="append", default=[])
    ap.add_argument("--replay", type=Path, nargs="+", help="grid sweep records to replay guided on (no live runs)")
    ap.add_argument("--worlds", type=int, metavar="SEEDS", help="run the known worlds, SEEDS seeds each")
    ap.add_argument("--output-dir", default="outputs/bench-sweep")
    a = ap.parse_args()
    over = parse_overrides(a.param)
    if a.worlds:
        worlds(a.worlds, Path(a.output_dir), over)
        return
    if a.replay:
        for run in a.replay:
            grid = load_record(run, settle=False)
            rep = replay(run, over, output_dir=a.output_dir, raise_on_failure=False)
            print(f"\ngrid record {run.name}: {_budget(grid).restarts} starts, {_budget(grid).wall_s:.0f} s")
            report("guided, replayed on the grid record", grid, rep.manifest, None)
        return
    base = {"output_dir": a.output_dir, **over}
    sweep = load_sweep_params(a.params, base)
    fp = None
    walls: dict[str, float] = {}
    results = {}
    for strategy in ("grid", "guided"):
        t0 = time.monotonic()
        results[strategy] = run_sweep(load_sweep_params(a.params, {**base, "strategy": strategy, "budget_s": None}),
                                      progress=False, raise_on_failure=False)
        walls[strategy] = time.monotonic() - t0
        fp = fp or results[strategy].manifest.host.fingerprint
    grid = results["grid"].manifest
    print(f"machine: {fp.cpu_model if fp else None} x{fp.cpu_count if fp else None} (shared with other jobs: noisy), "
          f"engine {sweep.trial.engine}, {len(sweep.settings())} settings x concurrency "
          f"{sweep.concurrency_levels()}, {sweep.trial.repeats} requests x {sweep.trial.max_tokens} tokens per level")
    print(f"grid: {_budget(grid).restarts} starts, {walls['grid']:.0f} s, record {results['grid'].run_dir.name}")
    report("guided, live", grid, results["guided"].manifest, walls["guided"])
    rep = replay(results["grid"].run_dir, output_dir=a.output_dir, raise_on_failure=False)
    report("guided, replayed on the grid record", grid, rep.manifest, None)


if __name__ == "__main__":
    main()
