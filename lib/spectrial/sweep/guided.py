"""The guided search: probes, then measure only what the fitted model says could beat the best so far.

    probes  the deepest setting of the first acceptance scenario, the shallowest of the second (of the first
            when there is one), the middle one of each further scenario, per top-k: two distinct k for the
            cycle-cost model and an acceptance curve for every scenario
    loop    fit (spectrial.sweep.model) -> for each unmeasured setting and concurrency level, the prediction
            x (1 + margin) against the upper CI bound of the best measured setting there -> measure the
            setting with the largest such ratio above 1 (its predictions are recorded on its points) -> refit
    stop    no ratio above 1 ("confirmed": nothing could beat the best beyond its noise), every setting
            measured, or the budget (restarts, seconds) ends
margin = the median |relative in-sample error| of the model on the measured points, at least margin_floor.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any

from spectrial.sweep.model import SweepModel, fit_sweep_model, relative_errors
from spectrial.sweep.params import Setting, SweepParams

if TYPE_CHECKING:
    from spectrial.sweep.run import _Sweep


def probe_settings(sweep: SweepParams) -> list[Setting]:
    """Guided first measurements, per top-k: the deepest setting of the first scenario, the shallowest of the
    second (of the first when there is one scenario), the middle one of each further scenario.

    Together they give the cycle model two distinct k and every scenario an acceptance curve.
    """
    settings, scenarios = sweep.settings(), sweep.scenarios()
    out: list[Setting] = []
    for topk in sorted({s.topk for s in settings}):
        for i, sc in enumerate(scenarios):
            mine = sorted((s for s in settings if s.topk == topk and s.synthetic_accept == sc),
                          key=lambda s: (s.k, s.steps))
            if not mine:
                continue
            picks = [mine[-1]] if i == 0 else [mine[0]] if i == 1 else [mine[len(mine) // 2]]
            if len(scenarios) == 1:
                picks.append(mine[0])
            out += [s for s in picks if s not in out]
    return out


def probe_reason(s: Setting) -> str:
    """Why a probe is informative, in words."""
    sc = "real acceptance" if s.synthetic_accept is None else f"synthetic acceptance {s.synthetic_accept:g}"
    return (f"depth {s.steps} (k={s.k}) under {sc}: a cycle-cost point and the acceptance curve "
            f"(per-position rates where the engine reports them)")


def run_guided(sw: _Sweep) -> None:
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
        if not model.cycle:
            s = todo[len(todo) // 2]
            sw.decisions.append({"phase": "probe", "setting": sw.sweep.arm(s).name,
                                 "reason": "no cycle model yet (needs two distinct k measured): another "
                                           "informative setting"})
            if not sw.measure([sw.sweep.arm(s)], "probe"):
                return
            continue
        cands = candidates(sw, model, todo)
        if not cands:
            sw.stopped_by = ("confirmed: no unmeasured setting is predicted to beat the best measured one "
                             "beyond its CI, even with the model's error added")
            return
        score, s, why, preds = cands[0]
        sw.decisions.append({"phase": "confirm", "setting": sw.sweep.arm(s).name, "reason": why,
                             "score": score, "model": model.as_dict()})
        for c, pred in preds.items():
            sw.point(sw.sweep.arm(s), c).prediction = pred
        if not sw.measure([sw.sweep.arm(s)], "confirm"):
            return


def margin(sw: _Sweep, model: SweepModel) -> float:
    """The model's relative error: median |in-sample error| of the measured points, at least margin_floor."""
    errs = [abs(e) for e in relative_errors(model, sw.model_points())]
    return max(sw.sweep.margin_floor, statistics.median(errs) if errs else 0.0)


def candidates(sw: _Sweep, model: SweepModel, todo: list[Setting]
               ) -> list[tuple[float, Setting, str, dict[int, dict[str, Any]]]]:
    """Unmeasured settings that could beat the best measured one somewhere by more than its noise, best
    chance first: prediction x (1 + model error) above the best's CI upper bound (a setting that could only
    land inside the best's CI would not change the answer, within the noise)."""
    e = margin(sw, model)
    out = []
    for s in todo:
        preds: dict[int, dict[str, Any]] = {}
        best_ratio, why = 0.0, ""
        for c in sw.levels:
            pred = model.predict(s.steps, s.topk, s.k, s.synthetic_accept, c)
            if pred is None:
                continue
            preds[c] = {**pred, "margin": e, "made_after_starts": sw.n_starts}
            best = sw.best_measured(s.synthetic_accept, c)
            bar = None if best is None else max(best.figures["tok_s"], best.figures.get("tok_s_ci_high") or 0.0)
            ratio = math.inf if bar is None else pred["tok_s"] * (1 + e) / bar
            if ratio > best_ratio:
                best_ratio = ratio
                why = (f"predicted {pred['tok_s']:.1f} tok/s at concurrency {c} (accept len "
                       f"{pred['accept_len']:.2f}, cycle {pred['cycle_ms']:.2f} ms); best measured there: "
                       + (f"{best.arm.name} {best.figures['tok_s']:.1f} tok/s (CI high {bar:.1f})" if best
                          else "none") + f"; model error margin {e:.1%}")
        if best_ratio > 1.0:
            out.append((best_ratio, s, why, preds))
    return sorted(out, key=lambda t: -t[0])
