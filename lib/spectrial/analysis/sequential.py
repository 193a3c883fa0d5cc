"""Sequential trials: keep interleaving server starts until the speed-up is decided, without cheating.

The unit of evidence is one server START (start-to-start spread dominates request noise), and
interleaving (base, arm, base, arm ...) pairs them: round i holds one start of the baseline and one of
each speculative arm, so y_i = log(arm_rate_i / base_rate_i) cancels whatever drifts slowly across the
session (clocks, thermals, a neighbour's load). `PairedSequence` tracks one arm over these rounds.

Looking at an ordinary confidence interval after every round and stopping when it excludes 1 is NOT
valid: the false-alarm rate grows with the number of looks (about 1 in 3 over 60 looks at 95 %, see
docs/STATISTICS.md). The interval here is an anytime-valid confidence sequence: the t-test confidence
sequence of Lindon, Ham, Tingley & Bojinov (2024, "Anytime-valid linear models and regression adjusted
causal inference in randomized experiments"), as implemented by savvi's `LinearRegression` with one
constant covariate (the mean of y_i, unknown variance). With probability >= `level` it covers the true
ratio at EVERY round simultaneously, so the trial may stop whenever it likes. savvi keeps the running
intersection of the intervals (each look's interval is valid, so their intersection is too).

`phi` is savvi's prior scale: the mixture puts a N(0, 1/phi) prior on the standardized effect
(mean of y / its SD). It only tunes where the sequence is tightest; coverage holds for any phi > 0.
phi = 1 (savvi's default) gives a finite 95 % interval from round 6 on and decided a 10 % speed-up at
5 % per-round noise in a median of 7 rounds in simulation; see `first_finite_round`.

Statuses: "faster" / "slower" (interval wholly above / below 1), "equivalent" (inside
[1/(1+margin), 1+margin]), "undecided", and "inconsistent": the running intersection became empty, i.e.
no constant speed-up fits all rounds (the ratio drifted during the trial; probability <= 1 - level
when it is constant).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from numbers import Real
from statistics import NormalDist
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np
from pydantic import BaseModel

from spectrial.errors import ConfigError

__all__ = [
    "SAVVI_PIP",
    "Allocation",
    "ArmSequence",
    "Decision",
    "Design",
    "GroupSequential",
    "PairedSequence",
    "SpreadPrior",
    "SequenceRecord",
    "Status",
    "allocate",
    "decide",
    "first_finite_round",
    "fixed_design_rounds",
    "group_sequential_design",
    "Forecast",
    "forecast",
    "looks",
    "power_rounds",
    "prior_from_starts",
    "statuses",
    "rounds_to_detect",
]

Status = Literal["faster", "slower", "equivalent", "undecided", "inconsistent"]
SAVVI_PIP = "pip install 'savvi==0.3.1'"
_SETTLED: frozenset[str] = frozenset({"faster", "slower", "equivalent", "inconsistent"})


class SequenceRecord(BaseModel):
    """One arm's confidence sequence at the last look, as stored in a run record (ratio scale)."""

    n: int
    estimate: float | None
    low: float | None
    high: float | None
    status: Status
    level: float
    margin: float | None
    phi: float
    fixed_design_rounds: int | None
    log_ratios: list[float]
    method: str


# --- argument checks ----------------------------------------------------------------------------------
def _real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ConfigError(f"{name} must be a number, got {value!r}", parameter=name)
    x = float(value)
    if not math.isfinite(x):
        raise ConfigError(f"{name} must be finite, got {value!r}", parameter=name)
    return x


def _positive(value: Any, name: str, hint: str = "") -> float:
    x = _real(value, name)
    if x <= 0:
        raise ConfigError(f"{name} must be > 0, got {value!r}", parameter=name, hint=hint)
    return x


def _probability(value: Any, name: str, example: str) -> float:
    x = _real(value, name)
    if not 0.0 < x < 1.0:
        raise ConfigError(f"{name} must lie strictly between 0 and 1 (e.g. {example}), got {value!r}",
                          parameter=name)
    return x


def _count(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}", parameter=name)
    return int(value)


def _savvi_model(level: float, phi: float) -> Any:
    try:
        from savvi.linear_regression import LinearRegression
    except ImportError:
        raise ConfigError("decide: the sequential mode needs the package savvi 0.3.1, which is not installed",
                          parameter="decide",
                          hint=f"{SAVVI_PIP} (savvi needs Python >= 3.11); or drop `decide:` and set "
                               "`restarts:` for a fixed design") from None
    return LinearRegression(alpha=1.0 - level, p=1, phi=phi)


