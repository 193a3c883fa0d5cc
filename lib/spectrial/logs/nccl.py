"""NCCL debug output (``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=...,TUNING``): the evidence of what NCCL used.

Kinds and columns (engine "nccl"; every row also has host, pid and rank, the ``[r]`` tag before ``NCCL``):
- ``env``: variable, value (``NCCL_PROTO set by environment to LL.``: a trailing period is not part of it).
- ``init``: nranks, nnodes, local_ranks, local_rank, cuda_dev, comm, state ("Init START", "Init COMPLETE"
  where printed); rank is the communicator rank (``comm 0x.. rank 6 nRanks 16 nNodes 2 localRanks 8
  localRank 6``; old ``... nranks 64 cudaDev 0 ...``).
- ``destroy``: the same columns for ``comm 0x.. rank 0 nranks 2 cudaDev 0 busId 60 - Destroy COMPLETE``
  (and ``- Abort COMPLETE``), state "Destroy COMPLETE" / "Abort COMPLETE": a communicator's end, not a
  second init.
- ``channels``: coll_channels, collnet_channels, nvls_channels, p2p_channels, p2p_channels_per_peer.
- ``connection``: channel, src, dst, transport (e.g. "P2P/CUMEM", "NET/Socket/0"), direction
  (``Channel 03/0 : 7[3] -> 5[1] via P2P/CUMEM``, the bracket a device or a hex bus id; old
  ``Ring 00 : 35 -> 34 [send] via NET/Socket/0``).
- ``tuning``: collective, algorithm, protocol with either bytes and time_us (per-call ``N Bytes -> Algo a
  proto p time t``; numeric ids are named: Algo 1 = Ring, proto 2 = Simple) or latency_us, bw_gbs and
  nthreads (the ``Algorithm | Protocol | Max NThreads`` tables of ``NCCL_DEBUG_SUBSYS=TUNING``).
- ``version``: version (``NCCL version 2.18.1+cuda12.1``).
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spectrial.logs.chunks import Chunk, Window
from spectrial.logs.columns import numbers
from spectrial.logs.formats import MORE, BlockFormat, BlockResult, Blocks, LineFormat, Record
from spectrial.logs.native import blocks as compiled
from spectrial.logs.registry import registry
from spectrial.logs.text import NUM, TS_ISO, num, re2
from spectrial.logs.vector import ROW, SKIP, STOP, last_per, np_bool, scan, split_once, to_str_numpy

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

def _init_state(df: pd.DataFrame) -> pd.DataFrame:
    """`... - Destroy COMPLETE` / `- Abort COMPLETE` lines are a communicator's end: kind destroy."""
    state = df["state"].to_numpy(object)
    end = np.array([isinstance(s, str) and s.startswith(("Destroy", "Abort")) for s in state], dtype=bool)
    df["kind"] = np.where(end, "destroy", "init")
    return df


