"""nvidia-smi output: the table, ``--query-gpu`` CSV, ``-q``, ``-L`` and ``topo -m``.

Kinds and columns (engine "nvidia-smi"):
- ``gpu``: index, name, driver_version, cuda_version, memory_used_mib, memory_total_mib, util_pct, temp_c,
  power_w, pstate, and where printed uuid, bus_id, persistence, power_cap_w, fan_pct, memory_free_mib,
  sm_clock_mhz, sm_clock_max_mhz, pcie_gen, pcie_width. Tables of every layout seen (515 classic, 535,
  595) and driver 610's ``KMD Version`` / ``CUDA UMD Version`` header; CSV with a header line, after the
  echoed ``--query-gpu=...`` command, or headerless rows of spectrial's portable query; ``> `` paste
  quotes and indentation are ignored; ``N/A`` / ``[Not Supported]`` -> None. The table's date line
  above the header is its timestamp.
- ``topology`` (``nvidia-smi topo -m``, space or tab separated): src, dst, link (e.g. "NV18", "SYS"),
  cpu_affinity, numa_affinity of src; the diagonal ``X`` is skipped.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spectrial.logs.chunks import Chunk, Window
from spectrial.logs.columns import numbers
from spectrial.logs.formats import MORE, BlockFormat, BlockResult, Blocks, Record
from spectrial.logs.native import blocks as compiled
from spectrial.logs.registry import register, registry
from spectrial.logs.text import NUM, named, num, re2
from spectrial.logs.vector import (
    ROW,
    SKIP,
    STOP,
    first_group,
    np_bool,
    scan,
    split_ws,
    texts_at,
    to_str_numpy,
)

GPU_COLUMNS: dict[str, str] = {
    "index": "float", "name": "str", "driver_version": "str", "cuda_version": "str",
    "memory_used_mib": "float", "memory_total_mib": "float", "util_pct": "float", "temp_c": "float",
    "power_w": "float", "pstate": "str", "uuid": "str", "bus_id": "str", "persistence": "str",
    "power_cap_w": "float", "fan_pct": "float", "memory_free_mib": "float", "sm_clock_mhz": "float",
    "sm_clock_max_mhz": "float", "pcie_gen": "float", "pcie_width": "float",
}
GPU_METRICS = ("memory_used_mib", "util_pct", "temp_c", "power_w")
PORTABLE_QUERY = ["index", "name", "uuid", "memory.used", "memory.total", "clocks.sm", "clocks.max.sm",
                  "pcie.link.gen.current", "pcie.link.width.current", "driver_version", "temperature.gpu",
                  "power.draw"]  # ENGINES.md's portable --query-gpu, printed with noheader
QUERY_FIELDS = {
    "index": "index", "name": "name", "gpu_name": "name", "uuid": "uuid", "gpu_uuid": "uuid",
    "pci.bus_id": "bus_id", "gpu_bus_id": "bus_id", "driver_version": "driver_version",
    "memory.used": "memory_used_mib", "memory.total": "memory_total_mib", "memory.free": "memory_free_mib",
    "utilization.gpu": "util_pct", "temperature.gpu": "temp_c", "power.draw": "power_w",
    "power.draw.instant": "power_w", "power.draw.average": "power_w", "power.limit": "power_cap_w",
    "enforced.power.limit": "power_cap_w", "pstate": "pstate", "fan.speed": "fan_pct",
    "persistence_mode": "persistence", "clocks.sm": "sm_clock_mhz", "clocks.current.sm": "sm_clock_mhz",
    "clocks.max.sm": "sm_clock_max_mhz", "clocks.max.graphics": "sm_clock_max_mhz",
    "pcie.link.gen.current": "pcie_gen", "pcie.link.gen.gpucurrent": "pcie_gen",
    "pcie.link.width.current": "pcie_width", "timestamp": "timestamp",
}
_QUOTE = re.compile(r"^\s*(?:>\s?)+")
_DATE = re.compile(r"^\s*(?P<timestamp>[A-Z][a-z]{2} [A-Z][a-z]{2} +[0-9]{1,2} [0-9]{2}:[0-9]{2}:[0-9]{2} [0-9]{4})")


def _unquote(s: str | None) -> str:
    return _QUOTE.sub("", s or "").strip()


def _value(col: str, text: str) -> Any:
    v = text.strip()
    if not v or v.startswith("[") or v.upper() in ("N/A", "NA"):
        return None
    return v if GPU_COLUMNS.get(col, "str") == "str" else num(v)


# ---------------------------------------------------------------- the table
_ROW1 = re.compile(r"^\|\s*(?P<index>[0-9]+)\s+(?P<name>.+?)(?:\s+(?P<persistence>On|Off))?\s*\|\s*"
                   r"(?P<bus_id>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
_ROW2 = {
    "fan_pct": re.compile(r"^\|\s*([0-9]+)\s*%"),
    "temp_c": re.compile(r"\b([0-9]+)\s*C\b"),
    "pstate": re.compile(r"\b(P[0-9]{1,2})\b"),
    "power_w": re.compile(rf"({NUM})\s*W\s*/"),
    "power_cap_w": re.compile(rf"/\s*({NUM})\s*W\b"),
    "memory_used_mib": re.compile(r"([0-9]+)\s*MiB\s*/"),
    "memory_total_mib": re.compile(r"/\s*([0-9]+)\s*MiB"),
    "util_pct": re.compile(r"MiB\s*\|\s*([0-9]+)\s*%"),
}
_DRIVER = re.compile(r"(?:Driver|KMD) Version:\s*([0-9][0-9A-Za-z.-]*)")
_CUDA = re.compile(r"CUDA(?: UMD)? Version:\s*([0-9][0-9A-Za-z.-]*)")


def smi_table(w: Window) -> BlockResult:
    """The ``nvidia-smi`` table: header with driver/CUDA versions, then two lines per GPU."""
    head = w[0] or ""
    common: Record = {
        "driver_version": (m.group(1) if (m := _DRIVER.search(head)) else None),
        "cuda_version": (m.group(1) if (m := _CUDA.search(head)) else None),
    }
    for k in (-1, -2, -3):
        if (d := _DATE.match(w[k] or "")):
            common["timestamp"] = d.group("timestamp")
            break
    recs: list[tuple[int, Record]] = []
    k = 1
    while (s := w[k]) is not None:
        t = _unquote(s)
        if not t or t[0] not in "|+":
            break
        m = _ROW1.match(t)
        if m:
            rec = {**common, "index": float(m.group("index")), "name": m.group("name").strip(),
                   "persistence": m.group("persistence"), "bus_id": m.group("bus_id")}
            row2 = _unquote(w[k + 1])
            for col, rx in _ROW2.items():
                if (v := rx.search(row2)):
                    rec[col] = v.group(1) if col == "pstate" else num(v.group(1))
            recs.append((k, rec))
        k += 1
    return (recs, k) if recs else ([], 0)


_QUOTE_V = re2(_QUOTE.pattern)
_ROW1_V = re2(_ROW1.pattern)
_ROW2_V = {c: re2(named(rx.pattern)) for c, rx in _ROW2.items()}
_DRIVER_V = re2(named(_DRIVER.pattern))
_CUDA_V = re2(named(_CUDA.pattern))
_DATE_V = re2(_DATE.pattern)


def _unquote_v(text: pa.Array) -> pa.Array:
    """:func:`_unquote` of each (plain) line."""
    return pc.ascii_trim_whitespace(pc.replace_substring_regex(text, _QUOTE_V, "", max_replacements=1))


def _smi_classify(text: pa.Array, block: np.ndarray, offset: np.ndarray) -> np.ndarray:
    t = _unquote_v(text)
    head = pc.utf8_slice_codeunits(t, 0, 1)
    table = np_bool(pc.or_(pc.equal(head, "|"), pc.equal(head, "+")))
    row1 = np_bool(pc.match_substring_regex(t, _ROW1_V))
    return np.where(~table, STOP, np.where(row1, ROW, SKIP))


def smi_table_vector(chunk: Chunk, at: np.ndarray) -> Blocks:
    """:func:`smi_table` of all the chunk's tables at once."""
    nb = len(at)
    head = chunk.texts(at)
    common = {"driver_version": to_str_numpy(first_group(head, _DRIVER_V)),
              "cuda_version": to_str_numpy(first_group(head, _CUDA_V))}
    stamp = np.empty(nb, object)
    for k in (-3, -2, -1):  # the nearest date line wins
        text, inside = texts_at(chunk, at, k)
        found = to_str_numpy(pc.struct_field(pc.extract_regex(text, _DATE_V), [0]))
        hit = inside & (found != None)  # noqa: E711 - elementwise
        stamp[hit] = found[hit]
    sc = scan(chunk, at, _smi_classify, first=16)
    rows = sc.rows(ROW)
    blk, off = sc.block[rows], sc.offset[rows]
    m = pc.extract_regex(_unquote_v(sc.text.take(pa.array(rows))), _ROW1_V)
    persistence = pc.struct_field(m, "persistence")
    cols: dict[str, np.ndarray] = {
        "index": numbers(pc.struct_field(m, "index"))[0],
        "name": to_str_numpy(pc.ascii_trim_whitespace(pc.struct_field(m, "name"))),
        "persistence": to_str_numpy(pc.if_else(pc.equal(persistence, ""), pa.scalar(None, pa.string()), persistence)),
        "bus_id": to_str_numpy(pc.struct_field(m, "bus_id")),
        **{c: v[blk] for c, v in common.items()},
        "timestamp": stamp[blk],
    }
    row2, _ = texts_at(chunk, at[blk] + off, 1)
    row2 = _unquote_v(row2)
    for c, pattern in _ROW2_V.items():
        got = first_group(row2, pattern)
        cols[c] = to_str_numpy(got) if c == "pstate" else numbers(got)[0]
    has = np.zeros(nb, dtype=bool)
    has[blk] = True
    used = np.where(has, sc.end, 0)
    return Blocks(used, sc.examined, blk, off, cols, np.where(sc.more, MORE, 0))


