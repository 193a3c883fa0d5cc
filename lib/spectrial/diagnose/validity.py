"""Detector of measurements that failed their validity checks (spectrial.validity): the verdict of such an arm
is "invalid measurement", and the doctor says which check failed, with its figures, and what to do."""

from __future__ import annotations

from collections.abc import Iterator

from spectrial.diagnose.common import rec
from spectrial.diagnose.context import Context
from spectrial.diagnose.model import Finding
from spectrial.diagnose.registry import detector
from spectrial.validity import problems


@detector("invalid_measurement", 2, "speculators-validate", "vllm#53504")
def invalid_measurement(ctx: Context) -> Iterator[Finding]:
    """A measurement that failed a validity check: load, queue, prefix cache, early stops, stream, starts."""
    for path, arm in ctx.arms:
        for c in problems(arm.validity):
            i = next(n for n, x in enumerate(arm.validity.checks) if x.name == c.name)  # type: ignore[union-attr]
            where = f"{path}.validity.checks[{i}]"
            invalid = c.severity == "invalid"
            yield Finding(kind="invalid_measurement", severity="critical" if invalid else "info", arm=arm.name,
                          title=f"{arm.name}: {c.name} check failed: {c.summary}",
                          detail=("The measurement does not measure what the verdict needs, so the arm is not "
                                  "called faster or slower (its verdict says 'invalid measurement')." if invalid else
                                  "The verdict stands, but this weakens it." if arm.verdict is not None else
                                  "The figures stand, but this weakens them."),
                          evidence=[rec(f"{where}.value", c.value), rec(f"{where}.limit", c.limit),
                                    *(rec(f"{where}.evidence.{k}", v) for k, v in c.evidence.items())],
                          fix=c.fix or "")
