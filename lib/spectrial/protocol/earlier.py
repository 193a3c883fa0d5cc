"""What this host's earlier runs know, read once for the three that need it.

Earlier runs are the run records under a folder that measured the same thing on the same machine: the same engine,
model and workload (`params.workload_identity`: the items asked, their format, sampling and length) and, once the
host has been fingerprinted, the same `fingerprint_key` (host state + engine build). From them:

- `prior`: the start-to-start spread of per-start decode rates (`sequential.prior_from_starts`: within each run and
  arm, pooled), decide's prior on the variance of a paired round;
- `start_s` / `ready_s` / `request_s`: what a server start and one request cost on this host (the plan's price);
- `baselines`: each earlier run's baseline per-start medians (the drift band, spectrial.protocol.drift).

Reading is bounded: at most `limit` matching records, newest first, each file under the record cap
(`spectrial.record.store.record_cap`); a damaged record (truncated, binary, another program's JSON, a future schema:
`RecordDamaged` from `spectrial.record.store.load_records`, the one loader) is skipped and named with what is wrong, never
fatal.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, JsonValue

from spectrial.analysis.sequential import SpreadPrior, prior_from_starts
from spectrial.errors import RecordDamaged
from spectrial.params import workload_identity
from spectrial.record.store import Skipped, list_runs, load_records
from spectrial.schema import Manifest, RecordedParams

LIMIT = 20  # newest matching records read at most


class BaselineRun(BaseModel):
    """One earlier run's baseline: its run id, when, and each start's median decode rate (tok/s per request)."""

    run_id: str
    started_at: str | None = None
    start_medians: list[float] = Field(default_factory=list)
    argv: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class Earlier(BaseModel):
    """What the earlier runs of one host, engine, model and workload say (see the module docstring)."""

    folder: str
    runs: list[str] = Field(default_factory=list, description="Matching run ids, oldest first")
    fingerprint_keys: list[str] = Field(default_factory=list, description="Their fingerprint keys")
    skipped: int = Field(0, description="Records that could not be read")
    damaged: list[str] = Field(default_factory=list, description="Each skipped record: its file and what is wrong")
    prior: SpreadPrior | None = None
    starts: int = Field(0, description="Server starts they hold (ok ones)")
    start_s: float | None = Field(None, description="Median seconds of a start, launch to stop")
    overhead_s: float | None = Field(None, description="What a start costs beyond its measured requests: median "
                                                       "start less its requests' time, at least the time to ready")
    ready_s: float | None = Field(None, description="Median seconds from launch to ready")
    request_s: float | None = Field(None, description="Median seconds of one measured request")
    within_sd_log: float | None = Field(None, description="SD of a request's log decode rate within a start, pooled")
    requests_per_start: float | None = Field(None, description="Median measured requests per start")
    baselines: list[BaselineRun] = Field(default_factory=list, description="Each run's baseline starts")

    def describe(self) -> str:
        if not self.runs:
            return f"no earlier run of this host, engine, model and workload under {self.folder}/"
        keys = ", ".join(self.fingerprint_keys) or "none recorded"
        return (f"{len(self.runs)} earlier run(s) under {self.folder}/ ({self.starts} starts; fingerprint {keys})"
                + (f"; {self.skipped} damaged record(s) skipped ({'; '.join(self.damaged[:3])}"
                   f"{'; ...' if len(self.damaged) > 3 else ''})" if self.skipped else ""))


def work_key(params: RecordedParams | Mapping[str, JsonValue]) -> str:
    """What must match for two runs to have measured the same thing (apart from the machine state): host,
    engine, model and workload identity, from recorded or given params."""
    p = params if isinstance(params, RecordedParams) else RecordedParams.model_validate(params)
    ident = {"host": p.host, "engine": p.engine, "model": p.model, "workload": workload_identity(p.as_dict())}
    return json.dumps(ident, sort_keys=True, default=str)


def find(folder: str | Path, params: RecordedParams | Mapping[str, JsonValue], *, fingerprint_key: str | None = None,
         exclude: str | None = None, before: str | None = None, limit: int = LIMIT,
         kinds: tuple[str, ...] = ("trial",)) -> tuple[list[Manifest], list[Skipped]]:
    """Matching earlier records under `folder` (oldest first, at most `limit`, newest kept) and the damaged ones
    passed over (which and why). `fingerprint_key`: only records of that key; `before`: only runs started before
    that time."""
    root = Path(folder)
    if not root.is_dir():
        return [], []
    want = work_key(params)
    out: list[Manifest] = []
    skipped: list[Skipped] = []
    runs = (r for r in reversed(list_runs(root)) if r.name != exclude)
    for run, m, skip in load_records(runs):
        if m is None:
            if skip is not None:
                skipped.append(skip)
            continue
        if m.kind not in kinds or m.status not in ("ok", "partial") or m.fingerprint_key is None:
            continue
        if fingerprint_key is not None and m.fingerprint_key != fingerprint_key:
            continue
        if before is not None and (m.started_at or "") >= before:
            continue
        try:
            if work_key(m.params) != want:
                continue
        except (TypeError, ValueError) as exc:
            skipped.append(Skipped(run, RecordDamaged(str(run / "manifest.json"), f"its params cannot be read: {exc}")))
            continue
        out.append(m)
        if len(out) >= limit:
            break
    return list(reversed(out)), skipped


def summarize(runs: list[Manifest], folder: str | Path, skipped: list[Skipped] | None = None) -> Earlier:
    """The figures of `runs` (see `Earlier`); `skipped`: the damaged records `find` passed over."""
    groups: list[list[float]] = []
    start_s: list[float] = []
    ready_s: list[float] = []
    request_s: list[float] = []
    baselines: list[BaselineRun] = []
    n_starts = 0
    w_ss, w_df = 0.0, 0
    per_start: list[float] = []
    for m in runs:
        for a in m.arms:
            rates = [float(s.tok_s) for s in a.starts if s.status == "ok" and _pos(s.tok_s)]
            groups.append(rates)
            if not rates and a.status == "ok" and _pos(a.tok_s) and not a.starts:
                rates = [float(a.tok_s)]  # a record without per-start figures (hand-made, old): one start
            n_starts += len(rates)
            if a.method == "none" and rates and not any(b.run_id == m.run_id for b in baselines):
                baselines.append(BaselineRun(run_id=m.run_id, started_at=m.started_at, start_medians=rates,
                                             argv=list(a.argv or []), env=dict(a.env or {})))
        for s in m.starts:
            if s.status != "ok" or s.superseded:
                continue
            if _pos(s.elapsed_s):
                start_s.append(float(s.elapsed_s))  # type: ignore[arg-type]
            if _pos(s.ready_s):
                ready_s.append(float(s.ready_s))  # type: ignore[arg-type]
            done = sum(w.requests_ok for w in s.windows)
            if done:
                per_start.append(float(done))
        for a in m.arms:
            if a.status != "ok":
                continue
            sv = a.serving
            if sv is not None and sv.e2el_ms is not None and _pos(sv.e2el_ms.p50):
                request_s.append(float(sv.e2el_ms.p50) / 1000.0)  # type: ignore[arg-type]
            if _pos(a.cv_within_start) and a.requests_ok and len(a.starts) >= 1:
                dof = max(int(a.requests_ok) - len(a.starts), 1)
                w_ss += float(a.cv_within_start) ** 2 * dof  # type: ignore[arg-type]
                w_df += dof
    keys = list(dict.fromkeys(m.fingerprint_key for m in runs if m.fingerprint_key))
    overhead = None
    if start_s and request_s and per_start:
        overhead = max(_median(ready_s) or 0.0, _median(start_s) - _median(per_start) * _median(request_s)) or None  # type: ignore[operator]
    prior = prior_from_starts(groups, source=f"{len(runs)} earlier run(s), {n_starts} starts, fingerprint "
                                             f"{', '.join(keys)}") if runs else None
    return Earlier(folder=str(folder), runs=[m.run_id for m in runs], fingerprint_keys=keys,
                   skipped=len(skipped or []), damaged=[f"{s.error.path}: {s.error.problem}" for s in skipped or []],
                   prior=prior, starts=n_starts, start_s=_median(start_s), ready_s=_median(ready_s),
                   request_s=_median(request_s), baselines=baselines,
                   within_sd_log=math.sqrt(w_ss / w_df) if w_df and w_ss > 0 else None,
                   requests_per_start=_median(per_start), overhead_s=overhead)


def earlier(folder: str | Path, params: RecordedParams | Mapping[str, JsonValue], **kwargs: Any) -> Earlier:
    """`find` then `summarize`."""
    runs, skipped = find(folder, params, **kwargs)
    return summarize(runs, folder, skipped)


def _pos(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None
