"""The guided search: probes, then measure only what the fitted model says could matter.

`decide(view)` is the whole strategy, a pure function: from a read-only `SweepView` of the sweep (its params,
the points measured so far, the settings tried, the fitted model) it returns the next thing to do, `Measure`
(settings, phase, why) or `Stop` (why). It writes nothing; the loop (`spectrial.sweep.run.Sweep.run_guided`)
records each decision, attaches the predictions, runs the starts and keeps the budget.

One cycle-cost model serves every acceptance scenario (a cycle drafts k tokens and verifies k + 1: its cost
follows k, not the acceptance), so each scenario needs one measured setting for its acceptance curve, and the
probes are chosen to be likely winners as well as informative:

    probes  (1) the deepest setting of each acceptance group (scenario, top-k) of unknown acceptance (the real
                draft, trees): its per-position rates give the whole curve; with none, the deepest setting of
                the highest synthetic rate
            (2) a second k for the cycle model (`cycle_probe`): in the group of lowest acceptance, the setting
                that the line through the baseline's time per token and the measured cycles predicts best
            (3) each group still unmeasured, a synthetic rate a (per-position rates a^i by construction): the
                setting the shared cycle model predicts best with a^i as its acceptance (`next_probe`)
    loop    fit (spectrial.sweep.model) -> measure the unmeasured setting with the largest
            pred x (1 + e) x (1 - w) / best above 1 at some concurrency level; when there is none, the model's
            predicted best (over every setting, measured or not) of a scenario and level if it is unmeasured
            -> refit
    stop    nothing left to measure ("confirmed") or every setting measured; the budget (restarts, seconds) is
            the loop's, checked before each server start (the sweep is then `partial`, and names each setting it
            skipped with its predicted tok/s and range)

e, the model's error: the larger of the median |relative error| of leave-one-setting-out predictions (refit
without the setting, predict it; once three exist) and the median |in-sample error| of the shared model
without the per-scenario offsets (how far the scenarios sit from one cycle model); at least margin_floor; per
setting, at least its scenario's |offset - 1| (`spectrial.sweep.model.model_error`, `setting_error`).
w, the noise: the median relative half-width below tok/s of the measured settings' CIs at that level (`noise`).
The ratio is the issue's yardstick ("within the grid-best's CI") turned round: a setting whose measurement,
even at the top of its predicted range, would hold the best measured tok/s inside its CI cannot change the
answer beyond the noise, so it is not worth a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from spectrial.analysis import fit_cycle_model
from spectrial.schema import Prediction
from spectrial.sweep.model import (
    AcceptanceCurve,
    MeasuredPoint,
    SweepModel,
    model_error,
    noise,
    setting_error,
)
from spectrial.sweep.params import Setting, SweepParams

Group = tuple[float | None, int]  # (scenario, topk): one acceptance curve


@dataclass(frozen=True)
class SweepView:
    """What the guided search reads of a sweep (built by the loop: `Sweep.view`; never changed by the search)."""

    sweep: SweepParams
    settings: tuple[Setting, ...]  # the grid, in grid order
    levels: tuple[int, ...]  # concurrency levels
    measured: tuple[MeasuredPoint, ...]  # speculative points with a measured tok/s, in grid order
    tried: frozenset[Setting]  # settings started (measured, failed or unavailable)
    baseline_cycle_ms: dict[int, float]  # the current host's baseline: time per token (ms) per level
    n_starts: int  # server starts so far
    model: SweepModel  # fitted on `measured`

    def best_measured(self, scenario: float | None, c: int) -> MeasuredPoint | None:
        """The fastest measured setting of a scenario at concurrency c."""
        pts = [p for p in self.measured if p.scenario == scenario and p.concurrency == c]
        return max(pts, key=lambda p: p.tok_s or 0.0) if pts else None


@dataclass(frozen=True)
class Pick:
    """One setting to measure and why."""

    setting: Setting
    reason: str


@dataclass(frozen=True)
class Measure:
    """Measure these settings next, in one schedule (with restarts > 1 their starts interleave). A probe informs the
    model; a confirmation could beat the best measured setting: its `score` (the ratio that chose it) and, per
    concurrency level, the `predictions` it was chosen by. `model`: the model it was decided with (None for the
    first probes, chosen before any measurement)."""

    phase: Literal["probe", "confirm"]
    picks: tuple[Pick, ...]
    model: SweepModel | None = None
    score: float | None = None
    predictions: dict[int, Prediction] = field(default_factory=dict)


@dataclass(frozen=True)
class Stop:
    """Nothing left to measure, and why."""

    reason: str


CONFIRMED = ("confirmed: no unmeasured setting, even at the top of its predicted range, would leave the best "
             "measured one outside its CI")


def decide(view: SweepView) -> Measure | Stop:
    """The next step of the guided search: the first probes (before any measurement), a probe the model still
    needs (a second k for the cycle model, a group's acceptance), the setting that could beat the best measured
    one beyond the noise (`candidates`), or a stop."""
    if not view.tried:
        return Measure("probe", tuple(Pick(s, "informative setting: " + probe_reason(s))
                                      for s in probe_settings(view.sweep)))
    model = view.model
    todo = [s for s in view.settings if s not in view.tried]
    if not todo:
        return Stop("every setting measured")
    probe = cycle_probe(view) if not model.cycle else next_probe(view)
    if probe is None and not model.cycle:
        probe = todo[len(todo) // 2], "no cycle model yet (needs two distinct k measured): another setting"
    if probe is not None:
        return Measure("probe", (Pick(*probe),), model=model)
    cands = candidates(view, todo)
    if not cands:
        return Stop(CONFIRMED)
    score, s, why, preds = cands[0]
    return Measure("confirm", (Pick(s, why),), model=model, score=score, predictions=preds)


def acceptance_groups(sweep: SweepParams) -> dict[Group, list[Setting]]:
    """Settings per acceptance group (scenario, top-k), shallowest first."""
    out: dict[Group, list[Setting]] = {}
    for s in sweep.settings():
        out.setdefault((s.synthetic_accept, s.topk), []).append(s)
    return {g: sorted(v, key=lambda s: (s.k, s.steps)) for g, v in out.items()}


def prior_alpha(group: Group) -> float | None:
    """The acceptance known before measuring: a synthetic rate a sets per-position rates a^i (chains only)."""
    scenario, topk = group
    return scenario if scenario is not None and topk == 1 else None


def probe_settings(sweep: SweepParams) -> list[Setting]:
    """The first probes, chosen before any measurement: the deepest setting of each group of unknown
    acceptance (the real draft, trees), whose per-position rates give the whole curve; with none, the deepest
    of the highest synthetic rate. The second k follows from what they measured (`cycle_probe`)."""
    groups = acceptance_groups(sweep)
    unknown = [groups[g][-1] for g in groups if prior_alpha(g) is None]
    return unknown or [groups[max(groups, key=lambda g: prior_alpha(g) or 0.0)][-1]]


def cycle_probe(view: SweepView) -> tuple[Setting, str] | None:
    """A setting of a k not measured yet, for the cycle model, in the group with the lowest acceptance
    (measured, else its synthetic rate): the one a provisional cycle model predicts best, the line through
    the baseline's time per token (k = 0) and the measured settings' cycles. A speculative cycle costs at
    least the baseline's step, so that line is too steep if anything: its best lies at or below the true
    best, far enough from the deepest probe to pin the slope."""
    ks = {s.k for s in view.settings if s in view.tried}
    ranked = []
    for g, settings in acceptance_groups(view.sweep).items():
        curve = view.model.acceptance.get(g)
        if curve is None and prior_alpha(g) is not None:
            curve = AcceptanceCurve(alpha=prior_alpha(g) or 0.0, source="prior: the synthetic rate")
        free = [s for s in settings if s.k not in ks and s not in view.tried]
        if curve is not None and free:
            ranked.append((curve.accept_len(1) - 1.0, g, curve, free))
    if not ranked:
        return None
    p1, g, curve, free = min(ranked, key=lambda t: t[0])
    prov = SweepModel(acceptance={g: curve})
    for c in view.levels:
        base = view.baseline_cycle_ms.get(c)
        rows = [(p.k, p.cycle_ms) for p in view.measured if p.concurrency == c and p.cycle_ms is not None]
        if base and rows:
            prov.cycle[c] = fit_cycle_model([(0, base), *rows])
    s, v = _best_of(prov, free, view.levels) or (free[0], [])
    return s, (f"a second k for the cycle-cost model, in the group of lowest acceptance (first-position rate "
               f"{p1:.2f}): predicted best by the line through the baseline's time per token and the measured "
               "cycles" + (f" ({', '.join(f'{x:.1f}' for x in v)} tok/s at concurrency {list(view.levels)})"
                           if v else ""))


def _best_of(model: SweepModel, settings: list[Setting], levels: tuple[int, ...]
             ) -> tuple[Setting, list[float]] | None:
    """The setting closest to the predicted best at every level (largest worst ratio to each level's best)."""
    scored = []
    for s in settings:
        preds = [model.predict(s.steps, s.topk, s.k, s.synthetic_accept, c) for c in levels]
        if all(p is not None for p in preds):
            scored.append((s, [p.tok_s for p in preds if p is not None]))
    if not scored:
        return None
    tops = [max(v[i] for _, v in scored) for i in range(len(levels))]
    return max(scored, key=lambda t: (min(x / top for x, top in zip(t[1], tops, strict=True)), t[0].k))


def probe_reason(s: Setting) -> str:
    """Why a first probe is informative, in words."""
    sc = "real acceptance" if s.synthetic_accept is None else f"synthetic acceptance {s.synthetic_accept:g}"
    return (f"depth {s.steps} (k={s.k}) under {sc}: a cycle-cost point and the acceptance curve "
            f"(per-position rates where the engine reports them)")


def next_probe(view: SweepView) -> tuple[Setting, str] | None:
    """The predicted-best setting of the first group with no measured setting, its acceptance taken as its
    synthetic rate a (per-position a^i); None when every group has a measurement."""
    for g, settings in acceptance_groups(view.sweep).items():
        if any(s in view.tried for s in settings):
            continue
        a = prior_alpha(g)
        if a is None:
            return settings[-1], "deepest setting of an acceptance group with no measurement yet"
        prior = SweepModel(cycle=view.model.cycle, calibration=view.model.calibration,
                           acceptance={g: AcceptanceCurve(alpha=a, source="prior: the synthetic rate")})
        found = _best_of(prior, settings, view.levels)
        if found is None:
            return settings[-1], "deepest setting (the cycle model cannot predict this group)"
        s, v = found
        return s, (f"acceptance probe of synthetic rate {a:g}: predicted best with per-position rates a^i "
                   f"and the shared cycle model ({', '.join(f'{x:.1f}' for x in v)} tok/s at concurrency "
                   f"{list(view.levels)})")
    return None


def candidates(view: SweepView, todo: list[Setting]
               ) -> list[tuple[float, Setting, str, dict[int, Prediction]]]:
    """What to measure next, first first: unmeasured settings whose prediction at the top of the model's error,
    pred x (1 + e), would once measured have a CI lower bound (x (1 - w)) above the best measured tok/s at some
    level (largest ratio first); when there is none, the model's predicted best (over every setting, measured
    or not) of a scenario and level where that is unmeasured."""
    model = view.model
    e = model_error(model, view.measured, view.sweep.margin_floor)
    w = {c: noise(view.measured, c) for c in view.levels}
    out, preds = [], {}
    for s in todo:
        preds[s] = {c: p.model_copy(update={"margin": setting_error(model, e, s.synthetic_accept, s.topk, c),
                                            "noise": w[c], "made_after_starts": view.n_starts})
                    for c in view.levels if (p := model.predict(s.steps, s.topk, s.k, s.synthetic_accept, c))}
        best_ratio, why = 0.0, ""
        for c, pred in preds[s].items():
            best = view.best_measured(s.synthetic_accept, c)
            err = pred.margin or 0.0
            top = pred.tok_s * (1 + err)
            ratio = float("inf") if best is None else top * (1 - w[c]) / (best.tok_s or 1.0)
            if ratio > best_ratio:
                best_ratio = ratio
                why = (f"predicted {pred.tok_s:.1f} tok/s at concurrency {c} (accept len {pred.accept_len:.2f}, "
                       f"cycle {pred.cycle_ms:.2f} ms), up to {top:.1f} with the model error {err:.1%}; measured, "
                       f"its CI would reach down to ~{top * (1 - w[c]):.1f} (noise {w[c]:.1%}), above the best "
                       "measured there: " + (f"{best.name} {best.tok_s:.1f} tok/s" if best else "none"))
        if best_ratio > 1.0:
            out.append((best_ratio, s, why, preds[s]))
    if out:
        return sorted(out, key=lambda t: -t[0])
    for sc in view.sweep.scenarios():
        for c in view.levels:
            best = view.best_measured(sc, c)
            pred_all = [(p.tok_s, s) for s in view.settings if s.synthetic_accept == sc
                        and (p := model.predict(s.steps, s.topk, s.k, sc, c))]
            if best is None or not pred_all:
                continue
            v, s = max(pred_all, key=lambda t: t[0])
            if s in todo:
                out.append((v / (best.tok_s or 1.0), s, (
                    f"the model's best at concurrency {c}: predicted {v:.1f} tok/s (best measured: "
                    f"{best.name} {best.tok_s:.1f}); within the noise, but the search does not "
                    "end before the setting the model, smoothing every measurement, calls best is measured"),
                    preds[s]))
    return sorted(out, key=lambda t: -t[0])


__all__ = ["CONFIRMED", "Measure", "Pick", "Stop", "SweepView", "candidates", "decide", "probe_settings"]
