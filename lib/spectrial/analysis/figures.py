"""One place per figure: an arm's figures, the baseline, the speed-up with its interval, break-even, verdict, pays.

Trials, sweeps, explain, history, drift, the doctor, diff, the report, the CLI and the notebooks all take these
numbers from here (docs/FIGURES.md lists every figure with its unit).

    decode rate       `tok_s`, tok/s per request: each request's decode rate (the engine's own where the request
                      reports one, else the client's: tokens after the first token event / time from the first to
                      the last token event), median over the arm's requests; IQR, bootstrap CI (two-level: starts,
                      then requests, when an arm has several starts)
    accept length     `accept_len`, tokens committed per verify step = 1 + accepted / verify steps
    cycle             `cycle_ms` = accept_len / tok_s x 1000: a verify cycle on the decode rate's clock (the
                      engine's own clock is kept apart as `engine_cycle_ms` = decode time / verify steps)
    baseline          the first completed arm with method "none" (or the one named); its `ms_per_token` = 1000 / tok_s
    speed-up          tok_s / baseline tok_s; interval: bootstrap of the ratio of medians. A decide run's arm: the
                      geometric mean of its paired per-round ratios, exp(mean log(arm rate / baseline rate)) over
                      the rounds (the sequence's `estimate`), with the confidence sequence as its interval: one
                      pair, never tok_s / baseline tok_s beside the sequence's interval (`ci_basis` names the rounds)
    verdict           faster / slower (interval wholly above / below 1), equivalent (inside a decide margin),
                      else not distinguishable
    break-even        cycle_ms / baseline ms_per_token = accept_len / speed-up: the accept length at which this
                      arm's cycle would just match the baseline; interval accept_len / the speed-up's interval
    verdict's cycle   `verdict_cycle_ms` = break-even x the baseline's ms_per_token: the cycle the speed-up implies,
                      what readers show beside the break-even (= cycle_ms, but for a decide run's arm); the
                      engine's own clock (`engine_cycle_ms`) is a cross-check, never a second break-even
    pays              the verdict said with the break-even: yes (accept_len above the break-even interval), no
                      (below it), undecided (inside it)
    validity          an arm (or its baseline) that failed a check of severity "invalid" (spectrial.analysis.validity)
                      gets the verdict "invalid measurement (...)" and pays undecided: never faster or slower
    per category      the same definitions over the requests of one workload category
Because speed-up, break-even and pays derive from the same two decode rates (a decide run: the same paired
rounds), they cannot disagree: accept_len > break_even exactly when speedup > 1, and pays is yes exactly when the
verdict is faster.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from spectrial.analysis import formulas, validity
from spectrial.analysis import stats as stat
from spectrial.analysis.serving import request_cycles, stalled
from spectrial.analysis.stats import finite
from spectrial.errors import SpectrialError
from spectrial.schema import (
    ArmFigures,
    ArmRecord,
    CategoryRecord,
    Comparison,
    CrossCheck,
    Load,
    Manifest,
    Pays,
    PointRecord,
    RequestRecord,
    WindowStats,
)

NOT_DISTINGUISHABLE = stat.NOT_DISTINGUISHABLE
NO_SPREAD = "single value: no spread"
TOO_FEW = "not enough requests for a confidence interval"
NO_BASELINE = "no comparable baseline (none of its session and NCCL state)"


def median(values: Iterable[Any]) -> float | None:
    """Median of the finite numbers among `values` (None when there are none)."""
    vals = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)]
    return statistics.median(vals) if vals else None


def positive(x: Any) -> float | None:
    """x as a finite float > 0, else None (None, bools, text, NaN, inf and x <= 0 give None)."""
    v = finite(x)
    return v if v is not None and v > 0 else None


# --- one request ------------------------------------------------------------------------------------------
def decode_rate(r: RequestRecord) -> float | None:
    """A request's decode rate (tok/s): as measured (`tok_s`), else the engine's own
    (`server_predicted_per_second`), else the client's (`client_tok_s`) unless the request stalled (its output
    all at the end: the client's clock then times the delivery burst, e.g. 68,094 tok/s from vLLM's CPU build)."""
    return positive(r.tok_s) or positive(r.server_predicted_per_second) or (
        None if stalled(r) else positive(r.client_tok_s))


def rate_source(r: RequestRecord) -> str:
    return "server" if positive(r.server_predicted_per_second) else "client"


def window_rates(requests: Sequence[RequestRecord]) -> list[float | None]:
    """The decode rate of each request of one measurement window: the engine's own when every successful request
    reports one, else the client's for all (one clock per window), a stalled request's left out (None: its
    client rate times the delivery, not the decoding). What the session records as `tok_s`."""
    ok = [r for r in requests if r.ok]
    server = bool(ok) and all(positive(r.server_predicted_per_second) for r in ok)
    return [None if not r.ok else positive(r.server_predicted_per_second) if server
            else None if stalled(r) else positive(r.client_tok_s) for r in requests]


def merge_stats(stats: Sequence[WindowStats]) -> WindowStats:
    """Counters of several windows of one arm (or point), summed; per-position rates weighted by verify steps."""
    out = WindowStats(source=",".join(sorted({s.source for s in stats})) or "none",
                      scoped=all(s.scoped for s in stats) if stats else False)

    def total(name: str) -> float | None:
        vals = [getattr(s, name) for s in stats]
        return None if not vals or any(v is None for v in vals) else float(sum(vals))

    for name in ("verify_steps", "drafted", "accepted", "tokens", "decode_ms", "draft_ms", "prompt_tokens",
                 "cached_prompt_tokens", "graph_lines", "graph_off_lines"):
        setattr(out, name, total(name))
    if stats and all(s.per_position and s.verify_steps for s in stats):
        n = min(len(s.per_position or []) for s in stats)
        w = sum(s.verify_steps or 0 for s in stats)
        out.per_position = [sum((s.per_position or [])[i] * (s.verify_steps or 0) for s in stats) / w
                            for i in range(n)]
    lens = [s.accept_len for s in stats if s.accept_len is not None]
    out.accept_len = statistics.mean(lens) if lens else None
    out.notes = sorted({n for s in stats for n in s.notes})
    logs = [s.cross_checks["log"] for s in stats if "log" in s.cross_checks]
    if logs:  # the log's own readings, weighted by the drafts each covers
        n = sum(x.drafts for x in logs)
        k = min(len(x.per_position) for x in logs)
        out.cross_checks["log"] = CrossCheck(
            source="; ".join(x.source for x in logs), drafts=n,
            accept_len=sum((x.accept_len or 0.0) * x.drafts for x in logs) / n,
            per_position=[sum(x.per_position[i] * x.drafts for x in logs) / n for i in range(k)])
    return out


# --- one arm --------------------------------------------------------------------------------------------
def alpha_of(accept_len: float | None, k: int | None, synthetic: Any = None) -> tuple[float | None, str | None]:
    """The per-token acceptance alpha of an arm: its forced (synthetic) rate where given as one number, else the
    chain model's alpha that yields `accept_len` at depth k (tau = (1 - alpha^(k+1)) / (1 - alpha))."""
    if isinstance(synthetic, int | float) and not isinstance(synthetic, bool) and 0 <= synthetic <= 1:
        return float(synthetic), "synthetic"
    al = finite(accept_len)
    if al is None or k is None or k < 1 or not 1.0 <= al <= k + 1:
        return None, None
    return formulas.required_alpha(al, k), "from accept length"


