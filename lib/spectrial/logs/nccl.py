"""NCCL debug output (``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=...,TUNING``): the evidence of what NCCL used.

Kinds and columns (engine "nccl"; every row also has host, pid and rank, the ``[r]`` tag before ``NCCL``):
- ``env``: variable, value (``NCCL_PROTO set by environment to LL.``: a trailing period is not part of it).
- ``init``: nranks, nnodes, local_ranks, local_rank, cuda_dev, comm; rank is the communicator rank
  (``comm 0x.. rank 6 nRanks 16 nNodes 2 localRanks 8 localRank 6``; old ``... nranks 64 cudaDev 0 ...``).
- ``channels``: coll_channels, collnet_channels, nvls_channels, p2p_channels, p2p_channels_per_peer.
- ``connection``: channel, src, dst, transport (e.g. "P2P/CUMEM", "NET/Socket/0"), direction
  (``Channel 03/0 : 7[3] -> 5[1] via P2P/CUMEM``; old ``Ring 00 : 35 -> 34 [send] via NET/Socket/0``).
- ``tuning``: collective, algorithm, protocol with either bytes and time_us (per-call ``N Bytes -> Algo a
  proto p time t``; numeric ids are named: Algo 1 = Ring, proto 2 = Simple) or latency_us, bw_gbs and
  nthreads (the ``Algorithm | Protocol | Max NThreads`` tables of ``NCCL_DEBUG_SUBSYS=TUNING``).
- ``version``: version (``NCCL version 2.18.1+cuda12.1``).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from spectrial.logs.core import (
    NUM,
    TS_ISO,
    BlockFormat,
    BlockResult,
    FastResult,
    LineFormat,
    Rows,
    Text,
    Window,
    num,
    registry,
)

HOST = r"(?P<host>[A-Za-z0-9_.-]+):(?P<pid>[0-9]+):[0-9]+ \[[0-9]+\] NCCL"
RANK = r"\[(?P<rank>[0-9]+)\][^\[\n]*?NCCL (?:INFO|WARN|TRACE|ERROR)"
PREFIX = (TS_ISO, HOST, RANK)
_TYPES = {"host": "str", "pid": "float", "rank": "float"}
ALGORITHMS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
PROTOCOLS = ("LL", "LL128", "Simple")

registry.add(LineFormat(
    "nccl", "env", ("set by environment to",),
    (*PREFIX, r"(?P<variable>[A-Za-z_][A-Za-z0-9_]*) set by environment to (?P<value>.*?)\.?\s*$"),
    types={**_TYPES, "variable": "str", "value": "str"}, require=("variable",),
))

registry.add(LineFormat(
    "nccl", "init", ("nRanks", "nranks"),
    (TS_ISO, HOST,
     r"\bcomm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>[0-9]+)",
     RANK,
     r"\bn[Rr]anks[ =](?P<nranks>[0-9]+)",
     r"\bnNodes (?P<nnodes>[0-9]+)",
     r"\blocalRanks (?P<local_ranks>[0-9]+)",
     r"\blocalRank (?P<local_rank>[0-9]+)",
     r"\bcudaDev (?P<cuda_dev>[0-9]+)"),
    types={**_TYPES, "comm": "str"}, require=("comm",),
    key_metrics=("nranks", "nnodes", "local_ranks"),
))

registry.add(LineFormat(
    "nccl", "channels", ("coll channels",),
    (*PREFIX,
     r"(?P<coll_channels>[0-9]+) coll channels",
     r"(?P<collnet_channels>[0-9]+) collnet channels",
     r"(?P<nvls_channels>[0-9]+) nvls channels",
     r"(?P<p2p_channels>[0-9]+) p2p channels(?:,|\s*$)",
     r"(?P<p2p_channels_per_peer>[0-9]+) p2p channels per peer"),
    types=_TYPES, require=("coll_channels", "p2p_channels"),
    key_metrics=("coll_channels", "p2p_channels", "nvls_channels"),
))

registry.add(LineFormat(
    "nccl", "connection", ("] via ",),
    (*PREFIX,
     r"(?:Channel|Ring) (?P<channel>[0-9]+)(?:/[0-9]+)? : (?P<src>[0-9]+)(?:\[[0-9]+\])? -> "
     r"(?P<dst>[0-9]+)(?:\[[0-9]+\])?",
     r"\[(?P<direction>send|receive)\]",
     r" via (?P<transport>.+?)\s*$"),
    types={**_TYPES, "direction": "str", "transport": "str"}, require=("src",),
))


def _name_ids(df: pd.DataFrame) -> pd.DataFrame:
    for col, names in (("algorithm", ALGORITHMS), ("protocol", PROTOCOLS)):
        vals = df[col].to_numpy(object)
        out = np.empty(len(vals), object)
        for i, v in enumerate(vals):
            if isinstance(v, str) and v.isdigit():
                out[i] = names[int(v)] if int(v) < len(names) else v
            elif isinstance(v, str):
                out[i] = next((n for n in names if n.lower() == v.lower()), v)
            else:
                out[i] = None
        df[col] = out
    return df


TUNING_COLUMNS = {"collective": "str", "algorithm": "str", "protocol": "str", "bytes": "float",
                  "time_us": "float", "latency_us": "float", "bw_gbs": "float", "nthreads": "float"}

registry.add(LineFormat(
    "nccl", "tuning", ("Bytes -> Algo",),
    (*PREFIX,
     r"(?P<collective>[A-Za-z]+): [0-9]+ Bytes -> Algo",
     r"(?P<bytes>[0-9]+) Bytes -> Algo (?P<algorithm>[A-Za-z0-9_]+) proto (?P<protocol>[A-Za-z0-9_]+)",
     rf"\btime (?P<time_us>{NUM})"),
    types={**_TYPES, "collective": "str", "algorithm": "str", "protocol": "str"},
    require=("bytes",), finalize=_name_ids,
    output={**_TYPES, **TUNING_COLUMNS},
    key_metrics=("time_us", "latency_us", "bw_gbs"),
))

registry.add(LineFormat(
    "nccl", "version", ("NCCL version ",),
    (*PREFIX, r"NCCL version (?P<version>[0-9][0-9A-Za-z.+_-]*)"),
    types={**_TYPES, "version": "str"}, require=("version",),
))

_INFO = re.compile(r"NCCL (?:INFO|TRACE)\s?(.*)$")
_HOSTPID = re.compile(HOST)
_RANKPY = re.compile(RANK)


def _cells(line: str | None) -> tuple[str, list[str]] | None:
    m = _INFO.search(line or "")
    if not m or "|" not in m.group(1):
        return None
    parts = [c.strip() for c in m.group(1).split("|")]
    if parts and parts[-1] == "":
        parts.pop()
    return parts[0], parts[1:]


def tuning_table(w: Window) -> BlockResult:
    """``NCCL_DEBUG_SUBSYS=TUNING`` tables: one row per collective x algorithm x protocol."""
    head = _cells(w[0])
    if head is None:
        return [], 0
    k = 1
    if "/" in "".join(head[1]):  # old: `Latency/AlgBw | Tree/ LL | Tree/ LL128 | ...`
        pairs = [tuple(x.strip() for x in c.split("/", 1)) for c in head[1]]
        algos, protos = [p[0] for p in pairs], [p[-1] for p in pairs]
    else:  # new: `Algorithm | Tree | Ring |` then `Protocol | LL | LL128 | Simple | ...`
        proto = _cells(w[1])
        if proto is None or not proto[0].startswith("Protocol") or not head[1]:
            return [], 0
        per = max(len(proto[1]) // len(head[1]), 1)
        protos = proto[1]
        algos = [head[1][min(j // per, len(head[1]) - 1)] for j in range(len(protos))]
        k = 2
    base: dict[str, Any] = {}
    if (hm := _HOSTPID.search(w[0] or "")):
        base.update(host=hm.group("host"), pid=float(hm.group("pid")))
    if (rm := _RANKPY.search(w[0] or "")):
        base["rank"] = float(rm.group("rank"))
    nthreads: list[float | None] = [None] * len(protos)
    rows: list[tuple[int, int, dict[str, Any]]] = []  # (offset, column, record)
    while (row := _cells(w[k])) is not None and len(row[1]) == len(protos):
        name, vals = row
        if name.lower().startswith("max nthreads"):
            nthreads = [num(v) for v in vals]
        else:
            for j, v in enumerate(vals):
                lat, _, bw = v.partition("/")
                rows.append((k, j, {"collective": name, "latency_us": num(lat), "bw_gbs": num(bw)}))
        k += 1
    if not rows:  # the table was cut before its collectives: keep the thread counts
        rows = [(0, j, {}) for j in range(len(protos))]
    recs = [(off, {**base, **r, "algorithm": algos[j], "protocol": protos[j], "nthreads": nthreads[j]})
            for off, j, r in rows]
    return recs, k


def tuning_table_fast(text: Text, i: int) -> FastResult | None:
    """:func:`tuning_table` over the plain lines of the table, its rows as one :class:`Rows`."""
    lines = [s.decode() for s in text.lines_at(i, 64)]
    if len(lines) < 2:
        return None
    head = _cells(lines[0])
    if head is None:
        return [], 0, 1
    k = 1
    if "/" in "".join(head[1]):
        pairs = [tuple(x.strip() for x in c.split("/", 1)) for c in head[1]]
        algos, protos = [p[0] for p in pairs], [p[-1] for p in pairs]
    else:
        proto = _cells(lines[1])
        if proto is None or not proto[0].startswith("Protocol") or not head[1]:
            return [], 0, 2
        per = max(len(proto[1]) // len(head[1]), 1)
        protos = proto[1]
        algos = [head[1][min(j // per, len(head[1]) - 1)] for j in range(len(protos))]
        k = 2
    base: list[tuple[str, Any]] = []
    if (hm := _HOSTPID.search(lines[0])):
        base += [("host", hm.group("host")), ("pid", float(hm.group("pid")))]
    if (rm := _RANKPY.search(lines[0])):
        base.append(("rank", float(rm.group("rank"))))
    width = len(protos)
    nthreads: list[float | None] = [None] * width
    offsets: list[int] = []
    cells: list[tuple[str, float | None, float | None, int]] = []
    while True:
        if k >= len(lines):
            return None  # the table goes on past what was read
        row = _cells(lines[k])
        if row is None or len(row[1]) != width:
            break
        name, vals = row
        if name.lower().startswith("max nthreads"):
            nthreads = [num(v) for v in vals]
        else:
            for j, v in enumerate(vals):
                lat, _, bw = v.partition("/")
                offsets.append(k)
                cells.append((name, num(lat), num(bw), j))
        k += 1
    names = tuple(c for c, _ in base)
    first = tuple(v for _, v in base)
    if not offsets:  # the table was cut before its collectives: keep the thread counts
        return Rows([0] * width, (*names, "algorithm", "protocol", "nthreads"),
                    [(*first, algos[j], protos[j], nthreads[j]) for j in range(width)]), k, k + 1
    return Rows(offsets, (*names, "collective", "latency_us", "bw_gbs", "algorithm", "protocol", "nthreads"),
                [(*first, c, lat, bw, algos[j], protos[j], nthreads[j]) for c, lat, bw, j in cells]), k, k + 1


registry.add(BlockFormat(
    "nccl", "tuning", ("Algorithm   |", "Latency/AlgBw"), tuning_table, {**_TYPES, **TUNING_COLUMNS},
    fast=tuning_table_fast,
))