class _Rounds:
    """What every arm sequence shares: its rounds' log ratios, the estimate, the interval on the ratio scale, the
    fixed-design comparison and the record (subclasses give `log_interval`, `status`, `method`)."""

    level: float
    margin: float | None
    phi: float = 0.0
    _y: list[float]

    @property
    def n(self) -> int:
        """Rounds added."""
        return len(self._y)

    @property
    def log_ratios(self) -> tuple[float, ...]:
        """y_i = log(arm_rate_i / base_rate_i), one per round."""
        return tuple(self._y)

    def log_interval(self) -> tuple[float, float] | None:  # pragma: no cover - every subclass has its own
        raise NotImplementedError

    def status(self) -> Status:  # pragma: no cover - every subclass has its own
        raise NotImplementedError

    def method(self) -> str:  # pragma: no cover - every subclass has its own
        raise NotImplementedError

    def interval(self) -> tuple[float, float] | None:
        """The interval at this look on the ratio scale (exp of the log interval); None while unbounded."""
        li = self.log_interval()
        return None if li is None else (math.exp(li[0]), math.exp(li[1]))

    def estimate(self) -> float | None:
        """Geometric-mean ratio exp(mean y); None before the first round."""
        return math.exp(sum(self._y) / len(self._y)) if self._y else None

    def fixed_design_rounds(self) -> int | None:
        """Rounds a fixed (non-sequential) paired t-interval would need for the current half-width, at the
        observed per-round SD; None while the interval is unbounded or the rounds show no spread."""
        li = self.log_interval()
        if li is None or self.n < 2:
            return None
        sd = float(np.std(self._y, ddof=1))
        if not sd > 0.0 or li[1] <= li[0]:
            return None
        return fixed_design_rounds(sd, (li[1] - li[0]) / 2.0, self.level)

    def to_record(self) -> SequenceRecord:
        """The state at this look as a pydantic record (JSON-ready)."""
        iv = self.interval()
        return SequenceRecord(n=self.n, estimate=self.estimate(), low=iv[0] if iv else None,
                              high=iv[1] if iv else None, status=self.status(), level=self.level,
                              margin=self.margin, phi=self.phi, fixed_design_rounds=self.fixed_design_rounds(),
                              log_ratios=list(self._y), method=self.method())


# --- one arm against the baseline ---------------------------------------------------------------------
class PairedSequence(_Rounds):
    """One speculative arm against the baseline over paired rounds: y_i = log(arm_rate_i / base_rate_i).

    level: coverage of the confidence sequence, simultaneously over all rounds (per arm; with k arms
    every arm's sequence covers at once with probability >= 1 - k (1 - level)).
    margin: equivalence margin; the arm is "equivalent" once its interval lies inside
    [1/(1+margin), 1+margin] (None: never).  phi: savvi's prior scale (see the module docstring).
    """

    def __init__(self, level: float = 0.95, margin: float | None = None, phi: float = 1.0) -> None:
        self.level = _probability(level, "level", "0.95")
        self.margin = None if margin is None else _positive(
            margin, "margin", hint="a relative difference that does not matter, e.g. 0.02; None for no "
                                   "equivalence test")
        self.phi = _positive(phi, "phi", hint="1.0 (savvi's default) unless you know why")
        self._model = _savvi_model(self.level, self.phi)
        self._y: list[float] = []

    @classmethod
    def from_rates(cls, base_rates: list[float], arm_rates: list[float], **kwargs: Any) -> PairedSequence:
        """A sequence fed round by round from two equal-length lists of per-start rates."""
        if len(base_rates) != len(arm_rates):
            raise ConfigError(f"arm_rates: {len(arm_rates)} rates for {len(base_rates)} baseline rates; "
                              "rounds pair one start of each", parameter="arm_rates")
        seq = cls(**kwargs)
        for b, a in zip(base_rates, arm_rates, strict=True):
            seq.add(b, a)
        return seq

    def add(self, base_rate: float, arm_rate: float) -> None:
        """One round: the baseline's and this arm's per-start rate (tok/s, both > 0)."""
        hint = "a start that measured nothing is a failed start: rerun it or end the trial, don't pass 0"
        b = _positive(base_rate, "base_rate", hint=hint)
        a = _positive(arm_rate, "arm_rate", hint=hint)
        y = math.log(a / b)
        self._y.append(y)
        with np.errstate(divide="ignore", invalid="ignore"):  # savvi divides by 0 while the CS is infinite
            self._model.update(np.array([y, 1.0]))
            self._model.infer()

    def log_interval(self) -> tuple[float, float] | None:
        """The running-intersection interval for mean y (log scale); None while infinite or once empty."""
        low, high = (float(v) for v in self._model.conf_int[0])
        if not (math.isfinite(low) and math.isfinite(high)) or low > high:
            return None
        return low, high

    def status(self) -> Status:
        """faster / slower / equivalent / undecided / inconsistent (see the module docstring); a direction
        wins over equivalence when both hold."""
        low, high = (float(v) for v in self._model.conf_int[0])
        if low > high:
            return "inconsistent"
        if low > 0.0:
            return "faster"
        if high < 0.0:
            return "slower"
        if self.margin is not None and high <= math.log1p(self.margin) and low >= -math.log1p(self.margin):
            return "equivalent"
        return "undecided"

    def method(self) -> str:
        """One line naming the procedure, for records and reports."""
        return (f"anytime-valid t confidence sequence on log(arm/base) per paired round (Lindon et al. 2024; "
                f"savvi LinearRegression, p=1, phi={self.phi:g}), running intersection, "
                f"{self.level:.0%} simultaneous over rounds")

    def __str__(self) -> str:
        est, iv = self.estimate(), self.interval()
        if est is None:
            return "no rounds yet"
        span = f"[{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "[unbounded]"
        return f"{est:.3f} {span} after {self.n} round(s) ({self.level:.0%} confidence sequence): {self.status()}"


