"""One server start, written once: the protocol's preamble and one start of one arm.

    preamble   prepare (engine, models, every arm's exact command, the workload sampled by seed) -> kill the
               old server -> GPUs free -> fingerprint the host
    one start  launch -> ready -> note the server's processes -> verify the environment -> GPU sampler on
               -> (first start, where only the server can count tokens: the workload's lengths)
               -> warm-up -> measurement windows (counters before/after each, its log lines noted) -> stop
               -> fetch the log once, parse it once -> each window's statistics (engine adapter) and the
               NCCL evidence from that one parse -> fingerprint diff

`spectrial.protocol.trial` (arms x restarts, one window per start) and `spectrial.sweep` (settings, one window per
concurrency level) are two schedules over a `Session`. A sweep takes its starts from any `StartSource`: a
live `Session`, or the replayer and simulated worlds of `spectrial.sweep`, which build the same records.
Every start becomes a `StartRecord` in the run record; what the session writes there, both schedules get.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import secrets as _rnd
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from spectrial import interrupts
from spectrial.analysis import energy
from spectrial.analysis.figures import median, window_rates
from spectrial.analysis.validity import Setting, planned
from spectrial.engines.base import Engine, ServerProbe, Window, Workers, get_engine
from spectrial.engines.nccl_evidence import evidence_summary, nccl_evidence
from spectrial.errors import ConfigError, HostError, MeasurementRejected, ServerMisbehaved
from spectrial.hosts import bandwidth, rapl
from spectrial.hosts.connect import get_host
from spectrial.hosts.fingerprint import compare as fp_compare
from spectrial.hosts.fingerprint import engine_identity, file_identity, fingerprint_key, host_fingerprint
from spectrial.hosts.gpu import GpuSampler, GpuStatus
from spectrial.hosts.local import Host
from spectrial.logs.api import ServerLog
from spectrial.measure.bench import RequestTags, run_requests, server_broke, stream_limits
from spectrial.measure.httpread import PROBE, Limits, bounded_client, metrics_limits
from spectrial.measure.workloads import (
    WorkItem,
    Workload,
    build_workload,
    estimate_lengths,
    hf_chat_template,
    local_lengths,
)
from spectrial.params import Arm, TrialParams
from spectrial.protocol.group import HostGroup
from spectrial.record.store import RunRecord
from spectrial.schema import (
    BandwidthBound,
    Check,
    ConfigCheckRecord,
    EngineInfo,
    GpusSeen,
    HostInfo,
    LaunchRecord,
    RequestRecord,
    StartEnergy,
    StartRecord,
    Status,
    StepRecord,
    WindowRecord,
    WindowStats,
)
from spectrial.secrets import mask_launch, secret_values
from spectrial.servers import configcheck
from spectrial.servers.envcheck import require_verified, strict_names
from spectrial.servers.lifecycle import Abandoned, KillReport, LaunchSpec, Server, stop_previous


@dataclass(frozen=True)
class WindowPlan:
    """One measurement window of a start: `requests` requests, `concurrency` at a time (with `rate`: an open loop
    offering `rate` requests per second, at most `concurrency` in flight)."""

    concurrency: int
    requests: int
    seed: int
    category: str | None = None  # draw only this workload category (a context-length bucket); None: all
    rate: float | None = None  # offered requests per second (open loop); None: a closed loop

    @property
    def load(self) -> str:
        """The window's load level in words: "c4", "2 req/s"."""
        return f"c{self.concurrency}" if self.rate is None else f"{self.rate:g} req/s"


class LoadLevel(Protocol):
    """A load level as the windows read it (spectrial.sweep.params.Load)."""

    @property
    def concurrency(self) -> int: ...

    @property
    def rate(self) -> float | None: ...


def level_windows(params: TrialParams, loads: Sequence[LoadLevel], restart: int = 0) -> list[WindowPlan]:
    """A sweep start's windows: one per load level, each a multiple of its concurrency (a request-rate level: of its
    cap in flight) with at least `repeats` requests. A level's seed does not depend on the arm: every arm is sent the
    same requests (and at a rate level, the same arrival times)."""
    p = params
    return [WindowPlan(x.concurrency, x.concurrency * math.ceil(p.repeats / x.concurrency),
                       p.seed + 100 * restart + (x.concurrency if x.rate is None else 100_000 + round(x.rate * 1000)),
                       rate=x.rate) for x in loads]


