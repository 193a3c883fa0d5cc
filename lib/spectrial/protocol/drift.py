"""Baseline drift: is this run's baseline where earlier baselines of the same fingerprint were?

Earlier runs (spectrial.protocol.earlier) are the run records under a folder with this run's `fingerprint_key` (host state +
engine build), engine, model (and model files) and workload: `REQUIRES`, through the one comparison
(spectrial.record.comparable). The unit is the server start, as in a decide run: each
earlier baseline start contributes its median decode rate (tok/s per request), so the band does not widen with
how few requests a start had (a request-level interval would: 3-request baselines made a band of 74-532 tok/s).

The band is a 95 % prediction interval, on the log scale, for the median of this run's k baseline starts from the m
earlier starts' medians: mean +- t(0.975, m - 1) x SD x sqrt(1/m + 1/k), where the SD of the earlier starts holds
both start-to-start and run-to-run spread; its half-width is at least `tolerance` (default 10 %), and with a single
earlier start it is `tolerance` alone. This run's baseline (the median of its start medians) is flagged when it
lies outside; the message says inside or outside, by how much, against what, and what else differs from the last
of those runs (argv, environment), the usual culprits.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from pathlib import Path

from pydantic import JsonValue

from spectrial.analysis.figures import pick_baseline
from spectrial.record import comparable as cmp
from spectrial.record.comparable import Category, argv_options
from spectrial.schema import ArmRecord, DriftRecord, Manifest

LEVEL = 0.95
# what an earlier run must share with this one (spectrial.record.comparable): its fingerprint key (host state and
# engine build), engine, model and model files, workload and sampling; not its concurrency, repeats or launch
REQUIRES: tuple[Category, ...] = ("fingerprint key", "engine", "model", "model files", "workload", "sampling")


def check_drift(manifest: Manifest, folder: str | Path, tolerance: float = 0.10) -> DriftRecord:
    """Compare the manifest's baseline starts with earlier same-fingerprint baseline starts under `folder`."""
    from spectrial.protocol.earlier import find, summarize

    base = pick_baseline(manifest.arms)
    out = DriftRecord()
    mine = [float(s.tok_s) for s in (base.starts if base else []) if s.status == "ok" and s.tok_s and s.tok_s > 0]
    if base is not None and not mine and base.tok_s and base.tok_s > 0:
        mine = [float(base.tok_s)]  # a record without per-start figures (hand-made, old): its rate as one start
    if base is None or not mine:
        out.message = "no baseline arm completed: drift not checked"
        return out
    runs, skipped = find(folder, manifest.params, fingerprint_key=manifest.fingerprint_key,
                         exclude=manifest.run_id, before=manifest.started_at or "~", kinds=(manifest.kind,))
    runs = [m for m in runs if cmp.compare(manifest, m, require=REQUIRES).comparable]
    earlier = summarize(runs, folder, skipped)
    damaged = (f" ({earlier.skipped} damaged record(s) under {folder} skipped: {'; '.join(earlier.damaged[:3])}"
               f"{'; ...' if len(earlier.damaged) > 3 else ''})") if earlier.skipped else ""
    current = statistics.median(mine)
    out.checked, out.n_earlier = True, len(earlier.baselines)
    out.current, out.current_ci = current, [base.tok_s_ci_low, base.tok_s_ci_high]
    out.current_starts = mine
    if not earlier.baselines:
        out.message = (f"no earlier baseline with this fingerprint ({manifest.fingerprint_key}): this run starts "
                       "the history" + damaged)
        return out
    values = [v for b in earlier.baselines for v in b.start_medians]
    center, half, sd, basis = prediction_band(values, len(mine), tolerance, len(earlier.baselines))
    m = len(values)
    ref = math.exp(center)
    band = (math.exp(center - half), math.exp(center + half))
    shift = current / ref - 1.0
    flagged = not band[0] <= current <= band[1]
    n_runs = len(earlier.baselines)
    out.earlier_runs = [b.run_id for b in earlier.baselines]
    out.earlier_medians = [statistics.median(b.start_medians) for b in earlier.baselines]
    out.earlier_starts, out.reference = m, ref
    out.band, out.widened_by, out.shift_pct, out.flagged = list(band), half, round(100 * shift, 2), flagged
    out.sd_log, out.basis = sd, basis
    out.fingerprint_key = manifest.fingerprint_key
    last = runs[-1] if runs else None
    last_base = pick_baseline(last.arms) if last is not None else None
    diffs = _what_differs(base, last_base) if last_base is not None else []
    out.differences_from_last = diffs
    where = f"the last {n_runs} run(s) on this host" if n_runs > 1 else "the last run on this host"
    numbers = (f"{current:.1f} vs {ref:.1f} tok/s (band {band[0]:.1f}-{band[1]:.1f} tok/s: {basis}; "
               f"fingerprint {manifest.fingerprint_key})")
    if flagged:
        direction = "below" if shift < 0 else "above"
        out.headline = f"baseline {abs(shift) * 100:.0f} % {direction} {where}: {current:.1f} vs {ref:.1f} tok/s"
        out.message = (f"baseline drift: {abs(shift) * 100:.1f} % {direction} {where}, outside the band: {numbers}"
                       + (f"; differs from {last.run_id} in: {'; '.join(diffs)}" if diffs and last else
                          "; no difference in argv or environment was recorded: look at the machine (clocks, "
                          "neighbours, thermals)"))
    else:
        out.message = f"baseline inside the band of {where} ({shift * 100:+.1f} %): {numbers}"
    out.message += damaged
    return out


