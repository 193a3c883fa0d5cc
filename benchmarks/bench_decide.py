"""Server starts to a decision: decide's design against a fixed design, by simulation (issue 36's table).

For true speed-ups {0.74x, 0.90x, 0.95x, 1.00x, 1.05x, 1.5x} x start-to-start spread {2 %, 5 %, 10 %} (and 8 %, the
original case's) x history {none, 3 earlier runs}: the median and 90th-percentile server starts to a decision, the
share decided within the budget, the wrong-decision rate (the wrong direction; for 1.00x any claim), and the starts
of a fixed paired design with 80 % power for the same effect (a paired t-test; 2 starts a round, one arm).

What is simulated (the same computation a decide run makes: `spectrial.analysis.sequential.forecast` -> `looks`):
- spread s is the SD of one server start's log decode rate (start-to-start CV); a round pairs one baseline start
  with one arm start, so its log ratio has SD s x sqrt 2 (a drift shared by the round's two starts cancels);
- "3 earlier runs": this host's records hold 3 runs with 3 starts each of the baseline and of one arm, at the same
  spread (12 degrees of freedom of the start-to-start variance, `prior_from_starts`); the prior is drawn afresh for
  every simulated trial, so its own sampling error is part of the figures;
- "misleading history": the earlier runs spread 2x (or 3x) less than today's (a quiet week, then a noisy neighbour):
  the rows that show what the F-test guard lets through.

    python benchmarks/bench_decide.py [--paths 4000] [--max-rounds 100] [--margin 0.05] [--quick] [--savvi]

--savvi adds the confidence sequence decide used before this design on the key cells (slow: per round).
Figures are medians over `--paths` simulated trials (five times as many for 1.00x, where the false-claim rate is the
figure) with a fixed seed: the same command prints the same table.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from spectrial.analysis.sequential import SpreadPrior, forecast, power_rounds, prior_from_starts

EFFECTS = (0.74, 0.90, 0.95, 1.00, 1.05, 1.5)
SPREADS = (0.02, 0.05, 0.10)
HISTORY_RUNS, HISTORY_STARTS = 3, 3
ORIGINAL = (0.736, 0.08)  # 60.5 vs 82.2 tok/s, 8 % start-to-start spread


def history_priors(spread: float, paths: int, seed: int) -> tuple[np.ndarray, int]:
    """Per simulated trial, the prior this host's 3 earlier runs give (baseline and one arm, 3 starts each)."""
    rng = np.random.default_rng(seed + 7919)
    sds, df = np.empty(paths), 0
    for i in range(paths):
        groups = np.exp(rng.normal(0.0, spread, (HISTORY_RUNS * 2, HISTORY_STARTS))) * 100.0
        prior: SpreadPrior | None = prior_from_starts(groups.tolist())
        assert prior is not None
        sds[i], df = prior.sd_log, prior.df
    return sds, df


def cell(effect: float, spread: float, history: str, paths: int, horizon: int, seed: int,
         margin: float | None = None, history_spread: float | None = None) -> dict[str, object]:
    """One cell of the table: starts to a decision (2 per round), decided share, wrong share, the fixed design."""
    prior_sd, df = (None, 0)
    if effect == 1.0:
        paths *= 5  # a false-claim rate near 5 %: five times the trials for a tenth of a point of simulation error
    if history != "none":
        prior_sd, df = history_priors(history_spread or spread, paths, seed)
    f = forecast(effect, spread * math.sqrt(2.0), max_rounds=horizon, margin=margin, prior_sd=prior_sd,
                 prior_df=df, paths=paths, seed=seed)
    fixed = None if effect == 1.0 else 2 * power_rounds(effect, spread * math.sqrt(2.0))
    return {"effect": f"{effect:.2f}x", "spread": f"{spread:.0%}", "history": history,
            "median starts": 2 * f.median_rounds, "p90 starts": 2 * f.p90_rounds, "decided": f"{f.decided:.1%}",
            "wrong": f"{f.wrong:.2%}" + (f" ± {math.sqrt(f.wrong * (1 - f.wrong) / f.paths):.2%}"
                                          if effect == 1.0 else ""),
            "fixed 80 % starts": fixed if fixed is not None else "-"}


