"""Accept length must not depend on parallelism (issue 39 item 7).

Acceptance is a property of the draft, the target, the sampling and the prompts: two arms that share those (model,
workload, sampling and the arm's speculative settings, as `spectrial.record.comparable` states them) must accept
alike whatever else differs between their runs: tensor or data parallelism, the engine, its version, the machine.
A difference beyond both arms' intervals is a bug signal, not a tuning result (the public SGLang case: DP attention
moved accept length from 2.35 to 1.48 on the same draft).

Each arm's interval is the percentile bootstrap of the mean of its requests' own accept lengths (1 + accepted /
verify steps of the request: `spectrial.analysis.figures.request_accept_lens`); an arm whose requests do not carry
their counts has no interval, and the pair is stated without a verdict. `spectrial diff` reports the shifts first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from pydantic import BaseModel, Field

from spectrial.analysis import stats
from spectrial.analysis.figures import request_accept_lens
from spectrial.record import comparable as cmp
from spectrial.record.comparable import Category
from spectrial.schema import Manifest, RequestRecord

# what two arms must share for their acceptance to be the same quantity
SHARED: tuple[Category, ...] = ("model", "workload", "sampling", "arm settings")
# what may differ between them: the suspects, named in the finding
SUSPECTS: tuple[Category, ...] = ("configuration", "engine", "engine version", "engine build", "GPU", "host",
                                  "concurrency")


class AcceptShift(BaseModel):
    """One arm's accept length in two runs that share its draft, depth, sampling and workload."""

    arm: str
    a: float | None = Field(None, description="Mean of the arm's per-request accept lengths in run A")
    b: float | None = Field(None, description="The same in run B")
    ci_a: tuple[float, float] | None = Field(None, description="Its bootstrap interval in run A")
    ci_b: tuple[float, float] | None = Field(None, description="Its bootstrap interval in run B")
    n_a: int = 0
    n_b: int = 0
    differs_in: list[str] = Field(default_factory=list, description="What else differs between the arms' runs")
    flagged: bool | None = Field(None, description="True: the intervals are apart (a bug signal); False: they "
                                                   "overlap; None: no interval to judge by")

    def text(self) -> str:
        """'eagle3: accept length 2.35 [2.31, 2.39] -> 1.48 [1.45, 1.51] with the same draft, depth, sampling and
        workload (differs: configuration: tp_size 1 vs 2): acceptance must not depend on parallelism ...'."""
        def fmt(v: float | None, ci: tuple[float, float] | None, n: int) -> str:
            if v is None:
                return "not counted per request"
            return f"{v:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "") + f" ({n} requests)"

        what = "; ".join(self.differs_in[:6]) or "nothing recorded"
        note = {True: "the intervals are apart: acceptance must not depend on parallelism, the engine or the "
                      "machine; this is a bug signal (a draft fed other hidden states, a sampler or kernel that "
                      "differs): check the engine's speculative path under this configuration",
                False: "the intervals overlap: acceptance is the same",
                None: "no interval to judge by"}[self.flagged]
        return (f"{self.arm}: accept length {fmt(self.a, self.ci_a, self.n_a)} -> {fmt(self.b, self.ci_b, self.n_b)} "
                f"with the same draft, depth, sampling and workload (differs: {what}): {note}")


def _interval(requests: Sequence[RequestRecord], level: float) -> tuple[float | None, tuple[float, float] | None,
                                                                         int]:
    lens, _ = request_accept_lens(requests)
    if not lens:
        return None, None, 0
    if len(lens) < 2:
        return float(lens[0]), None, 1
    ci = stats.bootstrap_ci(lens, stat=np.mean, level=level)
    return float(np.mean(lens)), (float(ci.low), float(ci.high)), len(lens)


def accept_shifts(a: Manifest, b: Manifest, requests_a: Mapping[str, Sequence[RequestRecord]],
                  requests_b: Mapping[str, Sequence[RequestRecord]], level: float = 0.95) -> list[AcceptShift]:
    """Every speculative arm completed in both runs whose draft, depth, sampling and workload are the same
    (`SHARED`), with its accept length in each run and whether they differ beyond their intervals."""
    names_b = {x.name: x for x in b.arms}
    out = []
    for x in a.arms:
        y = names_b.get(x.name)
        if y is None or not x.speculative or not y.speculative or x.status != "ok" or y.status != "ok":
            continue
        verdict = cmp.compare(a, b, arms=(x.name, y.name), require=SHARED)
        if not verdict.comparable:
            continue  # another draft, depth, sampling or workload: another experiment, not a shift
        va, ca, na = _interval(requests_a.get(x.name, []), level)
        vb, cb, nb = _interval(requests_b.get(y.name, []), level)
        flagged = None if ca is None or cb is None else bool(cb[1] < ca[0] or cb[0] > ca[1])
        differs = [d.text() for d in verdict.differences if d.category in SUSPECTS]
        out.append(AcceptShift(arm=x.name, a=va, b=vb, ci_a=ca, ci_b=cb, n_a=na, n_b=nb, differs_in=differs,
                               flagged=flagged))
    return out


__all__ = ["SHARED", "SUSPECTS", "AcceptShift", "accept_shifts"]