@functools.lru_cache(maxsize=64)
def first_finite_round(level: float = 0.95, phi: float = 1.0) -> int:
    """The first round at which savvi's confidence sequence can be finite (whatever the data, as long as
    the rounds differ): 6 at level 0.95 and phi 1. A start budget below this can never decide."""
    seq = PairedSequence(level=level, phi=phi)
    for i in range(1, 100_001):
        seq.add(1.0, 1.0 + 0.01 * (i % 3))
        if seq.log_interval() is not None:
            return i
    raise ConfigError(f"phi: no finite interval within 100000 rounds at phi={phi!r}, level={level!r}",
                      parameter="phi", hint="use phi between 0.1 and 10")


# --- the group-sequential design (decide's default) ----------------------------------------------------
# Repeated t-intervals over paired rounds with an error-spending boundary over a finite horizon (max_rounds),
# calibrated by simulation. Under normal y_i the joint law of the t-statistics t_n = mean(y) / (s / sqrt(n)) at
# every look does not depend on the unknown spread, so one simulation with spread 1 gives boundaries c_n that hold
# for every spread: P(|t_n - its mean's| > c_n at some look n <= K) = 0.98 (1 - level), 2 % under the level so that
# the simulation's error (about 0.0004) cannot take it over. The same boundaries make the intervals
# mean(y) +- c_n s / sqrt(n) cover the true log ratio at every
# look at once (repeated confidence intervals, Jennison & Turnbull 2000, ch. 9), so stopping at any look, for a
# decision or a budget, is valid. A horizon shorter than planned (a time budget) leaves error unspent: conservative.
SPEND_EARLY = 0.4  # share of the error spent over the first SPEND_EARLY_LOOKS looks (early decisions on big effects)
SPEND_EARLY_LOOKS = 3
CALIBRATION_PATHS = 400_000
CALIBRATION_SAFETY = 0.02  # spend 2 % less than 1 - level: simulation error (about 0.0004) stays below the level
CALIBRATION_SEED = 20261205
NO_HISTORY_FIRST_LOOK = 3  # with one degree of freedom (round 2) a t-interval is all tail: no look there
MAX_HORIZON = 500
GUARD = 0.2  # the F-test that drops a prior today's starts contradict (docs/STATISTICS.md: why 0.2)
Spending = Callable[[int], float]


class SpreadPrior(BaseModel):
    """What earlier runs of this host say of the per-round spread of y = log(arm rate / baseline rate): its SD and
    degrees of freedom, and where it comes from (spectrial.protocol.earlier). Used as prior observations of the variance
    (pooled with the rounds' own); the rounds can overturn it (an F-test at every look drops it)."""

    sd_log: float
    df: int
    source: str = ""


def prior_from_starts(groups: Sequence[Sequence[float]], source: str = "") -> SpreadPrior | None:
    """The spread prior from earlier runs: `groups` are per-start rates (tok/s) of one arm in one run each; the
    pooled variance of log rates around each group's mean, with sum(len - 1) degrees of freedom, doubled for a
    paired round (two independent starts). Slow drift within a run inflates it (pairing would cancel it): a
    conservative prior. None without two starts in any group."""
    ss, df = 0.0, 0
    for g in groups:
        logs = [math.log(float(x)) for x in g if isinstance(x, Real) and math.isfinite(float(x)) and float(x) > 0]
        if len(logs) >= 2:
            m = sum(logs) / len(logs)
            ss += sum((v - m) ** 2 for v in logs)
            df += len(logs) - 1
    if df == 0 or ss <= 0.0:
        return None
    return SpreadPrior(sd_log=math.sqrt(2.0 * ss / df), df=df, source=source)


class Design(BaseModel):
    """A group-sequential design: the boundary c_n on |t_n| at each round n (inf: no look), and how it was made."""

    level: float
    max_rounds: int
    first_look: int
    history_df: int
    boundaries: tuple[float, ...]  # index n - 1 for round n

    def boundary(self, n: int) -> float:
        return self.boundaries[n - 1] if 1 <= n <= len(self.boundaries) else math.inf

    def spending(self) -> str:
        return (f"error spent {SPEND_EARLY:.0%} over the first {SPEND_EARLY_LOOKS} looks from round "
                f"{self.first_look}, the rest in log(rounds), what is left at round {self.max_rounds}")


