"""Closed-form speculative-decoding relations: hand-worked values, inverses, input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spectrial.analysis import (
    accept_len_from_counts,
    break_even_accept_len,
    cycle_ms_from,
    expected_accept_len,
    ms_per_token,
    required_alpha,
    spec_throughput,
    speedup,
)
from spectrial.errors import ConfigError


def test_leviathan_accept_len_hand_worked() -> None:
    # 1 + 0.75 + 0.75^2 + 0.75^3 = 1 + 0.75 + 0.5625 + 0.421875
    assert expected_accept_len(0.75, 3) == pytest.approx(2.734375, abs=1e-12)
    assert expected_accept_len(0.5, 1) == pytest.approx(1.5)
    assert expected_accept_len(0.0, 5) == 1.0
    assert expected_accept_len(1.0, 5) == 6.0


def test_accept_len_is_continuous_at_alpha_one_and_monotone() -> None:
    assert expected_accept_len(1 - 1e-9, 4) == pytest.approx(5.0, rel=1e-6)
    taus = [expected_accept_len(a, 4) for a in np.linspace(0, 1, 41)]
    assert all(b > a for a, b in zip(taus, taus[1:], strict=False))
    # one more draft never commits fewer tokens
    assert expected_accept_len(0.6, 4) > expected_accept_len(0.6, 3)


def test_accept_len_accepts_numpy_scalars() -> None:
    assert expected_accept_len(np.float64(0.75), np.int64(3)) == pytest.approx(2.734375)


@given(alpha=st.floats(min_value=0.0, max_value=1.0), k=st.integers(min_value=1, max_value=12))
def test_required_alpha_round_trips(alpha: float, k: int) -> None:
    tau = expected_accept_len(alpha, k)
    back = required_alpha(tau, k)
    assert expected_accept_len(back, k) == pytest.approx(tau, rel=1e-9, abs=1e-9)


def test_required_alpha_ends_and_hand_value() -> None:
    assert required_alpha(1.0, 3) == 0.0
    assert required_alpha(4.0, 3) == 1.0
    assert required_alpha(2.734375, 3) == pytest.approx(0.75, abs=1e-9)


def test_required_alpha_rejects_unreachable_lengths() -> None:
    # seed case: 150 tok/s with a 30 ms cycle needs 4.5 tokens per cycle; 3 drafts commit at most 4
    with pytest.raises(ConfigError, match="accept_len 4.5 is unreachable with k=3"):
        required_alpha(150 * 30 / 1000, 3)
    with pytest.raises(ConfigError, match="accept_len"):
        required_alpha(0.9, 3)


def test_break_even_seed_case() -> None:
    # a ~30 ms cycle against an 82 tok/s baseline must commit 30 x 82 / 1000 = 2.46 tokens per cycle
    assert break_even_accept_len(30.0, ms_per_token(82.0)) == pytest.approx(2.46, abs=1e-12)
    # H200 first sweep: 11 ms cycle vs 5.36 ms/token -> ~2
    assert break_even_accept_len(11.0, 5.36) == pytest.approx(2.052, abs=1e-3)


def test_speedup_and_throughput_agree() -> None:
    assert spec_throughput(2.0, 10.0) == pytest.approx(200.0)
    assert speedup(2.0, 10.0, 5.0) == pytest.approx(1.0)
    # at the break-even length the speedup is exactly 1
    base = ms_per_token(82.0)
    assert speedup(break_even_accept_len(30.0, base), 30.0, base) == pytest.approx(1.0)
    # speedup = spec tok/s / base tok/s
    assert speedup(2.1, 22.0, base) == pytest.approx(spec_throughput(2.1, 22.0) / 82.0)


def test_ms_per_token_is_its_own_inverse() -> None:
    assert ms_per_token(200.0) == 5.0
    assert ms_per_token(ms_per_token(187.1)) == pytest.approx(187.1)


def test_counters_from_llamacpp_h200_runs() -> None:
    # LLAMACPP.md: n_max 1, 110 of 144 drafts accepted, mean len ~1.76 (one draft per verify step)
    assert accept_len_from_counts(110, 144) == pytest.approx(1.7639, abs=1e-4)
    # n_max 3, 164 of 272 drafts accepted (272 / 3 verify steps), mean len ~2.8
    assert accept_len_from_counts(164, 272 / 3) == pytest.approx(2.809, abs=1e-3)
    assert accept_len_from_counts(0, 759 / 3) == 1.0
    assert cycle_ms_from(1000.0, 100) == 10.0


@pytest.mark.parametrize(
    ("call", "argname"),
    [
        (lambda: expected_accept_len(1.5, 3), "alpha"),
        (lambda: expected_accept_len(-0.1, 3), "alpha"),
        (lambda: expected_accept_len(math.nan, 3), "alpha"),
        (lambda: expected_accept_len(0.5, 0), "k"),
        (lambda: expected_accept_len(0.5, 2.5), "k"),
        (lambda: expected_accept_len(0.5, True), "k"),
        (lambda: spec_throughput(2.0, 0.0), "cycle_ms"),
        (lambda: spec_throughput(0.5, 10.0), "accept_len"),
        (lambda: break_even_accept_len(30.0, -1.0), "base_ms_per_token"),
        (lambda: speedup(2.0, math.inf, 5.0), "cycle_ms"),
        (lambda: accept_len_from_counts(-1, 10), "accepted"),
        (lambda: accept_len_from_counts(3, 0), "verify_steps"),
        (lambda: cycle_ms_from(0, 10), "decode_ms"),
        (lambda: ms_per_token("82"), "tok_s"),
    ],
)
def test_bad_inputs_name_the_argument(call, argname: str) -> None:
    with pytest.raises(ConfigError, match=argname):
        call()


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        expected_accept_len(2.0, 1)
