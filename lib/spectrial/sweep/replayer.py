"""Replaying a strategy on a finished grid sweep: what would guided have measured, and found, on this data?

A grid record holds every setting's server start (its windows' counters and per-position rates) and every
request (`requests.csv`). Replaying runs the guided search (or any strategy and budget) with each "server
start" served from the record by `ReplaySource` (a `spectrial.protocol.session.StartSource`) instead of a host: same
decisions code, no host, no device time. The replay's clock is the recorded duration of each start, so time
budgets behave as they would have. Use it to judge the search on a committed record (a GPU grid, say) and
to compare guided with the grid on identical measurements, free of the drift between two live runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from spectrial.errors import ConfigError
from spectrial.params import Arm
from spectrial.protocol.session import MeasuredStart, OfflineSource, WindowPlan
from spectrial.record.store import RunRecord, load_record, opened, read_table, trial_params
from spectrial.schema import Manifest, StartRecord
from spectrial.sweep.params import Setting, load_sweep_params
from spectrial.sweep.recorded import windows_from
from spectrial.sweep.result import SweepResult
from spectrial.sweep.run import Sweep, execute, new_record


class ReplaySource(OfflineSource):
    """Server starts read from a finished record: `source` (its manifest, starts keyed by setting name) and
    `requests` (its requests.csv, each row naming its `point` and `start`)."""

    def __init__(self, record: RunRecord, source: Manifest, requests: pd.DataFrame) -> None:
        super().__init__(record)
        self.source, self.requests = source, requests
        self.fp_key = f"replay:{source.fingerprint_key}"  # never matched by drift checks of live runs

    def open(self) -> None:
        m, src = self.record.manifest, self.source
        m.engine, m.host, m.models = src.engine, src.host, src.models
        m.fingerprint_key, m.replayed_from = self.fp_key, src.run_id
        self.record.save()

    def start(self, arm: Arm, restart: int, windows: list[WindowPlan], phase: str | None = None
              ) -> MeasuredStart | None:
        src = next((s for s in self.source.starts if s.arm == arm.name and s.restart == restart), None)
        if src is None or src.status != "ok":  # no data: not a restart of the replay, just unavailable
            return None
        entry = StartRecord(arm=arm.name, restart=restart, order=len(self.record.manifest.starts), phase=phase,
                            status="ok", fingerprint_key=self.fp_key, replayed_from=src.order, ready_s=src.ready_s,
                            elapsed_s=src.elapsed_s)
        self.record.manifest.starts.append(entry)
        out = windows_from(src, entry, windows, self.requests)
        self.clock += float(src.elapsed_s or 0.0)
        return MeasuredStart(entry, out)


def _from_trial(src: Manifest, requests: pd.DataFrame) -> tuple[dict[str, Any], Manifest, pd.DataFrame]:
    """A trial record whose arms form a grid (one method and draft) as sweep params, starts and requests."""
    trial = src.params.as_dict()
    t = trial_params(src, "the trial record's params")
    sweep = load_sweep_params(data={"trial": trial})
    c = t.concurrency
    names: dict[str, str] = {}
    for a in t.arms:
        if not a.speculative:
            names.setdefault(a.name, "baseline")
            continue
        steps, topk = t.arm_steps(a), t.arm_topk(a)
        dt = steps + 1 if topk == 1 else t.arm_draft_tokens(a)
        names[a.name] = sweep.arm(Setting(steps, topk, int(dt or steps + 1), a.synthetic_accept)).name
    figures = {a.name: a for a in src.arms}
    elapsed: dict[tuple[str, int], float] = {}
    for st in src.steps:
        arm = st.get("arm")
        if arm is not None and st.name.split(":")[0] in ("launch", "ready", "env_check", "benchmark", "stop"):
            key = (arm, int(st.get("restart", 0)))
            elapsed[key] = elapsed.get(key, 0.0) + float(st.elapsed_s or 0.0)
    starts = []
    for s in src.starts:
        if s.arm not in names:
            continue
        f = figures.get(s.arm)
        wins = [w.model_copy(update={"concurrency": c, "per_position": w.per_position or (f.per_position if f else None),
                                     "stats_source": w.stats_source or (f.stats_source if f else None),
                                     "stats_scoped": f.stats_scoped if f and f.stats_scoped is not None else True})
                for w in s.windows]
        starts.append(s.model_copy(update={"arm": names[s.arm], "windows": wins,
                                           "elapsed_s": s.elapsed_s or elapsed.get((s.arm, s.restart))}))
    order = {(s.arm, s.restart): s.order for s in src.starts}
    reqs = requests[requests["arm"].isin(list(names))].copy()
    if "start" not in reqs or reqs["start"].isna().all():
        reqs["start"] = [order.get((a, int(r))) for a, r in zip(reqs["arm"], reqs["restart"], strict=True)]
    reqs["point"] = [f"{names[a]}@c{c}" for a in reqs["arm"]]
    return {"trial": trial}, src.model_copy(update={"starts": starts}), reqs


def replay(run_dir: str | Path, overrides: dict[str, Any] | None = None, *, output_dir: str | Path | None = None,
           raise_on_failure: bool = True) -> SweepResult:
    """Run a sweep (default strategy: guided) on the measurements of a finished grid: a sweep record, or a trial
    record whose arms form a grid (one method and draft; e.g. a depth x acceptance trial on a GPU host).

    `overrides` are dotted sweep parameters (e.g. {"budget_restarts": 5}); settings the record lacks are
    unavailable to the replay (never measured, never counted as a restart). The replay's record goes to
    `output_dir` (default: <run_dir>/replays).
    """
    run_dir = Path(run_dir)
    src = load_record(run_dir)
    csv = run_dir / "requests.csv"
    if not csv.is_file():
        raise ConfigError(f"{run_dir}: requests.csv is missing; a replay needs every request of the record")
    requests = read_table(csv)  # a damaged requests.csv: RecordDamaged
    if src.kind == "trial":
        data, src, requests = _from_trial(src, requests)
    elif src.kind in ("sweep", "sweep-world"):
        data = src.params.as_dict()
        if "point" not in requests or requests["point"].isna().all():  # before schema 2 the point id was `arm`
            requests["point"] = requests["arm"]
    else:
        raise ConfigError(f"{run_dir}: a replay needs a sweep, sweep-world or trial record, this one is "
                          f"{src.kind!r}")
    params = load_sweep_params(data=data, overrides={"strategy": "guided", **(overrides or {})})
    def make() -> Sweep:
        record = new_record(params, kind="sweep-replay", output_dir=output_dir or run_dir / "replays")
        return Sweep(params, record, ReplaySource(record, src, requests))

    with opened(make) as sw:
        return execute(sw, raise_on_failure, drift=False)


@dataclass(frozen=True)
class Judgement:
    """One scenario and concurrency level: the grid's best setting (tok/s and CI) against the setting another
    search found, as measured in the grid record; the gap (grid best - found) / grid best, and whether the found
    setting lies within the grid-best's CI (at or above its lower bound)."""

    scenario: float | None
    c: int
    grid_best: str
    grid_tok_s: float
    grid_ci: tuple[float | None, float | None]
    found: str
    found_own_tok_s: float | None
    found_in_grid_tok_s: float | None
    gap: float | None
    within_ci: bool