@dataclass
class MeasuredWindow:
    """A window as measured: its plan, its record (in the start record), its requests and statistics."""

    plan: WindowPlan
    record: WindowRecord
    requests: list[RequestRecord]
    stats: WindowStats


@dataclass
class MeasuredStart:
    """One start: its record (already in the run record) and its windows."""

    record: StartRecord
    windows: list[MeasuredWindow] = field(default_factory=list)


class StartSource(Protocol):
    """Where a schedule's server starts come from (a live host, a finished record, a model world)."""

    fp_key: str

    def open(self) -> None:
        """Everything before the first start (the preamble, or the source's metadata into the record)."""

    def start(self, arm: Arm, restart: int, windows: list[WindowPlan], phase: str | None = None
              ) -> MeasuredStart | None:
        """One start of `arm` measuring `windows`; None when the source has no such start (a replay)."""

    def elapsed_s(self) -> float:
        """Seconds spent starting and measuring so far (the clock of time budgets)."""

    def moved(self, start: StartRecord) -> str | None:
        """The new fingerprint key when the host changed during `start`, else None."""

    def setting(self, concurrency: int | None = None, rate: float | None = None) -> Setting | None:
        """What the validity checks compare a measurement at `concurrency` (with `rate`: an open loop offering
        `rate` req/s, at most `concurrency` in flight) with (None: no checks)."""

    def close(self) -> None:
        """Release hosts and connections."""


def validity_setting(params: TrialParams, engine: Engine | None, concurrency: int | None = None,
                     rate: float | None = None) -> Setting:
    """The run's settings as the validity checks see them (spectrial.analysis.validity)."""
    slots, what = engine.slots() if engine is not None else (None, "")
    return Setting(concurrency=concurrency or params.concurrency, rate=rate, slots=slots, slots_setting=what,
                   fixed_length=params.output_len == "fixed", warmup=params.warmup,
                   limits=params.validity.limits())


def planned_checks(params: TrialParams, windows: list[WindowPlan], engine: Engine | None = None) -> list[Check]:
    """The validity checks every start measuring `windows` will fail, known from the params alone (each window's
    planned requests through `spectrial.analysis.validity.planned`, the run's own rules); one per check and window size."""
    out: dict[tuple[str, str], Check] = {}
    for w in windows:
        for c in planned(w.requests, validity_setting(params, engine, w.concurrency, w.rate)):
            out.setdefault((c.name, c.summary), c)
    return list(out.values())


class OfflineSource:
    """A `StartSource` without a host (a replayed record, a model world): its clock is the recorded or
    simulated duration of its starts, and the host never changes under it."""

    fp_key = "offline"

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        self.clock = 0.0

    def elapsed_s(self) -> float:
        return self.clock

    def moved(self, start: StartRecord) -> str | None:
        return None

    def setting(self, concurrency: int | None = None, rate: float | None = None) -> Setting | None:
        return None

    def close(self) -> None:
        return None


@retry(retry=retry_if_exception_type(httpx.TransportError), stop=stop_after_attempt(3),
       wait=wait_exponential(multiplier=0.5, max=4), reraise=True)
def _snapshot(engine: Engine, client: httpx.Client, url: str) -> dict[str, float]:
    """Cumulative counters; retried on transport errors (a dropped SSH tunnel reconnects meanwhile), which
    cannot skew them since they are cumulative."""
    return engine.snapshot(client, url)


@dataclass
class _Raw:
    plan: WindowPlan
    before: dict[str, float]
    after: dict[str, float]
    requests: list[RequestRecord]
    first_line: int
    last_line: int = 0
    rapl_j: float | None = None  # CPU package energy over the window (RAPL), J


