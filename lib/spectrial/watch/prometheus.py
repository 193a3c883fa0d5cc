"""A watch's series from a Prometheus server's history instead of the server's own `/metrics` (issue 42).

Teams that serve with vLLM, SGLang or llama.cpp often have Prometheus scraping them already: `spectrial watch
--prometheus URL --selector 'job="llama"' --since 7d` reads the same counters from Prometheus' HTTP API
(`/api/v1/query_range`, one query for every metric of the engine, step = the interval) in seconds instead of
hours, and hands them to the same arithmetic as a live watch (spectrial.watch.sampler: the engine module's
`watch_totals` reads each step as it reads one `/metrics` read; a counter that goes down is a restart) and the same
change points (spectrial.watch.changes). A step with no sample (a scrape that failed, a server that was down:
Prometheus marks its series stale) is a gap. The metric names stay in the engine modules: a series is one of the
engine's when its name carries the engine's prefix (`llamacpp:`, `vllm:`, `sglang:`), plus
`process_start_time_seconds` (a restart where the engine exports it).

Every read is bounded (spectrial.measure.httpread: a deadline and a size cap). Bad input says what and how to fix it:
a Prometheus that does not answer or is not one, a selector that matches no series of any engine, or the series
of several servers (each named by its `job` and `instance`), a range beyond what Prometheus keeps.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from dataclasses import dataclass

import httpx

from spectrial.errors import ConfigError, ServerMisbehaved
from spectrial.measure.httpread import BoundExceeded, Limits, bounded_client
from spectrial.watch import sampler

MAX_POINTS = 11000  # Prometheus refuses a range query of more points per series; longer ranges are read in pieces
SERVER_LABELS = ("job", "instance")  # what tells one scraped server from another
LIMITS = Limits(deadline_s=120, read_s=60, max_bytes=256 << 20, connect_s=10)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w|y)\s*$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 365 * 86400}


def parse_duration(text: str, parameter: str = "--since") -> float:
    """`90s`, `15m`, `6h`, `7d`, `2w` -> seconds (ConfigError naming `parameter` otherwise)."""
    m = _DURATION.match(text or "")
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"{parameter}: {text!r} is not a duration", parameter=parameter,
                          hint="give a number and a unit: 90s, 15m, 6h, 7d or 2w")
    return float(m.group(1)) * _SECONDS[m.group(2)]


def parse_time(text: str, parameter: str) -> float:
    """An ISO 8601 time (UTC where it names no zone) or Unix seconds -> Unix seconds."""
    t = (text or "").strip()
    try:
        return float(t)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"{parameter}: {text!r} is not a time", parameter=parameter,
                          hint="give an ISO 8601 time (2026-12-06T14:00:00Z) or Unix seconds") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def matchers(selector: str | None) -> str:
    """A selector as the matchers inside `{...}`: `job="llama"`, `{job="llama"}` and '' (every series) alike."""
    s = (selector or "").strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1].strip()
    if "{" in s or "}" in s:
        raise ConfigError(f"--selector: {selector!r} is not a label selector", parameter="selector",
                          hint='give label matchers, e.g. job="vllm",instance="10.0.0.5:8000"')
    return s


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds")


@dataclass
class History:
    """What Prometheus holds for one server over a range, step by step: per step its time and the snapshot (metric
    key -> value, keyed as spectrial.measure.metrics.snapshot keys a `/metrics` read), empty where it has no sample."""

    engine: str
    server: dict[str, str]  # the server's job and instance labels
    times: list[float]
    snapshots: list[dict[str, float]]
    query: str


class Prometheus:
    """A Prometheus server's HTTP API, read with bounded requests."""

    def __init__(self, url: str) -> None:
        u = url.strip().rstrip("/")
        self.url = u if "://" in u else "http://" + u
        self.client = bounded_client(LIMITS)

    def close(self) -> None:
        self.client.close()

    def get(self, path: str, params: dict[str, str]) -> object:
        """One API call's `data` (ConfigError when Prometheus does not answer or refuses the query)."""
        where = f"{self.url}{path}"
        try:
            r = self.client.get(where, params=params)
        except BoundExceeded as exc:
            raise ServerMisbehaved(where, exc.problem, exc.limit) from None
        except httpx.TransportError as exc:
            raise ConfigError(f"--prometheus: {self.url} does not answer ({type(exc).__name__}: {exc})",
                              parameter="prometheus",
                              hint="is Prometheus running there? give its base URL, e.g. http://prometheus:9090") from None
        try:
            body = r.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("status") not in ("success", "error"):  # every API answer has it
            raise ConfigError(f"--prometheus: {where} did not answer as Prometheus' HTTP API does (HTTP {r.status_code}: "
                              f"{r.text[:120]!r})", parameter="prometheus",
                              hint="give the base URL of a Prometheus server (its /api/v1 is under it)")
        if body["status"] != "success":
            raise ConfigError(f"--prometheus: {where} refused the query ({body.get('errorType')}: {body.get('error')})",
                              parameter="prometheus", hint="check the selector's syntax and the time range")
        return body.get("data")

    def retention(self) -> str | None:
        """How long Prometheus keeps samples (its runtime info's `storageRetention`, e.g. "15d"), where it says."""
        try:
            data = self.get("/api/v1/status/runtimeinfo", {})
        except ConfigError:
            return None
        kept = data.get("storageRetention") if isinstance(data, dict) else None
        return str(kept) if kept else None

    def beyond_retention(self, start: float) -> str:
        """Words for a range that starts before what Prometheus keeps ('' where it does not, or cannot tell)."""
        kept = self.retention()
        first = (kept or "").split(" or ")[0].strip()
        try:
            span = parse_duration(first, "retention") if first else None
        except ConfigError:
            span = None
        if span is not None and start < time.time() - span:
            return f"; the range starts before what Prometheus keeps (retention {kept})"
        return ""

    def history(self, selector: str | None, start: float, end: float, step: float, engine: str = "auto") -> History:
        """Every step from `start` to `end` of the one server the selector picks (see the module docstring)."""
        if end <= start:
            raise ConfigError(f"--start/--end: the range ends ({iso(end)}) before it starts ({iso(start)})",
                              parameter="start")
        inner = matchers(selector)
        names = sampler.prefixes() if engine == "auto" else {engine: sampler.prefixes()[sampler.check_engine(engine)]}
        name_re = "|".join(re.escape(p) + ".+" for p in names.values()) + "|process_start_time_seconds"
        query = "{" + ", ".join(x for x in (f'__name__=~"{name_re}"', inner) if x) + "}"
        series = self.series(query, start, end, step)
        servers = {_server(lab) for lab in series if not dict(lab).get("__name__", "").startswith("process_")}
        if not servers:
            beyond = self.beyond_retention(start)
            raise ConfigError(f"--selector: {query} matches no series of {', '.join(names)} from {iso(start)} to "
                              f"{iso(end)} at {self.url}{beyond}", parameter="selector",
                              hint="check the job/instance labels (Prometheus' Targets page lists them) and the range")
        if len(servers) > 1:
            named = "; ".join(", ".join(f'{k}="{v}"' for k, v in srv) for srv in sorted(servers))
            raise ConfigError(f"--selector: {query} matches {len(servers)} servers ({named})", parameter="selector",
                              hint="add their job and instance to --selector, e.g. " + ", ".join(
                                  f'{k}="{v}"' for k, v in sorted(servers)[0]))
        (server,) = servers
        if engine == "auto":
            found = {dict(lab)["__name__"] for lab in series if _server(lab) == server}
            engine = sampler.detect_engine(dict.fromkeys(found, 0.0)) or ""
            if not engine:
                raise ConfigError(f"--selector: the series of {query} carry none of the engines' metrics",
                                  parameter="engine")
        h = History(engine=engine, server=dict(server), times=[], snapshots=[], query=query)
        return self._steps(h, series, start, end, step)

    def more(self, h: History, start: float, end: float, step: float) -> History:
        """The steps from `start` to `end` of the server `h` read (a live watch's next steps; no sample: a gap)."""
        return self._steps(h, self.series(h.query, start, end, step), start, end, step)

    def series(self, query: str, start: float, end: float, step: float
               ) -> dict[tuple[tuple[str, str], ...], dict[float, float]]:
        """`query_range` over [start, end] in pieces of MAX_POINTS steps: labels -> {time: value}."""
        series: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
        at = start
        while at <= end + 1e-9:
            stop = min(end, at + (MAX_POINTS - 1) * step)
            data = self.get("/api/v1/query_range", {"query": query, "start": f"{at:.3f}", "end": f"{stop:.3f}",
                                                     "step": f"{step:g}"})
            for s in (data or {}).get("result", []) if isinstance(data, dict) else []:
                labels = tuple(sorted((s.get("metric") or {}).items()))
                got = series.setdefault(labels, {})
                for t, v in s.get("values") or []:
                    got[round(float(t), 3)] = float(v)
            at = stop + step
        return series

    @staticmethod
    def _steps(h: History, series: dict[tuple[tuple[str, str], ...], dict[float, float]], start: float, end: float,
               step: float) -> History:
        """`h`'s server's series as snapshots at each step of [start, end], keyed as a `/metrics` read keys them
        (its job and instance labels left out); every other server's series left out."""
        prefix = sampler.prefixes()[h.engine]
        server = tuple((k, h.server.get(k, "")) for k in SERVER_LABELS)
        times = [round(start + i * step, 3) for i in range(int(math.floor((end - start) / step + 1e-9)) + 1)]
        snapshots: list[dict[str, float]] = [{} for _ in times]
        index = {t: i for i, t in enumerate(times)}
        for lab, vals in series.items():
            d = dict(lab)
            name = d.pop("__name__", "")
            if _server(lab) != server or not (name.startswith(prefix) or name == "process_start_time_seconds"):
                continue
            for k in SERVER_LABELS:
                d.pop(k, None)
            key = name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(d.items())) + "}" if d else "")
            for t, v in vals.items():
                i = index.get(t)
                if i is not None:
                    snapshots[i][key] = v
        return History(engine=h.engine, server=h.server, times=times, snapshots=snapshots, query=h.query)


def _server(labels: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    d = dict(labels)
    return tuple((k, d.get(k, "")) for k in SERVER_LABELS)


def samples(h: History) -> list[sampler.Sample | None]:
    """Each step as the live watch's read (None: no sample there, a gap); a step without the engine's counters is
    a gap too (the server's series were stale)."""
    read = sampler.totals_reader(h.engine)
    prefix = sampler.prefixes()[h.engine]
    out: list[sampler.Sample | None] = []
    for t, snap in zip(h.times, h.snapshots, strict=True):
        if not any(k.startswith(prefix) for k in snap):
            out.append(None)
            continue
        out.append(sampler.Sample(read(snap), iso(t), t, 0.0))
    return out