def derived_figures(f: ArmFigures, speculative: bool, k: int | None = None, synthetic: Any = None) -> ArmFigures:
    """The figures that follow from an arm's measured ones (a copy): ms_per_token = 1000 / tok_s, cycle_ms =
    accept_len / tok_s x 1000, the engine's clock (decode time / tokens, / verify steps), draft_accept_rate =
    accepted / drafted, alpha; a baseline's accept length is 1 and its cycle one token."""
    tok_s = positive(f.tok_s)
    upd: dict[str, Any] = {"ms_per_token": formulas.ms_per_token(tok_s) if tok_s else None}
    decode, tokens, steps = positive(f.decode_ms), positive(f.tokens), positive(f.verify_steps)
    upd["engine_ms_per_token"] = decode / tokens if decode and tokens else None
    if not speculative:
        upd.update(accept_len=1.0, cycle_ms=upd["ms_per_token"], engine_cycle_ms=upd["engine_ms_per_token"],
                   draft_accept_rate=None, alpha=None, alpha_source=None)
        return f.model_copy(update=upd)
    al = finite(f.accept_len)
    upd["cycle_ms"] = al / tok_s * 1000.0 if al and tok_s else None
    upd["engine_cycle_ms"] = formulas.cycle_ms_from(decode, steps) if decode and steps else None
    drafted = positive(f.drafted)
    upd["draft_accept_rate"] = f.accepted / drafted if drafted and f.accepted is not None else None
    upd["alpha"], upd["alpha_source"] = alpha_of(al, k, synthetic)
    return f.model_copy(update=upd)


def request_accept_lens(requests: Sequence[RequestRecord]) -> tuple[list[float], str | None]:
    """Each measured request's accept length, 1 + accepted / verify steps of that request (`request_cycles`),
    and how they were counted; empty unless every successful request reports its counts."""
    counts = [request_cycles(r) for r in requests if r.ok]
    if not counts or any(c is None or c[1] <= 0 for c in counts):
        return [], None
    return [1.0 + c[0] / c[1] for c in counts], counts[0][2]  # type: ignore[index]


