"""Detector of uncontrolled records: a server spectrial did not start, measured as it was (kind "observe", or a
watch), `controlled` False. Such a record has no baseline beside it and no environment check: the doctor says what
cannot be concluded from it and what would conclude it. The detectors that need a baseline find none in it
(`common.baseline_of`) and stay silent."""

from __future__ import annotations

from collections.abc import Iterator

from spectrial.readers.diagnose.common import rec
from spectrial.readers.diagnose.context import Context
from spectrial.readers.diagnose.model import Evidence, Finding
from spectrial.readers.diagnose.registry import detector


@detector("uncontrolled", 0, "seed-case", "vllm#53436")
def uncontrolled(ctx: Context) -> Iterator[Finding]:
    """An uncontrolled record (observe-only, watch): no speed-up, no environment check, other load unknown."""
    m = ctx.manifest
    if m is None or m.controlled:
        return
    o = m.observed
    evidence: list[Evidence] = [rec("kind", m.kind), rec("controlled", m.controlled)]
    if o is not None:
        evidence += [rec("observed.url", o.url), rec("observed.comparison", o.comparison),
                     rec("observed.env_check", o.env_check)]
        if o.host_note:
            evidence.append(rec("observed.host_note", o.host_note))
        evidence += [rec(f"observed.other_load[{i}]", x) for i, x in enumerate(o.other_load)]
    for path, a in ctx.arms:
        if a.accept_len is not None or a.tok_s is not None:
            evidence.append(rec(f"{path}.accept_len", a.accept_len))
        evidence.append(rec(f"{path}.speedup", a.speedup))
    load = ("other load was seen in the window's counters, so its figures mix this client's requests with "
            "other users'" if o is not None and o.other_load else
            "the server's load from other users is unknown (its counters count every user's requests; none was "
            "seen beside this client's in the window, which says nothing of the time before or after)")
    what = "an observe-only run" if m.kind == "observe" else f"a {m.kind} record"
    yield Finding(
        kind="uncontrolled", severity="warning", arm=m.arms[0].name if len(m.arms) == 1 else None,
        title=f"Uncontrolled: {what} of a server spectrial did not start, measured as it was, no baseline beside it",
        detail=("What cannot be concluded from it: no speed-up or verdict (no baseline was measured beside it, and "
                "a baseline from another session is not comparable: start-to-start spread alone is 10-20 %); no "
                "verification of the server's environment (spectrial did not start its processes and does not look "
                f"inside them); {load}; the host recorded is the client's, not the server's. What it does say: the "
                "accept length and per-position acceptance over the window, and the decode rate and latencies this "
                "client saw."),
        evidence=evidence,
        fix=("for a speed-up, run a controlled trial (`spectrial trial`, a baseline and the speculative arm started "
             "by spectrial, interleaved, their environment verified) when a restart of the server is allowed; keep "
             "this record as the server's acceptance as it runs"))
