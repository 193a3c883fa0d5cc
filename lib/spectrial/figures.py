"""One place per figure: an arm's figures, the baseline, break-even, speed-up with its CI, the verdict.

Trials, sweeps, explain, history, drift, narrative and the notebooks all take these numbers from here.

    arm figures       tok/s = median over requests of the server-reported decode rate (client rate when the
                      server reports none), IQR, bootstrap CI (two-level: starts, then requests, when an arm
                      has several starts); accept length = 1 + accepted / verify steps; cycle = decode time /
                      verify steps (spectrial.analysis)
    baseline          the first completed arm with method "none" (or the one named)
    break-even        cycle time / baseline time per token: the accept length a cycle must commit to pay
    speed-up          tok/s / baseline tok/s, CI and verdict (faster, slower, not distinguishable) from
                      analysis.compare_arms over the two arms' request rates
    per category      the same over the requests of one workload category (chat, code, ...): tok/s, accept
                      length from the engine's per-request counts (`request_cycles`), speed-up and verdict
                      against the baseline's requests of that category; the break-even line is the arm's (a
                      cycle costs about the same whatever the prompt; what changes is how much it commits);
                      a category whose per-request times give its own cycle time is judged against its own
                      line (that cycle time / the baseline's time per token on the same category)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from spectrial import analysis
from spectrial.errors import SpectrialError
from spectrial.records import finite
from spectrial.schema import ArmRecord, CategoryRecord, Comparison, RequestRecord, WindowStats


def median(values: Iterable[Any]) -> float | None:
    """Median of the finite numbers among `values` (None when there are none)."""
    vals = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)]
    return statistics.median(vals) if vals else None


def request_rate(r: RequestRecord, use_server: bool) -> float | None:
    """A request's decode rate: the server's own (`server_predicted_per_second`) or the client's."""
    v = r.get("server_predicted_per_second") if use_server else r.client_tok_s
    return float(v) if v else None


def rate_requests(requests: Sequence[RequestRecord]) -> str:
    """Set `tok_s` on every successful request (server rates when all have one); returns the source."""
    ok = [r for r in requests if r.ok]
    use_server = bool(ok) and all(r.get("server_predicted_per_second") for r in ok)
    for r in ok:
        r.tok_s = request_rate(r, use_server)
    return "server" if use_server else "client"


def merge_stats(stats: Sequence[WindowStats]) -> WindowStats:
    """Counters of several windows of one arm (or point), summed; per-position rates weighted by verify steps."""
    out = WindowStats(source=",".join(sorted({s.source for s in stats})) or "none",
                      scoped=all(s.scoped for s in stats) if stats else False)

    def total(name: str) -> float | None:
        vals = [getattr(s, name) for s in stats]
        return None if not vals or any(v is None for v in vals) else float(sum(vals))

    for name in ("verify_steps", "drafted", "accepted", "tokens", "decode_ms", "draft_ms"):
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
        n = sum(x["drafts"] for x in logs)
        k = min(len(x["per_position"]) for x in logs)
        out.cross_checks["log"] = {
            "source": "; ".join(x["source"] for x in logs), "drafts": n,
            "accept_len": sum(x["accept_len"] * x["drafts"] for x in logs) / n,
            "per_position": [sum(x["per_position"][i] * x["drafts"] for x in logs) / n for i in range(k)]}
    return out


