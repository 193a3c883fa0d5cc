"""Where speculation stops paying under load (issue 40 item 1): per speculative setting of a sweep, the speed-up
against the baseline at each load level with its interval, and the level at which it stops paying. The load has two
axes, each its own crossover: concurrency levels (a closed loop) and request rates (`grid.request_rate`: an open loop,
"stops paying at 4 req/s").

    pays                the interval lies wholly above 1 (the verdict "faster")
    stops paying at c   the first level c, above one where it paid, whose interval is no longer wholly above 1
                        (the levels where it pays are named: a setting may pay only in the middle of the range)
    slower from c       the first level whose interval lies wholly below 1
    pays throughout     every measured level pays; "never pays" when none does

Each level's figures are the record's own comparison (the point's `speedup` and interval, `spectrial.analysis.figures`),
never recomputed here; an invalid measurement at a level (its validity checks, e.g. queueing) is neither paying nor
not paying: it is named, and the crossover is stated over the valid levels only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from spectrial.analysis.validity import is_invalid
from spectrial.readers.points import (
    baseline_points,
    load_of,
    load_order,
    policy_points,
    scenario_label,
    setting_label,
    spec_points,
)
from spectrial.schema import Manifest, PointRecord

Axis = Literal["concurrency", "request rate"]


def at(axis: Axis, x: float) -> str:
    """A level in words: "concurrency 4", "4 req/s"."""
    return f"concurrency {x:g}" if axis == "concurrency" else f"{x:g} req/s"


class Level(BaseModel):
    """One load level of one setting, as the record compared it with the baseline of that level."""

    concurrency: int
    offered_rate: float | None = Field(None, description="A request-rate level's offered rate, req/s")
    speedup: float | None = None
    ci: tuple[float, float] | None = None
    verdict: str | None = None
    tok_s: float | None = Field(None, description="tok/s per request (decode), the arm's")
    output_tok_s: float | None = Field(None, description="Output tokens per second of the window, all streams")
    goodput: float | None = Field(None, description="Requests per second that met every SLO")
    invalid: bool = False

    @property
    def pays(self) -> bool | None:
        if self.invalid or self.ci is None:
            return None
        return self.ci[0] > 1.0

    @property
    def x(self) -> float:
        """Its place on its axis: the concurrency, or the offered rate."""
        return self.offered_rate if self.offered_rate is not None else float(self.concurrency)


class Crossover(BaseModel):
    """One setting across the measured load levels of one axis (concurrency, or request rate)."""

    setting: str
    scenario: float | None = None
    axis: Axis = "concurrency"
    levels: list[Level] = Field(default_factory=list)
    pays_until: float | None = Field(None, description="The highest level of the first run of paying levels")
    stops_at: float | None = Field(None, description="The first level above a paying one that does not pay")
    slower_from: float | None = Field(None, description="The first level whose interval lies wholly below 1")

    def text(self) -> str:
        valid = [lv for lv in self.levels if lv.pays is not None]
        where = f"{self.setting} ({scenario_label(self.scenario)})"
        unit = "" if self.axis == "concurrency" else " req/s"
        name = "concurrency " if self.axis == "concurrency" else ""
        span = ("no level" if not valid else f"{at(self.axis, valid[0].x)}, the only level measured"
                if len(valid) == 1 else f"{name}{valid[0].x:g}-{valid[-1].x:g}{unit}")
        if not valid:
            out = f"{where}: no level with an interval: cannot say where it stops paying"
        elif all(lv.pays for lv in valid):
            out = f"{where}: pays over the whole measured range ({span})" if len(valid) > 1 else f"{where}: pays ({span})"
        elif not any(lv.pays for lv in valid):
            out = f"{where}: does not pay at any measured level ({span})"
        else:
            paying = ", ".join(f"{lv.x:g}" for lv in valid if lv.pays)
            out = f"{where}: pays at {name}{paying}{unit} of {span}"
            if self.stops_at is not None:
                stop = next(lv for lv in valid if lv.x == self.stops_at)
                where = f"{self.stops_at:g}" if self.axis == "concurrency" else at(self.axis, self.stops_at)
                out += (f"; stops paying at {where} ({stop.speedup:.2f}x "
                        f"[{stop.ci[0]:.2f}, {stop.ci[1]:.2f}])")  # type: ignore[index]
        if self.slower_from is not None:
            out += f"; slower from {at(self.axis, self.slower_from)}"
        bad = [f"{lv.x:g}" for lv in self.levels if lv.invalid]
        if bad:
            out += f"; invalid measurement at {name}{', '.join(bad)}{unit} (left out)"
        return out


def _level(p: PointRecord, base: PointRecord | None) -> Level:
    ci = (p.speedup_ci_low, p.speedup_ci_high) if p.speedup_ci_low is not None and p.speedup_ci_high is not None \
        else None
    sv = p.serving
    return Level(concurrency=p.concurrency, offered_rate=p.offered_rate, speedup=p.speedup, ci=ci, verdict=p.verdict, tok_s=p.tok_s,
                 output_tok_s=sv.output_tok_s if sv else None, goodput=sv.goodput if sv else None,
                 invalid=is_invalid(p.verdict) or (base is not None and is_invalid(base.verdict)))


def axis_of(p: PointRecord) -> Axis:
    return "concurrency" if p.offered_rate is None else "request rate"


def crossovers(manifest: Manifest, axis: Axis | None = None) -> list[Crossover]:
    """Every speculative setting (and scenario) of a sweep record across its load levels: one crossover per axis it
    was measured on (`axis`: only that one)."""
    bases = baseline_points(manifest)
    groups: dict[tuple[str, float | None, Axis], list[PointRecord]] = {}
    for p in [*spec_points(manifest), *policy_points(manifest)]:
        if p.status == "ok" and axis in (None, axis_of(p)):
            groups.setdefault((setting_label(p), p.scenario, axis_of(p)), []).append(p)
    out = []
    for (label, scenario, ax), pts in sorted(groups.items(), key=lambda kv: kv[0][2] != "concurrency"):
        levels = [_level(p, bases.get(load_of(p))) for p in sorted(pts, key=lambda x: load_order(load_of(x)))]
        c = Crossover(setting=label, scenario=scenario, axis=ax, levels=levels)
        valid = [lv for lv in levels if lv.pays is not None]
        for prev, lv in zip(valid, valid[1:], strict=False):
            if prev.pays and not lv.pays:
                c.pays_until, c.stops_at = prev.x, lv.x
                break
        c.slower_from = next((lv.x for lv in valid if lv.ci is not None and lv.ci[1] < 1.0), None)
        out.append(c)
    return out


def policy_lines(manifest: Manifest) -> list[str]:
    """Each engine policy against the best static setting measured at each level (the record's comparison,
    `PointRecord.vs_best_static`): one line per policy."""
    groups: dict[str, list[PointRecord]] = {}
    for p in policy_points(manifest):
        if p.status == "ok" and p.vs_best_static is not None:
            groups.setdefault(setting_label(p), []).append(p)
    out = []
    for label, pts in groups.items():
        parts = []
        for p in sorted(pts, key=lambda x: load_order(load_of(x))):
            v = p.vs_best_static
            assert v is not None
            where = at(axis_of(p), load_of(p).rate or p.concurrency)
            if v.ratio is None:
                parts.append(f"{where}: {v.verdict}")
                continue
            ci = f" [{v.ci_low:.2f}, {v.ci_high:.2f}]" if v.ci_low is not None and v.ci_high is not None else ""
            parts.append(f"{where}: {v.ratio:.2f}x{ci} of the best static setting "
                         f"({v.best_static}), {v.verdict}")
        out.append(f"{label} against the best static depth at each level: " + "; ".join(parts))
    return out
