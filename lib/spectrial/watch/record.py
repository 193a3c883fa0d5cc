"""A watch of a live server spectrial did not start: attach, sample `/metrics` every interval, write the record.

The watch never stops, restarts or signals the server: it only reads `/metrics` (and sends requests when asked
to drive load). Per interval a `WatchInterval` (spectrial.watch.sampler); a server that stops answering is a
`WatchGap` (the watch keeps polling and resumes when it answers); a restart is a `reset` interval; change points
of accept length and tok/s (spectrial.watch.changes) are re-found on the whole series after every interval and
once more at the end. The record (kind "watch", controlled False) is rewritten after every interval, with
intervals.csv beside it and, at the end, watch.html (the figure).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import httpx
from pydantic import BaseModel, ConfigDict, Field

from spectrial import progress
from spectrial.errors import ConfigError, ServerMisbehaved
from spectrial.measure import metrics
from spectrial.measure.httpread import METRICS, BoundExceeded, Limits, bounded_client
from spectrial.record.store import RunRecord
from spectrial.schema import WatchChange, WatchGap, WatchInterval, WatchRecord, utc_now
from spectrial.watch import changes, sampler

if TYPE_CHECKING:
    from spectrial.watch.drive import Driver
    from spectrial.watch.push import Pusher

READ_TIMEOUT_S = 5.0  # one /metrics read waits at most this long for a byte, and takes at most the interval in all


class WatchOptions(BaseModel):
    """What `spectrial watch` was asked (recorded as the run's params)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="Base URL of the server, e.g. http://127.0.0.1:8080")
    interval_s: float = Field(10.0, gt=0, description="Seconds between two /metrics reads")
    duration_s: float | None = Field(None, gt=0, description="Stop after this many seconds (None: until Ctrl-C)")
    output_dir: str = Field("outputs", description="Folder of run records")
    engine: str = Field("auto", description="auto (from the metric prefixes), llamacpp, vllm or sglang")
    drive_rate: float | None = Field(None, gt=0, description="Requests/s spectrial sends itself (None: none)")
    params_file: str | None = Field(None, description="Params file whose workload --drive-rate sends")
    run_id: str | None = Field(None, description="Run id (default: generated)")
    selector: str | None = Field(None, description="With a Prometheus `url`: the label matchers of the one server "
                                                   "whose history is read (e.g. job=\"vllm\")")
    start: float | None = Field(None, description="With a Prometheus `url`: the range's start (Unix seconds)")
    end: float | None = Field(None, description="With a Prometheus `url`: the range's end (Unix seconds)")
    follow: bool = Field(False, description="With a Prometheus `url`: after the range, follow its new samples "
                                            "(for `duration_s`, or until interrupted)")
    push_gateway: str | None = Field(None, description="A Prometheus Pushgateway's base URL: the change points are "
                                                       "pushed there as series (spectrial.watch.push), live and at "
                                                       "the end")


def normalise_url(url: str) -> str:
    u = url.strip().rstrip("/")
    if "://" not in u:
        u = "http://" + u
    parsed = urlparse(u)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"URL: {url!r} is not a server address", parameter="url",
                          hint="give the server's base URL, e.g. http://127.0.0.1:8080")
    return u


