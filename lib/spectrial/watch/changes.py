"""Change points in a watch's series (accept length, tok/s per interval), found by ruptures' PELT.

Model: a piecewise-constant mean plus noise: the sum of squared deviations from each segment's mean, searched
exactly by PELT (ruptures' `KernelCPD` with the linear kernel: the same cost and search as `Pelt(model="l2")`,
in C: 5000 intervals in ~0.1 s where the pure-Python `Pelt` takes ~20 s for 2000, so re-running it on the whole
series after every interval stays cheap). Penalty per change: `PENALTY_C * sigma^2 * log(n)` (a BIC-like penalty for one mean and one
location per segment), with sigma estimated robustly from the series itself: the MAD of the first differences
/ (0.6745 * sqrt(2)) (a level shift moves one difference only, so the step does not inflate its own noise
estimate), and floored at SIGMA_FLOOR_REL of the series' median level. A series too short (< 2 * MIN_SIZE points)
yields no change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import ruptures as rpt

MIN_SIZE = 2  # intervals per segment at least
PENALTY_C = 3.0  # x sigma^2 log n; 3 keeps pure noise of a few hundred points free of false changes
# sigma is at least 1 % of the series' median level: a series steadier than that (the same prompts decoded greedily,
# whole requests per interval) would otherwise turn its granularity, a few tenths of a percent, into "changes"
SIGMA_FLOOR_REL = 0.01
METHOD = f"ruptures KernelCPD PELT (linear kernel = l2 cost, min_size {MIN_SIZE}), penalty {PENALTY_C:g} sigma^2 log n, sigma = MAD of " \
         "first differences / (0.6745 sqrt 2)"


@dataclass(frozen=True)
class Change:
    """A change point: `index` is the position (in the series given) of the first point of the new level."""

    index: int
    before_mean: float
    after_mean: float

    @property
    def relative_change(self) -> float:
        return self.after_mean / self.before_mean - 1 if self.before_mean else math.inf


def noise_sigma(values: Sequence[float]) -> float:
    """Robust noise estimate of a series: MAD of first differences / (0.6745 sqrt 2) (0 when fewer than 3
    points)."""
    x = np.asarray(values, dtype=float)
    if x.size < 3:
        return 0.0
    d = np.diff(x)
    return float(np.median(np.abs(d - np.median(d))) / (0.6745 * math.sqrt(2)))


def penalty(values: Sequence[float]) -> float:
    """The PELT penalty for this series: PENALTY_C sigma^2 log n (sigma floored at SIGMA_FLOOR_REL of the
    series' median level)."""
    x = np.asarray(values, dtype=float)
    sigma = max(noise_sigma(x), SIGMA_FLOOR_REL * abs(float(np.median(x))) if x.size else 0.0, 1e-12)
    return PENALTY_C * sigma**2 * math.log(max(x.size, 2))


def find_changes(values: Sequence[float]) -> list[Change]:
    """Change points of a piecewise-constant mean in `values` (see the module docstring), each with the means of
    the segments either side."""
    x = np.asarray(values, dtype=float)
    if x.size < 2 * MIN_SIZE or not np.all(np.isfinite(x)):
        return []
    ends = rpt.KernelCPD(kernel="linear", min_size=MIN_SIZE).fit(x.reshape(-1, 1)).predict(pen=penalty(x))
    bounds = [0, *(int(e) for e in ends)]
    out = []
    for k in range(1, len(bounds) - 1):
        before, after = x[bounds[k - 1]:bounds[k]], x[bounds[k]:bounds[k + 1]]
        out.append(Change(index=bounds[k], before_mean=float(before.mean()), after_mean=float(after.mean())))
    return out
