"""The configuration to deploy, from a sweep over draft depth x load (issue 40 item 4).

Per concurrency level the sweep's best setting of the draft's own acceptance (`Manifest.best`, scenario None:
synthetic scenarios are what-ifs, never deployed) is deployed where it pays (its speed-up interval wholly above 1),
else speculation is off at that load. The answer is written for the engine the sweep ran:

    vLLM       its `--speculative-config` JSON with `num_speculative_tokens_per_batch_size`: inclusive batch-size
               ranges, each level's depth from the level above the previous one (the first from 1), 0 where
               speculation does not pay; batch sizes above the highest measured level keep its depth (vLLM carries
               the last range forward), which the notes say was not measured
    SGLang     its speculative flags for one setting (SGLang 0.5.17 has no per-batch-size depth): the setting that
               pays at the most levels (ties: the lower load's best), and the levels where it did not
    llama.cpp  its flags for one setting, chosen as for SGLang

Request-rate levels (`grid.request_rate`, an open loop) are shown beside the concurrency levels with the setting
measured best there, and count towards the one setting of SGLang and llama.cpp; they are not folded into vLLM's
per-batch-size table (an open loop has no fixed batch size: its batch is whatever is in flight).

Each level carries the measured speed-up and interval the choice rests on. The flags come from the engine's adapter
(`Engine.deploy_schedule`, `Engine.deploy_flags`). `verify_params` writes the trial that re-measures the deployed
setting (`spectrial deploy RUN --verify-params FILE`); `check_verification` says whether its measured speed-up
interval overlaps the predicted one (`--check TRIAL`).
"""

from __future__ import annotations

import shlex
from collections import Counter
from typing import Any

from pydantic import BaseModel, Field

from spectrial.analysis.validity import is_invalid
from spectrial.engines.base import engine_class
from spectrial.errors import SpectrialError
from spectrial.schema import BestRecord, Manifest
from spectrial.sweep.params import SWEEP_KEYS


class DeployLevel(BaseModel):
    """One load level: the setting deployed there (None: speculation off) and the measurement it rests on."""

    concurrency: int
    offered_rate: float | None = Field(None, description="A request-rate level's offered rate, req/s")
    steps: int | None = None
    topk: int | None = None
    draft_tokens: int | None = None
    setting: str | None = None
    speedup: float | None = None
    ci: tuple[float, float] | None = None
    why: str = ""


class Deployment(BaseModel):
    """The deployable answer of one sweep record for its engine."""

    engine: str
    method: str | None = None
    draft: str | None = None
    levels: list[DeployLevel] = Field(default_factory=list)
    rates: list[DeployLevel] = Field(default_factory=list, description="The request-rate levels (open loop)")
    schedule_config: dict[str, Any] | None = Field(None, description="A per-batch-size depth schedule as the engine "
                                                                     "takes it (where it has one)")
    args: list[str] = Field(default_factory=list, description="The engine flags to deploy")
    notes: list[str] = Field(default_factory=list)

    def text(self) -> str:
        lines = [f"Configuration to deploy ({self.engine}, method {self.method}):"]
        for lv in [*self.levels, *self.rates]:
            ci = f" [{lv.ci[0]:.2f}, {lv.ci[1]:.2f}]" if lv.ci else ""
            what = f"depth {lv.steps} ({lv.setting})" if lv.steps else "speculation off"
            where = f"concurrency {lv.concurrency}" if lv.offered_rate is None else f"{lv.offered_rate:g} req/s"
            lines.append(f"  {where}: {what}; measured {lv.speedup:.2f}x{ci}; {lv.why}"
                         if lv.speedup is not None else f"  {where}: {what}; {lv.why}")
        if self.args:
            lines.append("  " + shlex.join(self.args))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _level(row: BestRecord, invalid: str | None = None) -> DeployLevel:
    ci = (row.speedup_ci_low, row.speedup_ci_high) if row.speedup_ci_low is not None \
        and row.speedup_ci_high is not None else None
    at = {"concurrency": row.concurrency, "offered_rate": row.offered_rate}
    if invalid:  # its validity checks void the speed-up: nothing is deployed on it
        return DeployLevel(**at, speedup=row.speedup, ci=ci, setting=row.best, why=f"{invalid}: not deployed")
    pays = ci is not None and ci[0] > 1.0
    if not pays:
        why = ("its best setting does not pay here (interval not wholly above 1)" if ci is not None else
               "no interval for its best setting: not deployed")
        return DeployLevel(**at, speedup=row.speedup, ci=ci, why=why, setting=row.best)
    return DeployLevel(**at, steps=row.steps, topk=row.topk, draft_tokens=row.draft_tokens,
                       setting=row.best, speedup=row.speedup, ci=ci, why="pays: the fastest measured setting here")


