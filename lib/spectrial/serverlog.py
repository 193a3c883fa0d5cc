"""A server's log, read once per start and shared by every consumer (window statistics, drafting time,
NCCL evidence, the log summary in the record, the notebooks' log table).

`ServerLog(text)` parses lazily with `spectrial.logs.parse` (the one parser per format) and keeps the table;
`window(first, last)` is the rows of the lines written during a benchmark window (spectrial.logs numbers
lines from 1).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import pandas as pd


class ServerLog:
    """The text of one server log and its parsed table (parsed at most once)."""

    def __init__(self, text: str) -> None:
        self.text = text

    @cached_property
    def table(self) -> pd.DataFrame:
        from spectrial.logs import parse

        return parse(self.text) if self.text else pd.DataFrame()

    def rows(self, kind: str | None = None, engine: str | None = None, first: int | None = None,
             last: int | None = None) -> pd.DataFrame:
        """Parsed rows of `kind` / `engine` whose line number lies in [first, last] (bounds optional)."""
        df = self.table
        if df.empty or "kind" not in df:
            return df
        mask = pd.Series(True, index=df.index)
        if kind is not None:
            mask &= df["kind"] == kind
        if engine is not None and "engine" in df:
            mask &= df["engine"] == engine
        if first is not None:
            mask &= df["line"] >= first
        if last is not None:
            mask &= df["line"] <= last
        return df[mask]

    def summary(self) -> dict[str, Any]:
        """What the parser found: records per kind and the medians of key metrics (the record's log_summary)."""
        from spectrial.logs import summary

        df = self.table
        rows = summary(df).to_dict("records") if not df.empty else []
        return {"lines": df.attrs.get("lines"), "unparsed_lines": df.attrs.get("unparsed_lines"),
                "metrics": [{k: r.get(k) for k in ("engine", "kind", "metric", "n", "median")} for r in rows]}

    def contains(self, needle: str) -> list[tuple[int, str]]:
        """(line number, line) of every line containing `needle`."""
        return [(i, ln) for i, ln in enumerate(self.text.splitlines(), 1) if needle in ln]

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.text.splitlines()[-n:])
