"""Remote run folders kept within a bound (issue 26): `prune_run_dirs` on the real sshd host.

The host's work dir gets one folder of server logs per run (`<work_dir>/<run id>`); nothing removed them.
`prune_run_dirs` keeps the newest `keep` and at most `max_bytes` in all, and removes only folders spectrial
made (named like a run id), never the current run's, never one still being written to.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from spectrial.errors import ConfigError
from spectrial.hosts.ssh import SSHHost
from spectrial.provisioning.remote import list_run_dirs, prune_run_dirs

pytestmark = pytest.mark.ssh

DAY = 86400


def make_run(work: Path, name: str, age_s: float) -> Path:
    """A run folder like the session's (a server log and an exit file), everything in it `age_s` old."""
    d = work / name
    d.mkdir(parents=True)
    (d / "llama-server-baseline.log").write_text("x" * 10_000)
    (d / "llama-server-baseline.exit").write_text("0\n")
    t = time.time() - age_s
    for p in [*d.iterdir(), d]:
        os.utime(p, (t, t))
    return d


def test_prune_keeps_the_newest_and_touches_only_run_folders(ssh_host: SSHHost, tmp_path: Path) -> None:
    work = tmp_path / "runs"
    names = [f"202611{i:02d}-120000-local-llamacpp-{i:04x}" for i in range(1, 26)]  # oldest first
    for i, name in enumerate(names):
        make_run(work, name, age_s=(30 - i) * DAY)
    current, busy = names[0], names[1]
    t = time.time()
    os.utime(work / busy / "llama-server-baseline.log", (t, t))  # a run still writing its log
    strangers = [work / "notes", work / "20261101-120000-not-hex-zzzz", work / "2026-11-01-120000-x-abcd"]
    for d in strangers:
        d.mkdir()
    (work / "20261101-110000-a-file-abcd").write_text("a file named like a run")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.txt").write_text("not spectrial's")
    (work / "20261101-100000-a-link-abcd").symlink_to(outside)

    listed, now = list_run_dirs(ssh_host, str(work))
    assert [d.name for d in listed] == names and abs(now - time.time()) < 5  # strangers, file, link not listed
    assert len({d.bytes for d in listed}) == 1  # alike folders: the size bound below counts whole folders

    removed = prune_run_dirs(ssh_host, str(work), keep=20, max_bytes=None, current=f"{work}/{current}")
    assert removed == [str(work / n) for n in names[2:5]]  # the 5 oldest beyond 20, less current and busy
    assert not any((work / n).exists() for n in names[2:5])
    assert all((work / n).is_dir() for n in [current, busy, *names[5:]])
    assert all(d.is_dir() for d in strangers) and (work / "20261101-110000-a-file-abcd").is_file()
    assert (work / "20261101-100000-a-link-abcd").is_symlink() and (outside / "keep.txt").is_file()

    size = listed[0].bytes
    removed = prune_run_dirs(ssh_host, str(work), keep=100, max_bytes=int(10.5 * size), current=current)
    assert removed == [str(work / n) for n in names[5:17]]  # the oldest until 10 folders fit
    left = sorted(p.name for p in work.iterdir() if p.name in names)
    assert left == [current, busy, *names[17:]]
    assert prune_run_dirs(ssh_host, str(work), keep=100, max_bytes=int(10.5 * size), current=current) == []


def test_prune_of_a_missing_work_dir_is_a_no_op(ssh_host: SSHHost, tmp_path: Path) -> None:
    assert prune_run_dirs(ssh_host, str(tmp_path / "never-made")) == []
    with pytest.raises(ConfigError, match="keep"):
        prune_run_dirs(ssh_host, str(tmp_path), keep=-1)
