"""Engine adapters; importing this package registers the built-in ones."""

from spectrial.engines import llamacpp, sglang, vllm  # noqa: F401
from spectrial.engines.base import Engine, Window, get_engine, register
from spectrial.schema import WindowStats

__all__ = ["Engine", "Window", "WindowStats", "get_engine", "register"]
