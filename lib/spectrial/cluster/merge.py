"""The merged record of a cluster run: each unit's figures against its own baseline, the host a factor.

A unit compares its arms with the baseline it interleaved on its own host, so its speed-ups are never
confounded by another host's speed. The merge only gathers and pools:

    comparisons   every speculative arm (a sweep: point) of every unit, with the unit, host and fingerprint key
    pooled        per arm (and concurrency, scenario) and fingerprint key: one unit's speed-up as it is; several
                  units' pooled on the log scale, each weighted by its inverse variance (the variance read off
                  its CI), the pooled CI normal on that scale; units of different fingerprint keys are never
                  pooled: each key its own row, marked "not comparable" with the others
    missing       what was planned and not measured, with the unit and why
    best (sweeps) per fingerprint key, scenario and concurrency: the setting with the highest speed-up against
                  its own unit's baseline (on one host a sweep ranks by tok/s, all settings sharing one baseline;
                  across units tok/s carries each host's and each moment's speed, the speed-up cancels it), and
                  the runner-up (ratio of the two speed-ups)
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from spectrial.analysis.figures import verdict_of
from spectrial.schema import (
    BestRecord,
    Manifest,
    PointRecord,
    PooledComparison,
    UnitComparison,
    UnitRecord,
)


def _z(confidence: float) -> float:
    return statistics.NormalDist().inv_cdf(0.5 + confidence / 2)


def unit_comparisons(unit: UnitRecord, m: Manifest) -> list[UnitComparison]:
    """The unit's speculative arms (a sweep's speculative points), as measured against its own baseline."""
    conc = m.params.concurrency if "concurrency" in m.params else None
    out: list[UnitComparison] = []
    if m.kind == "sweep":
        for pt in m.points:
            if pt.method == "none":  # the unit's own baseline
                continue
            out.append(UnitComparison(arm=pt.arm, unit=unit.name, host=unit.host, fingerprint_key=m.fingerprint_key
                                      or pt.fingerprint_key, concurrency=pt.concurrency, offered_rate=pt.offered_rate,
                                      scenario=pt.scenario,
                                      status=pt.status, tok_s=pt.tok_s, tok_s_ci_low=pt.tok_s_ci_low,
                                      tok_s_ci_high=pt.tok_s_ci_high, speedup=pt.speedup,
                                      speedup_ci_low=pt.speedup_ci_low, speedup_ci_high=pt.speedup_ci_high,
                                      accept_len=pt.accept_len, verdict=pt.verdict))
        return out
    for a in m.arms:
        if a.method == "none":
            continue
        out.append(UnitComparison(arm=a.name, unit=unit.name, host=unit.host, fingerprint_key=m.fingerprint_key,
                                  concurrency=conc, status=a.status, tok_s=a.tok_s, tok_s_ci_low=a.tok_s_ci_low,
                                  tok_s_ci_high=a.tok_s_ci_high, speedup=a.speedup, speedup_ci_low=a.speedup_ci_low,
                                  speedup_ci_high=a.speedup_ci_high, accept_len=a.accept_len, verdict=a.verdict))
    return out


def pool_speedups(comps: list[UnitComparison], confidence: float = 0.95) -> list[PooledComparison]:
    """Per arm, concurrency, scenario and fingerprint key: the units' speed-ups pooled (see the module)."""
    Load = tuple[int | None, float | None]  # concurrency, offered rate
    groups: dict[tuple[str, Load, float | None, str | None], list[UnitComparison]] = defaultdict(list)
    for c in comps:
        if c.status == "ok" and c.speedup:
            groups[(c.arm, (c.concurrency, c.offered_rate), c.scenario, c.fingerprint_key)].append(c)
    keys_of: dict[tuple[str, Load, float | None], set[str | None]] = defaultdict(set)
    for arm, load, scen, key in groups:
        keys_of[(arm, load, scen)].add(key)
    z = _z(confidence)
    out = []
    for (arm, (conc, rate), scen, key), cs in groups.items():
        others = sorted(str(k) for k in keys_of[(arm, (conc, rate), scen)] - {key})
        note = (f"not comparable with units on fingerprint key(s) {', '.join(others)} (another host type): "
                "judged apart") if others else None
        row = PooledComparison(arm=arm, fingerprint_key=key, units=[c.unit for c in cs], concurrency=conc,
                               offered_rate=rate, scenario=scen, note=note)
        if len(cs) == 1:
            c = cs[0]
            row.speedup, row.speedup_ci_low, row.speedup_ci_high, row.verdict = \
                c.speedup, c.speedup_ci_low, c.speedup_ci_high, c.verdict
        else:
            logs, weights = [], []
            for c in cs:
                lo, hi = c.speedup_ci_low, c.speedup_ci_high
                se = (math.log(hi) - math.log(lo)) / (2 * z) if lo and hi and hi > lo > 0 else None
                logs.append(math.log(c.speedup or 1.0))
                weights.append(1.0 / se ** 2 if se else None)
            if all(w is not None for w in weights):
                total = sum(w for w in weights if w is not None)
                mean = sum(w * x for w, x in zip(weights, logs, strict=True) if w is not None) / total
                half = z / math.sqrt(total)
                # full precision, as every figure of the record (readers round for display): bounds rounded to 4
                # decimals made a pooled interval of width 0.0039 look wider than a unit's (seen under two lanes)
                row.speedup = math.exp(mean)
                row.speedup_ci_low, row.speedup_ci_high = math.exp(mean - half), math.exp(mean + half)
                row.verdict = verdict_of(row.speedup_ci_low, row.speedup_ci_high)
            else:  # a unit without an interval: the geometric mean, no pooled interval
                row.speedup = math.exp(statistics.fmean(logs))
                row.verdict = None
                row.note = ((row.note + "; ") if row.note else "") + "a unit has no interval: no pooled CI"
        out.append(row)
    return sorted(out, key=lambda r: (r.arm, r.offered_rate or 0.0, r.concurrency or 0, r.scenario or -1.0,
                                      str(r.fingerprint_key)))


