"""Spread, bootstrap confidence intervals and arm comparisons for repeated measurements.

All bootstraps are percentile bootstraps, vectorised with numpy, and deterministic for a given
``seed`` (``numpy.random.default_rng(seed)``). ``stat`` is a numpy reduction that accepts ``axis=``
(``np.median`` by default, ``np.mean`` ...); other callables are applied row by row (slower).

Two-level data (requests within server restarts): restart-to-restart drift is usually larger than
request-to-request noise, so ``bootstrap_ci_two_level`` resamples restarts first, then requests within
each chosen restart, and ``two_level_spread`` reports both coefficients of variation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Real
from statistics import NormalDist
from typing import Any, Literal, NamedTuple

import numpy as np
import pandas as pd

from spectrial.errors import ConfigError

__all__ = [
    "Comparison",
    "ConfidenceInterval",
    "TwoLevelSpread",
    "Verdict",
    "bootstrap_ci",
    "bootstrap_ci_two_level",
    "bootstrap_ratio_ci",
    "compare_arms",
    "summarize",
    "two_level_spread",
]

StatFn = Callable[..., Any]
Verdict = Literal["faster", "slower", "not distinguishable at this noise"]
NOT_DISTINGUISHABLE: Verdict = "not distinguishable at this noise"

_MAX_CHUNK_ELEMENTS = 4_000_000  # resampled values held in memory at once
_NAN_AWARE: dict[Any, StatFn] = {np.median: np.nanmedian, np.mean: np.nanmean}


class ConfidenceInterval(NamedTuple):
    """A point estimate with its percentile-bootstrap interval at ``level`` (e.g. 0.95)."""

    estimate: float
    low: float
    high: float
    level: float


@dataclass(frozen=True)
class TwoLevelSpread:
    """Request-to-request and restart-to-restart spread of one arm.

    within_cv: pooled within-restart SD / grand mean, SD = sqrt(sum_g sum_i (x_gi - mean_g)^2 / (N - G)).
    between_cv: SD (ddof 1) of the restart medians / their mean (NaN with one restart).
    expected_between_cv: what request noise alone would give the restart medians,
    ~ within_cv * sqrt(pi / (2 n)), n the harmonic mean of requests per restart (normal approximation);
    between_cv well above it means restarts differ (re-measure the baseline in the same session).
    """

    n_groups: int
    n_values: int
    grand_median: float
    within_cv: float
    between_cv: float
    expected_between_cv: float
    group_medians: pd.Series


@dataclass(frozen=True)
class Comparison:
    """Speculative arm vs baseline: ratio = stat(spec) / stat(base) with its bootstrap CI.

    verdict: "faster" when the CI lies wholly on the better side of 1, "slower" when wholly on the worse
    side, else "not distinguishable at this noise" (with ``higher_is_better`` False, e.g. latencies,
    a ratio below 1 is faster).
    min_detectable_ratio: exp of the CI half-width in log space, sqrt(ci_high / ci_low) (>= 1); a true
    ratio that far from 1 would have produced a CI excluding 1 about half the time (50 % power), so
    differences smaller than (min_detectable_ratio - 1) could not have been seen by this run.
    min_detectable_ratio_80: the same at ~80 % power, exp(log(mdr) * (z_(1-a/2) + z_0.8) / z_(1-a/2)).
    """

    ratio: float
    ci_low: float
    ci_high: float
    level: float
    verdict: Verdict
    min_detectable_ratio: float
    min_detectable_ratio_80: float
    spec_estimate: float
    base_estimate: float
    n_spec: int
    n_base: int

    def __str__(self) -> str:
        pct = round(self.level * 100)
        return (f"spec/base = {self.ratio:.3f} [{self.ci_low:.3f}, {self.ci_high:.3f}] ({pct}% CI; "
                f"{self.spec_estimate:.4g} vs {self.base_estimate:.4g}, n={self.n_spec}/{self.n_base}): "
                f"{self.verdict}; smallest detectable difference ~{(self.min_detectable_ratio - 1) * 100:.1f}%")


def _values(values: Sequence[float] | np.ndarray | pd.Series, name: str, min_n: int = 1) -> np.ndarray:
    if isinstance(values, pd.DataFrame):
        raise ConfigError(f"{name} is a DataFrame: pass one column (df['tok_s']) or, for requests within "
                          "restarts, group_col= and value_col=")
    try:
        x = np.asarray(values, dtype=float).ravel()
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} must be a sequence of numbers: {exc}") from exc
    if x.size < min_n:
        raise ConfigError(f"{name} has {x.size} value(s); at least {min_n} needed")
    if not np.all(np.isfinite(x)):
        raise ConfigError(f"{name} contains NaN or inf: drop failed requests before computing statistics")
    return x


def _check_boot_args(level: float, n_boot: int) -> None:
    if isinstance(level, bool) or not isinstance(level, Real) or not 0.0 < level < 1.0:
        raise ConfigError(f"level must lie strictly between 0 and 1 (e.g. 0.95), got {level!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 100:
        raise ConfigError(f"n_boot must be an integer >= 100 (2000 is a good default), got {n_boot!r}")


def _apply_stat(stat: StatFn, samples: np.ndarray) -> np.ndarray:
    """stat over axis 1 of a 2-D array; NaN marks padding (two-level resamples of unequal groups)."""
    if np.isnan(samples).any():
        nan_fn = _NAN_AWARE.get(stat)
        if nan_fn is not None:
            return np.asarray(nan_fn(samples, axis=1), dtype=float)
        return np.array([float(stat(row[~np.isnan(row)])) for row in samples])
    try:
        out = np.asarray(stat(samples, axis=1), dtype=float)
        if out.shape == (samples.shape[0],):
            return out
    except TypeError:
        pass
    return np.array([float(stat(row)) for row in samples])


def _chunks(n_boot: int, per_boot: int) -> list[int]:
    size = max(1, _MAX_CHUNK_ELEMENTS // max(per_boot, 1))
    return [min(size, n_boot - i) for i in range(0, n_boot, size)]


def _boot_one_level(x: np.ndarray, stat: StatFn, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    parts = [_apply_stat(stat, x[rng.integers(0, x.size, size=(m, x.size))]) for m in _chunks(n_boot, x.size)]
    return np.concatenate(parts)


def _groups(df: pd.DataFrame, group_col: str, value_col: str, name: str) -> tuple[list[Any], list[np.ndarray]]:
    if not isinstance(df, pd.DataFrame):
        raise ConfigError(f"{name} must be a pandas DataFrame with columns {group_col!r} and {value_col!r}")
    missing = [c for c in (group_col, value_col) if c not in df.columns]
    if missing:
        raise ConfigError(f"{name} lacks column(s) {missing}; it has {list(df.columns)}: "
                          "pass group_col (restart id) and value_col (the measurement)")
    keys, groups = [], []
    for key, g in df.groupby(group_col, sort=True):
        keys.append(key)
        groups.append(_values(g[value_col].to_numpy(), f"{name}[{value_col}] of {group_col}={key!r}"))
    if not groups:
        raise ConfigError(f"{name} is empty")
    return keys, groups


def _boot_two_level(groups: list[np.ndarray], stat: StatFn, n_boot: int,
                    rng: np.random.Generator) -> np.ndarray:
    n_g = len(groups)
    sizes = np.array([g.size for g in groups])
    width = int(sizes.max())
    table = np.full((n_g, width), np.nan)
    for i, g in enumerate(groups):
        table[i, : g.size] = g
    parts = []
    for m in _chunks(n_boot, n_g * width):
        gi = rng.integers(0, n_g, size=(m, n_g))                      # restarts, with replacement
        sz = sizes[gi][..., None]                                      # (m, G, 1)
        wi = np.floor(rng.random((m, n_g, width)) * sz).astype(np.int64)  # requests within each restart
        vals = table[gi[..., None], wi]
        vals[np.arange(width) >= sz] = np.nan                          # pad shorter restarts
        parts.append(_apply_stat(stat, vals.reshape(m, n_g * width)))
    return np.concatenate(parts)


def _quantiles(dist: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1.0 - float(level)) / 2.0
    lo, hi = np.quantile(dist, [tail, 1.0 - tail])
    return float(lo), float(hi)


def summarize(values: Sequence[float] | np.ndarray | pd.Series) -> dict[str, float]:
    """Descriptive statistics: n, median, mean, std (ddof 1), q1, q3, iqr = q3 - q1, min, max, cv = std / mean.

    std and cv are NaN for a single value; quantiles use numpy's default (linear) interpolation.
    """
    x = _values(values, "values")
    q1, med, q3 = (float(v) for v in np.quantile(x, [0.25, 0.5, 0.75]))
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if x.size > 1 else math.nan
    return {"n": int(x.size), "median": med, "mean": mean, "std": std, "q1": q1, "q3": q3,
            "iqr": q3 - q1, "min": float(x.min()), "max": float(x.max()),
            "cv": std / mean if mean != 0 else math.nan}


def bootstrap_ci(values: Sequence[float] | np.ndarray | pd.Series, stat: StatFn = np.median,
                 level: float = 0.95, n_boot: int = 2000, seed: int = 0) -> ConfidenceInterval:
    """Percentile-bootstrap CI of stat(values): resample n values with replacement ``n_boot`` times.

    Returns ConfidenceInterval(estimate = stat(values), low, high = the (1-level)/2 and (1+level)/2
    quantiles of the resampled statistics, level).
    """
    x = _values(values, "values", min_n=2)
    _check_boot_args(level, n_boot)
    dist = _boot_one_level(x, stat, n_boot, np.random.default_rng(seed))
    return ConfidenceInterval(float(stat(x)), *_quantiles(dist, level), float(level))


def bootstrap_ratio_ci(a: Sequence[float] | np.ndarray | pd.Series, b: Sequence[float] | np.ndarray | pd.Series,
                       stat: StatFn = np.median, level: float = 0.95, n_boot: int = 2000,
                       seed: int = 0) -> ConfidenceInterval:
    """Percentile-bootstrap CI of stat(a) / stat(b), resampling a and b independently."""
    xa, xb = _values(a, "a", min_n=2), _values(b, "b", min_n=2)
    _check_boot_args(level, n_boot)
    rng = np.random.default_rng(seed)
    ratio = _ratio(_boot_one_level(xa, stat, n_boot, rng), _boot_one_level(xb, stat, n_boot, rng))
    return ConfidenceInterval(float(stat(xa) / stat(xb)), *_quantiles(ratio, level), float(level))


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    if np.any(den == 0):
        raise ConfigError("the baseline statistic is 0 in some resamples: a ratio is undefined; "
                          "compare differences or use a strictly positive metric (tok/s, ms)")
    return num / den


def bootstrap_ci_two_level(df: pd.DataFrame, group_col: str, value_col: str, stat: StatFn = np.median,
                           level: float = 0.95, n_boot: int = 2000, seed: int = 0) -> ConfidenceInterval:
    """Two-stage percentile bootstrap of stat over all values: resample restarts (groups) with
    replacement, then values within each chosen restart with replacement; estimate = stat(all values).

    With one restart this reduces to the one-level bootstrap and cannot see restart-to-restart drift.
    """
    _check_boot_args(level, n_boot)
    _, groups = _groups(df, group_col, value_col, "df")
    dist = _boot_two_level(groups, stat, n_boot, np.random.default_rng(seed))
    return ConfidenceInterval(float(stat(np.concatenate(groups))), *_quantiles(dist, level), float(level))


def two_level_spread(df: pd.DataFrame, group_col: str, value_col: str) -> TwoLevelSpread:
    """Request-to-request CV within restarts and restart-to-restart CV between restart medians
    (formulas on :class:`TwoLevelSpread`)."""
    keys, groups = _groups(df, group_col, value_col, "df")
    allv = np.concatenate(groups)
    n, g = allv.size, len(groups)
    grand_mean = float(allv.mean())
    ss_within = float(sum(((x - x.mean()) ** 2).sum() for x in groups))
    within_cv = math.sqrt(ss_within / (n - g)) / grand_mean if n > g and grand_mean != 0 else math.nan
    medians = pd.Series([float(np.median(x)) for x in groups], index=pd.Index(keys, name=group_col),
                        name=f"median_{value_col}")
    between_cv = float(medians.std(ddof=1) / medians.mean()) if g > 1 else math.nan
    n_harm = g / float(np.sum(1.0 / np.array([x.size for x in groups])))
    expected = within_cv * math.sqrt(math.pi / (2.0 * n_harm))
    return TwoLevelSpread(n_groups=g, n_values=n, grand_median=float(np.median(allv)), within_cv=within_cv,
                          between_cv=between_cv, expected_between_cv=expected, group_medians=medians)


def compare_arms(spec: Sequence[float] | np.ndarray | pd.Series | pd.DataFrame,
                 base: Sequence[float] | np.ndarray | pd.Series | pd.DataFrame,
                 level: float = 0.95, seed: int = 0, n_boot: int = 2000, stat: StatFn = np.median,
                 higher_is_better: bool = True, group_col: str | None = None,
                 value_col: str | None = None) -> Comparison:
    """Compare a speculative arm with its baseline: ratio stat(spec) / stat(base), bootstrap CI, verdict.

    Plain sequences are resampled independently (one level). With ``group_col`` and ``value_col``,
    ``spec`` and ``base`` are DataFrames of requests within restarts and each arm is resampled on two
    levels (restarts, then requests). Verdict and min_detectable_ratio are defined on :class:`Comparison`.
    """
    _check_boot_args(level, n_boot)
    rng = np.random.default_rng(seed)
    if (group_col is None) != (value_col is None):
        raise ConfigError("pass both group_col and value_col (two-level data) or neither (plain values)")
    if group_col is not None and value_col is not None:
        _, gs = _groups(spec, group_col, value_col, "spec")  # type: ignore[arg-type]
        _, gb = _groups(base, group_col, value_col, "base")  # type: ignore[arg-type]
        xs, xb = np.concatenate(gs), np.concatenate(gb)
        ds, db = _boot_two_level(gs, stat, n_boot, rng), _boot_two_level(gb, stat, n_boot, rng)
    else:
        xs, xb = _values(spec, "spec", min_n=2), _values(base, "base", min_n=2)  # type: ignore[arg-type]
        ds, db = _boot_one_level(xs, stat, n_boot, rng), _boot_one_level(xb, stat, n_boot, rng)
    est_s, est_b = float(stat(xs)), float(stat(xb))
    if est_b == 0:
        raise ConfigError("the baseline statistic is 0: a ratio is undefined")
    lo, hi = _quantiles(_ratio(ds, db), level)
    better_low, better_high = (lo > 1.0, hi < 1.0) if higher_is_better else (hi < 1.0, lo > 1.0)
    verdict: Verdict = "faster" if better_low else "slower" if better_high else NOT_DISTINGUISHABLE
    if lo > 0 and hi > 0:
        mdr = math.sqrt(hi / lo)
        z = NormalDist().inv_cdf(0.5 + float(level) / 2.0)
        mdr80 = math.exp(math.log(mdr) * (z + NormalDist().inv_cdf(0.8)) / z)
    else:
        mdr = mdr80 = math.inf
    return Comparison(ratio=est_s / est_b, ci_low=lo, ci_high=hi, level=float(level), verdict=verdict,
                      min_detectable_ratio=mdr, min_detectable_ratio_80=mdr80, spec_estimate=est_s,
                      base_estimate=est_b, n_spec=int(xs.size), n_base=int(xb.size))


def finite(x: Any) -> float | None:
    """A manifest value as a finite float, else None (None, bools, text, NaN and inf give None)."""
    if x is None or isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None
