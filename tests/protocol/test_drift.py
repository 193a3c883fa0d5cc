"""Baseline drift that is true and seen (issue 36): three normal real llama.cpp baselines, then one slowed on purpose
(its processes limited to a quarter of a CPU by a cgroup the test makes and removes); the fourth is flagged, in the record, the headline, the
terminal and the doctor, and every message says truly whether the baseline is inside or outside its band."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spectrial.readers.diagnose import diagnose
from spectrial.record.store import list_runs, load_record

SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]
QUOTA = 0.25  # of one CPU: the slowed run's whole process tree (client, server) under a CFS bandwidth limit


class CpuLimit:
    """A cgroup the test makes (cgroup v1 `cpu` or v2 `cpu.max`) with a CFS quota of `share` of one CPU; a process
    started with `enter` as its preexec_fn runs in it, and so do its children (the server spectrial starts). A
    quota throttles the compute itself; a busy neighbour does not (the scheduler's wake-up preference hands a
    server that sleeps between tokens the CPU at once: measured, its decode rate fell 0-25 % under 4 neighbours)."""

    def __init__(self, share: float) -> None:
        name = f"spectrial-drift-{os.getpid()}"
        v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
        try:
            if (v1 / "cpu.cfs_quota_us").exists():
                self.dir = v1 / name
                self.dir.mkdir()
                (self.dir / "cpu.cfs_period_us").write_text("100000")
                (self.dir / "cpu.cfs_quota_us").write_text(str(int(share * 100000)))
            elif (v2 / "cgroup.controllers").exists() and "cpu" in (v2 / "cgroup.controllers").read_text():
                self.dir = v2 / name
                self.dir.mkdir()
                (self.dir / "cpu.max").write_text(f"{int(share * 100000)} 100000")
            else:
                pytest.skip("no cgroup cpu controller here to limit a run's CPU with")
        except OSError as exc:
            pytest.skip(f"cannot make a cgroup here ({exc}): the slowed baseline needs one")

    def enter(self) -> None:
        (self.dir / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self) -> None:
        for _ in range(50):  # its processes have exited (the trial stopped its servers); the kernel may lag
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def _run(path: Path, preexec=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPECTRIAL, "trial", str(path), "--no-report"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "200"}, preexec_fn=preexec)


def _truthful(d) -> None:
    lo, hi = d.band
    inside = lo <= d.current <= hi
    assert d.flagged == (not inside), d.message
    assert ("inside the band" in d.message) == inside and ("outside the band" in d.message) == (not inside)
    nums = [float(x) for x in re.findall(r"band (\d+\.\d)-(\d+\.\d)", d.message)[0]]
    assert nums == [round(lo, 1), round(hi, 1)], d.message


@pytest.mark.slow
def test_a_slowed_baseline_is_flagged_after_three_normal_runs(tiny_params, write_params, tmp_path):
    params = {**tiny_params, "arms": [{"name": "baseline"}], "restarts": 2, "repeats": 5, "max_tokens": 32}
    path = write_params(params)
    for _ in range(3):
        res = _run(path)
        assert res.returncode == 0, res.stderr
    runs = list_runs(params["output_dir"])
    assert len(runs) == 3
    third = load_record(runs[-1]).drift
    assert third is not None and third.checked and third.n_earlier == 2 and third.earlier_starts == 4
    _truthful(third)
    normal = load_record(runs[-1]).arm("baseline").tok_s
    limit = CpuLimit(QUOTA)
    try:
        res = _run(path, limit.enter)
    finally:
        limit.remove()
    assert res.returncode == 0, res.stderr
    m = load_record(list_runs(params["output_dir"])[-1])
    d = m.drift
    assert d is not None and d.n_earlier == 3 and d.earlier_starts == 6
    slowed = m.arm("baseline").tok_s
    assert slowed < 0.8 * normal, (slowed, normal)  # the neighbours did slow it
    assert d.flagged and d.shift_pct < 0, d.message
    _truthful(d)
    assert re.search(r"baseline \d+ % below the last 3 run\(s\) on this host", d.headline), d.headline
    out = " ".join(res.stdout.split())
    assert "Drift: baseline" in out and "below the last 3 run(s) on this host" in out, res.stdout
    findings = [f for f in diagnose(list_runs(params["output_dir"])[-1]).findings if f.kind == "stale_baseline"]
    assert findings and findings[0].severity in ("critical", "warning") and "below" in findings[0].title
    assert json.loads((list_runs(params["output_dir"])[-1] / "manifest.json").read_text())["drift"]["flagged"]
