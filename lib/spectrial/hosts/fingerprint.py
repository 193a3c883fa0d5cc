"""Host fingerprint: everything about a machine's state that can move a decode benchmark.

Recorded per run and re-checked before and after each arm, so that "the baseline moved" can be told
apart from "the machine changed": GPU names/UUIDs, driver, CUDA, SM and memory clocks (current and max),
PCIe generation and width, temperature, power and its limit, persistence mode, ECC, throttle reasons,
CPU model and governor, kernel, NCCL as the engine would load it, and the identity of model files.
Everything is read with plain commands through the `Host`, so it works locally and over SSH.
"""

from __future__ import annotations

import hashlib
import json
import shlex

from spectrial.hosts.local import Host
from spectrial.schema import (  # noqa: F401 (the machine's stable view: the schema's, named here too)
    STABLE_GPU_FIELDS,
    EngineInfo,
    FileIdentity,
    GpuRow,
    HostFingerprint,
    StableView,
    stable_view,
)

GPU_QUERY = ("index", "name", "uuid", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem",
             "clocks.max.mem", "pcie.link.gen.current", "pcie.link.width.current", "pcie.link.gen.max",
             "temperature.gpu", "power.draw", "power.limit", "persistence_mode", "ecc.mode.current",
             "clocks_event_reasons.active", "memory.total", "compute_cap")
SAMPLE_QUERY = ("timestamp", "index", "clocks.sm", "clocks.mem", "temperature.gpu", "power.draw",
                "utilization.gpu", "clocks_event_reasons.active")
# clocks_event_reasons bits that mean the GPU is held back (not idle / application clocks).
THROTTLE_BITS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown",
                 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown"}


_SCRIPT = r"""
echo "kernel=$(uname -r)"
echo "arch=$(uname -m)"
echo "hostname=$(hostname 2>/dev/null || cat /etc/hostname)"
echo "cpu_model=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')"
echo "cpu_count=$(getconf _NPROCESSORS_ONLN 2>/dev/null)"
echo "cpu_governor=$(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null || echo n/a)"
echo "mem_total_kb=$(grep -m1 MemTotal /proc/meminfo 2>/dev/null | awk '{print $2}')"
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "cuda_version=$(nvidia-smi 2>/dev/null | grep -o 'CUDA[ UMD]* Version: *[0-9.]*' | head -1 | grep -o '[0-9.]*$')"
  echo "---gpus---"
  nvidia-smi --query-gpu={gpu_query} --format=csv,noheader,nounits 2>&1
fi
"""


def _parse_kv(text: str) -> tuple[dict[str, str], list[str]]:
    head, _, gpus = text.partition("---gpus---")
    kv = {}
    for line in head.splitlines():
        k, sep, v = line.partition("=")
        if sep:
            kv[k.strip()] = v.strip()
    return kv, [ln for ln in gpus.splitlines() if ln.strip()]


def throttle_reasons(mask: str | int | None) -> list[str]:
    """Names of the throttling bits set in a clocks_event_reasons mask (e.g. '0x0000000000000004')."""
    if mask is None or mask in ("", "[N/A]", "N/A"):
        return []
    try:
        value = int(mask, 16) if isinstance(mask, str) else int(mask)
    except ValueError:
        return []
    return [name for bit, name in THROTTLE_BITS.items() if value & bit]


def gpu_rows(lines: list[str], fields: tuple[str, ...] = GPU_QUERY) -> list[dict[str, str]]:
    """nvidia-smi CSV rows (noheader) as dicts keyed by query field."""
    rows = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == len(fields):
            rows.append(dict(zip(fields, parts, strict=True)))
    return rows


def host_fingerprint(host: Host) -> HostFingerprint:
    """Machine state of `host` (no engine or model parts)."""
    res = host.run(_SCRIPT.replace("{gpu_query}", ",".join(GPU_QUERY)), check=False, timeout=60)
    kv, lines = _parse_kv(res.stdout)
    gpus: list[GpuRow] = [{**g, "throttle": throttle_reasons(g.get("clocks_event_reasons.active"))}
                          for g in gpu_rows(lines)]
    return HostFingerprint.model_validate({"host": host.name, **kv, "gpus": gpus})  # kv: the keys _SCRIPT prints


def file_identity(host: Host, path: str, chunk: int = 1 << 20) -> FileIdentity:
    """Size, mtime and a hash of the first and last `chunk` bytes (fast even for 100 GB files)."""
    q = shlex.quote(path)
    script = (f"stat -L -c '%s %Y' {q} && {{ head -c {chunk} {q}; tail -c {chunk} {q}; }} | sha256sum")
    res = host.run(script, check=False, timeout=120)
    lines = res.stdout.split("\n")
    if not res.ok or len(lines) < 2:
        return FileIdentity(path=path, error=(res.stderr or res.stdout).strip()[:200])
    size, mtime = lines[0].split()
    return FileIdentity(path=path, size=int(size), mtime=int(mtime), head_tail_sha256=lines[1].split()[0][:16])


def engine_identity(host: Host, binary: str | None) -> FileIdentity | None:
    """Engine binary identity (path, size, mtime, head/tail hash) for a manifest's `engine.binary_identity`;
    None without a binary (a Python engine's adapter asks for none: its version says what runs)."""
    return file_identity(host, binary) if binary else None


def fingerprint_key(fp: HostFingerprint, engine: EngineInfo | None = None) -> str:
    """Short hash of the stable host view plus engine version and binary identity."""
    eng = engine or EngineInfo()
    binary = eng.binary_identity.model_dump(mode="json") if eng.binary_identity is not None else None
    ident = {"host": stable_view(fp), "engine": {"name": eng.name, "version": eng.version, "binary_identity": binary,
                                                 "commit": eng.commit, "diff_hash": eng.diff_hash}}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:12]


def compare(before: HostFingerprint, after: HostFingerprint) -> list[str]:
    """What changed between two fingerprints of the same host (stable fields, plus throttling)."""
    changes = []
    a, b = stable_view(before), stable_view(after)
    for k in a:
        if k != "gpus" and a[k] != b.get(k):
            changes.append(f"{k}: {a[k]!r} -> {b.get(k)!r}")
    for ga, gb in zip(a["gpus"], b["gpus"], strict=False):
        for k in STABLE_GPU_FIELDS:
            if ga.get(k) != gb.get(k):
                changes.append(f"GPU {ga.get('uuid') or '?'} {k}: {ga.get(k)} -> {gb.get(k)}")
    if len(a["gpus"]) != len(b["gpus"]):
        changes.append(f"GPU count: {len(a['gpus'])} -> {len(b['gpus'])}")
    for g in after.gpus or []:
        if g.get("throttle"):
            changes.append(f"GPU {g.get('index')} throttling: {', '.join(g['throttle'])}")
    return changes
