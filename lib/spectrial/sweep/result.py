"""What a sweep hands back: the run folder, its manifest, and tables of its points, best settings and starts;
and what every reader says of a sweep its budget stopped (`partial_reason`, `not_measured`, `sweep_status`).

A sweep that its budget (`budget_s`, `budget_restarts`) stopped before its plan was done is `partial`: its record
says so in `status`, its `reason` names the settings it did not measure, and `budget.not_measured` holds, per
setting never started, why and, per concurrency level, the final model's prediction with its range and whether
it could beat the best measured setting (`spectrial.sweep.run.Sweep._skipped`).
"""

from __future__ import annotations

import pandas as pd

from spectrial.record.store import RunResult
from spectrial.schema import Load, Manifest, PredictedLevel, SweepBudget, UnmeasuredSetting

POINT_COLUMNS = ["point", "setting", "scenario", "steps", "topk", "draft_tokens", "concurrency", "offered_rate", "status",
                 "phase",
                 "tok_s", "tok_s_ci_low", "tok_s_ci_high", "speedup", "speedup_ci_low", "speedup_ci_high",
                 "verdict", "accept_len", "cycle_ms", "draft_ms_per_cycle", "break_even_accept_len",
                 "predicted_tok_s", "prediction_error", "final_predicted_tok_s", "starts"]


class SweepResult(RunResult):
    """What a sweep produced: the run folder, its manifest and the per-request rows."""

    def points(self) -> pd.DataFrame:
        """One row per grid point (setting x concurrency, baselines first); unmeasured points included."""
        return points_table(self.manifest)

    def best(self) -> pd.DataFrame:
        """The best measured setting per scenario and concurrency, with its CI and the runner-up comparison."""
        return pd.DataFrame([b.model_dump() for b in self.manifest.best])

    def starts(self) -> pd.DataFrame:
        """Server starts in launch order: phase, arm, status, readiness, windows."""
        rows = [{"order": s.order, "phase": s.phase, "arm": s.arm, "restart": s.restart, "status": s.status,
                 "ready_s": s.ready_s, "seconds": s.elapsed_s,
                 "windows": ", ".join(f"{Load(w.concurrency, w.offered_rate).id}: "
                                      + (f"{w.tok_s:.1f}" if w.tok_s else "-") for w in s.windows),
                 "reason": s.reason} for s in self.manifest.starts]
        return pd.DataFrame(rows)

    def not_measured(self) -> pd.DataFrame:
        """Settings never started, one row per setting and concurrency level: why, the prediction and its range,
        and whether it could beat the best measured setting there."""
        return pd.DataFrame([{"setting": x.setting, "why": x.why, **(r.model_dump() if r else {})}
                             for x in not_measured(self.manifest) for r in x.predicted or [None]])

    def decisions(self) -> pd.DataFrame:
        """The guided search's decisions in order (phase, setting, why)."""
        return pd.DataFrame([d.model_dump() for d in self.manifest.decisions])


def points_table(manifest: Manifest) -> pd.DataFrame:
    rows = []
    for p in manifest.points:
        row = {c: getattr(p, c, None) for c in POINT_COLUMNS}
        row.update(point=p.id, predicted_tok_s=p.prediction.tok_s if p.prediction else None,
                   final_predicted_tok_s=p.final_prediction.tok_s if p.final_prediction else None,
                   starts=len(p.start_orders) or None)
        rows.append(row)
    return pd.DataFrame(rows, columns=POINT_COLUMNS)


_BUDGET_STOPS = ("restart budget", "time budget")



def sweep_status(manifest: Manifest) -> str:
    """The sweep's status: as recorded, but `partial` for a record written before that status existed whose
    budget stopped it (`ok` then, with `budget.stopped_by` naming the budget)."""
    b = manifest.budget or SweepBudget()
    if manifest.status == "ok" and (b.stopped_by or "").startswith(_BUDGET_STOPS):
        return "partial"
    return manifest.status


