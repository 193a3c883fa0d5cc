"""The verify cycle itself: an accept length below the break-even, with the per-token acceptance each depth would
need to win. Break-even, speed-up and the acceptance needed come from `spectrial.analysis.figures` and
`spectrial.readers.explain` (its "Acceptance needed" section), never recomputed here."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pandas as pd

from spectrial.analysis import figures
from spectrial.readers.diagnose.common import PINNED, f2, log, rec
from spectrial.readers.diagnose.context import Context, LogFile, number
from spectrial.readers.diagnose.model import Evidence, Finding
from spectrial.readers.diagnose.registry import detector
from spectrial.readers.explain import Explanation, explain
from spectrial.schema import ArmRecord

_filled = figures.filled  # hand-made records carry verify time and share instead of a cycle


def _groups(arms: Sequence[tuple[str, ArmRecord]]) -> list[list[tuple[str, ArmRecord]]]:
    """Arms that share one baseline: the same session and load level (concurrency, and a sweep's request rate)."""
    out: dict[tuple[Any, Any, Any], list[tuple[str, ArmRecord]]] = {}
    for p, a in arms:
        out.setdefault((a.session, a.get("concurrency"), a.get("offered_rate")), []).append((p, a))
    return list(out.values())


def needed(ex: Explanation, arm: ArmRecord) -> tuple[dict[int, float | None], str]:
    """Per depth k, the per-token acceptance that reaches the baseline for `arm`'s cycle (None: out of reach even at
    alpha = 1), from explain's "Acceptance needed" table, and the basis (fitted model or measured cycle)."""
    try:
        table = ex.section("Acceptance needed").table
    except KeyError:
        return {}, ""
    if table is None or table.empty or "alpha_break_even" not in table:
        return {}, ""
    model = next((key for key, fit in ex.numbers.models.items() if arm.name in fit.fitted_on), None)
    rows = table[table["source"] == model] if model else table.iloc[0:0]
    if rows.empty:
        rows = table[table["source"] == arm.name]
    if rows.empty:
        return {}, ""
    alphas = {int(k): (None if pd.isna(v) else float(v)) for k, v in zip(rows["k"], rows["alpha_break_even"],
                                                                         strict=True)}
    return alphas, str(rows["basis"].iloc[0])


def _alpha_text(alphas: dict[int, float | None], k: int | None) -> str:
    parts = [f"k={d}: {'out of reach' if a is None else f'{a:.2f}'}" for d, a in sorted(alphas.items())
             if d <= max(8, k or 0)]
    return ", ".join(parts)


def _pinned(a: ArmRecord) -> bool:
    al = number(a.accept_len)
    return (number(a.drafted) or 0) > 0 and number(a.accepted) == 0 or (al is not None and al <= PINNED)


def _arm_finding(ex: Explanation, path: str, arm: ArmRecord, base: ArmRecord, base_where: str) -> Finding | None:
    """An arm whose accept length is below its break-even (= its speed-up below 1, the same figures): critical when
    its verdict is slower (or a single measurement that cannot say otherwise), a warning when the difference is
    within the noise, info for a forced-acceptance what-if."""
    be = number(arm.break_even_accept_len)
    accept = number(arm.accept_len)
    if be is None or accept is None or accept >= be or _pinned(arm):
        return None
    sp = number(arm.speedup)
    base_ms = number(ex.numbers.baseline_ms_per_token)
    cycle = number(figures.verdict_cycle_ms(arm))  # the verdict's clock: be x the baseline's ms per token
    k = int(arm.steps) if number(arm.steps) else None
    alphas, basis = needed(ex, arm)
    recorded = number(arm.cycle_ms)  # the evidence is the record's field: its cycle where that is the verdict's
    same = cycle is not None and recorded is not None and abs(cycle - recorded) <= 1e-9 * recorded
    ev = [rec(f"{path}.accept_len", accept), rec(f"{path}.cycle_ms", recorded) if same else
          rec(f"{path}.break_even_accept_len", be), rec(base_where, base.tok_s)]
    parts = [f"A cycle takes {f2(cycle)} ms, the time of {be:.2f} baseline tokens ({f2(base_ms, 3)} ms each at "
             f"{f2(base.tok_s, 1)} tok/s); it commits {accept:.2f}"]
    derived = arm.derived or {}
    if derived:
        parts[-1] += " (" + "; ".join(f"{kk} = {vv}" for kk, vv in derived.items()) + ")"
    verify, share = number(arm.verify_ms), number(arm.verify_share)
    if verify and base_ms:
        parts.append(f"the verify pass alone takes {verify:g} ms = {verify / base_ms:.2f} baseline decode steps"
                     + (f" ({share:.0%} of the cycle)" if share else "") + (f", to check {k + 1} tokens" if k else "")
                     + ": verifying, not drafting, is the wall")
        ev.append(rec(f"{path}.verify_ms", verify))
    draft = number(arm.draft_ms_per_cycle)
    if draft is not None and cycle:
        parts.append(f"drafting takes {draft:.2f} ms ({draft / cycle:.0%} of the cycle)")
        ev.append(rec(f"{path}.draft_ms_per_cycle", draft))
    if k and alphas:
        need = alphas.get(k)
        measured = number(arm.alpha) if arm.alpha_source == "from accept length" else \
            figures.alpha_of(accept, k)[0] if 1 < accept <= k + 1 else None
        parts.append((f"at k={k} no acceptance breaks even at this cycle: even with every drafted token "
                      f"accepted (alpha = 1) it commits too few" if need is None else
                      f"to break even at k={k} each drafted token must be accepted with probability "
                      f"alpha >= {need:.2f}")
                     + (f" (measured {measured:.2f})" if measured is not None else "")
                     + f"; by depth ({basis}): {_alpha_text(alphas, k)}")
    syn = arm.synthetic_accept is not None or arm.synthetic
    ci = f" [{arm.speedup_ci_low:.2f}, {arm.speedup_ci_high:.2f}]" if arm.speedup_ci_low and arm.speedup_ci_high \
        else ""
    undecided = arm.pays == "undecided"
    if undecided:
        parts.append(f"the speed-up {sp:.2f}x{ci} is {arm.verdict}: it may not be slower at all; measure more "
                     "(more starts, or `decide: true`) before acting on it")
    return Finding(
        kind="below_break_even", severity="info" if syn else "warning" if undecided else "critical", arm=arm.name,
        title=f"{arm.name}: accept length {accept:.2f} below the break-even {be:.2f}"
              + (f" ({sp:.2f}x{ci} the baseline, {arm.verdict})" if sp is not None and arm.verdict else
                 f" ({sp:.2f}x the baseline)" if sp is not None else "")
              + (": a what-if at forced acceptance" if syn else ""),
        detail="; ".join(parts) + ".",
        evidence=ev,
        fix=_fix(OTHERS))


OTHERS = "{others}"  # filled by `name_causes` once every detector has run
# what can make the verify pass (or the cycle) cost several decode steps: the findings of these kinds
CYCLE_KINDS = ("cuda_graph", "running_cap", "tree_at_batch", "env_not_in_effect", "debug_switches", "throttling",
               "draft_tp")


def _fix(causes: str) -> str:
    return (f"Either shorten the cycle ({causes}) or raise acceptance (a draft trained on the target's outputs for "
            "this workload, a depth k where the needed alpha is within reach); 'Acceptance needed' in the analysis "
            "lists alpha per depth.")


def name_causes(findings: list[Finding]) -> None:
    """Fill the break-even fix with what the other findings say makes the cycle long (their numbers in the ranked
    list), or, when none did, with what to measure instead: never 'the other findings' when there are none."""
    causes = [(i, f) for i, f in enumerate(findings, 1) if f.kind in CYCLE_KINDS and f.severity != "info"]
    if causes:
        text = ("what makes the verify pass cost several decode steps: finding" + ("s " if len(causes) > 1 else " ")
                + ", ".join(f"{i} ({f.kind})" for i, f in causes))
    else:
        text = ("no other check found what makes the verify pass cost several decode steps: profile one cycle "
                "(draft steps vs the verify pass, each against a baseline decode step) to see where the time goes")
    for f in findings:
        if f.kind == "below_break_even" and OTHERS in f.fix:
            f.fix = f.fix.replace(OTHERS, text)


def _record(ctx: Context) -> Iterator[Finding]:
    m = ctx.manifest
    assert m is not None
    arms = [(p, _filled(a)) for p, a in ctx.arms]
    for group in _groups(arms):
        spec = [(p, a) for p, a in group if a.status == "ok" and not figures.is_baseline(a)]
        if not spec:
            continue
        ex = explain(m.model_copy(update={"arms": [a for _, a in group]}))
        for p, a in spec:
            base = next((b for _, b in group if b.name == a.baseline_arm), None) or \
                figures.pick_baseline([b for _, b in group])
            if base is None:
                continue
            f = _arm_finding(ex, p, a, base, next(pp for pp, aa in group if aa is base) + ".tok_s")
            if f is not None:
                yield f


# ------------------------------------------------------------------ result tables in logs
def _table_arms(lf: LogFile) -> dict[float, list[tuple[ArmRecord, int]]]:
    """Rows of a results table (SpecForge / SGLang bench_eagle3) or mtbench output as arms, per batch size:
    per-request throughput, cycle = accept length / per-request throughput (the inverse of
    analysis.spec_throughput)."""
    out: dict[float, list[tuple[ArmRecord, int]]] = {}
    for kind in ("results_table", "bench_mtbench"):
        df = lf.rows(kind)
        for r in df.to_dict("records") if not df.empty else []:
            tput, al = number(r.get("gen_throughput")), number(r.get("accept_len"))
            bs = number(r.get("batch_size")) or 1.0
            steps, topk = number(r.get("steps")) or 0, number(r.get("topk")) or 0
            if not tput:
                continue
            per_req = tput / bs
            if not steps and (al is None or al <= 1.0) and "EAGLE" not in str(r.get("label", "")).upper():
                a = ArmRecord(name=f"baseline bs={bs:g}", method="none", status="ok", tok_s=per_req)
            elif al:
                label = r.get("label") or f"steps={steps:g} topk={topk:g} draft={number(r.get('num_draft_tokens')) or 0:g}"
                a = ArmRecord(name=f"{label} bs={bs:g}", method="eagle3", status="ok", tok_s=per_req, accept_len=al,
                              steps=int(steps) if steps and topk <= 1 else None, topk=int(topk) or None,
                              cycle_ms=al / per_req * 1000.0)  # inverse of analysis.spec_throughput
            else:
                continue
            out.setdefault(bs, []).append((a, int(r["line"])))
    return out


def _table(lf: LogFile) -> Iterator[Finding]:
    losers: list[tuple[Finding, float]] = []
    for _, rows in sorted(_table_arms(lf).items()):
        arms = [a for a, _ in rows]
        base = figures.add_comparisons(arms, None)  # one value per row: judged without an interval
        if base is None or len(arms) < 2:
            continue
        rows = list(zip(arms, [n for _, n in rows], strict=True))
        ex = explain(arms)
        lines = {a.name: n for a, n in rows}
        for a, n in rows:
            if figures.is_baseline(a):
                continue
            f = _arm_finding(ex, f"{lf.label}:{n}", a, base, f"{lf.label}:{lines[base.name]}")
            if f is not None:
                f.evidence = [log(lf, n), log(lf, lines[base.name])]
                losers.append((f, number(a.accept_len) / number(a.break_even_accept_len)))  # type: ignore[operator]
    if not losers:
        return
    losers.sort(key=lambda x: -x[1])
    best = losers[0][0]
    ev: list[Evidence] = list(dict.fromkeys([e for f, _ in losers[:3] for e in f.evidence]))
    yield Finding(kind="below_break_even", severity="critical", arm=None,
                  title=f"{lf.label}: {len(losers)} speculative configuration(s) commit fewer tokens per cycle than "
                        f"the break-even (closest: {best.title})",
                  detail=best.detail, evidence=ev[:5], fix=best.fix)


@detector("below_break_even", 13, "seed-case", "llamacpp#24508", "vllm#16937", "angelslim#163")
def below_break_even(ctx: Context) -> Iterator[Finding]:
    """The verify cycle: accept length below the break-even, with the per-token acceptance each depth would need."""
    if ctx.manifest is not None and ctx.arms:
        yield from _record(ctx)
    for lf in ctx.logs:
        if lf.arm is None:
            yield from _table(lf)
