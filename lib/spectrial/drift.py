"""Baseline drift: is this run's baseline where earlier baselines of the same fingerprint were?

Earlier runs are the run records under a folder whose `fingerprint_key` (host state + engine build) and
workload (model identity and `params.workload_identity`: the items asked, their format, sampling and length) match. The current baseline is flagged when its confidence
interval lies outside the band spanned by the earlier baselines' intervals, widened by the server-start to
server-start spread: a request-level interval does not cover it (restarts differ by several percent even on
an unchanged machine, see benchmarks/bench_noise.py). The widening is `tolerance` (default 10 %), or three
times the relative spread of the earlier medians once there are three or more of them, whichever is larger.
The message names what else differs from those runs (argv, environment), the usual culprits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from spectrial.figures import pick_baseline
from spectrial.params import workload_identity
from spectrial.records import list_runs, load_record
from spectrial.schema import ArmRecord, DriftRecord, Manifest


def _baseline(manifest: Manifest) -> ArmRecord | None:
    return pick_baseline(manifest.arms)


def _workload(manifest: Manifest) -> tuple[Any, ...]:
    p = manifest.params
    models = tuple(sorted((m.size, m.head_tail_sha256) for m in manifest.models))
    return p.get("engine"), p.get("model"), json.dumps(workload_identity(p), sort_keys=True), models


def check_drift(manifest: Manifest, folder: str | Path, tolerance: float = 0.10) -> DriftRecord:
    """Compare the manifest's baseline with earlier same-fingerprint baselines under `folder`."""
    base = _baseline(manifest)
    out = DriftRecord()
    if base is None or base.tok_s is None:
        out.message = "no baseline arm completed: drift not checked"
        return out
    key, work = manifest.fingerprint_key, _workload(manifest)
    earlier: list[tuple[Manifest, ArmRecord]] = []
    for run in list_runs(folder) if Path(folder).is_dir() else []:
        if run.name == manifest.run_id:
            continue
        try:
            m = load_record(run)
        except (OSError, ValueError):
            continue
        b = _baseline(m)
        if b and m.status in ("ok", "partial") and m.fingerprint_key == key and _workload(m) == work \
                and (m.started_at or "") < (manifest.started_at or "~"):
            earlier.append((m, b))
    out.checked, out.n_earlier = True, len(earlier)
    out.current, out.current_ci = base.tok_s, [base.tok_s_ci_low, base.tok_s_ci_high]
    if not earlier:
        out.message = "no earlier baseline with this fingerprint: this run starts the history"
        return out
    meds = [float(b.tok_s) for _, b in earlier]  # type: ignore[arg-type]
    lows = [b.tok_s_ci_low or b.tok_s for _, b in earlier]
    highs = [b.tok_s_ci_high or b.tok_s for _, b in earlier]
    widen = tolerance
    if len(meds) >= 3:
        mean = sum(meds) / len(meds)
        sd = (sum((m - mean) ** 2 for m in meds) / (len(meds) - 1)) ** 0.5
        widen = max(widen, 3 * sd / mean)
    band = (min(lows) * (1 - widen), max(highs) * (1 + widen))  # type: ignore[type-var, operator]
    cur_lo = base.tok_s_ci_low or base.tok_s
    cur_hi = base.tok_s_ci_high or base.tok_s
    ref = sorted(meds)[len(meds) // 2]
    shift = (base.tok_s - ref) / ref
    flagged = cur_hi < band[0] or cur_lo > band[1]
    out.earlier_runs, out.earlier_medians, out.band = [m.run_id for m, _ in earlier], meds, list(band)
    out.widened_by, out.shift_pct, out.flagged = widen, round(100 * shift, 2), flagged
    if flagged:
        last_m, last_b = earlier[-1]
        diffs = _what_differs(base, last_b)
        out.differences_from_last = diffs
        out.message = (f"baseline drift: {base.tok_s:.1f} tok/s is {shift:+.1%} from the earlier median "
                       f"{ref:.1f} (band {band[0]:.1f}-{band[1]:.1f} over {len(earlier)} run(s) with the same "
                       f"fingerprint, start-to-start spread {widen:.0%} included)"
                       + (f"; differs from {last_m.run_id} in: {'; '.join(diffs)}" if diffs
                          else "; no difference in argv or environment was recorded"))
    else:
        out.message = (f"baseline {base.tok_s:.1f} tok/s within the band {band[0]:.1f}-{band[1]:.1f} of "
                       f"{len(earlier)} earlier run(s) with the same fingerprint ({shift:+.1%})")
    return out


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


def argv_options(argv: list[str]) -> dict[str, str]:
    """A launch command's options as {flag: value} ("" for a flag without a value)."""
    opts: dict[str, str] = {}
    i = 1
    while i < len(argv):
        a = argv[i]
        if a.startswith("-") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            opts[a] = argv[i + 1]
            i += 2
        else:
            opts[a] = ""
            i += 1
    return opts


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