def not_measured(manifest: Manifest) -> list[UnmeasuredSetting]:
    """Settings the sweep never started: `budget.not_measured`, or for older records the points marked "not
    measured" (their final prediction, without a range: assumed able to beat the best unless the guided search
    called them "not needed")."""
    b = manifest.budget
    if b is not None and b.not_measured is not None:
        return list(b.not_measured)
    out: dict[str, UnmeasuredSetting] = {}
    for p in manifest.points:
        if p.status != "not measured" or p.method == "none" or p.offered_rate is not None:
            continue
        x = out.setdefault(p.setting or p.id, UnmeasuredSetting(
            setting=p.setting or p.id, steps=p.steps, topk=p.topk, draft_tokens=p.draft_tokens,
            synthetic_accept=p.scenario, why=p.reason or "not measured"))
        could = not (p.reason or "").startswith("not needed")
        x.predicted.append(PredictedLevel(concurrency=p.concurrency, could_beat=could,
                                          tok_s=p.final_prediction.tok_s if p.final_prediction else None))
        if could:
            x.could_beat_at.append(p.concurrency)
    return list(out.values())


def prediction_text(pred: PredictedLevel, best: bool = True) -> str:
    """An unmeasured setting's prediction at one level in words; with `best`, against the best measured."""
    if pred.tok_s is None:
        return "no prediction: the model cannot predict it, so it could be faster"
    text = f"predicted {pred.tok_s:.1f} tok/s"
    if pred.low is not None and pred.high is not None:
        text += f" [{pred.low:.1f}, {pred.high:.1f}]"
    if best and pred.best and pred.best_tok_s is not None:
        text += (f", {'could beat' if pred.could_beat else 'cannot beat beyond the noise'} the best "
                 f"measured, {pred.best} {pred.best_tok_s:.1f} tok/s")
    return text


def partial_reason(manifest: Manifest) -> str | None:
    """What a partial sweep did not measure, in one paragraph (the record's `reason`, the CLI's last line, the
    verdict's first sentence); None when the sweep is not partial."""
    return budget_text(manifest) if sweep_status(manifest) == "partial" else None


def budget_text(manifest: Manifest, most: int = 6) -> str:
    """Why the budget stopped the sweep; the settings it did not measure: first those that could beat the best
    measured (each with its prediction; at most `most`), then the names of the rest; the settings measured with
    fewer starts than planned."""
    b = manifest.budget
    left = not_measured(manifest)
    could = [x for x in left if x.could_beat_at]
    rest = [x.setting for x in left if not x.could_beat_at]
    stopped_by = b.stopped_by if b else None
    text = f"stopped by the {stopped_by or 'budget'}"
    est = b.start_estimate if b else None
    if est is not None and est.how and (stopped_by or "").startswith("time budget"):
        text += f" (start estimate: {est.how})"
    if left:
        text += f"; {len(left)} of {b.settings if b else '?'} settings not measured"
    if could:
        named = []
        for x in could[:most]:
            preds = [r for r in x.predicted if r.could_beat]
            named.append(f"{x.setting} (" + "; ".join(
                (f"concurrency {r.concurrency}: " if len(x.predicted) > 1 else "")
                + prediction_text(r, best=False)
                + (f" vs {r.best} at {r.best_tok_s:.1f}" if r.best and r.best_tok_s else "")
                for r in preds) + ")")
        text += (f"; {len(could)} could be faster than the best measured: " + "; ".join(named)
                 + (f"; and {len(could) - most} more" if len(could) > most else "")
                 + ("; so the best they could beat is not confirmed"
                    if any(r.best for x in could for r in x.predicted) else ""))
    if rest:
        text += (f"; {'the other ' if could else ''}{len(rest)} predicted not to beat the best beyond the noise: "
                 + ", ".join(rest))
    if left and b is not None and b.remaining_estimate_s:
        text += (f"; measuring {'it' if len(left) == 1 else f'all {len(left)}'} would take "
                 f"~{b.remaining_estimate_s:.0f} s more")
    short = b.fewer_starts if b else []
    if short:
        text += "; fewer starts than planned: " + ", ".join(f"{x.setting} ({x.starts} of {x.planned})"
                                                           for x in short)
    return text
