"""GPU checks. Where a GPU cannot exist (CPU machines, CI), `nvidia-smi` is replaced by a TEST DOUBLE:
a small script printing nvidia-smi's CSV query format. It proves the parsing and the refusal logic only;
it never counts as the GPU path working (that runs on the H200 device, see docs/DEVICE.md)."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from spectrial.errors import ConfigError, ResourceBusyError
from spectrial.hosts.gpu import query, wait_gpus_free
from spectrial.hosts.local import LocalHost


def test_no_gpu_is_recorded_and_allowed_only_when_asked(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")  # no nvidia-smi on this PATH
    st = wait_gpus_free(LocalHost(), require_gpu=False)
    assert not st.available and "not found" in st.reason
    with pytest.raises(ConfigError, match="require_gpu"):
        wait_gpus_free(LocalHost(), require_gpu=True)


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """TEST DOUBLE for nvidia-smi (labelled): prints a busy GPU and one compute process (a real pid)."""
    holder = subprocess.Popen(["sleep", "60"])
    script = tmp_path / "nvidia-smi"
    script.write_text(f"""#!/bin/sh
case "$*" in
  *query-gpu*) echo "0, NVIDIA H200, GPU-abc, 70000, 143771, 99";;
  *query-compute-apps*) echo "{holder.pid}, 69000, GPU-abc";;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    yield holder
    holder.kill()
    holder.wait()


def test_busy_gpu_refused_with_pid_and_command(fake_nvidia_smi):
    st = query(LocalHost())
    assert st.available and st.gpus[0].name == "NVIDIA H200" and st.gpus[0].memory_used_mib == 70000
    with pytest.raises(ResourceBusyError) as e:
        wait_gpus_free(LocalHost(), max_used_mib=1024, timeout_s=0.5, poll_s=0.1)
    msg = str(e.value)
    assert "GPU 0 (NVIDIA H200) has 70000 MiB in use" in msg
    assert f"pid {fake_nvidia_smi.pid}" in msg and "sleep 60" in msg
