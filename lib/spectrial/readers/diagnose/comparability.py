"""Detectors about what a number is compared with: a stale or drifted baseline, and results that cannot be
compared (another session, launch, environment or machine state)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from spectrial.analysis import figures
from spectrial.readers.diagnose.common import f2, names, one, rec
from spectrial.readers.diagnose.context import Context, number
from spectrial.readers.diagnose.model import Evidence, Finding
from spectrial.readers.diagnose.registry import detector
from spectrial.schema import ArmRecord, DriftRecord

SESSION_SHIFT = 0.03  # a baseline that moved more than this between sessions is reported
UNFLAGGED_SHIFT = 25.0  # % shift the drift band let through (too wide to judge)
PAIR_GAP = 0.10  # the same configuration measured 10 % apart


# ------------------------------------------------------------------ stale or drifted baseline
@detector("stale_baseline", 9, "seed-case", "vllm#53436", "rtx6kpro-startup")
def stale_baseline(ctx: Context) -> Iterator[Finding]:
    """A stale or drifted baseline: re-measured elsewhere at another speed, or outside earlier runs' band."""
    m = ctx.manifest
    if m is None:
        return
    drift, where = m.drift, "drift"
    if (drift is None or not drift.checked) and ctx.run_dir is not None and m.kind in ("trial", "sweep"):
        from spectrial.protocol.drift import check_drift

        drift, where = check_drift(m, ctx.run_dir.parent), f"drift (recomputed against {ctx.run_dir.parent.name}/)"
    if drift is not None and drift.checked:
        effects = [abs(a.speedup - 1.0) * 100 for a in m.arms if a.status == "ok" and not figures.is_baseline(a)
                   and figures.positive(a.speedup)]
        yield from _drift(drift, where, min(effects) if effects else None)
    yield from _sessions(ctx)


def _drift(d: DriftRecord, where: str, smallest_effect_pct: float | None = None) -> Iterator[Finding]:
    shift = number(d.get("shift_pct"))
    if d.flagged:
        # ranked: a drift as large as an effect this run measured would flip a comparison with those earlier runs
        big = shift is not None and smallest_effect_pct is not None and abs(shift) >= smallest_effect_pct
        yield Finding(kind="stale_baseline", severity="critical" if big else "warning",
                      title=d.message if d.message.startswith("baseline drift") else f"baseline drift: {d.message}",
                      detail="The host runs the same build at another speed than before: numbers from the earlier "
                             "runs cannot be mixed with this one's"
                             + (" (critical: the drift is as large as a speed-up this run measured, so a comparison "
                                "across runs would turn its verdict)" if big else "") + ".",
                      evidence=[rec(f"{where}.message", d.message), rec(f"{where}.shift_pct", shift),
                                rec(f"{where}.earlier_runs", d.get("earlier_runs"))],
                      fix="Compare arms only with the baseline measured beside them; find what changed (the message "
                          "names argv/env differences; `spectrial diff` the two runs).")
    elif shift is not None and abs(shift) >= UNFLAGGED_SHIFT and d.n_earlier:
        band = d.get("band") or [None, None]
        yield Finding(kind="stale_baseline", severity="info",
                      title=f"baseline {f2(d.get('current'), 1)} tok/s is {shift:+.1f} % from the earlier median "
                            f"{f2((d.get('earlier_medians') or [None])[0], 1)} tok/s, yet not flagged: the band "
                            f"{f2(band[0], 1)}-{f2(band[1], 1)} is too wide to judge",
                      detail="The earlier run's interval is so wide that almost any value fits it: that run is no "
                             "usable reference, and this run's numbers cannot be compared with it.",
                      evidence=[rec(f"{where}.shift_pct", shift), rec(f"{where}.band", band),
                                rec(f"{where}.earlier_runs", d.get("earlier_runs"))],
                      fix="Re-measure the reference baseline with enough requests and starts for a narrow interval.")


def _sessions(ctx: Context) -> Iterator[Finding]:
    """Hand-made records with sessions: the same baseline state measured in two sessions at different speeds."""
    bases = [(p, a) for p, a in ctx.arms if figures.is_baseline(a) and a.status == "ok"
             and figures.positive(a.tok_s) and a.session is not None]
    groups: dict[str, list[tuple[str, ArmRecord]]] = {}
    for p, a in bases:
        groups.setdefault(str(a.nccl_env or ""), []).append((p, a))
    for state, group in groups.items():
        sessions = list(dict.fromkeys(str(a.session) for _, a in group))
        if len(sessions) < 2:
            continue
        (p0, old), (p1, new) = group[0], group[-1]
        shift = new.tok_s / old.tok_s - 1  # type: ignore[operator]
        if abs(shift) < SESSION_SHIFT:
            continue
        effects, flips = [], []
        for _, a in ctx.arms:
            if figures.is_baseline(a) or a.session != new.session or not figures.positive(a.tok_s):
                continue
            s_old, s_new = figures.speedup(a, old) or 0.0, figures.speedup(a, new) or 0.0
            effects.append(f"{a.name} reads {s_old:.2f}x against {old.tok_s:g} but {s_new:.2f}x against its own "
                           f"session's {new.tok_s:g}")
            if (s_old - 1) * (s_new - 1) < 0:
                flips.append(a.name)
        singles = (len(old.tok_s_values) < 2) and (len(new.tok_s_values) < 2)
        yield Finding(
            kind="stale_baseline", severity="critical" if flips else "warning", arm=None,
            title=f"stale baseline: {old.name} gave {old.tok_s:g} tok/s in session '{old.session}', re-measured as "
                  f"{new.name} {new.tok_s:g} tok/s in session '{new.session}' ({shift:+.1%})",
            detail="The same baseline (NCCL " + (state or "state unrecorded") + ") moved between server starts: "
                   "any arm judged against the other session's figure is judged against a stale baseline"
                   + (" (" + "; ".join(effects[:3]) + ")" if effects else "")
                   + (f"; the verdict of {names(flips)} flips with the choice" if flips else "")
                   + (". Single measurements without spread: a move this size cannot be told from noise." if singles
                      else "."),
            evidence=[rec(f"{p0}.tok_s", old.tok_s), rec(f"{p0}.session", old.session),
                      rec(f"{p1}.tok_s", new.tok_s), rec(f"{p1}.session", new.session),
                      *[rec(f"{p1}.notes[{i}]", n) for i, n in enumerate(new.notes[:1])]],
            fix="Measure the baseline in the same session as each arm, interleaved with it, with repeats and "
                "restarts (spectrial trial does), and compare only within a session.")