def arm_figures(requests: Sequence[RequestRecord], stats: WindowStats, speculative: bool,
                level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """Headline figures of one arm from its measured requests (all starts) and its scoped counters: the
    fields of `ArmRecord` from `requests_ok` to `draft_ms_per_cycle`."""
    ok = [r for r in requests if r.ok]
    source = rate_requests(requests)
    rated = [r for r in ok if r.tok_s]
    rates = [float(r.tok_s) for r in rated]  # type: ignore[arg-type]
    out: dict[str, Any] = {"requests_ok": len(ok), "requests_failed": len(requests) - len(ok),
                           "tok_s_source": source, "tok_s_values": rates}
    if rates:
        s = analysis.summarize(rates)
        out.update(tok_s=s["median"], tok_s_q1=s["q1"], tok_s_q3=s["q3"], tok_s_iqr=s["iqr"], tok_s_min=s["min"],
                   tok_s_max=s["max"], tok_s_cv=s["cv"])
        starts = {r.restart for r in rated}
        ci = None
        if len(starts) > 1:
            df = pd.DataFrame({"restart": [r.restart for r in rated], "tok_s": rates})
            ci = analysis.bootstrap_ci_two_level(df, "restart", "tok_s", level=level, seed=seed)
            spread = analysis.two_level_spread(df, "restart", "tok_s")
            out.update(cv_within_start=spread.within_cv, cv_between_starts=spread.between_cv,
                       cv_between_expected=spread.expected_between_cv,
                       start_medians=[float(x) for x in spread.group_medians])
        elif len(rates) >= 2:
            ci = analysis.bootstrap_ci(rates, level=level, seed=seed)
            out.update(cv_within_start=s["cv"], cv_between_starts=None)
        if ci is not None:
            out.update(tok_s_ci_low=ci.low, tok_s_ci_high=ci.high, ci_level=level)
    out["client_tok_s"] = median(r.client_tok_s for r in ok)
    out["ttft_ms"] = median(r.ttft_ms for r in ok)
    out["itl_ms"] = median(r.itl_ms_median for r in ok)
    drafted = stats.drafted if stats.drafted is not None else sum(r.get("server_draft_n", 0) for r in ok)
    accepted = stats.accepted if stats.accepted is not None else sum(r.get("server_draft_n_accepted", 0) for r in ok)
    tokens = stats.tokens if stats.tokens else sum(r.tokens or 0 for r in ok)
    decode_ms = stats.decode_ms if stats.decode_ms else sum(r.get("server_predicted_ms", 0) for r in ok) or None
    out.update(drafted=drafted, accepted=accepted, tokens=tokens, decode_ms=decode_ms,
               verify_steps=stats.verify_steps, per_position=stats.per_position, stats_source=stats.source,
               stats_scoped=stats.scoped, stats_notes=stats.notes, cross_checks=stats.cross_checks)
    out["ms_per_token"] = decode_ms / tokens if decode_ms and tokens else None
    if speculative:
        steps = stats.verify_steps
        out["accept_rate"] = accepted / drafted if drafted else None
        out["accept_len"] = analysis.accept_len_from_counts(accepted, steps) if steps and accepted is not None \
            else stats.accept_len
        out["cycle_ms"] = analysis.cycle_ms_from(decode_ms, steps) if steps and decode_ms else None
        out["draft_ms_per_cycle"] = stats.draft_ms / steps if stats.draft_ms is not None and steps else None
    else:
        out.update(accept_rate=None, accept_len=1.0, cycle_ms=out["ms_per_token"], draft_ms_per_cycle=None)
    return out


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


def positive(x: Any) -> float | None:
    """x as a finite float > 0, else None (None, bools, text, NaN, inf and x <= 0 give None)."""
    v = finite(x)
    return v if v is not None and v > 0 else None


def base_ms_per_token(base: ArmRecord) -> float | None:
    """The baseline's time per token: recorded, else 1000 / tok/s."""
    return positive(base.ms_per_token) or (analysis.ms_per_token(base.tok_s) if positive(base.tok_s) else None)


def break_even(arm: ArmRecord, base: ArmRecord) -> float | None:
    """Break-even accept length of `arm`: its cycle time / the baseline's time per token."""
    ms = base_ms_per_token(base)
    return analysis.break_even_accept_len(arm.cycle_ms, ms) if positive(arm.cycle_ms) and ms else None


def speedup(arm: ArmRecord, base: ArmRecord) -> float | None:
    return arm.tok_s / base.tok_s if positive(arm.tok_s) and positive(base.tok_s) else None  # type: ignore[operator]


def _frame(requests: Sequence[RequestRecord]) -> pd.DataFrame:
    return pd.DataFrame({"restart": [r.restart for r in requests if r.tok_s],
                         "tok_s": [float(r.tok_s) for r in requests if r.tok_s]})  # type: ignore[arg-type]


def compare_requests(a: Sequence[RequestRecord], b: Sequence[RequestRecord], level: float = 0.95,
                     seed: int = 0) -> analysis.Comparison | None:
    """Ratio of `a`'s to `b`'s median rate with its bootstrap CI (two-level over starts when both have
    several), or None with fewer than two rated requests on a side."""
    fa, fb = _frame(a), _frame(b)
    if len(fa) < 2 or len(fb) < 2:
        return None
    if fa["restart"].nunique() > 1 and fb["restart"].nunique() > 1:
        return analysis.compare_arms(fa, fb, level=level, seed=seed, group_col="restart", value_col="tok_s")
    return analysis.compare_arms(fa["tok_s"].to_numpy(), fb["tok_s"].to_numpy(), level=level, seed=seed)


def compare(arm: ArmRecord, base: ArmRecord, requests: dict[str, Sequence[RequestRecord]] | None = None,
            level: float = 0.95, seed: int = 0, key: str | None = None, base_key: str | None = None) -> Comparison:
    """`arm` against `base`: break-even, speed-up, and with their requests (`requests[key]`, keys default to
    the arms' names) the speed-up's CI and the verdict; without requests, a verdict from the recorded rates."""
    c = Comparison(baseline_arm=base.name, break_even_accept_len=break_even(arm, base), speedup=speedup(arm, base))
    if arm is base:
        return c
    ra = (requests or {}).get(key or arm.name)
    rb = (requests or {}).get(base_key or base.name)
    if requests is not None:
        cmp = compare_requests(ra or [], rb or [], level, seed)
        if cmp is None:
            c.verdict = "not enough requests for a confidence interval"
            return c
        two = _frame(ra or [])["restart"].nunique() > 1 and _frame(rb or [])["restart"].nunique() > 1
        c.speedup_ci_low, c.speedup_ci_high, c.verdict = cmp.ci_low, cmp.ci_high, cmp.verdict
        c.min_detectable_ratio, c.ci_level = cmp.min_detectable_ratio, level
        c.ci_basis = "restarts then requests" if two else "requests of one start"
        return c
    c.verdict = arm.verdict or recorded_verdict(arm, base)
    return c


def recorded_verdict(arm: ArmRecord, base: ArmRecord) -> str:
    """A verdict from the rates a record kept (tok_s_values) when its requests are not at hand."""
    va = [v for v in arm.tok_s_values if positive(v)]
    vb = [v for v in base.tok_s_values if positive(v)]
    if len(va) < 2 or len(vb) < 2:
        return "single value: no spread"
    try:
        return analysis.compare_arms(va, vb, seed=0).verdict
    except SpectrialError as exc:  # pragma: no cover - inputs are filtered above
        return f"n/a ({exc})"


def add_comparisons(arms: Sequence[ArmRecord], requests: Sequence[RequestRecord], level: float = 0.95,
                    seed: int = 0, base: ArmRecord | None = None, key: str = "arm") -> ArmRecord | None:
    """Compare every completed arm with the baseline (`base`, else `pick_baseline`), in place; requests are
    grouped by their `key` field (an arm's name, or a sweep point's id). Returns the baseline."""
    base = base or pick_baseline(arms)
    by: dict[str, list[RequestRecord]] = {}
    for r in requests:
        if r.tok_s:
            by.setdefault(str(r.get(key)), []).append(r)
    for a in arms:
        for f in Comparison.model_fields:
            setattr(a, f, None)
        if base is None or a.status != "ok":
            continue
        ident = getattr(a, "id", None) or a.name
        c = compare(a, base, by, level, seed, key=ident, base_key=getattr(base, "id", None) or base.name)
        for f in Comparison.model_fields:
            setattr(a, f, getattr(c, f))
    return base


# --- per category of the workload ---------------------------------------------------------------------------
def request_cycles(r: RequestRecord) -> tuple[float, float, str] | None:
    """(accepted draft tokens, verify cycles, how) of one request, from the engine's per-request figures:
    SGLang's meta_info spec_verify_ct (accepted = decoded - cycles), vLLM's counters read around the request
    (server_verify_steps, server_draft_n_accepted), llama.cpp's timings draft_n_accepted (cycles = decoded -
    accepted: each cycle commits its accepted tokens plus one). None when the engine reports none."""
    decoded = float(r.get("server_predicted_n") or r.tokens or 0) - 1
    verify = r.get("server_spec_verify_ct")
    if isinstance(verify, int | float) and verify > 0:
        return max(decoded - float(verify), 0.0), float(verify), "meta_info spec_verify_ct"
    acc = r.get("server_draft_n_accepted")
    if not isinstance(acc, int | float) or isinstance(acc, bool):
        return None
    steps = r.get("server_verify_steps")
    if isinstance(steps, int | float) and steps > 0:
        return float(acc), float(steps), "counters around each request"
    if decoded > acc:
        return float(acc), decoded - float(acc), "timings draft_n_accepted (cycles = decoded - accepted)"
    return None


def category_figures(requests: Sequence[RequestRecord], speculative: bool, level: float = 0.95,
                     seed: int = 0) -> list[CategoryRecord]:
    """An arm's figures per workload category of its measured requests (rates as `rate_requests` set them):
    tok/s (median, bootstrap CI), accept length = 1 + accepted / cycles summed over the category's requests
    (None unless every request reports its counts), cycle time = their decode time / cycles. Empty when the
    requests span fewer than two categories."""
    ok = [r for r in requests if r.ok]
    cats = list(dict.fromkeys(str(r.category) for r in ok if r.category))
    if len(cats) < 2:
        return []
    out = []
    for cat in cats:
        mine = [r for r in ok if r.category == cat]
        rates = [float(r.tok_s) for r in mine if r.tok_s]  # type: ignore[arg-type]
        c = CategoryRecord(category=cat, sources=sorted({str(r.source) for r in mine if r.source}),
                           requests_ok=len(mine), tokens=float(sum(r.tokens for r in mine)), tok_s_values=rates,
                           tok_s=median(rates))
        if len(rates) >= 2:
            ci = analysis.bootstrap_ci(rates, level=level, seed=seed)
            c.tok_s_ci_low, c.tok_s_ci_high = ci.low, ci.high
        if not speculative:
            c.accept_len = 1.0
        else:
            counts = [request_cycles(r) for r in mine]
            if counts and all(x is not None for x in counts):
                c.accepted = sum(x[0] for x in counts)  # type: ignore[index]
                c.verify_steps = sum(x[1] for x in counts)  # type: ignore[index]
                c.accept_source = counts[0][2]  # type: ignore[index]
                if c.verify_steps:
                    c.accept_len = analysis.accept_len_from_counts(c.accepted, c.verify_steps)
                    ms = [r.get("server_predicted_ms") for r in mine]
                    if all(isinstance(x, int | float) and x > 0 for x in ms):
                        c.cycle_ms = sum(ms) / c.verify_steps
        out.append(c)
    return out


def add_category_comparisons(arms: Sequence[ArmRecord], requests: Sequence[RequestRecord], level: float = 0.95,
                             seed: int = 0, base: ArmRecord | None = None) -> None:
    """Compare each arm's categories with the baseline's same categories, in place: speed-up with its CI and
    verdict (`compare_requests` over the two categories' request rates), the arm's break-even, the category's
    own, and whether its accept length clears its line (`category_line`)."""
    base = base or pick_baseline(arms)
    by: dict[tuple[str, str], list[RequestRecord]] = {}
    for r in requests:
        if r.tok_s and r.category:
            by.setdefault((str(r.arm), str(r.category)), []).append(r)
    bcats = {c.category: c for c in (base.categories if base is not None else [])}
    for a in arms:
        for c in a.categories:
            for f in ("baseline_tok_s", "speedup", "speedup_ci_low", "speedup_ci_high", "verdict",
                      "break_even_accept_len", "break_even_own", "pays"):
                setattr(c, f, None)
            b = bcats.get(c.category)
            if base is None or b is None or a is base or a.status != "ok":
                continue
            c.baseline_tok_s = b.tok_s
            c.speedup = c.tok_s / b.tok_s if positive(c.tok_s) and positive(b.tok_s) else None  # type: ignore[operator]
            cmp = compare_requests(by.get((a.name, c.category), []), by.get((base.name, c.category), []), level, seed)
            if cmp is None:
                c.verdict = "not enough requests for a confidence interval"
            else:
                c.speedup_ci_low, c.speedup_ci_high, c.verdict = cmp.ci_low, cmp.ci_high, cmp.verdict
            c.break_even_accept_len = a.break_even_accept_len
            if positive(c.cycle_ms) and positive(b.tok_s):
                c.break_even_own = analysis.break_even_accept_len(c.cycle_ms, analysis.ms_per_token(b.tok_s))
            line = category_line(c)
            if line is not None and c.accept_len is not None:
                c.pays = c.accept_len > line


def category_line(c: CategoryRecord) -> float | None:
    """The break-even a category is judged against: its own (its cycles' time over the baseline's time per token
    on the same category: longer prompts slow both) where the per-request times give it, else the arm's."""
    return c.break_even_own if c.break_even_own is not None else c.break_even_accept_len


CATEGORY_COLUMNS = ["arm", "category", "sources", "requests_ok", "tok_s", "tok_s_ci_low", "tok_s_ci_high",
                    "accept_len", "cycle_ms", "break_even_accept_len", "break_even_own", "pays", "speedup",
                    "speedup_ci_low",
                    "speedup_ci_high", "verdict"]


def category_table(arms: Sequence[ArmRecord]) -> pd.DataFrame:
    """One row per arm and workload category (columns CATEGORY_COLUMNS); empty when no arm has categories."""
    rows = [{"arm": a.name, **{k: getattr(c, k) for k in CATEGORY_COLUMNS[1:]}} for a in arms for c in a.categories]
    for r in rows:
        r["sources"] = ", ".join(r["sources"])
    return pd.DataFrame(rows, columns=CATEGORY_COLUMNS)