registry.add(LineFormat(
    "nccl", "init", ("nRanks", "nranks"),
    (TS_ISO, HOST,
     r"\bcomm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>[0-9]+)",
     RANK,
     r"\bn[Rr]anks[ =](?P<nranks>[0-9]+)",
     r"\bnNodes (?P<nnodes>[0-9]+)",
     r"\blocalRanks (?P<local_ranks>[0-9]+)",
     r"\blocalRank (?P<local_rank>[0-9]+)",
     r"\bcudaDev (?P<cuda_dev>[0-9]+)",
     r" - (?P<state>(?:Init|Destroy|Abort) (?:START|COMPLETE))"),
    types={**_TYPES, "comm": "str", "state": "str"}, require=("comm",), finalize=_init_state, rowwise=True, kinds=("destroy",),
    output={**_TYPES, "comm": "str", "nranks": "float", "nnodes": "float", "local_ranks": "float",
            "local_rank": "float", "cuda_dev": "float", "state": "str"},
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
     r"(?:Channel|Ring) (?P<channel>[0-9]+)(?:/[0-9]+)? : (?P<src>[0-9]+)(?:\[[0-9a-fA-F]+\])? -> "
     r"(?P<dst>[0-9]+)(?:\[[0-9a-fA-F]+\])?",
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
    require=("bytes",), finalize=_name_ids, rowwise=True,
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
    base: Record = {}
    if (hm := _HOSTPID.search(w[0] or "")):
        base.update(host=hm.group("host"), pid=float(hm.group("pid")))
    if (rm := _RANKPY.search(w[0] or "")):
        base["rank"] = float(rm.group("rank"))
    nthreads: list[float | None] = [None] * len(protos)
    rows: list[tuple[int, int, Record]] = []  # (offset, column, record)
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


_PREFIX_V = re2(r"^.*?NCCL (?:INFO|TRACE)")


def _bodies(text: pa.Array) -> pa.Array:
    """What follows each line's first ``NCCL INFO`` / ``NCCL TRACE`` (null where neither is), give or take
    the one whitespace character `_INFO` skips (the cells are stripped)."""
    parts = pc.split_pattern(text, "NCCL INFO", max_splits=1)
    offs = parts.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    found = np.diff(offs) == 2
    body = parts.values.take(pa.array(offs[1:] - 1, mask=~found))
    trace = np.flatnonzero(np_bool(pc.match_substring(text, "NCCL TRACE")))
    if len(trace):  # the first of the two decides
        sub = text.take(pa.array(trace))
        alt = pc.replace_substring_regex(sub, _PREFIX_V, "", max_replacements=1)
        pos = np.arange(len(text))
        pos[trace] = len(text) + np.arange(len(trace))
        body = pa.concat_arrays([body, alt]).take(pa.array(pos))
    return body


def _cells_v(text: pa.Array) -> tuple[np.ndarray, pa.Array, np.ndarray, np.ndarray]:
    """:func:`_cells` of each (plain) line: (is a table line, all cells, cells per line, first cell's index)."""
    body = _bodies(text)
    ok = np_bool(pc.match_substring(body, "|"))
    parts = pc.split_pattern(pc.fill_null(body, ""), "|")
    cells = pc.ascii_trim_whitespace(parts.values)
    offs = parts.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    counts = np.diff(offs)
    last = offs[1:] - 1
    empty_last = np.zeros(len(counts), dtype=bool)
    has = np.flatnonzero(counts > 0)
    empty_last[has] = np_bool(pc.equal(cells.take(pa.array(last[has])), ""))
    return ok, cells, counts - empty_last, offs[:-1]


def _tuning_plan(first: str | None, second: str | None) -> tuple[int, list[str], list[str], Record] | None:
    """What the head of a tuning table says: (first row offset, algorithms, protocols, host/pid/rank)."""
    m1, m2 = _INFO.search(first or ""), _INFO.search(second or "")
    head = _head(m1.group(1) if m1 else None, m2.group(1) if m2 else None)
    if head is None:
        return None
    base: Record = {}
    if (hm := _HOSTPID.search(first or "")):
        base.update(host=hm.group("host"), pid=float(hm.group("pid")))
    if (rm := _RANKPY.search(first or "")):
        base["rank"] = float(rm.group("rank"))
    return (*head, base)


@functools.lru_cache(maxsize=1024)
def _head(first: str | None, second: str | None) -> tuple[int, list[str], list[str]] | None:
    """(first row offset, algorithms, protocols) from the bodies (after ``NCCL INFO``) of a table's first
    two lines, as :func:`tuning_table` reads them (cached: every rank prints the same table)."""
    head = _cells(f"NCCL INFO {first}") if first is not None else None
    if head is None:
        return None
    if "/" in "".join(head[1]):
        pairs = [tuple(x.strip() for x in c.split("/", 1)) for c in head[1]]
        return 1, [p[0] for p in pairs], [p[-1] for p in pairs]
    proto = _cells(f"NCCL INFO {second}") if second is not None else None
    if proto is None or not proto[0].startswith("Protocol") or not head[1]:
        return None
    per = max(len(proto[1]) // len(head[1]), 1)
    algos = [head[1][min(j // per, len(head[1]) - 1)] for j in range(len(proto[1]))]
    return 2, algos, proto[1]


def tuning_table_vector(chunk: Chunk, at: np.ndarray) -> Blocks:
    """:func:`tuning_table` of all the chunk's tables at once: the heads in Python (two lines per table),
    the rows with column kernels."""
    nb = len(at)
    second = at + 1
    status = np.where((second >= chunk.n) & (not chunk.final), MORE, 0)
    plans = [_tuning_plan(a, b) for a, b in zip(chunk.strings(at), chunk.strings(np.minimum(second, chunk.n)),
                                               strict=True)]
    tabs = np.flatnonzero([p is not None for p in plans])
    used = np.zeros(nb, np.int64)
    examined = np.where(status == MORE, 1, 2)
    if not len(tabs):
        return Blocks(used, examined, np.zeros(0, np.int64), np.zeros(0, np.int64), {}, status)
    tp = [plans[t] for t in tabs.tolist()]
    k0 = np.array([p[0] for p in tp], np.int64)  # type: ignore[index]
    width = np.array([len(p[2]) for p in tp], np.int64)  # type: ignore[index]

    def classify(text: pa.Array, block: np.ndarray, offset: np.ndarray) -> np.ndarray:
        ok, _, counts, _ = _cells_v(text)
        row = ok & (counts - 1 == width[block])
        return np.where((offset < k0[block]), SKIP, np.where(row, ROW, STOP))

    sc = scan(chunk, at[tabs], classify, first=16)
    rows = sc.rows(ROW)
    blk, off = sc.block[rows], sc.offset[rows]
    _, cells, _, first = _cells_v(sc.text.take(pa.array(rows)))
    name = cells.take(pa.array(first))
    threads = np_bool(pc.starts_with(pc.utf8_lower(name), "max nthreads"))
    wr = width[blk]
    # every cell after the name: (row, column j)
    rr = np.repeat(np.arange(len(rows)), wr)
    jj = np.arange(len(rr)) - np.repeat(np.cumsum(wr) - wr, wr)
    vals = cells.take(pa.array(first[rr] + 1 + jj))
    lat, bw = split_once(vals, "/")
    lat_v = numbers(pc.ascii_trim_whitespace(lat))[0]
    bw_v = numbers(pc.ascii_trim_whitespace(pc.fill_null(bw, "")))[0]
    starts = np.concatenate(([0], np.cumsum(width)))
    nth = np.full(starts[-1], np.nan)
    tsel = np.flatnonzero(threads[rr])
    if len(tsel):  # the last `Max NThreads` row of a table holds for all its rows
        tsel = tsel[last_per(blk[rr[tsel]], jj[tsel])]
        nth[starts[blk[rr[tsel]]] + jj[tsel]] = lat_v[tsel]
    csel = np.flatnonzero(~threads[rr])
    has_rows = np.bincount(blk[rr[csel]], minlength=len(tabs)) > 0
    empty = np.flatnonzero(~has_rows)  # a table cut before its collectives: one record per column
    eb = np.repeat(empty, width[empty])
    ej = np.arange(len(eb)) - np.repeat(np.cumsum(width[empty]) - width[empty], width[empty])
    rb = np.concatenate((blk[rr[csel]], eb))
    ro = np.concatenate((off[rr[csel]], np.zeros(len(eb), np.int64)))
    rj = np.concatenate((jj[csel], ej))
    order = np.lexsort((np.arange(len(rb)), ro, rb))
    rb, ro, rj = rb[order], ro[order], rj[order]
    nrec = len(rb)
    src = np.concatenate((csel, np.full(len(eb), -1)))[order]
    real = src >= 0
    coll = np.empty(nrec, object)
    coll[real] = to_str_numpy(name.take(pa.array(rr[src[real]])))
    alg_flat = np.array([a for p in tp for a in p[1]], dtype=object)  # type: ignore[index]
    proto_flat = np.array([q for p in tp for q in p[2]], dtype=object)  # type: ignore[index]
    at_j = starts[rb] + rj
    cols: dict[str, np.ndarray] = {
        "collective": coll,
        # src -1 (a table without rows) reads the NaN appended: lat_v is empty when no table has a row
        "latency_us": np.append(lat_v, np.nan)[src],
        "bw_gbs": np.append(bw_v, np.nan)[src],
        "algorithm": alg_flat[at_j], "protocol": proto_flat[at_j], "nthreads": nth[at_j],
    }
    for c in ("host", "pid", "rank"):
        per = np.array([p[3].get(c) for p in tp], dtype=object)  # type: ignore[index]
        if any(v is not None for v in per):
            cols[c] = per[rb]
    used[tabs] = sc.end
    examined[tabs] = np.maximum(sc.examined, examined[tabs])
    status[tabs] = np.where(sc.more, MORE, status[tabs])
    return Blocks(used, examined, tabs[rb], ro, cols, status)


registry.add(BlockFormat(
    "nccl", "tuning", ("Algorithm   |", "Latency/AlgBw"), tuning_table, {**_TYPES, **TUNING_COLUMNS},
    vector=compiled.reader(compiled.Spec("nccl_tuning", ("pid", "rank", "latency_us", "bw_gbs", "nthreads"),
                                         ("host", "collective", "algorithm", "protocol")), tuning_table_vector),
))
