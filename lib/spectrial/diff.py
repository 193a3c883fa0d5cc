"""`spectrial diff RUN_A RUN_B`: what differs between two runs, most consequential first.

Order of consequence (what most often explains a different number):
    0 environment that did not reach the server (variables missing from worker processes), env requested
    1 engine build / version / source diff, model files
    2 machine state (driver, GPUs, clocks, kernel, governor, throttling)
    3 launch commands (argv per arm)
    4 other parameters
    5 results (tok/s per arm, with whether their intervals overlap)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectrial.fingerprint import stable_view
from spectrial.schema import ArmRecord, load_record


@dataclass(order=True)
class Finding:
    severity: int
    text: str


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    if isinstance(d, list) and d and all(isinstance(x, dict) for x in d):
        out = {}
        for i, v in enumerate(d):
            out.update(_flat(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): d}


def dict_changes(a: dict[str, Any], b: dict[str, Any], label: str) -> list[str]:
    """'label.KEY: a -> b' for every key that differs (added/removed included)."""
    fa, fb = _flat(a), _flat(b)
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


def _argv_options(argv: list[str]) -> dict[str, str]:
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
    oa, ob = _argv_options(a), _argv_options(b)
    for k in sorted(set(oa) | set(ob)):
        if oa.get(k) != ob.get(k):
            out.append(f"argv {k}: {oa.get(k, '(absent)')!r} -> {ob.get(k, '(absent)')!r}")
    return out or ["argv order changed"]


def _env_reach(arm: ArmRecord) -> dict[str, int]:
    """Per variable: in how many server processes it was missing or wrong."""
    out: dict[str, int] = {}
    for p in arm.env_check.processes if arm.env_check else []:
        for k in list(p.get("missing", [])) + list((p.get("wrong") or {}).keys()):
            out[k] = out.get(k, 0) + 1
    return out


def diff_runs(run_a: str | Path, run_b: str | Path) -> list[Finding]:
    """Findings between two run records, most consequential first."""
    a, b = load_record(run_a), load_record(run_b)
    f: list[Finding] = []
    arms_a = {x.name: x for x in a.arms}
    arms_b = {x.name: x for x in b.arms}
    common = [n for n in arms_a if n in arms_b]
    for n in sorted(set(arms_a) ^ set(arms_b)):
        f.append(Finding(3, f"arm {n} only in {'A' if n in arms_a else 'B'}"))
    for n in common:
        xa, xb = arms_a[n], arms_b[n]
        ra, rb = _env_reach(xa), _env_reach(xb)
        for var in sorted(set(ra) | set(rb)):
            if ra.get(var, 0) != rb.get(var, 0):
                side, cnt = ("B", rb[var]) if rb.get(var, 0) > ra.get(var, 0) else ("A", ra[var])
                f.append(Finding(0, f"{var} missing from {cnt} server process(es) of arm {n} in run {side}"))
        for t in dict_changes(xa.env or {}, xb.env or {}, f"arm {n} env"):
            f.append(Finding(0, t))
        for t in argv_changes(xa.argv or [], xb.argv or []):
            f.append(Finding(3, f"arm {n}: {t}"))
    ea, eb = a.engine, b.engine
    for k in ("version", "commit", "diff_hash", "binary"):
        if ea.get(k) != eb.get(k):
            f.append(Finding(1, f"engine {k}: {ea.get(k)!r} -> {eb.get(k)!r}"))
    ia, ib = ea.get("binary_identity") or {}, eb.get("binary_identity") or {}
    if ia and ib and (ia.get("head_tail_sha256"), ia.get("size")) != (ib.get("head_tail_sha256"), ib.get("size")):
        f.append(Finding(1, f"engine binary changed: {ia.get('path')} size {ia.get('size')} -> {ib.get('size')}, "
                            f"hash {ia.get('head_tail_sha256')} -> {ib.get('head_tail_sha256')}"))
    ma = {m.get("path"): m for m in a.models}
    mb = {m.get("path"): m for m in b.models}
    for p in sorted(set(ma) | set(mb)):
        if (ma.get(p) or {}).get("head_tail_sha256") != (mb.get(p) or {}).get("head_tail_sha256"):
            f.append(Finding(1, f"model file {p} changed or absent in one run"))
    fa = a.host.get("fingerprint") or {}
    fb = b.host.get("fingerprint") or {}
    if fa or fb:
        for t in dict_changes(stable_view(fa), stable_view(fb), "host"):
            f.append(Finding(2, t.replace("host.gpus.", "GPU ")))
    for n in common:
        ta, tb = arms_a[n].throttled_samples, arms_b[n].throttled_samples
        if ta != tb:
            f.append(Finding(2, f"arm {n}: throttled GPU samples {ta} -> {tb}"))
    skip = {"output_dir", "state_dir", "work_dir", "port", "name", "drift_dir"}
    pa = {k: v for k, v in a.params.items() if k not in skip and k != "arms"}
    pb = {k: v for k, v in b.params.items() if k not in skip and k != "arms"}
    f += [Finding(4, t) for t in dict_changes(pa, pb, "params")]
    for n in common:
        xa, xb = arms_a[n], arms_b[n]
        if xa.tok_s and xb.tok_s:
            rel = xb.tok_s / xa.tok_s - 1
            lo_a, hi_a, lo_b, hi_b = xa.tok_s_ci_low, xa.tok_s_ci_high, xb.tok_s_ci_low, xb.tok_s_ci_high
            overlap = None if None in (lo_a, hi_a, lo_b, hi_b) else not (hi_b < lo_a or lo_b > hi_a)  # type: ignore[operator]
            note = {None: "no intervals", True: "intervals overlap", False: "intervals do not overlap"}[overlap]
            f.append(Finding(5, f"arm {n}: {xa.tok_s:.2f} -> {xb.tok_s:.2f} tok/s ({rel:+.1%}; {note})"))
    if a.status != b.status:
        f.append(Finding(5, f"status: {a.status} -> {b.status}"))
    return sorted(f)


def format_findings(findings: list[Finding]) -> str:
    labels = {0: "environment", 1: "engine/model", 2: "machine", 3: "launch", 4: "params", 5: "results"}
    if not findings:
        return "no differences found"
    return "\n".join(f"[{labels[x.severity]}] {x.text}" for x in findings)