def deployment(manifest: Manifest) -> Deployment:
    """The configuration to deploy from a sweep record (see the module docstring), in the flags of the engine's
    adapter (`Engine.deploy_schedule`, `Engine.deploy_flags`)."""
    p = manifest.params
    name = manifest.engine.name or p.engine or ""
    engine = engine_class(name)
    rows = sorted((r for r in manifest.best if r.scenario is None and r.offered_rate is None),
                  key=lambda r: r.concurrency)
    rate_rows = sorted((r for r in manifest.best if r.scenario is None and r.offered_rate is not None),
                       key=lambda r: r.offered_rate or 0.0)
    method = p.get("method") or next((a.method for a in manifest.arms if a.method not in (None, "none")), None)
    verdicts = {(pt.setting or pt.arm, pt.concurrency, pt.offered_rate): pt.verdict for pt in manifest.points
                if pt.scenario is None}

    def level(r: BestRecord) -> DeployLevel:
        v = verdicts.get((r.best, r.concurrency, r.offered_rate))
        return _level(r, v if is_invalid(v) else None)

    dep = Deployment(engine=name, method=method, draft=p.draft, levels=[level(r) for r in rows],
                     rates=[level(r) for r in rate_rows])
    if not rows:
        dep.notes.append("the sweep measured no setting of the draft's own acceptance (only synthetic scenarios): "
                         "nothing to deploy")
        return dep
    paying = [lv for lv in dep.levels if lv.steps]
    if not paying and not any(lv.steps for lv in dep.rates):
        dep.notes.append(f"speculation pays at no measured level: deploy {engine.label} without speculative flags")
        return dep
    sched, first = [], 1
    for lv in dep.levels:
        sched.append([first, lv.concurrency, lv.steps or 0])
        first = lv.concurrency + 1
    draft = (manifest.engine.models or {}).get(dep.draft or "", dep.draft)
    per_batch = engine.deploy_schedule(method or "", draft, sched) if paying else None
    if per_batch is not None:
        dep.schedule_config, dep.args = per_batch
        dep.notes.append(f"batch sizes above {dep.levels[-1].concurrency} keep depth {dep.levels[-1].steps or 0} "
                         f"({engine.label} carries the last range forward): not measured")
        if dep.rates:
            dep.notes.append("the request-rate levels are shown, not folded into the per-batch-size table (an open "
                             "loop's batch is whatever is in flight)")
        return dep
    every = [*paying, *(lv for lv in dep.rates if lv.steps)]
    counts = Counter((lv.steps, lv.topk, lv.draft_tokens) for lv in every)
    # the most levels paid; ties: the setting best at the lowest load (concurrency levels before request rates)
    def lowest(s: tuple[int | None, int | None, int | None]) -> tuple[bool, float]:
        return min((lv.offered_rate is not None, lv.offered_rate or lv.concurrency)
                   for lv in every if (lv.steps, lv.topk, lv.draft_tokens) == s)

    best = min(counts, key=lambda s: (-counts[s], lowest(s)))
    steps, topk, draft_tokens = best
    dep.args = engine.deploy_flags(method or "", steps or 1, topk, draft_tokens)
    conc = [str(lv.concurrency) for lv in dep.levels if (lv.steps, lv.topk, lv.draft_tokens) != best]
    rates = [f"{lv.offered_rate:g}" for lv in dep.rates if (lv.steps, lv.topk, lv.draft_tokens) != best]
    other = [*([f"concurrency {', '.join(conc)}"] if conc else []), *([f"{', '.join(rates)} req/s"] if rates else [])]
    if other:
        dep.notes.append(f"{engine.label} takes one setting for every load: at {' and '.join(other)} another setting "
                         "(or none) was measured best")
    return dep




def _arm(lv: DeployLevel, method: str | None) -> dict[str, Any]:
    arm: dict[str, Any] = {"name": f"deploy-s{lv.steps}" + (f"-t{lv.topk}" if lv.topk not in (None, 1) else ""),
                           "method": method, "steps": lv.steps}
    if lv.topk not in (None, 1):
        arm.update(topk=lv.topk, draft_tokens=lv.draft_tokens)
    return arm


def verify_params(manifest: Manifest, dep: Deployment) -> dict[str, Any]:
    """A trial params mapping that runs the deployed setting beside the baseline at the lowest load level where it
    pays (the sweep's own trial keys, its grid and budget left out); `check_verification` reads the trial back.
    vLLM's per-batch-size table is verified level by level: the arm runs that level's depth."""
    paying = [lv for lv in dep.levels if lv.steps]
    if not paying:
        raise SpectrialError("nothing to verify: speculation pays at no measured level of the sweep")
    data = {k: v for k, v in manifest.params.as_dict().items() if k not in (*SWEEP_KEYS, "arms")}  # the sweep's own keys
    lv = paying[0]
    data.update(name=f"{data.get('name') or 'sweep'}-verify", concurrency=lv.concurrency,
                arms=[{"name": "baseline"}, _arm(lv, dep.method)])
    return data


def check_verification(dep: Deployment, trial: Manifest) -> tuple[list[str], bool]:
    """Did the deployed setting hold? Each deploy arm of `trial` against the level of the same concurrency: held when
    its measured speed-up interval overlaps the predicted one (the sweep's), else not (lines, all held)."""
    c = trial.params.concurrency or 1
    lv = next((x for x in dep.levels if x.concurrency == c), None)
    lines, held = [], True
    arms = [a for a in trial.arms if a.name.startswith("deploy-")]
    if lv is None or lv.ci is None or not arms:
        return ([f"nothing to check: the trial ran concurrency {c} and {len(arms)} deploy arm(s); the deployment "
                 f"measured levels {[x.concurrency for x in dep.levels]}"], False)
    for a in arms:
        ci = (a.speedup_ci_low, a.speedup_ci_high)
        ok = a.speedup is not None and None not in ci and not (ci[1] < lv.ci[0] or ci[0] > lv.ci[1])  # type: ignore[operator]
        held = held and ok
        measured = f"{a.speedup:.2f}x [{ci[0]:.2f}, {ci[1]:.2f}]" if a.speedup is not None and None not in ci \
            else "no interval"
        lines.append(f"{a.name} at concurrency {c}: predicted {lv.speedup:.2f}x [{lv.ci[0]:.2f}, {lv.ci[1]:.2f}], "
                     f"measured {measured}: " + ("held" if ok else "did not hold"))
    return lines, held
