"""decide's default design (issue 36): group-sequential repeated t-intervals over paired rounds with an error-spending
boundary calibrated by simulation, this host's history as a prior on the variance that today's starts can overturn,
and the optimal requests per start. Known truths are asserted: false claims under no effect, simultaneous coverage,
the original case decided in few rounds, a prior dropped when the rounds contradict it, hand-computed allocations.
The full table (effects x spreads x history) is benchmarks/bench_decide.py's."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("scipy")

from spectrial.analysis.sequential import (  # noqa: E402
    GroupSequential,
    SpreadPrior,
    allocate,
    decide,
    forecast,
    group_sequential_design,
    looks,
    power_rounds,
    prior_from_starts,
)
from spectrial.errors import ConfigError  # noqa: E402

ORIGINAL = 60.5 / 82.2  # the original case: 0.736x
SD8 = 0.08 * math.sqrt(2.0)  # 8 % start-to-start spread: a paired round's SD


def test_no_effect_claims_at_most_the_level_over_every_look() -> None:
    """20 rounds looked at after every round: false claims (faster or slower) stay at 5 %; 4000 trials."""
    f = forecast(1.0, 0.1, max_rounds=20, paths=4000, seed=11)
    assert f.wrong == f.decided and 0.03 <= f.wrong <= 0.065, f
    # the same computation through the class, one trial at a time
    rng = np.random.default_rng(5)
    claims = 0
    for _ in range(300):
        seq = GroupSequential(max_rounds=20)
        for _ in range(20):
            seq.add(100.0, 100.0 * math.exp(rng.normal(0.0, 0.1)))
            if seq.status() != "undecided":
                claims += 1
                break
    assert claims / 300 <= 0.09


def test_the_intervals_cover_the_truth_at_every_look_at_once() -> None:
    design = group_sequential_design(0.95, 30, 3, 0)
    rng = np.random.default_rng(3)
    truth = math.log(1.07)
    y = truth + 0.12 * rng.standard_normal((4000, 30))
    low, high, _ = looks(y, design)
    missed = np.nanmax(np.where(np.isnan(low), 0, (low > truth) | (high < truth)), axis=1)
    assert 0.03 <= missed.mean() <= 0.065  # 95 % simultaneous (a naive 95 % interval misses ~30 % over 30 looks)


def test_the_original_case_decides_in_four_rounds_without_history_and_two_with() -> None:
    none = forecast(ORIGINAL, SD8, max_rounds=20, paths=3000, seed=2)
    assert none.median_rounds <= 4 and none.wrong == 0.0, none
    prior = prior_from_starts(np.exp(np.random.default_rng(4).normal(0, 0.08, (6, 3))).tolist())
    assert prior is not None and prior.df == 12
    hist = forecast(ORIGINAL, SD8, max_rounds=20, prior_sd=prior.sd_log, prior_df=prior.df, paths=3000, seed=2)
    assert hist.median_rounds <= 3 and hist.wrong == 0.0, hist
    assert group_sequential_design(0.95, 20, 2, 12).first_look == 2


def test_a_sequence_has_no_interval_before_its_first_look_and_says_so() -> None:
    seq = GroupSequential(max_rounds=10)
    assert seq.first_look == 3
    for b, a in ((100, 70), (101, 72)):
        seq.add(b, a)
        assert seq.interval() is None and seq.status() == "undecided"
    seq.add(99, 71)
    iv = seq.interval()
    assert iv is not None and iv[0] <= seq.estimate() <= iv[1]  # the point and its interval are one pair
    early = GroupSequential(max_rounds=10)
    early.add(100, 70)
    assert "unbounded before round 3" in str(early)


def test_a_prior_today_contradicts_is_dropped_and_the_arm_judged_without_it() -> None:
    """History says the starts spread 1 %; today's spread 20 %: the F-test drops the prior, and the boundary and
    variance are then the no-history design's."""
    prior = SpreadPrior(sd_log=0.01 * math.sqrt(2), df=12, source="test")
    seq = GroupSequential(max_rounds=20, prior=prior)
    assert seq.first_look == 2
    rates = [(100, 90), (100, 120), (100, 80), (100, 125)]
    for b, a in rates:
        seq.add(b, a)
    assert seq.prior_dropped_at is not None and not seq.prior_in_use
    plain = GroupSequential(max_rounds=20)
    for b, a in rates:
        plain.add(b, a)
    iv, iv0 = seq.interval(), plain.interval()
    assert iv is not None and iv0 is not None and iv[1] - iv[0] >= iv0[1] - iv0[0] - 1e-12
    assert "dropped at round" in seq.method()
    kept = GroupSequential(max_rounds=20, prior=SpreadPrior(sd_log=0.3, df=12))
    for b, a in rates:
        kept.add(b, a)
    assert kept.prior_in_use and kept.prior_dropped_at is None