registry.add(BlockFormat(
    "nvidia-smi", "gpu", ("NVIDIA-SMI ",), smi_table, GPU_COLUMNS, key_metrics=GPU_METRICS, timestamps=(),
    lookback=3, vector=compiled.reader(compiled.Spec(
        "smi_table", ("index", "fan_pct", "temp_c", "power_w", "power_cap_w", "memory_used_mib",
                      "memory_total_mib", "util_pct"),
        ("name", "bus_id", "pstate", "driver_version", "cuda_version", "timestamp"),
        {"persistence": ("On", "Off")}), smi_table_vector),
))


# ---------------------------------------------------------------- --query-gpu CSV
_QUERY = re.compile(r"--query-gpu[= ]\s*([A-Za-z0-9_.,]+)")


def _field(token: str) -> str:
    return re.sub(r"\s*\[.*?\]\s*$", "", token.strip()).lower()


def _header(line: str) -> list[str] | None:
    fields = [_field(t) for t in line.split(",")]
    return fields if sum(f in QUERY_FIELDS for f in fields) >= max(2, len(fields) // 2) else None


def query_csv(w: Window) -> BlockResult:
    """CSV rows of ``--query-gpu``, named by the echoed command, a header line or the portable query."""
    first = _unquote(w[0])
    k = 0
    fields: list[str] | None = None
    if (m := _QUERY.search(first)):
        fields = [f.lower() for f in m.group(1).split(",") if f]
        k = 1
        if (h := _header(_unquote(w[1]))) and len(h) == len(fields):
            k = 2
    elif (h := _header(first)):
        fields, k = h, 1
    else:
        cells = [c.strip() for c in first.split(",")]
        if len(cells) == len(PORTABLE_QUERY) and cells[2].startswith("GPU-"):
            fields = PORTABLE_QUERY
    if not fields:
        return [], 0
    cols = [QUERY_FIELDS.get(f) for f in fields]
    recs: list[tuple[int, Record]] = []
    while (s := w[k]) is not None:
        cells = [c.strip() for c in _unquote(s).split(",")]
        if len(cells) != len(fields) or not any(cells):
            break
        rec = {c: _value(c, v) for c, v in zip(cols, cells, strict=True) if c}
        recs.append((k, rec))
        k += 1
    return (recs, k) if recs else ([], 0)


def _query_plan(first: str, second: str | None) -> tuple[int, tuple[str, ...]] | None:
    """(first row offset, fields) of a --query-gpu block from its first two lines, or None."""
    first = _unquote(first)
    if (m := _QUERY.search(first)):
        fields = [f.lower() for f in m.group(1).split(",") if f]
        k = 2 if (h := _header(_unquote(second))) and len(h) == len(fields) else 1
        return (k, tuple(fields)) if fields else None
    if (h := _header(first)):
        return 1, tuple(h)
    cells = [c.strip() for c in first.split(",")]
    if len(cells) == len(PORTABLE_QUERY) and cells[2].startswith("GPU-"):
        return 0, tuple(PORTABLE_QUERY)
    return None


def _csv_cells(text: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """The stripped comma-separated cells of each unquoted line: (cells, cells per line, first cell's index)."""
    parts = pc.split_pattern(_unquote_v(text), ",")
    offs = parts.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    return pc.ascii_trim_whitespace(parts.values), np.diff(offs), offs[:-1]


def query_csv_vector(chunk: Chunk, at: np.ndarray) -> Blocks:
    """:func:`query_csv` of all the chunk's marker lines at once: the heads in Python, the rows with
    column kernels."""
    nb = len(at)
    nxt = np.minimum(at + 1, chunk.n)
    plans = [_query_plan(a or "", b) for a, b in zip(chunk.strings(at), chunk.strings(nxt), strict=True)]
    status = np.where((at + 1 >= chunk.n) & (not chunk.final), MORE, 0)
    blocks = np.flatnonzero([p is not None for p in plans])
    used = np.zeros(nb, np.int64)
    examined = np.full(nb, 2, np.int64)
    if not len(blocks):
        return Blocks(used, examined, np.zeros(0, np.int64), np.zeros(0, np.int64), {}, status)
    plan_ids: dict[tuple[str, ...], int] = {}
    pid = np.array([plan_ids.setdefault(plans[b][1], len(plan_ids)) for b in blocks.tolist()], np.int64)  # type: ignore[index]
    k0 = np.array([plans[b][0] for b in blocks.tolist()], np.int64)  # type: ignore[index]
    width = np.array([len(plans[b][1]) for b in blocks.tolist()], np.int64)  # type: ignore[index]

    def classify(text: pa.Array, block: np.ndarray, offset: np.ndarray) -> np.ndarray:
        cells, counts, _ = _csv_cells(text)
        filled = np.bincount(np.repeat(np.arange(len(text)), counts),
                             weights=np_bool(pc.not_equal(cells, "")), minlength=len(text)) > 0
        row = (counts == width[block]) & filled
        return np.where(offset < k0[block], SKIP, np.where(row, ROW, STOP))

    sc = scan(chunk, at[blocks], classify, start=0, first=8)
    rows = sc.rows(ROW)
    has = np.zeros(len(blocks), dtype=bool)
    has[sc.block[rows]] = True  # a block claims its rows; a row whose fields name no column is no record
    names_one = np.array([any(QUERY_FIELDS.get(f) for f in fields) for fields in plan_ids], dtype=bool)
    rows = rows[names_one[pid[sc.block[rows]]]]
    blk = sc.block[rows]
    cells, _, first = _csv_cells(sc.text.take(pa.array(rows)))
    n = len(rows)
    cols: dict[str, np.ndarray] = {}
    upper = pc.utf8_upper(cells)
    missing = np_bool(pc.or_(pc.or_(pc.equal(cells, ""), pc.starts_with(cells, "[")),
                             pc.is_in(upper, value_set=pa.array(["N/A", "NA"]))))
    for fields, p in plan_ids.items():
        mine = np.flatnonzero(pid[blk] == p)
        if not len(mine):
            continue
        for j, f in enumerate(fields):
            col = QUERY_FIELDS.get(f)
            if col is None:
                continue
            at_cell = first[mine] + j
            vals = cells.take(pa.array(at_cell))
            gone = missing[at_cell]
            if GPU_COLUMNS.get(col, "str") == "str":
                out = to_str_numpy(vals)
                out[gone] = None
                cols.setdefault(col, np.empty(n, object))[mine] = out
            else:
                v = numbers(vals)[0]
                cols.setdefault(col, np.full(n, np.nan))[mine] = np.where(gone, np.nan, v)
    used[blocks] = np.where(has, sc.end, 0)
    examined[blocks] = np.maximum(sc.examined, 2)
    status[blocks] = np.where(sc.more, MORE, status[blocks])
    return Blocks(used, examined, blocks[blk], sc.offset[rows], cols, status)


registry.add(BlockFormat(
    "nvidia-smi", "gpu",
    ("--query-gpu", "memory.used", "memory.total", "memory.free", "utilization.gpu", "temperature.gpu",
     "power.draw", "driver_version", "gpu_name", ", GPU-"),
    query_csv, GPU_COLUMNS, timestamps=(),
    vector=compiled.reader(compiled.Spec(
        "smi_query_csv",
        ("index", "memory_used_mib", "memory_total_mib", "memory_free_mib", "util_pct", "temp_c", "power_w",
         "power_cap_w", "fan_pct", "sm_clock_mhz", "sm_clock_max_mhz", "pcie_gen", "pcie_width"),
        ("name", "uuid", "bus_id", "driver_version", "pstate", "persistence", "timestamp")), query_csv_vector),
))


# ---------------------------------------------------------------- nvidia-smi -q
_KV = re.compile(r"^(?P<key>[^:]+?)\s+:\s?(?P<value>.*)$")
_GPU_SECTION = re.compile(r"^GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_Q_TOP = {"Driver Version": "driver_version", "KMD Version": "driver_version", "CUDA Version": "cuda_version",
          "CUDA UMD Version": "cuda_version"}
_Q_GPU = {("", "Product Name"): "name", ("", "GPU UUID"): "uuid", ("", "Persistence Mode"): "persistence",
          ("", "Performance State"): "pstate", ("", "Fan Speed"): "fan_pct",
          ("FB Memory Usage", "Used"): "memory_used_mib", ("FB Memory Usage", "Total"): "memory_total_mib",
          ("FB Memory Usage", "Free"): "memory_free_mib", ("Utilization", "Gpu"): "util_pct",
          ("Temperature", "GPU Current Temp"): "temp_c", ("Clocks", "SM"): "sm_clock_mhz",
          ("Max Clocks", "SM"): "sm_clock_max_mhz", ("PCIe Generation", "Current"): "pcie_gen",
          ("Link Width", "Current"): "pcie_width"}
_Q_POWER = {"Power Draw": "power_w", "Instantaneous Power Draw": "power_w", "Average Power Draw": "power_w",
            "Current Power Limit": "power_cap_w", "Power Limit": "power_cap_w"}


def smi_query(w: Window) -> BlockResult:
    """``nvidia-smi -q``: top-level versions, then one indented section tree per GPU."""
    top: Record = {}
    gpus: list[tuple[int, Record]] = []
    stack: list[tuple[int, str]] = []
    k = 1
    while (s := w[k]) is not None and k < 20000:
        text = s.strip()
        if not text or set(text) <= set("="):
            k += 1
            continue
        indent = len(s) - len(s.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if (g := _GPU_SECTION.match(text)) and indent == 0:
            gpus.append((k, {"index": float(len(gpus)), "bus_id": g.group("bus")}))
            stack = []
        elif (kv := _KV.match(text)):
            key, value = kv.group("key").strip(), kv.group("value").strip()
            if not gpus:
                if key in _Q_TOP:
                    top[_Q_TOP[key]] = value
                elif key == "Timestamp":
                    top["timestamp"] = value
            else:
                rec = gpus[-1][1]
                section = stack[-1][1] if stack else ""
                col = _Q_GPU.get((section, key))
                if col is None and "Power Readings" in " ".join(n for _, n in stack):
                    col = _Q_POWER.get(key)
                if col is not None and rec.get(col) is None:
                    rec[col] = _value(col, value)
        elif indent > 0:
            stack.append((indent, text))
        else:
            break
        k += 1
    recs = [(off, {**top, **rec}) for off, rec in gpus]
    return (recs, k) if recs else ([], 0)


registry.add(BlockFormat("nvidia-smi", "gpu", ("NVSMI LOG",), smi_query, GPU_COLUMNS, timestamps=()))


# ---------------------------------------------------------------- nvidia-smi -L and topo -m
_LIST = re.compile(r"GPU ([0-9]+): (.+?) \(UUID: (GPU-[0-9A-Fa-f-]+)\)")


@register("nvidia-smi", "gpu", markers=["(UUID: GPU-"], columns=GPU_COLUMNS)
def smi_list(line: str) -> Record | None:
    """``GPU 0: NVIDIA H200 (UUID: GPU-...)`` from ``nvidia-smi -L``."""
    m = _LIST.search(line)
    return {"index": float(m.group(1)), "name": m.group(2).strip(), "uuid": m.group(3)} if m else None


def topology(w: Window) -> BlockResult:
    """``nvidia-smi topo -m``: device columns before ``CPU Affinity``, one row per device."""
    head = w[0] or ""
    devices = head[:head.find("CPU Affinity")].split()
    if not devices:
        return [], 0
    recs: list[tuple[int, Record]] = []
    k = 1
    while (s := w[k]) is not None:
        toks = s.split()
        if not toks or toks[0] not in devices or len(toks) < 1 + len(devices):
            break
        links, rest = toks[1:1 + len(devices)], toks[1 + len(devices):]
        for dst, link in zip(devices, links, strict=True):
            if dst != toks[0] and link != "X":
                recs.append((k, {"src": toks[0], "dst": dst, "link": link,
                                 "cpu_affinity": rest[0] if rest else None,
                                 "numa_affinity": rest[1] if len(rest) > 1 else None}))
        k += 1
    return (recs, k) if recs else ([], 0)


_DEVICES: dict[str, tuple[str, ...]] = {}


def _devices(head: str) -> tuple[str, ...]:
    """The device columns of a ``topo -m`` header (cached by its text)."""
    got = _DEVICES.get(head)
    if got is None:
        if len(_DEVICES) > 1024:
            _DEVICES.clear()
        got = _DEVICES[head] = tuple(head[:head.find("CPU Affinity")].split())
    return got


def topology_vector(chunk: Chunk, at: np.ndarray) -> Blocks:
    """:func:`topology` of all the chunk's matrices at once."""
    nb = len(at)
    devs = [_devices(h) for h in to_str_numpy(chunk.texts(at)).tolist()]
    plan_ids: dict[tuple[str, ...], int] = {}
    plan = np.array([plan_ids.setdefault(d, len(plan_ids)) if d else -1 for d in devs], np.int64)
    plans = list(plan_ids)
    width = np.array([len(d) for d in devs], np.int64)
    mats = np.flatnonzero(plan >= 0)
    used = np.zeros(nb, np.int64)
    examined = np.ones(nb, np.int64)
    status = np.zeros(nb, np.int64)
    if not len(mats):
        return Blocks.none(nb)

    def classify(text: pa.Array, block: np.ndarray, offset: np.ndarray) -> np.ndarray:
        tokens, counts, first = split_ws(text)
        b = mats[block]
        ok = counts >= 1 + width[b]
        member = np.zeros(len(text), dtype=bool)
        has = np.flatnonzero(counts > 0)
        firsts = tokens.take(pa.array(first[has])) if len(has) else pa.array([], pa.string())
        for pid, d in enumerate(plans):
            sel = np.flatnonzero(plan[b[has]] == pid)
            if len(sel):
                member[has[sel]] = np_bool(pc.is_in(firsts.take(pa.array(sel)), value_set=pa.array(d, pa.string())))
        return np.where(ok & member, ROW, STOP)

    sc = scan(chunk, at[mats], classify, first=16)
    rows = sc.rows(ROW)
    tokens, counts, first = split_ws(sc.text.take(pa.array(rows)))
    b = mats[sc.block[rows]]
    parts: list[tuple[np.ndarray, ...]] = []
    for pid, d in enumerate(plans):
        sel = np.flatnonzero(plan[b] == pid)
        if not len(sel):
            continue
        w = len(d)
        f0 = first[sel]
        src = to_str_numpy(tokens.take(pa.array(f0)))
        links = to_str_numpy(tokens.take(pa.array((f0[:, None] + 1 + np.arange(w)).ravel()))).reshape(-1, w)
        rest = counts[sel] - 1 - w
        cpu = np.empty(len(sel), object)
        numa = np.empty(len(sel), object)
        if (rest > 0).any():
            cpu[rest > 0] = to_str_numpy(tokens.take(pa.array(f0[rest > 0] + 1 + w)))
        if (rest > 1).any():
            numa[rest > 1] = to_str_numpy(tokens.take(pa.array(f0[rest > 1] + 2 + w)))
        dst = np.array(d, dtype=object)
        keep = (dst[None, :] != src[:, None]) & (links != "X")
        r, j = np.nonzero(keep)
        parts.append((sel[r], j, src[r], dst[j], links[r, j], cpu[r], numa[r]))
    examined[mats] = sc.examined
    status[mats] = np.where(sc.more, MORE, 0)
    if not parts:
        return Blocks(used, examined, np.zeros(0, np.int64), np.zeros(0, np.int64), {}, status)
    sel, j, src, dst, link, cpu, numa = (np.concatenate([p[k] for p in parts]) for k in range(7))
    order = np.lexsort((j, sel))
    sel = sel[order]
    cols = {"src": src[order], "dst": dst[order], "link": link[order], "cpu_affinity": cpu[order],
            "numa_affinity": numa[order]}
    has = np.zeros(len(mats), dtype=bool)
    has[sc.block[rows][sel]] = True
    used[mats] = np.where(has, sc.end, 0)
    return Blocks(used, examined, mats[sc.block[rows][sel]], sc.offset[rows][sel], cols, status)


registry.add(BlockFormat(
    "nvidia-smi", "topology", ("CPU Affinity",), topology,
    {"src": "str", "dst": "str", "link": "str", "cpu_affinity": "str", "numa_affinity": "str"}, timestamps=(),
    vector=compiled.reader(compiled.Spec("smi_topology", (), ("src", "dst", "link", "cpu_affinity",
                                                               "numa_affinity")), topology_vector),
))
