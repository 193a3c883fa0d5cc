"""What a guided sweep predicts from the points it has measured.

Two fitted parts, combined per grid point (Leviathan et al.'s relations, `spectrial.analysis`):

    acceptance  tau(depth) = 1 + p_1 + ... + p_depth        (tokens committed per cycle)
                p_i = the measured per-position acceptance (unconditional: accepted at position i per verify
                step, llama.cpp `/metrics`), pooled over measured points; past the deepest measured position,
                p_i = alpha^i with alpha fitted to the p_i by least squares. Where the engine reports only the
                mean accept length, alpha is fitted to (depth, tau) pairs by least squares on
                expected_accept_len(alpha, depth) = (1 - alpha^(depth+1)) / (1 - alpha).
    cycle cost  cycle_ms(k) = fixed_ms + per_draft_ms * k    (spectrial.analysis.fit_cycle_model, per
                concurrency level; k = draft tokens verified per cycle besides the target's own)
    throughput  tok_s = tau(depth) / cycle_ms(k) * 1000 * calibration

`calibration` (per concurrency level) is the median ratio of the measured tok/s (median over requests of
the server's per-request rate) to tau / cycle_ms of the same points: the two throughputs differ a little
(per-request medians vs window totals), and the ratio carries that over to unmeasured points.
One acceptance curve per (scenario, topk): a scenario is a synthetic rate, or the draft's real acceptance.
One cycle model serves every scenario (the cost of a cycle follows k, not the acceptance), so a scenario
needs one measured setting for its curve. What the shared model does not carry about a scenario (its cycles
run a little longer when more tokens are accepted: KV writes, sampling) is its `offset` per (scenario, topk,
level): the median ratio of its measured tok/s to the model's, which anchors the scenario's predictions on
its own measurements (1 where it has none).

How far to trust it: `model_error` (e, the larger of the leave-one-setting-out and the shared-model in-sample
errors), `setting_error` (e or a scenario's offset) and `noise` (w, the measured CIs' width), read by the guided
search (`spectrial.sweep.guided`) and by the sweep's summary alike.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from spectrial.analysis import CycleModel, fit_cycle_model
from spectrial.errors import ConfigError
from spectrial.schema import AcceptanceFit, CycleFit, OffsetFit, Prediction, SweepModelRecord

_ALPHAS = np.linspace(0.0, 1.0, 10001)


@dataclass(frozen=True)
class AcceptanceCurve:
    """Tokens committed per cycle as a function of draft depth, for one scenario and top-k."""

    alpha: float
    per_position: tuple[float, ...] = ()
    source: str = ""
    points: tuple[tuple[int, float], ...] = ()

    def accept_len(self, depth: int) -> float:
        """tau(depth): measured per-position rates up to their depth, alpha^i beyond."""
        if depth < 1:
            raise ConfigError(f"depth must be >= 1, got {depth}")
        known = self.per_position[:depth]
        tail = sum(self.alpha ** i for i in range(len(known) + 1, depth + 1))
        return 1.0 + float(sum(known)) + tail

    def record(self, scenario: float | None, topk: int) -> AcceptanceFit:
        return AcceptanceFit(scenario=scenario, topk=topk, alpha=self.alpha, per_position=list(self.per_position),
                             source=self.source, points=list(self.points))


@dataclass(frozen=True)
class MeasuredPoint:
    """A measured speculative grid point as the model and the search read it: its setting (steps, topk, k, scenario:
    the synthetic rate or None), its concurrency level and figures (None where not measured)."""

    steps: int
    topk: int
    k: int
    scenario: float | None
    concurrency: int
    tok_s: float | None
    accept_len: float | None = None
    cycle_ms: float | None = None
    draft_ms_per_cycle: float | None = None
    per_position: tuple[float, ...] | None = None
    verify_steps: float | None = None
    tok_s_ci_low: float | None = None
    name: str = ""  # the setting's arm name

    @property
    def setting_key(self) -> tuple[int, int, int, float | None]:
        return self.steps, self.topk, self.k, self.scenario


def fit_alpha_per_position(rates: list[float], weights: list[float] | None = None) -> float:
    """alpha minimising sum_i w_i (p_i - alpha^i)^2 over positions i = 1.. (grid search, 1e-4 steps)."""
    if not rates:
        raise ConfigError("per-position rates are empty: measure a speculative point first")
    p = np.asarray(rates, float)
    w = np.asarray(weights if weights is not None else np.ones_like(p), float)
    i = np.arange(1, p.size + 1)
    err = ((_ALPHAS[:, None] ** i[None, :] - p[None, :]) ** 2 * w[None, :]).sum(axis=1)
    return float(_ALPHAS[int(np.argmin(err))])


def fit_alpha_accept_len(points: Iterable[tuple[int, float]]) -> float:
    """alpha minimising sum_j (tau_j - expected_accept_len(alpha, depth_j))^2 (grid search, 1e-4 steps)."""
    pts = [(int(d), float(t)) for d, t in points]
    if not pts:
        raise ConfigError("no (depth, accept length) points: measure a speculative point first")
    err = np.zeros_like(_ALPHAS)
    for d, tau in pts:
        a = _ALPHAS
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.where(a < 1.0, (1.0 - a ** (d + 1)) / (1.0 - a), d + 1.0)
        err += (e - min(max(tau, 1.0), d + 1.0)) ** 2
    return float(_ALPHAS[int(np.argmin(err))])


def fit_acceptance(points: Sequence[MeasuredPoint]) -> AcceptanceCurve | None:
    """The acceptance curve of measured points of one scenario/top-k (depth: a point's steps).

    Per-position rates are pooled position by position, weighted by verify steps; without them, alpha comes from
    accept lengths.
    """
    ok = [p for p in points if p.accept_len]
    if not ok:
        return None
    pairs = tuple((int(p.steps), float(p.accept_len or 0.0)) for p in ok)
    with_pos = [(p.per_position, p.verify_steps) for p in ok if p.per_position and p.verify_steps]
    if with_pos:
        n = max(len(pos) for pos, _ in with_pos)
        rates, weights = [], []
        for i in range(n):
            rows = [(pos[i], v) for pos, v in with_pos if len(pos) > i]
            w = sum(v for _, v in rows)
            rates.append(sum(r * v for r, v in rows) / w)
            weights.append(w)
        return AcceptanceCurve(alpha=fit_alpha_per_position(rates, weights), per_position=tuple(rates),
                               source="per-position acceptance (/metrics)", points=pairs)
    return AcceptanceCurve(alpha=fit_alpha_accept_len(pairs), source="mean accept length per depth", points=pairs)


@dataclass
class SweepModel:
    """Cycle models per concurrency level, acceptance curves per (scenario, topk), calibration factors per
    level, offsets per (scenario, topk, level)."""

    cycle: dict[int, CycleModel] = field(default_factory=dict)
    acceptance: dict[tuple[float | None, int], AcceptanceCurve] = field(default_factory=dict)
    calibration: dict[int, float] = field(default_factory=dict)
    offsets: dict[tuple[float | None, int, int], float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def predict(self, steps: int, topk: int, k: int, scenario: float | None, concurrency: int
                ) -> Prediction | None:
        """Predicted accept_len, cycle_ms and tok_s of one grid point (None where a part is not fitted)."""
        curve = self.acceptance.get((scenario, topk))
        cyc = self.cycle.get(concurrency)
        if curve is None or cyc is None:
            return None
        tau = min(curve.accept_len(steps), k + 1.0)
        try:
            cycle_ms = cyc.cycle_ms(k)
        except ConfigError:
            return None
        tok_s = tau / cycle_ms * 1000.0 * self.calibration.get(concurrency, 1.0) \
            * self.offsets.get((scenario, topk, concurrency), 1.0)
        return Prediction(accept_len=tau, cycle_ms=cycle_ms, tok_s=tok_s)

    def record(self) -> SweepModelRecord:
        """The model as a record (its fits; the manifest's copy adds the error and noise: `Sweep.summarise`)."""
        return SweepModelRecord(
            cycle={c: CycleFit(fixed_ms=m.fixed_ms, per_draft_ms=m.per_draft_ms, r2=m.r2, ks=list(m.ks),
                               cycle_ms_measured=list(m.cycle_ms_measured), draft_fixed_ms=m.draft_fixed_ms,
                               draft_per_token_ms=m.draft_per_token_ms) for c, m in sorted(self.cycle.items())},
            acceptance=[c.record(s, t) for (s, t), c in self.acceptance.items()],
            calibration=dict(sorted(self.calibration.items())),
            offsets=[OffsetFit(scenario=s, topk=t, concurrency=c, offset=v) for (s, t, c), v in self.offsets.items()],
            notes=list(self.notes))


def fit_sweep_model(points: Sequence[MeasuredPoint]) -> SweepModel:
    """Fit the model on measured speculative points. Cycle models need two distinct k at a concurrency level;
    acceptance pools every concurrency level of a (scenario, topk)."""
    model = SweepModel()
    ok = [p for p in points if p.tok_s and p.cycle_ms and p.accept_len]
    for c in sorted({p.concurrency for p in ok}):
        mine = [p for p in ok if p.concurrency == c]
        if len({p.k for p in mine}) < 2:
            model.notes.append(f"concurrency {c}: one k measured so far, no cycle model yet")
            continue
        split = all(p.draft_ms_per_cycle is not None and 0 <= p.draft_ms_per_cycle <= (p.cycle_ms or 0.0)
                    for p in mine)
        rows = [(p.k, p.cycle_ms or 0.0, p.draft_ms_per_cycle or 0.0) if split else (p.k, p.cycle_ms or 0.0)
                for p in mine]
        model.cycle[c] = fit_cycle_model(rows)
        model.calibration[c] = statistics.median((p.tok_s or 0.0) / ((p.accept_len or 0.0) / (p.cycle_ms or 1.0)
                                                                     * 1000.0) for p in mine)
    for key in sorted({(p.scenario, p.topk) for p in ok}, key=lambda t: (t[0] is None, t[0] or 0, t[1])):
        curve = fit_acceptance([p for p in ok if (p.scenario, p.topk) == key])
        if curve is not None:
            model.acceptance[key] = curve
    offsets: dict[tuple[float | None, int, int], list[float]] = {}
    for p in ok:
        pred = model.predict(p.steps, p.topk, p.k, p.scenario, p.concurrency)
        if pred is not None:
            offsets.setdefault((p.scenario, p.topk, p.concurrency), []).append((p.tok_s or 0.0) / pred.tok_s)
    model.offsets = {g: statistics.median(v) for g, v in offsets.items()}
    return model


def relative_errors(model: SweepModel, points: Sequence[MeasuredPoint]) -> list[float]:
    """(predicted - measured) / measured tok/s of measured points the model can predict."""
    out = []
    for p in points:
        if not p.tok_s:
            continue
        pred = model.predict(p.steps, p.topk, p.k, p.scenario, p.concurrency)
        if pred is not None and math.isfinite(pred.tok_s):
            out.append(pred.tok_s / p.tok_s - 1.0)
    return out


# --- how far to trust it ---------------------------------------------------------------------------------
def cv_errors(points: Sequence[MeasuredPoint]) -> list[float]:
    """Leave-one-setting-out relative errors: each measured setting predicted by the model fitted without it
    (every concurrency level of the setting left out together); settings the rest cannot predict are skipped."""
    out = []
    for key in dict.fromkeys(p.setting_key for p in points):
        rest = [p for p in points if p.setting_key != key]
        if rest:
            out += relative_errors(fit_sweep_model(rest), [p for p in points if p.setting_key == key])
    return out


def model_error(model: SweepModel, points: Sequence[MeasuredPoint], floor: float) -> float:
    """The model's relative error e: the larger of the median |leave-one-setting-out error| (once three exist)
    and the median |in-sample error| of the shared model without the per-scenario offsets (how far scenarios
    sit from one shared cycle model: where they need large offsets, its slope is doubtful too); at least
    `floor` (the sweep's margin_floor)."""
    cv = [abs(e) for e in cv_errors(points)]
    shared = [abs(e) for e in relative_errors(dataclasses.replace(model, offsets={}), points)]
    return max(floor, statistics.median(cv) if len(cv) >= 3 else 0.0,
               statistics.median(shared) if shared else 0.0)


def setting_error(model: SweepModel, e: float, scenario: float | None, topk: int, c: int) -> float:
    """The error assumed for one prediction: e, or the setting's scenario offset from the shared model where
    larger (a scenario the shared cycle model misses by x % in level is not trusted closer than x % in shape)."""
    return max(e, abs(model.offsets.get((scenario, topk, c), 1.0) - 1.0))


def noise(points: Sequence[MeasuredPoint], c: int) -> float:
    """w: the median relative half-width below tok/s of the measured points' CIs at concurrency c."""
    widths = [(p.tok_s - p.tok_s_ci_low) / p.tok_s for p in points
              if p.concurrency == c and p.tok_s and p.tok_s_ci_low is not None]
    return min(0.5, max(0.0, statistics.median(widths))) if widths else 0.0


__all__ = ["AcceptanceCurve", "MeasuredPoint", "SweepModel", "cv_errors", "fit_acceptance", "fit_alpha_accept_len",
           "fit_alpha_per_position", "fit_sweep_model", "model_error", "noise", "relative_errors", "setting_error"]
