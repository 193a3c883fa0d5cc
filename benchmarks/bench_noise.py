"""Noise at two levels on the local llama.cpp pair: request-to-request and restart-to-restart.

Runs a trial of N restarts x M requests per arm (baseline and the real draft), interleaved, then prints
the coefficient of variation within a server start and between starts, the measured cost of a start and
of a request, and, from those, the smallest difference (as a speed-up ratio) a trial of R restarts x M
requests could detect, per minute of trial time.

    python benchmarks/bench_noise.py [--restarts 4] [--requests 6] [--params params/local.yaml] [-p NAME=VALUE]
"""

from __future__ import annotations

import argparse
import math
import time

import pandas as pd

from spectrial.params import load_params, parse_overrides
from spectrial.protocol.trial import run_trial


def mdd(cv_between: float, cv_within: float, restarts: int, requests: int, z: float = 1.96) -> float:
    """Minimum detectable relative difference of two arms' medians (normal approximation, 95 %)."""
    var_one_arm = cv_between ** 2 / restarts + cv_within ** 2 / (restarts * requests)
    return z * math.sqrt(2 * var_one_arm)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params/local.yaml")
    ap.add_argument("--restarts", type=int, default=4)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("-p", "--param", action="append", default=[])
    a = ap.parse_args()
    over = {"restarts": a.restarts, "repeats": a.requests, "order": "interleaved", "name": "bench-noise",
            **parse_overrides(a.param)}
    params = load_params(a.params, over)
    params.arms = [x for x in params.arms if x.method in ("none", "draft")] or params.arms[:1]
    t0 = time.monotonic()
    res = run_trial(params, progress=False, raise_on_failure=False)
    wall = time.monotonic() - t0
    m = res.manifest
    starts = pd.DataFrame(m["starts"])
    steps = pd.DataFrame(m["steps"])
    start_s = steps[steps["name"].str.startswith(("launch:", "ready:", "stop:"))]["elapsed_s"].sum() / len(starts)
    bench_s = steps[steps["name"].str.startswith("benchmark:")]["elapsed_s"].sum()
    req_s = bench_s / (len(starts) * (params.repeats + params.warmup))
    print(f"machine: {m['host']['fingerprint'].get('cpu_model')} x{m['host']['fingerprint'].get('cpu_count')}, "
          f"kernel {m['host']['fingerprint'].get('kernel')}; trial {res.run_dir.name}: {wall:.0f} s wall")
    print(f"per start: {start_s:.2f} s (launch+ready+stop); per request: {req_s:.2f} s "
          f"({params.max_tokens} tokens)")
    print(f"\n{'arm':<12} {'median tok/s':>12} {'CV within start':>16} {'CV between starts':>18} "
          f"{'expected from requests':>22}")
    rows = []
    for arm in m["arms"]:
        if arm.get("status") != "ok":
            print(f"{arm['name']:<12} failed: {arm.get('reason')}")
            continue
        print(f"{arm['name']:<12} {arm['tok_s']:>12.1f} {arm['cv_within_start']:>16.3f} "
              f"{arm['cv_between_starts']:>18.3f} {arm.get('cv_between_expected') or float('nan'):>22.3f}")
        rows.append(arm)
    if not rows:
        return
    cvb = max(r["cv_between_starts"] for r in rows)
    cvw = max(r["cv_within_start"] for r in rows)
    print("\nminimum detectable difference (95 %, two arms) per trial size:")
    print(f"{'restarts':>8} {'requests':>8} {'minutes':>8} {'MDD':>7} {'MDD x sqrt(min)':>16}")
    for r in (1, 2, 4, 8):
        for q in (3, 6, 12):
            minutes = 2 * r * (start_s + (q + params.warmup) * req_s) / 60
            d = mdd(cvb, cvw, r, q)
            print(f"{r:>8} {q:>8} {minutes:>8.2f} {d:>7.1%} {d * math.sqrt(minutes):>16.3f}")
    b = next((x for x in m["arms"] if x["method"] == "none"), None)
    for x in m["arms"]:
        if x is not b and x.get("verdict"):
            print(f"\n{x['name']} vs baseline: {x['speedup']:.3f}x, CI [{x['speedup_ci_low']:.3f}, "
                  f"{x['speedup_ci_high']:.3f}] -> {x['verdict']}; detectable ~{(x['min_detectable_ratio'] - 1):.1%}")


if __name__ == "__main__":
    main()
