"""Seed-style per-cycle profile lines (the patched EAGLE worker of the original investigation).

``Target verify: 12.34 ms/cyc ( 91.5%)`` -> kind ``verify`` (engine "profile"): phase, verify_ms,
verify_pct (share of the cycle, 0..100). Other phases printed the same way (``Draft: 0.52 ms/cyc (2.6%)``,
``Draft extend: ...``) -> kind ``phase``: phase, phase_ms, phase_pct. Several phases on one line give
several rows. The percentage is optional; ``ms/cycle`` is accepted too.
"""

from __future__ import annotations

import re

from spectrial.logs.formats import Record
from spectrial.logs.registry import register
from spectrial.logs.sglang import TS as SGLANG_TS
from spectrial.logs.text import NUM, TS_ISO

_PHASE = re.compile(rf"(?P<label>[A-Za-z][A-Za-z0-9_ /+&().-]*?)\s*:\s*(?P<ms>{NUM})\s*ms\s*/\s*cyc(?:le)?\b"
                    rf"(?:\s*\(\s*(?P<pct>{NUM})\s*%\s*\))?")


@register("profile", "verify", markers=["ms/cyc"], kinds=["phase"],
          columns={"phase": "str", "verify_ms": "float", "verify_pct": "float", "phase_ms": "float",
                   "phase_pct": "float"},
          kind_columns={"verify": ("phase", "verify_ms", "verify_pct"), "phase": ("phase", "phase_ms", "phase_pct")},
          key_metrics=["verify_ms", "verify_pct", "phase_ms", "phase_pct"], timestamps=[SGLANG_TS, TS_ISO])
def profile_phases(line: str) -> list[Record]:
    """One record per ``<phase>: X ms/cyc (Y%)`` on the line."""
    out = []
    for m in _PHASE.finditer(line):
        label = re.sub(r"\s+", " ", m.group("label")).strip(" -")
        ms = float(m.group("ms"))
        pct = float(m.group("pct")) if m.group("pct") else None
        if "verify" in label.lower():
            out.append({"kind": "verify", "phase": label, "verify_ms": ms, "verify_pct": pct})
        else:
            out.append({"kind": "phase", "phase": label, "phase_ms": ms, "phase_pct": pct})
    return out
