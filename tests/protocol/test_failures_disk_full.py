"""Failure: the remote disk is full (issue 7, part 3).

A 1 MiB tmpfs (mounted for the test, as root) stands for the full disk of the host, reached through SSH:
- as `work_dir`: every arm fails before launching with a clear error naming the folder, its free space and
  the parameter to change; no server starts; the run is `failed`, no arm is complete;
- as `ssh.cache_dir`: the upload of the llama.cpp build is refused before a byte is written;
- an upload that does not fit (check bypassed) fails with the free space in the hint and leaves neither a
  partial file under the final name nor its temp folder.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sshd_plugin import SshdServer
from test_ssh_trial import ssh_params

from spectrial.errors import ConfigError, HostError, ResourceBusyError, RunFailed
from spectrial.hosts.local import LocalHost
from spectrial.hosts.ssh import SSHHost
from spectrial.params import load_params
from spectrial.protocol.trial import run_trial
from spectrial.record.store import manifest_json

pytestmark = pytest.mark.ssh


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted on a fresh folder (skipped where mounting is not allowed); unmounted after."""
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip()}); run as root to test a full disk")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow
def test_full_work_dir_fails_every_arm_before_launch(sshd: SshdServer, tiny_params: dict[str, Any],
                                                     full_disk: Path) -> None:
    params = load_params(data=ssh_params(tiny_params, sshd, work_dir=str(full_disk / "runs"),
                                         arms=[{"name": "baseline"}, {"name": "draft", "method": "draft"}]))
    with pytest.raises(RunFailed) as info:
        run_trial(params, progress=False)
    m = manifest_json(info.value.result.run_dir)
    assert m["status"] == "failed"
    assert [a["status"] for a in m["arms"]] == ["failed", "failed"]
    print("reason:", m["starts"][0]["reason"])
    for start in m["starts"]:
        assert start["status"] == "failed" and "ResourceBusyError" in start["reason"]
        assert f"{full_disk}/runs" in start["reason"] and "MiB free" in start["reason"]
        assert "work_dir" in start["reason"] and start["server"]["pid"] is None
    launches = [s for s in m["steps"] if s["name"].startswith("launch:")]
    assert launches and not any(s["ok"] for s in launches)
    assert not any(s["name"].startswith("benchmark:") for s in m["steps"])
    assert list(full_disk.iterdir()) == []  # nothing was written on the full disk
    assert not LocalHost().port_holders(tiny_params["port"])


def test_full_cache_dir_refuses_the_upload(sshd: SshdServer, tiny_params: dict[str, Any], full_disk: Path) -> None:
    data = ssh_params(tiny_params, sshd, engine_bin="auto")
    data["ssh"]["cache_dir"] = str(full_disk / "cache")
    with pytest.raises(ResourceBusyError) as info:
        run_trial(load_params(data=data), progress=False)
    msg = str(info.value)
    print("error:", msg)
    assert "no space left on" in msg and str(full_disk) in msg and "ssh.cache_dir" in msg
    assert not any(full_disk.rglob("llama-server"))
    (run,) = Path(tiny_params["output_dir"]).iterdir()
    assert '"status": "failed"' in (run / "manifest.json").read_text()


def test_upload_that_does_not_fit_leaves_nothing_half_written(ssh_host: SSHHost, full_disk: Path,
                                                              tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * (3 * 2**20))
    target = full_disk / "big.bin"
    with pytest.raises(HostError) as info:
        ssh_host.put(big, str(target))
    print("error:", info.value)
    assert "MiB free" in str(info.value) and str(target) in str(info.value)
    assert not isinstance(info.value, ConfigError)
    assert list(full_disk.iterdir()) == []  # no partial file under the final name, no temp folder left
