"""NCCL tuning check: did the requested variables reach every spawned worker, did NCCL take them, and do
they help decode-size all-reduces? (issue 10; notebook 00, `spectrial nccl-check PARAMS`).

Per environment set, one process per rank is started with multiprocessing *spawn* (as SGLang starts its
workers); each worker records the requested variables in its `os.environ` and `/proc/self/environ`,
times all-reduces at decode message sizes and one bandwidth size, and keeps NCCL's debug output, which
`spectrial.logs` parses into the settings NCCL actually used. The gloo backend runs the same code on CPU.

Exports are loaded lazily so that a spawned worker imports only `spectrial.nccl.worker`.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "NcclCheckParams": "spectrial.nccl.params", "EnvSet": "spectrial.nccl.params",
    "load_nccl_params": "spectrial.nccl.params", "MULTICAST_OFF": "spectrial.nccl.params",
    "SEED_TUNING": "spectrial.nccl.params",
    "run_nccl_check": "spectrial.nccl.check", "load_nccl_check": "spectrial.nccl.check",
    "NcclCheckResult": "spectrial.nccl.check", "SetFailed": "spectrial.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'spectrial.nccl' has no attribute {name!r}")
