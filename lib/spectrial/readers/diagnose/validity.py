"""Detector of measurements that failed their validity checks (spectrial.analysis.validity): the verdict of such an arm
is "invalid measurement", and the doctor says which check failed, with its figures, and what to do."""

from __future__ import annotations

from collections.abc import Iterator

from spectrial.analysis.validity import problems
from spectrial.readers.diagnose.common import names, one, rec
from spectrial.readers.diagnose.context import Context
from spectrial.readers.diagnose.model import Finding
from spectrial.readers.diagnose.registry import detector
from spectrial.schema import ArmRecord


@detector("invalid_measurement", 2, "speculators-validate", "vllm#53504")
def invalid_measurement(ctx: Context) -> Iterator[Finding]:
    """A measurement that failed a validity check: load, queue, prefix cache, early stops, stream, starts
    (speculation_live: the accept_pinned detector, which also says why)."""
    groups: dict[tuple[str, str, str, str], list[tuple[str, ArmRecord, int]]] = {}
    for path, arm in ctx.arms:
        for c in problems(arm.validity):
            if c.name == "speculation_live":  # said by accept_pinned, with what in the launch explains it
                continue
            i = next(n for n, x in enumerate(arm.validity.checks) if x.name == c.name)  # type: ignore[union-attr]
            groups.setdefault((c.name, c.severity, c.summary, c.fix or ""), []).append((path, arm, i))
    for (name, severity, summary, fix), hits in groups.items():  # the same check failing alike: said once
        path, arm, i = hits[0]
        c = arm.validity.checks[i]  # type: ignore[union-attr]
        arms = [a.name for _, a, _ in hits]
        invalid = severity == "invalid"
        judged = [a.verdict is not None for _, a, _ in hits]
        where = f"{path}.validity.checks[{i}]"
        who = arms[0] if len(arms) == 1 else f"{len(arms)} arms ({names(arms)})"
        yield Finding(kind="invalid_measurement", severity="critical" if invalid else "info", arm=one(arms),
                      arms=arms if len(arms) > 1 else [],
                      title=f"{who}: {name} check failed: {summary}",
                      detail=("The measurement does not measure what the verdict needs, so the arm is not "
                              "called faster or slower (its verdict says 'invalid measurement')." if invalid else
                              ("The verdict stands, but this weakens it." if len(arms) == 1 else
                               "The verdicts stand, but this weakens them.") if all(judged) else
                              "The figures stand, but this weakens them."),
                      evidence=[rec(f"{where}.value", c.value), rec(f"{where}.limit", c.limit),
                                *(rec(f"{where}.evidence.{k}", v) for k, v in c.evidence.items()),
                                *(rec(f"{p}.validity.checks[{j}].value", a.validity.checks[j].value)  # type: ignore[union-attr]
                                  for p, a, j in hits[1:])],
                      fix=fix)
