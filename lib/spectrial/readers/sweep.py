"""A sweep record read: which points count (shared with the figures in `spectrial.readers.render.sweep`) and the
verdict paragraph, numbers and prose. No I/O, no plotly: manifest in, points or text out."""

from __future__ import annotations

import statistics

from spectrial.readers.crossover import crossovers, policy_lines
from spectrial.readers.points import baseline_points, load_of, scenario_label, spec_points
from spectrial.schema import Load, Manifest
from spectrial.sweep.result import partial_reason


# --- analysis: which points (spectrial.readers.points), and the verdict in words ------------------------
def fmt(x: float | None, nd: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def verdict(manifest: Manifest) -> str:
    """A paragraph computed from the record: cost of the sweep, baseline, best per scenario and concurrency."""
    b = manifest.budget
    parts = [f"The {manifest.strategy} sweep used {b.restarts if b else None} server starts (a full grid needs "
             f"{b.grid_restarts if b else None}) and {fmt(b.wall_s if b else None, 0)} s; it measured "
             f"{b.settings_measured if b else None} of {b.settings if b else None} settings and stopped because: "
             f"{(b.stopped_by if b else None) or 'the plan was done'}."]
    partial = partial_reason(manifest)
    if partial:
        parts.insert(0, f"**Partial sweep**: {partial}.")
    for x, base in baseline_points(manifest).items():
        parts.append(f"At {x.text()} the baseline decoded {fmt(base.tok_s)} tok/s per stream.")
    for row in manifest.best:
        where = f"{scenario_label(row.scenario)}, {Load(row.concurrency, row.offered_rate).text()}"
        if not row.best:
            parts.append(f"{where}: no setting measured.")
            continue
        s = f"{where}: best **{row.best}** at {fmt(row.tok_s)} tok/s [{fmt(row.tok_s_ci_low)}, {fmt(row.tok_s_ci_high)}]"
        if row.speedup is not None:
            s += f", {fmt(row.speedup, 2)}x the baseline ({row.vs_baseline or 'no CI'})"
        s += f"; {row.verdict or None}"
        if row.ratio_to_runner_up is not None:
            s += (f" (ratio to {row.runner_up} {fmt(row.ratio_to_runner_up, 3)} "
                  f"[{fmt(row.ratio_ci_low, 3)}, {fmt(row.ratio_ci_high, 3)}])")
        parts.append(s + ".")
    loads = {load_of(p) for p in spec_points(manifest)}
    if len(loads) > 1:  # where each setting stops paying under load (concurrency levels; request rates)
        parts += [c.text() + "." for c in crossovers(manifest)]
    parts += [x + "." for x in policy_lines(manifest)]  # the engines' own policies against the best static depth
    err = manifest.model.in_sample_rel_error if manifest.model else None
    preds = [p.prediction_error for p in spec_points(manifest) if p.prediction_error is not None]
    if preds:
        e = [abs(x) for x in preds]
        parts.append(f"Predictions made before measuring were off by {statistics.median(e) * 100:.1f} % (median) "
                     f"and {max(e) * 100:.1f} % at worst over {len(e)} point(s).")
    elif err is not None and err.median_abs is not None:
        parts.append(f"The fitted model reproduces the measured points within {err.median_abs * 100:.1f} % "
                     f"(median; worst {(err.max_abs or 0.0) * 100:.1f} %).")
    return " ".join(parts)


# --- rendering: plotly figures ---------------------------------------------------------------------------
