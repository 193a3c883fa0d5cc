"""Prometheus `/metrics` snapshots, for every engine: read with prometheus_client's parser, subtract two.

A snapshot is {"name{label=value,...}": value} (labels sorted; no braces without labels). Counters are
cumulative since the server started, so `after - before` scopes them to a benchmark window; gauges are not
(SGLang's `spec_accept_length` is a gauge of its last log window: never subtract it).
"""

from __future__ import annotations

import re

import httpx
from prometheus_client.parser import text_string_to_metric_families

from spectrial.errors import ServerMisbehaved
from spectrial.measure.httpread import BoundExceeded
from spectrial.schema import CounterTotals, WatchMetrics

_LABEL_RE = re.compile(r'(\w+)=([^,}]*)')


def snapshot(client: httpx.Client, base_url: str) -> dict[str, float]:
    """Every sample of `/metrics` ({} when the server has no metrics endpoint). A body that breaks a bound of the
    client (spectrial.measure.httpread: size, deadline, encoding) or is not Prometheus text is ServerMisbehaved."""
    what = f"{base_url}/metrics"
    try:
        r = client.get(what)
    except BoundExceeded as exc:
        raise ServerMisbehaved(what, exc.problem, exc.limit) from None
    if r.status_code != 200:
        return {}
    out: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(r.text):
            for s in fam.samples:
                label = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{label}}}" if label else s.name] = float(s.value)
    except (ValueError, TypeError, IndexError, KeyError) as exc:  # prometheus_client's parser on what is not its text
        raise ServerMisbehaved(what, f"the body is not Prometheus text ({type(exc).__name__}: {str(exc)[:120]})",
                               hint="check what serves that address: a proxy or another program") from None
    return out


def total(snap: dict[str, float], name: str) -> float | None:
    """Sum of `name` over its label sets (None when absent)."""
    keys = [k for k in snap if k == name or k.startswith(name + "{")]
    return sum(snap[k] for k in keys) if keys else None


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    """Increase of counter `name` (summed over label sets) between two snapshots; None when absent after."""
    a = total(after, name)
    return None if a is None else a - (total(before, name) or 0.0)


def delta_by_label(before: dict[str, float], after: dict[str, float], name: str, label: str) -> dict[str, float]:
    """Increase of counter `name` per value of `label` (other labels summed)."""
    out: dict[str, float] = {}
    for key, v in after.items():
        if not key.startswith(name + "{"):
            continue
        labels = dict(_LABEL_RE.findall(key[len(name):]))
        if label in labels:
            out[labels[label]] = out.get(labels[label], 0.0) + v - before.get(key, 0.0)
    return out


def watch_totals(names: WatchMetrics, snap: dict[str, float]) -> CounterTotals:
    """One `/metrics` snapshot's cumulative totals and load gauges, read with an engine's `WATCH_METRICS` (None
    where the engine does not export one; accepted derived as `WatchMetrics.accepted_minus` says)."""

    def get(name: str | None) -> float | None:
        return total(snap, name) if name else None

    verify, tokens = get(names.verify_steps), get(names.tokens)
    accepted = get(names.accepted)
    if names.accepted is None and names.accepted_minus is not None and verify is not None and tokens is not None:
        accepted = tokens - (get(names.accepted_minus) or 0.0) - verify
    per_pos = delta_by_label({}, snap, names.accepted_per_pos, names.position_label) if names.accepted_per_pos else {}
    return CounterTotals(engine=names.engine, verify_steps=verify, drafted=get(names.drafted), accepted=accepted,
                         accepted_per_pos=per_pos, tokens=tokens, requests_running=get(names.requests_running),
                         requests_waiting=get(names.requests_waiting), start_time_s=get(names.start_time))
