"""TEST DOUBLE helpers shared by the SGLang stand-in's processes (see `sglang/launch_server.py`).

Log formats, SGLang's `kill_process_tree`, the parent-death signal of its children, and the environment
variables SGLang sets itself before it spawns its scheduler and detokenizer.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time
from http import HTTPStatus

import psutil

# What SGLang 0.5.17's launcher assigns in its own os.environ before spawning its children (16 on the
# device: the count and the mechanism were recorded, not the names). NCCL_CUMEM_ENABLE, NCCL_NVLS_ENABLE and
# CUDA_DEVICE_MAX_CONNECTIONS are assigned by SGLang's source whatever the launch environment says; the
# other names are illustrative and only fill in what the launch environment lacks.
SGLANG_FORCED_ENV = {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "8"}
SGLANG_OWN_ENV: dict[str, str] = {
    **SGLANG_FORCED_ENV,
    "CUDA_MODULE_LOADING": "AUTO", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false", "TF_CPP_MIN_LOG_LEVEL": "3", "SGLANG_ENABLE_TORCH_COMPILE": "0",
    "SGLANG_IS_IN_CI": "false", "SGLANG_USE_MODELSCOPE": "false", "SGLANG_RUN_ID": "",
    "SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK": "false", "FLASHINFER_WORKSPACE_BASE": "",
    "SGLANG_ENABLE_JIT_DEEPGEMM": "false", "TRITON_PTXAS_PATH": "",
}

PR_SET_PDEATHSIG = 1


def log(msg: str, prefix: str = "") -> None:
    """One line (or a multi-line block) in SGLang's format `[YYYY-mm-dd HH:MM:SS<prefix>] msg`, one write."""
    sys.stdout.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{prefix}] {msg}\n")
    sys.stdout.flush()


def uvicorn_line(msg: str) -> None:
    """A line of uvicorn's own logger (no timestamp): `INFO:     msg`."""
    sys.stdout.write(f"INFO:     {msg}\n")
    sys.stdout.flush()


def access_line(client: tuple[str, int], method: str, path: str, version: str, code: int) -> None:
    """uvicorn's access log line: `INFO:     127.0.0.1:PORT - "GET /health HTTP/1.1" 503 Service Unavailable`."""
    uvicorn_line(f'{client[0]}:{client[1]} - "{method} {path} {version}" {code} {HTTPStatus(code).phrase}')


def set_own_env() -> None:
    """What SGLang's launcher does to its own environment before spawning (values resolved at run time)."""
    resolved = {"SGLANG_RUN_ID": f"standin-{os.getpid()}", "FLASHINFER_WORKSPACE_BASE": os.path.expanduser("~"),
                "TRITON_PTXAS_PATH": "/usr/local/cuda/bin/ptxas"}
    for k, v in SGLANG_OWN_ENV.items():
        if k in SGLANG_FORCED_ENV:
            os.environ[k] = v
        else:
            os.environ.setdefault(k, resolved.get(k, v))


def reassign_own_env() -> None:
    """Module-level side effects of SGLang's imports in a child: its own variables assigned again.

    glibc then points those `environ` entries at new heap strings, which ends the contiguous argv+environ
    block that setproctitle takes over: everything before the first of them is overwritten by the title and
    NUL padding, everything from it on stays readable in /proc/<pid>/environ.
    """
    for k in SGLANG_OWN_ENV:
        if k in os.environ:
            os.environ[k] = os.environ[k]


def kill_itself_when_parent_died() -> None:
    """SGLang's children ask the kernel for SIGKILL when their parent dies (prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def kill_process_tree(parent_pid: int, include_parent: bool = True) -> None:
    """SGLang's `kill_process_tree`: SIGKILL every descendant, then the process itself (itself last)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        itself = psutil.Process(parent_pid)
    except psutil.NoSuchProcess:
        return
    for child in itself.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    if include_parent:
        with contextlib.suppress(psutil.NoSuchProcess):
            if parent_pid == os.getpid():
                itself.kill()
                sys.exit(0)
            itself.kill()
            itself.send_signal(signal.SIGQUIT)


def env_flag(name: str) -> bool:
    """SGLang's get_bool_env_var: `true` or `1`."""
    return os.environ.get(name, "false").strip().lower() in ("true", "1")


def dump_stacks_on_sigusr1() -> None:
    """The double's own diagnostic hook (real SGLang has none; SIGUSR1 would end it): SIGUSR1 writes every
    thread's stack to stderr, which is the server's log. The tests send it to each process of a double that
    did not become ready, so that the failure shows where each one waits."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
