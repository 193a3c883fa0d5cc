"""What NCCL itself says it used, per rank: the decisive evidence for NCCL environment variables.

`/proc/<pid>/environ` shows a process's environment as it was exec'd; a variable assigned inside a running
worker is invisible there yet still reaches NCCL, which reads its variables when a communicator is created
(measured on 2 H200s, ENGINES.md). With `NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV` NCCL prints, per rank,

    host:pid:tid [dev] NCCL INFO NCCL_PROTO set by environment to LL
    host:pid:tid [dev] NCCL INFO comm 0x55d0 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0
    host:pid:tid [dev] NCCL INFO 16 coll channels, 0 collnet channels, 0 nvls channels, 16 p2p channels, ...

`nccl_evidence(log_text, requested)` turns those lines into one record per process (pid, device, ranks,
variables as NCCL reported them, channel counts) and checks each requested `NCCL_*` variable on every rank.
Rows come from `spectrial.logs.parse` (engine "nccl": kinds env/init/channels), the one NCCL line parser.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

NCCL_ENV_PREFIX = "NCCL_"
# Variables that steer NCCL's logging itself: NCCL does not report them as "set by environment".
DEBUG_VARS = frozenset({"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"})
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}

def nccl_rows(log: str | pd.DataFrame) -> list[dict[str, Any]]:
    """NCCL rows of a log (its text, or the DataFrame spectrial's one log parser made of it: engine "nccl",
    kinds env, init, channels)."""
    from spectrial.logs import parse

    df = parse(log) if isinstance(log, str) else log
    if df.empty or "engine" not in df:
        return []
    out = []
    for rec in df[df["engine"] == "nccl"].to_dict("records"):
        rec = {k: v for k, v in rec.items() if v is not None and v == v}  # drop None/NaN
        if "pid" in rec:
            rec["device"] = rec.get("rank")  # the [n] tag NCCL prints is the local device
            out.append(rec)
    return out


def summarize(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One record per NCCL process: pid, device, ranks, env as NCCL reported it, channel counts."""
    procs: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        key = (str(r.get("host", "")), int(r.get("pid", 0)))
        p = procs.setdefault(key, {"host": key[0], "pid": key[1], "device": None, "ranks": [], "nranks": [],
                                   "env": {}, "coll_channels": [], "p2p_channels": [], "nccl_version": None})
        if p["device"] is None and r.get("device") is not None:
            p["device"] = int(r["device"])
        kind = r.get("kind")
        if kind == "env":
            p["env"][str(r["variable"])] = str(r["value"])
        elif kind == "init":
            if r.get("rank") is not None and int(r["rank"]) not in p["ranks"]:
                p["ranks"].append(int(r["rank"]))
            if r.get("nranks") is not None and int(r["nranks"]) not in p["nranks"]:
                p["nranks"].append(int(r["nranks"]))
        elif kind == "channels":
            p["coll_channels"].append(int(r["coll_channels"]))
            p["p2p_channels"].append(int(r["p2p_channels"]))
        elif kind == "version":
            p["nccl_version"] = r.get("version")
    return sorted(procs.values(), key=lambda p: (p["host"], -1 if p["device"] is None else p["device"], p["pid"]))


def nccl_evidence(log: str | pd.DataFrame, requested: Mapping[str, str]) -> dict[str, Any]:
    """Per process what NCCL reported, and for each requested NCCL_* variable whether every rank used it.

    Returns {"ok", "source", "processes": [...], "variables": {VAR: {"requested", "confirmed": [pids],
    "missing": [pids], "different": {pid: value}}}, "problems": [...]}; `ok` is None when the log holds
    no NCCL INFO lines at all (NCCL_DEBUG not on, or no communicator was created).
    """
    source = "spectrial.logs"
    procs = summarize(nccl_rows(log))
    wanted = {k: v for k, v in requested.items() if k.startswith(NCCL_ENV_PREFIX) and k not in DEBUG_VARS}
    variables: dict[str, Any] = {}
    problems: list[str] = []
    for var, val in wanted.items():
        entry: dict[str, Any] = {"requested": val, "confirmed": [], "missing": [], "different": {}}
        for p in procs:
            got = p["env"].get(var)
            if got is None:
                entry["missing"].append(p["pid"])
                problems.append(f"{var}: NCCL in pid {p['pid']} (device {p['device']}) did not report it "
                                f"as set by environment")
            elif got != val:
                entry["different"][str(p["pid"])] = got
                problems.append(f"{var}: NCCL in pid {p['pid']} (device {p['device']}) used {got!r}, "
                                f"requested {val!r}")
            else:
                entry["confirmed"].append(p["pid"])
        variables[var] = entry
    ok: bool | None = None if not procs else not problems
    if not procs and wanted:
        problems.append("no NCCL INFO lines in the server log (NCCL_DEBUG=INFO not reaching NCCL, or no "
                        "communicator created, e.g. tp_size 1)")
    return {"ok": ok, "source": source, "processes": procs, "variables": variables, "problems": problems}


def evidence_summary(ev: Mapping[str, Any]) -> str:
    """One line for the record's notes."""
    procs = ev.get("processes") or []
    if not procs:
        return "NCCL evidence: no NCCL INFO lines found"
    parts = []
    for var, e in (ev.get("variables") or {}).items():
        parts.append(f"{var}={e['requested']} confirmed by NCCL in {len(e['confirmed'])}/{len(procs)} rank(s)")
    chans = sorted({c for p in procs for c in p["coll_channels"]})
    tail = f"; coll channels {chans}" if chans else ""
    return f"NCCL evidence ({len(procs)} rank(s)): " + ("; ".join(parts) or "no NCCL_* variables requested") + tail