def arm_figures(requests: Sequence[RequestRecord], stats: WindowStats, speculative: bool,
                level: float = 0.95, seed: int = 0, k: int | None = None, synthetic: Any = None,
                concurrency: int | None = None, slo: Mapping[str, float] | None = None,
                setting: validity.Setting | None = None) -> ArmFigures:
    """An arm's figures from its measured requests (all starts) and its scoped counters (the inputs are not
    changed): decode rate with its spread and CI, counters, accept length (token-weighted, and per request),
    the derived figures, serving metrics, and the validity checks of the measurement (with `setting`)."""
    from spectrial.analysis import serving

    ok = [r for r in requests if r.ok]
    rated = [(r, v) for r in ok if (v := decode_rate(r)) is not None]
    rates = [v for _, v in rated]
    sources = {rate_source(r) for r, _ in rated}
    f = ArmFigures(requests_ok=len(ok), requests_failed=len(requests) - len(ok), tok_s_values=rates,
                   tok_s_source=sources.pop() if len(sources) == 1 else ("mixed" if sources else None),
                   client_tok_s=median(r.client_tok_s for r in ok))
    if rates:
        s = stat.summarize(rates)
        f = f.model_copy(update={"tok_s": s["median"], "tok_s_q1": s["q1"], "tok_s_q3": s["q3"],
                                 "tok_s_iqr": s["iqr"], "tok_s_min": s["min"], "tok_s_max": s["max"],
                                 "tok_s_cv": s["cv"]})
        starts = {r.restart for r, _ in rated}
        ci = None
        if len(starts) > 1:
            df = pd.DataFrame({"restart": [r.restart for r, _ in rated], "tok_s": rates})
            ci = stat.bootstrap_ci_two_level(df, "restart", "tok_s", level=level, seed=seed)
            spread = stat.two_level_spread(df, "restart", "tok_s")
            f = f.model_copy(update={"cv_within_start": spread.within_cv, "cv_between_starts": spread.between_cv,
                                     "cv_between_expected": spread.expected_between_cv,
                                     "start_medians": [float(x) for x in spread.group_medians]})
        elif len(rates) >= 2:
            ci = stat.bootstrap_ci(rates, level=level, seed=seed)
            f = f.model_copy(update={"cv_within_start": s["cv"], "cv_between_starts": None})
        if ci is not None:
            f = f.model_copy(update={"tok_s_ci_low": ci.low, "tok_s_ci_high": ci.high})
    counted = [r for r in ok if r.server_draft_n is not None]  # counters not exported: unknown, never 0
    drafted = stats.drafted if stats.drafted is not None else (
        sum(r.server_draft_n or 0 for r in counted) if counted else None)
    accepted = stats.accepted if stats.accepted is not None else (
        sum(r.server_draft_n_accepted or 0 for r in counted) if counted else None)
    tokens = stats.tokens if stats.tokens else sum(r.tokens or 0 for r in ok)
    decode_ms = stats.decode_ms if stats.decode_ms else sum((r.server_predicted_ms or 0) for r in ok) or None
    steps = stats.verify_steps
    accept_len = None
    if speculative:
        accept_len = formulas.accept_len_from_counts(accepted, steps) if steps and accepted is not None \
            else stats.accept_len
    f = f.model_copy(update={
        "drafted": drafted, "accepted": accepted, "tokens": tokens, "decode_ms": decode_ms, "verify_steps": steps,
        "per_position": stats.per_position, "stats_source": stats.source, "stats_scoped": stats.scoped,
        "stats_notes": stats.notes, "cross_checks": stats.cross_checks, "accept_len": accept_len,
        "draft_ms_per_cycle": stats.draft_ms / steps if speculative and stats.draft_ms is not None and steps
        else None,
        "graph_off_share": stats.graph_off_lines / stats.graph_lines if stats.graph_lines else None})
    f = derived_figures(f, speculative, k, synthetic)
    if ok:
        sv = serving.serving_figures(ok, expected_tokens_per_chunk=f.accept_len if speculative else 1.0,
                                     concurrency=concurrency, slo=slo, level=level, seed=seed)
        f = f.model_copy(update={"serving": sv, "ttft_ms": sv.ttft_ms.p50 if sv.ttft_ms else None,
                                 "itl_ms": sv.itl_ms.p50 if sv.itl_ms else None})
    if speculative:
        lens, how = request_accept_lens(ok)
        if lens:
            q = np.percentile(lens, [10, 50, 90])
            f = f.model_copy(update={"accept_len_request_mean": float(np.mean(lens)),
                                     "accept_len_request_p10": float(q[0]), "accept_len_request_p50": float(q[1]),
                                     "accept_len_request_p90": float(q[2]), "accept_len_request_n": len(lens),
                                     "accept_len_request_source": how})
    if setting is not None and ok:
        f = f.model_copy(update={"validity": validity.assess(requests, stats, f, speculative, setting)})
    return f


def with_figures(arm: ArmRecord, f: ArmFigures) -> ArmRecord:
    """`arm` with its figures replaced by `f` (a copy; categories kept unless `f` has its own)."""
    upd = {name: getattr(f, name) for name in ArmFigures.model_fields if name != "categories" or f.categories}
    return arm.model_copy(update=upd)


# --- the baseline and the comparison --------------------------------------------------------------------
def is_baseline(arm: ArmRecord) -> bool:
    return (arm.method or "none") == "none"


