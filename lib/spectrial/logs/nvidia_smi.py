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

from spectrial.logs.core import (
    NUM,
    BlockFormat,
    BlockResult,
    FastResult,
    Rows,
    Text,
    Window,
    num,
    register,
    registry,
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
    common: dict[str, Any] = {
        "driver_version": (m.group(1) if (m := _DRIVER.search(head)) else None),
        "cuda_version": (m.group(1) if (m := _CUDA.search(head)) else None),
    }
    for k in (-1, -2, -3):
        if (d := _DATE.match(w[k] or "")):
            common["timestamp"] = d.group("timestamp")
            break
    recs: list[tuple[int, dict[str, Any]]] = []
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


_QUOTE_B = re.compile(_QUOTE.pattern.encode())
_ROW1_B = re.compile(_ROW1.pattern.encode())


def _unquote_b(s: bytes) -> bytes:
    if s[:1] in (b"|", b"+"):  # the common case: no quote, nothing to strip on the left
        return s.rstrip()
    return _QUOTE_B.sub(b"", s).strip()


def smi_table_fast(text: Text, i: int) -> FastResult | None:
    """:func:`smi_table` over the plain bytes of the table."""
    head = text.line(i)
    common: dict[str, Any] = {
        "driver_version": (m.group(1) if (m := _DRIVER.search(head)) else None),
        "cuda_version": (m.group(1) if (m := _CUDA.search(head)) else None),
    }
    for k in (-1, -2, -3):
        if (d := _DATE.match(text.line(i + k))):
            common["timestamp"] = d.group("timestamp")
            break
    body = text.lines_at(i + 1, 96)
    recs: list[tuple[int, dict[str, Any]]] = []
    for j, s in enumerate(body):
        t = _unquote_b(s)
        if not t or t[:1] not in (b"|", b"+"):
            break
        m = _ROW1_B.match(t) if t[:1] == b"|" else None
        if m:
            if j + 1 >= len(body):
                return None  # the second line of the GPU is past what was read
            rec = {**common, "index": float(m.group("index")), "name": m.group("name").strip().decode(),
                   "persistence": None if m.group("persistence") is None else m.group("persistence").decode(),
                   "bus_id": m.group("bus_id").decode()}
            row2 = _unquote_b(body[j + 1]).decode()
            for col, rx in _ROW2.items():
                if (v := rx.search(row2)):
                    rec[col] = v.group(1) if col == "pstate" else num(v.group(1))
            recs.append((j + 1, rec))
    else:
        return None  # the table goes on past what was read
    k = j + 1
    return (recs, k, k + 1) if recs else ([], 0, k + 1)


registry.add(BlockFormat("nvidia-smi", "gpu", ("NVIDIA-SMI ",), smi_table, GPU_COLUMNS,
                         key_metrics=GPU_METRICS, timestamps=(), fast=smi_table_fast, lookback=3))


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
    recs: list[tuple[int, dict[str, Any]]] = []
    while (s := w[k]) is not None:
        cells = [c.strip() for c in _unquote(s).split(",")]
        if len(cells) != len(fields) or not any(cells):
            break
        rec = {c: _value(c, v) for c, v in zip(cols, cells, strict=True) if c}
        recs.append((k, rec))
        k += 1
    return (recs, k) if recs else ([], 0)


registry.add(BlockFormat(
    "nvidia-smi", "gpu",
    ("--query-gpu", "memory.used", "memory.total", "memory.free", "utilization.gpu", "temperature.gpu",
     "power.draw", "driver_version", "gpu_name", ", GPU-"),
    query_csv, GPU_COLUMNS, timestamps=(),
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
    top: dict[str, Any] = {}
    gpus: list[tuple[int, dict[str, Any]]] = []
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
def smi_list(line: str) -> dict[str, Any] | None:
    """``GPU 0: NVIDIA H200 (UUID: GPU-...)`` from ``nvidia-smi -L``."""
    m = _LIST.search(line)
    return {"index": float(m.group(1)), "name": m.group(2).strip(), "uuid": m.group(3)} if m else None


def topology(w: Window) -> BlockResult:
    """``nvidia-smi topo -m``: device columns before ``CPU Affinity``, one row per device."""
    head = w[0] or ""
    devices = head[:head.find("CPU Affinity")].split()
    if not devices:
        return [], 0
    recs: list[tuple[int, dict[str, Any]]] = []
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


def topology_fast(text: Text, i: int) -> FastResult | None:
    """:func:`topology` over the plain bytes of the matrix, its rows as one :class:`Rows`."""
    head = text.lines_at(i, 1)[0]
    devices = head[:head.find(b"CPU Affinity")].split()
    if not devices:
        return [], 0, 1
    names = [d.decode() for d in devices]
    width = len(devices)
    offsets: list[int] = []
    values: list[tuple[str, str, str, str | None, str | None]] = []
    k = 1
    for s in text.iter_lines(i + 1):
        toks = s.split()
        if not toks or toks[0] not in devices or len(toks) < 1 + width:
            break
        src = toks[0].decode()
        rest = toks[1 + width:]
        cpu = rest[0].decode() if rest else None
        numa = rest[1].decode() if len(rest) > 1 else None
        for dst, link in zip(names, toks[1:1 + width], strict=True):
            if dst != src and link != b"X":
                offsets.append(k)
                values.append((src, dst, link.decode(), cpu, numa))
        k += 1
    else:
        return None  # the matrix goes on past what was read
    if not offsets:
        return [], 0, k + 1
    return Rows(offsets, ("src", "dst", "link", "cpu_affinity", "numa_affinity"), values), k, k + 1


registry.add(BlockFormat(
    "nvidia-smi", "topology", ("CPU Affinity",), topology,
    {"src": "str", "dst": "str", "link": "str", "cpu_affinity": "str", "numa_affinity": "str"}, timestamps=(),
    fast=topology_fast,
))
