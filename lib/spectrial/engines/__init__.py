"""Engine adapters; importing this package registers the built-in ones."""

from spectrial.engines import llamacpp, sglang, vllm  # noqa: F401
from spectrial.engines.base import ArmStats, Engine, get_engine, register

__all__ = ["ArmStats", "Engine", "get_engine", "register"]
