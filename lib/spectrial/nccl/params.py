"""Parameters of the NCCL tuning check: environment sets, message sizes, backend (pydantic, extra="forbid").

An environment set is a mapping of variables (`tuned: {NCCL_PROTO: LL}`, put on the launch of the workers)
with optional settings beside them or with the variables under `env`:
`{env: {...}, how: launch | in_worker | after_init, drop_in_rank: {1: [NAME]}}`. Upper-case keys are
variables, lower-case keys are settings (so `-p env_sets.tuned.NCCL_PROTO=Simple` works on either form).
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

from spectrial.errors import ConfigError
from spectrial.hosts.local import check_env_names
from spectrial.params import apply_override, read_params_yaml

How = Literal["launch", "in_worker", "after_init"]
Backend = Literal["nccl", "gloo"]

#: NVLink multicast stays off on the device machines: added to every environment of an NCCL run.
MULTICAST_OFF: dict[str, str] = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                 "NVSHMEM_DISABLE_NVLS": "1"}
#: The six variables of the original case (SEED_CASE.md).
SEED_TUNING: dict[str, str] = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS",
                               "NCCL_MAX_NCHANNELS": "16", "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}
#: Decode-size all-reduces: 8 KB, one 7168-wide bf16 token (14 KB), 4 tokens (56 KB), 256 KB, 1 MB.
DECODE_SIZES: tuple[int, ...] = (8192, 14336, 57344, 262144, 1048576)
BANDWIDTH_BYTES: dict[str, int] = {"nccl": 64 << 20, "gloo": 4 << 20}
DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}
_SET_KEYS = frozenset({"env", "how", "drop_in_rank"})


def _env_values(env: Any, where: str) -> dict[str, str]:
    """Environment values as strings (YAML reads 16777216 as an int); booleans are refused."""
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise ValueError(f"{where} must be a mapping of VARIABLE: value")
    out: dict[str, str] = {}
    for k, v in env.items():
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise ValueError(f"{where}.{k}: give the value as text or a number (got {v!r})")
        out[str(k)] = str(v)
    check_env_names(out)
    return out


class EnvSet(BaseModel):
    """One environment under test: its variables, where they are set, and (for testing) ranks that drop some."""

    model_config = ConfigDict(extra="forbid")

    env: dict[str, str] = Field(default_factory=dict, description="Variables of this set (e.g. NCCL_PROTO: LL).")
    how: How = Field("launch", description="launch: on the spawned workers' environment (visible in /proc); "
                                           "in_worker: os.environ in the worker before init_process_group; "
                                           "after_init: os.environ after the first communicator, then a new group.")
    drop_in_rank: dict[int, list[str]] = Field(
        default_factory=dict, description="Testing aid: rank -> variables that this rank does not get "
                                          "(a planted missing variable).")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if data is None:
            return {}
        if not isinstance(data, dict):
            return data
        variables = {k: v for k, v in data.items() if isinstance(k, str) and k not in _SET_KEYS and k == k.upper()}
        if not variables:
            return data
        rest = {k: v for k, v in data.items() if k not in variables}
        env = rest.get("env") or {}
        return {**rest, "env": {**env, **variables} if isinstance(env, dict) else env}

    @field_validator("env", mode="before")
    @classmethod
    def _env_ok(cls, v: Any) -> dict[str, str]:
        return _env_values(v, "env")

    @model_validator(mode="after")
    def _drops_ok(self) -> EnvSet:
        for rank, names in self.drop_in_rank.items():
            if rank < 0:
                raise ValueError(f"drop_in_rank: rank {rank} is negative")
            unknown = sorted(set(names) - set(self.env))
            if unknown:
                raise ValueError(f"drop_in_rank.{rank}: {unknown} are not variables of this set "
                                 f"(its variables: {sorted(self.env)})")
        return self


def _default_sets() -> dict[str, EnvSet]:
    return {"default": EnvSet(), "tuned": EnvSet(env=dict(SEED_TUNING))}


class NcclCheckParams(BaseModel):
    """Everything the NCCL check needs; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("nccl-check", description="Name of the check, used in the run id.")
    backend: Backend = Field("nccl", description="nccl (GPUs, one per rank) or gloo (CPU: same code, no NCCL).")
    world_size: int | None = Field(None, ge=1, description="Ranks; default: number of GPUs (nccl) or 2 (gloo). "
                                                          "One rank shows visibility and NCCL's own evidence only: "
                                                          "its all-reduce moves no data between GPUs.")
    env_sets: dict[str, EnvSet] = Field(default_factory=_default_sets,
                                        description="Environment sets, run in this order, each in fresh workers.")
    baseline: str = Field("default", description="The set the others are compared with.")
    sizes_bytes: list[int] = Field(default_factory=lambda: list(DECODE_SIZES),
                                   description="Decode-size all-reduce messages (hidden x batch x dtype bytes).")
    bandwidth_bytes: int | None = Field(None, ge=0, description="One large message (default 64 MB on nccl, "
                                                                "4 MB on gloo); 0: none.")
    dtype: Literal["bfloat16", "float16", "float32"] = Field("bfloat16", description="Element type.")
    iters: int = Field(100, ge=2, description="Timed all-reduces per size (after `warmup`).")
    warmup: int = Field(10, ge=0, description="Untimed all-reduces per size.")
    rounds: int = Field(2, ge=1, description="Times every set is run, each in fresh workers, in rotated order; "
                                             "with 2 or more, comparisons resample rounds, then calls.")
    nccl_debug: bool = Field(True, description="Put NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS on every launch (nccl).")
    nccl_debug_subsys: str = Field("INIT,ENV,TUNING", description="NCCL_DEBUG_SUBSYS when nccl_debug is on.")
    level: float = Field(0.95, gt=0, lt=1, description="Confidence level of the per-size comparisons.")
    seed: int = Field(0, description="Seed of the bootstrap.")
    timeout_s: float = Field(300, gt=0, description="Longest time one set's workers may take.")
    output_dir: str = Field("outputs", description="Local folder of run records.")

    @model_validator(mode="after")
    def _consistent(self) -> NcclCheckParams:
        if not self.env_sets:
            raise ValueError("env_sets: at least one set is needed (e.g. default: {})")
        if self.baseline not in self.env_sets:
            raise ValueError(f"baseline: {self.baseline!r} is not one of env_sets {sorted(self.env_sets)}")
        if self.backend == "nccl":
            for name, es in self.env_sets.items():
                bad_mc = {k: v for k, v in es.env.items() if k in MULTICAST_OFF and v != MULTICAST_OFF[k]}
                if bad_mc:
                    raise ValueError(f"env_sets.{name}: {bad_mc} would turn NVLink multicast on; it stays off on "
                                     f"the device machines ({MULTICAST_OFF}): remove these variables")
        item = DTYPE_BYTES[self.dtype]
        bad = [s for s in self.sizes_bytes if s < item or s % item]
        if bad:
            raise ValueError(f"sizes_bytes: {bad} are not positive multiples of {item} bytes ({self.dtype})")
        if self.bandwidth_bytes and self.bandwidth_bytes % item:
            raise ValueError(f"bandwidth_bytes: {self.bandwidth_bytes} is not a multiple of {item} bytes")
        return self

    def sizes(self) -> list[tuple[int, str]]:
        """(bytes, role) per message size, role 'decode' or 'bandwidth', ascending and unique."""
        bw = BANDWIDTH_BYTES[self.backend] if self.bandwidth_bytes is None else self.bandwidth_bytes
        roles = {s: "decode" for s in self.sizes_bytes}
        if bw:
            roles.setdefault(bw, "bandwidth")
        return sorted(roles.items())

    def launch_extras(self) -> dict[str, str]:
        """Variables spectrial adds to every launch: multicast off and NCCL debug output (nccl only)."""
        if self.backend != "nccl":
            return {}
        extra = dict(MULTICAST_OFF)
        if self.nccl_debug:
            extra.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": self.nccl_debug_subsys})
        return extra


def _format_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid NCCL-check parameters in {source}:"]
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            model = EnvSet if len(e["loc"]) >= 3 and e["loc"][0] == "env_sets" else NcclCheckParams
            msg = f"unknown parameter; allowed here: {', '.join(sorted(model.model_fields))}"
        elif "input" in e and not isinstance(e["input"], dict | list):
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"  - {loc}: {msg}")
    return "\n".join(lines)


def load_nccl_params(path: str | os.PathLike[str] | None = None, overrides: dict[str, JsonValue] | None = None,
                     data: dict[str, JsonValue] | None = None) -> NcclCheckParams:
    """Load YAML (or a given mapping), apply dotted overrides (`env_sets.tuned.NCCL_PROTO=LL`), validate."""
    raw: dict[str, JsonValue] = dict(data or {})
    source = "params"
    if path is not None:
        loaded, source = read_params_yaml(path)
        raw = {**loaded, **raw}
    for name, value in (overrides or {}).items():
        if name == "env_sets" or name.startswith("env_sets."):
            raw.setdefault("env_sets", {k: v.model_dump() for k, v in _default_sets().items()})
        apply_override(raw, name, value)
    try:
        return NcclCheckParams.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_error(err, source)) from None
