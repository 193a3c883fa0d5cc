"""Resuming a sweep that its budget stopped (issue 41): `spectrial sweep PARAMS --resume RUN_DIR`.

A server start is the currency: a sweep cut short by its time budget (a device call of ten minutes, a cold first
start of two) must not pay again for what it measured. The resumed sweep runs the same plan in a new record; each
server start the earlier record measured (status ok) is taken over from it, its windows, requests, logs and GPU
samples copied in (`StartRecord.replayed_from`: its order there), and only the others start a server. The new
record is the whole sweep (`resumed_from` names the earlier one, which stays as it was).

Baselines follow the sweep's one rule: a point is judged against the baseline of its host fingerprint. When the
host resumed on has the fingerprint of the earlier record's, its baseline stands; when it differs (another machine,
another build), the first live start says so and the next setting gets a baseline of its own, so no live point is
ever judged against a baseline of another host state. An earlier record older than `RESUME_MAX_AGE_S` is refused:
an old baseline is the seed case's stale one (SEED_CASE.md); start a new sweep instead.
"""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pandas as pd

from spectrial.errors import ConfigError
from spectrial.params import Arm
from spectrial.protocol.session import MeasuredStart, Session, WindowPlan
from spectrial.record.store import RunRecord, compacted, load_record, read_table, record_file_exists
from spectrial.schema import Manifest, StartRecord
from spectrial.sweep.params import Setting, SweepParams, flat_params
from spectrial.sweep.recorded import windows_from

RESUME_MAX_AGE_S = 3600.0
"""An earlier record that finished longer ago than this is not resumed (its baseline would be stale)."""

MAY_DIFFER = frozenset({"output_dir", "budget_s", "budget_restarts", "state_dir", "work_dir", "drift_dir"})
"""Params a resumed sweep may change: where it writes and how long it may run, never what it measures."""


def measured_starts(earlier: Manifest) -> dict[tuple[str, int], StartRecord]:
    """The starts of `earlier` a resume takes over, by (arm, restart): those that measured (ok, not superseded)."""
    return {(s.arm, s.restart): s for s in earlier.starts if s.status == "ok" and not s.superseded}


def load_resumable(run_dir: str | Path, params: SweepParams, now: dt.datetime | None = None
                   ) -> tuple[Manifest, pd.DataFrame]:
    """The earlier record and its requests, checked: a sweep of the same plan, finished (partial or failed) within
    `RESUME_MAX_AGE_S`. Anything else is a ConfigError naming --resume and what to do."""
    run = Path(run_dir)
    if not (run / "manifest.json").is_file():
        raise ConfigError(f"--resume: {run} holds no manifest.json; give the run folder of the sweep to resume "
                          "(outputs/<run-id>)")
    m = load_record(run)
    if m.kind != "sweep":
        raise ConfigError(f"--resume: {run} is a {m.kind} record; give the record of a sweep")
    if m.status == "running":
        raise ConfigError(f"--resume: {run} is still running; resume it once its sweep has stopped")
    if m.status == "ok":
        raise ConfigError(f"--resume: {run} measured its whole plan (status ok): nothing is left to measure")
    when = m.finished_at or m.started_at
    if when is not None:
        age = ((now or dt.datetime.now(dt.timezone.utc)) - dt.datetime.fromisoformat(when)).total_seconds()
        if age > RESUME_MAX_AGE_S:
            raise ConfigError(f"--resume: {m.run_id} finished {age / 3600:.1f} h ago; its baseline would be stale "
                              f"(at most {RESUME_MAX_AGE_S / 3600:.0f} h): start a new sweep")
    earlier, now_params = m.params.as_dict(), flat_params(params)
    differ = sorted(k for k in set(earlier) | set(now_params) if k not in MAY_DIFFER
                    and earlier.get(k) != now_params.get(k))
    if differ:
        named = ", ".join(differ[:8]) + (f" and {len(differ) - 8} more" if len(differ) > 8 else "")
        raise ConfigError(f"--resume: this sweep differs from {m.run_id}'s in {named}; resume with its "
                          f"params file and -p values (only {', '.join(sorted(MAY_DIFFER))} may differ)")
    if not record_file_exists(run / "requests.csv"):
        raise ConfigError(f"--resume: {run} has no requests.csv; its measured starts cannot be taken over")
    requests = read_table(run / "requests.csv")
    if "point" not in requests or "start" not in requests:
        raise ConfigError(f"--resume: {run}'s requests.csv names no point or start (a record of an older "
                          "spectrial): start a new sweep")
    return m, requests