def pick_baseline(arms: Sequence[ArmRecord], name: str | None = None,
                  problems: list[str] | None = None) -> ArmRecord | None:
    """The reference arm: the one named, else the first completed baseline (method none) with a throughput.
    What makes the choice doubtful is appended to `problems`."""
    problems = problems if problems is not None else []
    cands = [a for a in arms if a.status == "ok" and is_baseline(a) and positive(a.tok_s)]
    if name is not None:
        hit = [a for a in cands if a.name == name]
        if not hit:
            problems.append(f"No completed baseline arm named {name!r} (completed baselines: "
                            f"{', '.join(a.name for a in cands) or 'none'}).")
            return None
        return hit[0]
    if not cands:
        problems.append("No baseline arm (method none) completed with a throughput: break-even, speed-up and the "
                        "acceptance needed cannot be computed; re-run the baseline in the same session.")
        return None
    if len(cands) > 1:
        problems.append(f"{len(cands)} baseline arms completed ({', '.join(a.name for a in cands)}); "
                        f"the first, **{cands[0].name}**, is the reference.")
    return cands[0]


def reference(arm: ArmRecord, arms: Sequence[ArmRecord]) -> ArmRecord | None:
    """The baseline `arm` is judged against: the first completed baseline of its session (hand-made records of
    several sessions) with the same NCCL state where arms record one (None: no comparable baseline)."""
    same = [b for b in arms if b.session == arm.session and b.status == "ok" and is_baseline(b) and positive(b.tok_s)
            and b.nccl_env == arm.nccl_env]
    return same[0] if same else None


def base_ms_per_token(base: ArmRecord) -> float | None:
    """The baseline's time per token on the decode rate's clock: 1000 / tok_s."""
    tok_s = positive(base.tok_s)
    return formulas.ms_per_token(tok_s) if tok_s else None


def speedup(arm: ArmRecord | CategoryRecord, base: ArmRecord | CategoryRecord) -> float | None:
    """tok_s / the baseline's tok_s (decode rates per request)."""
    a, b = positive(arm.tok_s), positive(base.tok_s)
    return a / b if a and b else None


def paired_rounds(basis: str | None) -> bool:
    """Whether an interval's basis (`ci_basis`) names a decide run's paired rounds: its speed-up is then the
    sequence's estimate, not tok_s / baseline tok_s."""
    return bool(basis) and (str(basis).startswith("confidence sequence") or "paired round" in str(basis))


def decide_estimates(m: Manifest) -> dict[str, float]:
    """A decide run's speed-up per speculative arm that has an interval: the sequence's estimate (geometric mean of
    the paired per-round ratios) that goes with it, as its `decide` record holds them; empty for any other run.
    (An arm whose sequence has no interval yet has no pair: its speed-up is tok_s / baseline tok_s.)"""
    if m.decide is None:
        return {}
    return {d.arm: float(d.estimate) for d in m.decide.arms  # type: ignore[arg-type]
            if positive(d.estimate) and d.ci_low is not None and d.ci_high is not None}


def decide_stale(m: Manifest) -> bool:
    """A decide run's record written while its arms' speed-up was tok_s / baseline tok_s beside the sequence's
    interval (before the pair was one): `rederive` gives it the sequence's estimate."""
    est = decide_estimates(m)
    return any(a.name in est and paired_rounds(a.ci_basis) and positive(a.speedup) is not None
               and not math.isclose(float(a.speedup), est[a.name], rel_tol=1e-12)  # type: ignore[arg-type]
               for a in m.arms)


def verdict_cycle_ms(arm: ArmRecord) -> float | None:
    """A verify cycle on the verdict's clock (ms): break-even x the baseline's ms per token (1000 / baseline tok_s),
    the cycle that the arm's speed-up and accept length imply. It is `cycle_ms` (accept_len / tok_s x 1000) for
    every arm but a decide run's, whose speed-up is the paired rounds' estimate; without a break-even, `cycle_ms`.
    What readers show beside the break-even; the engine's own clock (`engine_cycle_ms`) is only a cross-check."""
    be, rate = positive(arm.break_even_accept_len), positive(arm.baseline_tok_s)
    if be and rate and arm.speculative:
        return be * 1000.0 / rate
    return positive(arm.cycle_ms)


def break_even(arm: ArmRecord | CategoryRecord, base: ArmRecord | CategoryRecord) -> float | None:
    """The accept length at which `arm`'s cycle would just match the baseline: cycle_ms / baseline ms_per_token
    = accept_len / speed-up; a hand-made arm with a cycle time (say, a profiled verify time) but no decode rate
    gets cycle_ms / baseline ms_per_token (None without either)."""
    s, al = speedup(arm, base), positive(arm.accept_len)
    if s and al:
        return al / s
    cycle, base_rate = positive(getattr(arm, "cycle_ms", None)), positive(base.tok_s)
    return cycle * base_rate / 1000.0 if s is None and cycle and base_rate else None


def verdict_of(low: float | None, high: float | None, margin: float | None = None) -> str | None:
    """faster / slower when the interval lies wholly above / below 1, equivalent when it lies inside
    [1 / (1 + margin), 1 + margin], else not distinguishable; None without an interval."""
    if low is None or high is None:
        return None
    if low > 1.0:
        return "faster"
    if high < 1.0:
        return "slower"
    if margin and 1.0 / (1.0 + margin) <= low and high <= 1.0 + margin:
        return f"equivalent within ±{margin:.0%}"
    return NOT_DISTINGUISHABLE