def sweep_points(units: list[tuple[UnitRecord, Manifest]]) -> list[PointRecord]:
    """Every unit's points, with the unit and host as extra fields (baselines included, each its unit's)."""
    out = []
    for u, m in units:
        for pt in m.points:
            p = pt.model_copy(deep=True)
            p.id = f"{u.name}:{pt.id}"
            p.unit, p.unit_host = u.name, u.host
            p.fingerprint_key = p.fingerprint_key or m.fingerprint_key
            out.append(p)
    return out


def sweep_best(points: list[PointRecord]) -> list[BestRecord]:
    """Per fingerprint key, scenario and load level: the fastest measured setting against the runner-up."""
    groups: dict[tuple[str | None, float | None, float, int], list[PointRecord]] = defaultdict(list)
    for p in points:
        if p.method != "none" and p.status == "ok" and p.tok_s:
            groups[(p.fingerprint_key, p.scenario, p.offered_rate or 0.0, p.concurrency)].append(p)
    keys = {k for k, _, _, _ in groups}
    out = []
    for (key, scen, rate, conc), pts in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or -1.0,
                                                                             kv[0][2], kv[0][3])):
        # across units the currency is the speed-up against each unit's own baseline: a unit on a faster (or
        # less loaded) host has faster tok/s for every setting, its baseline's included
        ranked = sorted(pts, key=lambda p: (p.speedup or 0.0, p.tok_s or 0.0), reverse=True)
        b = ranked[0]
        r = ranked[1] if len(ranked) > 1 else None
        row = BestRecord(scenario=scen, concurrency=conc, offered_rate=rate or None, best=b.arm, verdict=b.verdict or "", tok_s=b.tok_s,
                         tok_s_ci_low=b.tok_s_ci_low, tok_s_ci_high=b.tok_s_ci_high, speedup=b.speedup,
                         speedup_ci_low=b.speedup_ci_low, speedup_ci_high=b.speedup_ci_high,
                         vs_baseline=b.baseline, measured_settings=len({p.arm for p in pts}),
                         runner_up=r.arm if r else None, runner_up_tok_s=r.tok_s if r else None,
                         ratio_to_runner_up=round((b.speedup or 0) / r.speedup, 4) if r and r.speedup else None)
        row.fingerprint_key, row.unit = key, b.unit
        if len(keys) > 1:
            row.note = "units on several fingerprint keys: each key has its own best"
        out.append(row)
    return out
