"""The memory bandwidth a host's decode can use: measured on CPU (STREAM-style), from the datasheet on a GPU.

A decode step at batch 1 streams the weights once, so tok/s can never exceed bandwidth / bytes per token
(spectrial.analysis.roofline). On a CPU host nothing publishes that bandwidth: `measure(host)` runs a short
STREAM-style probe on the host itself (one thread per CPU, arrays of 8x the last-level cache, at least 256 MB and
at most 2 GB in all, best of 5): copy (read + write counted, as STREAM does) and read (a sum), and takes the larger
as the bound's bandwidth, so a bound is never below what the memory can deliver. It also reads the last-level
cache's size: weights that fit in it are not streamed from DRAM, and no DRAM bound holds for them.

On a GPU host the bound reads the datasheet's figure of the GPU model and variant (params/hardware.yaml, matched by
the name nvidia-smi reports: SXM, PCIe and NVL parts differ) times the GPUs the server uses.

Runs with the host's Python (`python` argument: the engine's interpreter on a GPU host, `python3` elsewhere; the
local host runs spectrial's own). numpy missing there: no measurement, and the record says so.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time

from spectrial.errors import HostError
from spectrial.hosts.local import Host
from spectrial.schema import HostBandwidth

PROBE_TIMEOUT_S = 120

SNIPPET = r'''
import json, os, threading, time
out = {"threads": os.cpu_count() or 1, "cache_bytes": None}
base = "/sys/devices/system/cpu/cpu0/cache"
try:
    best = (0, 0)
    for d in os.listdir(base):
        if not d.startswith("index"):
            continue
        level = int(open(os.path.join(base, d, "level")).read())
        size = open(os.path.join(base, d, "size")).read().strip()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        best = max(best, (level, int(size.rstrip("KMG")) * mult))
    out["cache_bytes"] = best[1] or None
except (OSError, ValueError):
    pass
try:
    import numpy as np
except ImportError:
    out["error"] = "numpy is not importable by this Python"
    print(json.dumps(out))
    raise SystemExit(0)
n = out["threads"]
total = min(max(8 * (out["cache_bytes"] or 32 << 20), 256 << 20), 2 << 30)
per = max(total // (2 * n) // 8, 1 << 17)
src = [np.ones(per) for _ in range(n)]
dst = [np.zeros(per) for _ in range(n)]
def timed(work):
    bar = threading.Barrier(n + 1)
    def run(i):
        bar.wait()
        work(i)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    bar.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return time.perf_counter() - t0
copy = max(2 * 8 * per * n / timed(lambda i: np.copyto(dst[i], src[i])) for _ in range(5))
read = max(8 * per * n / timed(lambda i: src[i].sum()) for _ in range(5))
out.update(copy_gb_s=copy / 1e9, read_gb_s=read / 1e9, bytes=int(2 * 8 * per * n))
print(json.dumps(out))
'''


def measure(host: Host, python: str | None = None) -> HostBandwidth:
    """The host's CPU memory bandwidth by the probe above, and its last-level cache (see the module docstring);
    a HostBandwidth with `error` set when it cannot be measured (never raises for the host's sake)."""
    exe = python or (sys.executable if host.is_local else "python3")
    try:
        res = host.run(f"{shlex.quote(exe)} -c {shlex.quote(SNIPPET)}", check=False, timeout=PROBE_TIMEOUT_S)
    except HostError as exc:
        return HostBandwidth(error=f"the probe could not run: {exc}")
    try:
        data = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return HostBandwidth(error=f"the probe answered no JSON (exit {res.exit_code}): {res.stderr[-300:]}")
    bw = max(data.get("copy_gb_s") or 0.0, data.get("read_gb_s") or 0.0) or None
    return HostBandwidth(copy_gb_s=data.get("copy_gb_s"), read_gb_s=data.get("read_gb_s"), bandwidth_gb_s=bw,
                         threads=data.get("threads"), cache_bytes=data.get("cache_bytes"),
                         probe_bytes=data.get("bytes"), error=data.get("error"),
                         how=(f"STREAM-style probe on the host: {data.get('threads')} thread(s), "
                              f"{(data.get('bytes') or 0) / 1e6:.0f} MB, best of 5; the larger of copy "
                              f"{data.get('copy_gb_s') or 0:.1f} and read {data.get('read_gb_s') or 0:.1f} GB/s")
                         if bw else "")


CACHE_S = 24 * 3600  # a host's memory does not change within a day of the same fingerprint


def cached(host: Host, fingerprint_key: str | None, python: str | None = None) -> HostBandwidth:
    """`measure`, kept a day per fingerprint key (the host and build state: another host state measures again) in
    spectrial's cache, so that a run of many trials pays the probe's second once."""
    from spectrial.cache import cache_root

    path = cache_root() / "probes" / f"bandwidth-{fingerprint_key}.json" if fingerprint_key else None
    if path is not None and path.is_file() and time.time() - path.stat().st_mtime < CACHE_S:
        try:
            return HostBandwidth.model_validate_json(path.read_text())
        except ValueError:
            pass  # a damaged entry: measured again
    got = measure(host, python)
    if path is not None and got.bandwidth_gb_s:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(got.model_dump_json())
        tmp.replace(path)
    return got