def pays_of(verdict: str | None, speedup: float | None = None) -> Pays | None:
    """The verdict in break-even words: faster = yes, slower = no, anything judged otherwise = undecided. Single
    values without an interval (hand-measured records) are said from the point: yes when the speed-up is above 1,
    no below (their verdict says there is no interval). None when nothing was compared."""
    if verdict in (NO_SPREAD, TOO_FEW) and speedup is not None:
        return "yes" if speedup > 1 else "no" if speedup < 1 else "undecided"
    if verdict is None or verdict in (NO_SPREAD, TOO_FEW, NO_BASELINE) or verdict.startswith("n/a"):
        return None
    return "yes" if verdict == "faster" else "no" if verdict == "slower" else "undecided"


def judged(arm: ArmRecord | CategoryRecord, base: ArmRecord | CategoryRecord, low: float | None,
           high: float | None, verdict: str | None, estimate: float | None = None, **extra: Any) -> Comparison:
    """The comparison of `arm` with `base` given the speed-up's interval and verdict: every field derived here.
    `estimate`: the speed-up that goes with the interval where it is not tok_s / baseline tok_s (a decide run's
    sequence estimate); break-even, its interval, pays and the verdict then all follow from that one pair."""
    s = positive(estimate) or speedup(arm, base)
    bad = validity.invalid_names(arm, base)
    if bad and verdict is not None and verdict not in (NO_BASELINE,):
        verdict = validity.invalid_verdict(bad)  # an invalid measurement is never faster or slower
    al = positive(arm.accept_len)
    be = (al / s if al else None) if s else break_even(arm, base)
    be_lo = al / high if al and high else None
    be_hi = al / low if al and low else None
    return Comparison(baseline_arm=getattr(base, "name", None) or getattr(base, "category", None),
                      baseline_tok_s=base.tok_s, speedup=s, speedup_ci_low=low, speedup_ci_high=high,
                      break_even_accept_len=be, break_even_ci_low=be_lo, break_even_ci_high=be_hi,
                      verdict=verdict, pays=pays_of(verdict, s), **extra)


def _frame(requests: Sequence[RequestRecord]) -> pd.DataFrame:
    rated = [(r.restart, v) for r in requests if r.ok and (v := decode_rate(r)) is not None]
    return pd.DataFrame({"restart": [x for x, _ in rated], "tok_s": [v for _, v in rated]})


def compare_requests(a: Sequence[RequestRecord], b: Sequence[RequestRecord], level: float = 0.95,
                     seed: int = 0) -> stat.Comparison | None:
    """Ratio of `a`'s to `b`'s median decode rate with its bootstrap CI (two-level over starts when both have
    several), or None with fewer than two rated requests on a side."""
    fa, fb = _frame(a), _frame(b)
    if len(fa) < 2 or len(fb) < 2:
        return None
    if fa["restart"].nunique() > 1 and fb["restart"].nunique() > 1:
        return stat.compare_arms(fa, fb, level=level, seed=seed, group_col="restart", value_col="tok_s")
    return stat.compare_arms(fa["tok_s"].to_numpy(), fb["tok_s"].to_numpy(), level=level, seed=seed)


def compare(arm: ArmRecord, base: ArmRecord, requests: Mapping[str, Sequence[RequestRecord]] | None = None,
            level: float = 0.95, seed: int = 0, key: str | None = None, base_key: str | None = None,
            interval: Mapping[str, Any] | None = None, estimate: float | None = None) -> Comparison:
    """`arm` against `base`. The speed-up's interval comes from, in order: `interval` (a decide run's confidence
    sequence: low, high, verdict, basis, and `estimate`, the sequence's speed-up that goes with it), the two arms'
    requests (`requests[key]`, keys default to the arms' names: a bootstrap), the interval the record holds (a
    decide run's read back keeps its pair: the recorded speed-up, or `estimate`, the sequence's), else a
    bootstrap over the rates the record kept."""
    if arm is base:
        return judged(arm, base, None, None, None)
    if interval is not None:
        return judged(arm, base, interval.get("low"), interval.get("high"), interval.get("verdict"),
                      estimate=interval.get("estimate"), ci_level=interval.get("level"),
                      ci_basis=interval.get("basis"))
    if requests is not None:
        ra, rb = requests.get(key or arm.name) or [], requests.get(base_key or base.name) or []
        cmp = compare_requests(ra, rb, level, seed)
        if cmp is None:
            return judged(arm, base, None, None, TOO_FEW)
        two = _frame(ra)["restart"].nunique() > 1 and _frame(rb)["restart"].nunique() > 1
        return judged(arm, base, cmp.ci_low, cmp.ci_high, cmp.verdict, min_detectable_ratio=cmp.min_detectable_ratio,
                      ci_level=level, ci_basis="restarts then requests" if two else "requests of one start")
    if paired_rounds(arm.ci_basis):  # a decide run read back: the sequence's pair as recorded, never re-sampled
        lo, hi = positive(arm.speedup_ci_low), positive(arm.speedup_ci_high)
        v = arm.verdict if lo is None or hi is None or (arm.verdict or "").startswith(("equivalent", "inconsistent")) \
            else verdict_of(lo, hi)
        return judged(arm, base, lo, hi, v, estimate=estimate if estimate is not None else arm.speedup,
                      min_detectable_ratio=arm.min_detectable_ratio, ci_level=arm.ci_level, ci_basis=arm.ci_basis)
    if positive(arm.speedup_ci_low) and positive(arm.speedup_ci_high):  # as measured (a record read back)
        lo, hi = float(arm.speedup_ci_low), float(arm.speedup_ci_high)  # type: ignore[arg-type]
        v = arm.verdict if arm.verdict and arm.verdict.startswith("equivalent") else verdict_of(lo, hi)
        return judged(arm, base, lo, hi, v, min_detectable_ratio=arm.min_detectable_ratio, ci_level=arm.ci_level,
                      ci_basis=arm.ci_basis)
    va = [v for v in arm.tok_s_values if positive(v)]
    vb = [v for v in base.tok_s_values if positive(v)]
    if len(va) < 2 or len(vb) < 2:
        return judged(arm, base, None, None, NO_SPREAD if positive(arm.tok_s) and positive(base.tok_s) else None)
    try:
        cmp = stat.compare_arms(va, vb, level=level, seed=seed)
    except SpectrialError as exc:  # pragma: no cover - inputs are filtered above
        return judged(arm, base, None, None, f"n/a ({exc})")
    return judged(arm, base, cmp.ci_low, cmp.ci_high, cmp.verdict, min_detectable_ratio=cmp.min_detectable_ratio,
                  ci_level=level, ci_basis="rates kept in the record")


