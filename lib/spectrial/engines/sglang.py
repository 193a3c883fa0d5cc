"""SGLang `python -m sglang.launch_server`: the engine of the original investigation.

Arms map to flags as follows (checked against SGLang 0.5.10.post1's own argument parser):
    none   -> no speculative flags
    eagle3 -> --speculative-algorithm EAGLE3 --speculative-draft-model-path D --speculative-num-steps S
              --speculative-eagle-topk K --speculative-num-draft-tokens N
    eagle  -> EAGLE (same flags); nextn -> NEXTN (draft optional: MTP layers of the target);
    draft  -> STANDALONE (a small LM as draft); ngram -> NGRAM (--speculative-num-draft-tokens only)
Rules mirrored from SGLang's ServerArgs: topk == 1 needs N == S + 1 (SGLang silently adjusts; spectrial
refuses unless `adjust_draft_tokens`), S unset (`auto_speculative_params`) needs K and N unset too, an
EAGLE-3 draft under algorithm EAGLE (accept length exactly 1.00) is refused.
Version-aware flags (seen in the wheels): `--cuda-graph-max-bs` up to 0.5.13, `--cuda-graph-max-bs-decode`
from 0.5.14 (the old one a deprecated alias until 0.5.19, gone in 0.5.20 where it is an ambiguous prefix).
Readiness: `/health` is 503 until SGLang's own warm-up request has run, then 200.
Stats, best first: `/metrics` counters `sglang:spec_verify_calls_total` + `sglang:generation_tokens_total`
(SGLang >= 0.5.14 with --enable-metrics; absent in 0.5.10.post1) before/after the window; per-request
`meta_info` (native `/generate`); the `Decode batch ... accept len` log lines inside the window; last,
`/server_info` `avg_spec_accept_length` (fallback `/get_server_info`), cumulative since start: not scoped.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections.abc import Mapping
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from spectrial.engines.base import (
    Engine,
    EngineIdentity,
    HostProbe,
    ServerProbe,
    Window,
    Worker,
    Workers,
    WorkerSpec,
    client_decode,
    register,
)
from spectrial.engines.flags import Flag, Version, general, render
from spectrial.engines.nccl_evidence import DEBUG_ENV
from spectrial.errors import ConfigError
from spectrial.measure import metrics
from spectrial.measure.bench import ChatMessage, Payload, RequestBody, Sampling
from spectrial.measure.workloads import ChatTemplate, hf_chat_template
from spectrial.params import Arm
from spectrial.schema import (
    ConfigSetting,
    CounterTotals,
    GitSource,
    ObservedServer,
    ServerRequestStats,
    WatchMetrics,
    WindowStats,
)
from spectrial.secrets import mask_launch
from spectrial.servers.configcheck import setting
from spectrial.servers.lifecycle import LaunchSpec, Probe

ALGORITHMS = {"eagle3": "EAGLE3", "eagle": "EAGLE", "nextn": "NEXTN", "draft": "STANDALONE", "ngram": "NGRAM"}
NEEDS_DRAFT = ("eagle3", "eagle", "draft")
NEWEST_KNOWN = (0, 5, 23)
CUDA_GRAPH_DECODE_SINCE = (0, 5, 14)  # --cuda-graph-max-bs-decode appears; --cuda-graph-max-bs deprecated
CUDA_GRAPH_OLD_REMOVED = (0, 5, 20)  # --cuda-graph-max-bs gone (argparse: ambiguous prefix)
SPEC_FLAGS = ("--speculative-algorithm", "--speculative-draft-model-path", "--speculative-draft-model",
              "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")
OWN_FLAGS = ("--model-path", "--model", "--tp-size", "--tensor-parallel-size", "--host", "--port")
JSON_MARK = "SPECTRIAL_JSON "
# /health runs a 1-token generation (~1 s once up; 503 after SGLANG_HEALTH_CHECK_TIMEOUT, 20 s) and uvicorn logs
# every request: poll once a second, each poll allowed 5 s
HEALTH_TIMEOUT_S, HEALTH_POLL_S = 5.0, 1.0

_VERSION_RE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")
_EAGLE3_NAME_RE = re.compile(r"eagle-?3", re.IGNORECASE)

PROBE_SCRIPT = """\
import json, os, sys
out = {"python": sys.executable, "python_version": sys.version.split()[0]}
try:
    import sglang
    out["version"] = getattr(sglang, "__version__", None)
    out["package_dir"] = os.path.dirname(os.path.abspath(sglang.__file__))
except Exception as exc:
    out["error"] = type(exc).__name__ + ": " + str(exc)
print("SPECTRIAL_JSON " + json.dumps(out))
"""

PARSER_SCRIPT = """\
import argparse, contextlib, io, json, sys
argvs = json.loads(sys.argv[1])
try:
    from sglang.srt.server_args import ServerArgs
except Exception as exc:
    print("SPECTRIAL_JSON " + json.dumps({"import_error": type(exc).__name__ + ": " + str(exc)}))
    sys.exit(0)
results = []
for argv in argvs:
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        results.append({"ok": False, "error": lines[-1] if lines else "argparse exited"})
        continue
    results.append({"ok": True, "args": {k: v for k, v in vars(ns).items()
                                         if k.startswith("speculative_") or k in (
                                             "model_path", "tp_size", "tensor_parallel_size", "host", "port",
                                             "mem_fraction_static", "cuda_graph_max_bs",
                                             "cuda_graph_max_bs_decode", "enable_metrics")}})
