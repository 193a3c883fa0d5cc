"""A known world as a sweep: judge a search strategy where the true best setting is known.

`simulate(params, World(...))` runs a sweep (grid or guided) whose server starts are drawn from a model world
instead of a server: same decisions code, same figures, same record layout (kind "sweep-world", the world in
`manifest["world"]`), so a simulated grid record can be replayed like a measured one
(`spectrial.sweep.replayer.replay`). What the world fixes:

    cycle_ms(k, c)  = (fixed_ms + accepted_ms * (tau - 1)) * (1 + fixed_growth * (c - 1))
                      + per_draft_ms * k * (1 + draft_growth * (c - 1))
    acceptance      synthetic rate a: per-position rates (a x synthetic_scale)^i (llama.cpp's --spec-synth-rates
                    sets a^i; a scale below 1 is an engine that accepts less than it was told);
                    the real draft: real_p1 * real_decay^(i - 1) (not geometric, as real drafts are not)
    tok/s           tau / cycle_ms * 1000 per request, times a per-start factor exp(N(0, start_sigma)) and a
                    per-request factor exp(N(0, request_sigma)); baseline 1000 / (base_ms * (1 + ...))

Counters are what an engine would report for those requests (verify steps, accepted, decode and draft ms),
per-position rates carry binomial noise, and every start takes `start_s` plus its requests' decode time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spectrial.params import Arm
from spectrial.protocol.session import MeasuredStart, MeasuredWindow, OfflineSource, WindowPlan
from spectrial.record.store import RunRecord, opened
from spectrial.schema import EngineInfo, HostInfo, RequestRecord, StartRecord, WindowRecord, WindowStats
from spectrial.sweep.params import Setting, SweepParams
from spectrial.sweep.result import SweepResult
from spectrial.sweep.run import Sweep, execute, new_record


@dataclass(frozen=True)
class World:
    """Costs, acceptance and noise of a model world (see the module docstring for the formulas)."""

    fixed_ms: float = 8.0
    per_draft_ms: float = 1.0
    draft_share: float = 0.7
    accepted_ms: float = 0.0
    fixed_growth: float = 0.3
    draft_growth: float = 0.6
    base_ms: float = 5.5
    real_p1: float = 0.8
    real_decay: float = 0.8
    synthetic_scale: float = 1.0
    request_sigma: float = 0.03
    start_sigma: float = 0.02
    start_s: float = 5.0

    def per_position(self, setting: Setting) -> list[float]:
        """True unconditional acceptance per draft position 1..steps."""
        a = setting.synthetic_accept
        if a is not None:
            return [(a * self.synthetic_scale) ** i for i in range(1, setting.steps + 1)]
        return [self.real_p1 * self.real_decay ** (i - 1) for i in range(1, setting.steps + 1)]

    def accept_len(self, setting: Setting) -> float:
        return 1.0 + sum(self.per_position(setting)[:setting.k])

    def cycle_ms(self, setting: Setting | None, c: int) -> float:
        """True cycle time (ms) at concurrency c; the baseline's decode step for None."""
        if setting is None:
            return self.base_ms * (1 + self.fixed_growth * (c - 1))
        tau = self.accept_len(setting)
        return ((self.fixed_ms + self.accepted_ms * (tau - 1)) * (1 + self.fixed_growth * (c - 1))
                + self.per_draft_ms * setting.k * (1 + self.draft_growth * (c - 1)))

    def tok_s(self, setting: Setting | None, c: int) -> float:
        """True per-request tokens per second."""
        tau = 1.0 if setting is None else self.accept_len(setting)
        return tau / self.cycle_ms(setting, c) * 1000.0

    def best(self, sweep: SweepParams) -> dict[tuple[float | None, int], tuple[Setting, float]]:
        """The true best setting and its tok/s per (scenario, concurrency)."""
        out: dict[tuple[float | None, int], tuple[Setting, float]] = {}
        for s in sweep.settings():
            for c in sweep.concurrency_levels():
                key, v = (s.synthetic_accept, c), self.tok_s(s, c)
                if key not in out or v > out[key][1]:
                    out[key] = (s, v)
        return out


