"""llama.cpp `llama-server`: the engine that runs on these machines (CPU here, CUDA on a GPU host).

Arms map to flags as follows (llama.cpp commit 0c1e570):
    none   -> no speculative flags
    draft  -> --spec-type draft-simple -md DRAFT --spec-draft-n-max STEPS
    eagle3 -> --spec-type draft-eagle3 -md DRAFT --spec-draft-n-max STEPS
    ngram  -> --spec-type ngram-simple --spec-draft-n-max STEPS
    synthetic_accept a -> --spec-synth-rates a,a^2,...,a^STEPS (benchmark-only; labelled in the record)
Readiness: every path answers 503 while loading; `/health` 200 when ready.
Stats: `/metrics` counters (`llamacpp:spec_decode_num_drafts_total` = verify steps, ...) before/after the
benchmark window; per request `timings`; drafting time from the `statistics` log lines (`-lv 4`).
Remote hosts: `engine_bin: auto` and `tiny:` models are built/written here and uploaded into the host's cache
(`spectrial.provisioning.remote`). Multi-host: `rpc-server -H ADDR -p PORT` on the other nodes (`spectrial.protocol.group`), and
`--rpc ADDR:PORT,...` on the head.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from spectrial.engines.base import (
    Engine,
    EngineIdentity,
    ServerProbe,
    Window,
    Worker,
    Workers,
    WorkerSpec,
    register,
)
from spectrial.engines.flags import Flag, render
from spectrial.errors import ConfigError
from spectrial.hosts.local import Host
from spectrial.logs.api import parse
from spectrial.measure import metrics
from spectrial.measure.bench import ChatMessage, RequestBody
from spectrial.measure.httpread import PROBE, Limits, bounded_client
from spectrial.measure.workloads import Lengths, WorkItem
from spectrial.params import Arm
from spectrial.schema import (
    ConfigSetting,
    CounterTotals,
    ObservedServer,
    ServerRequestStats,
    Upload,
    WatchMetrics,
    WindowStats,
)
from spectrial.servers.configcheck import setting
from spectrial.servers.lifecycle import LaunchSpec, Probe, on_each
from spectrial.servers.lifecycle import classify_exit as server_classify_exit

SPEC_TYPES = {"draft": "draft-simple", "eagle3": "draft-eagle3", "ngram": "ngram-simple"}
METRIC_PREFIX = "llamacpp:"
_ENDPOINT_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?:\d{1,5}$")
_LOG_TS_RE = re.compile(r"^(?:\x1b\[[0-9;]*m)?(\d+)\.(\d{2})\.(\d{3})\.(\d{3})\b")
READY_LINE = "model loaded"  # printed right after the server flips /health to 200
TERM_AGAIN_S = 1.0  # llama-server finishes the requests in flight on SIGTERM; a second one ends it at once

# engine_config fields -> flags, in argv order (llama.cpp 0c1e570)
SERVER_FLAGS = (Flag("ctx_size", "-c"), Flag("parallel", "-np"), Flag("metrics", "--metrics", switch=True),
                Flag("webui_off", "--no-webui", switch=True), Flag("log_verbosity", "-lv"), Flag("threads", "-t"),
                Flag("gpu_layers", "-ngl"), Flag("flash_attn", "-fa"))
DRAFT_FLAGS = (Flag("threads_draft", "-td", when="draft_model"), Flag("draft_gpu_layers", "-ngld", when="draft_model"),
               Flag("draft_n_min", "--spec-draft-n-min"), Flag("draft_p_min", "--spec-draft-p-min"))


class LlamaCppConfig(BaseModel):
    """llama.cpp-specific settings (`engine_config:` in params)."""

    model_config = ConfigDict(extra="forbid")

    threads: int | None = Field(None, ge=1, description="-t: CPU threads for generation.")
    threads_draft: int | None = Field(None, ge=1, description="-td: CPU threads of the draft model.")
    ctx_size: int = Field(2048, ge=64, description="-c: context size of one slot (llama-server gets -c ctx_size x "
                                                   "slots, so each request keeps this context).")
    parallel: int | None = Field(None, ge=1, description="-np: server slots (None: the trial's concurrency, so "
                                                         "concurrent requests run at once instead of queueing).")
    gpu_layers: int | Literal["auto", "all"] | None = Field(None, description="-ngl: layers on the GPU.")
    draft_gpu_layers: int | Literal["auto", "all"] | None = Field(None, description="-ngld: draft layers on GPU.")
    flash_attn: Literal["on", "off", "auto"] | None = Field(None, description="-fa.")
    log_verbosity: int = Field(4, ge=0, le=5, description="-lv: 4 prints the speculative statistics lines.")
    cache_prompt: bool = Field(False, description="Requests' cache_prompt (off: every request pays its own prefill; "
                                                  "on, a repeated prompt is served from the slot's cache and the "
                                                  "prefix_cache validity check marks the verdicts invalid).")
    draft_n_min: int | None = Field(None, ge=0, description="--spec-draft-n-min.")
    draft_p_min: float | None = Field(None, ge=0, le=1, description="--spec-draft-p-min (greedy threshold).")
    cuda: bool = Field(False, description="With engine_bin 'auto': build llama-server with CUDA.")
    cuda_arch: str = Field("90", description="CUDA architecture for the auto build.")
    rpc: list[str] = Field(default_factory=list, description="--rpc: rpc-server endpoints host:port (started by "
                                                             "you; with `hosts:` spectrial starts its own).")
    rpc_port: int = Field(50052, ge=1, le=65535, description="Port of the rpc-server spectrial starts on each "
                                                             "other node of `hosts:`.")
    extra_args: list[str] = Field(default_factory=list, description="Arguments appended to every arm.")
    tiny: dict[str, Any] = Field(default_factory=dict, description="Knobs of spectrial's tiny models.")

    @property
    def metrics(self) -> bool:  # /metrics is how spectrial scopes counters to a window: always on
        return True

    @property
    def webui_off(self) -> bool:
        return True

    @field_validator("rpc")
    @classmethod
    def _endpoints_ok(cls, v: list[str]) -> list[str]:
        for ep in v:
            if not _ENDPOINT_RE.match(ep):
                raise ValueError(f"{ep!r} is not HOST:PORT (host name or IPv4 address, then the port)")
        return v


def synth_rates(value: float | list[float] | None, steps: int) -> list[float] | None:
    """Per-position unconditional acceptance: a -> [a, a^2, ..., a^steps]; a list must have `steps` items."""
    if value is None:
        return None
    if isinstance(value, list):
        if len(value) != steps:
            raise ConfigError(f"synthetic_accept: {len(value)} per-position rates given for steps={steps}; "
                              "give exactly one rate per drafted position, or one per-token rate a")
        return [float(x) for x in value]
    return [round(float(value) ** (i + 1), 6) for i in range(steps)]


# llama.cpp's names of its speculative types -> spectrial's methods
TYPE_METHODS = {"draft-simple": "draft", "draft-eagle3": "eagle3", "ngram-simple": "ngram", "ngram-cache": "ngram",
                "ngram-map-k": "ngram", "ngram-map-k4v": "ngram", "ngram-mod": "ngram"}


def _observed_slots(probe: ServerProbe, obs: ObservedServer, fresh: bool = False) -> None:
    """`/slots`: whether each slot speculates, and (once a slot served a request) the types it runs."""
    if fresh:
        probe.answers.pop("/slots", None)
    slots = probe.json("/slots")
    if not isinstance(slots, list) or not slots or not isinstance(slots[0], dict):
        obs.found.setdefault("speculative", "not said: GET /slots is off (llama-server --no-slots)")
        return
    spec = [s.get("speculative") for s in slots if isinstance(s.get("speculative"), bool)]
    if spec:
        obs.speculative = any(spec)
        obs.found["speculative"] = f"GET /slots speculative: {spec[0] if len(set(spec)) == 1 else spec}"
    for s in slots:
        types = (s.get("params") or {}).get("speculative.types")
        if types:
            obs.settings["slots.speculative.types"] = types
            _observed_types(obs, str(types), "GET /slots params['speculative.types'] (of a slot that served a request)")
            return


def _observed_types(obs: ObservedServer, types: str, how: str) -> None:
    named = [t.strip() for t in types.split(",") if t.strip() and t.strip() != "none"]
    if not named:
        return
    obs.engine_method = ",".join(named)
    methods = {TYPE_METHODS.get(t) for t in named} - {None}
    if len(methods) == 1:
        obs.method = methods.pop()
        obs.found["method"] = f"{how}: {types}"
        obs.found["engine_method"] = obs.found["method"]

@register("llamacpp")
class LlamaCpp(Engine):
    """llama.cpp's llama-server."""

    config_model = LlamaCppConfig

    label = "llama.cpp"
    start_s = 2.0
    tree_drafts = False  # llama.cpp drafts a chain
    tiny_remote = True  # its tiny GGUF files are uploaded with it
    auto_binary = "spectrial's llama.cpp build"

    @classmethod
    def with_slots(cls, engine_config: dict[str, Any], concurrency: int) -> dict[str, Any]:
        """One slot per concurrent stream (-np)."""
        return {**engine_config, "parallel": max(int(engine_config.get("parallel") or 1), concurrency)}

    def tiny_model_path(self, ref: str) -> Path:
        """llama.cpp reads a GGUF file."""
        from spectrial.models.tiny import cache_root, tiny_spec

        knobs = dict(getattr(self.config, "tiny", {}) or {})
        return cache_root() / "models" / tiny_spec(**knobs).key() / f"{ref.removeprefix('tiny:')}.gguf"
    metric_prefix = METRIC_PREFIX
    server_header = "llama.cpp"
    metrics_flag = "llama-server --metrics"
    speculation_hint = ("start llama-server with a speculative method (e.g. --spec-type draft-simple -md DRAFT "
                        "--spec-draft-n-max 2) at its next restart")

    @classmethod
    def identify(cls, probe: ServerProbe, obs: ObservedServer) -> bool:
        props = probe.json("/props")
        if not isinstance(props, dict) or "build_info" not in props:
            return False
        obs.found["_how"] = "GET /props has build_info"
        obs.version = str(props["build_info"])
        obs.found["version"] = "GET /props build_info"
        if props.get("model_path") or props.get("model_alias"):
            obs.model = str(props.get("model_alias") or props.get("model_path"))
            obs.found["model"] = "GET /props model_alias" if props.get("model_alias") else "GET /props model_path"
        if isinstance(props.get("total_slots"), int):
            obs.slots = props["total_slots"]
            obs.found["slots"] = "GET /props total_slots"
        gen = props.get("default_generation_settings") or {}
        if isinstance(gen.get("n_ctx"), int):
            obs.context_tokens = gen["n_ctx"]
            obs.found["context_tokens"] = "GET /props default_generation_settings.n_ctx"
        types = (gen.get("params") or {}).get("speculative.types")
        if types:
            obs.settings["props.speculative.types"] = types
        _observed_slots(probe, obs)
        if obs.method is None and types:
            _observed_types(obs, str(types), "GET /props default_generation_settings.params['speculative.types']")
        return True

    @classmethod
    def refresh_observed(cls, probe: ServerProbe, obs: ObservedServer) -> None:
        """llama.cpp names the method a slot runs only once the slot served a request: read /slots again."""
        if obs.method is None:
            _observed_slots(probe, obs, fresh=True)

    def __init__(self, params, host) -> None:  # type: ignore[no-untyped-def]
        super().__init__(params, host)
        self.binary: str | None = None
        self.models: dict[str, str] = {}
        self.uploads: list[Upload] = []  # files sent to SSH hosts by prepare (and prepare_workers)

    # --- preparation ---------------------------------------------------------------------------------
    def _upload(self, host: Host, local: Path, mode: int, what: str) -> str:
        """`local` mirrored into `host`'s cache (uploaded unless identical there); returns the path there."""
        from spectrial.provisioning.remote import host_cache_root, mirror_path, sync_file

        remote = mirror_path(local, host_cache_root(host, self.params.ssh.cache_dir))
        info = sync_file(host, local, remote, mode, what=f"ssh.cache_dir (needed for {what})")
        self.uploads.append(info)
        return remote

    def engine_binary(self, host: Host, name: str = "llama-server") -> str:
        """Path of spectrial's build of `name` (llama-server or rpc-server) on `host`, built/uploaded as needed."""
        from spectrial.engines.llamacpp_build import ensure_binary

        local = ensure_binary(name, cuda=self.config.cuda, cuda_arch=self.config.cuda_arch)
        if not local.is_file():
            raise ConfigError(f"engine_bin: {local} is missing from spectrial's build; rebuild it "
                              f"(remove {local.parent} and run `spectrial provision llama-server`)")
        if host.is_local:
            return str(local)
        from spectrial.provisioning.remote import check_runs, check_same_arch

        check_same_arch(host)
        remote = self._upload(host, local, 0o700, name)
        check_runs(host, remote, "--version" if name == "llama-server" else "--help")
        return remote

    def _resolve_model(self, ref: str, what: str) -> str:
        if ref.startswith("tiny:"):
            from spectrial.models import ensure_tiny_models

            mset = ensure_tiny_models(**self.config.tiny)
            path = mset.dir / f"{ref[5:]}.gguf"
            if not path.is_file():
                known = sorted(p.stem for p in mset.dir.glob("*.gguf"))
                raise ConfigError(f"{what}: {ref!r} is not one of spectrial's tiny models {known}")
            return str(path) if self.host.is_local else self._upload(self.host, path, 0o600, what)
        path = self.host.expand(ref)
        if not self.host.exists(path):
            raise ConfigError(f"{what}: model file {path!r} not found on host {self.host.name}; "
                              "fix the path in the params file or with -p")
        return path

    def prepare(self) -> EngineIdentity:
        """Find or build llama-server, resolve target and draft paths (fails before any launch)."""
        p = self.params
        if p.engine_bin == "auto":
            self.binary = self.engine_binary(self.host)
        else:
            self.binary = self.host.expand(p.engine_bin)
            if not self.host.run(["test", "-x", self.binary], check=False).ok:
                raise ConfigError(f"engine_bin: {self.binary!r} is not an executable on host {self.host.name}; "
                                  "give the path of llama-server, or 'auto' to build it locally")
        self.models["model"] = self._resolve_model(p.model, "model")
        for arm in p.arms:
            self._check_arm(arm)
            draft = p.arm_draft(arm)
            if arm.method in ("draft", "eagle3"):
                if not draft:
                    raise ConfigError(f"arms[{arm.name}].draft: method {arm.method!r} needs a draft model; set "
                                      "`draft` at the top level or on the arm")
                self.models.setdefault(draft, self._resolve_model(draft, f"arms[{arm.name}].draft"))
        out = EngineIdentity(binary=self.binary, models=dict(self.models))
        if self.uploads:
            out.uploads = list(self.uploads)
        self.resolved = True
        return out

    # --- several nodes: an rpc-server on each other node, `--rpc` on the head -----------------------------
    def worker_port(self) -> int:
        return self.config.rpc_port

    def prepare_workers(self, head_addr: str, nodes: list[Worker]) -> Workers:
        """spectrial's rpc-server on each other node (uploaded with `engine_bin: auto`, else the one next to the
        given llama-server), and whether stdbuf is there to line-buffer its log."""
        if self.params.engine_bin == "auto":
            paths = on_each([(n.name, lambda n=n: self.engine_binary(n.host, "rpc-server")) for n in nodes])
        else:
            paths = [f"{str(self.binary).rsplit('/', 1)[0]}/rpc-server" for _ in nodes]
            for n, path in zip(nodes, paths, strict=True):
                if not n.host.run(["test", "-x", path], check=False).ok:
                    raise ConfigError(f"engine_bin: no executable rpc-server at {path} on {n.name}; spectrial "
                                      "looks for it next to engine_bin (or use engine_bin: auto)")
        stdbuf = on_each([(n.name, lambda n=n: n.host.which("stdbuf") is not None) for n in nodes])
        return Workers(head_addr, [dataclasses.replace(n, binary=path, line_buffered=buffered)
                                   for n, path, buffered in zip(nodes, paths, stdbuf, strict=True)])

    def worker_specs(self, head: LaunchSpec, arm: Arm, workers: Workers) -> list[WorkerSpec]:
        start = head.name.removeprefix("llama-server-")  # arm name plus the restart suffix: one log per start
        return [WorkerSpec(n, self.rpc_worker_spec(arm, n, name=f"rpc-server-{start}-node{n.rank}"), True)
                for n in workers.nodes]

    def rpc_worker_spec(self, arm: Arm, node: Worker, name: str) -> LaunchSpec:
        """`rpc-server -H ADDR -p PORT` for one other node of `hosts:`; ready once it listens on its port.

        rpc-server reports connections with printf, block-buffered into a log file and lost when it is
        stopped: with stdbuf on the node (`line_buffered`) it runs under `stdbuf -oL` (coreutils) so the log
        shows them as they happen.
        """
        port, addr, host = self.config.rpc_port, node.addr, node.host
        argv = [*(["stdbuf", "-oL"] if node.line_buffered else []), str(node.binary), "-H", addr, "-p", str(port)]
        if self.config.threads:
            argv += ["-t", str(self.config.threads)]

        def listening(client: httpx.Client, base_url: str) -> Probe:
            holders = host.port_holders(port)
            return Probe(bool(holders), f"listening on {addr}:{port}" if holders else f"{addr}:{port} not open")

        return LaunchSpec(argv=argv, env={**self.params.env, **arm.env}, port=port, probe=listening,
                          name=name, bind=addr, http=False)

    def resolve_dry(self) -> None:
        """Paths as they would be used, without building or checking anything."""
        from spectrial.engines.llamacpp_build import binary_path

        p = self.params
        self.binary = str(binary_path("llama-server", self.config.cuda, self.config.cuda_arch)) \
            if p.engine_bin == "auto" else p.engine_bin
        self.models["model"] = p.model
        for arm in p.arms:
            self._check_arm(arm)
            draft = p.arm_draft(arm)
            if draft:
                self.models.setdefault(draft, draft)
        self.resolved = True

    def _check_arm(self, arm: Arm) -> None:
        p = self.params
        if arm.method not in ("none", *SPEC_TYPES):
            raise ConfigError(f"arms[{arm.name}].method: llama.cpp supports none, {', '.join(SPEC_TYPES)}; "
                              f"got {arm.method!r}")
        if arm.speculative:
            if p.arm_topk(arm) != 1:
                raise ConfigError(f"arms[{arm.name}].topk: llama.cpp drafts a chain; use topk 1")
            dt = p.arm_draft_tokens(arm)
            if dt is not None and dt != p.arm_steps(arm) + 1:
                raise ConfigError(f"arms[{arm.name}].draft_tokens: llama.cpp verifies steps + 1 = "
                                  f"{p.arm_steps(arm) + 1} tokens per cycle; leave draft_tokens unset")
            synth_rates(arm.synthetic_accept, p.arm_steps(arm))
        elif arm.synthetic_accept is not None:
            raise ConfigError(f"arms[{arm.name}].synthetic_accept: only speculative arms take synthetic acceptance")

    def slots(self) -> tuple[int | None, str]:
        """Requests llama-server decodes at once: -np (engine_config.parallel, else the trial's concurrency)."""
        return self.config.parallel or self.params.concurrency, "engine_config.parallel (-np)"

    def build_spec(self, arm: Arm, workers: Workers | None = None) -> LaunchSpec:
        """argv for one arm (server flags with -np = the slots and -c = ctx_size x slots, speculative flags,
        extra args)."""
        p = self.params
        slots = self.slots()[0] or 1
        c = self.config.model_copy(update={"parallel": slots, "ctx_size": self.config.ctx_size * slots})
        self._check_arm(arm)
        argv = [str(self.binary), "-m", self.models["model"], "--host", p.bind, "--port", str(p.port),
                *render(SERVER_FLAGS, c)]
        rpc = [*c.rpc, *(f"{n.addr}:{c.rpc_port}" for n in (workers.nodes if workers else []))]
        if rpc:
            argv += ["--rpc", ",".join(rpc)]
        if arm.speculative:
            steps = p.arm_steps(arm)
            argv += ["--spec-type", SPEC_TYPES[arm.method], "--spec-draft-n-max", str(steps)]
            has_draft = arm.method in ("draft", "eagle3")
            if has_draft:
                argv += ["-md", self.models[p.arm_draft(arm) or ""]]
            argv += render(DRAFT_FLAGS, c, active=frozenset({"draft_model"} if has_draft else ()))
            rates = synth_rates(arm.synthetic_accept, steps)
            if rates:
                argv += ["--spec-synth-rates", ",".join(f"{r:g}" for r in rates)]
        if arm.policy is not None and arm.speculative:
            argv += self.policy_launch(arm.policy, p.arm_steps(arm), p.arm_topk(arm), f"arms[{arm.name}]")[1]
        argv += [*c.extra_args, *arm.extra_args]
        return LaunchSpec(argv=argv, env={**p.env, **arm.env}, port=p.port, probe=probe, name=f"llama-server-{arm.name}",
                          bind=p.bind, term_again_s=TERM_AGAIN_S, exit_rule=classify_exit)

    def version(self) -> EngineIdentity:
        if self.binary is None:
            return EngineIdentity()
        res = self.host.run(f"{shlex.quote(self.binary)} --version 2>&1", check=False, timeout=60)
        lines = [ln.strip() for ln in res.stdout.splitlines() if ln.startswith(("version", "built with"))]
        return EngineIdentity(engine="llamacpp", binary=self.binary, version=" | ".join(lines) or res.stdout[-200:])

    # --- benchmark hooks -----------------------------------------------------------------------------
    def completion_payload(self, prompt: str, max_tokens: int) -> RequestBody:
        body = super().completion_payload(prompt, max_tokens)
        body.update(cache_prompt=self.config.cache_prompt, stream_options={"include_usage": True})
        return body

    def chat_payload(self, messages: list[ChatMessage], max_tokens: int) -> RequestBody:
        body = super().chat_payload(messages, max_tokens)
        body.update(cache_prompt=self.config.cache_prompt, stream_options={"include_usage": True})
        return body

    def chat_template_note(self) -> str:
        return ("the server's: llama-server renders the GGUF's tokenizer.chat_template with its jinja engine "
                "(ChatML when the model has none)")

    def context_tokens(self) -> int | None:
        """The context of one slot (-c / -np = ctx_size)."""
        return self.config.ctx_size

    def server_lengths(self, base_url: str, chat: bool) -> Lengths | None:
        """Lengths by llama-server's own tokenizer: the prompt as the server builds it (chat: `/apply-template`
        of the messages, then `/tokenize` with the BOS; completion: `/tokenize` with the BOS), the reference
        output without specials."""
        def count(items: Sequence[WorkItem]) -> list[tuple[int, int | None]]:
            out: list[tuple[int, int | None]] = []
            with bounded_client(Limits(deadline_s=60, read_s=60, max_bytes=PROBE.max_bytes)) as client:
                def tokens(text: str, special: bool) -> int:
                    r = client.post(f"{base_url}/tokenize", json={"content": text, "add_special": special})
                    r.raise_for_status()
                    return len(r.json()["tokens"])

                for it in items:
                    text = it.completion_text()
                    if chat:
                        r = client.post(f"{base_url}/apply-template", json={"messages": it.chat_messages()})
                        r.raise_for_status()
                        text = r.json()["prompt"]
                    out.append((tokens(text, True), tokens(it.reference, False) if it.reference else None))
            return out

        return count

    def request_stats(self, final: dict[str, Any]) -> ServerRequestStats:
        """llama-server's `timings` of the last chunk (prompt_n, predicted_ms, draft_n_accepted, cache_n, ...)."""
        t = Timings.model_validate(final.get("timings") or {})
        return ServerRequestStats(**{f"server_{k}": v for k, v in t.model_dump(exclude_none=True).items()})

    @classmethod
    def policy_launch(cls, policy: Mapping[str, Any], steps: int, topk: int, where: str
                      ) -> tuple[dict[str, Any], list[str]]:
        """llama.cpp's draft-time controls: `p_min` (--spec-draft-p-min: drafting stops at a token whose greedy
        probability is below it) and `n_min` (--spec-draft-n-min: a draft shorter than it is not verified)."""
        cls.policy_keys(policy, {"p_min": "--spec-draft-p-min, 0-1", "n_min": "--spec-draft-n-min, 0-steps"}, where)
        out = []
        if "p_min" in policy:
            v = policy["p_min"]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
                raise ConfigError(f"{where}.policy.p_min: a probability in [0, 1] (got {v!r})",
                                  parameter=f"{where}.policy.p_min")
            out += ["--spec-draft-p-min", f"{float(v):g}"]
        if "n_min" in policy:
            v = policy["n_min"]
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= steps:
                raise ConfigError(f"{where}.policy.n_min: a whole number of tokens in [0, steps = {steps}] (got "
                                  f"{v!r})", parameter=f"{where}.policy.n_min")
            out += ["--spec-draft-n-min", str(v)]
        return {}, out

    @classmethod
    def deploy_flags(cls, method: str, steps: int, topk: int | None, draft_tokens: int | None) -> list[str]:
        return ["--spec-type", SPEC_TYPES.get(method, method), "--spec-draft-n-max", str(steps)]

    def config_readback(self, arm: Arm, probe: ServerProbe, log: str) -> list[ConfigSetting]:
        """GET /props (model_path, total_slots), GET /slots (n_ctx and speculative per slot; the types a slot ran,
        after the warm-up) and the startup log (the draft model loaded). The draft depth is not exposed."""
        obs = ObservedServer(url=probe.url)
        if not self.identify(probe, obs):
            return [setting("server", "llama-server /props", "llama-server", None,
                            "GET /props did not answer with build_info")]
        p, props = self.params, probe.json("/props") or {}
        slots = probe.json("/slots")
        ctx = sorted({s.get("n_ctx") for s in slots if isinstance(s, dict) and isinstance(s.get("n_ctx"), int)}) \
            if isinstance(slots, list) else []
        out = [
            setting("model", "model file (-m)", self.models.get("model"), props.get("model_path"),
                    "GET /props model_path"),
            setting("slots", "slots (-np)", self.slots()[0] or 1, obs.slots,
                    obs.found.get("slots", "GET /props has no total_slots")),
            setting("context", "context per slot (-c / -np)", self.config.ctx_size,
                    (ctx[0] if len(ctx) == 1 else ctx) if ctx else None,
                    "GET /slots n_ctx" if ctx else "GET /slots is off (--no-slots) or names no n_ctx"),
            setting("speculative", "speculation on", arm.speculative, obs.speculative,
                    obs.found.get("speculative", "GET /slots names no speculative")),
        ]
        if arm.speculative:
            ran = obs.settings.get("slots.speculative.types")
            out.append(setting("method", "speculative type (--spec-type)", SPEC_TYPES[arm.method],
                               ",".join(t for t in str(ran).split(",") if t.strip() not in ("", "none")) if ran
                               else None, obs.found.get("method", "GET /slots: no slot has served a request "
                                                                  "(warm-up 0) to name its types")))
            if arm.method in ("draft", "eagle3"):
                rows = parse(log, "llamacpp:draft_model") if log else None
                got = str(rows["draft_model"].iloc[-1]) if rows is not None and len(rows) else None
                out.append(setting("draft_model", "draft model (-md)", self.models.get(p.arm_draft(arm) or ""), got,
                                   "startup log: loading draft model" if got else
                                   "startup log: no 'loading draft model' line in its last 1 MiB"))
            out.append(setting("steps", "draft depth (--spec-draft-n-max)", p.arm_steps(arm), None,
                               "llama-server reports no draft depth (/props, /slots or its log)"))
        return out

    per_request_counters = True  # verify steps per request (timings give drafted and accepted, not the steps)

    def request_counter_stats(self, before: dict[str, float], after: dict[str, float]) -> ServerRequestStats:
        """Verify steps of one request (concurrency 1): the drafts counter read around it."""
        steps = metrics.delta(before, after, METRIC_PREFIX + "spec_decode_num_drafts_total")
        return ServerRequestStats(server_verify_steps=steps or None)

    def window_stats(self, w: Window) -> WindowStats:
        return llamacpp_window_stats(w)


