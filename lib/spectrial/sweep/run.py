"""Running a sweep: server starts that each measure every concurrency level, in grid or guided order.

    open the start source (live: the session's preamble: prepare, kill old server, GPUs free, fingerprint)
    grid:   baseline + every setting, `restarts` starts each, interleaved (trial.schedule)
    guided: baseline + probes (the deepest setting of each scenario of unknown acceptance, a second depth for the
            cycle model, the predicted best of each synthetic rate) -> fit (sweep.model: one cycle model for
            every scenario) -> measure the unmeasured setting that, at the top of the model's error, would hold
            the best measured tok/s outside its CI, then the model's predicted best -> refit -> ... until
            nothing is left that could change the answer beyond the noise, or the budget ends. What to measure
            next is `sweep.guided.decide`, a pure function of a frozen view of the sweep (`Sweep.view`); this
            loop owns the bookkeeping: the decisions recorded, predictions attached, starts, budget.
    -> figures per point (spectrial.analysis.figures.arm_figures), speed-up against the baseline of the same host
       fingerprint and concurrency (figures.add_comparisons), best setting per scenario and concurrency against
       the runner-up (figures.compare_requests at confirm_level), the final model's prediction for every point.

The budget: `budget_restarts` counts starts; `budget_s` lets no start begin that would be expected to end after
it, a start's time being the median of the warm starts so far (the cold first start, often twice as long, is paid
once and never averaged in: `Sweep.start_estimate`). A sweep its budget stopped is `partial`: every setting it
never started is named in `budget.not_measured` with why and the final model's prediction (and range) per level,
and a best is "confirmed" only when no unmeasured setting could beat it (`Sweep._skipped`, `Sweep._best`).

One server start = one setting; inside it, one benchmark window per concurrency level (spectrial.protocol.session).
Starts come from a `StartSource`: a live `Session`, a finished grid (sweep.replayer) or a model world
(sweep.world). The baseline is measured once per host fingerprint key: if the fingerprint changes during the
sweep, a new baseline is measured before the next setting.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from spectrial import interrupts
from spectrial.analysis import validity
from spectrial.analysis.figures import add_comparisons, arm_figures, compare_requests, merge_stats
from spectrial.errors import (
    ConfigError,
    ConnectionLost,
    MeasurementRejected,
    RecordWriteError,
    RunFailed,
    SpectrialError,
)
from spectrial.params import Arm, TrialParams
from spectrial.protocol.session import (
    MeasuredStart,
    Session,
    StartSource,
    WindowPlan,
    level_windows,
    lost_requests,
    schedule,
)
from spectrial.record.store import RunRecord, opened
from spectrial.schema import (
    ArmFigures,
    BestRecord,
    GridSetting,
    PointRecord,
    PredictedLevel,
    Prediction,
    RelativeError,
    RequestRecord,
    ShortSetting,
    StartEstimate,
    StaticComparison,
    SweepBudget,
    SweepDecision,
    SweepGridRecord,
    UnmeasuredSetting,
    WindowStats,
)
from spectrial.secrets import secret_values
from spectrial.servers import configcheck
from spectrial.sweep.guided import CONFIRMED, Measure, Stop, SweepView, decide
from spectrial.sweep.model import (
    MeasuredPoint,
    SweepModel,
    cv_errors,
    fit_sweep_model,
    model_error,
    noise,
    relative_errors,
    setting_error,
)
from spectrial.sweep.params import Load, Setting, SweepParams, flat_params, load_sweep_params
from spectrial.sweep.result import SweepResult, budget_text, prediction_text


@dataclass
class _Point:
    """One measured (or planned) grid point: a setting (None for a baseline) at one concurrency level."""

    id: str
    arm: Arm
    setting: Setting | None
    concurrency: int
    rate: float | None = None  # a request-rate level's offered req/s (concurrency: its cap in flight)
    requests: list[RequestRecord] = field(default_factory=list)
    stats: list[WindowStats] = field(default_factory=list)
    start_orders: list[int] = field(default_factory=list)
    phase: str | None = None
    prediction: Prediction | None = None
    fingerprint_key: str | None = None
    failed: str | None = None
    figures: ArmFigures = field(default_factory=ArmFigures)

    @property
    def measured(self) -> bool:
        return bool(self.figures.tok_s)

    @property
    def load(self) -> Load:
        return Load(self.concurrency, self.rate)


def _point_id(arm: Arm, load: Load) -> str:
    return f"{arm.name}@{load.id}"


class Sweep:
    """One sweep: its params, record, start source and everything measured so far."""

    def __init__(self, sweep: SweepParams, record: RunRecord, source: StartSource) -> None:
        self.sweep, self.record, self.source = sweep, record, source
        self.params: TrialParams = sweep.trial_params()
        self.levels = sweep.concurrency_levels()  # the closed-loop levels: what the cycle model and the search read
        self.loads = sweep.loads()  # every level a start measures (the request rates after the concurrency levels)
        self.settings = sweep.settings()
        self.policies = sweep.policy_arms()  # the engines' own run-time depth control: measured after the settings
        self.arms: dict[str, Arm] = {a.name: a for a in self.params.arms}
        self.setting_of: dict[str, Setting] = {sweep.arm(s).name: s for s in self.settings}
        self.points: dict[str, _Point] = {}
        for arm in self.params.arms:
            self._add_points(arm)
        self.baselines: dict[str, str] = {}  # fingerprint key -> baseline arm name
        self.decisions: list[SweepDecision] = []
        self.durations: list[float] = []
        self.stopped_by: str | None = None
        self.failures: list[str] = []

    def _add_points(self, arm: Arm) -> None:
        for x in self.loads:
            self.points[_point_id(arm, x)] = _Point(_point_id(arm, x), arm, self.setting_of.get(arm.name),
                                                    x.concurrency, x.rate)

    def abandon(self, exc: BaseException) -> None:
        """Stopped on `exc` before `execute` took over: the record says failed and why (see records.opened)."""
        self.record.abandon(exc)

    @property
    def fp_key(self) -> str:
        return self.source.fp_key

    # --- budget ----------------------------------------------------------------------------------------
    @property
    def n_starts(self) -> int:
        return len(self.record.manifest.starts)

    def elapsed_s(self) -> float:
        return self.source.elapsed_s()

    def start_estimate(self) -> StartEstimate | None:
        """What the next server start is expected to take, from the starts so far (None before the first).

        The sweep's first start is cold (weights read from disk, JIT and CUDA-graph caches built: 167.5 s against
        73-78 s for the next ones on an H200 with SGLang), and it is paid once: averaging it into every later
        start's estimate made the time budget skip settings that would have fit. So the estimate is the median of
        the warm starts (every start after the first, failed ones included: their time was spent too); with no
        warm start yet, the cold one (an upper bound)."""
        if not self.durations:
            return None
        cold, warm = self.durations[0], self.durations[1:]
        if warm:
            est = statistics.median(warm)
            spread = f"{min(warm):.0f}-{max(warm):.0f} s" if round(min(warm)) != round(max(warm)) else f"{est:.0f} s"
            how = f"median of {len(warm)} warm start(s) ({spread}); the cold first start ({cold:.0f} s) counted once"
        else:
            est, how = cold, f"no warm start yet: the cold first start's {cold:.0f} s (an upper bound)"
        return StartEstimate(start_s=round(est, 2), how=how, cold_start_s=round(cold, 2),
                             warm_start_s=[round(x, 2) for x in warm])

    def budget_stop(self, n: int = 1) -> str | None:
        """Why `n` more server starts may not begin (None when they may)."""
        b = self.sweep
        used = self.n_starts if self.record.manifest.resumed_from is None else sum(  # a resume's taken-over
            1 for x in self.record.manifest.starts if x.replayed_from is None)      # starts cost no start
        if b.budget_restarts is not None and used + n > b.budget_restarts:
            return f"restart budget: {used} of {b.budget_restarts} server starts used"
        est = self.start_estimate()
        if b.budget_s is not None and est is not None and self.elapsed_s() + est.start_s * n > b.budget_s:
            kind = "a warm start" if est.warm_start_s else "a start (the cold first one; no warm start yet)"
            return (f"time budget: {self.elapsed_s():.0f} s used of {b.budget_s:.0f} s, and {kind} takes "
                    f"~{est.start_s:.0f} s")
        return None

    @property
    def budget_hit(self) -> bool:
        """Whether a budget (restarts or seconds) stopped the sweep before its plan was done."""
        return (self.stopped_by or "").startswith(("restart budget", "time budget"))

    # --- measuring -------------------------------------------------------------------------------------
    def measure(self, arms: list[Arm], phase: str) -> bool:
        """`restarts` starts of each arm (interleaved as `order` says); False when the budget stopped it."""
        p = self.params
        for arm, restart in schedule(arms, p.restarts, p.order, p.seed + self.n_starts):
            if arm.speculative and self.fp_key not in self.baselines \
                    and not self._measure_baseline("baseline (new host fingerprint)"):
                return False
            why = self.budget_stop()
            if why:
                self.stopped_by = why
                self.decisions.append(SweepDecision(phase="budget", setting=arm.name, reason=f"not started: {why}"))
                return False
            self._one_start(arm, restart, phase if arm.speculative else "baseline")
        return True

    def _measure_baseline(self, phase: str) -> bool:
        name = "baseline" if not self.baselines else f"baseline-{len(self.baselines) + 1}"
        if name not in self.arms:
            arm = Arm(name=name)
            self.arms[name] = arm
            self._add_points(arm)
        self.baselines[self.fp_key] = name
        self.decisions.append(SweepDecision(phase=phase, setting=name, reason=f"baseline of host fingerprint "
                                                                             f"{self.fp_key}"))
        return self.measure([self.arms[name]], phase)

    def windows(self, restart: int) -> list[WindowPlan]:
        """One window per load level (`level_windows`)."""
        return level_windows(self.params, self.loads, restart)

    def _one_start(self, arm: Arm, restart: int, phase: str) -> None:
        try:
            m = self.source.start(arm, restart, self.windows(restart), phase)
            if m is None:
                for x in self.loads:
                    self.points[_point_id(arm, x)].failed = "unavailable"
                return
            if m.record.status != "ok":
                self.failures.append(f"{arm.name} start {restart + 1}: {m.record.reason}")
            elif lost := lost_requests(m):
                self.failures.append(f"{arm.name} start {restart + 1}: {lost}")
            self.add_start(arm, m)
        except (KeyboardInterrupt, ConfigError, MeasurementRejected, RecordWriteError, ConnectionLost):  # end it
            raise
        except SpectrialError as exc:
            self.failures.append(f"{arm.name} start {restart + 1}: {exc}")
            for x in self.loads:
                pt = self.points[_point_id(arm, x)]
                if not pt.requests:
                    pt.failed = str(exc).splitlines()[0][:300]
            start = self.record.manifest.starts[-1] if self.record.manifest.starts else None
            if start is not None and start.arm == arm.name:
                self.durations.append(start.elapsed_s or 0.0)
            return
        self.durations.append(m.record.elapsed_s or 0.0)
        moved = self.source.moved(m.record)
        if moved:
            self.decisions.append(SweepDecision(
                phase="fingerprint", reason=f"host fingerprint changed ({'; '.join(m.record.fingerprint_changes[:3])})"
                                            f": now {moved}; the next setting gets a new baseline"))

    def add_start(self, arm: Arm, m: MeasuredStart) -> None:
        """File a start's windows under their points."""
        m.record.phase = m.record.phase or None
        for w in m.windows:
            pt = self.points[_point_id(arm, Load(w.plan.concurrency, w.plan.rate))]
            for r in w.requests:
                r.point = pt.id
            pt.requests += w.requests
            pt.stats.append(w.stats)
            pt.start_orders.append(m.record.order)
            pt.phase = pt.phase or m.record.phase
            pt.fingerprint_key = pt.fingerprint_key or m.record.fingerprint_key
        for x in self.loads:
            self._refresh(self.points[_point_id(arm, x)])

    def _refresh(self, pt: _Point) -> None:
        if not pt.requests:
            return
        figs = arm_figures(pt.requests, merge_stats(pt.stats), pt.arm.speculative, self.params.confidence,
                           self.params.seed, k=self.params.arm_steps(pt.arm) if pt.arm.speculative else None,
                           synthetic=pt.arm.synthetic_accept, concurrency=pt.concurrency, slo=self.params.slo.limits(),
                           setting=self.source.setting(pt.concurrency, pt.rate))
        starts = {s.order: s for s in self.record.manifest.starts}
        checks = [starts[o].config_check for o in pt.start_orders if o in starts and starts[o].config_check]
        cfg = configcheck.over_starts(checks)
        if cfg is not None:  # what the engine resolved of the setting (the same check as a trial's arm)
            figs.validity = validity.with_check(figs.validity, validity.resolved_config(cfg))
        pt.figures = figs
        if not figs.tok_s:
            pt.failed = pt.failed or "no successful request"

    # --- what the model sees ---------------------------------------------------------------------------
    def measured_points(self) -> list[MeasuredPoint]:
        """The speculative points measured so far, as the model and the search read them (grid order)."""
        out = []
        for pt in self.points.values():
            if pt.setting is None or not pt.measured or pt.rate is not None:  # the model is of closed loops
                continue
            f, s = pt.figures, pt.setting
            out.append(MeasuredPoint(steps=s.steps, topk=s.topk, k=s.k, scenario=s.synthetic_accept,
                                     concurrency=pt.concurrency, tok_s=f.tok_s, accept_len=f.accept_len,
                                     cycle_ms=f.cycle_ms, draft_ms_per_cycle=f.draft_ms_per_cycle,
                                     per_position=tuple(f.per_position) if f.per_position is not None else None,
                                     verify_steps=f.verify_steps, tok_s_ci_low=f.tok_s_ci_low, name=pt.arm.name))
        return out

    def view(self) -> SweepView:
        """What the guided search may read: a frozen copy of what was measured and tried, and the fitted model."""
        measured = tuple(self.measured_points())
        base = self.arms[self.baselines.get(self.fp_key, "baseline")]
        base_cycle = {c: v for c in self.levels if (v := self.point(base, c).figures.cycle_ms)}
        return SweepView(sweep=self.sweep, settings=tuple(self.settings), levels=tuple(self.levels),
                         measured=measured, tried=frozenset(s for s in self.settings if self.tried(s)),
                         baseline_cycle_ms=base_cycle, n_starts=self.n_starts, model=fit_sweep_model(measured))

    def point(self, arm: Arm, c: int) -> _Point:
        return self.points[_point_id(arm, Load(c))]

    def best_measured(self, scenario: float | None, c: int) -> _Point | None:
        pts = [pt for pt in self.points.values() if pt.setting is not None and pt.measured
               and pt.setting.synthetic_accept == scenario and pt.concurrency == c and pt.rate is None]
        return max(pts, key=lambda pt: pt.figures.tok_s) if pts else None

    def tried(self, s: Setting) -> bool:
        return any(pt.requests or pt.failed for pt in self.points.values() if pt.setting == s)

    # --- strategies ------------------------------------------------------------------------------------
    def run_grid(self) -> None:
        plan = [self.arms["baseline"], *(self.sweep.arm(s) for s in self.settings),
                *(self.arms[a.name] for a in self.policies)]
        self.decisions.append(SweepDecision(phase="grid", reason=f"measure all {len(self.settings)} settings"
                                                                 + (f", {len(self.policies)} policies"
                                                                    if self.policies else "")
                                                                 + f" and the baseline, {self.params.restarts} "
                                                                   f"start(s) each, order {self.params.order}"))
        self.baselines[self.fp_key] = "baseline"
        self.measure(plan, "grid")

    def run_guided(self) -> None:
        """The guided search (`spectrial.sweep.guided.decide`) with the bookkeeping: each decision recorded, a
        confirmation's predictions attached to its points, the starts measured (the baseline with the first probes)
        within the budget, until the search stops or the budget does."""
        self.baselines[self.fp_key] = "baseline"
        first = [self.arms["baseline"]]
        while True:
            step = decide(self.view())
            if isinstance(step, Stop):
                self.stopped_by = step.reason
                if self.policies:  # the engines' policies, beside the best static settings the search found
                    self.decisions.append(SweepDecision(
                        phase="policy", reason=f"measure the {len(self.policies)} engine policies at every level, "
                                               "to compare with the best static setting there"))
                    self.measure([*first, *(self.arms[a.name] for a in self.policies)], "policy")
                return
            self._record(step)
            if not self.measure([*first, *(self.sweep.arm(p.setting) for p in step.picks)], step.phase):
                return
            first = []

    def _record(self, step: Measure) -> None:
        model = step.model.record() if step.model is not None else None
        for pick in step.picks:
            arm = self.sweep.arm(pick.setting)
            self.decisions.append(SweepDecision(phase=step.phase, setting=arm.name, reason=pick.reason,
                                                score=step.score, model=model))
            for c, pred in step.predictions.items():
                self.point(arm, c).prediction = pred

    # --- summary ---------------------------------------------------------------------------------------
    def summarise(self) -> None:
        rec, p = self.record, self.params
        measured = self.measured_points()
        model = fit_sweep_model(measured)
        e = model_error(model, measured, self.sweep.margin_floor)
        skipped = self._skipped(model, e, measured)
        left = {(x.setting, r.concurrency): (x.why, r) for x in skipped for r in x.predicted}
        points: list[PointRecord] = []
        for pt in self.points.values():
            s = pt.setting
            d = PointRecord(id=pt.id, name=pt.id, arm=pt.arm.name, setting=pt.arm.name, method=pt.arm.method,
                            concurrency=pt.concurrency, offered_rate=pt.rate, scenario=s.synthetic_accept if s else None,
                            steps=s.steps if s else None, topk=s.topk if s else None,
                            draft_tokens=s.draft_tokens if s else None,
                            synthetic_accept=s.synthetic_accept if s else None,
                            synthetic=bool(s and s.synthetic_accept is not None),
                            k=s.k if s else 0, phase=pt.phase, start_orders=pt.start_orders,
                            fingerprint_key=pt.fingerprint_key, prediction=pt.prediction, policy=pt.arm.policy)
            if pt.arm.policy is not None:  # a policy: its deepest depth, no grid setting
                d.steps = d.k = p.arm_steps(pt.arm)
                d.topk = p.arm_topk(pt.arm)
            if pt.measured:
                d = d.model_copy(update={**dict(pt.figures), "status": "ok", "reason": None})
            elif pt.failed or pt.requests:
                d = d.model_copy(update={**dict(pt.figures), "status": "failed",
                                         "reason": pt.failed or "no successful request"})
            else:
                why, pred = left.get((pt.arm.name, pt.concurrency) if pt.rate is None else (pt.arm.name, -1),
                                     (self._why_unmeasured(), None))
                d.status, d.reason = "not measured", why + (f"; {prediction_text(pred)}" if pred else "")
            if s is not None and pt.rate is None:
                d.final_prediction = model.predict(s.steps, s.topk, s.k, s.synthetic_accept, pt.concurrency)
                if pt.prediction and d.tok_s:
                    d.prediction_error = pt.prediction.tok_s / d.tok_s - 1.0
            points.append(d)
        self._compare_with_baselines(points)
        self._policy_vs_static(points)
        m = rec.manifest
        m.points = points
        m.arms = [d for d in points if d.status != "not measured"]
        errs = [abs(x) for x in relative_errors(model, measured)]
        cv = [abs(x) for x in cv_errors(measured)]
        m.model = model.record().model_copy(update={
            "margin": e, "noise": {c: noise(measured, c) for c in self.levels},
            "cv_rel_error": RelativeError(median_abs=statistics.median(cv) if cv else None,
                                          max_abs=max(cv) if cv else None, n=len(cv)),
            "in_sample_rel_error": RelativeError(median_abs=statistics.median(errs) if errs else None,
                                                 max_abs=max(errs) if errs else None, n=len(errs))})
        m.best = self._best(points, skipped)
        m.decisions = list(self.decisions)
        m.baselines = dict(self.baselines)
        est = self.start_estimate()
        starts = {a: sum(1 for x in rec.manifest.starts if x.arm == a) for a in {x.arm for x in rec.manifest.starts}}
        short = [ShortSetting(setting=a, starts=n, planned=p.restarts)
                 for a in [*self.baselines.values(), *(self.sweep.arm(s).name for s in self.settings)]
                 if 0 < (n := starts.get(a, 0)) < p.restarts] if self.budget_hit else []
        m.budget = SweepBudget(
            budget_s=self.sweep.budget_s, budget_restarts=self.sweep.budget_restarts,
            wall_s=round(self.elapsed_s(), 2), restarts=self.n_starts,
            grid_restarts=(1 + len(self.settings) + len(self.policies)) * p.restarts,
            settings_measured=sum(1 for s in self.settings if self.tried(s)), settings=len(self.settings),
            stopped_by=self.stopped_by, partial=self.budget_hit, not_measured=skipped, fewer_starts=short,
            start_estimate=est,
            remaining_estimate_s=round(est.start_s * len(skipped) * p.restarts, 1) if est and skipped else None)
        rec.save()

    def _why_unmeasured(self) -> str:
        if self.sweep.strategy == "guided" and self.stopped_by == CONFIRMED:
            return ("not needed: even at the top of its predicted range, the best measured setting would lie "
                    "within its CI")
        return self.stopped_by if self.budget_hit else "not measured: the sweep ended before it"

    def _skipped(self, model: SweepModel, e: float, measured: list[MeasuredPoint]) -> list[UnmeasuredSetting]:
        """Every setting never started, with why and, per concurrency level, the final model's prediction, its
        range (x (1 -/+ the model's error)) and whether it could beat the best measured setting: whether its CI,
        measured at the top of that range, would clear the best's tok/s (the guided search's own rule: what it
        would have measured next). A setting the model cannot predict could beat anything."""
        out = []
        for s in self.settings:
            if self.tried(s):
                continue
            levels = []
            for c in self.levels:
                best = self.best_measured(s.synthetic_accept, c)
                row = PredictedLevel(concurrency=c, best=best.arm.name if best else None,
                                     best_tok_s=best.figures.tok_s if best else None, could_beat=True)
                pred = model.predict(s.steps, s.topk, s.k, s.synthetic_accept, c)
                if pred is not None and math.isfinite(pred.tok_s):
                    err, w = setting_error(model, e, s.synthetic_accept, s.topk, c), noise(measured, c)
                    v = pred.tok_s
                    row = row.model_copy(update={
                        "tok_s": round(v, 2), "low": round(v * (1 - err), 2), "high": round(v * (1 + err), 2),
                        "error": round(err, 4), "noise": round(w, 4),
                        "could_beat": best is None or v * (1 + err) * (1 - w) > (best.figures.tok_s or 0.0)})
                levels.append(row)
            out.append(UnmeasuredSetting(setting=self.sweep.arm(s).name, steps=s.steps, topk=s.topk,
                                         draft_tokens=s.draft_tokens, synthetic_accept=s.synthetic_accept,
                                         why=self._why_unmeasured(), predicted=levels,
                                         could_beat_at=[r.concurrency for r in levels if r.could_beat]))
        return out

    def _compare_with_baselines(self, points: list[PointRecord]) -> None:
        by_id = {d.id: d for d in points}
        for x in self.loads:
            for key, base_name in self.baselines.items():
                base = by_id.get(_point_id(self.arms[base_name], x))
                mine = [d for d in points if (d.concurrency, d.offered_rate) == (x.concurrency, x.rate)
                        and d.status == "ok" and d.method != "none"
                        and (d.fingerprint_key == key or len(self.baselines) == 1)]
                if base is None or base.status != "ok":
                    continue
                reqs = [r for pt in (base, *mine) for r in self.points[pt.id].requests]
                group = [base, *mine]
                add_comparisons(group, reqs, self.params.confidence, self.params.seed, base=base, key="point",
                                greedy=self.params.sampling.greedy, setting=self.source.setting(x.concurrency, x.rate))
                for d in group[1:]:
                    d.baseline = base.id
                for d in group:
                    points[next(i for i, x in enumerate(points) if x.id == d.id)] = d
                    by_id[d.id] = d

    def _policy_vs_static(self, points: list[PointRecord]) -> None:
        """Each measured policy point against the best static setting measured at its level (real acceptance): the
        ratio of their median decode rates with its bootstrap interval at the sweep's confirm_level."""
        for d in points:
            if d.policy is None or d.status != "ok":
                continue
            def own_failed(x: PointRecord) -> list[str]:  # its own checks (a baseline's do not bear on this)
                return list(x.validity.failed) if x.validity is not None else []

            if own_failed(d):  # its own measurement is invalid: it is compared with nothing
                d.vs_best_static = StaticComparison(verdict=f"invalid measurement ({', '.join(own_failed(d))})")
                continue
            static = sorted((x for x in points if x.method != "none" and x.policy is None and x.status == "ok"
                             and x.scenario is None and x.concurrency == d.concurrency
                             and x.offered_rate == d.offered_rate and not own_failed(x)),
                            key=lambda x: -(x.tok_s or 0))
            if not static:
                d.vs_best_static = StaticComparison(verdict="no valid static setting measured at this level")
                continue
            b = static[0]
            cmp = compare_requests(self.points[d.id].requests, self.points[b.id].requests, self.sweep.confirm_level,
                                   self.params.seed)
            d.vs_best_static = StaticComparison(best_static=b.setting, best_static_tok_s=b.tok_s) if cmp is None \
                else StaticComparison(best_static=b.setting, best_static_tok_s=b.tok_s, ratio=cmp.ratio,
                                      ci_low=cmp.ci_low, ci_high=cmp.ci_high, level=cmp.level, verdict=cmp.verdict)
            if cmp is None:
                d.vs_best_static.verdict = "too few requests to compare"

    def _best(self, points: list[PointRecord], skipped: list[UnmeasuredSetting]) -> list[BestRecord]:
        """Per scenario and level, the best measured setting against the runner-up. "confirmed" only when it is
        faster than the runner-up beyond the noise and no setting left unmeasured could beat it (`_skipped`);
        otherwise the verdict names the settings that could."""
        out = []
        for scenario in self.sweep.scenarios():
            for x in self.loads:
                c = x.concurrency
                mine = sorted((d for d in points if d.method != "none" and d.status == "ok" and d.policy is None
                               and d.scenario == scenario and d.concurrency == c and d.offered_rate == x.rate),
                              key=lambda d: -(d.tok_s or 0))
                # a setting never started could beat the best: where the model predicts it (a concurrency level), at
                # the top of its range; at a request rate (the model is of closed loops), any
                threats = [(u, next((p for p in u.predicted if p.concurrency == c), None) if x.rate is None else None)
                           for u in skipped if u.synthetic_accept == scenario
                           and (c in u.could_beat_at if x.rate is None else True)]
                if not mine:
                    out.append(BestRecord(scenario=scenario, concurrency=c, offered_rate=x.rate,
                                          verdict="no setting measured", confirmed=False,
                                          could_beat=[u.setting for u, _ in threats]))
                    continue
                b = mine[0]
                row = BestRecord(scenario=scenario, concurrency=c, offered_rate=x.rate, best=b.setting, steps=b.steps,
                                 topk=b.topk, draft_tokens=b.draft_tokens, tok_s=b.tok_s,
                                 tok_s_ci_low=b.tok_s_ci_low, tok_s_ci_high=b.tok_s_ci_high,
                                 speedup=b.speedup, speedup_ci_low=b.speedup_ci_low,
                                 speedup_ci_high=b.speedup_ci_high, vs_baseline=b.verdict,
                                 measured_settings=len(mine))
                if len(mine) > 1:
                    r = mine[1]
                    cmp = compare_requests(self.points[b.id].requests, self.points[r.id].requests,
                                           self.sweep.confirm_level, self.params.seed)
                    row.runner_up, row.runner_up_tok_s = r.setting, r.tok_s
                    if cmp is not None:
                        row.ratio_to_runner_up, row.ratio_ci_low, row.ratio_ci_high = cmp.ratio, cmp.ci_low, cmp.ci_high
                        row.confirm_level, row.vs_runner_up = cmp.level, cmp.verdict
                        row.verdict = ("confirmed: faster than the runner-up" if cmp.verdict == "faster" else
                                       f"tied with {r.setting} within the noise ({cmp.verdict})")
                    else:
                        row.verdict = "too few requests to compare with the runner-up"
                else:
                    row.verdict = "only setting measured at this concurrency" if x.rate is None else \
                        "only setting measured at this request rate"
                row.could_beat = [u.setting for u, _ in threats]
                row.confirmed = row.verdict.startswith("confirmed") and not threats
                if threats:
                    against = {"faster": f"faster than the runner-up {row.runner_up}"}.get(
                        row.vs_runner_up or "", row.verdict.replace("only setting measured at this concurrency",
                                                                    "the only one measured").replace(
                            "only setting measured at this request rate", "the only one measured"))
                    unpredicted = "not predicted: the cycle model is of concurrency levels"
                    named = "; ".join(f"{u.setting} ({prediction_text(p, best=False) if p is not None else unpredicted})"
                                      for u, p in threats[:4])
                    more = f"; and {len(threats) - 4} more" if len(threats) > 4 else ""
                    row.verdict = (f"best of the measured settings ({against}), not confirmed: not measured "
                                   f"({_short_why(threats[0][0].why)}) and could be faster: {named}{more}")
                out.append(row)
        return out

    def all_requests(self) -> list[RequestRecord]:
        return [r for pt in self.points.values() for r in pt.requests]