def with_comparison(arm: ArmRecord, c: Comparison) -> ArmRecord:
    return arm.model_copy(update=dict(c))


def add_comparisons(arms: list[ArmRecord], requests: Sequence[RequestRecord] | None, level: float = 0.95,
                    seed: int = 0, base: ArmRecord | None = None, key: str = "arm",
                    intervals: Mapping[str, Mapping[str, Any]] | None = None, greedy: bool | None = None,
                    setting: validity.Setting | None = None) -> ArmRecord | None:
    """Compare every completed arm with the baseline (`base`, else `pick_baseline`), replacing the arms of the
    list by their compared copies; requests are grouped by their `key` field (an arm's name, or a sweep point's
    id); without requests, each arm's recorded interval is used (`compare`). With requests that kept their
    outputs and the run's `setting`, each speculative arm's outputs are first checked against the baseline's
    (`validity.lossless`: `greedy` sampling makes that possible), so that its verdict heeds the check. Returns the
    baseline."""
    base = base or pick_baseline(arms)
    by: dict[str, list[RequestRecord]] | None = None
    if requests is not None:
        by = {}
        for r in requests:
            by.setdefault(str(r.get(key)), []).append(r)
    for i, a in enumerate(arms):
        if base is None or a.status != "ok":
            arms[i] = with_comparison(a, Comparison())
            continue
        ident = getattr(a, "id", None) or a.name
        base_key = getattr(base, "id", None) or base.name
        mine = (by or {}).get(ident, [])
        if setting is not None and a is not base and not is_baseline(a) and any(r.output is not None for r in mine):
            check = validity.lossless(mine, (by or {}).get(base_key, []), greedy,
                                      bool(getattr(a, "synthetic", False) or getattr(a, "synthetic_accept", None) is not None),
                                      setting)
            a = a.model_copy(update={"validity": validity.with_check(a.validity, check)})
        c = compare(a, base, by, level, seed, key=ident, base_key=base_key,
                    interval=(intervals or {}).get(a.name))
        arms[i] = with_comparison(a, c)
        if a is base:
            base = arms[i]
    return base


