"""A cluster run's merged record, read: its units, the speed-ups against each unit's own baseline (pooled per
fingerprint key), the best settings of a sweep and what is missing; as lines (the CLI) and tables (the report)."""

from __future__ import annotations

import pandas as pd

from spectrial.schema import Manifest


def units_frame(m: Manifest) -> pd.DataFrame:
    """One row per unit: what it measured, where, how its job ended and why."""
    c = m.cluster
    rows = [{"unit": u.name, "state": u.state, "host": u.host, "job": u.job_id, "arms": ", ".join(u.arms),
             "round": u.round, "job state": u.scheduler_state, "record": u.record_status,
             "fingerprint": (u.fingerprint_key or "")[:12] or None, "elapsed s": u.elapsed_s, "reason": u.reason}
            for u in (c.units if c is not None else [])]
    return pd.DataFrame(rows)


def pooled_frame(m: Manifest) -> pd.DataFrame:
    """One row per arm (a sweep: setting and concurrency) and fingerprint key: the speed-up against each unit's
    own baseline, pooled over the units of that key (spectrial.cluster.merge.pool_speedups)."""
    c = m.cluster
    rows = [{"arm": p.arm, "concurrency": p.concurrency, "scenario": p.scenario, "speed-up": p.speedup,
             "CI low": p.speedup_ci_low, "CI high": p.speedup_ci_high, "verdict": p.verdict,
             "units": ", ".join(p.units), "fingerprint": (p.fingerprint_key or "")[:12] or None, "note": p.note}
            for p in (c.pooled if c is not None else [])]
    return pd.DataFrame(rows)


def summary_lines(m: Manifest) -> list[str]:
    """The merged record in a few lines (the CLI prints them)."""
    c = m.cluster
    if c is None:
        return []
    out = [f"{m.kind} {m.run_id}: {m.status} ({len(c.units)} units, {c.executor}, at most {c.max_parallel} at once; "
           f"wall {c.wall_s or 0:.0f} s, the units' own time {c.unit_s or 0:.0f} s; {c.starts} server starts, "
           f"{c.one_host_starts} for the {'whole grid' if m.kind == 'cluster-sweep' else 'trial'} on one host)"]
    for u in c.units:
        out.append(f"  {u.name} {u.state:<15} {u.host or '?':<12} job {u.job_id or '-':<8} {', '.join(u.arms)}"
                   + (f"  ({u.reason})" if u.reason and u.state != "ok" else ""))
    for p in c.pooled:
        ci = f" [{p.speedup_ci_low:.3f}, {p.speedup_ci_high:.3f}]" if p.speedup_ci_low and p.speedup_ci_high else ""
        where = f"c={p.concurrency} " if m.kind == "cluster-sweep" else ""
        out.append(f"  {p.arm} {where}speed-up x{p.speedup or 0:.3f}{ci} {p.verdict or ''} over {', '.join(p.units)}"
                   + (f" — {p.note}" if p.note else ""))
    for b in m.best:
        out.append(f"  best (scenario {b.scenario}, c={b.concurrency}): {b.best} {b.tok_s or 0:.1f} tok/s, "
                   f"x{b.speedup or 0:.3f} vs its unit's baseline (unit {b.unit})")
    if c.missing:
        out.append("  missing: " + "; ".join(c.missing))
    if not c.comparable:
        out.append("  units ran on several fingerprint keys: " + ", ".join(
            f"{k[:12]}: {', '.join(v)}" for k, v in c.fingerprint_groups.items()) + " (never pooled across keys)")
    return out

