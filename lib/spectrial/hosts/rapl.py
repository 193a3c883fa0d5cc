"""CPU package energy from RAPL (`/sys/class/powercap/intel-rapl:N/energy_uj`, AMD's packages appear there too).

`read(host)` returns each top-level package domain's counter (microjoules) and its wrap range, or None where none
is readable (no powercap, a VM, or a kernel that keeps the counters to root); `joules(before, after)` is the energy
between two readings, each domain's difference taken modulo its range (the counter wraps).
"""

from __future__ import annotations

import re

from spectrial.errors import HostError
from spectrial.hosts.local import Host

ROOT = "/sys/class/powercap"
_PACKAGE = re.compile(r"^intel-rapl:\d+$")  # packages only: their sub-domains (core, dram) are inside them


def read(host: Host, root: str = ROOT) -> dict[str, tuple[int, int]] | None:
    """{domain: (energy_uj, max_energy_range_uj)} of the host's package domains; None where none is readable."""
    cmd = (f'for d in {root}/intel-rapl:*; do [ -r "$d/energy_uj" ] && '
           'echo "${d##*/} $(cat "$d/energy_uj") $(cat "$d/max_energy_range_uj" 2>/dev/null || echo 0)"; '
           "done 2>/dev/null; true")
    try:
        res = host.run(cmd, check=False, timeout=15)
    except HostError:
        return None
    out: dict[str, tuple[int, int]] = {}
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and _PACKAGE.match(parts[0]) and parts[1].isdigit() and parts[2].isdigit():
            out[parts[0]] = (int(parts[1]), int(parts[2]))
    return out or None


def joules(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> float | None:
    """Energy between two readings, J (each domain modulo its wrap range); None when they share no domain."""
    common = sorted(set(before) & set(after))
    if not common:
        return None
    total = 0
    for d in common:
        diff = after[d][0] - before[d][0]
        if diff < 0 and after[d][1] > 0:
            diff += after[d][1]
        total += max(diff, 0)
    return total / 1e6


NONE = f"no readable RAPL counters ({ROOT}/intel-rapl:*/energy_uj): CPU energy n/a"