# --- per category of the workload ---------------------------------------------------------------------------
def category_figures(requests: Sequence[RequestRecord], speculative: bool, level: float = 0.95,
                     seed: int = 0, windows: Sequence[tuple[str | None, WindowStats]] = ()) -> list[CategoryRecord]:
    """An arm's figures per workload category of its measured requests: decode rate (median, bootstrap CI),
    accept length = 1 + accepted / cycles summed over the category's requests (None unless every request reports
    its counts), cycle_ms = accept_len / tok_s x 1000 (the engine's per-request time / cycles apart), mean
    prompt tokens. A category measured in windows of its own (`windows`: (category, statistics) of each window;
    a context-length bucket) also gets the per-position acceptance of those windows (`merge_stats`), and their
    accept length where the requests carry no counts of their own (an engine with server-wide counters only).
    Empty when the requests span fewer than two categories."""
    ok = [r for r in requests if r.ok]
    cats = list(dict.fromkeys(str(r.category) for r in ok if r.category))
    if len(cats) < 2:
        return []
    out = []
    for cat in cats:
        mine = [r for r in ok if r.category == cat]
        rates = [v for r in mine if (v := decode_rate(r)) is not None]
        c = CategoryRecord(category=cat, sources=sorted({str(r.source) for r in mine if r.source}),
                           requests_ok=len(mine), tokens=float(sum(r.tokens for r in mine)), tok_s_values=rates,
                           tok_s=median(rates))
        plens = [r.prompt_len for r in mine if r.prompt_len]
        c.prompt_tokens = float(np.mean(plens)) if plens else None
        own = [st for wc, st in windows if wc == cat]
        merged = merge_stats(own) if own else None
        if len(rates) >= 2:
            ci = stat.bootstrap_ci(rates, level=level, seed=seed)
            c.tok_s_ci_low, c.tok_s_ci_high = ci.low, ci.high
        if not speculative:
            c.accept_len = 1.0
        else:
            counts = [request_cycles(r) for r in mine]
            if counts and all(x is not None for x in counts):
                c.accepted = sum(x[0] for x in counts)  # type: ignore[index]
                c.verify_steps = sum(x[1] for x in counts)  # type: ignore[index]
                c.accept_source = counts[0][2]  # type: ignore[index]
                lens = [1.0 + x[0] / x[1] for x in counts if x and x[1] > 0]  # type: ignore[index]
                c.accept_len_request_mean = float(np.mean(lens)) if lens else None
                if c.verify_steps:
                    c.accept_len = formulas.accept_len_from_counts(c.accepted, c.verify_steps)
                    ms = [r.server_predicted_ms for r in mine]
                    if all(x is not None and x > 0 for x in ms):
                        c.engine_cycle_ms = sum(x for x in ms if x is not None) / c.verify_steps
            if merged is not None:
                c.per_position = merged.per_position
                if c.accept_len is None and merged.verify_steps and merged.accepted is not None:
                    c.accepted, c.verify_steps = merged.accepted, merged.verify_steps
                    c.accept_source = f"{merged.source} (the category's own windows)"
                    c.accept_len = formulas.accept_len_from_counts(c.accepted, c.verify_steps)
        if c.accept_len and positive(c.tok_s):
            c.cycle_ms = c.accept_len / float(c.tok_s) * 1000.0  # type: ignore[arg-type]
        out.append(c)
    return out


def add_category_comparisons(arms: Sequence[ArmRecord], requests: Sequence[RequestRecord] | None,
                             level: float = 0.95, seed: int = 0, base: ArmRecord | None = None) -> None:
    """Compare each arm's categories with the baseline's same categories, in place (each category replaced by
    its compared copy): the same definitions as an arm's (`judged`), the interval from the two categories'
    request rates, else the one the record holds."""
    base = base or pick_baseline(arms)
    by: dict[tuple[str, str], list[RequestRecord]] = {}
    for r in requests or []:
        if r.category:
            by.setdefault((str(r.arm), str(r.category)), []).append(r)
    bcats = {c.category: c for c in (base.categories if base is not None else [])}
    for a in arms:
        new = []
        for c in a.categories:
            b = bcats.get(c.category)
            if base is None or b is None or a.name == base.name or a.status != "ok":
                new.append(c.model_copy(update=dict(Comparison())))
                continue
            if requests is not None:
                cmp = compare_requests(by.get((a.name, c.category), []), by.get((base.name, c.category), []),
                                       level, seed)
                cc = judged(c, b, None, None, TOO_FEW) if cmp is None else \
                    judged(c, b, cmp.ci_low, cmp.ci_high, cmp.verdict, ci_level=level, ci_basis="requests")
            elif positive(c.speedup_ci_low) and positive(c.speedup_ci_high):
                cc = judged(c, b, c.speedup_ci_low, c.speedup_ci_high, verdict_of(c.speedup_ci_low, c.speedup_ci_high),
                            ci_level=c.ci_level, ci_basis=c.ci_basis)
            else:
                cc = judged(c, b, None, None, c.verdict or NO_SPREAD)
            new.append(c.model_copy(update={**dict(cc), "baseline_arm": base.name}))
        a.categories = new


CATEGORY_COLUMNS = ["arm", "category", "sources", "requests_ok", "tok_s", "tok_s_ci_low", "tok_s_ci_high",
                    "accept_len", "accept_len_request_mean", "break_even_accept_len", "pays", "speedup",
                    "speedup_ci_low", "speedup_ci_high",
                    "verdict"]


def accept_table(arms: Sequence[ArmRecord]) -> pd.DataFrame:
    """Accept length per speculative arm, token-weighted (the counters: 1 + accepted / verify steps over every
    request) beside the per-request mean and spread (each request weighs the same: a token-weighted figure leans
    towards the longest completions)."""
    rows = [{"arm": a.name, "accept len (token-weighted)": a.accept_len,
             "per-request mean": a.accept_len_request_mean, "p10": a.accept_len_request_p10,
             "p50": a.accept_len_request_p50, "p90": a.accept_len_request_p90, "requests": a.accept_len_request_n,
             "counted from": a.accept_len_request_source}
            for a in arms if a.speculative and a.status == "ok" and a.accept_len_request_n]
    return pd.DataFrame(rows)


def category_table(arms: Sequence[ArmRecord]) -> pd.DataFrame:
    """One row per arm and workload category (columns CATEGORY_COLUMNS); empty when no arm has categories."""
    rows = [{"arm": a.name, **{k: getattr(c, k) for k in CATEGORY_COLUMNS[1:]}} for a in arms for c in a.categories]
    for r in rows:
        r["sources"] = ", ".join(r["sources"])
    return pd.DataFrame(rows, columns=CATEGORY_COLUMNS)