def _short_why(why: str) -> str:
    """"time budget" of "time budget: 288 s used of ...", "the sweep ended before it" of "not measured: ..."."""
    return why.removeprefix("not measured: ").split(":")[0]


def run_sweep(params: SweepParams | str | Path, overrides: dict[str, Any] | None = None, *,
              run_id: str | None = None, progress: bool = True, raise_on_failure: bool = True,
              resume: str | Path | None = None) -> SweepResult:
    """Run a sweep (`params`: SweepParams or a YAML path plus dotted overrides) on its host; write its record.
    `resume`: the record of the same sweep that its budget stopped; its measured starts are taken over, not
    started again (`spectrial.sweep.resume`)."""
    if not isinstance(params, SweepParams):
        params = load_sweep_params(params, overrides)
    elif overrides:
        params = load_sweep_params(data=params.model_dump(mode="json"), overrides=overrides)
    from spectrial.protocol.plan import sweep_plan

    earlier, taken = None, 0
    if resume is not None:
        from spectrial.sweep.resume import load_resumable, measured_starts

        earlier = load_resumable(resume, params)
        taken = len(measured_starts(earlier[0]))
    plan = sweep_plan(params, launches=False, taken_over=taken,
                      resumed_from=earlier[0].run_id if earlier is not None else None)
    if progress:
        from spectrial.progress import note

        for line in plan.lines():
            note(line)
        if earlier is not None:
            note(f"resuming {earlier[0].run_id}: its {taken} measured start(s) are taken over, not started again")

    def make() -> Sweep:
        record = new_record(params, run_id)
        record.manifest.plan = plan.record
        live = Session(params.trial_params(), record, progress)
        if earlier is None:
            return Sweep(params, record, live)
        from spectrial.sweep.resume import ResumeSource

        m, requests = earlier
        source = ResumeSource(live, record, m, requests, Path(resume))  # type: ignore[arg-type]
        sw = Sweep(params, record, source)
        sw.decisions.append(SweepDecision(
            phase="resume", reason=f"resumed {m.run_id} ({m.status}): its {len(source.done)} measured start(s) "
                                   "taken over from its record, the others started here"))
        return sw

    with opened(make) as sw:
        return execute(sw, raise_on_failure)


