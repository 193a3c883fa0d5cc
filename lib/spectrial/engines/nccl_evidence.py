"""What NCCL itself says it used, per rank: the decisive evidence for NCCL environment variables.

`/proc/<pid>/environ` shows a process's environment as it was exec'd; a variable assigned inside a running
worker is invisible there yet still reaches NCCL, which reads its variables when a communicator is created
(measured on 2 H200s, ENGINES.md). With `NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV` NCCL prints, per rank,

    host:pid:tid [dev] NCCL INFO NCCL_PROTO set by environment to LL
    host:pid:tid [dev] NCCL INFO comm 0x55d0 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0
    host:pid:tid [dev] NCCL INFO 16 coll channels, 0 collnet channels, 0 nvls channels, 16 p2p channels, ...

`nccl_evidence(log_text, requested)` turns those lines into one `NcclProcess` per process (pid, device, ranks,
variables as NCCL reported them, channel counts) and checks each requested `NCCL_*` variable on every rank.
Rows come from `spectrial.logs.parse` (engine "nccl": kinds env/init/channels), the one NCCL line parser.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pandas as pd
from pydantic import BaseModel, ConfigDict

from spectrial.schema import NcclEvidence, NcclProcess, NcclVariable

NCCL_ENV_PREFIX = "NCCL_"
# Variables that steer NCCL's logging itself: NCCL does not report them as "set by environment".
DEBUG_VARS = frozenset({"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"})
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}

class NcclLine(BaseModel):
    """One NCCL line as spectrial's log parser read it (engine "nccl"): who printed it, and what it says."""

    model_config = ConfigDict(extra="ignore", coerce_numbers_to_str=True)

    host: str = ""
    pid: int
    kind: str | None = None  # env, init, channels, version
    device: int | None = None  # the [n] tag NCCL prints: the local device (the parser calls it rank)
    rank: int | None = None  # init: the rank in the communicator
    nranks: int | None = None
    variable: str | None = None  # env: NCCL_X set by environment to value
    value: str | None = None
    coll_channels: int | None = None
    p2p_channels: int | None = None
    version: str | None = None


def nccl_rows(log: str | pd.DataFrame) -> list[NcclLine]:
    """NCCL lines of a log (its text, or the DataFrame spectrial's one log parser made of it: engine "nccl",
    kinds env, init, channels, version)."""
    from spectrial.logs import parse

    df = parse(log) if isinstance(log, str) else log
    if df.empty or "engine" not in df:
        return []
    out = []
    for rec in df[df["engine"] == "nccl"].to_dict("records"):  # a parsed row, validated at once
        rec = {str(k): v for k, v in rec.items() if v is not None and v == v}  # drop None/NaN
        if "pid" in rec:
            out.append(NcclLine.model_validate({**rec, "device": rec.get("rank")}))
    return out


def summarize(rows: Iterable[NcclLine]) -> list[NcclProcess]:
    """One record per NCCL process: pid, device, ranks, env as NCCL reported it, channel counts."""
    procs: dict[tuple[str, int], NcclProcess] = {}
    for r in rows:
        p = procs.setdefault((r.host, r.pid), NcclProcess(host=r.host, pid=r.pid))
        if p.device is None and r.device is not None:
            p.device = r.device
        if r.kind == "env" and r.variable is not None:
            p.env[r.variable] = str(r.value)
        elif r.kind == "init":
            if r.rank is not None and r.rank not in p.ranks:
                p.ranks.append(r.rank)
            if r.nranks is not None and r.nranks not in p.nranks:
                p.nranks.append(r.nranks)
        elif r.kind == "channels" and r.coll_channels is not None and r.p2p_channels is not None:
            p.coll_channels.append(r.coll_channels)
            p.p2p_channels.append(r.p2p_channels)
        elif r.kind == "version":
            p.nccl_version = r.version
    return sorted(procs.values(), key=lambda p: (p.host, -1 if p.device is None else p.device, p.pid))


def nccl_evidence(log: str | pd.DataFrame, requested: Mapping[str, str]) -> NcclEvidence:
    """Per process what NCCL reported, and for each requested NCCL_* variable whether every rank used it
    (`ok` None when the log holds no NCCL INFO lines at all: NCCL_DEBUG not on, or no communicator created)."""
    procs = summarize(nccl_rows(log))
    wanted = {k: v for k, v in requested.items() if k.startswith(NCCL_ENV_PREFIX) and k not in DEBUG_VARS}
    variables: dict[str, NcclVariable] = {}
    problems: list[str] = []
    for var, val in wanted.items():
        entry = variables[var] = NcclVariable(requested=val)
        for p in procs:
            got = p.env.get(var)
            if got is None:
                entry.missing.append(p.pid)
                problems.append(f"{var}: NCCL in pid {p.pid} (device {p.device}) did not report it "
                                f"as set by environment")
            elif got != val:
                entry.different[str(p.pid)] = got
                problems.append(f"{var}: NCCL in pid {p.pid} (device {p.device}) used {got!r}, "
                                f"requested {val!r}")
            else:
                entry.confirmed.append(p.pid)
    ok: bool | None = None if not procs else not problems
    if not procs and wanted:
        problems.append("no NCCL INFO lines in the server log (NCCL_DEBUG=INFO not reaching NCCL, or no "
                        "communicator created, e.g. tp_size 1)")
    return NcclEvidence(ok=ok, source="spectrial.logs", processes=procs, variables=variables, problems=problems)


def evidence_summary(ev: NcclEvidence) -> str:
    """One line for the record's notes."""
    procs = ev.processes
    if not procs:
        return "NCCL evidence: no NCCL INFO lines found"
    parts = [f"{var}={e.requested} confirmed by NCCL in {len(e.confirmed)}/{len(procs)} rank(s)"
             for var, e in ev.variables.items()]
    chans = sorted({c for p in procs for c in p.coll_channels})
    tail = f"; coll channels {chans}" if chans else ""
    return f"NCCL evidence ({len(procs)} rank(s)): " + ("; ".join(parts) or "no NCCL_* variables requested") + tail
