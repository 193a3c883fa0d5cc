"""What a sweep hands back: the run folder, its manifest, and tables of its points, best settings and starts."""

from __future__ import annotations

import pandas as pd

from spectrial.records import RunResult
from spectrial.schema import Manifest

POINT_COLUMNS = ["point", "setting", "scenario", "steps", "topk", "draft_tokens", "concurrency", "status", "phase",
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
        return pd.DataFrame(self.manifest.best)

    def starts(self) -> pd.DataFrame:
        """Server starts in launch order: phase, arm, status, readiness, windows."""
        rows = [{"order": s.order, "phase": s.phase, "arm": s.arm, "restart": s.restart, "status": s.status,
                 "ready_s": s.ready_s, "seconds": s.elapsed_s,
                 "windows": ", ".join(f"c{w.concurrency}: {w.tok_s:.1f}" if w.tok_s else f"c{w.concurrency}: -"
                                      for w in s.windows),
                 "reason": s.reason} for s in self.manifest.starts]
        return pd.DataFrame(rows)

    def decisions(self) -> pd.DataFrame:
        """The guided search's decisions in order (phase, setting, why)."""
        return pd.DataFrame(self.manifest.decisions)


def points_table(manifest: Manifest) -> pd.DataFrame:
    rows = []
    for p in manifest.points:
        pred = p.prediction or {}
        final = p.final_prediction or {}
        row = {c: getattr(p, c, None) for c in POINT_COLUMNS}
        row.update(point=p.id, predicted_tok_s=pred.get("tok_s"), final_predicted_tok_s=final.get("tok_s"),
                   starts=len(p.start_orders) or None)
        rows.append(row)
    return pd.DataFrame(rows, columns=POINT_COLUMNS)