def table(rows: list[dict[str, object]]) -> str:
    cols = list(rows[0])
    width = {c: max(len(c), *(len(_fmt(r[c])) for r in rows)) for c in cols}
    head = " | ".join(c.rjust(width[c]) for c in cols)
    line = "-|-".join("-" * width[c] for c in cols)
    return "\n".join([head, line, *(" | ".join(_fmt(r[c]).rjust(width[c]) for c in cols) for r in rows)])


def _fmt(v: object) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def savvi_rounds(effect: float, sd_log: float, paths: int, horizon: int, seed: int) -> tuple[float, float]:
    """Today's (until issue 36) confidence sequence: median and p90 rounds to a decision (looks every round)."""
    from spectrial.analysis.sequential import PairedSequence

    rng = np.random.default_rng(seed)
    rounds = []
    for _ in range(paths):
        seq = PairedSequence()
        n = horizon
        for i in range(horizon):
            seq.add(100.0, 100.0 * math.exp(math.log(effect) + sd_log * rng.standard_normal()))
            if seq.status() != "undecided":
                n = i + 1
                break
        rounds.append(n)
    return float(np.median(rounds)), float(np.percentile(rounds, 90))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", type=int, default=4000, help="simulated trials per cell")
    ap.add_argument("--max-rounds", type=int, default=100, help="decide.max_rounds (the horizon)")
    ap.add_argument("--margin", type=float, default=None, help="decide.margin (default none: 1.00x never settles)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="the original case and the 5 %% effect only")
    ap.add_argument("--savvi", action="store_true", help="also today's confidence sequence on the key cells")
    a = ap.parse_args()
    t0 = time.monotonic()
    print(f"decide: group-sequential repeated t-intervals, 95 %, horizon {a.max_rounds} rounds, margin "
          f"{a.margin if a.margin else 'none'}; {a.paths} simulated trials per cell; starts = 2 per round (one arm)\n")
    grid = [(e, s) for s in SPREADS for e in EFFECTS] if not a.quick else [(1.05, s) for s in SPREADS]
    grid.append(ORIGINAL)
    rows = [cell(e, s, h, a.paths, a.max_rounds, a.seed, a.margin) for e, s in grid for h in ("none", "3 earlier runs")]
    print(table(rows))
    print("\nMisleading history: the earlier runs spread less than today (what the F-test guard lets through)")
    wrong_rows = [cell(e, s, f"3 runs at {s / k:.1%}", a.paths, a.max_rounds, a.seed, a.margin, history_spread=s / k)
                  for e, s in ((1.0, 0.05), (1.0, 0.10), (0.95, 0.10), ORIGINAL) for k in (2, 3)]
    print(table(wrong_rows))
    if a.margin is None and not a.quick:
        print("\nWith an equivalence margin of 5 %: 1.00x settles as 'equivalent'")
        print(table([cell(1.0, s, h, a.paths, a.max_rounds, a.seed, 0.05) for s in SPREADS
                     for h in ("none", "3 earlier runs")]))
    if a.savvi:
        n = max(200, a.paths // 20)
        print(f"\nToday's confidence sequence (savvi, phi 1; {n} trials per cell) on the same cells, starts:")
        out = []
        for e, s in (ORIGINAL, (1.05, 0.02), (1.05, 0.05), (0.90, 0.05)):
            med, p90 = savvi_rounds(e, s * math.sqrt(2.0), n, a.max_rounds, a.seed)
            new = cell(e, s, "none", a.paths, a.max_rounds, a.seed)
            out.append({"effect": f"{e:.2f}x", "spread": f"{s:.0%}", "savvi median": 2 * med, "savvi p90": 2 * p90,
                        "new median": new["median starts"], "new p90": new["p90 starts"]})
        print(table(out))
    print(f"\n({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
