"""Evidence of what each worker got: variable visibility (os.environ vs /proc) and NCCL's own word.

NCCL's debug output is read through `spectrial.logs.parse` (engine "nccl"; kinds `env` with variable,
value; `init` with nranks, nnodes, local_ranks; `channels` with coll_channels, p2p_channels,
nvls_channels; `connection` with channel, src, dst, transport; `tuning` with collective, algorithm,
protocol, bw_gbs; `version`). Each rank's log holds the
worker's phase markers, so rows are attributed to the communicator they describe (`first_communicator`,
`new_group`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from spectrial.nccl.worker import MARK_PREFIX, WorkerResult
from spectrial.secrets import MASK, is_secret_name

_KINDS = ("env", "init", "channels", "connection", "tuning", "version")
Scalar = str | int | float | bool | None
LogRow = dict[str, Scalar]  # one parsed NCCL log record (`spectrial.logs` columns of its kind)


class Visibility(TypedDict):
    """One worker's view of the requested variables at the communicator its set targets."""

    rank: int
    pid: int | None
    phase: str | None
    seen_in_os_environ: list[str]
    seen_in_proc: list[str]
    missing: list[str]
    not_in_proc: list[str]
    proc_readable: bool | None
    values: dict[str, dict[str, str | None]]  # name -> {requested, os_environ, proc} (secrets masked)


class RankEvidence(TypedDict):
    """NCCL's own word in one rank's log: rows by phase and kind, or why there are none (`error`)."""

    error: str | None
    phases: dict[str, dict[str, list[LogRow]]]


class SettingsRow(TypedDict):
    """What NCCL says it used in one phase of one rank."""

    set: str
    rank: int
    phase: str
    set_by_environment: str
    nccl_version: Scalar
    nranks: int | None
    nnodes: int | None
    local_ranks: int | None
    coll_channels: int | None
    p2p_channels: int | None
    nvls_channels: int | None
    transports: str
    tuning: str


def visibility(result: WorkerResult) -> Visibility:
    """One worker's view at the communicator that its set targets (the last snapshot).

    seen_in_os_environ / seen_in_proc: requested variables present there with the requested value;
    missing: not in os.environ with the requested value (what NCCL reads); not_in_proc: not in
    /proc/<pid>/environ with the requested value (what `ps e` or a server check sees).
    """
    snaps = result.get("snapshots") or []
    out: Visibility = {"rank": result["rank"], "pid": result.get("pid"), "phase": None,
                       "seen_in_os_environ": [], "seen_in_proc": [], "missing": [], "not_in_proc": [],
                       "proc_readable": None, "values": {}}
    if not snaps:
        return out
    snap = snaps[-1]
    out["phase"], out["proc_readable"] = snap["phase"], snap.get("proc_readable")
    for name, v in sorted(snap["vars"].items()):
        in_os, in_proc = v["os_environ"] == v["requested"], v["proc"] == v["requested"]
        out["seen_in_os_environ" if in_os else "missing"].append(name)
        out["seen_in_proc" if in_proc else "not_in_proc"].append(name)
        vals: dict[str, str | None] = {"requested": v["requested"], "os_environ": v["os_environ"], "proc": v["proc"]}
        out["values"][name] = {k: (MASK if x is not None and is_secret_name(name) else x) for k, x in vals.items()}
    return out


def _phase_bounds(text: str) -> list[tuple[int, str]]:
    """(line number, phase) of the worker's markers, 1-based like the parser's `line` column."""
    return [(i, line.split(MARK_PREFIX, 1)[1].strip()) for i, line in enumerate(text.splitlines(), 1)
            if MARK_PREFIX in line]


def _phase_of(line: int, bounds: list[tuple[int, str]]) -> str:
    phase = "before_markers"
    for start, name in bounds:
        if line > start:
            phase = name
    return phase


def _records(df: Any, kind: str) -> list[LogRow]:
    if df is None or df.empty or "kind" not in df:
        return []
    sel = df["kind"].isin([kind, f"nccl_{kind}"])
    if "engine" in df:
        sel &= df["engine"].fillna("nccl") == "nccl"
    sub = df[sel].dropna(axis=1, how="all")
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            for row in sub.to_dict(orient="records")]


def parse_rank_log(log_path: str | Path) -> RankEvidence:
    """NCCL evidence of one rank's log, grouped by phase: {phase: {kind: [rows]}} plus `error`."""
    path = Path(log_path)
    text = path.read_text(errors="replace") if path.is_file() else ""
    try:
        from spectrial.logs import parse
    except ImportError as exc:
        return {"error": f"spectrial.logs is not importable ({exc}): NCCL output kept raw, not parsed",
                "phases": {}}
    try:
        df = parse(str(path), kinds="nccl")
    except Exception as exc:  # noqa: BLE001 - a parser failure is evidence, not a crash of the check
        return {"error": f"spectrial.logs.parse failed: {type(exc).__name__}: {exc}", "phases": {}}
    bounds = _phase_bounds(text)
    phases: dict[str, dict[str, list[LogRow]]] = {}
    for kind in _KINDS:
        for row in _records(df, kind):
            phase = _phase_of(int(row.get("line") or 0), bounds)
            phases.setdefault(phase, {}).setdefault(kind, []).append(row)
    return {"error": None, "phases": phases}


