"""Which points of a sweep record count: the speculative ones, the baseline per concurrency level, and their labels
(one selection for the verdict, the crossover and the figures)."""

from __future__ import annotations

from spectrial.schema import Manifest, PointRecord


def scenario_label(s: float | None) -> str:
    return "real acceptance" if s is None else f"synthetic a={s:g}"


def spec_points(manifest: Manifest) -> list[PointRecord]:
    """The static speculative settings' points (an engine policy's apart: `policy_points`)."""
    return [p for p in manifest.points if p.method != "none" and p.policy is None]


def policy_points(manifest: Manifest) -> list[PointRecord]:
    """The points of the engines' own run-time depth control (`policies` of a sweep)."""
    return [p for p in manifest.points if p.method != "none" and p.policy is not None]


def baseline_points(manifest: Manifest) -> dict[int, PointRecord]:
    """The first measured baseline point per concurrency level."""
    out: dict[int, PointRecord] = {}
    for p in manifest.points:
        if p.method == "none" and p.status == "ok":
            out.setdefault(p.concurrency, p)
    return out


def setting_label(p: PointRecord) -> str:
    if p.policy is not None:
        return f"policy {p.setting or p.arm}"
    label = f"s{p.steps}"
    if p.topk not in (None, 1):
        label += f" t{p.topk} n{p.draft_tokens}"
    return label