class Session:
    """A host, an engine and a run record: the preamble and one start at a time (a `StartSource`)."""

    def __init__(self, params: TrialParams, record: RunRecord, progress: bool = True) -> None:
        self.params, self.record, self.progress = params, record, progress
        self.rapl = False  # RAPL counters readable on the host (a CPU host): each window's energy is read
        self.host: Host | None = None
        self.group: HostGroup | None = None
        self.engine: Engine | None = None
        self.workers: Workers | None = None  # the other nodes of `hosts:` as the engine prepared them
        self.specs: dict[str, LaunchSpec] = {}
        self.prompts: list[WorkItem] = []  # the trial's workload, sampled once by prepare
        self.workload: Workload | None = None
        self.gpus: GpuStatus | None = None
        self.fp_key = ""
        self.done: set[str] = set()  # preamble steps done
        self.prepare_s: float | None = None
        self._t0 = time.monotonic()
        record.add_secrets(secret_values(params.env))

    # --- the preamble ------------------------------------------------------------------------------------
    def connect(self) -> None:
        """Connect the host (and the other nodes of `hosts:`) and configure the engine adapter."""
        if self.host is not None:
            return
        p = self.params
        self.host = get_host(p.host, **p.ssh.connect_options())
        self.group = HostGroup.from_params(p, self.host)
        self.record.manifest.host = HostInfo(name=self.host.name)
        self.engine = get_engine(p.engine, p, self.host)

    def prepare(self) -> dict[str, LaunchSpec]:
        """Resolve binaries and models, validate every arm and fix its exact command (before any launch)."""
        if "prepare" in self.done:
            return self.specs
        self.connect()
        assert self.engine is not None and self.group is not None
        m = self.record.manifest
        with self.record.step("prepare"):
            found = self.engine.prepare()  # the adapter's identity: only the fields it set go into the record
            ssh_identity = getattr(self.host, "ssh_identity", None)  # an SSH host: host key, client keys
            if callable(ssh_identity):
                m.host.ssh = ssh_identity()
            m.engine = EngineInfo(name=self.params.engine).add(found)
            if self.group.workers:
                self.workers = self.group.prepare(self.engine)
                m.nodes = self.group.node_entries(self.workers)
            m.engine.add(self.engine.version())
            self.specs = {a.name: self.engine.launch_spec(a, self.workers) for a in self.params.arms}
            shown = {name: mask_launch(s.argv, s.env) for name, s in self.specs.items()}
            m.launch = [LaunchRecord(arm=a.name, method=a.method, argv=shown[a.name].argv, env=shown[a.name].env,
                                     notes=list(self.specs[a.name].notes)) for a in self.params.arms]
            for masked in shown.values():
                self.record.add_secrets(masked.secrets)
            self.prompts = self._workload()
        self.done.add("prepare")
        return self.specs

    def _workload(self) -> list[WorkItem]:
        """Read and order the workload once (seeded; `spectrial.measure.workloads`) and count its lengths in the
        target's tokens: with its local tokenizer now, else by the server at the first start (`_count`), else
        estimated. What was sampled and how goes into the record."""
        assert self.engine is not None and self.host is not None
        p, engine = self.params, self.engine
        chat = p.request_format == "chat"
        note = engine.chat_template_note() if chat else None
        lengths, unit = None, ""
        if (tok := engine.tokenizer_file()) is not None:
            template = None
            if chat and (d := engine.model_dir()) is not None:
                with contextlib.suppress(ConfigError):  # no template: the server refuses chat, the record says why
                    template = hf_chat_template(self.host, d)
            lengths, unit = local_lengths(tok, chat, template), f"tokens of the target's tokenizer ({tok})"
        elif not engine.counts_on_server:
            lengths, unit = estimate_lengths(chat), "estimated tokens (UTF-8 bytes / 3: no tokenizer of the target)"
        self.workload = build_workload(p, lengths=lengths, unit=unit, context=engine.context_tokens(),
                                       chat_template=note)
        self.workload.description.endpoint = engine.request_target(p.request_format)[0]
        self.record.manifest.workload = self.workload.description
        return self.workload.items

    def _count(self, server: Server) -> None:
        """Count the workload's lengths with the running server's tokenizer (once, at the first start: every
        arm gets the same items)."""
        assert self.engine is not None and self.workload is not None
        lengths = self.engine.server_lengths(server.base_url, self.params.request_format == "chat")
        assert lengths is not None
        with self.record.step("workload_lengths", server=server.spec.name):
            self.workload.finalize(lengths, f"tokens counted by the server ({server.spec.name}: /tokenize)")
        self.prompts = self.workload.items
        self.record.manifest.workload = self.workload.description
        self.record.save()

    def spec(self, arm: Arm) -> LaunchSpec:
        """The exact command of `arm` (fixed by `prepare`; arms added later are resolved on first use)."""
        if arm.name not in self.specs:
            assert self.engine is not None
            self.specs[arm.name] = self.engine.launch_spec(arm, self.workers)
        return self.specs[arm.name]

    def kill_old_server(self) -> KillReport:
        """Stop what spectrial left running on the port (by its recorded process group), and refuse, naming the
        culprit, when something else holds it; on every node."""
        self.prepare()
        assert self.host is not None and self.group is not None and self.engine is not None
        p = self.params
        with self.record.step("kill_old_server") as st:
            st.report = stop_previous(self.host, p.port, self.host.expand(p.state_dir), p.stop_grace_s, p.takeover)
            if self.group.workers:
                st.nodes = self.group.stop_previous(self.engine, p)
            report: KillReport = st.report
            if report.abandoned is not None:
                report.abandoned.settled = self._settle_previous(report.abandoned)
        self.done.add("kill_old_server")
        return report

    def _settle_previous(self, prev: Abandoned) -> str:
        """The run that left a server on the port: its server log copied into its record (the evidence of what it
        was doing), and its record marked failed if it still says running (spectrial.record.store.settle_record)."""
        from pathlib import Path

        from spectrial.record.store import add_log_to_record, settle_record

        run = Path(prev.record or "")
        if not prev.record or not (run / "manifest.json").is_file() or run == self.record.dir:
            return "its record is not on this machine" if prev.record else "no record named"
        assert self.host is not None
        notes = []
        if prev.log and prev.name:
            try:
                if add_log_to_record(run, f"logs/{prev.name}.log", self.host.read_text(prev.log)):
                    notes.append("server log copied into it")
            except Exception as exc:  # noqa: BLE001 - a log that went away is reported, not fatal
                notes.append(f"server log not copied: {exc}")
        why = settle_record(run, reason=f"its server was found on port {self.params.port} by run "
                                 f"{self.record.run_id} and stopped")
        return "; ".join([*notes, why or "record already final"])

    def verify_gpus_free(self) -> GpuStatus:
        """Wait until the GPUs are free (or record that the host has none); on every node."""
        if "kill_old_server" not in self.done:
            self.kill_old_server()
        assert self.group is not None
        with self.record.step("verify_gpus_free") as st:
            self.gpus, node_gpus = self.group.wait_gpus_free(self.params)
            if node_gpus:
                st.nodes = node_gpus
            st.gpus = self.gpus.as_dict()
        self.done.add("verify_gpus_free")
        return self.gpus

    def setting(self, concurrency: int | None = None, rate: float | None = None) -> Setting:
        return validity_setting(self.params, self.engine, concurrency, rate)

    def fingerprint(self) -> str:
        """Host state, engine build and model files: the key that says which runs are comparable."""
        if "verify_gpus_free" not in self.done:
            self.verify_gpus_free()
        assert self.host is not None and self.group is not None and self.gpus is not None
        m = self.record.manifest
        with self.record.step("fingerprint"):
            fp, node_fps = self.group.fingerprints()
            if node_fps:
                m.node_fingerprints = node_fps
            if self.engine.binary_identity and (binary := engine_identity(self.host, m.engine.binary)) is not None:
                m.engine.binary_identity = binary
            models = (m.engine.models or {}).values()
            m.models = [file_identity(self.host, x) for x in dict.fromkeys(models) if x.startswith("/")]
            m.host.fingerprint = fp
            m.host.gpus = GpusSeen.model_validate(self.gpus.as_dict())
            self.fp_key = m.fingerprint_key = fingerprint_key(fp, m.engine)
        if not (m.host.gpus and m.host.gpus.gpus):
            if self.params.bandwidth_gb_s is None:
                with self.record.step("bandwidth"):  # a CPU host: its memory bandwidth bounds decode (issue 39)
                    m.bandwidth = BandwidthBound(host=bandwidth.cached(self.host, self.fp_key))
            self.rapl = rapl.read(self.host) is not None  # a CPU host's energy: RAPL where readable
        self.done.add("fingerprint")
        return self.fp_key

    def open(self) -> None:
        """The whole preamble (each step once), and the host's old run folders pruned (`work_dir`: the newest
        kept, spectrial.provisioning.remote.prune_run_dirs)."""
        if "fingerprint" not in self.done:
            self.fingerprint()
        if "prune" not in self.done:
            self._prune()
        if self.prepare_s is None:  # budgets count from here: builds and model writes are not measuring
            self.prepare_s = round(time.monotonic() - self._t0, 2)
            self._t0 = time.monotonic()

    def _prune(self) -> None:
        from spectrial.provisioning.remote import prune_run_dirs

        assert self.host is not None
        self.done.add("prune")
        try:
            removed = prune_run_dirs(self.host, self.host.expand(self.params.work_dir), current=self.record.run_id)
        except Exception as exc:  # noqa: BLE001 - housekeeping never fails a run; the record says why it was skipped
            self.record.manifest.steps.append(StepRecord(name="prune_work_dir", ok=False, error=str(exc)[:300]))
            return
        if removed:
            self.record.manifest.steps.append(StepRecord(name="prune_work_dir", ok=True, removed=removed))
            self.record.save()

    def elapsed_s(self) -> float:
        return time.monotonic() - self._t0

    def moved(self, start: StartRecord) -> str | None:
        """A new fingerprint key when the host's stable state changed during `start` (not throttling)."""
        stable = [c for c in start.fingerprint_changes if "throttling" not in c]
        if not stable or self.host is None:
            return None
        key = fingerprint_key(host_fingerprint(self.host), self.record.manifest.engine)
        if key == self.fp_key:
            return None
        self.fp_key = key
        return key

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        if self.host is not None:
            self.host.close()

    # --- one start ---------------------------------------------------------------------------------------
    def start(self, arm: Arm, restart: int, windows: list[WindowPlan], phase: str | None = None) -> MeasuredStart:
        """Launch, verify, measure every window, stop: one server start of `arm`; its record is in the run
        record whatever happens (status failed and why), and the server is stopped on any exception."""
        if "fingerprint" not in self.done:
            self.open()
        assert self.host is not None and self.engine is not None
        p, rec, host, engine = self.params, self.record, self.host, self.engine
        spec = self.spec(arm)
        one = p.restarts == 1 and p.decide is None  # one start per arm: names without a number
        label = arm.name if one else f"{arm.name}#{restart + 1}"
        entry = StartRecord(arm=arm.name, restart=restart, order=len(rec.manifest.starts), phase=phase,
                            fingerprint_key=self.fp_key)
        rec.manifest.starts.append(entry)
        work = f"{host.expand(p.work_dir)}/{rec.run_id}"
        name = spec.name if one else f"{spec.name}-{restart + 1}"
        server = Server(host, dataclasses.replace(spec, name=name, argv=list(spec.argv)), work_dir=work,
                        state_dir=host.expand(p.state_dir), grace_s=p.stop_grace_s, run_id=rec.run_id, arm=arm.name,
                        tag=f"{rec.run_id}:{arm.name}:{restart}:{_rnd.token_hex(3)}", record_dir=str(rec.dir))
        if self.group is not None:
            self.group.attach(server, engine, arm, p, self.workers)
        fp_before = host_fingerprint(host)
        raws: list[_Raw] = []
        samples: list[dict[str, Any]] = []
        tags: dict[str, str | int] = {"arm": arm.name, "restart": restart, **({"phase": phase} if phase else {})}
        t0 = time.monotonic()
        failure: BaseException | None = None
        try:
            with contextlib.ExitStack() as guard:
                # the stop is guaranteed on any exception (KeyboardInterrupt included) from the launch on: a
                # SIGTERM delivered while the launch step saved the record once left the server running
                guard.push(server.__exit__)
                with rec.step(f"launch:{label}", **tags):
                    server.start()
                with rec.step(f"ready:{label}", **tags):
                    entry.ready_s = server.wait_ready(p.ready_timeout_s, progress=self.progress)
                    server.record_members()
                with rec.step(f"env_check:{label}", **tags):
                    entry.env_check = server.verify_env()
                    ranks, nodes = engine.ranks(), max(len(p.hosts), 1)
                    strict = strict_names(spec.env, ranks, nodes)
                    if strict:  # NCCL_* on a multi-GPU launch: a process nothing could verify does not pass
                        entry.env_check = require_verified(
                            entry.env_check, strict, f"a multi-GPU launch ({ranks} rank(s)" + (
                                f" per node, {nodes} nodes" if nodes > 1 else "") + ") with NCCL_* variables")
                    if not entry.env_check.ok and spec.env and p.env_check == "fail":
                        raise MeasurementRejected(
                            f"env_check: requested variables did not reach the server of arm {arm.name}: "
                            f"{entry.env_check.summary}", check="env_check", arm=arm.name, result=entry.env_check,
                            hint="see the record's env_check per process; set env_check: warn to continue anyway")
                sampler = GpuSampler(host, f"{work}/{server.spec.name}.gpu.csv", p.sample_gpu_ms,
                                     env=server.helper_env("gpu"), on_start=lambda g: server.add_helper("gpu", g))
                def check_config() -> None:  # after the warm-up: llama.cpp names a slot's method once it served
                    if p.config_check == "off":
                        return
                    with rec.step(f"config_check:{label}", **tags):
                        entry.config_check = self._config_check(server, arm)
                        if entry.config_check.ok is False and p.config_check == "fail":
                            raise MeasurementRejected(
                                f"config_check: the server of arm {arm.name} resolved another configuration than "
                                f"asked: {entry.config_check.summary}", check="config_check", arm=arm.name,
                                result=entry.config_check, hint=configcheck.fix_hint(entry.config_check))

                with rec.step(f"benchmark:{label}", **tags), sampler:
                    try:
                        self._measure(server, arm, restart, entry.order, windows, label, raws, check_config)
                    except httpx.HTTPError as exc:
                        raise server.lost(exc) from exc
                    samples = sampler.stop()
                entry.gpu_sampling = sampler.reason or f"{len(samples)} samples"
                with rec.step(f"stop:{label}", **tags) as st:
                    st.report = server.stop()
            entry.status, entry.reason = start_outcome([r for raw in raws for r in raw.requests])
        except BaseException as exc:
            failure = exc
            entry.status, entry.reason = "failed", interrupts.describe(exc)
            if isinstance(exc, HostError) and exc.lost and server.pid is not None:
                entry.reason += (f"; the server (pid {server.pid}, tag {server.tag}) may still be running on "
                                 f"{host.name}: the next trial's kill step on that host stops it")
            raise
        finally:
            try:
                measured = self._finish(entry, server, spec, arm, raws, samples, fp_before, t0)
            except Exception as exc:  # noqa: BLE001 - after a failure, the failure is what the caller must see
                if failure is None:
                    raise
                entry.notes.append(f"finishing the start after {type(failure).__name__} failed too: "
                                   f"{type(exc).__name__}: {exc}")
                measured = []
        return MeasuredStart(entry, measured)

    def _config_check(self, server: Server, arm: Arm) -> ConfigCheckRecord:
        """What the running server resolved of the arm's settings, beside what the params asked
        (spectrial.servers.configcheck): its endpoints and the tail of its startup log, each read bounded."""
        assert self.engine is not None and self.host is not None
        log = ""
        with contextlib.suppress(HostError):
            log = self.host.read_text(server.log_path, max_bytes=configcheck.LOG_READ_BYTES)
        with bounded_client(Limits(deadline_s=60, read_s=30, max_bytes=PROBE.max_bytes)) as client:
            try:
                settings = self.engine.config_readback(arm, ServerProbe(server.base_url, client), log)
            except (httpx.HTTPError, ValueError) as exc:
                settings = [configcheck.setting("server", "the server's endpoints", "answers", None,
                                                f"reading them failed: {type(exc).__name__}: {exc}")]
        return configcheck.check(settings, self.params.config_check)

    def _measure(self, server: Server, arm: Arm, restart: int, order: int, windows: list[WindowPlan],
                 label: str, out: list[_Raw], after_warmup: Callable[[], None] = lambda: None) -> None:
        """Warm up once, then `after_warmup` (the configuration check), then each window with counters before
        and after (appended to `out` as measured)."""
        assert self.engine is not None and self.host is not None
        p, engine = self.params, self.engine
        if self.workload is not None and not self.workload.ready:
            self._count(server)
        path, payload = engine.request_target(p.request_format)
        common = {"max_tokens": p.max_tokens, "payload": payload, "stats_fn": engine.request_stats, "path": path,
                  "timeout_s": p.request_timeout_s, "progress": self.progress, "output_len": p.output_len,
                  "limits": stream_limits(p)}
        if p.warmup:
            warm = run_requests(server.base_url, self.prompts, n=p.warmup, phase="warmup", concurrency=1,
                                seed=p.seed + 1000 + restart, label=label, **common)
            for why in filter(None, map(server_broke, warm)):  # a broken server is not measured: the start fails
                raise ServerMisbehaved(f"{server.base_url}{path} (warm-up)", why)
        after_warmup()
        for w in windows:
            tags: RequestTags = {"arm": arm.name, "restart": restart, "start": order,
                                 "concurrency": w.concurrency}
            if w.rate is not None:
                tags["offered_rate"] = w.rate
            prompts = [it for it in self.prompts if it.category == w.category] if w.category else self.prompts
            if not prompts:
                raise ConfigError(f"workload: no item of category {w.category!r} for a window of arm {arm.name}",
                                  parameter="workload", hint="see the workload's categories in the record")
            with bounded_client(metrics_limits(p.limits)) as client:
                around = ((lambda c=client: _snapshot(engine, c, server.base_url)), engine.request_counter_stats) \
                    if engine.per_request_counters else None
                before = _snapshot(engine, client, server.base_url)
                raw = _Raw(w, before, {}, [], first_line=self.host.line_count(server.log_path) + 1)
                out.append(raw)
                energy0 = rapl.read(self.host) if self.rapl else None
                where = " ".join(x for x in (w.load if len({v.load for v in windows}) > 1
                                              else "", w.category or "") if x)
                raw.requests = run_requests(server.base_url, prompts, n=w.requests, concurrency=w.concurrency,
                                            seed=w.seed, tags=tags, rate=w.rate, label=f"{label} {where}" if where and
                                            len(windows) > 1 else label, counters=around, **common)
                lost = getattr(self.host, "lost", None)
                if lost is None and not self.host.is_local and any(
                        r.error and not r.error.startswith(("HTTP ", "short output")) for r in raw.requests):
                    # a request broke off on its way: is it the link? One command over it answers (the host
                    # gives up within its reconnect window), so a dead sshd is not reported as lost requests
                    with contextlib.suppress(HostError):
                        self.host.run("true", check=False, timeout=30)
                    lost = getattr(self.host, "lost", None)
                if lost is not None:  # the host is gone: the window's failed requests say nothing of the server
                    raise lost
                raw.after = _snapshot(engine, client, server.base_url)
                energy1 = rapl.read(self.host) if energy0 is not None else None
                raw.rapl_j = rapl.joules(energy0, energy1) if energy0 is not None and energy1 is not None else None

    def _finish(self, entry: StartRecord, server: Server, spec: LaunchSpec, arm: Arm, raws: list[_Raw],
                samples: list[dict[str, Any]], fp_before: dict[str, Any], t0: float) -> list[MeasuredWindow]:
        """After the stop (or a failure): fetch and parse the log once, compute every window's statistics
        from it, record the host's changes, GPU samples, companions' logs and connection events."""
        assert self.host is not None and self.engine is not None
        rec, host = self.record, self.host
        entry.elapsed_s = round(time.monotonic() - t0, 3)
        entry.server = server.info()
        try:
            entry.fingerprint_changes = fp_compare(fp_before, host_fingerprint(host))
        except Exception as exc:  # noqa: BLE001 - a host that went away is itself a finding
            entry.notes.append(f"fingerprint after the start not taken: {exc}")
        entry.throttled_samples = sum(1 for s in samples if s.get("throttle"))
        if samples:
            rec.write_table(f"gpu/{server.spec.name}.csv", samples)
        log = ServerLog("")
        try:
            log = ServerLog(host.read_text(server.log_path))
            rec.write_text(f"logs/{server.spec.name}.log", log.text)
            entry.log_summary = log.summary()
            if server.pid is None:  # stopped: what the engine left outside its folders goes too
                for path in self.engine.runtime_leftovers(log.text):
                    host.remove(path)
        except Exception as exc:  # noqa: BLE001 - a log that never got written is itself a finding
            entry.notes.append(f"server log not fetched: {exc}")
        measured = []
        for i, raw in enumerate(raws):
            raw.last_line = raws[i + 1].first_line - 1 if i + 1 < len(raws) else max(raw.first_line, len(log.text.splitlines()))
            measured.append(self._window(raw, arm, spec, log, entry))
        entry.windows = [m.record for m in measured]
        entry.tok_s = median(r.tok_s for m in measured for r in m.requests if r.ok)
        entry.energy = self._energy(measured, raws, samples)
        if spec.env.get("NCCL_DEBUG", "").upper() == "INFO" and log.text:
            entry.nccl_evidence = ev = nccl_evidence(log.table, spec.env)
            entry.notes.append(evidence_summary(ev))
        for name, text in server.extra_logs().items():
            rec.write_text(f"logs/{name}", text)
        events = host.take_events() + (self.group.take_events() if self.group else [])
        if events:
            entry.connection_events = events
        rec.save()
        ev = entry.nccl_evidence
        if entry.status == "ok" and ev and ev.ok is False and self.engine.nccl_evidence_check(spec.env) == "fail":
            entry.status = "failed"
            entry.reason = "NCCL did not use the requested values: " + "; ".join(ev.problems[:8])
            rec.save()
            raise MeasurementRejected(f"engine_config.nccl_evidence_check: {entry.reason} (arm {arm.name})",
                                      check="nccl_evidence", arm=arm.name, result=ev,
                                      hint="see the record's nccl_evidence per rank; set engine_config."
                                           "nccl_evidence_check: warn to continue anyway")
        return measured

    def _energy(self, measured: list[MeasuredWindow], raws: list[_Raw], samples: list[dict[str, Any]]) -> StartEnergy:
        """The energy of the start's windows (spectrial.analysis.energy): the GPUs' sampled power over the windows'
        duration, or the CPU packages' RAPL counters read around each window; n/a and why otherwise."""
        spans = [max(r.t_end for r in m.requests if r.t_end is not None)
                 - min(r.t_start for r in m.requests if r.t_start is not None)
                 for m in measured if any(r.t_end is not None for r in m.requests)
                 and any(r.t_start is not None for r in m.requests)]
        duration = float(sum(spans))
        tokens = float(sum(r.tokens for m in measured for r in m.requests if r.ok))
        acc = [m.stats.accepted for m in measured]
        accepted = float(sum(a for a in acc if a is not None)) if acc and None not in acc else None
        power, instants, gpus = energy.mean_power_w(samples)
        if power is not None:
            return energy.start_energy(power, duration, tokens, accepted,
                                       f"nvidia-smi power.draw ({gpus} GPU(s), {instants} samples)")
        joules = [r.rapl_j for r in raws]
        if self.rapl and joules and None not in joules:
            return energy.start_energy(None, duration, tokens, accepted, "RAPL package counters",
                                       joules=float(sum(j for j in joules if j is not None)))
        if samples:
            return StartEnergy(source="the GPU samples carry no power reading (power.draw [N/A])")
        return StartEnergy(source=rapl.NONE if not self.rapl else "RAPL counters not read around every window")

    def _window(self, raw: _Raw, arm: Arm, spec: LaunchSpec, log: ServerLog, entry: StartRecord) -> MeasuredWindow:
        """One window's statistics (the engine adapter's), and its record."""
        assert self.engine is not None
        w = Window(arm=arm, spec=spec, before=raw.before, after=raw.after, requests=raw.requests, log=log,
                   first_line=raw.first_line, last_line=raw.last_line)
        try:
            stats = self.engine.window_stats(w) if raw.after or not raw.before else WindowStats(scoped=False)
        except Exception as exc:  # noqa: BLE001 - statistics of a broken window must not hide its failure
            stats = WindowStats(scoped=False, source="none", notes=[f"window statistics failed: {exc}"])
        ok = [r for r in raw.requests if r.ok]
        for r, rate in zip(raw.requests, window_rates(raw.requests), strict=True):
            r.tok_s = rate  # the request's decode rate, on one clock per window (figures.window_rates)
        record = WindowRecord(concurrency=raw.plan.concurrency, category=raw.plan.category, offered_rate=raw.plan.rate,
                              requests=len(raw.requests), requests_ok=len(ok),
                              tok_s=median(r.tok_s for r in ok), counters=stats.counters(), per_position=stats.per_position,
                              accept_len=stats.accept_len, stats_source=stats.source, stats_scoped=stats.scoped,
                              stats_notes=list(stats.notes), cross_checks=stats.cross_checks,
                              log_lines=[raw.first_line, raw.last_line])
        return MeasuredWindow(raw.plan, record, raw.requests, stats)


