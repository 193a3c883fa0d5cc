"""Baseline drift: is this run's baseline where earlier baselines of the same fingerprint were?

Earlier runs are the run records under a folder whose `fingerprint_key` (host state + engine build) and
workload (model identity, max_tokens, prompts) match. The current baseline is flagged when its confidence
interval lies outside the band spanned by the earlier baselines' intervals, widened by the server-start to
server-start spread: a request-level interval does not cover it (restarts differ by several percent even on
an unchanged machine, see benchmarks/bench_noise.py). The widening is `tolerance` (default 10 %), or three
times the relative spread of the earlier medians once there are three or more of them, whichever is larger.
The message names what else differs from those runs (argv, environment), the usual culprits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spectrial.records import list_runs, load_manifest


def _baseline(manifest: dict[str, Any]) -> dict[str, Any] | None:
    return next((a for a in manifest.get("arms", []) if a.get("method") == "none" and a.get("status") == "ok"
                 and a.get("tok_s")), None)


def _workload(manifest: dict[str, Any]) -> tuple[Any, ...]:
    p = manifest.get("params") or {}
    models = tuple(sorted((m.get("size"), m.get("head_tail_sha256")) for m in manifest.get("models") or []))
    return p.get("engine"), p.get("model"), p.get("max_tokens"), p.get("prompts"), models


def check_drift(manifest: dict[str, Any], folder: str | Path, tolerance: float = 0.10) -> dict[str, Any]:
    """Compare the manifest's baseline with earlier same-fingerprint baselines under `folder`."""
    base = _baseline(manifest)
    out: dict[str, Any] = {"checked": False, "flagged": False, "n_earlier": 0, "message": ""}
    if base is None:
        out["message"] = "no baseline arm completed: drift not checked"
        return out
    key, work = manifest.get("fingerprint_key"), _workload(manifest)
    earlier = []
    for run in list_runs(folder) if Path(folder).is_dir() else []:
        if run.name == manifest.get("run_id"):
            continue
        try:
            m = load_manifest(run)
        except (OSError, ValueError):
            continue
        b = _baseline(m)
        if b and m.get("status") == "ok" and m.get("fingerprint_key") == key and _workload(m) == work \
                and (m.get("started_at") or "") < (manifest.get("started_at") or "~"):
            earlier.append((m, b))
    out.update(checked=True, n_earlier=len(earlier), current=base["tok_s"],
               current_ci=[base.get("tok_s_ci_low"), base.get("tok_s_ci_high")])
    if not earlier:
        out["message"] = "no earlier baseline with this fingerprint: this run starts the history"
        return out
    meds = [b["tok_s"] for _, b in earlier]
    lows = [b.get("tok_s_ci_low") or b["tok_s"] for _, b in earlier]
    highs = [b.get("tok_s_ci_high") or b["tok_s"] for _, b in earlier]
    widen = tolerance
    if len(meds) >= 3:
        mean = sum(meds) / len(meds)
        sd = (sum((m - mean) ** 2 for m in meds) / (len(meds) - 1)) ** 0.5
        widen = max(widen, 3 * sd / mean)
    band = (min(lows) * (1 - widen), max(highs) * (1 + widen))
    cur_lo = base.get("tok_s_ci_low") or base["tok_s"]
    cur_hi = base.get("tok_s_ci_high") or base["tok_s"]
    ref = sorted(meds)[len(meds) // 2]
    shift = (base["tok_s"] - ref) / ref
    flagged = cur_hi < band[0] or cur_lo > band[1]
    out.update(earlier_runs=[m["run_id"] for m, _ in earlier], earlier_medians=meds, band=list(band),
               widened_by=widen, shift_pct=round(100 * shift, 2), flagged=flagged)
    if flagged:
        last_m, last_b = earlier[-1]
        diffs = _what_differs(base, last_b)
        out["differences_from_last"] = diffs
        out["message"] = (f"baseline drift: {base['tok_s']:.1f} tok/s is {shift:+.1%} from the earlier median "
                          f"{ref:.1f} (band {band[0]:.1f}-{band[1]:.1f} over {len(earlier)} run(s) with the same "
                          f"fingerprint, start-to-start spread {widen:.0%} included)" + (f"; differs from {last_m['run_id']} in: {'; '.join(diffs)}"
                                             if diffs else "; no difference in argv or environment was recorded"))
    else:
        out["message"] = (f"baseline {base['tok_s']:.1f} tok/s within the band {band[0]:.1f}-{band[1]:.1f} of "
                          f"{len(earlier)} earlier run(s) with the same fingerprint ({shift:+.1%})")
    return out


def _what_differs(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """argv and env differences between two arm records."""
    from spectrial.diff import argv_changes, dict_changes

    return argv_changes(b.get("argv") or [], a.get("argv") or []) + dict_changes(b.get("env") or {},
                                                                                   a.get("env") or {}, "env")