def new_record(params: SweepParams, run_id: str | None = None, kind: str = "sweep",
               output_dir: str | Path | None = None) -> RunRecord:
    """The run record of a sweep, with the grid as planned."""
    record = RunRecord(output_dir or params.trial.output_dir, f"{params.trial.name}-{params.strategy}", kind=kind,
                       run_id=run_id, params=flat_params(params))
    m = record.manifest
    m.strategy = params.strategy
    m.grid = SweepGridRecord(
        settings=[GridSetting(steps=s.steps, topk=s.topk, draft_tokens=s.draft_tokens,
                              synthetic_accept=s.synthetic_accept, arm=params.arm(s).name) for s in params.settings()],
        concurrency=params.concurrency_levels(), request_rate=params.rate_levels(),
        max_inflight=params.inflight_cap() if params.rate_levels() else None, scenarios=params.scenarios(),
        restart_fields=["steps", "topk", "draft_tokens", "synthetic_accept"],
        per_request_fields=["concurrency", "request_rate"])
    record.add_secrets(secret_values(params.trial.env))
    record.save()
    return record


def execute(sw: Sweep, raise_on_failure: bool = True, drift: bool = True) -> SweepResult:
    """Open the start source, run the strategy, summarise, finish the record (failed, with the reason, on
    errors)."""
    record, params = sw.record, sw.sweep
    try:
        sw.source.open()
        if getattr(sw.source, "prepare_s", None) is not None:
            record.manifest.prepare_s = sw.source.prepare_s  # type: ignore[attr-defined]
        if params.strategy == "grid":
            sw.run_grid()
        else:
            sw.run_guided()
        with record.step("summarise"):
            sw.summarise()
            if drift:
                from spectrial.protocol.drift import check_drift

                record.manifest.drift = check_drift(record.manifest, params.trial.drift_dir or params.trial.output_dir,
                                                    params.trial.drift_tolerance)
    except BaseException as exc:
        sw.failures.append(interrupts.describe(exc))  # "interrupted by Ctrl-C", as a trial's record says
        try:
            sw.summarise()
        except Exception as inner:  # noqa: BLE001 - the original error is the one to report
            sw.failures.append(f"summary failed too: {inner}")
        record.finish("failed", "\n".join(dict.fromkeys(sw.failures)))
        _write_requests(record, sw)
        raise
    finally:
        sw.source.close()
    _write_requests(record, sw)
    base_ok = any(d.status == "ok" for d in record.manifest.points if d.method == "none")
    spec_ok = any(d.status == "ok" for d in record.manifest.points if d.method != "none")
    problems = list(dict.fromkeys(sw.failures))
    if not base_ok:
        problems.append("the baseline was not measured")
    if not spec_ok:
        problems.append("no speculative setting was measured")
    if problems and sw.budget_hit:
        problems.append(budget_text(record.manifest))
    if problems:
        record.finish("failed", "\n".join(problems))
    elif sw.budget_hit:
        record.finish("partial", budget_text(record.manifest))
    else:
        record.finish("ok")
    result = SweepResult(record.dir, record.manifest, pd.DataFrame([r.model_dump() for r in sw.all_requests()]))
    if problems and raise_on_failure:
        raise RunFailed(f"sweep {record.run_id} failed (record: {record.dir}):\n" + "\n".join(problems), result)
    return result


def _write_requests(record: RunRecord, sw: Sweep) -> None:
    """requests.csv and stream.csv of a sweep (each request's delivery judged against its point's accept length)."""
    from spectrial.analysis.serving import write_requests

    write_requests(record, sw.all_requests(), {p.id: p.accept_len for p in record.manifest.points}, key="point")
