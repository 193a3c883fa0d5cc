"""Energy per token: joules per output token and per accepted draft token, per start and per arm.

Per start, the energy of its benchmark windows is mean power x their duration:

    power     GPU: the sampler's `power.draw` (nvidia-smi, W), summed over the GPUs of each sampling instant and
              averaged over the instants of the benchmark (the warm-up request's few samples included); CPU: the
              RAPL package counters (`/sys/class/powercap/intel-rapl:N/energy_uj`) read around each window, their
              difference over its duration (wrapping at `max_energy_range_uj`)
    duration  the windows' spans (first request sent to last stream ended), summed
    tokens    output tokens of the windows' successful requests; accepted = the windows' accepted draft tokens

J per output token = energy / tokens; J per accepted token = energy / accepted (speculative arms). Across an arm's
starts: the mean of the starts' values with a t interval at the run's confidence (one start: no interval). Where
nothing measures power (no nvidia-smi, no readable RAPL) the arm says n/a and why.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from spectrial.schema import EnergyFigures, StartEnergy


def mean_power_w(samples: Sequence[Mapping[str, Any]]) -> tuple[float | None, int, int]:
    """(mean total power in W, sampling instants, GPUs) from GPU sampler rows: power.draw summed over the GPUs of
    each instant, averaged over instants; None where no row has a power reading ('[N/A]' on some boards)."""
    by_t: dict[str, float] = defaultdict(float)
    gpus: set[str] = set()
    for r in samples:
        w = r.get("power.draw")
        try:
            watts = float(w)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if watts != watts or watts < 0:
            continue
        by_t[str(r.get("timestamp"))] += watts
        gpus.add(str(r.get("index")))
    if not by_t:
        return None, 0, 0
    return float(np.mean(list(by_t.values()))), len(by_t), len(gpus)


def start_energy(power_w: float | None, duration_s: float, tokens: float, accepted: float | None,
                 source: str, joules: float | None = None) -> StartEnergy:
    """One start's energy from a mean power (or a measured energy, `joules`) over its windows' duration."""
    if joules is None and power_w is not None and duration_s > 0:
        joules = power_w * duration_s
    if joules is None:
        return StartEnergy(source=source)
    return StartEnergy(joules=joules, mean_w=joules / duration_s if duration_s > 0 else power_w,
                       duration_s=duration_s, tokens=tokens, accepted=accepted, source=source,
                       j_per_token=joules / tokens if tokens else None,
                       j_per_accepted=joules / accepted if accepted else None)


def _mean_ci(values: Sequence[float], confidence: float) -> tuple[float | None, tuple[float, float] | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    m = float(np.mean(vals))
    if len(vals) < 2:
        return m, None
    # scipy.stats costs 0.6 s to import (every CLI start paid it): imported only where an interval is made
    from scipy.stats import t as student_t

    half = float(student_t.ppf(0.5 + confidence / 2, len(vals) - 1) * np.std(vals, ddof=1) / np.sqrt(len(vals)))
    return m, (m - half, m + half)


def arm_energy(starts: Sequence[StartEnergy | None], confidence: float = 0.95, why_none: str = "") -> EnergyFigures:
    """An arm's energy per token over its starts: the mean of the starts' J per token, with a t interval."""
    got = [s for s in starts if s is not None and s.joules is not None]
    if not got:
        reasons = sorted({s.source for s in starts if s is not None and s.source})
        return EnergyFigures(note=why_none or "; ".join(reasons) or "no power readings")
    j, ci = _mean_ci([s.j_per_token for s in got if s.j_per_token is not None], confidence)
    ja, ci_a = _mean_ci([s.j_per_accepted for s in got if s.j_per_accepted is not None], confidence)
    return EnergyFigures(j_per_token=j, j_per_token_ci=ci, j_per_accepted=ja, j_per_accepted_ci=ci_a,
                         starts=len(got), mean_w=float(np.mean([s.mean_w for s in got if s.mean_w is not None])),
                         source=got[0].source)