class ResumeSource:
    """A live `Session` whose starts already measured in `earlier` (a record of the same sweep) are taken over from
    it instead of started again (see the module's docstring)."""

    def __init__(self, live: Session, record: RunRecord, earlier: Manifest, requests: pd.DataFrame,
                 earlier_dir: Path) -> None:
        self.live, self.record, self.earlier, self.requests, self.earlier_dir = (live, record, earlier, requests,
                                                                                 earlier_dir)
        self.done = measured_starts(earlier)
        self.fp_key = earlier.fingerprint_key or ""
        self.taken = 0
        self.prepare_s: float | None = None

    def open(self) -> None:
        self.live.open()
        self.prepare_s = self.live.prepare_s
        m = self.record.manifest
        m.resumed_from = self.earlier.run_id
        self.record.save()

    def start(self, arm: Arm, restart: int, windows: list[WindowPlan], phase: str | None = None
              ) -> MeasuredStart | None:
        src = self.done.get((arm.name, restart))
        if src is None:
            m = self.live.start(arm, restart, windows, phase)
            if self.live.fp_key and self.live.fp_key != self.fp_key and not m.record.fingerprint_changes:
                m.record.fingerprint_changes = [f"resumed on another host state than {self.earlier.run_id}'s "
                                                f"({self.fp_key or 'none'} -> {self.live.fp_key})"]
            return m
        return self._take(src, windows, phase)

    def _take(self, src: StartRecord, windows: list[WindowPlan], phase: str | None) -> MeasuredStart:
        """The earlier record's start, as this record's next start: windows, requests and files copied."""
        order = len(self.record.manifest.starts)
        entry = src.model_copy(deep=True, update={"order": order, "phase": phase, "replayed_from": src.order,
                                                  "windows": []})
        entry.notes = [*entry.notes, f"taken over from {self.earlier.run_id} (its start {src.order}): not started "
                                     "again"]
        self.record.manifest.starts.append(entry)
        self._copy_files(src)
        out = windows_from(src, entry, windows, self.requests)
        self.fp_key = src.fingerprint_key or self.fp_key
        self.taken += 1
        self.record.save()
        return MeasuredStart(entry, out)

    def _copy_files(self, src: StartRecord) -> None:
        """The start's server log and GPU samples, into this record under the same names (compacted or not)."""
        names = []
        if src.server is not None and src.server.log:
            names.append(f"logs/{Path(src.server.log).name}")  # the record keeps the server's log under logs/
        if src.gpu_sampling and src.gpu_sampling.startswith("gpu/"):
            names.append(src.gpu_sampling)
        for name in names:
            rel = Path(name)
            if ".." in rel.parts:
                continue
            for cand in (self.earlier_dir / rel, compacted(self.earlier_dir / rel)):
                if cand.is_file():
                    dest = self.record.dir / cand.relative_to(self.earlier_dir)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(cand, dest)
                    files = self.record.manifest.files
                    if dest.relative_to(self.record.dir).as_posix() not in files:
                        files.append(dest.relative_to(self.record.dir).as_posix())

    def elapsed_s(self) -> float:
        return self.live.elapsed_s()  # the budget is this run's: taken-over starts cost nothing

    def moved(self, start: StartRecord) -> str | None:
        if start.replayed_from is not None:
            return None
        moved = self.live.moved(start)
        key = moved or self.live.fp_key
        if key and key != self.fp_key:
            self.fp_key = key
            return key
        return None

    def setting(self, concurrency: int | None = None, rate: float | None = None) -> Setting | None:
        return self.live.setting(concurrency, rate)

    def close(self) -> None:
        self.live.close()


__all__ = ["MAY_DIFFER", "RESUME_MAX_AGE_S", "ResumeSource", "load_resumable"]