def attach(client: httpx.Client, url: str, engine: str) -> tuple[str, sampler.Sample, list[str]]:
    """Check the server answers, exports /metrics and which engine it is; the first sample and notes.
    ConfigError naming what is missing and how to turn it on."""
    if engine != "auto":
        sampler.check_engine(engine)
    try:
        r = client.get(f"{url}/metrics")
    except BoundExceeded as exc:
        raise ServerMisbehaved(f"{url}/metrics", exc.problem, exc.limit,
                               hint="the server answers, but not as a metrics endpoint should: check what serves "
                                    "that address (a proxy?), or watch another instance") from None
    except httpx.TransportError as exc:
        raise ConfigError(f"URL: {url} does not answer ({type(exc).__name__}: {exc})", parameter="url",
                          hint="is the server running and listening on that address and port?") from None
    if r.status_code != 200:
        guess = engine if engine != "auto" else sampler.engine_by_header(r.headers.get("server"))
        flags = sampler.metrics_flags()
        how = flags[guess] if guess else "; ".join(f"{k}: {v}" for k, v in flags.items())
        raise ConfigError(f"URL: {url} answers, but has no /metrics (HTTP {r.status_code}: {r.text[:120]!r})",
                          parameter="url", hint=f"turn metrics on: {how}")
    try:
        snap = metrics.snapshot(client, url)
    except BoundExceeded as exc:
        raise ServerMisbehaved(f"{url}/metrics", exc.problem, exc.limit) from None
    found = sampler.detect_engine(snap)
    if engine == "auto":
        if found is None:
            raise ConfigError(f"URL: {url}/metrics carries none of the engines' metrics "
                              f"({', '.join(sampler.prefixes().values())})", parameter="engine",
                              hint=f"give --engine {'|'.join(sampler.prefixes())} if the names are its own")
        engine = found
    sampler.check_engine(engine)
    sample = sampler.read(client, url, engine)
    notes = []
    if not sample.totals.has_spec:
        notes.append(f"the server exports no speculation counters ({engine}: no speculative decoding configured, "
                     "or metrics without them): recording throughput and load only")
    return engine, sample, notes


