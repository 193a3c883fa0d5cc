"""Grid against guided on the same grid: server restarts, wall time, best tok/s found and its gap to the grid's.

Live (default, the local llama.cpp pair of params/sweep-local.yaml): runs the grid sweep, then the guided
sweep, then replays guided on the grid's own record (same decisions code, each "start" read from the grid
record: the search judged on identical measurements, free of drift between the two live runs).
With --replay RUN_DIR (a committed grid sweep record, e.g. from a GPU host) it only replays.

For each scenario (acceptance) and concurrency level: the grid's best setting with its CI; the setting the
guided search calls best, its tok/s in the grid record and the gap to the grid's best; whether that lies
within the grid-best's CI. Target: within the CI everywhere, with <= 40 % of the grid's server starts.

    python benchmarks/bench_sweep.py [--params params/sweep-local.yaml] [-p NAME=VALUE] [--replay RUN_DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from spectrial.params import parse_overrides
from spectrial.records import load_manifest
from spectrial.sweep import load_sweep_params, replay, run_sweep

TARGET_SHARE = 0.40


def best_rows(manifest: dict[str, Any]) -> dict[tuple[Any, int], dict[str, Any]]:
    return {(b["scenario"], b["concurrency"]): b for b in manifest.get("best") or [] if b.get("best")}


def point(manifest: dict[str, Any], setting: str, c: int) -> dict[str, Any] | None:
    return next((p for p in manifest["points"] if p["setting"] == setting and p["concurrency"] == c
                 and p["status"] == "ok"), None)


def judge(grid: dict[str, Any], other: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """Per scenario and concurrency: the other strategy's best, measured in the grid record, against the grid's."""
    rows, ok = [], True
    gb = best_rows(grid)
    for key, ob in best_rows(other).items():
        g = gb.get(key)
        if g is None:
            continue
        same = point(grid, ob["best"], key[1])
        in_grid = same["tok_s"] if same else None
        within = in_grid is not None and in_grid >= (g.get("tok_s_ci_low") or g["tok_s"])
        ok = ok and within
        rows.append({"scenario": key[0], "c": key[1], "grid_best": g["best"], "grid_tok_s": g["tok_s"],
                     "grid_ci": (g.get("tok_s_ci_low"), g.get("tok_s_ci_high")), "found": ob["best"],
                     "found_own_tok_s": ob["tok_s"], "found_in_grid_tok_s": in_grid,
                     "gap": None if in_grid is None else (g["tok_s"] - in_grid) / g["tok_s"], "within_ci": within})
    return rows, ok


def _f(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def report(label: str, grid: dict[str, Any], other: dict[str, Any], wall_s: float | None) -> bool:
    b, gb = other["budget"], grid["budget"]
    share = b["restarts"] / gb["restarts"]
    rows, within = judge(grid, other)
    print(f"\n== {label}: {b['restarts']} server starts = {share:.0%} of the grid's {gb['restarts']}; "
          f"wall {_f(wall_s if wall_s is not None else b['wall_s'], '.0f')} s (grid {gb['wall_s']:.0f} s); "
          f"stopped by: {b['stopped_by']}")
    print(f"{'scenario':>9} {'c':>2} {'grid best':>18} {'tok/s [CI]':>26} {'found':>18} {'own tok/s':>10} "
          f"{'in grid':>8} {'gap':>7} {'within CI':>9}")
    for r in rows:
        ci = f"{_f(r['grid_tok_s'])} [{_f(r['grid_ci'][0])}, {_f(r['grid_ci'][1])}]"
        print(f"{_f(r['scenario'], 'g') if r['scenario'] is not None else 'real':>9} {r['c']:>2} {r['grid_best']:>18} "
              f"{ci:>26} {r['found']:>18} {_f(r['found_own_tok_s']):>10} {_f(r['found_in_grid_tok_s']):>8} "
              f"{_f(None if r['gap'] is None else r['gap'] * 100, '.1f') + '%':>7} {'yes' if r['within_ci'] else 'NO':>9}")
    met = within and share <= TARGET_SHARE
    print(f"target (within the grid-best's CI everywhere, <= {TARGET_SHARE:.0%} of the starts): "
          f"{'MET' if met else 'NOT MET'}")
    return met


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params/sweep-local.yaml")
    ap.add_argument("-p", "--param", action="append", default=[])
    ap.add_argument("--replay", type=Path, help="a grid sweep record to replay guided on (no live runs)")
    ap.add_argument("--output-dir", default="outputs/bench-sweep")
    a = ap.parse_args()
    over = parse_overrides(a.param)
    if a.replay:
        grid = load_manifest(a.replay)
        rep = replay(a.replay, over, raise_on_failure=False)
        print(f"grid record {a.replay.name}: {grid['budget']['restarts']} starts, {grid['budget']['wall_s']:.0f} s")
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
        fp = fp or results[strategy].manifest["host"].get("fingerprint") or {}
    grid = results["grid"].manifest
    print(f"machine: {fp.get('cpu_model')} x{fp.get('cpu_count')} (shared with other jobs: noisy), "
          f"engine {sweep.trial.engine}, {len(sweep.settings())} settings x concurrency "
          f"{sweep.concurrency_levels()}, {sweep.trial.repeats} requests x {sweep.trial.max_tokens} tokens per level")
    print(f"grid: {grid['budget']['restarts']} starts, {walls['grid']:.0f} s, record {results['grid'].run_dir.name}")
    report("guided, live", grid, results["guided"].manifest, walls["guided"])
    rep = replay(results["grid"].run_dir, raise_on_failure=False)
    report("guided, replayed on the grid record", grid, rep.manifest, None)


if __name__ == "__main__":
    main()
