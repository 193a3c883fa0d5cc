"""Calibration data out (issue 40 item 5): the measured cycle costs of a sweep or trial, in a documented object that
simulators of serving systems (Vidur, LLMServingSim and the like) can read, with the fitted model's residuals.

Format `spectrial-calibration/1` (JSON; `frame()` gives the same points as CSV rows):

    run_id, engine, engine_version, model, draft, gpus      what was measured, where
    units                                                   every figure's unit (`spectrial.analysis.catalogue`)
    baseline[]       concurrency, ms_per_token, tok_s       the target alone per batch size
    points[]         one per speculative setting and concurrency level (a trial: per arm at its concurrency):
                     method, steps, topk, draft_tokens, concurrency, scenario (None: the draft's own acceptance),
                     cycle_ms (time per verify cycle on the decode rate's clock: accept_len / tok_s x 1000),
                     engine_cycle_ms (the engine's own decode time / verify cycles, a cross-check),
                     draft_ms_per_cycle (the engine's drafting time per cycle, where it reports it),
                     accept_len, per_position (acceptance probability per draft position), tok_s (per request),
                     predicted_tok_s, predicted_cycle_ms (the sweep's fitted model, `spectrial.sweep.model`),
                     residual (measured / predicted tok/s - 1, the prediction made before the point was
                     measured: out of sample, guided sweeps), fit_residual (measured / the final model's tok/s - 1:
                     in sample), requests
    model            the sweep's cycle fits per concurrency (cycle_ms = a + b x k) and acceptance fits, as recorded

Every value is the record's own but `fit_residual`, the one ratio of two recorded figures.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from pydantic import BaseModel, Field

from spectrial.analysis.catalogue import CATALOGUE
from spectrial.schema import ArmRecord, Manifest, PointRecord

FORMAT = "spectrial-calibration/1"
_FIGURES = ("cycle_ms", "engine_cycle_ms", "draft_ms_per_cycle", "accept_len", "per_position", "tok_s")


class CalibrationPoint(BaseModel):
    method: str
    steps: int | None = None
    topk: int | None = None
    draft_tokens: int | None = None
    concurrency: int = 1
    scenario: float | None = None
    cycle_ms: float | None = None
    engine_cycle_ms: float | None = None
    draft_ms_per_cycle: float | None = None
    accept_len: float | None = None
    per_position: list[float] | None = None
    tok_s: float | None = None
    predicted_tok_s: float | None = None
    predicted_cycle_ms: float | None = None
    residual: float | None = None
    fit_residual: float | None = None
    requests: int | None = None


class Calibration(BaseModel):
    format: str = FORMAT
    run_id: str
    engine: str | None = None
    engine_version: str | None = None
    model: str | None = None
    draft: str | None = None
    gpus: list[str] = Field(default_factory=list)
    units: dict[str, str] = Field(default_factory=dict)
    baseline: list[dict[str, float | int | None]] = Field(default_factory=list)
    points: list[CalibrationPoint] = Field(default_factory=list)
    model_fits: dict[str, Any] | None = None

    def frame(self) -> pd.DataFrame:
        """The points as rows (per_position as a ';'-joined text), with the run's identity on each."""
        rows = [{"run_id": self.run_id, "engine": self.engine, **p.model_dump(),
                 "per_position": ";".join(f"{x:.6g}" for x in p.per_position) if p.per_position else None}
                for p in self.points]
        return pd.DataFrame(rows)


def _point(a: ArmRecord, concurrency: int, scenario: float | None) -> CalibrationPoint:
    pred = a.final_prediction if isinstance(a, PointRecord) else None
    return CalibrationPoint(method=a.method or "", steps=a.steps, topk=a.topk, draft_tokens=a.draft_tokens,
                            concurrency=concurrency, scenario=scenario, cycle_ms=a.cycle_ms,
                            engine_cycle_ms=a.engine_cycle_ms, draft_ms_per_cycle=a.draft_ms_per_cycle,
                            accept_len=a.accept_len, per_position=a.per_position, tok_s=a.tok_s,
                            predicted_tok_s=pred.tok_s if pred else None,
                            predicted_cycle_ms=pred.cycle_ms if pred else None,
                            residual=a.prediction_error if isinstance(a, PointRecord) else None,
                            fit_residual=a.tok_s / pred.tok_s - 1 if pred and a.tok_s and pred.tok_s else None,
                            requests=a.requests_ok)


def calibration(m: Manifest) -> Calibration:
    """The calibration object of a sweep (its points) or a trial (its arms at the run's concurrency)."""
    gpus = [g.name for g in m.host.gpus.gpus if g.name] if m.host.gpus is not None else []
    cal = Calibration(run_id=m.run_id, engine=m.engine.name or m.params.engine, engine_version=m.engine.version,
                      model=m.params.model, draft=m.params.draft, gpus=gpus,
                      units={f: CATALOGUE[f].unit for f in _FIGURES} | {"predicted_tok_s": CATALOGUE["tok_s"].unit,
                                                                       "predicted_cycle_ms": CATALOGUE["cycle_ms"].unit,
                                                                       "residual": "fraction", "fit_residual": "fraction"})
    if m.points:
        ok = [p for p in m.points if p.status == "ok" and p.offered_rate is None]  # batch sizes: closed loops only
        cal.baseline = [{"concurrency": p.concurrency, "ms_per_token": p.ms_per_token, "tok_s": p.tok_s}
                        for p in ok if p.method == "none"]
        cal.points = [_point(p, p.concurrency, p.scenario) for p in ok if p.method != "none" and p.policy is None]
        cal.model_fits = m.model.model_dump(mode="json") if m.model is not None else None
    else:
        c = m.params.concurrency or 1
        ok = [a for a in m.arms if a.status == "ok"]
        cal.baseline = [{"concurrency": c, "ms_per_token": a.ms_per_token, "tok_s": a.tok_s}
                        for a in ok if a.method in (None, "none")]
        cal.points = [_point(a, c, None) for a in ok if a.method not in (None, "none")]
    return cal
