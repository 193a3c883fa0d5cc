"""The numbers of an NCCL check (pure functions of its latency data) and the verdict paragraph the check writes
into its record.

Latency data (`latency.csv`, one row per timed all-reduce): round, set, group, size_bytes, role, rank, iter,
us. A collective's latency is its slowest rank's: rank "max" is the maximum over ranks of each call.
Percentiles pool the rounds; comparisons resample rounds, then calls, when both sides have two or more.
The tables read from the record are in `spectrial.readers.nccl`, its figure in `spectrial.readers.render.plots`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from spectrial.analysis.stats import NOT_DISTINGUISHABLE, compare_arms
from spectrial.schema import Manifest

_PCTS = {"p10": 10, "p50": 50, "p90": 90, "p99": 99}
_WORD = {"faster": "faster", "slower": "slower", NOT_DISTINGUISHABLE: "same"}


def human_bytes(n: float) -> str:
    """8192 -> '8 KB', 14336 -> '14 KB', 67108864 -> '64 MB' (binary units, as NCCL tests print)."""
    for unit, div in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if abs(v - round(v)) < 0.05 else f"{v:.1f} {unit}"
    return f"{int(n)} B"


def with_max_rank(latency: pd.DataFrame) -> pd.DataFrame:
    """Add rank 'max' rows: per (set, group, size, iter) the slowest rank's time."""
    if latency.empty:
        return latency.assign(rank=latency["rank"].astype(str))
    lat = latency.assign(rank=latency["rank"].astype(str))
    keys = [c for c in ("round", "set", "group", "size_bytes", "role", "iter") if c in lat.columns]
    mx = lat.groupby(keys, as_index=False, sort=False)["us"].max().assign(rank="max")
    return pd.concat([lat, mx[lat.columns]], ignore_index=True)


def summarize_latency(latency: pd.DataFrame) -> pd.DataFrame:
    """Percentiles (us) per set, group, size and rank (ranks and 'max'): n, mean, p10, p50, p90, p99."""
    cols = ["set", "group", "size_bytes", "size", "role", "rank", "n", "mean_us",
            *(f"{k}_us" for k in _PCTS)]
    if latency.empty:
        return pd.DataFrame(columns=cols)
    lat = with_max_rank(latency)
    g = lat.groupby(["set", "group", "size_bytes", "role", "rank"], sort=False)["us"]
    out = g.agg(n="count", mean_us="mean").reset_index()
    for k, q in _PCTS.items():
        out[f"{k}_us"] = g.quantile(q / 100).to_numpy()
    out["size"] = out["size_bytes"].map(human_bytes)
    order = {s: i for i, s in enumerate(dict.fromkeys(latency["set"]))}
    out = out.sort_values(["set", "group", "size_bytes", "rank"], key=lambda c: c.map(order) if c.name == "set"
                          else c).reset_index(drop=True)
    return out[cols]


