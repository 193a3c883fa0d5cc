"""A Grafana dashboard for speculative decoding, for all three engines' metric names (`spectrial dashboard`).

The PromQL is written from each engine module's `WATCH_METRICS` (the one place its names live), the quantities as
`spectrial watch` defines them (spectrial.watch.sampler):

- accept length = 1 + accepted / verify steps (tokens per verify step, the bonus token included),
- acceptance rate = accepted / drafted (where the engine counts drafted tokens),
- per-position acceptance = accepted at position k / verify steps,
- drafted and accepted tokens/s, generated tokens/s, requests running and waiting,

each a rate over Grafana's `$__rate_interval`, summed per job and instance, so that one panel shows every server
the `job` / `instance` variables pick, whatever its engine (one query per engine; the others return nothing).
The change points `spectrial watch --push-gateway` pushed (spectrial.watch.push) are annotations: their value is
their time (`useValueForTime`).

Provisioning-ready: the datasource is a dashboard variable (any Prometheus), no `__inputs`, a fixed uid; drop the
file into a folder that a Grafana file provider reads (`spectrial dashboard --provisioning DIR` writes both).
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from spectrial.engines.base import BUILTINS
from spectrial.schema import WatchMetrics

UID = "spectrial-specdec"
TITLE = "Speculative decoding (spectrial)"
SCHEMA_VERSION = 39  # Grafana 11's dashboard JSON
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job=~"$job", instance=~"$instance"'
BY = "job, instance"
CHANGE_METRIC = "spectrial_watch_change_time_seconds"


def engine_metrics() -> list[WatchMetrics]:
    """Each built-in engine's `WATCH_METRICS` (its module imported by name)."""
    out = []
    for module in BUILTINS.values():
        names = getattr(importlib.import_module(module), "WATCH_METRICS", None)
        if isinstance(names, WatchMetrics):
            out.append(names)
    return out


def _rate(name: str, by: str = BY) -> str:
    return f"sum by ({by}) (rate({name}{{{SEL}}}[$__rate_interval]))"


def _accepted(m: WatchMetrics) -> str | None:
    """Accepted draft tokens per second (derived where the engine has no counter of them)."""
    if m.accepted:
        return _rate(m.accepted)
    if m.accepted_minus and m.tokens and m.verify_steps:
        return f"({_rate(m.tokens)} - {_rate(m.accepted_minus)} - {_rate(m.verify_steps)})"
    return None


def queries(m: WatchMetrics) -> dict[str, list[tuple[str, str]]]:
    """Panel key -> [(PromQL, legend)] of one engine (a panel the engine cannot fill is left out)."""
    legend = "{{job}} {{instance}} (" + m.engine + ")"
    out: dict[str, list[tuple[str, str]]] = {}
    acc = _accepted(m)
    if acc and m.verify_steps:
        out["accept_len"] = [(f"1 + {acc} / {_rate(m.verify_steps)}", legend)]
    if acc and m.drafted:
        out["accept_rate"] = [(f"{acc} / {_rate(m.drafted)}", legend)]
    if m.accepted_per_pos and m.verify_steps:
        pos = m.position_label
        out["per_position"] = [(f"{_rate(m.accepted_per_pos, f'{BY}, {pos}')} / on ({BY}) group_left "
                                f"{_rate(m.verify_steps)}", "{{job}} {{instance}} position {{" + pos + "}} (" +
                                m.engine + ")")]
    drafts = []
    if m.drafted:
        drafts.append((_rate(m.drafted), "drafted " + legend))
    if acc:
        drafts.append((acc, "accepted " + legend))
    if drafts:
        out["drafted_accepted"] = drafts
    if m.tokens:
        out["tok_s"] = [(_rate(m.tokens), legend)]
    load = [(f"sum by ({BY}) ({name}{{{SEL}}})", f"{what} {legend}")
            for name, what in ((m.requests_running, "running"), (m.requests_waiting, "waiting")) if name]
    if load:
        out["requests"] = load
    return out


