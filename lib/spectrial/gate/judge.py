"""A gate's judgement: is the candidate run worse than its reference by more than the tolerance, better, or can
the noise not tell? Pure functions of typed records (no files, no output).

Noise, per figure (the standard error of the change, the tolerance's units):
    candidate   its own interval: the bootstrap CI of tok/s and speed-up (over starts, then requests), the p50's
                CI of TTFT/ITL, the between-start spread of accept length and per-position acceptance (each
                start's window), or their per-request spread / binomial error where one start was measured
    reference   the same of the reference record; of a history of N runs, the spread of their values / sqrt(N)
    between     a history's run-to-run spread (the standard deviation of the N runs' values): a new run varies by
                that much even when nothing changed, so the candidate's own error counts at least as much
    floor       the figure's `noise_floor` (tolerances file): the run-to-run spread no interval shows
    noise = max(sqrt(max(candidate^2, between^2) + reference^2), floor)
The change's interval is change +/- z x noise (z of the gate's confidence); regression when the whole interval is
below -tolerance, pass when it is above, improvement when it is above +tolerance, inconclusive when it straddles
-tolerance (more repeats or restarts narrow it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from spectrial.analysis.catalogue import figure
from spectrial.analysis.figures import median
from spectrial.gate.params import FigureTolerance, GateTolerances
from spectrial.record import comparable as cmp
from spectrial.record.comparable import Category, Comparability
from spectrial.schema import ArmRecord, GateCheck, GateOutcome, Manifest, WindowRecord

# figure -> (unit, which way is better)
GATED = ("accept_len", "per_position", "speedup", "tok_s", "ttft_ms", "itl_ms")
# each gated figure's unit and better direction, as the catalogue declares them (spectrial.analysis.catalogue)
FIGURES: dict[str, tuple[str, str]] = {n: (figure(n).unit, figure(n).better) for n in GATED}
THROUGHPUT = ("speedup", "tok_s", "ttft_ms", "itl_ms")
GREEDY = "greedy with a real draft: the same prompts give the same acceptance"


@dataclass(frozen=True)
class Figure:
    """One figure of one arm of one run: its value and standard error (None: unknown), and where the error came
    from."""

    value: float | None
    se: float | None = None
    basis: str = ""


def _z(level: float | None) -> float:
    return NormalDist().inv_cdf((1 + (level or 0.95)) / 2)


def _ci_se(low: float | None, high: float | None, level: float | None) -> float | None:
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return None
    return (high - low) / (2 * _z(level))


def _sd(values: Sequence[float]) -> float | None:
    return statistics.stdev(values) if len(values) >= 2 else None


def _windows(m: Manifest, arm: str) -> list[WindowRecord]:
    return [w for s in m.live_starts(arm) if s.status == "ok" for w in s.windows if w.requests_ok]


def arm_figures(m: Manifest, a: ArmRecord) -> dict[str, Figure]:
    """Every gateable figure of arm `a` of run `m` with its standard error: accept_len, per_position[i], speedup,
    tok_s, ttft_ms, itl_ms (a figure the arm lacks is absent)."""
    out: dict[str, Figure] = {}
    if a.tok_s is not None:
        out["tok_s"] = Figure(a.tok_s, _ci_se(a.tok_s_ci_low, a.tok_s_ci_high, 0.95), "its bootstrap CI")
    if a.speedup is not None and a.speculative:  # a baseline's is 1 by definition
        out["speedup"] = Figure(a.speedup, _ci_se(a.speedup_ci_low, a.speedup_ci_high, a.ci_level),
                                f"its CI ({a.ci_basis or 'bootstrap'})")
    serving = a.serving
    for name, p in (("ttft_ms", serving.ttft_ms if serving else None), ("itl_ms", serving.itl_ms if serving else None)):
        if p is not None and p.p50 is not None:
            lo, hi = p.p50_ci or (None, None)
            out[name] = Figure(p.p50, _ci_se(lo, hi, p.ci_level), f"the p50's bootstrap CI ({p.n} values)")
        elif getattr(a, name) is not None:
            out[name] = Figure(getattr(a, name))
    if not a.speculative:
        return out
    windows = _windows(m, a.name)
    steps = a.verify_steps or 0
    # Acceptance is random where the draft's tokens are sampled (temperature > 0) or the rates are synthetic: its
    # error is the spread between starts or the counts' own (whichever is larger). With greedy sampling and a real
    # draft it is a function of the prompts, which two comparable runs share request by request (same workload,
    # seed, repeats and restarts): no error is measurable within one run; the floor, or a history's run-to-run
    # spread, says what the engine's numerics move.
    random_accept = a.synthetic or not (m.workload.sampling.get("greedy", True) if m.workload else True)
    if a.accept_len is not None:
        errs: list[tuple[float, str]] = []
        starts = [v for w in windows if (v := _window_accept_len(w)) is not None]
        if random_accept and (sd := _sd(starts)) is not None:
            errs.append((sd / math.sqrt(len(starts)), f"spread of {len(starts)} starts"))
        if random_accept and steps >= 1 and a.per_position:
            var = _accepted_variance(a.per_position)
            errs.append((math.sqrt(var / steps), f"accepted tokens per step, {steps:.0f} verify steps"))
        se, basis = max(errs) if errs else (None, "" if random_accept else GREEDY)
        out["accept_len"] = Figure(a.accept_len, se, basis)
    for i, p in enumerate(a.per_position or []):
        errs = []
        starts = [w.per_position[i] for w in windows if w.per_position and len(w.per_position) > i]
        if random_accept and (sd := _sd(starts)) is not None:
            errs.append((sd / math.sqrt(len(starts)), f"spread of {len(starts)} starts"))
        if random_accept and steps >= 1 and 0 <= p <= 1:
            errs.append((math.sqrt(max(p * (1 - p), 0.25 / steps) / steps), f"binomial, {steps:.0f} verify steps"))
        se, basis = max(errs) if errs else (None, "" if random_accept else GREEDY)
        out[f"per_position[{i + 1}]"] = Figure(p, se, basis)
    return out


def _missing(a: ArmRecord, figure: str) -> str:
    """Why arm `a` lacks `figure`: the serving analysis withholds latencies of a coarse stream (a chunk carried
    several decode steps: the figure would measure the delivery, not the decoding)."""
    sv = a.serving
    if figure in ("itl_ms", "ttft_ms") and sv is not None and sv.granularity == "coarse":
        per = f" ({sv.chunks_per_request:.0f} chunks per request)" if sv.chunks_per_request is not None else ""
        return f"withheld in the candidate: its stream was too coarse for {figure}{per}"
    return "not measured in the candidate"


def _window_accept_len(w: WindowRecord) -> float | None:
    """A window's accept length: 1 + accepted / verify steps (the engine's own mean where it reports only that)."""
    c = w.counters
    if c.verify_steps and c.accepted is not None:
        return 1 + c.accepted / c.verify_steps
    return w.accept_len


def _accepted_variance(per_position: Sequence[float]) -> float:
    """Variance of the draft tokens accepted per verify step, X, from P(X >= i) = per_position[i-1]:
    E[X] = sum p_i, E[X^2] = sum (2i - 1) p_i."""
    ex = sum(per_position)
    ex2 = sum((2 * i + 1) * p for i, p in enumerate(per_position))
    return max(ex2 - ex * ex, 0.0)


def _base(figure: str) -> str:
    return figure.split("[", 1)[0]


def judge(arm: str, figure: str, tol: FigureTolerance, candidate: Figure | None, references: Sequence[Figure],
          confidence: float, ungated: str | None = None, missing: str = "not measured in the candidate") -> GateCheck:
    """One check: the candidate's figure against the reference's (one record, or a history's values). A figure the
    candidate lacks is inconclusive (`missing` says why), unless it is not gated: then it is reported only."""
    unit, better = FIGURES[_base(figure)]
    check = GateCheck(arm=arm, figure=figure, unit=unit, better=better, tolerance=tol.tolerance,  # type: ignore[arg-type]
                      tolerance_kind=tol.kind)
    refs = [r for r in references if r.value is not None]
    ref = median(r.value for r in refs)
    check.reference = ref
    check.candidate = candidate.value if candidate is not None else None
    if ref is None:
        check.reason = "not in the reference"
        return check
    if candidate is None or candidate.value is None:
        if ungated is not None or not tol.gate:
            check.outcome, check.reason = "not gated", f"{missing}; {ungated or 'gate: false in the tolerances'}"
        else:
            check.outcome, check.reason = "inconclusive", missing
        return check
    c = candidate.value
    if tol.kind == "relative" and ref <= 0:
        check.reason = "reference is 0: no relative change"
        return check
    scale = ref if tol.kind == "relative" else 1.0
    sign = 1.0 if better == "higher" else -1.0
    check.change = sign * (c - ref) / scale
    parts, cand_se = [], (candidate.se or 0.0) / scale
    if candidate.se is not None:
        parts.append(f"candidate {candidate.se / scale:.3g} ({candidate.basis})")
    elif candidate.basis:
        parts.append(candidate.basis)
    values = [r.value for r in refs]
    between = (_sd(values) or 0.0) / scale  # type: ignore[arg-type]
    if len(refs) >= 2:
        ref_se = between / math.sqrt(len(refs))
        parts.append(f"history of {len(refs)} runs: spread {between:.3g}, reference error {ref_se:.3g}")
    else:
        ref_se = (refs[0].se or 0.0) / scale
        if refs[0].se is not None:
            parts.append(f"reference {ref_se:.3g} ({refs[0].basis})")
    noise = math.sqrt(max(cand_se, between) ** 2 + ref_se ** 2)
    if noise < tol.noise_floor:
        noise = tol.noise_floor
        parts.append(f"floor {tol.noise_floor:.3g}")
    check.noise, check.noise_basis = noise, "; ".join(parts) or "none known"
    z = _z(confidence)
    check.change_low, check.change_high = check.change - z * noise, check.change + z * noise
    if ungated is not None or not tol.gate:
        check.outcome, check.reason = "not gated", ungated or "gate: false in the tolerances"
        return check
    t = tol.tolerance
    tol_text = f"{t:.0%}" if tol.kind == "relative" else f"{t:g}"
    if check.change_high < -t:
        check.outcome = "regression"
        check.reason = f"worse by more than {tol_text} (the whole interval is below -{tol_text})"
    elif check.change_low > t:
        check.outcome = "improvement"
        check.reason = f"better by more than {tol_text}: update the reference"
    elif check.change_low >= -t:
        check.outcome, check.reason = "pass", f"within {tol_text}"
    else:
        check.outcome = "inconclusive"
        check.reason = (f"the interval straddles -{tol_text}: the noise ({noise:.3g}) cannot tell; more repeats or "
                        "restarts (or a history reference) narrow it")
    return check


# --- comparability (spectrial.record.comparable: the one answer) ------------------------------------------------
# the categories the gate requires, by the names a tolerances file's `allow` takes; the gate judges the arm
# settings (`changed`) and lets the launch configuration and the host's state beyond its GPU model differ
NAMES: dict[Category, str] = {"GPU": "hardware", "engine": "engine", "engine version": "engine_version",
                              "model": "model", "workload": "workload", "repeats": "workload",
                              "sampling": "sampling", "concurrency": "concurrency",
                              "resolved config": "resolved_config"}
REQUIRES: tuple[Category, ...] = tuple(NAMES)


def comparison(cand: Manifest, ref: Manifest, allow: Sequence[str] = (), history: bool = False) -> Comparability:
    """The candidate against one reference run: the gate's categories required, less those `allow` names. The
    hardware is compared only where spectrial started both servers (an observe-only run's host is not
    fingerprinted); a history (`history`) also requires the fingerprint key, unless the hardware is allowed."""
    require = list(REQUIRES)
    if history and not (cand.controlled and "hardware" in allow):
        require.append("fingerprint key")  # an observe-only run's key is its server's (url, engine, version, model)
    ignore = [c for c, name in NAMES.items() if name in allow]
    if not (cand.controlled and ref.controlled):
        ignore.append("GPU")
    return cmp.compare(cand, ref, require=require, ignore=ignore)


def differences(c: Comparability, blocking: bool = True, hardware: bool = True) -> dict[str, str]:
    """The gate's categories that differ (name -> "reference -> candidate"), the blocking ones or the allowed ones;
    a value recorded in one run only is a difference. `hardware`: False where it was not compared (a run
    spectrial did not start)."""
    out: dict[str, list[str]] = {}
    for d in c.blocking if blocking else c.allowed:
        name = NAMES.get(d.category)
        if name is None or (name == "hardware" and not hardware):
            continue
        if name == "workload":
            out.setdefault(name, []).append(f"{d.field} {_short(d.b, 80)} -> {_short(d.a, 80)}")
        else:
            out.setdefault(name, []).append(f"{_short(d.b)} -> {_short(d.a)}")
    return {k: ", ".join(v) for k, v in out.items()}


def _short(v: object, n: int = 160) -> str:
    text = str(v)
    return text if len(text) <= n else text[: n - 3] + "..."


def setting_changes(cand: Manifest, ref: Manifest, arm: str) -> list[str]:
    """The arm's own settings that differ (the draft, its depth, synthetic acceptance): what the gate judges."""
    c = cmp.compare(cand, ref, arms=(arm, arm), require=())
    return [f"{arm}: {d.field} {d.b!r} -> {d.a!r}" for d in c.of("arm settings")] + \
        [f"{arm}: resolved {d.field} {d.b!r} -> {d.a!r} (read back from the server)" for d in c.of("resolved config")]


def worst(outcomes: Sequence[GateOutcome]) -> GateOutcome:
    """The gate's outcome from its checks: a regression first, then not comparable, inconclusive, improvement."""
    for o in ("regression", "not comparable", "inconclusive", "improvement", "pass"):
        if o in outcomes:
            return o  # type: ignore[return-value]
    return "inconclusive"  # nothing was gated


def gate_arms(cand: Manifest, refs: Sequence[Manifest], tol: GateTolerances) -> tuple[list[GateCheck], list[str]]:
    """Every check of every gated arm, and the arm settings that changed."""
    checks: list[GateCheck] = []
    changed: list[str] = []
    latest = refs[-1]
    names = tol.arms or [a.name for a in latest.arms]
    uncontrolled = not cand.controlled or any(not r.controlled for r in refs)
    for name in names:
        ref_arms = [(r, r.arm(name)) for r in refs]
        ref_arms = [(r, a) for r, a in ref_arms if a is not None and a.status == "ok"]
        c_arm = cand.arm(name)
        if not ref_arms:
            checks.append(GateCheck(arm=name, figure="arm", outcome="not comparable",
                                    reason="no measured arm of this name in the reference"))
            continue
        if c_arm is None:
            checks.append(GateCheck(arm=name, figure="arm", outcome="not comparable",
                                    reason=f"the candidate has no arm {name!r} (its arms: "
                                           f"{', '.join(a.name for a in cand.arms) or 'none'})"))
            continue
        changed += setting_changes(cand, ref_arms[-1][0], name)
        ref_figs = [arm_figures(r, a) for r, a in ref_arms]
        cand_figs = arm_figures(cand, c_arm) if c_arm.status == "ok" else {}
        if c_arm.status != "ok":
            checks.append(GateCheck(arm=name, figure="arm", outcome="regression",
                                    reason=f"the arm did not complete in the candidate ({c_arm.status}: "
                                           f"{c_arm.reason or 'no reason recorded'})"))
            continue
        keys = list(dict.fromkeys(k for f in ref_figs for k in f))
        for key in keys:
            base = _base(key)
            ungated = None
            if uncontrolled and base in THROUGHPUT and "controlled" not in tol.allow:
                ungated = ("uncontrolled record: no baseline beside it and the server's other load unknown "
                           "(allow: [controlled] to judge it anyway)")
            checks.append(judge(name, key, tol.figure(base, name), cand_figs.get(key), [f[key] for f in ref_figs if key in f],
                                tol.confidence, ungated, _missing(c_arm, base)))
    return checks, changed
