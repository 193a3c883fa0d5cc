"""spectrial's Grafana dashboard (spectrial.watch.grafana) against Grafana's dashboard schema, as Grafana's own
Foundation SDK encodes it (PyPI `grafana-foundation-sdk`, generated from Grafana's schemas: every field of the
dashboard, panel, variable, annotation, Prometheus query and time-series option, with its type): the dashboard is
decoded into the SDK's models with Grafana's plugins registered, every value is checked against the model's type,
and encoding it again must give back every key (a key Grafana does not know is dropped, so it shows), except the
Prometheus annotation's own keys (`useValueForTime`, `titleFormat`, ...: the Prometheus datasource reads them from the
annotation, the schema leaves them to the datasource). A planted error of each kind fails the check. The dashboard's
PromQL is run against a real Prometheus in test_watch_prometheus.py (llama.cpp) and test_watch.py (vLLM)."""

from __future__ import annotations

import copy
import enum
import json
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from spectrial.watch import grafana

gd = pytest.importorskip("grafana_foundation_sdk.models.dashboard")
from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: E402
from grafana_foundation_sdk.cog.plugins import register_default_plugins  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "dashboards" / f"{grafana.UID}.json"
# what Grafana's Prometheus datasource reads from an annotation query, beside the schema's own fields
PROMETHEUS_ANNOTATION_KEYS = {"useValueForTime", "titleFormat", "textFormat", "tagKeys", "step"}


def type_errors(obj: Any, hint: Any, path: str) -> list[str]:
    """Where `obj` (decoded by the SDK) does not have the type the SDK's model declares."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is object or hint is Any:
        return []
    if origin in (typing.Union, types.UnionType):
        tries = [type_errors(obj, a, path) for a in args if obj is None or a is not type(None)]
        return [] if any(not t for t in tries) else min(tries, key=len)  # the nearest alternative's errors
    if hint is type(None):
        return [] if obj is None else [f"{path}: {obj!r} is not None"]
    if origin is typing.Literal:
        return [] if obj in args else [f"{path}: {obj!r} is not one of {args}"]
    if origin is list:
        if not isinstance(obj, list):
            return [f"{path}: {obj!r} is not a list"]
        return [e for i, x in enumerate(obj) for e in type_errors(x, args[0] if args else Any, f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(obj, dict):
            return [f"{path}: {obj!r} is not an object"]
        return [e for k, v in obj.items() for e in type_errors(v, args[1] if args else Any, f"{path}.{k}")]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            hint(obj.value if isinstance(obj, enum.Enum) else obj)
        except ValueError:
            return [f"{path}: {obj!r} is not one of {[m.value for m in hint]}"]
        return []
    if hint is bool:
        return [] if isinstance(obj, bool) else [f"{path}: {obj!r} is not a boolean"]
    if hint in (int, float):
        ok = isinstance(obj, int | float) and not isinstance(obj, bool) and (hint is float or isinstance(obj, int))
        return [] if ok else [f"{path}: {obj!r} is not {hint.__name__}"]
    if hint is str:
        return [] if isinstance(obj, str) else [f"{path}: {obj!r} is not a string"]
    if isinstance(hint, type):
        if not isinstance(obj, hint):
            return [f"{path}: {type(obj).__name__} is not {hint.__name__}"]
        hints = typing.get_type_hints(type(obj))
        return [e for name, h in hints.items() for e in type_errors(getattr(obj, name, None), h, f"{path}.{name}")]
    return []


def dropped(before: Any, after: Any, path: str = "") -> list[str]:
    """Keys of `before` that the SDK's encoding lost (keys it adds are its defaults)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [p for k, v in before.items()
                for p in ([f"{path}.{k}"] if k not in after else dropped(v, after[k], f"{path}.{k}"))]
    if isinstance(before, list) and isinstance(after, list):
        return [p for i, (x, y) in enumerate(zip(before, after, strict=False)) for p in dropped(x, y, f"{path}[{i}]")]
    return []


def schema_problems(d: dict[str, Any]) -> list[str]:
    """Everything in `d` that Grafana's dashboard schema (the SDK's models) does not take as it is."""
    register_default_plugins()
    problems = [f"required: {k}" for k in ("schemaVersion", "templating", "annotations") if k not in d]
    model = gd.Dashboard.from_json(d)
    problems += type_errors(model, gd.Dashboard, "dashboard")
    back = json.loads(json.dumps(model, cls=JSONEncoder))
    for path in dropped(d, back):
        if path.startswith(".annotations.list[") and path.rsplit(".", 1)[1] in PROMETHEUS_ANNOTATION_KEYS:
            continue
        problems.append(f"not in the schema: {path}")
    return problems


def test_the_dashboard_takes_grafanas_schema() -> None:
    d = grafana.dashboard()
    assert schema_problems(d) == []
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    cells = [(x, y) for p in d["panels"] for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
             for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])]
    assert len(cells) == len(set(cells)) and all(0 <= x < 24 for x, _ in cells), "panels overlap or leave the grid"
    for p in d["panels"]:
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        assert all(t["datasource"] == grafana.DS for t in p["targets"])
    assert {v["name"] for v in d["templating"]["list"]} == {"datasource", "job", "instance"}


