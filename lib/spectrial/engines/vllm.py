"""vLLM `vllm serve`: speculative decoding through one `--speculative-config` JSON.

Arms map to the JSON's `method` (vLLM's SpeculativeConfig): eagle3 -> "eagle3", eagle -> "eagle",
draft -> "draft_model", ngram -> "ngram", nextn -> "mtp"; `model` is the draft (none for ngram/mtp),
`num_speculative_tokens` the arm's steps. vLLM drafts a chain here: topk must be 1 and draft_tokens (if
given) steps + 1.
Readiness: nothing listens while the model loads (connection refused), then `/health` answers 200.
Stats: `/metrics` counters before/after the window (prometheus_client's parser):
`vllm:spec_decode_num_drafts_total` (= verify steps), `..._num_draft_tokens_total`,
`..._num_accepted_tokens_total`, `..._num_accepted_tokens_per_pos_total{position}`; decode time from the
client's stream timing (as for SGLang).
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from spectrial import metrics
from spectrial.engines.base import Engine, Window, client_decode, register
from spectrial.engines.flags import Flag, general, render
from spectrial.engines.nccl_evidence import DEBUG_ENV
from spectrial.engines.sglang import is_hf_id
from spectrial.errors import ConfigError
from spectrial.params import Arm
from spectrial.schema import WindowStats
from spectrial.server import LaunchSpec, Probe

METHODS = {"eagle3": "eagle3", "eagle": "eagle", "draft": "draft_model", "ngram": "ngram", "nextn": "mtp"}
NEEDS_DRAFT = ("eagle3", "eagle", "draft")
OWN_FLAGS = ("--speculative-config", "--spec-method", "--spec-model", "--spec-tokens", "--host", "--port",
             "--tensor-parallel-size", "-tp")
PREFIX = "vllm:spec_decode_"
SERVER_FLAGS = (Flag("served_model_name", "--served-model-name"),
                Flag("gpu_memory_utilization", "--gpu-memory-utilization", fmt=general),
                Flag("max_model_len", "--max-model-len"), Flag("trust_remote_code", "--trust-remote-code", switch=True),
                Flag("enforce_eager", "--enforce-eager", switch=True))


class VLLMConfig(BaseModel):
    """vLLM-specific settings (`engine_config:` in params)."""

    model_config = ConfigDict(extra="forbid")

    vllm: str = Field("vllm", description="The `vllm` executable on the host (engine_bin 'auto' uses it; a "
                                          "non-'auto' engine_bin overrides it).")
    tensor_parallel_size: int = Field(1, ge=1, description="--tensor-parallel-size: one GPU per rank.")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="--gpu-memory-utilization.")
    max_model_len: int | None = Field(None, ge=16, description="--max-model-len.")
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
    nccl_evidence_check: Literal["fail", "warn"] = Field("warn", description="'fail': a requested NCCL_* "
                                                         "variable not reported by NCCL on every rank fails "
                                                         "the arm.")
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


@register("vllm")
class VLLM(Engine):
    """vLLM's OpenAI-compatible server."""

    config_model = VLLMConfig

    def __init__(self, params, host) -> None:  # type: ignore[no-untyped-def]
        super().__init__(params, host)
        self.binary: str | None = None
        self.identity: dict[str, Any] = {}
        self.paths: dict[str, str] = {}
        self.notes: list[str] = []

    def _resolve_path(self, ref: str, what: str) -> str:
        path = self.host.expand(ref)
        if self.host.exists(path):
            return path
        if is_hf_id(ref):
            self.notes.append(f"{what}: {ref!r} taken as a Hugging Face repo id (not checked)")
            return ref
        raise ConfigError(f"{what}: {path!r} not found on host {self.host.name}; fix the path")

    def prepare(self) -> dict[str, Any]:
        """Find `vllm` and its version, check model paths and GPUs, validate every arm."""
        from spectrial.gpu import query

        p, c = self.params, self.config
        self.binary = p.engine_bin if p.engine_bin != "auto" else c.vllm
        res = self.host.run(f"{shlex.quote(self.binary)} --version 2>&1", check=False, timeout=300)
        if not res.ok:
            raise ConfigError(f"engine_bin: {self.binary!r} does not run on host {self.host.name} (exit "
                              f"{res.exit_code}: {res.stdout.strip()[-200:]}); give the vllm executable")
        self.identity = {"binary": self.binary, "vllm_version": res.stdout.strip().splitlines()[-1]}
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
        self.resolved = True
        for arm in p.arms:
            self.launch_spec(arm)
        return {"binary": self.binary, "models": dict(self.paths), "notes": list(self.notes)}

    def resolve_dry(self) -> None:
        p = self.params
        self.binary = p.engine_bin if p.engine_bin != "auto" else self.config.vllm
        self.paths["model"] = p.model
        self.resolved = True

    def _env(self, arm: Arm) -> dict[str, str]:
        env = dict(self.params.env)
        if self.config.nccl_debug:
            env.update(DEBUG_ENV)
        return {**env, **arm.env}

    def build_spec(self, arm: Arm) -> LaunchSpec:
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
        argv = [str(self.binary), "serve", self.paths.get("model", p.model), "--host", p.bind, "--port",
                str(p.port), "--tensor-parallel-size", str(c.tensor_parallel_size), *render(SERVER_FLAGS, c)]
        if spec_cfg is not None:
            argv += ["--speculative-config", json.dumps(spec_cfg, separators=(",", ":"))]
        argv += [*c.extra_args, *arm.extra_args]
        return LaunchSpec(argv=argv, env=self._env(arm), port=p.port, probe=probe, name=f"vllm-{arm.name}",
                          bind=p.bind)

    def version(self) -> dict[str, Any]:
        return {"engine": "vllm", **self.identity}

    def completion_payload(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        body = super().completion_payload(prompt, max_tokens)
        body["model"] = self.config.served_model_name or self.paths.get("model", self.params.model)
        body["stream_options"] = {"include_usage": True}
        return body

    def window_stats(self, w: Window) -> WindowStats:
        return vllm_window_stats(w)


def probe(client: httpx.Client, base_url: str) -> Probe:
    """vLLM is ready when `/health` answers 200 (connection refused while the model loads)."""
    r = client.get(f"{base_url}/health")
    return Probe(r.status_code == 200, f"{r.status_code}")


def vllm_window_stats(w: Window) -> WindowStats:
    """Spec counters of the window (after - before) and client-side decode time."""
    st = WindowStats(source="metrics")
    st.tokens, st.decode_ms = client_decode(w.ok_requests)
    st.verify_steps = w.delta(PREFIX + "num_drafts_total")
    st.drafted = w.delta(PREFIX + "num_draft_tokens_total")
    st.accepted = w.delta(PREFIX + "num_accepted_tokens_total")
    per_pos = metrics.delta_by_label(w.before, w.after, PREFIX + "num_accepted_tokens_per_pos_total", "position")
    if per_pos and st.verify_steps:
        st.per_position = [per_pos[k] / st.verify_steps for k in sorted(per_pos, key=int)]
    if not w.after:
        st.scoped, st.source = False, "none (no /metrics)"
    st.notes.append("decode time from the client's stream timing (first to last chunk per request)")
    return st
