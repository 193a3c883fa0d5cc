"""Engine adapters: `get_engine(name, params, host)` imports a built-in adapter (llamacpp, sglang, vllm) the first
time it is asked for; `register` adds another."""

from spectrial.engines.base import Engine, Window, Worker, Workers, WorkerSpec, get_engine, register
from spectrial.schema import WindowStats

__all__ = ["Engine", "Window", "WindowStats", "Worker", "WorkerSpec", "Workers", "get_engine", "register"]
