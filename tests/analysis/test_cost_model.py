"""Cycle-cost model: exact recovery on synthetic arms, and the real H200 sweep of LLAMACPP.md."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from spectrial.analysis import (
    break_even_accept_len,
    expected_accept_len,
    fit_cycle_model,
    ms_per_token,
    prediction_errors,
    spec_throughput,
    speedup,
)
from spectrial.errors import ConfigError

# /work/shared/reference/LLAMACPP.md, "A finer H200 sweep": random-weight Llama-3-8B shape, f16, 1-layer
# EAGLE-3 draft with synthetic per-token acceptance a, 3 requests x 256 tokens; baseline 187.1 tok/s.
# columns: n_max (k), a, tok/s median, mean len, cycle ms, draft ms/cycle, speedup, break-even len
H200_BASE_TOK_S = 187.1
H200_SWEEP = pd.DataFrame(
    [
        (1, 0.6, 165.8, 1.55, 9.31, 0.74, 0.89, 1.75),
        (2, 0.6, 197.5, 1.97, 9.94, 1.39, 1.06, 1.87),
        (3, 0.6, 190.8, 2.04, 10.65, 1.98, 1.02, 2.00),
        (4, 0.6, 201.5, 2.38, 11.76, 2.67, 1.08, 2.21),
        (6, 0.6, 188.0, 2.52, 13.35, 3.84, 1.00, 2.51),
        (1, 0.9, 210.2, 1.90, 9.00, 0.75, 1.12, 1.69),
        (2, 0.9, 269.6, 2.71, 10.01, 1.38, 1.44, 1.88),
        (3, 0.9, 304.7, 3.54, 11.57, 2.03, 1.63, 2.17),
        (4, 0.9, 307.5, 3.98, 12.89, 2.71, 1.64, 2.42),
        (6, 0.9, 366.2, 5.20, 14.15, 3.86, 1.96, 2.66),
    ],
    columns=["k", "alpha", "tok_s", "mean_len", "cycle_ms", "draft_ms", "speedup", "break_even"],
)


def test_reproduces_llamacpp_two_parameter_model() -> None:
    model = fit_cycle_model(H200_SWEEP[["k", "cycle_ms"]])
    # LLAMACPP.md: cycle = 8.23 ms + 0.95 ms x k
    assert model.fixed_ms == pytest.approx(8.23, abs=0.005)
    assert model.per_draft_ms == pytest.approx(0.95, abs=0.005)
    errs = prediction_errors(model, H200_SWEEP)
    abs_err = errs["rel_error"].abs()
    # "median error of 2.7 % and a worst case of 10.8 % (n_max 4, a 0.9)"
    assert abs_err.median() == pytest.approx(0.027, abs=0.0005)
    assert abs_err.max() == pytest.approx(0.108, abs=0.0005)
    worst = errs.loc[abs_err.idxmax()]
    assert (worst["k"], worst["alpha"]) == (4, 0.9)
    assert 0.9 < model.r2 < 1.0


def test_draft_verify_split_on_h200_sweep() -> None:
    model = fit_cycle_model(H200_SWEEP[["k", "cycle_ms", "draft_ms"]])
    assert model.has_split
    # "each extra drafted token adds ~0.65 ms of drafting plus a little verify"
    assert 0.55 < model.draft_per_token_ms < 0.7
    assert 0.0 < model.verify_per_token_ms < 0.5
    # the two parts add up to the total fit (least squares is linear in the data)
    assert model.draft_fixed_ms + model.verify_fixed_ms == pytest.approx(model.fixed_ms)
    assert model.draft_per_token_ms + model.verify_per_token_ms == pytest.approx(model.per_draft_ms)
    for k in (1, 3, 6):
        assert model.draft_ms(k) + model.verify_ms(k) == pytest.approx(model.cycle_ms(k))


def test_sweep_columns_follow_the_formulas() -> None:
    # the doc's derived columns use its rounded 5.32 ms/token (1000 / 187.1 is 5.345)
    base_ms = 5.32
    assert ms_per_token(H200_BASE_TOK_S) == pytest.approx(base_ms, abs=0.03)
    for row in H200_SWEEP.itertuples():
        assert break_even_accept_len(row.cycle_ms, base_ms) == pytest.approx(row.break_even, abs=0.006)
        assert speedup(row.mean_len, row.cycle_ms, base_ms) == pytest.approx(row.speedup, abs=0.011)
        assert spec_throughput(row.mean_len, row.cycle_ms) == pytest.approx(row.tok_s, rel=0.02)
        # "Mean accepted length follows (1 - a^(k+1)) / (1 - a) within a few percent"
        assert expected_accept_len(row.alpha, row.k) == pytest.approx(row.mean_len, rel=0.07)


def test_recovers_known_costs_exactly() -> None:
    fixed, per, d0, d1 = 7.5, 1.25, 0.2, 0.6
    pts = [(k, fixed + per * k, d0 + d1 * k) for k in (1, 2, 3, 5, 8)]
    model = fit_cycle_model(pts)
    assert model.fixed_ms == pytest.approx(fixed, abs=1e-10)
    assert model.per_draft_ms == pytest.approx(per, abs=1e-10)
    assert model.draft_fixed_ms == pytest.approx(d0, abs=1e-10)
    assert model.draft_per_token_ms == pytest.approx(d1, abs=1e-10)
    assert model.verify_fixed_ms == pytest.approx(fixed - d0, abs=1e-10)
    assert model.verify_per_token_ms == pytest.approx(per - d1, abs=1e-10)
    assert max(abs(r) for r in model.residuals_ms) < 1e-10
    assert model.r2 == pytest.approx(1.0)
    for k, c, _ in pts:
        assert model.cycle_ms(k) == pytest.approx(c)


def test_residuals_are_measured_minus_fitted() -> None:
    model = fit_cycle_model([(1, 10.0), (2, 13.0), (3, 14.0)])
    # least squares through (1,10) (2,13) (3,14): slope 4/2 = 2, intercept 37/3 - 2*2 = 25/3
    assert model.per_draft_ms == pytest.approx(2.0)
    assert model.fixed_ms == pytest.approx(25 / 3)
    assert model.residuals_ms == pytest.approx((-1 / 3, 2 / 3, -1 / 3))
    assert not model.has_split
    with pytest.raises(ConfigError, match="draft_ms"):
        model.draft_ms(2)


def test_throughput_best_k_and_alpha_for() -> None:
    model = fit_cycle_model([(1, 9.0), (4, 12.0)])  # 8 ms + 1 ms per draft
    assert model.throughput(0.75, 3) == pytest.approx(2.734375 / 11.0 * 1000.0)
    # a free draft: more drafts always pay while alpha > 0
    free = fit_cycle_model([(1, 10.0), (2, 10.0)])
    assert free.best_k(0.5, range(1, 9)) == 8
    # a useless draft (alpha 0) commits one token whatever k: the cheapest k wins
    assert model.best_k(0.0, range(1, 9)) == 1
    # expensive drafts: one is best
    costly = fit_cycle_model([(1, 15.0), (2, 25.0)])
    assert costly.best_k(0.9, range(1, 9)) == 1
    # alpha_for inverts throughput
    a = model.alpha_for(250.0, 4)
    assert a is not None and model.throughput(a, 4) == pytest.approx(250.0, rel=1e-9)
    # unreachable even at alpha = 1: (k + 1) / cycle = 5 / 12 ms = 416.7 tok/s at most
    assert model.alpha_for(420.0, 4) is None
    # below one token per cycle: any draft reaches it
    assert model.alpha_for(50.0, 4) == 0.0


def test_predict_table() -> None:
    model = fit_cycle_model(H200_SWEEP[["k", "cycle_ms"]])
    table = model.predict_table([0.6, 0.9], [1, 2, 3], base_tok_s=H200_BASE_TOK_S)
    assert len(table) == 6
    assert list(table.columns) == ["alpha", "k", "accept_len", "cycle_ms", "tok_s", "speedup",
                                   "break_even_accept_len"]
    row = table[(table.alpha == 0.9) & (table.k == 3)].iloc[0]
    assert row.tok_s == pytest.approx(model.throughput(0.9, 3))
    assert row.speedup == pytest.approx(row.tok_s / H200_BASE_TOK_S)
    assert row.speedup > 1 > table[(table.alpha == 0.6) & (table.k == 1)].iloc[0].speedup
    wide = table.pivot(index="alpha", columns="k", values="tok_s")
    assert wide.shape == (2, 3)
    assert "speedup" not in model.predict_table([0.5], [1]).columns


@pytest.mark.parametrize(
    ("points", "match"),
    [
        ([(3, 10.0), (3, 11.0)], "two distinct k"),
        ([(1, 10.0), (2, 11.0, 1.0)], "all"),
        ([], "empty"),
        ([(1, 10.0), (2, math.nan)], "non-finite cycle_ms"),
        ([(1, 10.0), (2, -1.0)], "cycle_ms <= 0"),
        ([(1, 10.0, 11.0), (2, 12.0, 1.0)], "draft_ms"),
        (pd.DataFrame({"k": [1, 2]}), "cycle_ms"),
    ],
)
def test_fit_rejects_bad_points(points, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        fit_cycle_model(points)


def test_prediction_errors_needs_columns() -> None:
    model = fit_cycle_model([(1, 9.0), (4, 12.0)])
    with pytest.raises(ConfigError, match="alpha"):
        prediction_errors(model, pd.DataFrame({"k": [1], "tok_s": [100.0]}))