print("SPECTRIAL_JSON " + json.dumps({"results": results}, default=str))
"""


class SGLangConfig(BaseModel):
    """SGLang-specific settings (`engine_config:` in params)."""

    model_config = ConfigDict(extra="forbid")

    python: str = Field("python3", description="Python on the host that imports sglang (engine_bin 'auto' "
                                               "uses it; a non-'auto' engine_bin overrides it).")
    tp_size: int = Field(1, ge=1, description="--tp-size: tensor-parallel ranks, one GPU each.")
    mem_fraction_static: float | None = Field(None, gt=0, lt=1, description="--mem-fraction-static.")
    trust_remote_code: bool = Field(False, description="--trust-remote-code.")
    cuda_graph_max_bs: int | None = Field(None, ge=1, description="Largest CUDA-graph decode batch: "
                                          "--cuda-graph-max-bs before SGLang 0.5.14, --cuda-graph-max-bs-decode "
                                          "from 0.5.14 (chosen by the installed version).")
    num_continuous_decode_steps: int | None = Field(None, ge=1, description="--num-continuous-decode-steps.")
    disable_custom_all_reduce: bool = Field(False, description="--disable-custom-all-reduce (all-reduce "
                                                               "through NCCL).")
    max_running_requests: int | None = Field(None, ge=1, description="--max-running-requests (SGLang forces 48 "
                                             "for EAGLE/NGRAM unless given).")
    decode_log_interval: int | None = Field(None, ge=1, description="--decode-log-interval: decode steps per "
                                            "'Decode batch' log line (SGLang default 40).")
    disable_radix_cache: bool = Field(True, description="--disable-radix-cache (on by default: a prompt served from "
                                      "the radix cache skips the prefill the other arms paid; the prefix_cache "
                                      "validity check reads each response's meta_info cached_tokens).")
    enable_metrics: bool = Field(True, description="--enable-metrics: Prometheus /metrics, whose counters "
                                 "(SGLang >= 0.5.14) scope accept length to the benchmark window.")
    random_seed: int | None = Field(None, description="--random-seed.")
    adjust_draft_tokens: bool = Field(False, description="topk 1 with draft_tokens != steps + 1: warn and use "
                                      "steps + 1 (as SGLang does silently) instead of an error.")
    auto_speculative_params: bool = Field(False, description="Leave steps/topk/draft tokens to SGLang's "
                                          "auto-choice (no --speculative-num-* flags); then topk and "
                                          "draft_tokens must not be set.")
    nccl_debug: bool = Field(False, description="Add NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV to the launch "
                             "env and record, per rank, what NCCL reports it used.")
    nccl_evidence_check: Literal["fail", "warn"] | None = Field(
        None, description="With nccl_debug: 'fail' fails the arm when a requested NCCL_* variable is not reported by "
                          "NCCL on every rank (or with another value), 'warn' records it; default: fail on a "
                          "multi-GPU launch (tp_size > 1 or several nodes) that requests NCCL_* variables, else warn.")
    sglang_version: str | None = Field(None, description="SGLang version when the host cannot be asked (dry "
                                       "runs); must match the host's when it can. Unset in a dry run: the "
                                       "newest known flag set.")
    check_args_on_host: bool = Field(True, description="Before launching, parse every arm's argv with the "
                                     "host's own sglang.srt.server_args parser.")
    extra_args: list[str] = Field(default_factory=list, description="Arguments appended to every arm.")
    client_api: Literal["openai", "native"] = Field(
        "openai", description="Benchmark through /v1/completions (openai) or the native /generate, whose final "
                              "chunk carries per-request meta_info (spec_verify_ct, spec_accept_length).")
    tiny: dict[str, Any] = Field(default_factory=dict, description="Knobs of spectrial's HF-format tiny models "
                                 "(`model: tiny:target`, drafts `tiny:eagle3`, `tiny:draft`): kind counting|random, "
                                 "shape (tiny|llama3-8b), n_layers, vocab_size, seed.")
    pythonpath: list[str] = Field(default_factory=list, description="Directories prepended to PYTHONPATH on "
                                  "the launch env (e.g. a patched SGLang checkout, or a test double).")


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """'0.5.10.post1' -> (0, 5, 10); None when unreadable."""
    m = _VERSION_RE.match(text or "")
    return (int(m[1]), int(m[2]), int(m[3] or 0)) if m else None


# engine_config fields -> flags, in argv order; flags that changed name carry one entry per version
SERVER_FLAGS = (
    Flag("trust_remote_code", "--trust-remote-code", switch=True),
    Flag("mem_fraction_static", "--mem-fraction-static", fmt=general),
    Flag("cuda_graph_max_bs", {(0, 0, 0): "--cuda-graph-max-bs", CUDA_GRAPH_DECODE_SINCE: "--cuda-graph-max-bs-decode"}),
    Flag("num_continuous_decode_steps", "--num-continuous-decode-steps"),
    Flag("disable_custom_all_reduce", "--disable-custom-all-reduce", switch=True),
    Flag("max_running_requests", "--max-running-requests"),
    Flag("decode_log_interval", "--decode-log-interval"),
    Flag("enable_metrics", "--enable-metrics", switch=True),
    Flag("disable_radix_cache", "--disable-radix-cache", switch=True),
    Flag("random_seed", "--random-seed"),
)


def cuda_graph_flag(version: Version | None) -> str:
    """The CUDA-graph max batch flag of this SGLang version (newest when unknown)."""
    return next(f for f in SERVER_FLAGS if f.field == "cuda_graph_max_bs").name(version)


def check_version_flags(args: list[str], version: tuple[int, int, int] | None, where: str) -> None:
    """Refuse pass-through flags that this SGLang version does not have."""
    v = version or NEWEST_KNOWN
    vs = ".".join(map(str, v))
    for a in args:
        flag = a.split("=", 1)[0]
        if flag == "--cuda-graph-max-bs" and v >= CUDA_GRAPH_OLD_REMOVED:
            raise ConfigError(f"{where}: SGLang {vs} has no --cuda-graph-max-bs (removed in 0.5.20; argparse "
                              "calls it ambiguous); set engine_config.cuda_graph_max_bs and spectrial writes "
                              "--cuda-graph-max-bs-decode")
        if flag in ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill") and v < CUDA_GRAPH_DECODE_SINCE:
            raise ConfigError(f"{where}: SGLang {vs} has no {flag} (added in 0.5.14); set "
                              "engine_config.cuda_graph_max_bs and spectrial writes --cuda-graph-max-bs")


def speculative_args(method: str, steps: int, topk: int, draft_tokens: int | None, draft: str | None, *,
                     adjust: bool, auto: bool, where: str) -> tuple[list[str], list[str]]:
    """SGLang's speculative flags for one arm, validated as SGLang's ServerArgs would; (argv, notes)."""
    if method == "none":
        return [], []
    if method not in ALGORITHMS:
        raise ConfigError(f"{where}.method: SGLang supports none, {', '.join(ALGORITHMS)}; got {method!r}")
    algo, notes = ALGORITHMS[method], []
    if method in NEEDS_DRAFT and not draft:
        raise ConfigError(f"{where}.draft: method {method!r} ({algo}) needs a draft model; set `draft` at the "
                          "top level or on the arm")
    if method == "eagle" and draft and _EAGLE3_NAME_RE.search(draft):
        raise ConfigError(f"{where}: draft {draft!r} looks like an EAGLE-3 draft but method is 'eagle' "
                          "(SGLang algorithm EAGLE): that runs with accept length exactly 1.00; use method eagle3")
    argv = ["--speculative-algorithm", algo]
    if draft and method != "ngram":
        argv += ["--speculative-draft-model-path", draft]
    if method == "ngram":
        if topk != 1:
            raise ConfigError(f"{where}.topk: SGLang's NGRAM sets topk from --speculative-ngram-max-bfs-breadth; "
                              "leave topk at 1 and pass that flag in extra_args")
        argv += ["--speculative-num-draft-tokens", str(draft_tokens or steps + 1)]
        return argv, notes
    if auto:
        return argv, ["speculative steps/topk/draft tokens left to SGLang's auto-choice"]
    if topk == 1:
        want = steps + 1
        if draft_tokens is not None and draft_tokens != want:
            msg = (f"{where}.draft_tokens: with topk 1 SGLang verifies steps + 1 = {want} tokens per cycle, "
                   f"not {draft_tokens}")
            if not adjust:
                raise ConfigError(msg + "; set draft_tokens to steps + 1 or leave it unset (or set "
                                        "engine_config.adjust_draft_tokens: true to adjust with a warning)")
            warnings.warn(msg + f": adjusted to {want}", stacklevel=3)
            notes.append(msg + f": adjusted to {want}")
        draft_tokens = want
    elif draft_tokens is None:
        raise ConfigError(f"{where}.draft_tokens: with topk {topk} give draft_tokens (the tree nodes verified "
                          "per cycle, e.g. 8 for steps 5 topk 4)")
    elif draft_tokens < 2:
        raise ConfigError(f"{where}.draft_tokens: must be at least 2 with topk > 1, got {draft_tokens}")
    argv += ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
             "--speculative-num-draft-tokens", str(draft_tokens)]
    return argv, notes


def parse_marked_json(text: str) -> dict[str, Any] | None:
    """The last `SPECTRIAL_JSON {...}` line of a host script's output (engines print noise around it)."""
    for line in reversed(text.splitlines()):
        if line.startswith(JSON_MARK):
            try:
                return json.loads(line[len(JSON_MARK):])
            except json.JSONDecodeError:
                return None
    return None


