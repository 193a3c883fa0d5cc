"""Shared fixtures: the real llama-server binary, spectrial's tiny models, free ports, tiny params."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from sshd_plugin import free_port  # one choice of port: outside the ephemeral range

pytest_plugins = ["sshd_plugin", "slurm_plugin", "shared_servers", "lanes"]

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _ctrl_c_is_delivered() -> Any:
    """Tests deliver Ctrl-C (SIGINT) to this process: a shell that starts pytest in the background (`cmd &`, nohup)
    hands it SIGINT ignored, which would turn those tests into waits for what never comes. Python's own handler
    while the tests run, the inherited one after."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.fixture(scope="session")
def llama_server() -> Path:
    """spectrial's cached llama-server (built once per machine by `make llama-server`), with the rpc-server beside
    it that the multi-host tests find there (built on demand since issue 41: a trial builds only what it runs)."""
    from spectrial.engines.llamacpp_build import ensure_binary

    ensure_binary("rpc-server")
    return ensure_binary("llama-server")


@pytest.fixture(scope="session")
def tiny_models() -> Any:
    """spectrial's tiny target + drafts (written once into the cache)."""
    from spectrial.models import ensure_tiny_models

    return ensure_tiny_models()


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def tiny_params(tmp_path: Path, port: int, llama_server: Path, tiny_models: Any) -> dict[str, Any]:
    """A small, fast local llama.cpp trial: baseline + draft-simple + synthetic EAGLE-3, 2 requests each."""
    return {
        "name": "test-tiny", "host": "local", "engine": "llamacpp", "engine_bin": str(llama_server),
        "model": "tiny:target", "draft": "tiny:draft-simple", "steps": 2, "repeats": 2, "warmup": 1,
        "max_tokens": 24, "port": port, "output_dir": str(tmp_path / "outputs"),
        "state_dir": str(tmp_path / "state"), "work_dir": str(tmp_path / "work"), "ready_timeout_s": 120,
        "engine_config": {"threads": 1, "ctx_size": 512},
        "arms": [{"name": "baseline"}, {"name": "draft", "method": "draft"},
                 {"name": "eagle3", "method": "eagle3", "draft": "tiny:eagle3", "synthetic_accept": 0.8}],
    }


@pytest.fixture
def write_params(tmp_path: Path):
    """Write a params mapping as YAML and return its path."""

    def _write(data: dict[str, Any], name: str = "params.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return _write


def has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and os.environ.get("SPECTRIAL_NO_GPU") != "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests are skipped where there is no NVIDIA GPU."""
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU on this machine (nvidia-smi not found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
