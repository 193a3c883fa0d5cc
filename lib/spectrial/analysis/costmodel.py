"""A linear cycle-cost model fitted to measured speculative arms, and what it predicts.

Model (least squares, ``numpy.linalg.lstsq``) with k the drafted tokens per cycle:

    cycle_ms(k) = fixed_ms + per_draft_ms * k

When draft time per cycle is measured too, the two parts are fitted separately on the same design,
``draft(k) = d0 + d1 * k`` and ``verify(k) = (cycle - draft)(k) = v0 + v1 * k``; because least squares
is linear in the data, ``d0 + v0 == fixed_ms`` and ``d1 + v1 == per_draft_ms`` exactly.
Predicted throughput (tok/s) = expected_accept_len(alpha, k) / cycle_ms(k) * 1000.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from spectrial.analysis._checks import check_alpha, check_k, check_nonneg, check_positive
from spectrial.analysis.formulas import expected_accept_len, required_alpha
from spectrial.errors import ConfigError

__all__ = ["CycleModel", "fit_cycle_model", "prediction_errors"]

DEFAULT_KS: tuple[int, ...] = tuple(range(1, 11))


@dataclass(frozen=True)
class CycleModel:
    """Fitted cycle cost: cycle_ms(k) = fixed_ms + per_draft_ms * k (k = drafted tokens per cycle).

    ``residuals_ms`` are measured minus fitted cycle times, in the order of the fitted points;
    ``r2`` = 1 - SS_res / SS_tot (NaN when the measured cycles do not vary). The ``draft_*``/``verify_*``
    fields are set only when draft time per cycle was given for every point.
    """

    fixed_ms: float
    per_draft_ms: float
    ks: tuple[float, ...]
    cycle_ms_measured: tuple[float, ...]
    residuals_ms: tuple[float, ...]
    r2: float
    draft_fixed_ms: float | None = None
    draft_per_token_ms: float | None = None
    verify_fixed_ms: float | None = None
    verify_per_token_ms: float | None = None

    @property
    def has_split(self) -> bool:
        """True when the model separates draft and verify time."""
        return self.draft_fixed_ms is not None

    def cycle_ms(self, k: float) -> float:
        """Predicted cycle time in ms: fixed_ms + per_draft_ms * k."""
        kk = _nonneg_k(k)
        out = self.fixed_ms + self.per_draft_ms * kk
        if out <= 0:
            raise ConfigError(f"the model predicts a non-positive cycle ({out:.3g} ms) at k={k}: "
                              "k lies far outside the fitted range; fit with arms nearer that k")
        return out

    def draft_ms(self, k: float) -> float:
        """Predicted draft time per cycle: draft_fixed_ms + draft_per_token_ms * k (needs draft_ms data)."""
        self._need_split()
        return self.draft_fixed_ms + self.draft_per_token_ms * _nonneg_k(k)  # type: ignore[operator]

    def verify_ms(self, k: float) -> float:
        """Predicted verify + overhead time per cycle: verify_fixed_ms + verify_per_token_ms * k."""
        self._need_split()
        return self.verify_fixed_ms + self.verify_per_token_ms * _nonneg_k(k)  # type: ignore[operator]

    def throughput(self, alpha: float, k: int) -> float:
        """Predicted tok/s: expected_accept_len(alpha, k) / cycle_ms(k) * 1000."""
        return expected_accept_len(alpha, k) / self.cycle_ms(check_k(k)) * 1000.0

    def best_k(self, alpha: float, ks: Iterable[int] = DEFAULT_KS) -> int:
        """The k among ``ks`` with the highest predicted throughput at ``alpha`` (smallest k on ties)."""
        ks_list = [check_k(k, "ks[i]") for k in ks]
        if not ks_list:
            raise ConfigError("ks is empty: pass the candidate draft lengths, e.g. range(1, 9)")
        best = max(ks_list, key=lambda k: (self.throughput(alpha, k), -k))
        return best

    def alpha_for(self, target_tok_s: float, k: int) -> float | None:
        """Per-token acceptance needed to reach ``target_tok_s`` with ``k`` drafts, None if unreachable.

        Needed accept length tau = target_tok_s * cycle_ms(k) / 1000; None when tau > k + 1 (not even
        alpha = 1 suffices), 0.0 when tau <= 1 (any draft reaches it), else required_alpha(tau, k).
        """
        kk = check_k(k)
        tau = check_positive(target_tok_s, "target_tok_s") * self.cycle_ms(kk) / 1000.0
        if tau > kk + 1:
            return None
        if tau <= 1.0:
            return 0.0
        return required_alpha(tau, kk)

    def predict_table(self, alphas: Iterable[float], ks: Iterable[int] = DEFAULT_KS,
                      base_tok_s: float | None = None) -> pd.DataFrame:
        """Long table of predictions, one row per (alpha, k).

        Columns: alpha, k, accept_len (tau), cycle_ms, tok_s (= tau / cycle_ms * 1000) and, when
        ``base_tok_s`` is given, speedup (= tok_s / base_tok_s) and break_even_accept_len
        (= cycle_ms * base_tok_s / 1000). Pivot with ``df.pivot(index="alpha", columns="k", values="tok_s")``.
        """
        alphas_list = [check_alpha(a, "alphas[i]") for a in alphas]
        ks_list = [check_k(k, "ks[i]") for k in ks]
        base = None if base_tok_s is None else check_positive(base_tok_s, "base_tok_s")
        rows = []
        for a in alphas_list:
            for k in ks_list:
                tau, cyc = expected_accept_len(a, k), self.cycle_ms(k)
                row = {"alpha": a, "k": k, "accept_len": tau, "cycle_ms": cyc, "tok_s": tau / cyc * 1000.0}
                if base is not None:
                    row["speedup"] = row["tok_s"] / base
                    row["break_even_accept_len"] = cyc * base / 1000.0
                rows.append(row)
        return pd.DataFrame(rows)

    def _need_split(self) -> None:
        if not self.has_split:
            raise ConfigError("this CycleModel was fitted without draft_ms: pass (k, cycle_ms, draft_ms) "
                              "points to fit_cycle_model to separate draft from verify time")


def _nonneg_k(k: object) -> float:
    return check_nonneg(k, "k (drafted tokens per cycle)")


def _points_array(points: Iterable[Sequence[float]] | pd.DataFrame) -> tuple[np.ndarray, np.ndarray,
                                                                              np.ndarray | None]:
    if isinstance(points, pd.DataFrame):
        missing = {"k", "cycle_ms"} - set(points.columns)
        if missing:
            raise ConfigError(f"points DataFrame lacks column(s) {sorted(missing)}: it needs k, cycle_ms "
                              "and optionally draft_ms")
        k = points["k"].to_numpy(float)
        c = points["cycle_ms"].to_numpy(float)
        d = points["draft_ms"].to_numpy(float) if "draft_ms" in points.columns else None
        return k, c, d
    rows = [tuple(p) for p in points]
    widths = {len(r) for r in rows}
    if not rows:
        raise ConfigError("points is empty: pass (k, cycle_ms) or (k, cycle_ms, draft_ms) per measured arm")
    if len(widths) != 1 or widths.pop() not in (2, 3):
        raise ConfigError("points must all be (k, cycle_ms) or all (k, cycle_ms, draft_ms) tuples")
    arr = np.asarray(rows, dtype=float)
    return arr[:, 0], arr[:, 1], (arr[:, 2] if arr.shape[1] == 3 else None)


def fit_cycle_model(points: Iterable[Sequence[float]] | pd.DataFrame) -> CycleModel:
    """Least-squares fit of cycle_ms = fixed_ms + per_draft_ms * k over measured arms.

    ``points``: tuples (k, cycle_ms) or (k, cycle_ms, draft_ms), k = drafted tokens per cycle
    (llama.cpp n_max, SGLang num_draft_tokens - 1 ...), times in ms per cycle; or a DataFrame with
    columns k, cycle_ms[, draft_ms]. Needs at least two distinct k. With draft_ms, also fits
    draft = d0 + d1 * k and verify = cycle - draft = v0 + v1 * k.
    """
    k, c, d = _points_array(points)
    for name, arr in (("k", k), ("cycle_ms", c)) + ((("draft_ms", d),) if d is not None else ()):
        if not np.all(np.isfinite(arr)):
            raise ConfigError(f"points contain a non-finite {name}: drop failed arms before fitting")
    if np.any(k < 0):
        raise ConfigError("points contain k < 0: k is the number of drafted tokens per cycle")
    if np.any(c <= 0):
        raise ConfigError("points contain cycle_ms <= 0: pass the measured cycle time in ms")
    if d is not None and (np.any(d < 0) or np.any(d > c)):
        raise ConfigError("points contain draft_ms < 0 or > cycle_ms: draft time is a part of the cycle")
    if np.unique(k).size < 2:
        raise ConfigError("points need at least two distinct k to separate the fixed and per-draft costs")
    design = np.column_stack([np.ones_like(k), k])
    (fixed, per), *_ = np.linalg.lstsq(design, c, rcond=None)
    fitted = design @ np.array([fixed, per])
    resid = c - fitted
    ss_tot = float(np.sum((c - c.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid ** 2)) / ss_tot if ss_tot > 0 else math.nan
    split: dict[str, float] = {}
    if d is not None:
        (d0, d1), *_ = np.linalg.lstsq(design, d, rcond=None)
        (v0, v1), *_ = np.linalg.lstsq(design, c - d, rcond=None)
        split = {"draft_fixed_ms": float(d0), "draft_per_token_ms": float(d1),
                 "verify_fixed_ms": float(v0), "verify_per_token_ms": float(v1)}
    return CycleModel(fixed_ms=float(fixed), per_draft_ms=float(per), ks=tuple(k.tolist()),
                      cycle_ms_measured=tuple(c.tolist()), residuals_ms=tuple(resid.tolist()), r2=r2, **split)


def prediction_errors(model: CycleModel, arms: pd.DataFrame) -> pd.DataFrame:
    """Compare the model's throughput with measured arms.

    ``arms`` needs columns k, alpha, tok_s (measured). Returns a copy with predicted_tok_s
    (= model.throughput(alpha, k)) and rel_error = (predicted - measured) / measured.
    Summarise with ``out.rel_error.abs().median()`` and ``.max()``.
    """
    missing = {"k", "alpha", "tok_s"} - set(arms.columns)
    if missing:
        raise ConfigError(f"arms lacks column(s) {sorted(missing)}: it needs k, alpha, tok_s")
    out = arms.copy()
    ks = out["k"].to_numpy(float)
    if not np.all(np.mod(ks, 1.0) == 0):
        raise ConfigError("arms column k must hold whole numbers of drafted tokens per cycle")
    out["predicted_tok_s"] = [model.throughput(float(a), int(k))
                              for a, k in zip(out["alpha"], ks, strict=True)]
    out["rel_error"] = (out["predicted_tok_s"] - out["tok_s"]) / out["tok_s"]
    return out