def start_outcome(requests: list[RequestRecord]) -> tuple[Status, str | None]:
    """A measured start's status: ok when any request succeeded, else failed with the first errors."""
    if any(r.ok for r in requests):
        return "ok", None
    errs = sorted({str(r.error) for r in requests})
    return "failed", "no successful request" + (": " + "; ".join(errs[:3]) if errs else "")


def lost_requests(m: MeasuredStart) -> str | None:
    """What a start that ran lost: "k of n measured requests failed (the first error)", or None. A window that
    lost requests is never silently ok: the run says failed and why, the arm's figures use what was measured."""
    reqs = [r for w in m.windows for r in w.requests]
    bad = [r for r in reqs if not r.ok]
    if not bad:
        return None
    return f"{len(bad)} of {len(reqs)} measured requests failed (first: {str(bad[0].error)[:160]})"


def schedule(arms: list[Arm], restarts: int, order: str, seed: int = 0) -> list[tuple[Arm, int]]:
    """Server starts in launch order: interleaved (A B A B), blocked (A A B B) or random (seeded shuffle)."""
    if order == "blocked":
        return [(a, r) for a in arms for r in range(restarts)]
    plan = [(a, r) for r in range(restarts) for a in arms]
    if order == "random":
        random.Random(seed).shuffle(plan)
    return plan