@pytest.mark.parametrize("plant", ["unknown panel key", "gridPos a string", "bad variable type", "bad refresh",
                                   "query key unknown", "option key unknown"])
def test_the_schema_check_can_fail(plant: str) -> None:
    d = copy.deepcopy(grafana.dashboard())
    p = d["panels"][0]
    if plant == "unknown panel key":
        p["colour"] = "red"
    elif plant == "gridPos a string":
        p["gridPos"]["h"] = "8"
    elif plant == "bad variable type":
        d["templating"]["list"][1]["type"] = "sql"
    elif plant == "bad refresh":
        d["templating"]["list"][1]["refresh"] = 7
    elif plant == "query key unknown":
        p["targets"][0]["promql"] = p["targets"][0]["expr"]
    else:
        p["options"]["legend"]["position"] = "left"
    assert schema_problems(d), plant


def test_every_engine_metric_name_is_on_the_dashboard() -> None:
    """The names come from the engine modules' WATCH_METRICS (one place): each one a watch reads is queried."""
    text = grafana.dashboard_json()
    engines = grafana.engine_metrics()
    assert {m.engine for m in engines} == {"llamacpp", "vllm", "sglang"}
    for m in engines:
        for field in ("verify_steps", "drafted", "accepted", "accepted_minus", "accepted_per_pos", "tokens",
                      "requests_running", "requests_waiting"):
            name = getattr(m, field)
            if name:
                assert f"{name}{{" in text, (m.engine, field, name)
    assert grafana.CHANGE_METRIC in text


def test_the_committed_file_and_the_provisioning_are_what_the_command_writes(tmp_path: Path) -> None:
    assert COMMITTED.read_text() == grafana.dashboard_json(), "run: spectrial dashboard -o dashboards/" \
                                                              f"{grafana.UID}.json"
    res = subprocess.run([sys.executable, "-m", "spectrial.cli", "dashboard", "--provisioning", str(tmp_path / "p")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "p" / f"{grafana.UID}.json").read_text() == grafana.dashboard_json()
    provider = yaml.safe_load((tmp_path / "p" / "spectrial.yaml").read_text())
    (prov,) = provider["providers"]
    assert provider["apiVersion"] == 1 and prov["type"] == "file"
    assert Path(prov["options"]["path"]) == (tmp_path / "p").resolve()
    res = subprocess.run([sys.executable, "-m", "spectrial.cli", "dashboard", "-o", str(tmp_path / "no" / "d.json")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "cannot write the dashboard" in res.stderr, res.stderr


def test_pushed_change_points_parse_as_prometheus_reads_them_and_a_dead_gateway_is_a_note() -> None:
    from prometheus_client.parser import text_string_to_metric_families
    from sshd_plugin import free_port

    from spectrial.schema import WatchChange, WatchRecord
    from spectrial.watch import push

    w = WatchRecord(url="http://h:8000", engine="vllm", interval_s=1.0, speculation=True, detector="x")
    w.changes = [WatchChange(series="accept_len", index=7, at="2026-12-07T00:00:10.500000Z", at_s=10.5,
                             before_mean=2.634, after_mean=1.0312, relative_change=1.0312 / 2.634 - 1)]
    fams = {f.name: f for f in text_string_to_metric_families(push.exposition(w, w.changes).decode())}
    (s,) = fams["spectrial_watch_change_time_seconds"].samples
    assert s.value == 1796601610.5 and s.labels == {"engine": "vllm", "server": "http://h:8000", "series": "accept_len",
                                                    "index": "7", "direction": "down", "before": "2.63",
                                                    "after": "1.03"}
    assert fams["spectrial_watch_change_relative"].samples[0].value == pytest.approx(-0.6085, abs=1e-4)
    assert push.group_url("http://g:9091/", "w-1.a") == "http://g:9091/metrics/job/spectrial-watch/run_id/w-1.a"
    assert push.group_url("http://g:9091/", "run/1") == "http://g:9091/metrics/job/spectrial-watch/run_id@base64/cnVuLzE="
    dead = push.Pusher(f"127.0.0.1:{free_port()}")
    dead.bind("r1")
    problem = dead.push(w)
    dead.close()
    assert problem and "failed" in problem and "ConnectError" in problem, problem


def test_a_silent_gateway_holds_a_push_up_5_s_at_most() -> None:
    """A gateway that takes the connection and never answers (a listening socket nobody reads): the push gives up
    at its deadline, with a note, so the last push on the way out cannot hold an exit up."""
    import socket
    import time

    from spectrial.schema import WatchRecord
    from spectrial.watch import push

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        p = push.Pusher(f"http://127.0.0.1:{silent.getsockname()[1]}")
        p.bind("r1")
        t0 = time.monotonic()
        problem = p.push(WatchRecord(url="http://h:1", engine="vllm", interval_s=1.0, speculation=True, detector="x"))
        took = time.monotonic() - t0
        p.close()
    assert problem and "failed" in problem, problem
    assert push.PUSH.deadline_s - 0.5 <= took <= push.PUSH.deadline_s + 3, took
