"""Replaying a strategy on a finished grid sweep: what would guided have measured, and found, on this data?

A grid record holds every setting's server start (its windows' counters and per-position rates) and every
request (`requests.csv`). Replaying runs the guided search (or any strategy and budget) with each "server
start" served from the record instead of a server: same decisions code, no host, no device time. The
replay's clock is the recorded duration of each start, so time budgets behave as they would have.
Use it to judge the search on a committed record (a GPU grid, say) and to compare guided with the grid on
identical measurements, free of the drift between two live runs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from spectrial.engines import ArmStats
from spectrial.errors import ConfigError
from spectrial.params import Arm
from spectrial.params import validate as validate_trial
from spectrial.records import load_manifest
from spectrial.sweep.params import Setting, SweepParams, load_sweep_params
from spectrial.sweep.result import WINDOW_COUNTERS, SweepResult
from spectrial.sweep.run import _point_id, _Sweep, execute, new_record


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}


class _Replay(_Sweep):
    """A sweep whose server starts are read from a grid record."""

    def __init__(self, sweep: SweepParams, record: Any, source: dict[str, Any], requests: pd.DataFrame) -> None:
        super().__init__(sweep, record, progress=False)
        self.source, self.src_requests = source, requests
        self.clock = 0.0

    def open(self) -> None:
        src = self.source
        self.fp_key = f"replay:{src.get('fingerprint_key')}"  # never matched by drift checks of live runs
        self.record.manifest.update(engine=src.get("engine") or {}, host=src.get("host") or {},
                                    models=src.get("models") or [], fingerprint_key=self.fp_key,
                                    replayed_from=src.get("run_id"))
        self.record.save()

    def close(self) -> None:
        return None

    def elapsed_s(self) -> float:
        return self.clock

    def _one_start(self, arm: Arm, restart: int, phase: str) -> None:
        src = next((s for s in self.source.get("starts", []) if s["arm"] == arm.name and s["restart"] == restart),
                   None)
        if src is None or src.get("status") != "ok":  # no data: not a restart of the replay, just unavailable
            why = "not in the source record" if src is None else f"failed there: {src.get('reason')}"
            self.decisions.append({"phase": phase, "setting": arm.name, "reason": f"unavailable in the replay: {why}"})
            for c in self.levels:
                self.points[_point_id(arm, c)].failed = why
            return
        entry: dict[str, Any] = {"arm": arm.name, "restart": restart, "order": self.n_starts, "phase": phase,
                                 "status": "ok", "reason": None, "fingerprint_key": self.fp_key, "windows": [],
                                 "replayed_from": src["order"]}
        self.record.manifest["starts"].append(entry)
        entry.update(ready_s=src.get("ready_s"), elapsed_s=src.get("elapsed_s"))
        for w in src.get("windows", []):
            if w["concurrency"] not in self.levels:
                continue
            pt = self.points[_point_id(arm, w["concurrency"])]
            rows = self.src_requests[(self.src_requests["arm"] == pt.id) & (self.src_requests["start"] == src["order"])]
            reqs = [_clean(r) for r in rows.to_dict("records")]
            counters = w.get("counters") or {}
            stats = ArmStats(**{k: counters.get(k) for k in WINDOW_COUNTERS}, per_position=w.get("per_position"),
                             accept_len=w.get("accept_len"), scoped=bool(w.get("stats_scoped", True)),
                             source=w.get("stats_source") or "replay")
            self.add_window(pt, entry, restart, reqs, stats)
        self.clock += float(src.get("elapsed_s") or 0.0)
        self.durations.append(float(src.get("elapsed_s") or 0.0))
        for c in self.levels:
            self._refresh(self.points[_point_id(arm, c)])


def _from_trial(src: dict[str, Any], requests: pd.DataFrame) -> tuple[dict[str, Any], dict[str, Any], pd.DataFrame]:
    """A trial record whose arms form a grid (one method and draft) as sweep params, starts and requests."""
    trial = src["params"]
    t = validate_trial(trial, "the trial record's params")
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
    figures = {a["name"]: a for a in src.get("arms", [])}
    elapsed: dict[tuple[str, int], float] = {}
    for st in src.get("steps", []):
        if st.get("arm") is not None and str(st["name"]).split(":")[0] in ("launch", "ready", "env_check",
                                                                           "benchmark", "stop"):
            key = (st["arm"], int(st.get("restart") or 0))
            elapsed[key] = elapsed.get(key, 0.0) + float(st.get("elapsed_s") or 0.0)
    starts = []
    for s in src.get("starts", []):
        if s["arm"] not in names:
            continue
        f = figures.get(s["arm"], {})
        starts.append({"arm": names[s["arm"]], "restart": s["restart"], "order": s["order"], "status": s["status"],
                       "reason": s.get("reason"), "ready_s": s.get("ready_s"),
                       "elapsed_s": elapsed.get((s["arm"], s["restart"])),
                       "windows": [{"concurrency": c, "counters": s.get("counters") or {},
                                    "per_position": f.get("per_position"), "accept_len": None,
                                    "stats_source": f.get("stats_source"), "stats_scoped": f.get("stats_scoped", True)}]})
    order = {(s["arm"], s["restart"]): s["order"] for s in src.get("starts", [])}
    reqs = requests[requests["arm"].isin(list(names))].copy()
    reqs["start"] = [order.get((a, int(r))) for a, r in zip(reqs["arm"], reqs["restart"], strict=True)]
    reqs["arm"] = [f"{names[a]}@c{c}" for a in reqs["arm"]]
    return {"trial": trial}, {**src, "starts": starts}, reqs


def replay(run_dir: str | Path, overrides: dict[str, Any] | None = None, *, output_dir: str | Path | None = None,
           raise_on_failure: bool = True) -> SweepResult:
    """Run a sweep (default strategy: guided) on the measurements of a finished grid: a sweep record, or a trial
    record whose arms form a grid (one method and draft; e.g. a depth x acceptance trial on a GPU host).

    `overrides` are dotted sweep parameters (e.g. {"budget_restarts": 5}); settings the record lacks are
    unavailable to the replay (never measured, never counted as a restart). The replay's record goes to
    `output_dir` (default: <run_dir>/replays).
    """
    run_dir = Path(run_dir)
    src = load_manifest(run_dir)
    csv = run_dir / "requests.csv"
    if not csv.is_file():
        raise ConfigError(f"{run_dir}: requests.csv is missing; a replay needs every request of the record")
    requests = pd.read_csv(csv)
    if src.get("kind") == "trial":
        data, src, requests = _from_trial(src, requests)
    elif src.get("kind") in ("sweep", "sweep-world"):
        data = json.loads(json.dumps(src["params"]))
    else:
        raise ConfigError(f"{run_dir}: a replay needs a sweep, sweep-world or trial record, this one is "
                          f"{src.get('kind')!r}")
    params = load_sweep_params(data=data, overrides={"strategy": "guided", **(overrides or {})})
    record = new_record(params, kind="sweep-replay", output_dir=output_dir or run_dir / "replays")
    return execute(_Replay(params, record, src, requests), raise_on_failure, drift=False)


def judge(grid: dict[str, Any], other: dict[str, Any]) -> list[dict[str, Any]]:
    """Per scenario and concurrency: the best setting of `other` (a guided replay, say), as measured in the grid
    record, against the grid's best: the gap, and whether it lies within the grid-best's CI (at or above its
    lower bound: the issue's yardstick). Both manifests must be of the same measurements (a replay)."""
    rows = []
    gb = {(b["scenario"], b["concurrency"]): b for b in grid.get("best") or [] if b.get("best")}
    for ob in other.get("best") or []:
        key = (ob["scenario"], ob["concurrency"])
        g = gb.get(key)
        if g is None or not ob.get("best"):
            continue
        same = next((p for p in grid["points"] if p["setting"] == ob["best"] and p["concurrency"] == key[1]
                     and p["status"] == "ok"), None)
        in_grid = same["tok_s"] if same else None
        rows.append({"scenario": key[0], "c": key[1], "grid_best": g["best"], "grid_tok_s": g["tok_s"],
                     "grid_ci": (g.get("tok_s_ci_low"), g.get("tok_s_ci_high")), "found": ob["best"],
                     "found_own_tok_s": ob["tok_s"], "found_in_grid_tok_s": in_grid,
                     "gap": None if in_grid is None else (g["tok_s"] - in_grid) / g["tok_s"],
                     "within_ci": in_grid is not None and in_grid >= (g.get("tok_s_ci_low") or g["tok_s"])})
    return rows
