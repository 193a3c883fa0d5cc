"""The engine interface: plain data plus small functions, so SGLang, vLLM and llama.cpp slot in alike.

An engine turns (trial params, arm) into a `LaunchSpec` (argv + env + probe), names the request payload
for its OpenAI-compatible streaming endpoint, snapshots its cumulative counters before and after a
benchmark, and reads its own server log (through `spectrial.logs`) into per-arm statistics.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx
from pydantic import BaseModel, ValidationError

from spectrial.errors import ConfigError
from spectrial.host import Host
from spectrial.params import Arm, TrialParams, format_validation_error
from spectrial.server import LaunchSpec

_REGISTRY: dict[str, type[Engine]] = {}


def register(name: str):
    """Class decorator adding an engine to the registry under `name`."""

    def deco(cls: type[Engine]) -> type[Engine]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def get_engine(name: str, params: TrialParams, host: Host) -> Engine:
    """The engine adapter `name`, configured from `params.engine_config`."""
    import spectrial.engines  # noqa: F401  (registers the built-in engines)

    if name not in _REGISTRY:
        raise ConfigError(f"engine: {name!r} is not known; choose one of {sorted(_REGISTRY)}")
    return _REGISTRY[name](params, host)


@dataclass
class ArmStats:
    """Server-side statistics of one arm's benchmark window (None where the engine cannot tell)."""

    verify_steps: float | None = None
    drafted: float | None = None
    accepted: float | None = None
    tokens: float | None = None
    decode_ms: float | None = None
    draft_ms: float | None = None
    per_position: list[float] | None = None
    accept_len: float | None = None  # when the engine reports only a mean (e.g. SGLang's avg_spec_accept_length)
    scoped: bool = True
    source: str = ""
    notes: list[str] = field(default_factory=list)
    nccl_evidence: dict[str, Any] | None = None  # per rank what NCCL reported it used (NCCL_DEBUG=INFO runs)


class Engine(ABC):
    """One inference engine as spectrial drives it."""

    name: ClassVar[str] = "engine"
    config_model: ClassVar[type[BaseModel]]

    def __init__(self, params: TrialParams, host: Host) -> None:
        self.params, self.host = params, host
        try:
            self.config = self.config_model.model_validate(params.engine_config)
        except ValidationError as err:
            raise ConfigError(format_validation_error(err, f"engine_config ({self.name})")
                              .replace("  - ", "  - engine_config.")) from None

    # --- launch --------------------------------------------------------------------------------------
    @abstractmethod
    def prepare(self) -> dict[str, Any]:
        """Resolve binaries and models on the host (build/write what is missing); returns identities."""

    @abstractmethod
    def resolve_dry(self) -> None:
        """Fill paths as the params give them, without contacting the host (for dry runs)."""

    @abstractmethod
    def launch_spec(self, arm: Arm) -> LaunchSpec:
        """Exact argv and environment for `arm`, validated before anything is launched."""

    def version(self) -> dict[str, Any]:
        """Engine version (and source identity where known)."""
        return {}

    # --- benchmark hooks -----------------------------------------------------------------------------
    def completion_payload(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        """Body of an OpenAI-compatible streaming /v1/completions request of fixed output length."""
        return {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "stream": True, "ignore_eos": True}

    def request_target(self) -> tuple[str, Callable[[str, int], dict[str, Any]]]:
        """Path and body builder of the benchmark's streaming requests (default: OpenAI completions)."""
        return "/v1/completions", self.completion_payload

    def request_stats(self, final: dict[str, Any]) -> dict[str, Any]:
        """Per-request server stats from the final streamed chunk (engine specific)."""
        return {}

    def snapshot(self, client: httpx.Client, base_url: str) -> dict[str, float]:
        """Cumulative server counters (subtract two snapshots to scope a benchmark window)."""
        return {}

    def window_stats(self, before: dict[str, float], after: dict[str, float],
                     requests: list[dict[str, Any]], log_text: str) -> ArmStats:
        """Statistics of one benchmark window from counters, per-request stats and the server log."""
        return ArmStats(scoped=False, source="none")
