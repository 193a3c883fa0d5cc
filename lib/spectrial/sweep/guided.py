"""The guided search: probes, then measure only what the fitted model says could matter.

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
    stop    nothing left to measure ("confirmed"), every setting measured, or the budget (restarts, seconds:
            the sweep is then `partial`, and names each setting it skipped with its predicted tok/s and range)

e, the model's error: the larger of the median |relative error| of leave-one-setting-out predictions (refit
without the setting, predict it; once three exist) and the median |in-sample error| of the shared model
without the per-scenario offsets (how far the scenarios sit from one cycle model); at least margin_floor; per
setting, at least its scenario's |offset - 1| (`setting_error`).
w, the noise: the median relative half-width below tok/s of the measured settings' CIs at that level.
The ratio is the issue's yardstick ("within the grid-best's CI") turned round: a setting whose measurement,
even at the top of its predicted range, would hold the best measured tok/s inside its CI cannot change the
answer beyond the noise, so it is not worth a restart.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import TYPE_CHECKING, Any

from spectrial.analysis import fit_cycle_model
from spectrial.sweep.model import AcceptanceCurve, SweepModel, fit_sweep_model, relative_errors
from spectrial.sweep.params import Setting, SweepParams

if TYPE_CHECKING:
    from spectrial.sweep.run import Sweep

Group = tuple[float | None, int]  # (scenario, topk): one acceptance curve


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


def cycle_probe(sw: Sweep, model: SweepModel) -> tuple[Setting, str] | None:
    """A setting of a k not measured yet, for the cycle model, in the group with the lowest acceptance
    (measured, else its synthetic rate): the one a provisional cycle model predicts best, the line through
    the baseline's time per token (k = 0) and the measured settings' cycles. A speculative cycle costs at
    least the baseline's step, so that line is too steep if anything: its best lies at or below the true
    best, far enough from the deepest probe to pin the slope."""
    ks = {s.k for s in sw.settings if sw.tried(s)}
    ranked = []
    for g, settings in acceptance_groups(sw.sweep).items():
        curve = model.acceptance.get(g)
        if curve is None and prior_alpha(g) is not None:
            curve = AcceptanceCurve(alpha=prior_alpha(g) or 0.0, source="prior: the synthetic rate")
        free = [s for s in settings if s.k not in ks and not sw.tried(s)]
        if curve is not None and free:
            ranked.append((curve.accept_len(1) - 1.0, g, curve, free))
    if not ranked:
        return None
    p1, g, curve, free = min(ranked, key=lambda t: t[0])
    prov = SweepModel(acceptance={g: curve})
    for c in sw.levels:
        base = sw.point(sw.arms[sw.baselines.get(sw.fp_key, "baseline")], c).figures.get("cycle_ms")
        rows = [(p["k"], p["cycle_ms"]) for p in sw.model_points() if p["concurrency"] == c]
        if base and rows:
            prov.cycle[c] = fit_cycle_model([(0, base), *rows])
    s, v = _best_of(prov, free, sw.levels) or (free[0], [])
    return s, (f"a second k for the cycle-cost model, in the group of lowest acceptance (first-position rate "
               f"{p1:.2f}): predicted best by the line through the baseline's time per token and the measured "
               "cycles" + (f" ({', '.join(f'{x:.1f}' for x in v)} tok/s at concurrency {sw.levels})" if v else ""))


def _best_of(model: SweepModel, settings: list[Setting], levels: list[int]
             ) -> tuple[Setting, list[float]] | None:
    """The setting closest to the predicted best at every level (largest worst ratio to each level's best)."""
    scored = []
    for s in settings:
        preds = [model.predict(s.steps, s.topk, s.k, s.synthetic_accept, c) for c in levels]
        if all(p is not None for p in preds):
            scored.append((s, [p["tok_s"] for p in preds if p is not None]))
    if not scored:
        return None
    tops = [max(v[i] for _, v in scored) for i in range(len(levels))]
    return max(scored, key=lambda t: (min(x / top for x, top in zip(t[1], tops, strict=True)), t[0].k))


def probe_reason(s: Setting) -> str:
    """Why a first probe is informative, in words."""
    sc = "real acceptance" if s.synthetic_accept is None else f"synthetic acceptance {s.synthetic_accept:g}"
    return (f"depth {s.steps} (k={s.k}) under {sc}: a cycle-cost point and the acceptance curve "
            f"(per-position rates where the engine reports them)")


def next_probe(sw: Sweep, model: SweepModel) -> tuple[Setting, str] | None:
    """The predicted-best setting of the first group with no measured setting, its acceptance taken as its
    synthetic rate a (per-position a^i); None when every group has a measurement."""
    for g, settings in acceptance_groups(sw.sweep).items():
        if any(sw.tried(s) for s in settings):
            continue
        a = prior_alpha(g)
        if a is None:
            return settings[-1], "deepest setting of an acceptance group with no measurement yet"
        prior = SweepModel(cycle=model.cycle, calibration=model.calibration,
                           acceptance={g: AcceptanceCurve(alpha=a, source="prior: the synthetic rate")})
        found = _best_of(prior, settings, sw.levels)
        if found is None:
            return settings[-1], "deepest setting (the cycle model cannot predict this group)"
        s, v = found
        return s, (f"acceptance probe of synthetic rate {a:g}: predicted best with per-position rates a^i "
                   f"and the shared cycle model ({', '.join(f'{x:.1f}' for x in v)} tok/s at concurrency "
                   f"{sw.levels})")
    return None


def run_guided(sw: Sweep) -> None:
    """Baseline and probes, then fit, predict and measure what could beat the best, until nothing can."""
    sw.baselines[sw.fp_key] = "baseline"
    probes = probe_settings(sw.sweep)
    for s in probes:
        sw.decisions.append({"phase": "probe", "setting": sw.sweep.arm(s).name,
                             "reason": "informative setting: " + probe_reason(s)})
    if not sw.measure([sw.arms["baseline"], *(sw.sweep.arm(s) for s in probes)], "probe"):
        return
    while True:
        model = fit_sweep_model(sw.model_points())
        todo = [s for s in sw.settings if not sw.tried(s)]
        if not todo:
            sw.stopped_by = "every setting measured"
            return
        probe = cycle_probe(sw, model) if not model.cycle else next_probe(sw, model)
        if probe is None and not model.cycle:
            probe = todo[len(todo) // 2], "no cycle model yet (needs two distinct k measured): another setting"
        if probe is not None:
            sw.decisions.append({"phase": "probe", "setting": sw.sweep.arm(probe[0]).name, "reason": probe[1],
                                 "model": model.as_dict()})
            if not sw.measure([sw.sweep.arm(probe[0])], "probe"):
                return
            continue
        cands = candidates(sw, model, todo)
        if not cands:
            sw.stopped_by = ("confirmed: no unmeasured setting, even at the top of its predicted range, would "
                             "leave the best measured one outside its CI")
            return
        score, s, why, preds = cands[0]
        sw.decisions.append({"phase": "confirm", "setting": sw.sweep.arm(s).name, "reason": why,
                             "score": score, "model": model.as_dict()})
        for c, pred in preds.items():
            sw.point(sw.sweep.arm(s), c).prediction = pred
        if not sw.measure([sw.sweep.arm(s)], "confirm"):
            return


def _key(p: dict[str, Any]) -> tuple[Any, ...]:
    return p["steps"], p["topk"], p["k"], p["scenario"]


def cv_errors(points: list[dict[str, Any]]) -> list[float]:
    """Leave-one-setting-out relative errors: each measured setting predicted by the model fitted without it
    (every concurrency level of the setting left out together); settings the rest cannot predict are skipped."""
    out = []
    for key in dict.fromkeys(map(_key, points)):
        rest = [p for p in points if _key(p) != key]
        if rest:
            out += relative_errors(fit_sweep_model(rest), [p for p in points if _key(p) == key])
    return out


def margin(sw: Sweep, model: SweepModel) -> float:
    """The model's relative error e: the larger of the median |leave-one-setting-out error| (once three exist)
    and the median |in-sample error| of the shared model without the per-scenario offsets (how far scenarios
    sit from one shared cycle model: where they need large offsets, its slope is doubtful too); at least
    margin_floor."""
    pts = sw.model_points()
    cv = [abs(e) for e in cv_errors(pts)]
    shared = [abs(e) for e in relative_errors(dataclasses.replace(model, offsets={}), pts)]
    return max(sw.sweep.margin_floor, statistics.median(cv) if len(cv) >= 3 else 0.0,
               statistics.median(shared) if shared else 0.0)


def setting_error(model: SweepModel, e: float, s: Setting, c: int) -> float:
    """The error assumed for one prediction: e, or the setting's scenario offset from the shared model where
    larger (a scenario the shared cycle model misses by x % in level is not trusted closer than x % in shape)."""
    return max(e, abs(model.offsets.get((s.synthetic_accept, s.topk, c), 1.0) - 1.0))


def noise(sw: Sweep, c: int) -> float:
    """w: the median relative half-width below tok/s of the measured settings' CIs at concurrency c."""
    widths = [(pt.figures.tok_s - pt.figures.tok_s_ci_low) / pt.figures.tok_s
              for pt in sw.points.values() if pt.setting is not None and pt.concurrency == c and pt.measured
              and pt.figures.get("tok_s_ci_low") is not None]
    return min(0.5, max(0.0, statistics.median(widths))) if widths else 0.0


def candidates(sw: Sweep, model: SweepModel, todo: list[Setting]
               ) -> list[tuple[float, Setting, str, dict[int, dict[str, Any]]]]:
    """What to measure next, first first: unmeasured settings whose prediction at the top of the model's error,
    pred x (1 + e), would once measured have a CI lower bound (x (1 - w)) above the best measured tok/s at some
    level (largest ratio first); when there is none, the model's predicted best (over every setting, measured
    or not) of a scenario and level where that is unmeasured."""
    e = margin(sw, model)
    w = {c: noise(sw, c) for c in sw.levels}
    out, preds = [], {}
    for s in todo:
        preds[s] = {c: {**p, "margin": setting_error(model, e, s, c), "noise": w[c],
                        "made_after_starts": sw.n_starts}
                    for c in sw.levels if (p := model.predict(s.steps, s.topk, s.k, s.synthetic_accept, c))}
        best_ratio, why = 0.0, ""
        for c, pred in preds[s].items():
            best = sw.best_measured(s.synthetic_accept, c)
            err = pred["margin"]
            top = pred["tok_s"] * (1 + err)
            ratio = float("inf") if best is None else top * (1 - w[c]) / best.figures.tok_s
            if ratio > best_ratio:
                best_ratio = ratio
                why = (f"predicted {pred['tok_s']:.1f} tok/s at concurrency {c} (accept len {pred['accept_len']:.2f}, "
                       f"cycle {pred['cycle_ms']:.2f} ms), up to {top:.1f} with the model error {err:.1%}; measured, "
                       f"its CI would reach down to ~{top * (1 - w[c]):.1f} (noise {w[c]:.1%}), above the best "
                       "measured there: " + (f"{best.arm.name} {best.figures.tok_s:.1f} tok/s" if best else "none"))
        if best_ratio > 1.0:
            out.append((best_ratio, s, why, preds[s]))
    if out:
        return sorted(out, key=lambda t: -t[0])
    for sc in sw.sweep.scenarios():
        for c in sw.levels:
            best = sw.best_measured(sc, c)
            pred_all = [(p["tok_s"], s) for s in sw.settings if s.synthetic_accept == sc
                        and (p := model.predict(s.steps, s.topk, s.k, sc, c))]
            if best is None or not pred_all:
                continue
            v, s = max(pred_all, key=lambda t: t[0])
            if s in todo:
                out.append((v / best.figures.tok_s, s, (
                    f"the model's best at concurrency {c}: predicted {v:.1f} tok/s (best measured: "
                    f"{best.arm.name} {best.figures.tok_s:.1f}); within the noise, but the search does not "
                    "end before the setting the model, smoothing every measurement, calls best is measured"),
                    preds[s]))
    return sorted(out, key=lambda t: -t[0])