def _spending(level: float, first_look: int, horizon: int) -> Spending:
    """Cumulative error spent by round n (n >= first_look): SPEND_EARLY of it over the first looks, the rest in
    proportion to log(n / (first_look - 1)), everything by the horizon."""
    alpha = (1.0 - level) * (1.0 - CALIBRATION_SAFETY)
    base = max(first_look - 1, 1)
    span = math.log(horizon / base) if horizon > base else 1.0

    def spent(n: int) -> float:
        if n >= horizon:
            return alpha
        early = min(1.0, (n - first_look + 1) / SPEND_EARLY_LOOKS)
        return alpha * (SPEND_EARLY * early + (1.0 - SPEND_EARLY) * math.log(n / base) / span)

    return spent


@functools.lru_cache(maxsize=64)
def group_sequential_design(level: float = 0.95, max_rounds: int = 20, first_look: int = NO_HISTORY_FIRST_LOOK,
                            history_df: int = 0) -> Design:
    """The boundaries for `max_rounds` looks from `first_look` on, at `level`, with `history_df` prior degrees of
    freedom of the variance (0: the rounds' own only), calibrated by a seeded simulation (about 0.1 s per 20
    rounds; cached)."""
    lv = _probability(level, "level", "0.95")
    horizon = _count(max_rounds, "max_rounds", 2)
    if horizon > MAX_HORIZON:
        raise ConfigError(f"max_rounds: at most {MAX_HORIZON} rounds, got {max_rounds!r}", parameter="max_rounds",
                          hint="a budget of that many server starts is not a plan; lower decide.max_rounds")
    first = _count(first_look, "first_look", 2)
    hdf = _count(history_df, "history_df", 0)
    bounds = [math.inf] * horizon
    if first <= horizon:
        spent_by = _spending(lv, first, horizon)
        rng = np.random.default_rng(CALIBRATION_SEED)
        paths = CALIBRATION_PATHS
        s1 = np.zeros(paths)
        s2 = np.zeros(paths)
        prior_ss = rng.chisquare(hdf, paths) if hdf else np.zeros(paths)
        alive = np.ones(paths, dtype=bool)
        crossed = 0
        for n in range(1, horizon + 1):
            z = rng.standard_normal(paths)
            s1 += z
            s2 += z * z
            if n < first:
                continue
            allowed = round(spent_by(n) * paths) - crossed
            if allowed <= 0:
                continue
            mean = s1[alive] / n
            var = (np.maximum(s2[alive] - n * mean * mean, 0.0) + prior_ss[alive]) / (n - 1 + hdf)
            t = np.abs(mean) / np.sqrt(var / n)
            if allowed >= t.size:
                bounds[n - 1] = 0.0
                break
            c = float(np.partition(t, t.size - allowed)[t.size - allowed])
            bounds[n - 1] = c
            hit = t >= c
            idx = np.flatnonzero(alive)
            alive[idx[hit]] = False
            crossed += int(hit.sum())
    return Design(level=lv, max_rounds=horizon, first_look=first, history_df=hdf, boundaries=tuple(bounds))


