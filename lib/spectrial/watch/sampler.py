"""Reading a live server's `/metrics` for a watch, and the arithmetic of one interval (pure).

`read` takes one snapshot (spectrial.measure.metrics, prometheus_client's parser) and hands it to the engine module's
`watch_totals` (the counter names live there; the module is imported by name, as `engines.base.get_engine`
imports the adapters); `measure` subtracts two such totals into a `WatchInterval`:
a counter that went down or a changed process start time is a restart (`reset`: the interval's counts are
unknown, never negative), and an interval that spans a time the server did not answer is marked `after_gap`
with its counts unknown (a restart may hide in it; llama-server exports no start time).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from spectrial.engines.base import BUILTINS, engine_classes
from spectrial.errors import ConfigError
from spectrial.measure import metrics
from spectrial.schema import CounterTotals, WatchInterval, utc_now


def prefixes() -> dict[str, str]:
    """engine -> its metrics' name prefix (each adapter's `metric_prefix`)."""
    return {cls.name: cls.metric_prefix for cls in engine_classes() if cls.metric_prefix}


def metrics_flags() -> dict[str, str]:
    """engine -> how to turn its /metrics on (each adapter's `metrics_flag`)."""
    return {cls.name: cls.metrics_flag for cls in engine_classes()}


def engine_by_header(server: str | None) -> str | None:
    """The engine whose HTTP `server` header this is (None: no adapter claims it)."""
    return next((cls.name for cls in engine_classes() if server and cls.server_header == server), None)
COUNTERS = ("verify_steps", "drafted", "accepted", "tokens")


class NoMetrics(Exception):
    """The server answered, but `/metrics` gave no samples (HTTP status not 200: metrics off, or loading)."""


@dataclass(frozen=True)
class Sample:
    """One read: the totals, when (UTC and monotonic, at the end of the read) and how long the read took."""

    totals: CounterTotals
    at: str
    t: float
    read_ms: float


def detect_engine(snap: dict[str, float]) -> str | None:
    """The engine whose metric prefix the snapshot carries (None: none of them)."""
    for name, prefix in prefixes().items():
        if any(k.startswith(prefix) for k in snap):
            return name
    return None


def totals_reader(engine: str) -> Callable[[dict[str, float]], CounterTotals]:
    """The engine module's `watch_totals` (imported by name, as `engines.base.get_engine` imports adapters)."""
    return importlib.import_module(BUILTINS[check_engine(engine)]).watch_totals  # type: ignore[no-any-return]


def read(client: httpx.Client, base_url: str, engine: str) -> Sample:
    """One `/metrics` read into the engine's totals; httpx.TransportError when the server does not answer,
    NoMetrics when it answers without metrics."""
    t0 = time.perf_counter()
    snap = metrics.snapshot(client, base_url)
    ms = (time.perf_counter() - t0) * 1000
    if not snap:
        raise NoMetrics(f"{base_url}/metrics answered without metrics (not HTTP 200: metrics off, or the server is "
                        "loading)")
    return Sample(totals_reader(engine)(snap), utc_now(), time.monotonic(), ms)


def check_engine(engine: str) -> str:
    known = prefixes()
    if engine not in known:
        raise ConfigError(f"--engine: {engine!r} is not one of auto, {', '.join(known)}", parameter="engine")
    return engine


def restarted(prev: CounterTotals, cur: CounterTotals) -> bool:
    """A counter went down (per position too) or the process start time changed: the server restarted."""
    if prev.start_time_s is not None and cur.start_time_s is not None and abs(cur.start_time_s - prev.start_time_s) > 1e-6:
        return True
    for name in COUNTERS:
        a, b = getattr(prev, name), getattr(cur, name)
        if a is not None and b is not None and b < a:
            return True
    return any(cur.accepted_per_pos.get(k, 0.0) < v for k, v in prev.accepted_per_pos.items())


def _delta(prev: CounterTotals, cur: CounterTotals, name: str) -> float | None:
    a, b = getattr(prev, name), getattr(cur, name)
    return None if b is None else b - (a or 0.0)


def measure(index: int, prev: Sample, cur: Sample, t0: float, after_gap: bool = False) -> WatchInterval:
    """The interval between two reads (see the module docstring); gauges are those of the closing read."""
    wall = cur.t - prev.t
    iv = WatchInterval(index=index, start=prev.at, end=cur.at, start_s=round(prev.t - t0, 3),
                       end_s=round(cur.t - t0, 3), wall_s=round(wall, 4), reset=restarted(prev.totals, cur.totals),
                       after_gap=after_gap, requests_running=cur.totals.requests_running,
                       requests_waiting=cur.totals.requests_waiting, read_ms=round(cur.read_ms, 3))
    if iv.reset or after_gap:
        return iv
    for name in COUNTERS:
        setattr(iv, name, _delta(prev.totals, cur.totals, name))
    if iv.verify_steps and iv.accepted is not None:
        iv.accept_len = 1.0 + iv.accepted / iv.verify_steps
        per = {k: v - prev.totals.accepted_per_pos.get(k, 0.0) for k, v in cur.totals.accepted_per_pos.items()}
        iv.per_position = [per[k] / iv.verify_steps for k in sorted(per, key=int)]
    if iv.tokens is not None and wall > 0:
        iv.tok_s = iv.tokens / wall
    return iv