def check_with_parser(host: Any, python: str, argvs: list[list[str]], env: dict[str, str] | None = None,
                      timeout: float = 600) -> dict[str, Any]:
    """Parse argv lists (after `-m sglang.launch_server`) with the host's own SGLang argument parser.

    Returns {"results": [{"ok", "args"|"error"}, ...]} or {"import_error": ...}.
    """
    res = host.run([python, "-c", PARSER_SCRIPT, json.dumps(argvs)], env=env, check=False, timeout=timeout)
    out = parse_marked_json(res.stdout)
    if out is None:
        tail = (res.stderr or res.stdout).strip().splitlines()[-5:]
        return {"import_error": f"parser script failed (exit {res.exit_code}): " + " | ".join(tail)}
    return out


# SGLang's speculative algorithms -> spectrial's methods
ALGORITHM_METHODS = {"EAGLE": "eagle", "EAGLE3": "eagle3", "NEXTN": "nextn", "STANDALONE": "draft", "NGRAM": "ngram"}

@register("sglang")
class SGLang(Engine):
    """SGLang's launch_server."""

    config_model = SGLangConfig

    label = "SGLang"
    start_s = 90.0
    binary_identity = False  # a Python engine: its version says what runs
    metric_prefix = "sglang:"
    metrics_flag = "SGLang --enable-metrics (SGLang >= 0.5.14 exports the speculation counters)"
    speculation_hint = "start SGLang with --speculative-algorithm (EAGLE3, STANDALONE, NGRAM, ...) at its next restart"
    observe_config = {"enable_metrics": True}  # its adapter reads /metrics only with metrics on (observe checks them)

    @classmethod
    def identify(cls, probe: ServerProbe, obs: ObservedServer) -> bool:
        info, path = probe.json("/server_info"), "/server_info"
        if not isinstance(info, dict):
            info, path = probe.json("/get_server_info"), "/get_server_info"
        if not isinstance(info, dict) or not ("speculative_algorithm" in info or "model_path" in info):
            return False
        obs.found["_how"] = f"GET {path} has model_path / speculative_algorithm"
        if info.get("version"):
            obs.version = str(info["version"])
            obs.found["version"] = f"GET {path} version"
        if info.get("served_model_name") or info.get("model_path"):
            obs.model = str(info.get("served_model_name") or info.get("model_path"))
            obs.found["model"] = f"GET {path} " + ("served_model_name" if info.get("served_model_name")
                                                   else "model_path")
        if isinstance(info.get("max_running_requests"), int):
            obs.slots = info["max_running_requests"]
            obs.found["slots"] = f"GET {path} max_running_requests"
        if isinstance(info.get("context_length"), int):
            obs.context_tokens = info["context_length"]
            obs.found["context_tokens"] = f"GET {path} context_length"
        obs.settings.update({k: v for k, v in info.items() if k.startswith("speculative_") and v is not None})
        if "speculative_algorithm" in info:
            algo = info.get("speculative_algorithm")
            obs.speculative = bool(algo)
            obs.found["speculative"] = f"GET {path} speculative_algorithm: {algo}"
            if algo:
                obs.engine_method = str(algo)
                if (m := ALGORITHM_METHODS.get(str(algo).upper())) is not None:
                    obs.method = m
                    obs.found["method"] = f"GET {path} speculative_algorithm: {algo}"
                obs.found["engine_method"] = f"GET {path} speculative_algorithm"
        if isinstance(info.get("speculative_num_steps"), int):
            obs.steps = info["speculative_num_steps"]
            obs.found["steps"] = f"GET {path} speculative_num_steps"
        return True

    def __init__(self, params, host) -> None:  # type: ignore[no-untyped-def]
        super().__init__(params, host)
        self.python: str | None = None
        self.sglang_version: str | None = None
        self.identity = EngineIdentity()
        self.notes: list[str] = []
        self.paths: dict[str, str] = {}
        self.pythonpath: list[str] = list(self.config.pythonpath)
        self._chat_template: ChatTemplate | None = None

    # --- preparation ---------------------------------------------------------------------------------
    @property
    def version_tuple(self) -> tuple[int, int, int] | None:
        return parse_version(self.sglang_version)

    def _python_from_params(self) -> str:
        return self.params.engine_bin if self.params.engine_bin != "auto" else self.config.python

    def _base_env(self) -> dict[str, str]:
        """Variables spectrial adds to every launch (before the arm's own)."""
        p, c = self.params, self.config
        env = dict(p.env)
        if self.pythonpath:
            env["PYTHONPATH"] = ":".join([*self.pythonpath, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
        if c.nccl_debug:
            env.update(DEBUG_ENV)
        return env

    def _absolute(self, path: str) -> str:
        """A path that exists on the host, made absolute there (the server runs in its own work dir)."""
        if path.startswith("/"):
            return path
        res = self.host.run(["realpath", "--", path], check=False)
        return res.stdout.strip() if res.ok and res.stdout.strip() else path

    def _resolve_path(self, ref: str, what: str) -> str:
        return self.resolve_hf_model(ref, what, self.notes)

    def _probe_host(self) -> HostProbe:
        env = {"PYTHONPATH": self._base_env()["PYTHONPATH"]} if self.pythonpath else None
        res = self.host.run([str(self.python), "-c", PROBE_SCRIPT], env=env, check=False, timeout=300)
        info = parse_marked_json(res.stdout)
        if info is None:
            raise ConfigError(f"engine_config.python: {self.python!r} did not run on host {self.host.name} "
                              f"(exit {res.exit_code}: {(res.stderr or res.stdout).strip()[-300:]}); give the "
                              "python that has sglang installed")
        probe = HostProbe.model_validate(info)
        if probe.error is not None:
            raise ConfigError(f"engine_config.python: {self.python!r} on {self.host.name} cannot import sglang "
                              f"({probe.error}); give the python of the SGLang environment, or add a "
                              "checkout to engine_config.pythonpath")
        return probe

    def _source_identity(self, pkg_dir: str) -> GitSource | None:
        """Commit and uncommitted-diff hash when sglang is imported from a git checkout (patched SGLang)."""
        tracked = self.host.run(["git", "-C", pkg_dir, "ls-files", "--error-unmatch", "__init__.py"],
                                check=False)
        if not tracked.ok:
            return None
        commit = self.host.run(["git", "-C", pkg_dir, "rev-parse", "HEAD"], check=False).stdout.strip()
        top = self.host.run(["git", "-C", pkg_dir, "rev-parse", "--show-toplevel"], check=False).stdout.strip()
        diff = self.host.run(["git", "-C", pkg_dir, "diff", "HEAD"], check=False, timeout=120).stdout
        files = self.host.run(["git", "-C", pkg_dir, "diff", "HEAD", "--name-only"], check=False).stdout.split()
        return GitSource(toplevel=top, commit=commit, dirty=bool(diff.strip()),
                         diff_sha256=hashlib.sha256(diff.encode()).hexdigest() if diff.strip() else None,
                         diff_files=files[:50])

    def _check_gpus(self) -> None:
        from spectrial.hosts.gpu import query

        st = query(self.host)
        tp = self.config.tp_size
        if st.available:
            if tp > len(st.gpus):
                raise ConfigError(f"engine_config.tp_size: {tp} ranks need {tp} GPUs; host {self.host.name} has "
                                  f"{len(st.gpus)}: lower tp_size or pick another host")
            return
        if self.params.require_gpu:
            raise ConfigError(f"require_gpu: host {self.host.name} has no usable GPU ({st.reason}); "
                              f"tp_size {tp} cannot run there")
        self.notes.append(f"no GPU on {self.host.name} ({st.reason}): tp_size {tp} not checked against GPUs")

    def prepare(self) -> EngineIdentity:
        """Find sglang on the host, record its version and source, check paths, GPUs and every arm's argv."""
        p, c = self.params, self.config
        self.python = self._python_from_params()
        for d in c.pythonpath:
            if not self.host.exists(self.host.expand(d)):
                raise ConfigError(f"engine_config.pythonpath: {d!r} is not a directory on host {self.host.name}")
        self.pythonpath = [self._absolute(self.host.expand(d)) for d in c.pythonpath]
        info = self._probe_host()
        host_version = info.version
        if c.sglang_version and host_version and parse_version(c.sglang_version) != parse_version(host_version):
            raise ConfigError(f"engine_config.sglang_version: {c.sglang_version!r} given but host "
                              f"{self.host.name} has SGLang {host_version!r}; remove the override")
        self.sglang_version = host_version or c.sglang_version
        self.identity = EngineIdentity(python=info.python, python_version=info.python_version,
                                       sglang_version=host_version, package_dir=info.package_dir,
                                       git=self._source_identity(str(info.package_dir)))
        self.paths["model"] = self._resolve_path(p.model, "model")
        for arm in p.arms:
            draft = p.arm_draft(arm)
            if arm.speculative and draft and arm.method != "ngram":
                self.paths.setdefault(draft, self._resolve_path(draft, f"arms[{arm.name}].draft"))
                self._check_draft_kind(arm, self.paths[draft])
        self._check_gpus()
        self.resolved = True
        specs = [self.launch_spec(arm) for arm in p.arms]
        self.notes += [n for s in specs for n in s.notes if n not in self.notes]
        if c.check_args_on_host:
            self._check_argvs(specs)
        return EngineIdentity(python=self.python, models=dict(self.paths), notes=list(self.notes))

    def _check_draft_kind(self, arm: Arm, path: str) -> None:
        """An EAGLE-3 draft (architectures *Eagle3*) under algorithm EAGLE gives accept length 1.00."""
        cfg = f"{path.rstrip('/')}/config.json"
        if arm.method != "eagle" or not self.host.exists(cfg):
            return
        try:
            archs = json.loads(self.host.read_text(cfg)).get("architectures") or []
        except (json.JSONDecodeError, AttributeError):
            return
        if any("eagle3" in str(a).lower() for a in archs):
            raise ConfigError(f"arms[{arm.name}].method: draft {path!r} is an EAGLE-3 model ({archs}); SGLang's "
                              "EAGLE algorithm runs it with accept length exactly 1.00: use method eagle3")

    def _check_argvs(self, specs: list[LaunchSpec]) -> None:
        module_at = [s.argv.index("sglang.launch_server") + 1 for s in specs]
        argvs = [s.argv[i:] for s, i in zip(specs, module_at, strict=True)]
        env = {k: v for k, v in specs[0].env.items() if k == "PYTHONPATH"} or None
        out = check_with_parser(self.host, str(self.python), argvs, env=env)
        if "import_error" in out:
            self.notes.append(f"argv not checked with the host's SGLang parser: {out['import_error']}")
            return
        for arm, argv, r in zip(self.params.arms, argvs, out.get("results", []), strict=False):
            if not r.get("ok"):
                raise ConfigError(f"arms[{arm.name}]: SGLang {self.sglang_version} on {self.host.name} rejects "
                                  f"the command: {r.get('error')}\nargs: {mask_launch(argv).argv_line}")
        self.notes.append(f"argv of {len(argvs)} arm(s) accepted by SGLang {self.sglang_version}'s own parser "
                          f"on {self.host.name}")

    def resolve_dry(self) -> None:
        """Paths and version as the params give them; nothing on the host is touched."""
        p, c = self.params, self.config
        self.python = self._python_from_params()
        self.sglang_version = c.sglang_version
        if c.sglang_version is None and c.cuda_graph_max_bs is not None:
            warnings.warn("engine_config.sglang_version unset: the dry run writes the newest SGLang flag "
                          f"{cuda_graph_flag(None)}; set it to see your version's flags", stacklevel=2)
        self.paths["model"] = p.model
        for arm in p.arms:
            draft = p.arm_draft(arm)
            if draft:
                self.paths.setdefault(draft, draft)
        self.resolved = True

    # --- argv ----------------------------------------------------------------------------------------
    def _check_extra(self, args: list[str], where: str) -> None:
        for a in args:
            flag = a.split("=", 1)[0]
            if flag in SPEC_FLAGS:
                raise ConfigError(f"{where}: {flag} is written by spectrial from method/draft/steps/topk/"
                                  "draft_tokens; set those parameters instead of passing the flag")
            if flag in OWN_FLAGS:
                raise ConfigError(f"{where}: {flag} is written by spectrial (model, engine_config.tp_size, bind, "
                                  "port); set the parameter instead")
        check_version_flags(args, self.version_tuple, where)

    def _auto_conflict(self, arm: Arm) -> None:
        set_top = self.params.model_fields_set
        given = [n for n in ("topk", "draft_tokens") if getattr(arm, n) is not None or n in set_top]
        if given:
            raise ConfigError(f"arms[{arm.name}]: engine_config.auto_speculative_params lets SGLang choose steps, "
                              f"topk and draft tokens together; remove {', '.join(given)} (SGLang asserts they "
                              "are unset when steps is)")

    def build_spec(self, arm: Arm, workers: Workers | None = None) -> LaunchSpec:
        """Exact argv and environment of one arm (with other nodes: rank 0's, `--nnodes --node-rank 0
        --dist-init-addr`)."""
        p, c = self.params, self.config
        where = f"arms[{arm.name}]"
        if c.auto_speculative_params and arm.speculative:
            self._auto_conflict(arm)
        draft = p.arm_draft(arm) if arm.speculative else None
        spec_argv, notes = speculative_args(
            arm.method, p.arm_steps(arm), p.arm_topk(arm), p.arm_draft_tokens(arm),
            self.paths.get(draft, draft) if draft else None, adjust=c.adjust_draft_tokens,
            auto=c.auto_speculative_params, where=where)
        self._check_extra(c.extra_args, "engine_config.extra_args")
        self._check_extra(arm.extra_args, f"{where}.extra_args")
        env = {**self._base_env(), **arm.env}
        if arm.synthetic_accept is not None:
            if not arm.speculative:
                raise ConfigError(f"{where}.synthetic_accept: only speculative arms take synthetic acceptance",
                                  parameter=f"{where}.synthetic_accept")
            tau = simulated_accept_len(arm.synthetic_accept, p.arm_steps(arm))
            env[SIMULATE_VAR] = f"{tau:.6g}"
            notes = [*notes, f"synthetic acceptance: {SIMULATE_VAR}={tau:.6g} (the accept length per-token "
                             f"rate {arm.synthetic_accept} gives at {p.arm_steps(arm)} steps; SGLang forces it, "
                             "output tokens become meaningless)"]
        if c.cuda_graph_max_bs is not None and c.cuda_graph_max_bs < p.concurrency:
            notes = [*notes, f"concurrency {p.concurrency} above engine_config.cuda_graph_max_bs "
                             f"({c.cuda_graph_max_bs}): batches that large decode without CUDA graphs"]
        argv = [str(self.python), "-m", "sglang.launch_server", "--model-path", self.paths.get("model", p.model),
                "--tp-size", str(c.tp_size), "--host", p.bind, "--port", str(p.port),
                *render(SERVER_FLAGS, c, self.version_tuple), *spec_argv, *c.extra_args, *arm.extra_args]
        if arm.policy is not None and arm.speculative:
            argv += self.policy_launch(arm.policy, p.arm_steps(arm), p.arm_topk(arm), where)[1]
        if workers is not None:
            argv = rank_argv(argv, 0, workers.count, dist_init_addr(argv, workers.head_addr))
        return LaunchSpec(argv=argv, env=env, port=p.port, probe=probe,
                          name=f"sglang-{arm.name}", bind=p.bind, notes=notes, python=True,
                          probe_timeout_s=HEALTH_TIMEOUT_S, poll_s=HEALTH_POLL_S, exit_rule=classify_exit)

    # --- several nodes: the head's command per rank --------------------------------------------------------
    def prepare_workers(self, head_addr: str, nodes: list[Worker]) -> Workers:
        """Nothing to provision: every node runs the head's Python and model paths (the same on each node)."""
        return Workers(head_addr, list(nodes))

    def worker_specs(self, head: LaunchSpec, arm: Arm, workers: Workers) -> list[WorkerSpec]:
        """Rank r > 0 runs the head's argv with `--node-rank r`, started right after the head (rank 0)."""
        dist = dist_init_addr(head.argv, workers.head_addr)
        return [WorkerSpec(n, LaunchSpec(argv=rank_argv(head.argv, n.rank, workers.count, dist), env=dict(head.env),
                                         port=head.port, probe=_always_ready, name=f"{head.name}-rank{n.rank}",
                                         bind=head.bind, http=False, python=head.python), False)
                for n in workers.nodes]

    def slots(self) -> tuple[int | None, str]:
        return self.config.max_running_requests, "engine_config.max_running_requests (--max-running-requests)"

    def ranks(self) -> int:
        return self.config.tp_size

    def version(self) -> EngineIdentity:
        return self.identity.model_copy(update={"engine": "sglang", "version": self.sglang_version})

    # --- benchmark hooks -----------------------------------------------------------------------------
    def completion_payload(self, prompt: str, max_tokens: int) -> RequestBody:
        body = super().completion_payload(prompt, max_tokens)
        body["stream_options"] = {"include_usage": True}
        return body

    def chat_payload(self, messages: list[ChatMessage], max_tokens: int) -> RequestBody:
        body = super().chat_payload(messages, max_tokens)
        body["stream_options"] = {"include_usage": True}
        return body

    def request_target(self, request_format: str = "completion") -> tuple[str, Payload]:
        """OpenAI completions / chat completions, or with client_api native `/generate`: raw text, or for chat
        the model's chat template rendered here (BOS stripped: the server adds its own), as SGLang's
        bench_serving does with --apply-chat-template."""
        if self.config.client_api != "native":
            return super().request_target(request_format)
        if request_format == "chat":
            template = self.chat_template()
            return "/generate", lambda item, n: self.generate_payload(template.render(item.chat_messages()), n)
        return "/generate", lambda item, n: self.generate_payload(item.completion_text(), n)

    def chat_template(self) -> ChatTemplate:
        """The target's chat template (read once from its folder on the host)."""
        if self._chat_template is None:
            d = self.model_dir()
            if d is None:
                raise ConfigError(f"request_format: chat through client_api native needs the target's chat "
                                  f"template, read from its folder; {self.params.model!r} is not a folder on "
                                  f"{self.host.name}", parameter="request_format",
                                  hint="give a model path, or use client_api: openai (the server's template)")
            self._chat_template = hf_chat_template(self.host, d)
        return self._chat_template

    def chat_template_note(self) -> str:
        if self.config.client_api == "native":
            return (f"applied by spectrial (client_api native): {self.chat_template().origin}, rendered with the "
                    "generation prompt, BOS stripped")
        return "the server's: SGLang renders the model's tokenizer chat template"

    def generate_payload(self, prompt: str, max_tokens: int) -> RequestBody:
        """Body of a streaming native `POST /generate` request, whose final chunk carries `meta_info`
        (per-request spec_verify_ct, spec_accept_length, ...) for `request_stats`."""
        sp: Sampling = {"max_new_tokens": max_tokens, **self.sampling_fields()}
        if "seed" in sp:  # SGLang's native name
            sp["sampling_seed"] = sp.pop("seed")
        return {"text": prompt, "stream": True, "sampling_params": sp}

    def request_stats(self, final: dict[str, Any]) -> ServerRequestStats:
        return meta_info_stats(final)

    def snapshot(self, client: httpx.Client, base_url: str) -> dict[str, float]:
        snap = server_info_snapshot(client, base_url)
        if self.config.enable_metrics:
            snap.update(metrics.snapshot(client, base_url))
        return snap

    @classmethod
    def policy_launch(cls, policy: Mapping[str, Any], steps: int, topk: int, where: str
                      ) -> tuple[dict[str, Any], list[str]]:
        """SGLang's adaptive speculation (0.5.17: `--speculative-adaptive`, which changes the number of steps from
        the acceptance rate, `--speculative-adaptive-config FILE` its knobs); a chain only (its server_args:
        "adaptive spec currently requires topk=1")."""
        cls.policy_keys(policy, {"adaptive": "true: --speculative-adaptive",
                                 "config": "--speculative-adaptive-config FILE"}, where)
        if policy.get("adaptive") is not True:
            raise ConfigError(f"{where}.policy.adaptive: give true (SGLang's adaptive speculation)",
                              parameter=f"{where}.policy.adaptive")
        if topk != 1:
            raise ConfigError(f"{where}.policy: SGLang's adaptive speculation needs topk 1 (this arm: {topk})",
                              parameter=f"{where}.topk")
        if policy.get("config") is None and steps != ADAPTIVE_DEFAULT_MAX_STEPS:
            raise ConfigError(
                f"{where}.steps: SGLang's adaptive speculation without a config picks from steps [1, 3, 7] and sizes "
                f"its CUDA-graph buffers for 7, but the shared logits buffer for --speculative-num-steps ({steps}): "
                "0.5.17 fails at start-up ('shared logits buffer holds 4 rows but caller needs 8', an H100, "
                "2026-12-06)", parameter=f"{where}.steps",
                hint=f"give the arm steps: {ADAPTIVE_DEFAULT_MAX_STEPS} (the deepest candidate), or a policy config "
                     "whose largest candidate_steps is the arm's steps")
        out = ["--speculative-adaptive"]
        if policy.get("config") is not None:
            if not isinstance(policy["config"], str) or not policy["config"].strip():
                raise ConfigError(f"{where}.policy.config: the path of a JSON file", parameter=f"{where}.policy.config")
            out += ["--speculative-adaptive-config", policy["config"]]
        return {}, out

    @classmethod
    def deploy_flags(cls, method: str, steps: int, topk: int | None, draft_tokens: int | None) -> list[str]:
        return ["--speculative-algorithm", ALGORITHMS.get(method, method.upper()), "--speculative-num-steps",
                str(steps), "--speculative-eagle-topk", str(topk or 1), "--speculative-num-draft-tokens",
                str(draft_tokens or steps + 1)]

    def config_readback(self, arm: Arm, probe: ServerProbe, log: str) -> list[ConfigSetting]:
        """GET /server_info (fallback /get_server_info): the ServerArgs SGLang resolved, beside the flags spectrial
        wrote (SGLang's own rules change some: max running requests 48 for speculative decoding, draft tokens
        steps + 1 at top-k 1, its CUDA-graph batch limit)."""
        p, c = self.params, self.config
        info, path = probe.json("/server_info"), "GET /server_info"
        if not isinstance(info, dict) or "model_path" not in info:
            info, path = probe.json("/get_server_info"), "GET /get_server_info"
        if not isinstance(info, dict) or "model_path" not in info:
            return [setting("server", "SGLang /server_info", "ServerArgs", None,
                            "GET /server_info and /get_server_info did not answer with model_path")]
        draft = p.arm_draft(arm) if arm.speculative else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            spec_argv, _ = speculative_args(arm.method, p.arm_steps(arm), p.arm_topk(arm), p.arm_draft_tokens(arm),
                                            self.paths.get(draft, draft) if draft else None,
                                            adjust=c.adjust_draft_tokens, auto=c.auto_speculative_params, where="")
        asked = dict(zip(spec_argv[::2], spec_argv[1::2], strict=False))

        def got(key: str) -> Any:
            return info.get(key)

        def at(key: str) -> str:
            return f"{path} {key}" if key in info else f"{path} has no {key}"

        algo = got("speculative_algorithm")
        want = asked.get("--speculative-algorithm")
        out = [
            setting("model", "model (--model-path)", self.paths.get("model", p.model), got("model_path"),
                    at("model_path")),
            setting("tp", "tensor parallel size (--tp-size)", c.tp_size, got("tp_size"), at("tp_size")),
            setting("dp", "data parallel size", None, got("dp_size"), at("dp_size")),
            setting("speculative", "speculation on", arm.speculative,
                    bool(algo) if "speculative_algorithm" in info else None, at("speculative_algorithm")),
        ]
        if arm.speculative:
            # SGLang runs NEXTN as EAGLE (same algorithm, its own name for MTP heads): not a mismatch
            same = {"NEXTN": "EAGLE"}
            out.append(setting("method", "speculative algorithm", same.get(str(want), want),
                               same.get(str(algo), algo) if algo else algo, at("speculative_algorithm")))
            for key, flag, name in (("steps", "--speculative-num-steps", "speculative_num_steps"),
                                    ("topk", "--speculative-eagle-topk", "speculative_eagle_topk"),
                                    ("draft_tokens", "--speculative-num-draft-tokens", "speculative_num_draft_tokens"),
                                    ("draft_model", "--speculative-draft-model-path", "speculative_draft_model_path")):
                a = asked.get(flag)
                if a is not None or got(name) is not None:
                    out.append(setting(key, name.replace("_", " "), a, got(name), at(name)))
        running = got("max_running_requests")
        if c.max_running_requests is not None:
            out.append(setting("max_running", "max running requests", c.max_running_requests, running,
                               at("max_running_requests")))
        else:  # SGLang's choice (48 for speculative decoding) must still hold the concurrency
            out.append(setting("max_running", "max running requests (its own choice; the concurrency needs)",
                               p.concurrency, running, at("max_running_requests"), at_least=True))
        graphs_off = bool(got("disable_cuda_graph"))
        bs = got("cuda_graph_max_bs_decode") if got("cuda_graph_max_bs_decode") is not None else got("cuda_graph_max_bs")
        bs_key = "cuda_graph_max_bs_decode" if got("cuda_graph_max_bs_decode") is not None else "cuda_graph_max_bs"
        if graphs_off:
            out.append(setting("cuda_graph", "CUDA graphs", True if c.cuda_graph_max_bs else None, False,
                               at("disable_cuda_graph")))
        elif c.cuda_graph_max_bs is not None:
            out.append(setting("cuda_graph_max_bs", "largest CUDA-graph decode batch", c.cuda_graph_max_bs, bs,
                               at(bs_key)))
        else:
            out.append(setting("cuda_graph_max_bs", "largest CUDA-graph decode batch (its own choice; the "
                               "concurrency needs)", p.concurrency, bs, at(bs_key), at_least=True))
        if isinstance(got("context_length"), int):
            out.append(setting("context", "context length", None, got("context_length"), at("context_length")))
        return out

    def window_stats(self, w: Window) -> WindowStats:
        st = sglang_window_stats(w, draft_tokens=self._draft_tokens(w.arm))
        if w.arm.method == "eagle" and st.accept_len is not None and abs(st.accept_len - 1) < 1e-3:
            st.notes.append("accept length exactly 1.00 under algorithm EAGLE: is the draft an EAGLE-3 model?")
        return st

    def _draft_tokens(self, arm: Arm) -> int | None:
        if not arm.speculative or self.config.auto_speculative_params:
            return None
        p = self.params
        if arm.method == "ngram" or p.arm_topk(arm) != 1:
            return p.arm_draft_tokens(arm) or p.arm_steps(arm) + 1
        return p.arm_steps(arm) + 1


ADAPTIVE_DEFAULT_MAX_STEPS = 7  # sglang/srt/speculative/adaptive_spec_params.py (0.5.17): candidate_steps [1, 3, 7]
SIMULATE_VAR = "SGLANG_SIMULATE_ACC_LEN"  # forced acceptance, read in SGLang's scheduler


def simulated_accept_len(value: float | list[float], steps: int) -> float:
    """The accept length SGLang should force for an arm's synthetic acceptance: 1 + the per-position rates,
    a, a^2, ..., a^steps for a per-token rate a (the same rates llama.cpp's --spec-synth-rates takes)."""
    if isinstance(value, list):
        if len(value) != steps:
            raise ConfigError(f"synthetic_accept: {len(value)} per-position rates given for steps={steps}; give "
                              "one rate per drafted position, or one per-token rate a", parameter="synthetic_accept")
        return 1.0 + sum(float(x) for x in value)
    return 1.0 + sum(float(value) ** (i + 1) for i in range(steps))


CLEAN_STOP_LINES = ("Gracefully exiting", "Draining requests and shutting down", "Force exiting")
CRASH_LINES = ("Scheduler hit an exception", "SIGQUIT received", "Traceback (most recent call last)")


def classify_exit(how: str, code: int | None, log_tail: str) -> tuple[bool | None, list[str]]:
    """SGLang ends every stop by SIGKILLing its own tree (exit status -9, 137 through a shell): clean after
    `Gracefully exiting...`, a crash after `Scheduler hit an exception` / `SIGQUIT received`; the lines that
    decide are the evidence."""
    lines = log_tail.splitlines()
    crash = [ln for ln in lines if any(m in ln for m in CRASH_LINES)]
    graceful = [ln for ln in lines if any(m in ln for m in CLEAN_STOP_LINES)]
    if how == "gone":
        return (False, crash[-5:]) if crash else (None, [f"the server had already exited (exit code {code})"])
    if crash:
        return False, crash[-5:]
    if code in (-9, 137) and graceful:
        return True, [f"exit code {code} (SGLang kills its own tree) after: {graceful[-1].strip()[:200]}"]
    if code in (0, 143, -15):
        return True, [f"exit code {code} after SIGTERM"]
    return False, [f"exit code {code} without SGLang's shutdown lines" + (" (SIGKILLed after stop_grace_s)"
                                                                          if how == "KILL" else "")]


def probe(client: httpx.Client, base_url: str) -> Probe:
    """SGLang is ready when `/health` answers 200 (503 until its warm-up request has run).

    A build without `/health` (404) is probed on `/v1/models`, as the original investigation did by hand;
    that answers before the warm-up has finished, which the detail says.
    """
    r = client.get(f"{base_url}/health")
    if r.status_code == 200:
        return Probe(True, "200 ok")
    if r.status_code == 404:
        m = client.get(f"{base_url}/v1/models")
        return Probe(m.status_code == 200, f"/health missing; /v1/models {m.status_code} (warm-up not awaited)")
    return Probe(False, f"{r.status_code} {r.text[:80]}".strip())


DIST_INIT_PORT = 50000  # rank 0's port for the other ranks' rendezvous, unless extra_args give --dist-init-addr
_RANK_FLAGS = {"--nnodes": 1, "--node-rank": 1, "--dist-init-addr": 1}


def dist_init_addr(argv: list[str], head_addr: str) -> str:
    """The rendezvous address of a multi-node server: `--dist-init-addr` of `argv` (spaced or `=` form) where the
    params give it, else the head's address at DIST_INIT_PORT."""
    for i, a in enumerate(argv):
        flag, eq, value = a.partition("=")
        if flag == "--dist-init-addr":
            return value if eq else argv[i + 1]
    return f"{head_addr}:{DIST_INIT_PORT}"


def rank_argv(argv: list[str], rank: int, nnodes: int, dist_init_addr: str) -> list[str]:
    """The SGLang launch argv of node `rank` out of `nnodes`, derived from the rank-0 argv.

    Any `--nnodes`, `--node-rank` and `--dist-init-addr` already in `argv` (spaced or `=` form) are
    replaced, so the result is the same whichever argv it starts from.
    """
    if not 0 <= rank < nnodes:
        raise ConfigError(f"hosts: rank {rank} is outside 0..{nnodes - 1}")
    out: list[str] = []
    skip = 0
    for item in argv:
        if skip:
            skip -= 1
            continue
        flag = item.split("=", 1)[0]
        if flag in _RANK_FLAGS:
            skip = 0 if "=" in item else _RANK_FLAGS[flag]
            continue
        out.append(item)
    return [*out, "--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr", dist_init_addr]


def _always_ready(client: httpx.Client, base_url: str) -> Probe:
    """Ranks > 0 serve nothing of their own: the head's readiness covers them."""
    return Probe(True, "rank started")


def server_info_snapshot(client: httpx.Client, base_url: str) -> dict[str, float]:
    """`/server_info` (fallback `/get_server_info`): cumulative avg_spec_accept_length and throughput."""
    out: dict[str, float] = {}
    r = client.get(f"{base_url}/server_info")
    if r.status_code == 404:
        r = client.get(f"{base_url}/get_server_info")
        out["server_info:fallback_get_server_info"] = 1.0
    if r.status_code != 200:
        return out
    try:
        data = r.json()
    except ValueError:
        return out
    states = data.get("internal_states") or [data]
    accept = [s.get("avg_spec_accept_length") for s in states if isinstance(s, dict)]
    accept = [float(a) for a in accept if isinstance(a, int | float)]
    if accept:
        out["server_info:avg_spec_accept_length"] = sum(accept) / len(accept)
    thr = [s.get("last_gen_throughput") for s in states if isinstance(s, dict)]
    thr = [float(t) for t in thr if isinstance(t, int | float)]
    if thr:
        out["server_info:last_gen_throughput"] = thr[0]
    return out


class MetaInfo(BaseModel):
    """SGLang's `meta_info` of a native `/generate` chunk (the fields spectrial keeps; spec_* only when
    speculating)."""

    model_config = ConfigDict(extra="ignore")

    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens served from the radix cache
    spec_verify_ct: float | None = None
    spec_accept_length: float | None = None
    spec_accept_rate: float | None = None
    e2e_latency: float | None = None
    spec_accept_token_num: float | None = None
    spec_draft_token_num: float | None = None

    def stats(self) -> ServerRequestStats:
        return ServerRequestStats(
            server_predicted_n=self.completion_tokens, server_prompt_n=self.prompt_tokens,
            server_cache_n=self.cached_tokens, server_spec_verify_ct=self.spec_verify_ct,
            server_spec_accept_length=self.spec_accept_length, server_spec_accept_rate=self.spec_accept_rate,
            server_e2e_latency=self.e2e_latency, server_draft_n_accepted=self.spec_accept_token_num,
            server_draft_n=self.spec_draft_token_num)


def meta_info_stats(final: dict[str, Any]) -> ServerRequestStats:
    """Per-request stats from the native `/generate` path's `meta_info` of the chunk, as parsed."""
    return MetaInfo.model_validate(final.get("meta_info") or {}).stats()


WATCH_METRICS = WatchMetrics(
    engine="sglang", verify_steps="sglang:spec_verify_calls_total", tokens="sglang:generation_tokens_total",
    accepted_minus="sglang:num_requests_total", requests_running="sglang:num_running_reqs",
    requests_waiting="sglang:num_queue_reqs", start_time="process_start_time_seconds")


def watch_totals(snap: dict[str, float]) -> CounterTotals:
    """One `/metrics` snapshot's cumulative totals (SGLang >= 0.5.14 with --enable-metrics): verify calls,
    generated tokens, and accepted = generated - requests (each one's first token comes from prefill) - verify
    calls, as `sglang_window_stats` counts them (a difference of two such totals is exact for requests that
    finished inside it, approximate for those in flight); running / queued requests as gauges. SGLang exports
    no drafted-token counter. The names: `WATCH_METRICS`."""
    return metrics.watch_totals(WATCH_METRICS, snap)


def sglang_window_stats(w: Window, *, draft_tokens: int | None) -> WindowStats:
    """Statistics of one window; accept length from the best source the server offers (see module doc).

    tokens = tokens decoded after each request's first (the first comes from prefill, its time is TTFT);
    decode_ms = client-side decode span (last - first streamed chunk) summed over requests;
    verify_steps = verify cycles; accepted = draft tokens accepted = tokens - verify_steps.
    """
    ok = w.ok_requests
    st = WindowStats(source="client stream timing")
    st.tokens, st.decode_ms = client_decode(ok)
    cache_n, prompt_n = [r.server_cache_n for r in ok], [r.server_prompt_n for r in ok]
    if ok and None not in cache_n and None not in prompt_n:
        st.prompt_tokens = float(sum(n or 0 for n in prompt_n))  # meta_info prompt_tokens counts the cached ones too
        st.cached_prompt_tokens = float(sum(c or 0 for c in cache_n))
    dec = w.log_rows("decode")
    if not dec.empty and "graph" in dec:  # 'cuda graph: True/False' per decode line (each decode_log_interval steps)
        said = [bool(g) for g in dec["graph"] if g is not None and g == g]
        if said:
            st.graph_lines, st.graph_off_lines = float(len(said)), float(said.count(False))
    if not w.arm.speculative:
        return st
    verify = w.delta("sglang:spec_verify_calls_total")
    gen = w.delta("sglang:generation_tokens_total")
    nreq = w.delta("sglang:num_requests_total")
    meta_v = [r.server_spec_verify_ct for r in ok]
    if verify and gen is not None:
        decoded = gen - (nreq if nreq is not None else len(ok))
        st.source, st.verify_steps = "metrics (spec_verify_calls_total, generation_tokens_total)", verify
        st.accepted = max(decoded - verify, 0.0)
        st.accept_len = 1.0 + st.accepted / verify
        st.notes.append(f"window counters: {verify:.0f} verify calls, {gen:.0f} generated tokens")
    elif ok and all(v is not None and v > 0 for v in meta_v):
        st.source = "meta_info (per request)"
        st.verify_steps = float(sum(v or 0 for v in meta_v))
        st.accepted = float(sum((r.server_predicted_n or r.tokens) - 1 for r in ok)) - st.verify_steps
        st.accept_len = 1.0 + st.accepted / st.verify_steps
    else:
        dec = w.log_rows("decode")
        lens = [float(x) for x in dec["accept_len"] if x is not None and x == x] \
            if not dec.empty and "accept_len" in dec else []
        if lens:
            st.source = f"log ({len(lens)} 'Decode batch' lines inside the window)"
            st.accept_len = sum(lens) / len(lens)
            if st.tokens:
                st.verify_steps = st.tokens / st.accept_len
                st.accepted = st.tokens - st.verify_steps
                st.notes.append("verify_steps estimated as decoded tokens / log accept len (each log line "
                                "covers decode_log_interval decode steps; steps before the first line of the "
                                "window are not counted)")
        else:
            cum = w.after.get("server_info:avg_spec_accept_length")
            st.accept_len, st.scoped = cum, False
            st.source = "server_info avg_spec_accept_length (cumulative since server start)"
            st.notes.append("accept length not scoped to the benchmark: SGLang reports only a cumulative mean "
                            "(including warm-up), updated every decode_log_interval steps; run SGLang >= 0.5.14 "
                            "with --enable-metrics, or lower decode_log_interval, to scope it")
    if st.verify_steps and draft_tokens and w.arm.policy is None:
        st.drafted = st.verify_steps * (draft_tokens - 1)
    elif w.arm.policy is not None:  # the depth changes at run time: verify x (draft tokens - 1) would be made up
        st.notes.append("drafted tokens unknown: adaptive speculation changes the depth at run time and SGLang "
                        "exports no drafted-token counter")
    cum = w.after.get("server_info:avg_spec_accept_length")
    if cum is not None:
        st.notes.append(f"server_info avg_spec_accept_length (cumulative since start): {cum:.3f}")
    return st
