"""A watch record read (kind "watch"): its intervals as a table and the summary in words. No I/O, no plotly:
manifest in, frame or text out (the figure: `spectrial.readers.render.watch`)."""

from __future__ import annotations

import pandas as pd

from spectrial.schema import Manifest, WatchRecord


def intervals_frame(watch: WatchRecord) -> pd.DataFrame:
    """One row per interval (the columns of intervals.csv)."""
    return pd.DataFrame([iv.model_dump() for iv in watch.intervals])


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summary(manifest: Manifest) -> str:
    """What the watch saw: intervals, overall accept length and tok/s, changes, gaps, restarts, notes."""
    w = manifest.watch
    if w is None:
        return f"{manifest.run_id}: not a watch record (kind {manifest.kind})"
    measured = [iv for iv in w.intervals if not iv.reset and not iv.after_gap]
    steps = sum(iv.verify_steps or 0 for iv in measured)
    acc = sum(iv.accepted or 0 for iv in measured)
    toks = sum(iv.tokens or 0 for iv in measured)
    wall = sum(iv.wall_s for iv in measured)
    lines = [f"watch of {w.url} ({w.engine}, not started by spectrial): {len(w.intervals)} interval(s) of "
             f"{w.interval_s:g} s, status {manifest.status}" + (f" ({manifest.reason})" if manifest.reason else "")]
    if steps:
        lines.append(f"  accept length {1 + acc / steps:.3f} over {steps:.0f} verify steps")
    elif not w.speculation:
        lines.append("  no speculation counters: throughput only")
    if wall:
        lines.append(f"  {toks:.0f} tokens generated, {toks / wall:.1f} tok/s over {wall:.0f} s measured")
    if w.read_ms_median is not None:
        lines.append(f"  one /metrics read: {w.read_ms_median:.1f} ms (median)")
    for c in w.changes:
        lines.append(f"  change in {c.series} at interval {c.index} ({c.at}): {c.before_mean:.3g} -> "
                     f"{c.after_mean:.3g} ({c.relative_change:+.1%})")
    if not w.changes:
        lines.append("  no change found")
    for g in w.gaps:
        lines.append(f"  gap: {g.start} to {g.end or 'the end of the watch'} ({g.polls} failed read(s): {g.error})")
    if w.resets:
        lines.append(f"  {w.resets} restart(s) of the server (counter reset)")
    lines += [f"  note: {n}" for n in w.notes]
    return "\n".join(lines)