class Timings(BaseModel):
    """llama-server's `timings` object of a completion's last chunk (the fields spectrial keeps)."""

    model_config = ConfigDict(extra="ignore")

    prompt_n: int | None = None
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    predicted_per_second: float | None = None
    draft_n: float | None = None
    draft_n_accepted: float | None = None
    cache_n: int | None = None


def classify_exit(how: str, code: int | None, log_tail: str) -> tuple[bool | None, list[str]]:
    """As `server.classify_exit`, and exit 1 right after spectrial's second SIGTERM (llama-server's "Received
    second interrupt, terminating immediately": it was still busy with a request) is clean too."""
    if how != "KILL" and code == 1 and "Received second interrupt" in log_tail:
        return True, ["exit code 1 on spectrial's second SIGTERM (a request was still in flight)"]
    return server_classify_exit(how, code, log_tail)


def probe(client: httpx.Client, base_url: str) -> Probe:
    """llama-server is ready when `/health` answers 200 (503 'Loading model' before)."""
    r = client.get(f"{base_url}/health")
    if r.status_code == 200:
        return Probe(True, "200 ok")
    return Probe(False, f"{r.status_code} {r.text[:80]}")


WATCH_METRICS = WatchMetrics(
    engine="llamacpp", verify_steps=METRIC_PREFIX + "spec_decode_num_drafts_total",
    drafted=METRIC_PREFIX + "spec_decode_num_draft_tokens_total",
    accepted=METRIC_PREFIX + "spec_decode_num_accepted_tokens_total",
    accepted_per_pos=METRIC_PREFIX + "spec_decode_num_accepted_tokens_per_pos_total",
    tokens=METRIC_PREFIX + "tokens_predicted_total", requests_running=METRIC_PREFIX + "requests_processing",
    requests_waiting=METRIC_PREFIX + "requests_deferred")  # llama-server exports no process start time