# --- hand-made records and old ones -------------------------------------------------------------------------
def fill_derived(arm: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a hand-made arm (the seed case: no counters) with what its recorded figures imply filled in,
    and a ``derived`` note per field. Baselines: accept_len = 1. Speculative arms: cycle_ms = verify_ms /
    verify_share, else accept_len / tok_s x 1000 (the decode rate's clock), else verify_ms as a lower bound;
    accept_len = tok_s x cycle_ms / 1000 (only from a cycle that is not a lower bound). Recorded values are
    never replaced; ms_per_token is always 1000 / tok_s."""
    out = dict(arm)
    notes: dict[str, str] = dict(arm.get("derived") or {})
    tok_s = positive(arm.get("tok_s"))
    out["ms_per_token"] = formulas.ms_per_token(tok_s) if tok_s else None
    if str(arm.get("method") or "none") == "none":
        out["cycle_ms"] = out["ms_per_token"]
        if out.get("accept_len") is None:
            out["accept_len"] = 1.0
        out["derived"] = notes
        return out
    verify, share, accept = finite(arm.get("verify_ms")), finite(arm.get("verify_share")), finite(arm.get("accept_len"))
    lower_bound = False
    if finite(arm.get("cycle_ms")) is None:
        if verify and share and 0 < share <= 1:
            out["cycle_ms"] = verify / share
            notes["cycle_ms"] = "verify_ms / verify_share"
        elif accept and accept >= 1 and tok_s:
            out["cycle_ms"] = accept / tok_s * 1000.0  # the decode rate's clock
            notes["cycle_ms"] = "accept_len / tok_s x 1000"
        elif verify:
            out["cycle_ms"] = verify
            notes["cycle_ms"] = "verify_ms only (share unrecorded): a lower bound"
            lower_bound = True
    cycle = finite(out.get("cycle_ms"))
    if accept is None and tok_s and cycle and not lower_bound:
        out["accept_len"] = tok_s * cycle / 1000.0
        notes["accept_len"] = "tok_s x cycle_ms / 1000"
    out["derived"] = notes
    return out


def filled(arm: ArmRecord) -> ArmRecord:
    """A completed hand-made arm with `fill_derived` applied (others unchanged)."""
    if arm.status != "ok" or arm.decode_ms is not None or arm.verify_steps is not None:
        return arm
    return type(arm).model_validate(fill_derived(arm.model_dump()))


def rederive(m: Manifest) -> Manifest:
    """Every figure of a record that follows from what it measured, recomputed with the definitions above (the
    migration of records written before schema 3, and of a decide run's whose speed-up was not yet the sequence's
    estimate): derived figures of every arm and point, comparisons against their baselines (the intervals they
    hold; a decide run's arm keeps its sequence's pair), categories, a sweep's best rows. Returns a new manifest."""
    arms = [_rederive_arm(a) for a in m.arms]
    est = decide_estimates(m)
    if arms and not m.points:
        refs = [reference(a, arms) for a in arms]
        for i, (a, ref) in enumerate(zip(arms, refs, strict=True)):
            arms[i] = with_comparison(a, compare(a, ref, estimate=est.get(a.name))
                                      if ref is not None and a.status == "ok" else
                                      Comparison(verdict=NO_BASELINE if a.status == "ok" else None))
        for ref in {r.name: r for r in refs if r is not None}.values():
            group = [a for a, r in zip(arms, refs, strict=True) if r is not None and r.name == ref.name]
            add_category_comparisons(group, None, base=next(a for a in arms if a.name == ref.name))
    points = [_rederive_arm(p) for p in m.points]
    by_id = {p.id: p for p in points}
    for i, p in enumerate(points):
        base = by_id.get(p.baseline or "") if isinstance(p, PointRecord) else None
        if base is not None and p.status == "ok":
            points[i] = with_comparison(p, compare(p, base))
        elif p.method == "none" and p.status == "ok":
            points[i] = with_comparison(p, compare(p, p))
    if points:
        by_id = {p.id: p for p in points}
        arms = [by_id.get(getattr(a, "id", ""), a) for a in arms]
    best = []
    for row in m.best:
        p = by_id.get(f"{row.best}@{Load(row.concurrency, row.offered_rate).id}") if row.best and points else None
        if p is not None:
            row = row.model_copy(update={"speedup": p.speedup, "speedup_ci_low": p.speedup_ci_low,
                                         "speedup_ci_high": p.speedup_ci_high, "vs_baseline": p.verdict})
        best.append(row)
    return m.model_copy(update={"arms": arms, "points": points, "best": best})


def _rederive_arm(a: ArmRecord) -> ArmRecord:
    if a.status != "ok":
        return a
    if a.decode_ms is None and a.verify_steps is None and a.stats_source is None:  # hand-made
        return filled(a)
    k = a.steps if isinstance(a.steps, int) else None
    a = with_figures(a, derived_figures(a.figures(), a.speculative, k, a.synthetic_accept))
    a.categories = [c.model_copy(update={"cycle_ms": c.accept_len / c.tok_s * 1000.0
                                         if positive(c.accept_len) and positive(c.tok_s) else None})
                    for c in a.categories]
    return a
