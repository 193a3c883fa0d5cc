"""Observe-only trials: a server spectrial did not start (and may not restart), measured as it is.

    spectrial observe http://10.0.0.5:8080 [-p max_tokens=128] [--params FILE]

    identify   the URL answers -> which engine, version, model, speculative method and settings the server
               reports (llama.cpp /props + /slots, vLLM /version + /v1/models, SGLang /server_info) -> /metrics
               is on (refused, naming the engine's flag, when it is not)
    one arm    warm-up -> one measurement window with the server's counters before and after (the engine
               adapter's snapshot and `window_stats`, with an empty server log: spectrial cannot read the log of a
               server it did not start) -> the arm's figures by `spectrial.analysis.figures`, as a trial's arm gets them

Nothing is started, stopped, restarted or signalled: no kill step, no "GPUs free" check, no environment check
inside processes spectrial did not start. The record (kind "observe", `controlled` False) has one arm and no
baseline: the arm's speed-up, verdict and break-even stay empty and say why (`schema.NO_BASELINE`); the host it
records is the client's (the machine spectrial ran on), not the server's; the server's own load from other users
moves the same counters, and the record says when it saw some. `ObserveSource` is a `session.StartSource`, so
the schedules that take starts from a source can drive it too; `Observe` is the one-arm run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx

from spectrial import interrupts
from spectrial.analysis.figures import arm_figures, median, merge_stats, window_rates, with_figures
from spectrial.analysis.validity import Setting
from spectrial.engines.base import Engine, ServerProbe, Window, engine_class, engine_classes, get_engine
from spectrial.errors import ConfigError, RunFailed, ServerError, ServerMisbehaved, SpectrialError
from spectrial.hosts.connect import get_host
from spectrial.hosts.fingerprint import host_fingerprint
from spectrial.logs.api import ServerLog
from spectrial.measure.bench import run_requests, server_broke, stream_limits
from spectrial.measure.httpread import BoundExceeded, bounded_client, metrics_limits, probe_limits
from spectrial.measure.workloads import WorkItem, Workload, build_workload, estimate_lengths
from spectrial.params import Arm, TrialParams, load_params, read_params_yaml
from spectrial.protocol.session import (
    MeasuredStart,
    MeasuredWindow,
    WindowPlan,
    start_outcome,
    validity_setting,
)
from spectrial.record.store import RunRecord, RunResult, opened
from spectrial.schema import (
    ArmRecord,
    EngineInfo,
    HostInfo,
    ObservedServer,
    RequestRecord,
    ServerInfo,
    StartRecord,
    StartSummary,
    WindowRecord,
    WindowStats,
)
from spectrial.servers.lifecycle import LaunchSpec, Probe

ONE_ARM = "observe measures the server as it is: one arm"
# --- identify: what the server says it is ------------------------------------------------------------------
def _unreachable(url: str, exc: Exception) -> ServerError:
    return ServerError(f"observe.url: {url} does not answer ({type(exc).__name__}: {exc})", phase="ready", name=url,
                       hint="check that the server is running and listening on that address and port (curl "
                            f"{url}/health), that this machine can reach it (firewall, SSH tunnel), and the "
                            "scheme (http or https)")


def identify(params: TrialParams) -> ObservedServer:
    """What the server at `params.observe.url` reports: engine, version, model, speculative method and settings,
    slots, each with how it was found. Refuses (ServerError / ConfigError, naming what to check or the flag to
    turn on) a URL that does not answer, an engine it cannot tell, a server without /metrics, a server that says
    it does not speculate. Reads only; sends no generation request."""
    assert params.observe is not None
    url = params.observe.url
    timeout = params.observe.probe_timeout_s
    with bounded_client(probe_limits(params.limits, timeout), verify=True) as client:
        pr = ServerProbe(url, client)
        try:
            code, body = pr.get("/health")
        except BoundExceeded as exc:
            raise ServerMisbehaved(f"{url}/health", exc.problem, exc.limit) from None
        except httpx.HTTPError as exc:
            raise _unreachable(url, exc) from None
        if code == 503:
            raise ServerError(f"observe.url: {url}/health answers 503 ({str(body)[:120]}): the server is still "
                              "loading", phase="ready", name=url, hint="wait until /health answers 200, then retry")
        try:
            obs = _identify_engine(params, pr)
            _check_metrics(obs, pr)
        except BoundExceeded as exc:
            raise ServerMisbehaved(exc.what.split(" ", 1)[-1], exc.problem, exc.limit) from None
        except httpx.HTTPError as exc:
            raise _unreachable(url, exc) from None
    if obs.speculative is False:
        cls = engine_class(obs.engine or "")
        raise ConfigError(f"observe.url: the {cls.label} server at {url} does not speculate "
                          f"({obs.found.get('speculative', '')}): observe measures speculative decoding",
                          parameter="observe.url", hint=cls.speculation_hint)
    return obs


def _identify_engine(params: TrialParams, pr: ServerProbe) -> ObservedServer:
    """Which engine answers (the one the params name, when they name one; each adapter's `identify` reads its own
    endpoints), and what it reports."""
    obs = ObservedServer(url=pr.url, host_note=_host_note(pr.url))
    named = params.engine if "engine" in params.model_fields_set else None
    classes = engine_classes()
    for cls in classes:
        if named not in (None, cls.name):
            continue
        if cls.identify(pr, obs):
            obs.engine = cls.name
            obs.found.setdefault("engine", f"{cls.label} answered ({obs.found.pop('_how', '')})")
            if named:
                obs.found["engine"] = f"the params' engine ({named}); {obs.found['engine']}"
            return obs
    asked = ", ".join(f"GET {p} -> {c}" for p, (c, _) in pr.answers.items())
    labels = [c.label for c in classes]
    what = f"a {engine_class(named).label} server" if named else ", ".join(labels[:-1]) + " or " + labels[-1]
    raise ConfigError(f"observe.url: the server at {pr.url} does not answer like {what} ({asked})",
                      parameter="observe.url", hint="check the URL (the server's base URL, no path); name the engine "
                                                    f"with -p engine={'|'.join(c.name for c in classes)}")


def _check_metrics(obs: ObservedServer, pr: ServerProbe) -> None:
    """/metrics must answer with the engine's counters (they scope the window); what they say of speculation goes
    to the adapter (`observed_metrics`: vLLM exports its speculation counters only with a speculative config)."""
    code, body = pr.get("/metrics")
    cls = engine_class(obs.engine or "")
    if code != 200 or not isinstance(body, str) or not body.strip():
        raise ConfigError(f"observe.url: the {cls.label} server at {obs.url} has no /metrics (GET "
                          f"/metrics -> {code}): spectrial scopes accept length and acceptance to its measurement "
                          "window with the server's own counters", parameter="observe.url",
                          hint=f"the server must run with metrics on ({cls.metrics_flag}); observe never "
                               "restarts a server, so ask whoever runs it to add the flag at its next restart")
    obs.found["metrics"] = "GET /metrics -> 200"
    cls.observed_metrics(body, obs)


def _host_note(url: str) -> str:
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    local = host in ("127.0.0.1", "localhost", "::1", socket.gethostname())
    return ("the recorded host (fingerprint, GPUs) is the machine spectrial ran on, the client; it is not the "
            "server's" + (" (the server answered on a local address, which may still be a tunnel to another "
                          "machine)" if local else f": the server at {host} may be remote"))


# --- the source: one start that is no start ----------------------------------------------------------------
class ObserveSource:
    """A `StartSource` over a running server spectrial did not start: `open` records what the server is (and
    the client's host), `start` measures one window of an arm on it as it is (nothing launched or stopped)."""

    def __init__(self, params: TrialParams, record: RunRecord, observed: ObservedServer,
                 progress: bool = True) -> None:
        assert params.observe is not None and observed.engine is not None
        self.params, self.record, self.observed, self.progress = params, record, observed, progress
        self.url = observed.url
        self.host = get_host("local")  # the client: this machine
        data = params.model_dump(mode="json")
        data["engine"] = observed.engine
        # what an adapter needs to read a server it did not start (SGLang's: metrics on, checked by identify)
        data["engine_config"] = {**data.get("engine_config", {}), **engine_class(observed.engine).observe_config}
        self.eparams = TrialParams.model_validate(data)
        self.engine: Engine = get_engine(observed.engine, self.eparams, self.host)
        self.workload: Workload | None = None
        self.prompts: list[WorkItem] = []
        self.fp_key = ""
        self._t0 = time.monotonic()
        self.opened = False

    def open(self) -> None:
        if self.opened:
            return
        m, o = self.record.manifest, self.observed
        with self.record.step("identify"):
            m.observed = o
            m.engine = EngineInfo(name=o.engine, engine=o.engine, version=o.version)
            m.host = HostInfo(name=self.host.name, checks=[o.host_note])
            try:
                m.host.fingerprint = host_fingerprint(self.host)
            except SpectrialError as exc:  # the client's fingerprint is context, never the run's cause of failure
                m.host.checks.append(f"client fingerprint not taken: {exc}")
            ident = {"observed": {"url": o.url, "engine": o.engine, "version": o.version, "model": o.model}}
            self.fp_key = m.fingerprint_key = "observe-" + hashlib.sha256(
                json.dumps(ident, sort_keys=True).encode()).hexdigest()[:12]
        with self.record.step("workload"):
            self._workload()
        self.opened = True

    def _workload(self) -> None:
        """The trial's workload, counted by the server's own tokenizer where the engine can (llama.cpp /tokenize),
        else estimated."""
        p, engine = self.eparams, self.engine
        chat = p.request_format == "chat"
        lengths, unit = None, ""
        if not engine.counts_on_server:
            lengths, unit = estimate_lengths(chat), "estimated tokens (UTF-8 bytes / 3: no tokenizer of the target)"
        note = "the server's own (observed as it is)" if chat else None
        wl = build_workload(p, lengths=lengths, unit=unit, context=self.observed.context_tokens, chat_template=note)
        if not wl.ready:
            counter = engine.server_lengths(self.url, chat)
            assert counter is not None
            wl.finalize(counter, f"tokens counted by the observed server ({self.url}/tokenize)")
        wl.description.endpoint = engine.request_target(p.request_format)[0]
        self.workload, self.prompts = wl, wl.items
        self.record.manifest.workload = wl.description

    def start(self, arm: Arm, restart: int, windows: list[WindowPlan], phase: str | None = None) -> MeasuredStart:
        """Warm-up, then each window with the server's counters before and after; the start record says it was
        not a start (no launch, ready, env_check or stop) and is failed and why on any exception."""
        self.open()
        rec, p, engine = self.record, self.eparams, self.engine
        entry = StartRecord(arm=arm.name, restart=restart, order=len(rec.manifest.starts), phase=phase,
                            fingerprint_key=self.fp_key, server=ServerInfo(url=self.url))
        entry.notes.append("observed, not started: spectrial did not launch, signal or stop this server "
                           "(no launch, ready, env_check or stop step)")
        entry.notes.append(f"env_check: {self.observed.env_check}")
        rec.manifest.starts.append(entry)
        t0 = time.monotonic()
        measured: list[MeasuredWindow] = []
        path, payload = engine.request_target(p.request_format)
        common: dict[str, Any] = {"max_tokens": p.max_tokens, "payload": payload, "stats_fn": engine.request_stats,
                                  "path": path, "timeout_s": p.request_timeout_s, "progress": self.progress,
                                  "output_len": p.output_len, "limits": stream_limits(p)}
        try:
            if p.warmup:
                with rec.step(f"warmup:{arm.name}", arm=arm.name):
                    warm = run_requests(self.url, self.prompts, n=p.warmup, phase="warmup", concurrency=1,
                                        seed=p.seed + 1000 + restart, label=arm.name, **common)
                    for why in filter(None, map(server_broke, warm)):  # not measured: the run fails, and why
                        raise ServerMisbehaved(f"{self.url}{path} (warm-up)", why)
            with rec.step(f"benchmark:{arm.name}", arm=arm.name):
                for w in windows:
                    measured.append(self._window(arm, restart, entry, w, common))
            entry.status, entry.reason = start_outcome([r for m in measured for r in m.requests])
        except BaseException as exc:
            entry.status, entry.reason = "failed", interrupts.describe(exc)
            entry.notes.append("the server was left as it was: observe never signals it")
            raise
        finally:
            entry.windows = [m.record for m in measured]
            entry.tok_s = median(r.tok_s for m in measured for r in m.requests if r.ok)
            entry.elapsed_s = round(time.monotonic() - t0, 3)
            rec.save()
        return MeasuredStart(entry, measured)

    def _window(self, arm: Arm, restart: int, entry: StartRecord, w: WindowPlan, common: dict[str, Any]
                ) -> MeasuredWindow:
        engine = self.engine
        tags = {"arm": arm.name, "restart": restart, "start": entry.order, "concurrency": w.concurrency}
        with bounded_client(metrics_limits(self.params.limits)) as client:
            around = ((lambda c=client: engine.snapshot(c, self.url)), engine.request_counter_stats) \
                if engine.per_request_counters else None
            before = engine.snapshot(client, self.url)
            requests = run_requests(self.url, self.prompts, n=w.requests, concurrency=w.concurrency, seed=w.seed,
                                    tags=tags, label=arm.name, counters=around, **common)
            after = engine.snapshot(client, self.url)
        spec = LaunchSpec(argv=[], env={}, port=0, probe=_no_probe, name="observed")
        win = Window(arm=arm, spec=spec, before=before, after=after, requests=requests, log=ServerLog(""),
                     first_line=1, last_line=0)
        try:
            stats = engine.window_stats(win)
        except Exception as exc:  # noqa: BLE001 - statistics of a broken window must not hide its requests
            stats = WindowStats(scoped=False, source="none", notes=[f"window statistics failed: {exc}"])
        stats.notes.append("the server's counters: requests of other users in the window count too")
        ok = [r for r in requests if r.ok]
        ours = sum(r.tokens or 0 for r in ok)
        if stats.tokens is not None and stats.tokens > ours * 1.02 + 2:
            seen = (f"window at concurrency {w.concurrency}: the server generated {stats.tokens:.0f} tokens, "
                    f"spectrial's requests {ours}: other load shared the server and its counters")
            self.observed.other_load.append(seen)
            stats.notes.append(seen)
        for r, rate in zip(requests, window_rates(requests), strict=True):
            r.tok_s = rate
        record = WindowRecord(concurrency=w.concurrency, requests=len(requests), requests_ok=len(ok),
                              tok_s=median(r.tok_s for r in ok), counters=stats.counters(),
                              per_position=stats.per_position, accept_len=stats.accept_len, stats_source=stats.source,
                              stats_scoped=stats.scoped, stats_notes=list(stats.notes),
                              cross_checks=stats.cross_checks)
        return MeasuredWindow(w, record, requests, stats)

    def refresh_method(self) -> None:
        """What the server says only after it served a request (llama.cpp: the method a slot runs), read again."""
        if self.observed.method is not None:
            return
        with bounded_client(probe_limits(self.params.limits, self.params.observe.probe_timeout_s if self.params.observe
                                                     else None)) as client:
            engine_class(self.observed.engine or "").refresh_observed(ServerProbe(self.url, client), self.observed)

    def elapsed_s(self) -> float:
        return time.monotonic() - self._t0

    def moved(self, start: StartRecord) -> str | None:
        return None  # the server's machine is not visible from here

    def setting(self, concurrency: int | None = None, rate: float | None = None) -> Setting:
        s = validity_setting(self.eparams, None, concurrency, rate)
        if self.observed.slots is None:
            return s
        return dataclasses.replace(s, slots=self.observed.slots, slots_setting="the server's own slots (observed)")

    def close(self) -> None:
        self.host.close()


def _no_probe(client: httpx.Client, base_url: str) -> Probe:
    return Probe(True, "observed: not launched by spectrial")


# --- the run -----------------------------------------------------------------------------------------------
class ObserveResult(RunResult):
    """What an observe-only run produced: its folder, its manifest (one arm, no baseline), its requests."""


class Observe:
    """An observe-only run: its record (kind "observe", controlled False) and source; `run()` measures the arm."""

    def __init__(self, params: TrialParams, observed: ObservedServer, *, run_id: str | None = None,
                 progress: bool = True) -> None:
        self.params = params
        self.record = RunRecord(params.output_dir, params.name if "name" in params.model_fields_set else "observe",
                                kind="observe", run_id=run_id, params=params)
        self.record.manifest.controlled = False
        self.record.manifest.observed = observed
        self.record.save()
        try:
            self.source = ObserveSource(params, self.record, observed, progress)
        except BaseException as exc:
            self.record.finish("failed", interrupts.describe(exc), best_effort=True)
            raise
        self.arm = observe_arm(params, observed)
        self.measured: MeasuredStart | None = None

    @property
    def observed(self) -> ObservedServer:
        return self.source.observed

    def run(self, raise_on_failure: bool = True) -> ObserveResult:
        try:
            self._run()
        except BaseException as exc:  # a Ctrl-C / SIGTERM lands anywhere: never left "running"
            self.abandon(exc)
            raise
        finally:
            self.source.close()
        m = self.record.manifest
        if m.status != "ok" and raise_on_failure:
            raise RunFailed(f"observe {self.record.run_id} failed (record: {self.record.dir}):\n{m.reason}",
                            self.result())
        return self.result()

    def _run(self) -> None:
        p, m = self.params, self.record.manifest
        m.arms = [ArmRecord(name=self.arm.name, method=self.arm.method, status="running",
                            steps=self.observed.steps, notes=[self.observed.comparison])]
        self.source.open()
        plan = WindowPlan(p.concurrency, p.repeats, p.seed)
        # llama.cpp says the method only after a slot served a request: measure first when it is not known yet
        self.measured = self.source.start(self.arm, 0, [plan])
        self.source.refresh_method()
        self._settle_method()
        self._summarise()

    def _settle_method(self) -> None:
        """The arm's method: the server's where it says, else the params' single arm; a server that says
        nothing and params that give no method leave the run failed, saying how to give it."""
        o, a = self.observed, self.record.manifest.arms[0]
        given = "arms" in self.params.model_fields_set
        if o.method is not None:
            if given and self.arm.method != o.method:
                a.notes.append(f"the params' arm says method {self.arm.method}; the server says {o.method} "
                               f"({o.found.get('method')}): the server's is recorded")
            a.method = o.method
        elif given:
            a.method = o.method = self.arm.method
            o.found["method"] = "the params' single arm (the server does not say)"
        else:
            raise ConfigError(f"arms: the server at {o.url} does not say which speculative method it runs; give it "
                              "as the params' single arm, e.g. -p 'arms=[{name: observed, method: draft, steps: 2}]'",
                              parameter="arms")
        if o.steps is None and given and (self.arm.steps or "steps" in self.params.model_fields_set):
            o.steps = self.params.arm_steps(self.arm)
            o.found["steps"] = "the params (the server does not say)"
        a.steps = o.steps
        self.arm = self.arm.model_copy(update={"method": a.method})

    def _summarise(self) -> None:
        from spectrial.analysis.serving import write_requests

        p, rec, m = self.params, self.record, self.record.manifest
        ms = self.measured
        a = m.arms[0]
        if ms is None:
            return
        reqs = [r for w in ms.windows for r in w.requests]
        a.starts = [StartSummary(restart=0, order=ms.record.order, status=ms.record.status, tok_s=ms.record.tok_s,
                                 reason=ms.record.reason)]
        with rec.step("figures"):
            stats = merge_stats([w.stats for w in ms.windows])
            figs = arm_figures(reqs, stats, self.arm.speculative, p.confidence, p.seed, k=a.steps,
                               concurrency=p.concurrency, slo=p.slo.limits(), setting=self.source.setting())
            a = with_figures(a, figs)
            a.status = "ok" if ms.record.status == "ok" and a.tok_s else "failed"
            a.reason = None if a.status == "ok" else (ms.record.reason or "no successful request")
            m.arms = [a]
        write_requests(rec, reqs, {a.name: a.accept_len})
        problems = [] if a.status == "ok" else [f"arm {a.name}: {a.reason}"]
        if (bad := [r for r in reqs if not r.ok]):
            problems.append(f"arm {a.name}: {len(bad)} of {len(reqs)} measured requests failed "
                            f"(first: {str(bad[0].error)[:160]})")
        rec.finish("failed" if problems else "ok", "\n".join(problems) or None)

    def abandon(self, exc: BaseException) -> None:
        """The run stopped on `exc`: the arm and the record say failed and why (the server is left as it is)."""
        m = self.record.manifest
        if m.status in ("pending", "running"):
            why = interrupts.describe(exc)
            for a in m.arms:
                if a.status in ("pending", "running"):
                    a.status, a.reason = "failed", f"observe stopped ({why})"
            self.record.finish("failed", f"{why}; the observed server was left as it was (never signalled)",
                               best_effort=True)
        self.source.close()

    def result(self) -> ObserveResult:
        from spectrial.analysis.serving import requests_frame

        reqs: list[RequestRecord] = [r for w in (self.measured.windows if self.measured else []) for r in w.requests]
        return ObserveResult(self.record.dir, self.record.manifest, requests_frame(reqs))


def observe_arm(params: TrialParams, observed: ObservedServer) -> Arm:
    """The one arm: the params' single speculative arm when they give arms (more than one, or a baseline, is
    refused: `ONE_ARM`), else "observed" with the server's method (settled after the window if not yet known)."""
    if "arms" not in params.model_fields_set:
        return Arm(name="observed", method=observed.method or "draft")  # type: ignore[arg-type]
    arms = params.arms
    if len(arms) != 1 or not arms[0].speculative:
        given = ", ".join(f"{a.name} ({a.method})" for a in arms)
        raise ConfigError(f"arms: {ONE_ARM}, the speculative one it runs; the params give {len(arms)} arm(s): "
                          f"{given}", parameter="arms",
                          hint="give one arm with the server's method (or no arms: the method is read from the "
                               "server); a comparison with a baseline needs a controlled `spectrial trial`, which "
                               "starts and restarts its own servers")
    if arms[0].synthetic_accept is not None:
        raise ConfigError("arms[0].synthetic_accept: observe cannot force acceptance on a server it did not start; "
                          "leave it out", parameter="arms")
    return arms[0]


def run_observe(params: TrialParams, *, run_id: str | None = None, progress: bool = True,
                raise_on_failure: bool = True) -> ObserveResult:
    """Identify the server (refusals before any record), then measure it as it is (spectrial.protocol.observe)."""
    if params.observe is None:
        raise ConfigError("observe: give the running server's URL (observe: {url: http://HOST:PORT}, or "
                          "`spectrial observe URL`)", parameter="observe")
    observed = identify(params)
    observe_arm(params, observed)  # refuse bad arms before a record exists
    with opened(lambda: Observe(params, observed, run_id=run_id, progress=progress)) as ob:
        return ob.run(raise_on_failure)


def observe_params(url: str, params_file: Path | None = None, overrides: dict[str, Any] | None = None
                   ) -> TrialParams:
    """Params of `spectrial observe URL`: the file's (if any) with `observe.url` set; `model` need not be given
    (the server's is recorded), the name defaults to "observe"."""
    data: dict[str, Any] = {}
    if params_file is not None:
        data, _ = read_params_yaml(params_file)
    data = {"model": "(the observed server's)", "name": "observe", **data}
    data["observe"] = {**(data.get("observe") or {}), "url": url}
    return load_params(data=data, overrides=overrides)  # `arms` counts as given only when the file or -p gives it