class WorldSource(OfflineSource):
    """Server starts drawn from a World (a `spectrial.protocol.session.StartSource`)."""

    fp_key = "world"

    def __init__(self, record: RunRecord, sweep: SweepParams, world: World, seed: int) -> None:
        super().__init__(record)
        self.sweep, self.world = sweep, world
        self.params = sweep.trial_params()
        self.setting_of = {sweep.arm(s).name: s for s in sweep.settings()}
        self.rng = np.random.default_rng(seed)

    def open(self) -> None:
        m = self.record.manifest
        m.engine, m.host, m.models = EngineInfo(name=self.params.engine), HostInfo(name="world"), []
        m.fingerprint_key, m.world = self.fp_key, dataclasses.asdict(self.world)
        self.record.save()

    def start(self, arm: Arm, restart: int, windows: list[WindowPlan], phase: str | None = None) -> MeasuredStart:
        w, p = self.world, self.params
        s = self.setting_of.get(arm.name)
        entry = StartRecord(arm=arm.name, restart=restart, order=len(self.record.manifest.starts), phase=phase,
                            status="ok", fingerprint_key=self.fp_key, ready_s=w.start_s)
        self.record.manifest.starts.append(entry)
        factor = float(np.exp(self.rng.normal(0.0, w.start_sigma)))
        seconds = w.start_s
        out = []
        for plan in windows:
            if plan.rate is not None:  # the world models closed loops (a cycle time per batch size), not arrivals
                continue
            c, n = plan.concurrency, plan.requests
            rates = w.tok_s(s, c) * factor * np.exp(self.rng.normal(0.0, w.request_sigma, n))
            reqs = [RequestRecord(index=i, tokens=p.max_tokens, server_predicted_n=p.max_tokens,
                                  server_predicted_per_second=float(r),
                                  server_predicted_ms=p.max_tokens / float(r) * 1000.0, client_tok_s=float(r),
                                  arm=arm.name, restart=restart, start=entry.order, concurrency=c)
                    for i, r in enumerate(rates)]
            decode_ms = sum(r.server_predicted_ms for r in reqs)
            seconds += decode_ms / 1000.0 / c
            stats = self._stats(s, n, decode_ms)
            record = WindowRecord(concurrency=c, requests=n, requests_ok=n, tok_s=float(np.median(rates)),
                                  counters=stats.counters(), per_position=stats.per_position,
                                  stats_source=stats.source)
            entry.windows.append(record)
            out.append(MeasuredWindow(plan, record, reqs, stats))
        entry.elapsed_s = seconds
        self.clock += seconds
        return MeasuredStart(entry, out)

    def _stats(self, s: Setting | None, n: int, decode_ms: float) -> WindowStats:
        """The counters an engine would report for n requests of max_tokens tokens."""
        tokens = float(n * self.params.max_tokens)
        if s is None:
            return WindowStats(verify_steps=tokens, drafted=0.0, accepted=0.0, tokens=tokens, decode_ms=decode_ms,
                               draft_ms=0.0, source="world")
        steps = max(1.0, round(tokens / self.world.accept_len(s)))
        rates = [float(self.rng.binomial(int(steps), min(1.0, q))) / steps for q in self.world.per_position(s)]
        accepted = min(tokens - steps, steps * sum(rates[:s.k]))
        cycle = decode_ms / steps
        draft = self.world.per_draft_ms * s.k * self.world.draft_share / self.world.cycle_ms(s, 1) * cycle
        return WindowStats(verify_steps=steps, drafted=steps * s.k, accepted=accepted, tokens=steps + accepted,
                           decode_ms=decode_ms, draft_ms=min(draft * steps, decode_ms), per_position=rates,
                           source="world")


def simulate(sweep: SweepParams, world: World, *, seed: int = 0, output_dir: str | Path) -> SweepResult:
    """Run `sweep` (its strategy and budget) on `world`; the record (kind "sweep-world") goes to output_dir."""
    def make() -> Sweep:
        record = new_record(sweep, kind="sweep-world", output_dir=output_dir)
        return Sweep(sweep, record, WorldSource(record, sweep, world, seed))

    with opened(make) as sw:
        return execute(sw, raise_on_failure=True, drift=False)


__all__ = ["World", "WorldSource", "simulate"]