def compare_sets(latency: pd.DataFrame, baseline: str, *, level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Each (set, group) vs the baseline's default group, per size, on the per-call max over ranks:
    ratio of medians (set / baseline; below 1 is faster) with its bootstrap CI and a verdict word.
    With two or more rounds on both sides the bootstrap resamples rounds (worker starts), then calls.
    The intervals of one set's sizes hold together (Bonferroni: each at 1 - (1 - level) / n_sizes), so
    a set that changes nothing is called faster or slower at any size with probability <= 1 - level."""
    cols = ["set", "group", "size_bytes", "size", "role", "base_p50_us", "p50_us", "ratio", "ci_low", "ci_high",
            "level", "verdict"]
    if latency.empty:
        return pd.DataFrame(columns=cols)
    mx = with_max_rank(latency)
    mx = mx[mx["rank"] == "max"]
    base = mx[(mx["set"] == baseline) & (mx["group"] == "default")]
    rows = []
    for (set_name, group), sub in mx.groupby(["set", "group"], sort=False):
        if set_name == baseline and group == "default":
            continue
        each = 1 - (1 - level) / max(sub["size_bytes"].nunique(), 1)
        for size, cur in sub.groupby("size_bytes"):
            ref_df = base[base["size_bytes"] == size]
            ref, vals = ref_df["us"].to_numpy(), cur["us"].to_numpy()
            if ref.size < 2 or vals.size < 2:
                continue
            two_level = "round" in mx.columns and ref_df["round"].nunique() >= 2 and cur["round"].nunique() >= 2
            if two_level:
                c = compare_arms(cur, ref_df, level=each, seed=seed, higher_is_better=False,
                                 group_col="round", value_col="us")
            else:
                c = compare_arms(vals, ref, level=each, seed=seed, higher_is_better=False)
            rows.append({"set": set_name, "group": group, "size_bytes": int(size), "size": human_bytes(size),
                         "role": cur["role"].iloc[0], "base_p50_us": float(np.median(ref)),
                         "p50_us": float(np.median(vals)), "ratio": c.ratio, "ci_low": c.ci_low,
                         "ci_high": c.ci_high, "level": round(each, 4), "verdict": _WORD[c.verdict]})
    return pd.DataFrame(rows, columns=cols)


# --- the verdict paragraph (written into the record by the check) ---------------------------------------------
def _round(r: int | None) -> str:
    return f" round {r}" if r is not None else ""


def _ratio_text(r: pd.Series) -> str:
    return f"{r['size']} {r['ratio']:.2f}x [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"


def _effect_words(cmp: pd.DataFrame) -> tuple[str, str]:
    """(overall word, detail) from one set's comparisons."""
    dec = cmp[cmp["role"] == "decode"]
    faster, slower = (dec["verdict"] == "faster").any(), (dec["verdict"] == "slower").any()
    overall = ("helped decode-size all-reduces" if faster and not slower else
               "hurt decode-size all-reduces" if slower and not faster else
               "mixed: faster at some decode sizes, slower at others" if faster and slower else
               "no measurable effect at decode sizes")
    parts = []
    for word in ("faster", "slower", "same"):
        sub = cmp[cmp["verdict"] == word]
        if not sub.empty:
            parts.append(f"{word} at " + ", ".join(_ratio_text(r) for _, r in sub.iterrows()))
    return overall, "; ".join(parts)


def verdict_text(manifest: Manifest, comparisons: pd.DataFrame) -> str:
    """Markdown paragraph per set: did the variables reach the workers, did NCCL take them, did they help."""
    base = manifest.params.baseline
    gloo = manifest.params.backend == "gloo"
    lines = []
    for s in manifest.get("sets", []):
        head = f"**{s['name']}** (how: `{s['how']}`)"
        if s.get("status") != "ok":
            lines.append(f"- {head}: **failed**: {s.get('error')}")
            continue
        workers = s.get("workers", [])
        miss = [f"rank {w['rank']}{_round(w.get('round'))} (pid {w['pid']}): {', '.join(w['missing'])}" for w in workers
                if w.get("missing")]
        noproc = sorted({n for w in workers for n in w.get("not_in_proc", [])})
        vis = ("every requested variable was in every worker's `os.environ`" if not miss else
               "**missing** in " + "; ".join(miss))
        vis += ("; all also in `/proc/<pid>/environ`" if not noproc else
                f"; not in `/proc/<pid>/environ`: {', '.join(noproc)}")
        eff = s.get("effect", {}).get("status", "")
        text = f"- {head}: {vis}. NCCL: {eff}."
        cmp = comparisons[comparisons["set"] == s["name"]] if not comparisons.empty else comparisons
        if s["name"] != base and not cmp.empty:
            for group, sub in cmp.groupby("group", sort=False):
                overall, detail = _effect_words(sub)
                where = "" if group == "default" else f" ({group} group)"
                if gloo:
                    overall = "A/A check (gloo ignores NCCL variables: every 'faster' or 'slower' is a false alarm)"
                text += f" Versus `{base}`{where}: {overall} (set/baseline p50: {detail})."
        lines.append(text)
    if manifest.params.rounds < 2:
        lines.append("- one round only: the intervals cover call-to-call noise, not the drift between worker "
                     "starts; run with `rounds: 2` or more before trusting a small difference.")
    if gloo:
        lines.append("- gloo ignores NCCL variables: any difference between sets here is drift or noise between "
                     "worker starts (an A/A check of the method), not an effect of the variables.")
    return "\n".join(lines)
