"""Which points of a sweep record count: the speculative ones, the baseline per load level (a concurrency, or a
request rate), and their labels (one selection for the verdict, the crossover and the figures)."""

from __future__ import annotations

from spectrial.schema import Manifest, PointRecord
from spectrial.sweep.params import Load


def load_of(p: PointRecord) -> Load:
    """A point's load level: its concurrency, or its offered request rate (with the cap in flight)."""
    return Load(p.concurrency, p.offered_rate)


def load_order(x: Load) -> tuple[bool, float]:
    """Concurrency levels first (ascending), then request rates (ascending)."""
    return (x.rate is not None, x.rate if x.rate is not None else float(x.concurrency))


def load_short(x: Load) -> str:
    """"c=4", "2 req/s": a level in a legend or a hover."""
    return f"c={x.concurrency}" if x.rate is None else f"{x.rate:g} req/s"


def scenario_label(s: float | None) -> str:
    return "real acceptance" if s is None else f"synthetic a={s:g}"


def spec_points(manifest: Manifest) -> list[PointRecord]:
    """The static speculative settings' points (an engine policy's apart: `policy_points`)."""
    return [p for p in manifest.points if p.method != "none" and p.policy is None]


def policy_points(manifest: Manifest) -> list[PointRecord]:
    """The points of the engines' own run-time depth control (`policies` of a sweep)."""
    return [p for p in manifest.points if p.method != "none" and p.policy is not None]


def baseline_points(manifest: Manifest) -> dict[Load, PointRecord]:
    """The first measured baseline point per load level, in `load_order`."""
    out: dict[Load, PointRecord] = {}
    for p in manifest.points:
        if p.method == "none" and p.status == "ok":
            out.setdefault(load_of(p), p)
    return dict(sorted(out.items(), key=lambda kv: load_order(kv[0])))


def setting_label(p: PointRecord) -> str:
    if p.policy is not None:
        return f"policy {p.setting or p.arm}"
    label = f"s{p.steps}"
    if p.topk not in (None, 1):
        label += f" t{p.topk} n{p.draft_tokens}"
    return label