def watch_totals(snap: dict[str, float]) -> CounterTotals:
    """One `/metrics` snapshot's cumulative totals (the counters `llamacpp_window_stats` subtracts) and the load
    gauges (`requests_processing`, `requests_deferred`), by `WATCH_METRICS`."""
    return metrics.watch_totals(WATCH_METRICS, snap)


def llamacpp_window_stats(w: Window) -> WindowStats:
    """Counters of the benchmark window (after - before) plus drafting time from the log's statistics."""
    st = WindowStats(source="metrics")
    st.verify_steps = w.delta(METRIC_PREFIX + "spec_decode_num_drafts_total")
    st.drafted = w.delta(METRIC_PREFIX + "spec_decode_num_draft_tokens_total")
    st.accepted = w.delta(METRIC_PREFIX + "spec_decode_num_accepted_tokens_total")
    st.tokens = w.delta(METRIC_PREFIX + "tokens_predicted_total")
    secs = w.delta(METRIC_PREFIX + "tokens_predicted_seconds_total")
    st.decode_ms = secs * 1000 if secs is not None else None
    per_pos = metrics.delta_by_label(w.before, w.after, METRIC_PREFIX + "spec_decode_num_accepted_tokens_per_pos_total",
                             "position")
    if per_pos and st.verify_steps:
        st.per_position = [per_pos[k] / st.verify_steps for k in sorted(per_pos, key=int)]
    cached = w.delta(METRIC_PREFIX + "prompt_tokens_cached_total")  # prompt tokens reused from the slot's cache
    processed = w.delta(METRIC_PREFIX + "prompt_tokens_total")
    if cached is None:  # builds without the counter: each response's timings.cache_n
        cache_n = [r.server_cache_n for r in w.ok_requests]
        prompt_n = [r.server_prompt_n for r in w.ok_requests]
        if cache_n and None not in cache_n and None not in prompt_n:
            cached, processed = float(sum(c or 0 for c in cache_n)), float(sum(n or 0 for n in prompt_n))
    if cached is not None and processed is not None:
        st.prompt_tokens, st.cached_prompt_tokens = processed + cached, cached
    if not w.after:
        st.scoped, st.source = False, "none (no /metrics)"
    st.draft_ms = draft_ms_from_log(w)
    return st


def draft_ms_from_log(w: Window) -> float | None:
    """Drafting time inside the window: last cumulative `statistics` g-duration minus the one before it."""
    stats = w.log.rows("spec_statistics")
    if stats.empty:
        return None
    inside = stats[(stats["line"] >= w.first_line) & (stats["line"] <= w.last_line)]
    if inside.empty:
        return None
    end = float(inside["draft_ms_total"].iloc[-1])
    prior = stats[stats["line"] < w.first_line]
    begin = float(prior["draft_ms_total"].iloc[-1]) if not prior.empty else 0.0
    return end - begin


def ready_offset_s(log_text: str) -> float | None:
    """Seconds from llama-server's start to its own "model loaded" line, from the line's relative timestamp.

    llama.cpp prefixes log lines with the time since the process started, `M.SS.mmm.uuu` (minutes, seconds,
    milliseconds, microseconds), e.g. `0.05.756.667 I srv  main: model loaded` is 5.756667 s.
    """
    for line in log_text.splitlines():
        if READY_LINE in line:
            m = _LOG_TS_RE.match(line)
            if m:
                return int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1e3 + int(m[4]) / 1e6
    return None