# ------------------------------------------------------------------ results that cannot be compared
def _config(a: ArmRecord) -> tuple[Any, ...]:
    return (a.method, a.steps, a.topk, a.draft_tokens, a.synthetic_accept, a.get("concurrency"), a.get("offered_rate"))


def _pair_evidence(path: str, a: ArmRecord) -> list[Evidence]:
    out = [rec(f"{path}.tok_s", a.tok_s)]
    for field in ("session", "launch", "nccl_env", "verify_ms"):
        v = a.get(field)
        if v is not None:
            out.append(rec(f"{path}.{field}", v))
    return out


@detector("not_comparable", 10, "seed-case", "llamacpp#14104", "vllm#53436")
def not_comparable(ctx: Context) -> Iterator[Finding]:
    """Results compared that cannot be compared: other session, launch, environment, machine state."""
    m = ctx.manifest
    if m is None:
        return
    yield from _pairs(ctx)
    changed = [(i, s, c) for i, s in enumerate(m.starts) for c in s.fingerprint_changes if "throttl" not in c]
    if changed:
        arms = list(dict.fromkeys(s.arm for _, s, _ in changed))
        yield Finding(kind="not_comparable", severity="warning", arm=one(arms),
                      title=f"the machine changed during the run ({names(arms)}): "
                            f"{'; '.join(dict.fromkeys(c for _, _, c in changed[:3]))}",
                      detail="Arms measured before and after the change ran on different machine states (driver, "
                             "clocks, power limit, GPU): their ratio mixes the change in.",
                      evidence=[rec(f"starts[{i}].fingerprint_changes", c) for i, _, c in changed[:4]],
                      fix="Re-run the run on a stable host state; `spectrial diff` names what differs.")
    keys = {s.fingerprint_key for s in m.starts if s.fingerprint_key}
    if len(keys) > 1:
        yield Finding(kind="not_comparable", severity="warning",
                      title=f"the run's starts ran on {len(keys)} different host fingerprints",
                      detail="Starts with different fingerprints (host state + engine build) are not comparable.",
                      evidence=[rec(f"starts[{i}].fingerprint_key", s.fingerprint_key)
                                for i, s in enumerate(m.starts) if s.fingerprint_key][:4],
                      fix="Keep the host state and the engine build fixed during a run.")


def _pairs(ctx: Context) -> Iterator[Finding]:
    """The same configuration measured twice, far apart, under conditions the record says differ."""
    from spectrial.readers.history import incomparability, record_rows

    m = ctx.manifest
    assert m is not None
    spec = [(p, a) for p, a in ctx.arms if a.status == "ok" and not figures.is_baseline(a)
            and figures.positive(a.tok_s)]
    rows = {r.arm: r for r in record_rows(m, str(m.run_id))[0]}
    done = set()
    for i, (pa, a) in enumerate(spec):
        for pb, b in spec[i + 1:]:
            if _config(a) != _config(b) or (a.name, b.name) in done:
                continue
            gap = abs(a.tok_s - b.tok_s) / min(a.tok_s, b.tok_s)  # type: ignore[operator, type-var]
            # the same configuration (`_config`): the arm settings are not what makes the pair incomparable
            reasons = (incomparability(rows[a.name], rows[b.name], ignore=("arm settings",))
                       if a.name in rows and b.name in rows else [])
            if gap < PAIR_GAP or not reasons:
                continue
            done.add((a.name, b.name))
            hi, lo = (a, b) if a.tok_s >= b.tok_s else (b, a)  # type: ignore[operator]
            ph, pl = (pa, pb) if hi is a else (pb, pa)
            vh, vl = number(hi.verify_ms), number(lo.verify_ms)
            cycle = (f"; verify per cycle {vh:g} vs {vl:g} ms ({vl / vh - 1:+.0%}): the system changed between "
                     "the launches, not the draft") if vh and vl else ""
            yield Finding(
                kind="not_comparable", severity="warning", arm=hi.name,
                title=f"{hi.name} ({hi.tok_s:g} tok/s) and {lo.name} ({lo.tok_s:g} tok/s), the same configuration, "
                      "cannot be compared",
                detail="Why: " + "; ".join(reasons) + cycle + ".",
                evidence=_pair_evidence(ph, hi) + _pair_evidence(pl, lo),
                fix="Re-measure both with a baseline beside each, the launch and its environment recorded and "
                    "verified, with repeats; until then neither number says what the draft does.")
