"""The registry of formats: which marker selects which format, which kinds exist, what summary reports."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from spectrial.errors import ConfigError
from spectrial.logs.chunks import Chunk, Window
from spectrial.logs.formats import BlockFormat, BlockResult, Blocks, Format, LineFormat, Record
from spectrial.logs.text import TS_ISO


class Registry:
    """The known formats; each marker string selects exactly one format."""

    def __init__(self) -> None:
        self._formats: list[Format] = []
        self._markers: dict[str, Format] = {}

    @property
    def formats(self) -> tuple[Format, ...]:
        """Registered formats, in registration order."""
        return tuple(self._formats)

    def add(self, fmt: Format) -> Format:
        """Register a LineFormat or BlockFormat; markers must be new and non-empty."""
        if not isinstance(fmt, (LineFormat, BlockFormat)):
            raise ConfigError(f"format: expected a LineFormat or BlockFormat, got {type(fmt).__name__}")
        if not fmt.markers or any(not m for m in fmt.markers):
            raise ConfigError(f"markers: {fmt.engine}/{fmt.kind} needs at least one non-empty marker string")
        for m in fmt.markers:
            if m in self._markers:
                other = self._markers[m]
                raise ConfigError(f"markers: {m!r} of {fmt.engine}/{fmt.kind} is already used by "
                                  f"{other.engine}/{other.kind}; pick a more specific marker")
        for m in fmt.markers:
            self._markers[m] = fmt
        self._formats.append(fmt)
        return fmt

    def register(self, engine: str, kind: str, markers: Sequence[str],
                 columns: Mapping[str, str] | Sequence[str], *, kinds: Sequence[str] = (),
                 key_metrics: Sequence[str] = (), timestamps: Sequence[str] = (TS_ISO,),
                 kind_columns: Mapping[str, Sequence[str]] | None = None,
                 ) -> Callable[[Callable[[str], Any]], Callable[[str], Any]]:
        """Decorator: register `fn(line) -> dict | list[dict] | None` for lines holding a marker.

        The dicts hold the record's columns (`columns`: names, all float, or name -> type); they may set
        `kind` and `timestamp` (`kinds`: the other kinds it sets; `kind_columns`: each kind's columns where they
        differ). The function runs once per marker line, in Python: prefer a
        :class:`~spectrial.logs.formats.LineFormat` (data, vectorised) where regexes can say it. Example::

            @register("myengine", "step", markers=["step time"], columns=["step_ms"])
            def step(line):
                m = re.search(r"step time: ([0-9.]+) ms", line)
                return {"step_ms": float(m.group(1))} if m else None
        """
        cols = dict(columns) if isinstance(columns, Mapping) else {c: "float" for c in columns}

        def deco(fn: Callable[[str], Any]) -> Callable[[str], Any]:
            def block(w: Window) -> BlockResult:
                got = fn(w[0] or "")
                recs = [got] if isinstance(got, dict) else list(got or [])
                return [(0, r) for r in recs if r], (1 if recs else 0)

            def vector(chunk: Chunk, at: np.ndarray) -> Blocks:
                return _per_line(chunk, at, fn)

            self.add(BlockFormat(engine, kind, tuple(markers), block, cols, kinds=tuple(kinds),
                                 key_metrics=tuple(key_metrics), timestamps=tuple(timestamps), vector=vector,
                                 kind_columns={k: tuple(v) for k, v in (kind_columns or {}).items()}))
            return fn

        return deco

    def kinds(self) -> list[tuple[str, str]]:
        """(engine, kind) pairs the formats can produce."""
        seen: dict[tuple[str, str], None] = {}
        for f in self._formats:
            for k in (f.kind, *f.kinds):
                seen[(f.engine, k)] = None
        return list(seen)

    def select(self, kinds: str | Iterable[str] | None) -> list[Format]:
        """Formats producing any of `kinds` (a kind, an engine, or "engine:kind"); all when None."""
        if kinds is None:
            return list(self._formats)
        wanted = {kinds} if isinstance(kinds, str) else set(kinds)
        known = {n for e, k in self.kinds() for n in (e, k, f"{e}:{k}")}
        unknown = sorted(wanted - known)
        if unknown:
            raise ConfigError(f"kinds: unknown {unknown}; known kinds: "
                              f"{sorted({k for _, k in self.kinds()})} and engines "
                              f"{sorted({e for e, _ in self.kinds()})}")
        return [f for f in self._formats if any(wants(wanted, f.engine, k) for k in (f.kind, *f.kinds))]

    def key_metrics(self, engine: str, kind: str) -> tuple[str, ...]:
        """The metrics `summary` reports for (engine, kind)."""
        for f in self._formats:
            if f.engine == engine and kind in (f.kind, *f.kinds) and f.key_metrics:
                return f.key_metrics
        return ()


def wants(wanted: set[str], engine: str, kind: str) -> bool:
    """Whether a `kinds` selection (kinds, engines, "engine:kind") takes records of (engine, kind)."""
    return bool(wanted & {engine, kind, f"{engine}:{kind}"})


def _per_line(chunk: Chunk, at: np.ndarray, fn: Callable[[str], Any]) -> Blocks:
    """A one-line function over all its marker lines (the same text a Window gives)."""
    used = np.zeros(len(at), np.int64)
    block: list[int] = []
    recs: list[Record] = []
    for j, line in enumerate(chunk.strings(at)):
        got = fn(line or "")
        got = [got] if isinstance(got, dict) else list(got or [])
        if got:
            used[j] = 1
        for r in got:
            if r:
                block.append(j)
                recs.append(r)
    names: dict[str, None] = {}
    for r in recs:
        names.update(dict.fromkeys(r))
    cols = {}
    for c in names:
        col = np.empty(len(recs), object)
        col[:] = [r.get(c) for r in recs] if recs else []
        cols[c] = col
    b = np.array(block, np.int64)
    return Blocks(used, np.ones(len(at), np.int64), b, np.zeros(len(b), np.int64), cols)


registry = Registry()
"""The default registry: every format of spectrial.logs (the engine modules add theirs on import)."""
register = registry.register