def judge(grid: Manifest, other: Manifest) -> list[Judgement]:
    """Per scenario and concurrency: the best setting of `other` (a guided replay, say), as measured in the grid
    record, against the grid's best: the gap, and whether it lies within the grid-best's CI (at or above its
    lower bound: the issue's yardstick). Both manifests must be of the same measurements (a replay)."""
    rows = []
    gb = {(b.scenario, b.concurrency): b for b in grid.best if b.best and b.offered_rate is None}
    for ob in other.best:
        if ob.offered_rate is not None:  # request-rate levels: the search does not steer by them
            continue
        key = (ob.scenario, ob.concurrency)
        g = gb.get(key)
        if g is None or g.best is None or g.tok_s is None or not ob.best:
            continue
        same = next((p for p in grid.points if p.setting == ob.best and p.concurrency == key[1]
                     and p.offered_rate is None and p.status == "ok"), None)
        in_grid = same.tok_s if same else None
        rows.append(Judgement(scenario=key[0], c=key[1], grid_best=g.best, grid_tok_s=g.tok_s,
                              grid_ci=(g.tok_s_ci_low, g.tok_s_ci_high), found=ob.best, found_own_tok_s=ob.tok_s,
                              found_in_grid_tok_s=in_grid,
                              gap=None if in_grid is None else (g.tok_s - in_grid) / g.tok_s,
                              within_ci=in_grid is not None and in_grid >= (g.tok_s_ci_low or g.tok_s)))
    return rows


__all__ = ["Judgement", "ReplaySource", "judge", "replay"]