class Watch:
    """One watch: `run()` samples until the duration is over (or an interrupt); the record is written after every
    interval. Usable step by step: `check()`, `open()`, `step()` (one interval), `finish()`."""

    def __init__(self, opts: WatchOptions, progress_on: bool = True,
                 draw: Callable[[WatchRecord], str] | None = None) -> None:
        # the recorder writes numbers; its command draws (`draw` returns the figure's HTML, written as watch.html)
        self.draw = draw
        self.opts = opts.model_copy(update={"url": normalise_url(opts.url)})
        # a scrape ends within the interval whatever the server does (a slow one is a gap, not a stall), and its
        # body is capped (a /metrics bomb is refused with its size)
        span = min(self.opts.interval_s, METRICS.deadline_s)
        self.client = bounded_client(Limits(deadline_s=span, read_s=min(READ_TIMEOUT_S, span),
                                            max_bytes=METRICS.max_bytes, connect_s=min(READ_TIMEOUT_S, span)))
        self.progress_on = progress_on
        self.record: RunRecord | None = None
        self.watch: WatchRecord | None = None
        self.prev: sampler.Sample | None = None
        self.t0 = time.monotonic()
        self.gap: WatchGap | None = None
        self._reported: set[tuple[str, int]] = set()
        self.driver: Driver | None = None
        self.engine = self.opts.engine
        self.first: sampler.Sample | None = None
        self.notes: list[str] = []
        self.pusher: Pusher | None = None
        if self.opts.push_gateway:
            from spectrial.watch.push import Pusher

            self.pusher = Pusher(self.opts.push_gateway)

    # --- steps ---------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Check the server can be watched (ConfigError naming what is missing and how to turn it on)."""
        if self.opts.drive_rate and self.driver is None:
            from spectrial.watch import drive

            self.driver = drive.Driver(self.opts.url, self.opts.params_file, self.opts.drive_rate)
        if self.pusher is not None:
            self.pusher.check()
        self.engine, self.first, self.notes = attach(self.client, self.opts.url, self.opts.engine)

    def open(self) -> Watch:
        """Open the record (kind watch, controlled False) from the first read."""
        if self.first is None:
            self.check()
        assert self.first is not None
        first, notes = self.first, self.notes
        host = urlparse(self.opts.url)
        self.record = RunRecord(self.opts.output_dir, f"watch-{host.hostname}-{host.port or ''}", kind="watch",
                                run_id=self.opts.run_id, params=self.opts)
        self.record.manifest.controlled = False
        self.record.manifest.status = "running"
        self.watch = WatchRecord(url=self.opts.url, engine=self.engine, interval_s=self.opts.interval_s,
                                 duration_s=self.opts.duration_s, drive_rate=self.opts.drive_rate,
                                 speculation=first.totals.has_spec, detector=changes.METHOD, notes=list(notes))
        self.record.manifest.watch = self.watch
        self.record.manifest.engine.engine = self.engine
        if self.pusher is not None:
            self.pusher.bind(self.record.run_id)
        self.t0 = first.t
        self.prev = first
        self.record.save()
        for n in notes:
            progress.status(f"watch: {n}", self.progress_on)
        return self

    def abandon(self, exc: BaseException) -> None:
        if self.record is not None:
            self.record.abandon(exc)

    def step(self) -> WatchInterval | None:
        """Read once; an interval when the server answered, None inside a gap."""
        assert self.watch is not None and self.prev is not None
        try:
            cur = sampler.read(self.client, self.opts.url, self.watch.engine)
        except (httpx.TransportError, sampler.NoMetrics, ServerMisbehaved) as exc:  # a gap: the schedule goes on
            self._in_gap(str(exc) if isinstance(exc, sampler.NoMetrics | ServerMisbehaved)
                         else f"{type(exc).__name__}: {exc}")
            return None
        return self.take(cur)

    def take(self, cur: sampler.Sample, live: bool = True) -> WatchInterval:
        """The interval from the last read to `cur` (`live`: print it and look for changes at once)."""
        assert self.watch is not None and self.prev is not None
        after_gap = self.gap is not None
        if self.gap is not None:
            self.gap.end, self.gap.end_s = cur.at, round(cur.t - self.t0, 3)
            self._line(f"server answers again after {self.gap.end_s - self.gap.start_s:.1f} s")
            self.gap = None
        iv = sampler.measure(len(self.watch.intervals), self.prev, cur, self.t0, after_gap=after_gap)
        self.prev = cur
        self.watch.intervals.append(iv)
        if iv.reset:
            self.watch.resets += 1
        if live:
            self._line(interval_line(iv))
            self.detect(live=True)
        return iv

    def _in_gap(self, error: str, at: str | None = None, t: float | None = None, say: bool | None = None) -> None:
        """A failed read (now, or at `at` / `t`: a step of a history without a sample; `say`: print it, by default
        for a live read only)."""
        assert self.watch is not None
        now = time.monotonic() if t is None else t
        if self.gap is None:
            self.gap = WatchGap(start=at or utc_now(), start_s=round(now - self.t0, 3), error=error[:500])
            self.watch.gaps.append(self.gap)
            if say if say is not None else t is None:
                self._line(f"server not answering: {error[:200]} (still polling; the server is not touched)")
        else:
            self.gap.polls += 1

    def detect(self, live: bool = False) -> list[WatchChange]:
        """Change points of accept length and tok/s over the intervals with work (the whole series so far); `live`:
        new ones are pushed at once (--push-gateway)."""
        assert self.watch is not None
        found: list[WatchChange] = []
        for series, count, per in (("accept_len", "accepted", "verify_steps"), ("tok_s", "tokens", "wall_s")):
            pts = [iv for iv in self.watch.intervals if getattr(iv, series) is not None and (iv.tokens or 0) > 0]
            step = changes.resolution([getattr(iv, count) for iv in pts], [getattr(iv, per) for iv in pts])
            for c in changes.find_changes([getattr(iv, series) for iv in pts], step):
                iv = pts[c.index]
                found.append(WatchChange(series=series, index=iv.index, at=iv.start, at_s=iv.start_s,  # type: ignore[arg-type]
                                         before_mean=c.before_mean, after_mean=c.after_mean,
                                         relative_change=c.relative_change))
        self.watch.changes = found
        new = False
        for c in found:
            if (c.series, c.index) not in self._reported:
                self._reported.add((c.series, c.index))
                self._line(change_line(c))
                new = True
        if new and live:
            self.push()
        return found

    def push(self, force: bool = False) -> None:
        """The change points to the Pushgateway (with --push-gateway); a failure is a note and a line, once."""
        if self.pusher is None or self.watch is None:
            return
        problem = self.pusher.push(self.watch, force=force)
        if problem and problem not in self.watch.notes:
            self.watch.notes.append(problem)
            self._line(problem + " (the watch goes on; the record keeps them)")

    def save(self) -> None:
        assert self.record is not None and self.watch is not None
        reads = [iv.read_ms for iv in self.watch.intervals if iv.read_ms is not None]
        self.watch.read_ms_median = round(statistics.median(reads), 3) if reads else None
        self.record.write_table("intervals.csv", self.watch.intervals)
        self.record.save()

    def finish(self, status: str | None = "ok", reason: str | None = None) -> None:
        """Final detection, notes, intervals.csv and the figure; `status` None leaves the status to the caller."""
        assert self.record is not None and self.watch is not None
        self.detect()
        self.push(force=True)
        w = self.watch
        work = [iv for iv in w.intervals if (iv.tokens or 0) > 0]
        if w.speculation and work and not any(iv.verify_steps for iv in work):
            w.notes.append(f"no verify steps in {len(work)} interval(s) with generated tokens: speculative decoding "
                           "seems off on this server (no draft configured)")
        if self.driver is not None:
            w.notes.append(self.driver.summary())
        self.save()
        if self.draw is not None:
            try:
                self.record.write_text("watch.html", self.draw(w))
            except ImportError as exc:  # plotly missing: the record stands without its figure
                w.notes.append(f"figure not written: {exc}")
        if self.pusher is not None:
            self.pusher.close()
        if status is not None:
            self.record.finish(status, reason)

    # --- the loop --------------------------------------------------------------------------------------------
    def run(self) -> RunRecord:
        """attach, then one step per interval until the duration is over; an interrupt writes what was measured
        (the caller's guard marks the record failed and why)."""
        if self.record is None:
            self.open()
        assert self.record is not None
        if self.driver is not None:
            self.driver.start()
        total = int(self.opts.duration_s // self.opts.interval_s) if self.opts.duration_s else None
        self.bar = progress.Progress(f"watch {self.opts.url}", total=total, unit="interval",
                                     enabled=self.progress_on and progress.mode() == "bar")
        deadline = self.t0 + self.opts.duration_s if self.opts.duration_s else None
        nxt = self.t0 + self.opts.interval_s
        try:
            while deadline is None or nxt <= deadline + 1e-6:
                time.sleep(max(0.0, nxt - time.monotonic()))
                nxt = max(nxt + self.opts.interval_s, time.monotonic())
                self.step()
                self.bar.update(1)
                self.save()
        except KeyboardInterrupt:
            self._stop_driver()
            self.finish(status=None)
            raise
        finally:
            self.bar.close()
            self.client.close()
        self._stop_driver()
        self.finish("ok", f"gaps: {len(self.watch.gaps)}, resets: {self.watch.resets}" if self.watch and
                    (self.watch.gaps or self.watch.resets) else None)
        return self.record

    def _stop_driver(self) -> None:
        if self.driver is not None:
            self.driver.stop()

    def _line(self, text: str) -> None:
        """A line per interval (and per gap, change) where output is not a terminal; the bar's text in one."""
        if not self.progress_on:
            return
        bar = getattr(self, "bar", None)
        if bar is not None and bar.mode == "bar":
            bar.set_postfix_str(text)
        elif progress.mode() != "off":
            print(f"[spectrial] watch: {text}", file=sys.stdout, flush=True)


class HistoryWatch(Watch):
    """A watch of a server's history in Prometheus (spectrial.watch.prometheus): the same intervals, gaps, resets,
    change points and record as a live watch, from `query_range` steps of `interval_s` over [start, end]; the
    server is not contacted at all."""

    def check(self) -> None:
        from spectrial.watch import prometheus

        assert self.opts.start is not None and self.opts.end is not None
        if self.pusher is not None:
            self.pusher.check()
        prom = prometheus.Prometheus(self.opts.url)
        try:
            self.history = prom.history(self.opts.selector, self.opts.start, self.opts.end, self.opts.interval_s,
                                        self.opts.engine)
        finally:
            prom.close()
        self.steps = prometheus.samples(self.history)
        first = next((i for i, s in enumerate(self.steps) if s is not None), None)
        if first is None:
            raise ConfigError(f"--selector: {self.history.query} has no sample of {self.history.engine}'s counters "
                              "in the range", parameter="selector")
        self.engine, self.first = self.history.engine, self.steps[first]
        self.steps = self.steps[first + 1:]
        self.times = self.history.times[first + 1:]
        server = ", ".join(f'{k}="{v}"' for k, v in self.history.server.items())
        self.notes = [f"read from Prometheus {self.opts.url} ({server}; {self.history.query}), steps of "
                      f"{self.opts.interval_s:g} s from {self.first.at} to "
                      f"{prometheus.iso(self.history.times[-1])}: the server was not contacted"]
        if not self.first.totals.has_spec:
            self.notes.append(f"the series carry no speculation counters ({self.engine}): throughput and load only")
        if first > 1:
            self.notes.append(f"no sample before {self.first.at} ({first} step(s) of the range: the server was not "
                              "scraped yet, or Prometheus no longer keeps them)")

    def run(self) -> RunRecord:
        """Every step of the history, then the change points once."""

        if self.record is None:
            self.open()
        assert self.record is not None and self.watch is not None
        self.watch.source, self.watch.selector = "prometheus", self.history.query
        for t, s in zip(self.times, self.steps, strict=True):
            self._history_step(t, s, live=False)
        self.watch.duration_s = round(self.history.times[-1] - self.t0, 3)
        if self.opts.follow:
            try:
                self._follow()
            except KeyboardInterrupt:
                self.finish(status=None)
                raise
        self.finish("ok", f"gaps: {len(self.watch.gaps)}, resets: {self.watch.resets}" if self.watch.gaps or
                    self.watch.resets else None)
        return self.record

    def _history_step(self, t: float, s: sampler.Sample | None, live: bool) -> None:
        from spectrial.watch import prometheus

        if s is None:
            self._in_gap("no sample in Prometheus (a failed scrape, or the server was down)", prometheus.iso(t), t,
                         say=live)
        else:
            self.take(s, live=live)

    def _follow(self) -> None:
        """Prometheus' new steps as they come, one interval behind (its last scrape may not be in yet), each as a
        live watch takes a read; for `duration_s` or until interrupted."""
        from spectrial.watch import prometheus

        assert self.watch is not None
        step = self.opts.interval_s
        last = self.history.times[-1]
        stop_at = time.monotonic() + self.opts.duration_s if self.opts.duration_s else None
        prom = prometheus.Prometheus(self.opts.url)
        self._line(f"following {self.history.query} from {prometheus.iso(last)} every {step:g} s")
        try:
            while stop_at is None or time.monotonic() < stop_at:
                time.sleep(step if stop_at is None else max(0.0, min(step, stop_at - time.monotonic())))
                now = time.time() - step
                if now < last + step:
                    continue
                piece = prom.more(self.history, last + step, now, step)
                for t, s in zip(piece.times, prometheus.samples(piece), strict=True):
                    self._history_step(t, s, live=True)
                last = piece.times[-1]
                self.watch.duration_s = round(last - self.t0, 3)
                self.save()
        finally:
            prom.close()


def _f(x: float | None, nd: int) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def interval_line(iv: WatchInterval) -> str:
    flag = " RESET (server restarted: counts unknown)" if iv.reset else " after a gap (counts unknown)" \
        if iv.after_gap else ""
    return (f"#{iv.index} {iv.end[11:19]} accept {_f(iv.accept_len, 3)} tok/s {_f(iv.tok_s, 1)} "
            f"drafted {_f(iv.drafted, 0)} accepted {_f(iv.accepted, 0)} steps {_f(iv.verify_steps, 0)} "
            f"running {_f(iv.requests_running, 0)} waiting {_f(iv.requests_waiting, 0)}{flag}")


def change_line(c: WatchChange) -> str:
    return (f"change in {c.series} at interval {c.index} ({c.at[11:19]}): {c.before_mean:.3g} -> "
            f"{c.after_mean:.3g} ({c.relative_change:+.1%})")