# panel key -> (title, unit, description)
PANELS: dict[str, tuple[str, str, str]] = {
    "accept_len": ("Accept length (tokens per verify step)", "none",
                   "1 + accepted draft tokens / verify steps: the tokens each verify step commits, the bonus token "
                   "included (spectrial's accept length)."),
    "accept_rate": ("Acceptance rate (accepted / drafted)", "percentunit",
                    "Accepted draft tokens / drafted tokens (engines that count drafted tokens)."),
    "per_position": ("Per-position acceptance", "percentunit",
                     "Share of verify steps whose k-th drafted token was accepted (position 0 first)."),
    "drafted_accepted": ("Drafted vs accepted tokens/s", "short",
                         "Draft tokens proposed and accepted per second (rate over the interval)."),
    "tok_s": ("Generated tokens/s", "short", "Generated tokens per second, all requests (rate over the interval)."),
    "requests": ("Requests running / waiting", "short", "The engine's gauges of requests running and waiting."),
}


def _panel(pid: int, key: str, targets: list[tuple[str, str]], x: int, y: int) -> dict[str, Any]:
    title, unit, description = PANELS[key]
    return {
        "id": pid, "type": "timeseries", "title": title, "description": description, "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit, "custom": {"drawStyle": "line", "lineWidth": 1,
                                                               "showPoints": "never", "spanNulls": False}},
                        "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True, "calcs": []},
                    "tooltip": {"mode": "multi", "sort": "none"}},
        "targets": [{"datasource": DS, "refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                     "range": True, "editorMode": "code"} for i, (expr, legend) in enumerate(targets)],
    }


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {"type": "query", "name": name, "label": label, "datasource": DS,
            "query": {"query": query, "refId": f"{name}-values"}, "refresh": 2, "multi": True, "includeAll": True,
            "allValue": ".*", "sort": 1, "current": {"text": "All", "value": "$__all"}}


def dashboard() -> dict[str, Any]:
    """The dashboard (Grafana's JSON model; see the module docstring)."""
    engines = engine_metrics()
    per_engine = [queries(m) for m in engines]
    panels = []
    for n, key in enumerate(PANELS):
        targets = [t for q in per_engine for t in q.get(key, [])]
        panels.append(_panel(n + 1, key, targets, x=12 * (n % 2), y=8 * (n // 2)))
    annotations = [
        {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
         "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"},
        {"name": "spectrial change points", "datasource": DS, "enable": True, "hide": False, "iconColor": "orange",
         "expr": f"1000 * max by (run_id, engine, server, series, index, direction, before, after) "
                 f"({CHANGE_METRIC})",
         "useValueForTime": True, "step": "60s", "titleFormat": "{{series}} {{direction}}: {{before}} -> {{after}}",
         "textFormat": "spectrial watch {{run_id}} of {{server}} ({{engine}})", "tagKeys": "series,engine"},
    ]
    templating = [
        {"type": "datasource", "name": "datasource", "label": "Prometheus", "query": "prometheus", "refresh": 1,
         "current": {"text": "default", "value": "default"}},
        _variable("job", "job", "label_values(up, job)"),
        _variable("instance", "instance", 'label_values(up{job=~"$job"}, instance)'),
    ]
    return {
        "uid": UID, "title": TITLE, "tags": ["spectrial", "speculative-decoding", *(m.engine for m in engines)],
        "description": f"Speculative decoding on {', '.join(m.engine for m in engines)} servers (their own metric "
                       "names), with the change points spectrial watch found. Written by `spectrial dashboard`.",
        "editable": True, "graphTooltip": 1, "timezone": "utc", "refresh": "30s", "schemaVersion": SCHEMA_VERSION,
        "time": {"from": "now-6h", "to": "now"}, "fiscalYearStartMonth": 0, "liveNow": False, "weekStart": "",
        "annotations": {"list": annotations}, "templating": {"list": templating}, "panels": panels, "links": [],
    }


def dashboard_json() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"


PROVIDER = """# Grafana provisioning: a file provider that loads spectrial's dashboard (written by `spectrial dashboard
# --provisioning DIR`). Put this file in Grafana's provisioning/dashboards/ and point `path` at the folder that
# holds spectrial-specdec.json.
apiVersion: 1
providers:
  - name: spectrial
    folder: spectrial
    type: file
    disableDeletion: false
    allowUiUpdates: true
    options:
      path: {path}
"""