def _norm(value: Scalar) -> str:
    """NCCL prints integer parameters as `16777216.` and may pad: compare trimmed, numbers as numbers."""
    text = str(value).strip().rstrip(".").strip()
    try:
        return str(int(text, 0))
    except ValueError:
        return text


def set_by_environment(evidence: RankEvidence, phases: tuple[str, ...] | None = None) -> dict[str, str]:
    """NCCL's `NAME set by environment to VALUE` lines of one rank, from `phases` only (None: all)."""
    out: dict[str, str] = {}
    for ph, kinds in (evidence.get("phases") or {}).items():
        if phases is not None and ph not in phases:
            continue
        for row in kinds.get("env", []):
            name = row.get("variable")
            if name:
                out[str(name)] = str(row.get("value"))
    return out


def target_phases(how: str) -> tuple[str, ...]:
    """The log phases that describe the communicator a set's variables are meant for."""
    return ("new_group", "measure") if how == "after_init" else ("first_communicator", "measure")


def confirmed(requested: dict[str, str], seen: dict[str, str]) -> tuple[list[str], list[str], dict[str, str]]:
    """(confirmed, unconfirmed, different): requested NCCL_* variables that NCCL reported with the same
    value, did not report, or reported with another value (name -> reported value)."""
    ok, absent, other = [], [], {}
    for name, value in sorted(requested.items()):
        if not name.startswith("NCCL_"):
            continue
        if name not in seen:
            absent.append(name)
        elif _norm(seen[name]) == _norm(value):
            ok.append(name)
        else:
            other[name] = seen[name]
    return ok, absent, other


def settings_rows(set_name: str, rank: int, evidence: RankEvidence) -> list[SettingsRow]:
    """One row per phase: what NCCL says it used (variables, ranks, channels, transports, tuning)."""
    rows: list[SettingsRow] = []
    for phase, kinds in sorted((evidence.get("phases") or {}).items()):
        env = {r.get("variable"): r.get("value") for r in kinds.get("env", [])}
        init: LogRow = (kinds.get("init") or [{}])[-1]
        ch: LogRow = (kinds.get("channels") or [{}])[-1]
        version = (kinds.get("version") or [{}])[-1].get("version")
        transports = sorted({str(r.get("transport")) for r in kinds.get("connection", []) if r.get("transport")})
        rows.append({
            "set": set_name, "rank": rank, "phase": phase,
            "set_by_environment": "; ".join(f"{k}={v}" for k, v in sorted(env.items()) if k),
            "nccl_version": version, "nranks": _int(init.get("nranks")), "nnodes": _int(init.get("nnodes")),
            "local_ranks": _int(init.get("local_ranks")), "coll_channels": _int(ch.get("coll_channels")),
            "p2p_channels": _int(ch.get("p2p_channels")), "nvls_channels": _int(ch.get("nvls_channels")),
            "transports": ", ".join(transports),
            "tuning": tuning_summary(kinds.get("tuning", [])),
        })
    return rows


def tuning_summary(rows: list[LogRow]) -> str:
    """What the TUNING rows say: the algorithm/protocol pairs the tuning table enables for AllReduce
    (bandwidth > 0), and, where NCCL printed per-call lines (`N Bytes -> Algo a proto p`), the pair it
    chose per message size."""
    from spectrial.nccl.latency import human_bytes

    table = [r for r in rows if _float(r.get("bw_gbs"), None) is not None]
    calls = [r for r in rows if _float(r.get("bytes"), None) is not None and r.get("algorithm")]
    parts = []
    if table:
        pairs = sorted({f"{r.get('algorithm')}/{r.get('protocol')}" for r in table
                        if str(r.get("collective", "")).lower() == "allreduce" and _float(r.get("bw_gbs")) > 0})
        parts.append("AllReduce enabled: " + (", ".join(pairs) if pairs else "none"))
    if calls:
        chosen: dict[int, set[str]] = {}
        for r in calls:
            chosen.setdefault(int(_float(r["bytes"])), set()).add(f"{r['algorithm']}/{r.get('protocol')}")
        parts.append("chosen per call: " + "; ".join(f"{human_bytes(b)} {', '.join(sorted(v))}"
                                                      for b, v in sorted(chosen.items())))
    if not parts and rows:
        parts.append(f"{len(rows)} tuning rows")
    return " | ".join(parts)


def _int(v: Any) -> int | None:
    f = _float(v, None)
    return None if f is None else int(f)


def _float(v: Any, default: Any = 0.0) -> Any:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return default
    return default if f != f else f