def test_prior_from_starts_hand_computed() -> None:
    groups = [[100.0, 110.0], [50.0, 50.0, 55.0], [80.0]]
    logs = [[math.log(x) for x in g] for g in groups[:2]]
    ss = sum(sum((v - sum(g) / len(g)) ** 2 for v in g) for g in logs)
    p = prior_from_starts(groups, source="s")
    assert p is not None and p.df == 1 + 2 and math.isclose(p.sd_log, math.sqrt(2 * ss / 3))
    assert prior_from_starts([[100.0], [90.0]]) is None


def test_allocation_hand_computed() -> None:
    # a 540 s start, 5 s requests, within-start SD 5 %, start-to-start SD 4 % of medians of 10 requests
    a = allocate(540.0, 5.0, 0.05, 0.04, 10.0, default=5, lo=5, hi=40)
    noise = math.pi / 2 * 0.05 ** 2 / 10
    expect = math.sqrt(540 / 5 * noise * 10 / (0.04 ** 2 - noise))
    assert a.requests == round(expect) and math.isclose(a.optimum, expect)
    cheap = allocate(5.0, 5.0, 0.05, 0.04, 10.0, default=5, lo=5, hi=40)
    assert cheap.requests < a.requests  # a costly start carries more requests
    assert allocate(None, 5.0, 0.05, 0.04, 10.0, default=7).requests == 7  # no history: `repeats`


def test_decide_counts_rounds_when_settled_arms_leave() -> None:
    fast, slow = GroupSequential(max_rounds=6), GroupSequential(max_rounds=6)
    for i in range(3):
        slow.add(100, 50 + i)
    fast.add(100, 101)
    stop, why = decide({"a": slow, "b": fast}, min_rounds=2, max_rounds=6, elapsed_s=1, max_s=None, rounds=6)
    assert stop and why.startswith("start budget: 6 of 6 rounds")


def test_power_rounds_matches_a_known_t_test() -> None:
    # a paired t-test, effect 0.5 SD, 80 % power at 5 %: 34 pairs (G*Power / textbook tables)
    assert power_rounds(math.exp(0.5), 1.0) == 34
    with pytest.raises(ConfigError):
        power_rounds(1.0, 0.1)


def test_design_arguments_are_checked() -> None:
    with pytest.raises(ConfigError) as err:
        group_sequential_design(0.95, 10_000)
    assert err.value.parameter == "max_rounds"
    with pytest.raises(ConfigError):
        GroupSequential(level=1.5)


def test_a_host_that_moved_does_not_lend_its_history() -> None:
    """A decide run leans on its host's history only while its first baseline start lies inside the earlier
    baselines' band (the drift band for one start); a start 40 % slower is a changed host."""
    from spectrial.protocol.earlier import BaselineRun, Earlier
    from spectrial.protocol.trial import _moved

    found = Earlier(folder="o", runs=["a", "b", "c"],
                    baselines=[BaselineRun(run_id=r, start_medians=v) for r, v in
                               (("a", [400.0, 404.0]), ("b", [396.0, 402.0]), ("c", [399.0, 401.0]))])
    assert _moved(found, 401.0, 0.10) is None
    why = _moved(found, 240.0, 0.10)
    assert why is not None and "240.0 tok/s" in why and "outside the band" in why
    assert _moved(Earlier(folder="o"), 240.0, 0.10) is None  # nothing to judge by


def test_the_h100_sglang_rounds_that_ran_out_of_budget_now_decide_at_round_three() -> None:
    """Issue 36: real SGLang on the lent H100 measured 0.434, 0.501 and 0.499 in three rounds, and the confidence
    sequence stopped on its 7-minute budget with an unbounded interval at every look. The design decides them."""
    seq = GroupSequential(max_rounds=20)
    for ratio in (0.434, 0.501, 0.499):
        seq.add(100.0, 100.0 * ratio)
    iv = seq.interval()
    assert seq.status() == "slower" and iv is not None and iv[1] < 1.0
    assert seq.fixed_design_rounds() is not None and seq.to_record().fixed_design_rounds is not None
