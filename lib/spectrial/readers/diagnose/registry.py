"""The detectors: one function per cause, registered with its kind, rank and public sources.

A detector reads a `Context` and yields `Finding`s; `@detector(kind, order, *sources)` registers it, and the
findings it yields get its rank (`order`: how often that cause is the answer, 1 first) and, unless they name
their own (or say `sources=[]`: none fits), its sources.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from spectrial.readers.diagnose.context import Context
from spectrial.readers.diagnose.model import Finding, Source
from spectrial.readers.diagnose.sources import sources

DetectorFn = Callable[[Context], Iterable[Finding]]


@dataclass(frozen=True)
class Detector:
    """A registered detector: its kind, rank, what it checks (its docstring's first line), its sources."""

    kind: str
    order: int
    fn: DetectorFn
    sources: tuple[Source, ...]

    @property
    def title(self) -> str:
        return (self.fn.__doc__ or self.kind).strip().splitlines()[0]

    def run(self, ctx: Context) -> list[Finding]:
        out = []
        for f in self.fn(ctx):
            f.order = self.order
            if not f.sources and "sources" not in f.model_fields_set:  # sources=[]: none of them fits
                f.sources = list(self.sources)
            out.append(f)
        return out


DETECTORS: dict[str, Detector] = {}


def detector(kind: str, order: int, *source_keys: str) -> Callable[[DetectorFn], DetectorFn]:
    """Register `fn` as the detector of `kind` (rank `order`, public sources `source_keys`)."""

    def wrap(fn: DetectorFn) -> DetectorFn:
        if kind in DETECTORS:
            raise ValueError(f"detector {kind!r} registered twice")
        DETECTORS[kind] = Detector(kind, order, fn, tuple(sources(*source_keys)))
        return fn

    return wrap


def get(kind: str) -> Detector:
    """The detector of `kind` (KeyError lists the known kinds)."""
    try:
        return DETECTORS[kind]
    except KeyError:
        raise KeyError(f"no detector {kind!r}; known: {sorted(DETECTORS)}") from None