def prediction_band(values: list[float], k: int, tolerance: float, runs: int) -> tuple[float, float, float | None,
                                                                                    str]:
    """The log-scale band for the median of k new baseline starts from earlier starts' medians `values` (tok/s):
    (centre, half-width, SD or None, basis in words); see the module docstring."""
    from scipy.stats import t as student_t

    logs = [math.log(v) for v in values]
    m = len(logs)
    center = statistics.fmean(logs)
    floor = math.log1p(tolerance)
    if m >= 2:
        sd = statistics.stdev(logs)
        half = max(floor, float(student_t.ppf(0.5 + LEVEL / 2, m - 1)) * sd * math.sqrt(1 / m + 1 / max(k, 1)))
        basis = (f"{LEVEL:.0%} prediction from {m} earlier start(s) of {runs} run(s), start-to-start SD {sd:.1%}"
                 + (f", at least ±{tolerance:.0%}" if half == floor else ""))
        return center, half, sd, basis
    return center, floor, None, f"one earlier start: ±{tolerance:.0%} (drift_tolerance), no spread to judge by"


def _what_differs(a: ArmRecord, b: ArmRecord) -> list[str]:
    """argv and env differences between two arm records."""
    return argv_changes(b.argv or [], a.argv or []) + dict_changes(b.env or {}, a.env or {}, "env")


# --- what differs between two launches (also spectrial.readers.diff's) ---------------------------------------
def _flat(d: JsonValue, prefix: str = "") -> dict[str, JsonValue]:
    if isinstance(d, dict):
        out: dict[str, JsonValue] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    if isinstance(d, list) and d and all(isinstance(x, dict) for x in d):
        out = {}
        for i, v in enumerate(d):
            out.update(_flat(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): d}


def dict_changes(a: Mapping[str, JsonValue], b: Mapping[str, JsonValue], label: str) -> list[str]:
    """'label.KEY: a -> b' for every key that differs (added/removed included)."""
    fa, fb = _flat(dict(a)), _flat(dict(b))
    out = []
    for k in sorted(set(fa) | set(fb)):
        if fa.get(k) != fb.get(k):
            if k not in fa:
                out.append(f"{label}.{k} added: {fb[k]!r}")
            elif k not in fb:
                out.append(f"{label}.{k} removed (was {fa[k]!r})")
            else:
                out.append(f"{label}.{k}: {fa[k]!r} -> {fb[k]!r}")
    return out


def argv_changes(a: list[str], b: list[str]) -> list[str]:
    """Option-level differences between two launch commands."""
    if a == b:
        return []
    out = []
    if a[:1] != b[:1]:
        out.append(f"executable: {a[:1]} -> {b[:1]}")
    oa, ob = argv_options(a), argv_options(b)
    for k in sorted(set(oa) | set(ob)):
        if oa.get(k) != ob.get(k):
            out.append(f"argv {k}: {oa.get(k, '(absent)')!r} -> {ob.get(k, '(absent)')!r}")
    return out or ["argv order changed"]
