"""Sequential stopping on paired server starts: validity under optional stopping (simulated, seeded),
power, coverage, the design arithmetic against hand-computed values, and argument errors.

Simulated trial: round i has a session drift d_i ~ N(0, 0.2) shared by its two starts (what interleaving
cancels) and per-start noise N(0, sd/sqrt 2) on the log scale, so y_i = log(arm/base) ~ N(log ratio, sd).
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

pytest.importorskip("savvi", reason="savvi needs Python >= 3.11")

from scipy import stats  # noqa: E402  (installed with savvi)

from spectrial.analysis.sequential import (  # noqa: E402
    PairedSequence,
    decide,
    first_finite_round,
    fixed_design_rounds,
    rounds_to_detect,
)
from spectrial.errors import ConfigError  # noqa: E402

ALPHA = 0.05
MAX_ROUNDS = 60
DRIFT_SD = 0.20  # round-to-round drift of both starts together (20 %: much larger than the effect)


def _rates(rng: np.random.Generator, ratio: float, sd: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    drift = rng.normal(0.0, DRIFT_SD, n)
    noise = rng.normal(0.0, sd / math.sqrt(2.0), (2, n))
    base = 40.0 * np.exp(drift + noise[0])
    return base, 40.0 * ratio * np.exp(drift + noise[1])


def _run(rng: np.random.Generator, ratio: float, sd: float, *, margin: float | None = None,
         stop: bool = True, max_rounds: int = MAX_ROUNDS) -> tuple[PairedSequence, bool, int]:
    """One trial looking after every round; stop at the first decision when `stop`.
    Returns the sequence, whether 1 was ever excluded, and the round of the first decision (0: none)."""
    base, arm = _rates(rng, ratio, sd, max_rounds)
    seq = PairedSequence(level=1 - ALPHA, margin=margin)
    excluded, decided_at = False, 0
    for b, a in zip(base, arm, strict=True):
        seq.add(float(b), float(a))
        _check_status_matches_interval(seq)
        excluded = excluded or seq.status() in ("faster", "slower")
        if decided_at == 0 and seq.status() != "undecided":
            decided_at = seq.n
            if stop:
                break
    return seq, excluded, decided_at


def _check_status_matches_interval(seq: PairedSequence) -> None:
    """The status is what the interval says (definitions in the module docstring)."""
    iv, status = seq.interval(), seq.status()
    if iv is None:
        assert status in ("undecided", "inconsistent")
        return
    low, high = iv
    m = seq.margin
    expected = ("faster" if low > 1.0 else "slower" if high < 1.0
                else "equivalent" if m is not None and 1 / (1 + m) <= low and high <= 1 + m else "undecided")
    assert status == expected, (status, iv, m)


def _naive_ever_excludes(y: np.ndarray, alpha: float) -> np.ndarray:
    """Per run: did an ordinary t-interval, recomputed after every round from round 2, ever exclude 0?"""
    n = np.arange(1, y.shape[1] + 1)
    mean = np.cumsum(y, axis=1) / n
    with np.errstate(divide="ignore", invalid="ignore"):
        sd = np.sqrt((np.cumsum(y * y, axis=1) - n * mean**2) / (n - 1))
        half = stats.t.ppf(1 - alpha / 2, n - 1) * sd / np.sqrt(n)
    hit = (np.abs(mean) > half)[:, 1:]
    return hit.any(axis=1)


def _sim_error(p: float, runs: int) -> float:
    return 2.0 * math.sqrt(p * (1 - p) / runs)


# --- validity: repeated looks under the null ---------------------------------------------------------
def test_null_false_alarm_rate_holds_under_repeated_looks_and_the_naive_way_does_not() -> None:
    runs, sd = 400, 0.05
    rng = np.random.default_rng(20240611)
    seq_alarms, ys = 0, []
    for _ in range(runs):
        seq, excluded, _ = _run(rng, 1.0, sd, stop=False)
        seq_alarms += excluded
        ys.append(seq.log_ratios)
    seq_rate = seq_alarms / runs
    naive_rate = float(_naive_ever_excludes(np.array(ys), ALPHA).mean())  # the very same data
    assert seq_rate <= ALPHA + _sim_error(ALPHA, runs), seq_rate
    assert naive_rate >= 3 * ALPHA, naive_rate  # ~1 in 3 over 60 looks: why repeated CIs are not allowed
    assert naive_rate > seq_rate + 0.15


def test_the_interval_opens_at_the_round_the_formula_says() -> None:
    # savvi: finite once (phi/(phi+n))^(n-2) < alpha^2; phi 1, alpha .05: n=5 gives 6^-3 = .0046 > .0025,
    # n=6 gives 7^-4 = .00042 < .0025
    assert first_finite_round(0.95, 1.0) == 6
    seq = PairedSequence()
    for i in range(5):
        seq.add(50.0, 50.0 + i)
    assert seq.interval() is None and seq.status() == "undecided"
    seq.add(50.0, 52.0)
    low, high = seq.interval()
    assert low < seq.estimate() < high


# --- power ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("ratio", "expected"), [(1.10, "faster"), (0.90, "slower")])
def test_a_ten_percent_difference_is_decided_early(ratio: float, expected: str) -> None:
    rng = np.random.default_rng(7)
    outcomes = [_run(rng, ratio, 0.05) for _ in range(60)]
    statuses = [seq.status() for seq, _, _ in outcomes]
    rounds = [at for _, _, at in outcomes]
    assert statuses.count(expected) >= 57, statuses
    assert float(np.median(rounds)) <= 12, rounds
    assert max(rounds) < MAX_ROUNDS


def test_no_difference_with_small_noise_ends_equivalent() -> None:
    rng = np.random.default_rng(11)
    outcomes = [_run(rng, 1.0, 0.02, margin=0.05) for _ in range(60)]
    statuses = [seq.status() for seq, _, _ in outcomes]
    rounds = [at for _, _, at in outcomes]
    assert statuses.count("equivalent") >= 55, statuses
    assert float(np.median(rounds)) <= 15 and max(rounds) < MAX_ROUNDS, rounds


# --- coverage under optional stopping ------------------------------------------------------------------
def test_final_interval_covers_the_true_ratio_under_optional_stopping() -> None:
    runs, ratio = 300, 1.04
    rng = np.random.default_rng(5)
    covered = 0
    for _ in range(runs):
        seq, _, _ = _run(rng, ratio, 0.05, margin=0.02)  # stops at the first faster/slower/equivalent
        low, high = seq.interval()
        covered += low <= ratio <= high
    assert covered / runs >= 1 - ALPHA - _sim_error(ALPHA, runs), covered / runs


def test_a_drifting_ratio_empties_the_running_intersection() -> None:
    seq = PairedSequence()
    rng = np.random.default_rng(3)
    for i in range(200):
        y = (0.2 if i < 12 else -0.2) + rng.normal(0.0, 0.01)
        seq.add(40.0, 40.0 * math.exp(y))
    assert seq.status() == "inconsistent" and seq.interval() is None
    stop, why = decide({"eagle": seq}, min_rounds=2, max_rounds=500, elapsed_s=0.0, max_s=None)
    assert stop and "drifted" in why


# --- design arithmetic ---------------------------------------------------------------------------------
def test_fixed_design_rounds_hand_computed() -> None:
    # sd 1, half-width 1: n=6: t(.975, 5) = 2.5706 / sqrt 6 = 1.049 > 1; n=7: t(.975, 6) = 2.4469 / sqrt 7 = .925
    assert fixed_design_rounds(1.0, 1.0, 0.95) == 7
    # sd .05, half-width .02: n=26: 2.0595 * .05 / sqrt 26 = .02019 > .02; n=27: 2.0555 * .05 / sqrt 27 = .01978
    assert fixed_design_rounds(0.05, 0.02, 0.95) == 27
    # z-like case, many rounds: sd 1, half-width .1 at 90 %: 1.6449^2 * 100 = 270.6 -> t(.95, 271) = 1.6505
    # gives 1.6505 / sqrt 272 = .10008 > .1, n=273: 1.6505 / sqrt 273 = .09989
    assert fixed_design_rounds(1.0, 0.1, 0.90) == 273


def test_rounds_to_detect_hand_computed() -> None:
    # CI [.95, 1.05] on 10 starts: H = ln(1.05/.95)/2 = .050042; 5 % at 80 % power, 95 %:
    # H_target = ln 1.05 * 1.95996 / (1.95996 + .84162) = .048790 * .69959 = .034133
    # n = 10 * (.050042 / .034133)^2 = 10 * 2.1494 = 21.49 -> 22
    assert rounds_to_detect(0.95, 1.05, 10) == 22
    # a CI already narrow enough: [0.99, 1.01] on 100 requests -> 100 * (.010000 / .034133)^2 = 8.58 -> 9
    assert rounds_to_detect(0.99, 1.01, 100) == 9
    # 10 % effect at 50 % power (z_power = 0): H_target = ln 1.1 = .09531; [.9, 1.1], n 4:
    # H = ln(1.1/.9)/2 = .10034 -> 4 * 1.1083 = 4.43 -> 5
    assert rounds_to_detect(0.9, 1.1, 4, effect=0.10, power=0.5) == 5
    assert rounds_to_detect(-math.inf, math.inf, 3) is None
    assert rounds_to_detect(0.9, math.inf, 3) is None


def test_sequence_reports_its_fixed_design_equivalent() -> None:
    rng = np.random.default_rng(1)
    base, arm = _rates(rng, 1.05, 0.05, 30)
    seq = PairedSequence.from_rates(list(base), list(arm))
    low, high = seq.log_interval()
    assert seq.estimate() == pytest.approx(math.exp(np.mean(np.log(arm / base))), rel=1e-12)
    m = seq.fixed_design_rounds()
    assert m == fixed_design_rounds(float(np.std(seq.log_ratios, ddof=1)), (high - low) / 2, 0.95)
    assert 2 <= m < seq.n  # the price of looking at every round: the same width costs fewer fixed rounds
    rec = seq.to_record()
    assert rec.n == 30 and rec.fixed_design_rounds == m and len(rec.log_ratios) == 30
    assert rec.low == pytest.approx(math.exp(low)) and "savvi" in rec.method
    assert PairedSequence().to_record().low is None


# --- the stopping rule ---------------------------------------------------------------------------------
def _decided_pair() -> dict[str, PairedSequence]:
    rng = np.random.default_rng(2)
    fast, same = PairedSequence(), PairedSequence(margin=0.05)
    for _ in range(20):
        b = 40.0 * math.exp(rng.normal(0, 0.2))
        fast.add(b, b * 1.2 * math.exp(rng.normal(0, 0.02)))
        same.add(b, b * math.exp(rng.normal(0, 0.01)))
    return {"eagle": fast, "ngram": same}


def test_decide_stops_when_every_arm_is_settled_but_not_before_min_rounds() -> None:
    arms = _decided_pair()
    assert arms["eagle"].status() == "faster" and arms["ngram"].status() == "equivalent"
    stop, why = decide(arms, min_rounds=4, max_rounds=40, elapsed_s=100.0, max_s=3600.0)
    assert stop and why.startswith("decided after 20 rounds") and "eagle faster" in why
    stop, why = decide(arms, min_rounds=25, max_rounds=40, elapsed_s=100.0, max_s=3600.0)
    assert not stop and why.startswith("continue")


def test_decide_budgets() -> None:
    open_arm = {"eagle": PairedSequence.from_rates([40.0, 41.0, 39.0], [40.0, 42.0, 38.0])}
    stop, why = decide(open_arm, min_rounds=1, max_rounds=10, elapsed_s=0.0, max_s=None)
    assert not stop and why.startswith("continue: 3 rounds; undecided: eagle")
    stop, why = decide(open_arm, min_rounds=1, max_rounds=3, elapsed_s=0.0, max_s=None)
    assert stop and why.startswith("start budget: 3 of 3") and "eagle" in why
    stop, why = decide(open_arm, min_rounds=1, max_rounds=10, elapsed_s=3601.0, max_s=3600.0)
    assert stop and why.startswith("time budget")
    stop, _ = decide(open_arm, min_rounds=1, max_rounds=10, elapsed_s=3000.0, max_s=3600.0, round_s=700.0)
    assert stop  # the next round would overrun
    stop, _ = decide(open_arm, min_rounds=1, max_rounds=10, elapsed_s=3000.0, max_s=3600.0, round_s=500.0)
    assert not stop


# --- bad inputs ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("base", "arm", "name"), [
    (0.0, 40.0, "base_rate"), (-1.0, 40.0, "base_rate"), (math.nan, 40.0, "base_rate"),
    (40.0, math.inf, "arm_rate"), (40.0, 0.0, "arm_rate"), (40.0, True, "arm_rate"), (40.0, "41", "arm_rate"),
])
def test_bad_rates_name_the_argument(base: float, arm: float, name: str) -> None:
    seq = PairedSequence()
    with pytest.raises(ConfigError) as err:
        seq.add(base, arm)
    assert err.value.parameter == name and name in str(err.value)
    assert seq.n == 0


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"level": 0.0}, "level"), ({"level": 1.0}, "level"), ({"level": 95}, "level"), ({"level": math.nan}, "level"),
    ({"margin": -0.05}, "margin"), ({"margin": 0.0}, "margin"), ({"phi": 0.0}, "phi"),
])
def test_bad_settings_name_the_argument(kwargs: dict, name: str) -> None:
    with pytest.raises(ConfigError) as err:
        PairedSequence(**kwargs)
    assert err.value.parameter == name


@pytest.mark.parametrize(("call", "name"), [
    (lambda: fixed_design_rounds(0.0, 0.02), "sd_log"),
    (lambda: fixed_design_rounds(0.05, -0.02), "halfwidth_log"),
    (lambda: fixed_design_rounds(0.05, 0.02, level=1.5), "level"),
    (lambda: rounds_to_detect(0.0, 1.1, 10), "ci_low"),
    (lambda: rounds_to_detect(1.1, 0.9, 10), "ci_high"),
    (lambda: rounds_to_detect(math.nan, 1.1, 10), "ci_low"),
    (lambda: rounds_to_detect(0.9, 1.1, 0), "n"),
    (lambda: rounds_to_detect(0.9, 1.1, 10, effect=-0.05), "effect"),
    (lambda: rounds_to_detect(0.9, 1.1, 10, power=1.0), "power"),
    (lambda: decide({}, min_rounds=1, max_rounds=2, elapsed_s=0, max_s=None), "sequences"),
    (lambda: decide({"a": PairedSequence()}, min_rounds=5, max_rounds=2, elapsed_s=0, max_s=None), "max_rounds"),
    (lambda: decide({"a": PairedSequence()}, min_rounds=1, max_rounds=2, elapsed_s=0, max_s=0), "max_s"),
])
def test_bad_design_arguments_name_the_argument(call, name: str) -> None:
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.parameter == name


def test_missing_savvi_is_a_config_error_with_the_pip_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "savvi.linear_regression", None)  # what an interpreter without it sees
    with pytest.raises(ConfigError) as err:
        PairedSequence()
    assert err.value.parameter == "decide" and "savvi==0.3.1" in str(err.value)