def looks(y: np.ndarray, design: Design, fallback: Design | None = None, prior_sd: np.ndarray | float | None = None,
          prior_df: int = 0, guard: float = GUARD, starts: np.ndarray | None = None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The repeated t-intervals of paths of rounds: `y` is (paths, rounds) of log ratios. Returns the log
    interval's low and high ends at every round (NaN before the first look or without a boundary) and whether
    the prior was still in use there.

    With a prior (`prior_sd`: its SD of y per round, one per path or one for all, with `prior_df` degrees of
    freedom), `design` is the one calibrated for those degrees of freedom and `fallback` the one without. The prior
    is pooled with the rounds' variance until an F-test at level `guard` says today's starts spread more than it
    (then for good: the fallback's boundary, never below the prior's, on the rounds' own variance). The test reads
    `starts` (paths, rounds, 2: each round's baseline and arm log rates, 2 (n - 1) degrees of freedom; a drift
    across rounds only makes it drop the prior sooner) where given, else y (n - 1). One computation for
    `GroupSequential` and the benchmark (vectorised)."""
    y = np.atleast_2d(np.asarray(y, dtype=float))
    rounds = y.shape[1]
    n = np.arange(1, rounds + 1, dtype=float)
    mean = np.cumsum(y, axis=1) / n
    ss = np.maximum(np.cumsum(y * y, axis=1) - n * mean * mean, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        own_var = np.where(n > 1, ss / np.maximum(n - 1, 1), np.nan)
    c_prior = np.array([design.boundary(int(k)) for k in n])
    if prior_sd is None or prior_df <= 0:
        c, var, in_use = c_prior, own_var, np.zeros_like(y, dtype=bool)
    else:
        from scipy.stats import f as f_dist

        hvar = np.reshape(np.asarray(prior_sd, dtype=float) ** 2, (-1, 1))
        pooled = (ss + prior_df * hvar) / (n - 1 + prior_df)
        if starts is not None:
            x = np.asarray(starts, dtype=float).reshape(y.shape[0], rounds, -1)
            xm = np.cumsum(x, axis=1) / n[:, None]
            xss = np.maximum(np.cumsum(x * x, axis=1) - n[:, None] * xm * xm, 0.0).sum(axis=2)
            dfs = x.shape[2] * (n - 1)
            ratio = (xss / np.maximum(dfs, 1)) / (hvar / 2.0)  # a start's variance is half a round's
        else:
            dfs, ratio = n - 1, own_var / hvar
        crit = np.array([f_dist.ppf(1.0 - guard, d, prior_df) if d > 0 else np.inf for d in dfs])
        with np.errstate(invalid="ignore"):
            rejected = np.where(n > 1, ratio > crit, False)
        in_use = ~np.logical_or.accumulate(rejected, axis=1)
        fb = fallback or design
        c_fb = np.maximum(np.array([fb.boundary(int(k)) for k in n]), c_prior)
        c = np.where(in_use, c_prior, c_fb)
        var = np.where(in_use, pooled, own_var)
    with np.errstate(invalid="ignore"):
        half = c * np.sqrt(var / n)
    half = np.where(np.isfinite(half), half, np.nan)
    return mean - half, mean + half, in_use


def statuses(low: np.ndarray, high: np.ndarray, margin: float | None) -> np.ndarray:
    """`looks`' intervals as statuses (an array of "faster" / "slower" / "equivalent" / "undecided")."""
    out = np.full(low.shape, "undecided", dtype=object)
    with np.errstate(invalid="ignore"):
        if margin is not None:
            m = math.log1p(margin)
            out[(high <= m) & (low >= -m)] = "equivalent"
        out[high < 0.0] = "slower"
        out[low > 0.0] = "faster"
    return out


class GroupSequential(_Rounds):
    """One speculative arm against the baseline over paired rounds, judged by repeated t-intervals with an
    error-spending boundary over `max_rounds` rounds (decide's default; see the section comment above).

    The interface is `PairedSequence`'s. With a `prior` (this host's earlier runs: spectrial.protocol.earlier), the first
    look is round 2 and the variance pools the prior's degrees of freedom with the rounds' own until the rounds
    contradict it (F-test at `guard`), after which the arm is judged as without history (`prior_dropped_at`). The
    interval at each look is centred on the estimate (no running intersection), so the point and its interval
    are one pair."""

    def __init__(self, level: float = 0.95, margin: float | None = None, *, max_rounds: int = 20,
                 min_rounds: int = 2, prior: SpreadPrior | None = None, guard: float = GUARD) -> None:
        self.level = _probability(level, "level", "0.95")
        self.margin = None if margin is None else _positive(
            margin, "margin", hint="a relative difference that does not matter, e.g. 0.02; None for no "
                                   "equivalence test")
        self.max_rounds = _count(max_rounds, "max_rounds", 2)
        lo = _count(min_rounds, "min_rounds", 1)
        if prior is not None and (not math.isfinite(prior.sd_log) or prior.sd_log <= 0 or prior.df < 1):
            prior = None  # no spread to lean on (identical earlier rounds): judged as without history
        self.prior = prior
        self.guard = _probability(guard, "guard", "0.05")
        self.fallback = group_sequential_design(self.level, self.max_rounds, max(lo, NO_HISTORY_FIRST_LOOK), 0)
        self.design = self.fallback if prior is None else group_sequential_design(
            self.level, self.max_rounds, max(lo, 2), prior.df)
        self._y: list[float] = []
        self._starts: list[tuple[float, float]] = []

    @property
    def first_look(self) -> int:
        """The first round at which this arm can be decided."""
        return self.design.first_look

    def add(self, base_rate: float, arm_rate: float) -> None:
        """One round: the baseline's and this arm's per-start rate (tok/s, both > 0)."""
        hint = "a start that measured nothing is a failed start: rerun it or end the trial, don't pass 0"
        b = _positive(base_rate, "base_rate", hint=hint)
        a = _positive(arm_rate, "arm_rate", hint=hint)
        self._y.append(math.log(a / b))
        self._starts.append((math.log(b), math.log(a)))

    def _last(self) -> tuple[float, float, bool]:
        if not self._y:
            return math.nan, math.nan, self.prior is not None
        low, high, in_use = self._looks()
        return float(low[0, -1]), float(high[0, -1]), bool(in_use[0, -1])

    def _looks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        p = self.prior
        return looks(np.array([self._y]), self.design, self.fallback, p.sd_log if p else None, p.df if p else 0,
                     self.guard, np.array([self._starts]))

    @property
    def prior_in_use(self) -> bool:
        """The prior still pools with the rounds (False without one, or once the rounds overturned it)."""
        return self.prior is not None and self._last()[2]

    @property
    def prior_dropped_at(self) -> int | None:
        """The round at which the rounds overturned the prior (None: never, or no prior)."""
        if self.prior is None or not self._y:
            return None
        in_use = self._looks()[2][0]
        off = np.flatnonzero(~in_use)
        return int(off[0]) + 1 if off.size else None

    def log_interval(self) -> tuple[float, float] | None:
        low, high, _ = self._last()
        return (low, high) if math.isfinite(low) and math.isfinite(high) else None

    def status(self) -> Status:
        low, high, _ = self._last()
        return statuses(np.array([low]), np.array([high]), self.margin)[0]  # type: ignore[no-any-return]

    def method(self) -> str:
        prior = ""
        if self.prior is not None:
            dropped = self.prior_dropped_at
            prior = (f"; prior spread {self.prior.sd_log:.3f} (log SD per round, {self.prior.df} df: "
                     f"{self.prior.source or 'earlier runs'})"
                     + (f", dropped at round {dropped} (the rounds spread more)" if dropped else
                        ", pooled with the rounds (F-test at every look)"))
        return (f"group-sequential repeated t-intervals on log(arm/base) per paired round, {self.level:.0%} "
                f"simultaneous over rounds {self.design.first_look}-{self.max_rounds} "
                f"({self.design.spending()}; boundaries calibrated by simulation){prior}")

    def __str__(self) -> str:
        est, iv = self.estimate(), self.interval()
        if est is None:
            return "no rounds yet"
        span = f"[{iv[0]:.3f}, {iv[1]:.3f}]" if iv else f"[unbounded before round {self.first_look}]"
        return f"{est:.3f} {span} after {self.n} round(s) ({self.level:.0%} repeated intervals): {self.status()}"


class Forecast(BaseModel):
    """How a decide design fares for a true speed-up `effect` at a per-round SD `sd_log` of log(arm/base), by
    simulation of `paths` trials: rounds to the first decision (undecided trials count the whole horizon), the
    share decided within it and the share decided wrongly (the wrong direction; "equivalent" outside the margin;
    any direction for an effect of exactly 1)."""

    effect: float
    sd_log: float
    median_rounds: float
    p90_rounds: float
    decided: float
    wrong: float
    paths: int


def forecast(effect: float, sd_log: float, *, level: float = 0.95, max_rounds: int = 20, min_rounds: int = 2,
             margin: float | None = None, prior_sd: np.ndarray | float | None = None, prior_df: int = 0,
             guard: float = GUARD, paths: int = 2000, seed: int = 0) -> Forecast:
    """Simulate the decide design (`looks`, the one computation) on normal starts (SD sd_log / sqrt 2 each, so
    a round's y ~ N(log effect, sd_log));
    `prior_sd` (one per path, or one) with `prior_df` stands for the host's history."""
    eff = _positive(effect, "effect", hint="a speed-up ratio, e.g. 0.74")
    sd = _positive(sd_log, "sd_log", hint="the SD of log(arm/base) per round, e.g. 0.11")
    horizon = _count(max_rounds, "max_rounds", 2)
    rng = np.random.default_rng(seed)
    shape = (_count(paths, "paths", 1), horizon)
    starts = np.stack([sd / math.sqrt(2.0) * rng.standard_normal(shape),
                       math.log(eff) + sd / math.sqrt(2.0) * rng.standard_normal(shape)], axis=2)
    y = starts[:, :, 1] - starts[:, :, 0]
    has_prior = prior_sd is not None and prior_df > 0
    fallback = group_sequential_design(level, horizon, max(min_rounds, NO_HISTORY_FIRST_LOOK), 0)
    design = group_sequential_design(level, horizon, max(min_rounds, 2), prior_df) if has_prior else fallback
    low, high, _ = looks(y, design, fallback, prior_sd if has_prior else None, prior_df, guard, starts)
    st = statuses(low, high, margin)
    settled = st != "undecided"
    any_settled = settled.any(axis=1)
    first = np.where(any_settled, settled.argmax(axis=1), horizon - 1)
    outcome = st[np.arange(y.shape[0]), first]
    rounds = np.where(any_settled, first + 1, horizon)
    if eff > 1.0:
        wrong = (outcome == "slower") | ((outcome == "equivalent") & (margin is not None and eff > 1 + (margin or 0)))
    elif eff < 1.0:
        wrong = (outcome == "faster") | ((outcome == "equivalent") & (margin is not None
                                                                       and eff < 1 / (1 + (margin or 0))))
    else:
        wrong = (outcome == "faster") | (outcome == "slower")
    return Forecast(effect=eff, sd_log=sd, median_rounds=float(np.median(rounds)),
                    p90_rounds=float(np.percentile(rounds, 90)), decided=float(any_settled.mean()),
                    wrong=float(wrong.mean()), paths=int(y.shape[0]))


def power_rounds(effect: float, sd_log: float, level: float = 0.95, power: float = 0.8) -> int:
    """Rounds a fixed paired t-test needs to detect `effect` (a speed-up ratio) with `power` at `level`, when the
    per-round SD of log(arm/base) is `sd_log` (noncentral t, exact)."""
    from scipy.stats import nct
    from scipy.stats import t as student_t

    d = abs(math.log(_positive(effect, "effect")))
    sd = _positive(sd_log, "sd_log")
    lv, pw = _probability(level, "level", "0.95"), _probability(power, "power", "0.8")
    if d == 0.0:
        raise ConfigError("effect: 1.0 is no difference; a fixed design detects a speed-up other than 1",
                          parameter="effect")
    tail = 1.0 - (1.0 - lv) / 2.0
    for n in range(2, 100_000):
        crit = student_t.ppf(tail, n - 1)
        if nct.sf(crit, n - 1, d / sd * math.sqrt(n)) >= pw:
            return n
    raise ConfigError(f"effect: {effect!r} at sd_log {sd_log!r} needs more than 100000 rounds", parameter="effect")


START_SHARE_FLOOR = 0.1  # the start-to-start variance is taken as at least this share of what the starts showed


class Allocation(BaseModel):
    """Requests per server start for a decide run, and why (`allocate`)."""

    requests: int
    optimum: float | None = None
    reason: str


def allocate(start_s: float | None, request_s: float | None, within_sd_log: float | None,
             start_sd_log: float | None, requests_then: float | None, default: int, lo: int = 1,
             hi: int = 200) -> Allocation:
    """The optimal requests per start m* = sqrt((c_start / c_request) x (pi/2 sigma_w^2) / sigma_b^2) for a
    two-level design whose unit is the start: c_start what a start costs beyond its requests (load, warm-up,
    stop), c_request one request, sigma_w the within-start SD of a request's log rate (a start's median of m
    requests has variance about pi/2 sigma_w^2 / m), sigma_b the start-to-start SD net of that median noise
    (from the earlier starts' spread, which had `requests_then` requests each). It minimises the time to a
    given precision: a costly start carries more requests, noisy requests more too. Clamped to [lo, hi]; without
    the figures it is `default`, and the reason says so."""
    figs = (start_s, request_s, within_sd_log, start_sd_log, requests_then)
    if any(x is None or not math.isfinite(x) or x <= 0 for x in figs):
        return Allocation(requests=max(lo, default), reason="no history of start and request costs and spreads on "
                                                            "this host: `repeats` as given")
    c_start, c_req, sw, sb_total, m0 = (float(x) for x in figs)  # type: ignore[arg-type]
    noise = math.pi / 2.0 * sw * sw / m0
    sb2 = max(sb_total * sb_total - noise, sb_total * sb_total * START_SHARE_FLOOR)
    opt = math.sqrt(c_start / c_req * noise * m0 / sb2)
    m = min(hi, max(lo, round(opt)))
    floor = " (at its floor: few earlier starts cannot show it smaller)" if \
        sb2 == sb_total * sb_total * START_SHARE_FLOOR else ""
    why = (f"a start costs {c_start:.1f} s beyond its requests, a request {c_req:.2f} s; within-start SD {sw:.1%}, "
           f"start-to-start SD {math.sqrt(sb2):.1%}{floor}: optimum {opt:.1f} requests per start"
           + (f", clamped to {lo}-{hi}" if not lo <= round(opt) <= hi else ""))
    return Allocation(requests=m, optimum=opt, reason=why)


class ArmSequence(Protocol):
    """What `decide` reads of an arm's sequence (PairedSequence or GroupSequential)."""

    @property
    def n(self) -> int: ...

    def status(self) -> Status: ...

    def interval(self) -> tuple[float, float] | None: ...

    def estimate(self) -> float | None: ...


# --- design arithmetic --------------------------------------------------------------------------------
def fixed_design_rounds(sd_log: float, halfwidth_log: float, level: float = 0.95) -> int:
    """Rounds n a fixed paired t-interval needs for half-width `halfwidth_log` (log scale) when the per-round
    SD of log ratios is `sd_log`: the smallest n >= 2 with t_(1-a/2, n-1) * sd / sqrt(n) <= halfwidth."""
    sd = _positive(sd_log, "sd_log")
    h = _positive(halfwidth_log, "halfwidth_log")
    lv = _probability(level, "level", "0.95")
    try:
        from scipy.stats import t as student_t
    except ImportError:
        raise ConfigError("decide: fixed_design_rounds needs scipy (installed with savvi)", parameter="decide",
                          hint=SAVVI_PIP) from None
    tail = 1.0 - (1.0 - lv) / 2.0
    z = NormalDist().inv_cdf(tail)
    n = max(2, math.ceil((z * sd / h) ** 2))  # t > z, so the normal answer is a lower bound
    while student_t.ppf(tail, n - 1) * sd / math.sqrt(n) > h:
        n += 1
    return n


def rounds_to_detect(ci_low: float, ci_high: float, n: int, effect: float = 0.05, level: float = 0.95,
                     power: float = 0.8) -> int | None:
    """Units (starts or requests) in total a fixed design needs to detect a relative difference `effect` with
    `power`, extrapolated from a ratio CI [ci_low, ci_high] built on `n` units: the log half-width
    H = log(high/low)/2 scales as 1/sqrt(n), and detection needs H_target = log(1+effect) z/(z + z_power),
    z = z_(1-a/2); so n_needed = ceil(n (H / H_target)^2). None when the CI is unbounded or degenerate."""
    units = _count(n, "n", 1)
    eff = _positive(effect, "effect", hint="a relative difference, e.g. 0.05 for 5 %")
    lv = _probability(level, "level", "0.95")
    pw = _probability(power, "power", "0.8")
    bounds: list[float] = []
    for value, name in ((ci_low, "ci_low"), (ci_high, "ci_high")):
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(value):
            raise ConfigError(f"{name} must be a number (inf for an unbounded interval), got {value!r}",
                              parameter=name)
        bounds.append(float(value))
    low, high = bounds
    if not (math.isfinite(low) and math.isfinite(high)):
        return None
    if low <= 0.0:
        raise ConfigError(f"ci_low must be > 0 (a ratio), got {ci_low!r}", parameter="ci_low")
    if high < low:
        raise ConfigError(f"ci_high ({ci_high!r}) is below ci_low ({ci_low!r})", parameter="ci_high")
    if high == low:
        return None
    z = NormalDist().inv_cdf(1.0 - (1.0 - lv) / 2.0)
    h_target = math.log1p(eff) * z / (z + NormalDist().inv_cdf(pw))
    h = math.log(high / low) / 2.0
    return max(1, math.ceil(units * (h / h_target) ** 2 - 1e-9))


# --- the stopping rule --------------------------------------------------------------------------------
class Decision(NamedTuple):
    """Whether to stop interleaving rounds, and why (one line for the log and the record)."""

    stop: bool
    why: str


def _describe(name: str, seq: ArmSequence) -> str:
    iv = seq.interval()
    est = seq.estimate()
    span = f" {est:.3f} [{iv[0]:.3f}, {iv[1]:.3f}]" if iv and est is not None else ""
    return f"{name} {seq.status()}{span}"


def decide(sequences: Mapping[str, ArmSequence], *, min_rounds: int, max_rounds: int, elapsed_s: float,
           max_s: float | None, round_s: float | None = None, rounds: int | None = None) -> Decision:
    """Stop when every arm is settled (faster / slower / equivalent, or inconsistent) after at least
    `min_rounds` rounds, or when `max_rounds` rounds are done, or when the time budget `max_s` is spent
    (`round_s`, the expected duration of one more round, stops early when that round would overrun).
    `rounds`: the rounds run so far (default: the fewest any arm has; settled arms leave later rounds)."""
    if not sequences:
        raise ConfigError("sequences: no speculative arm to decide on", parameter="sequences")
    lo_rounds = _count(min_rounds, "min_rounds", 1)
    hi_rounds = _count(max_rounds, "max_rounds", 1)
    if hi_rounds < lo_rounds:
        raise ConfigError(f"max_rounds ({hi_rounds}) is below min_rounds ({lo_rounds})", parameter="max_rounds")
    spent = _real(elapsed_s, "elapsed_s")
    budget = None if max_s is None else _positive(max_s, "max_s")
    next_round = 0.0 if round_s is None else max(0.0, _real(round_s, "round_s"))
    n = min(seq.n for seq in sequences.values()) if rounds is None else _count(rounds, "rounds", 0)
    states = "; ".join(_describe(name, seq) for name, seq in sequences.items())
    open_arms = [name for name, seq in sequences.items() if seq.status() not in _SETTLED]
    if not open_arms and n >= lo_rounds:
        inconsistent = [name for name, seq in sequences.items() if seq.status() == "inconsistent"]
        note = (f" ({', '.join(inconsistent)}: no constant speed-up fits all rounds; the ratio drifted)"
                if inconsistent else "")
        return Decision(True, f"decided after {n} rounds: {states}{note}")
    if n >= hi_rounds:
        return Decision(True, f"start budget: {n} of {hi_rounds} rounds used; undecided: "
                              f"{', '.join(open_arms) or 'none (min_rounds not reached)'}; {states}")
    if budget is not None and spent + next_round > budget:
        return Decision(True, f"time budget: {spent:.0f} s of {budget:.0f} s used after {n} rounds; "
                              f"undecided: {', '.join(open_arms) or 'none'}; {states}")
    return Decision(False, f"continue: {n} rounds; undecided: {', '.join(open_arms) or 'none'}; {states}")
