"""Change points in a watch's series (accept length, tok/s per interval), found by ruptures' PELT.

Model: a piecewise-constant mean plus noise: the sum of squared deviations from each segment's mean, searched
exactly by PELT (ruptures' `KernelCPD` with the linear kernel: the same cost and search as `Pelt(model="l2")`,
in C: 5000 intervals in ~0.1 s where the pure-Python `Pelt` takes ~20 s for 2000, so re-running it on the whole
series after every interval stays cheap). Penalty per change: `PENALTY_C * sigma^2 * log(n)` (a BIC-like penalty for one mean and one
location per segment), with sigma estimated robustly from the series itself: the MAD of the first differences
/ (0.6745 * sqrt(2)) (a level shift moves one difference only, so the step does not inflate its own noise
estimate), and floored at SIGMA_FLOOR_REL of the series' median level. A series too short (< 2 * MIN_SIZE points)
yields no change.

Counting noise (issue 42): a watch's figures are rates of whole counts over an interval (tokens per second from a
token counter that may move a request's worth at a time; accept length from accepted tokens per verify step), so a
steady server's series jumps between a few levels one count apart (64-token requests over 2 s: 112, 128, 144,
160 tok/s). Given the counts (`resolution`), the detector knows that step: the series' resolution is the counts'
quantum (their greatest common divisor) over the median denominator (interval wall time, verify steps), sigma is at
least half of it (a rate between two levels alternates between them), and a change must move the mean by at least
MIN_EFFECT_REL of the level before it and by one resolution step, with MIN_SIZE intervals on each side. A change
that fails is dropped and its two segments merged (the smallest first, means recomputed), so a steady server's
discreteness is never a change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import ruptures as rpt

MIN_SIZE = 3  # intervals per segment at least: a level held for fewer is not a level (issue 42: was 2)
MIN_EFFECT_REL = 0.05  # a change moves the mean by 5 % of the level before it at least
PENALTY_C = 3.0  # x sigma^2 log n; 3 keeps pure noise of a few hundred points free of false changes
# sigma is at least 1 % of the series' median level: a series steadier than that (the same prompts decoded greedily,
# whole requests per interval) would otherwise turn its granularity, a few tenths of a percent, into "changes"
SIGMA_FLOOR_REL = 0.01
METHOD = f"ruptures KernelCPD PELT (linear kernel = l2 cost, min_size {MIN_SIZE}), penalty {PENALTY_C:g} sigma^2 log n, sigma = MAD of " \
         "first differences / (0.6745 sqrt 2), at least half the counts' resolution; a change moves the mean by " \
         f"{MIN_EFFECT_REL:.0%} and one resolution step at least"


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


def resolution(counts: Sequence[float | None], denominators: Sequence[float | None]) -> float:
    """The step between two neighbouring values of a rate `count / denominator`: the counts' quantum (the
    greatest common divisor of the whole counts; 1 where they are not whole) over the median denominator. 0 where
    nothing was counted."""
    c = np.array([v for v in counts if v is not None and v > 0], dtype=float)
    d = np.array([v for v in denominators if v is not None and v > 0], dtype=float)
    if not c.size or not d.size:
        return 0.0
    whole = np.round(c)
    quantum = float(np.gcd.reduce(whole.astype(np.int64))) if np.allclose(c, whole) else 1.0
    return quantum / float(np.median(d))


def sigma_of(values: Sequence[float], step: float = 0.0) -> float:
    """The noise the penalty assumes: the robust estimate, at least SIGMA_FLOOR_REL of the median level and half
    the series' resolution `step`."""
    x = np.asarray(values, dtype=float)
    return max(noise_sigma(x), SIGMA_FLOOR_REL * abs(float(np.median(x))) if x.size else 0.0, step / 2, 1e-12)


def penalty(values: Sequence[float], step: float = 0.0) -> float:
    """The PELT penalty for this series: PENALTY_C sigma^2 log n (sigma: :func:`sigma_of`)."""
    x = np.asarray(values, dtype=float)
    return PENALTY_C * sigma_of(x, step) ** 2 * math.log(max(x.size, 2))


def _large_enough(before: float, after: float, step: float) -> bool:
    effect = abs(after - before)
    return effect >= MIN_EFFECT_REL * abs(before) and effect >= step


def find_changes(values: Sequence[float], step: float = 0.0) -> list[Change]:
    """Change points of a piecewise-constant mean in `values` (see the module docstring), each with the means of
    the segments either side. `step`: the series' resolution (:func:`resolution`; 0: not known)."""
    x = np.asarray(values, dtype=float)
    if x.size < 2 * MIN_SIZE or not np.all(np.isfinite(x)):
        return []
    ends = rpt.KernelCPD(kernel="linear", min_size=MIN_SIZE).fit(x.reshape(-1, 1)).predict(pen=penalty(x, step))
    bounds = [0, *(int(e) for e in ends)]
    while len(bounds) > 2:  # merge across the smallest change that is not large enough, until none is left
        means = [float(x[a:b].mean()) for a, b in zip(bounds, bounds[1:], strict=False)]
        small = [(abs(means[k] - means[k - 1]), k) for k in range(1, len(means))
                 if not _large_enough(means[k - 1], means[k], step)]
        if not small:
            break
        del bounds[min(small)[1]]
    out = []
    for k in range(1, len(bounds) - 1):
        before, after = x[bounds[k - 1]:bounds[k]], x[bounds[k]:bounds[k + 1]]
        out.append(Change(index=bounds[k], before_mean=float(before.mean()), after_mean=float(after.mean())))
    return out
