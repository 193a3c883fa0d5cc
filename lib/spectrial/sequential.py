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
from collections.abc import Mapping
from numbers import Real
from statistics import NormalDist
from typing import Any, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel

from spectrial.errors import ConfigError

__all__ = [
    "SAVVI_PIP",
    "Decision",
    "PairedSequence",
    "SequenceRecord",
    "Status",
    "decide",
    "first_finite_round",
    "fixed_design_rounds",
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


# --- one arm against the baseline ---------------------------------------------------------------------
class PairedSequence:
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

    @property
    def n(self) -> int:
        """Rounds added."""
        return len(self._y)

    @property
    def log_ratios(self) -> tuple[float, ...]:
        """y_i = log(arm_rate_i / base_rate_i), one per round."""
        return tuple(self._y)

    def log_interval(self) -> tuple[float, float] | None:
        """The running-intersection interval for mean y (log scale); None while infinite or once empty."""
        low, high = (float(v) for v in self._model.conf_int[0])
        if not (math.isfinite(low) and math.isfinite(high)) or low > high:
            return None
        return low, high

    def interval(self) -> tuple[float, float] | None:
        """The confidence sequence at this look on the ratio scale (exp of the log interval); None while
        infinite (too few rounds, see `first_finite_round`) or once empty (status "inconsistent")."""
        li = self.log_interval()
        return None if li is None else (math.exp(li[0]), math.exp(li[1]))

    def estimate(self) -> float | None:
        """Geometric-mean ratio exp(mean y); None before the first round."""
        return math.exp(sum(self._y) / len(self._y)) if self._y else None

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

    def fixed_design_rounds(self) -> int | None:
        """Rounds a fixed (non-sequential) paired t-interval would need for the current half-width, at the
        observed per-round SD; None while the interval is infinite or the rounds show no spread."""
        li = self.log_interval()
        if li is None or self.n < 2:
            return None
        sd = float(np.std(self._y, ddof=1))
        if not sd > 0.0 or li[1] <= li[0]:
            return None
        return fixed_design_rounds(sd, (li[1] - li[0]) / 2.0, self.level)

    def method(self) -> str:
        """One line naming the procedure, for records and reports."""
        return (f"anytime-valid t confidence sequence on log(arm/base) per paired round (Lindon et al. 2024; "
                f"savvi LinearRegression, p=1, phi={self.phi:g}), running intersection, "
                f"{self.level:.0%} simultaneous over rounds")

    def to_record(self) -> SequenceRecord:
        """The state at this look as a pydantic record (JSON-ready)."""
        iv = self.interval()
        return SequenceRecord(n=self.n, estimate=self.estimate(), low=iv[0] if iv else None,
                              high=iv[1] if iv else None, status=self.status(), level=self.level,
                              margin=self.margin, phi=self.phi, fixed_design_rounds=self.fixed_design_rounds(),
                              log_ratios=list(self._y), method=self.method())

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


def _describe(name: str, seq: PairedSequence) -> str:
    iv = seq.interval()
    est = seq.estimate()
    span = f" {est:.3f} [{iv[0]:.3f}, {iv[1]:.3f}]" if iv and est is not None else ""
    return f"{name} {seq.status()}{span}"


def decide(sequences: Mapping[str, PairedSequence], *, min_rounds: int, max_rounds: int, elapsed_s: float,
           max_s: float | None, round_s: float | None = None) -> Decision:
    """Stop when every arm is settled (faster / slower / equivalent, or inconsistent) after at least
    `min_rounds` rounds, or when `max_rounds` rounds are done, or when the time budget `max_s` is spent
    (`round_s`, the expected duration of one more round, stops early when that round would overrun)."""
    if not sequences:
        raise ConfigError("sequences: no speculative arm to decide on", parameter="sequences")
    lo_rounds = _count(min_rounds, "min_rounds", 1)
    hi_rounds = _count(max_rounds, "max_rounds", 1)
    if hi_rounds < lo_rounds:
        raise ConfigError(f"max_rounds ({hi_rounds}) is below min_rounds ({lo_rounds})", parameter="max_rounds")
    spent = _real(elapsed_s, "elapsed_s")
    budget = None if max_s is None else _positive(max_s, "max_s")
    next_round = 0.0 if round_s is None else max(0.0, _real(round_s, "round_s"))
    n = min(seq.n for seq in sequences.values())
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
