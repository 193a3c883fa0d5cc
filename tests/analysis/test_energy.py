"""Issue 39 item 6: joules per output token and per accepted draft token, per start and per arm. GPU power from the
sampler's nvidia-smi rows (summed over the GPUs of an instant, averaged over instants), CPU energy from RAPL package
counters read by a real shell on the local host (a sysfs tree laid out as the kernel's, since this VM has none),
the counter's wrap included; the interval across starts is Student's t."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from spectrial.analysis.energy import arm_energy, mean_power_w, start_energy
from spectrial.hosts import rapl
from spectrial.hosts.fingerprint import SAMPLE_QUERY, gpu_rows
from spectrial.hosts.local import LocalHost

# nvidia-smi --query-gpu=<SAMPLE_QUERY> --format=csv,noheader,nounits: two GPUs, three instants
SAMPLES = """\
2026/12/06 04:30:00.100, 0, 1980, 2619, 41, 402.17, 97, 0x0000000000000000
2026/12/06 04:30:00.100, 1, 1980, 2619, 39, 398.83, 96, 0x0000000000000000
2026/12/06 04:30:00.600, 0, 1980, 2619, 42, 410.00, 98, 0x0000000000000000
2026/12/06 04:30:00.600, 1, 1980, 2619, 40, 390.00, 97, 0x0000000000000000
2026/12/06 04:30:01.100, 0, 1980, 2619, 42, [N/A], 98, 0x0000000000000000
2026/12/06 04:30:01.100, 1, 1980, 2619, 40, 395.00, 97, 0x0000000000000000
"""


def test_gpu_power_is_summed_per_instant_and_averaged() -> None:
    rows = gpu_rows(SAMPLES.splitlines(), SAMPLE_QUERY)
    watts, instants, gpus = mean_power_w(rows)
    # 801.0, 800.0 and (one board said [N/A]) 395.0 W
    assert (instants, gpus) == (3, 2) and watts == pytest.approx((801.0 + 800.0 + 395.0) / 3)
    e = start_energy(800.0, 2.5, 1000, 400, "nvidia-smi power.draw")
    assert e.joules == 2000.0 and e.j_per_token == 2.0 and e.j_per_accepted == 5.0 and e.mean_w == 800.0
    assert mean_power_w([{"timestamp": "t", "index": "0", "power.draw": "[N/A]"}]) == (None, 0, 0)
    assert start_energy(None, 2.5, 1000, None, "why").joules is None


def test_the_arm_interval_is_students_t_over_starts() -> None:
    starts = [start_energy(None, 1.0, 100, 50, "RAPL package counters", joules=j) for j in (50.0, 60.0, 55.0)]
    e = arm_energy(starts, 0.95)
    vals = [0.5, 0.6, 0.55]
    half = stats.t.ppf(0.975, 2) * np.std(vals, ddof=1) / np.sqrt(3)
    assert e.j_per_token == pytest.approx(0.55) and e.j_per_token_ci == pytest.approx((0.55 - half, 0.55 + half))
    assert e.j_per_accepted == pytest.approx(1.1) and e.starts == 3 and e.source == "RAPL package counters"
    one = arm_energy(starts[:1])
    assert one.j_per_token == 0.5 and one.j_per_token_ci is None  # one start: no interval
    none = arm_energy([start_energy(None, 1.0, 100, None, rapl.NONE)])
    assert none.j_per_token is None and none.note == rapl.NONE


def _domain(root: Path, name: str, uj: int, wrap: int) -> None:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "energy_uj").write_text(f"{uj}\n")
    (d / "max_energy_range_uj").write_text(f"{wrap}\n")


def test_rapl_packages_are_read_and_their_wrap_undone(tmp_path: Path) -> None:
    host = LocalHost()
    assert rapl.read(host, str(tmp_path / "absent")) is None  # this VM's case: no powercap at all
    _domain(tmp_path, "intel-rapl:0", 262_143_000_000, 262_143_328_850)
    _domain(tmp_path, "intel-rapl:0:0", 5_000_000, 262_143_328_850)  # a core sub-domain: inside package 0
    _domain(tmp_path, "intel-rapl:1", 1_000_000, 262_143_328_850)
    before = rapl.read(host, str(tmp_path))
    assert before == {"intel-rapl:0": (262_143_000_000, 262_143_328_850), "intel-rapl:1": (1_000_000, 262_143_328_850)}
    _domain(tmp_path, "intel-rapl:0", 671_150, 262_143_328_850)  # wrapped: 328,850 + 671,150 uJ = 1 J
    _domain(tmp_path, "intel-rapl:1", 3_500_000, 262_143_328_850)  # 2.5 J
    after = rapl.read(host, str(tmp_path))
    assert rapl.joules(before, after) == pytest.approx(3.5)
    assert rapl.joules(before, {}) is None
