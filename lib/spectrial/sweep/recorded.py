"""A start of a finished record, as a start of another record: its windows and requests (the replay of a grid,
`spectrial.sweep.replayer`, and the resume of a partial sweep, `spectrial.sweep.resume`, read them alike)."""

from __future__ import annotations

import pandas as pd

from spectrial.protocol.session import MeasuredWindow, WindowPlan
from spectrial.schema import RequestRecord, StartRecord, WindowRecord
from spectrial.sweep.params import Load


def windows_from(src: StartRecord, entry: StartRecord, windows: list[WindowPlan], requests: pd.DataFrame
                 ) -> list[MeasuredWindow]:
    """The windows of a recorded start `src` that `windows` plans, as start `entry` of another record measured them:
    each window's record (appended to `entry.windows`), its requests from `requests` (rows naming the point and
    `src`'s order, renumbered to `entry`) and its statistics."""
    levels = {Load(w.concurrency, w.rate): w for w in windows}
    out = []
    for w in src.windows:
        load = Load(w.concurrency, w.offered_rate)
        if load not in levels:
            continue
        rows = requests[(requests["point"] == f"{entry.arm}@{load.id}") & (requests["start"] == src.order)]
        rows = rows.astype(object).where(rows.notna(), None)  # NaN cells: fields not set
        reqs = [RequestRecord.model_validate(r) for r in rows.to_dict("records")]
        for r in reqs:
            r.restart, r.start = entry.restart, entry.order
        record = WindowRecord.model_validate(w.model_dump())
        entry.windows.append(record)
        out.append(MeasuredWindow(levels[load], record, reqs, w.stats()))
    return out


__all__ = ["windows_from"]
