"""Every committed run record loads into the manifest's typed sections (controller, host, engine, models,
model_info, workload) without losing or renaming a field: the values read through the models are the ones in
the JSON files, each section dumps back to exactly what the file holds, and no field of a committed record is
left undeclared (kept only as an extra)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from spectrial.record.store import load_record
from spectrial.schema import (
    Controller,
    EngineInfo,
    FileIdentity,
    HostFingerprint,
    HostInfo,
    ModelInfo,
    WorkloadDescription,
)

ROOT = Path(__file__).resolve().parents[2]
RECORDS = sorted((ROOT / "outputs" / "examples").rglob("manifest.json"))
SECTIONS = ("controller", "host", "engine", "model_info", "workload")


def test_the_committed_records_are_all_found() -> None:
    assert len(RECORDS) >= 17


def _undeclared(model: BaseModel, where: str) -> list[str]:
    """Paths of fields a model (and the models inside it) keeps only as extras."""
    out = [f"{where}.{k}" for k in model.model_extra or {}]
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for i, x in enumerate(items):
            if isinstance(x, BaseModel):
                out += _undeclared(x, f"{where}.{name}" + (f"[{i}]" if isinstance(value, list) else ""))
    return out


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: str(p.parent.relative_to(ROOT / "outputs" / "examples")))
def test_a_record_reads_through_the_models(path: Path) -> None:
    raw = json.loads(path.read_text())
    m = load_record(path.parent, settle=False)
    assert isinstance(m.host, HostInfo) and isinstance(m.engine, EngineInfo)
    assert all(isinstance(x, FileIdentity) for x in m.models)

    host, engine = raw.get("host") or {}, raw.get("engine") or {}
    assert m.host.name == host.get("name")
    assert (m.engine.name, m.engine.version) == (engine.get("name"), engine.get("version"))
    assert [x.path for x in m.models] == [x["path"] for x in raw.get("models") or []]
    assert [(x.size, x.head_tail_sha256) for x in m.models] == \
        [(x.get("size"), x.get("head_tail_sha256")) for x in raw.get("models") or []]
    assert m.engine.models == engine.get("models")
    if "binary_identity" in engine:
        assert m.engine.binary_identity is not None
        assert m.engine.binary_identity.head_tail_sha256 == engine["binary_identity"]["head_tail_sha256"]
    if "fingerprint" in host:
        fp = m.host.fingerprint
        assert isinstance(fp, HostFingerprint)
        assert (fp.hostname, fp.kernel, fp.cuda_version) == tuple(host["fingerprint"].get(k) for k in
                                                                  ("hostname", "kernel", "cuda_version"))
        assert fp.gpus == host["fingerprint"].get("gpus")
    if "gpus" in host:
        assert m.host.gpus is not None
        assert [g.name for g in m.host.gpus.gpus] == [g.get("name") for g in host["gpus"].get("gpus") or []]
    assert m.host.gpu_key == host.get("gpu_key") and m.host.checks == host.get("checks", [])
    if raw.get("controller"):
        assert isinstance(m.controller, Controller)
        assert (m.controller.host, m.controller.pid) == (raw["controller"]["host"], raw["controller"]["pid"])
    if raw.get("model_info"):
        assert isinstance(m.model_info, ModelInfo)
        assert (m.model_info.name, m.model_info.params_b) == (raw["model_info"]["name"], raw["model_info"]["params_b"])
    if raw.get("workload"):
        wl = m.workload
        assert isinstance(wl, WorkloadDescription)
        assert (wl.items, wl.categories, wl.endpoint) == tuple(raw["workload"].get(k) for k in
                                                               ("items", "categories", "endpoint"))
        assert [s.source for s in wl.sources] == [s["source"] for s in raw["workload"]["sources"]]

    for key in SECTIONS:  # written back, each section is what the file holds (nothing dropped, nothing added)
        section = getattr(m, key)
        dumped = section.model_dump(mode="json") if section is not None else None
        assert dumped == (raw.get(key) or ({} if key in ("host", "engine") else None)), key
        if section is not None:
            assert _undeclared(section, key) == []
    assert [x.model_dump(mode="json") for x in m.models] == (raw.get("models") or [])
    assert _undeclared(m.models[0], "models[0]") == [] if m.models else True


def test_a_field_never_set_stays_out_of_the_record() -> None:
    """The sections are written as found: an adapter's unset fields do not become nulls in the JSON."""
    eng = EngineInfo(name="llamacpp", binary="/bin/llama-server")
    assert eng.model_dump(mode="json") == {"binary": "/bin/llama-server", "name": "llamacpp"}
    eng.version = None
    assert eng.model_dump(mode="json") == {"version": None, "binary": "/bin/llama-server", "name": "llamacpp"}
    assert HostInfo(name="box").model_dump(mode="json") == {"name": "box"}


# ------------------------------------------------------------------ descriptions and `spectrial schema`
def _parts(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    """`model` and every model its fields hold (through lists, dicts and unions), recursively."""
    import typing

    def models_in(t: object) -> list[type[BaseModel]]:
        hit = [t] if isinstance(t, type) and issubclass(t, BaseModel) else []
        return hit + [m for a in typing.get_args(t) for m in models_in(a)]

    if model not in seen:
        seen.add(model)
        for f in model.model_fields.values():
            for m in models_in(f.annotation):
                _parts(m, seen)
    return seen


def test_every_field_of_the_manifest_and_its_parts_has_a_description() -> None:
    """What `spectrial schema` prints and the JSON Schema publishes: no field without a description, in the
    manifest and every model it holds (arms, starts, windows, requests, points, gate, watch, cluster, ...)."""
    from spectrial.schema import RECORD_PARTS, Manifest

    parts: set[type[BaseModel]] = set()
    for m in RECORD_PARTS.values():
        _parts(m, parts)
    assert len(parts) >= 60 and Manifest in parts
    missing = [f"{m.__name__}.{n}" for m in parts for n, f in m.model_fields.items()
               if not (f.description and f.description.strip())]
    assert missing == []
    schema = Manifest.model_json_schema()
    props = [(name, f, p) for name, d in [("Manifest", schema), *schema["$defs"].items()]
             for f, p in d.get("properties", {}).items()]
    assert len(props) > 800 and all(p.get("description") for _, _, p in props)


def test_cli_schema_is_a_table_by_default_and_json_on_request() -> None:
    import subprocess
    import sys

    run = [sys.executable, "-m", "spectrial.cli", "schema"]
    table = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == "Manifest: A run record's manifest.json." and lines[2].split() == ["field", "type", "description"]
    assert any(x.split()[:3] == ["arms", "list[ArmRecord]", "Every"] for x in lines)
    assert len(lines) < 80  # the manifest's own fields, not 2,801 lines of JSON
    part = subprocess.run([*run, "HostInfo"], capture_output=True, text=True, timeout=120)
    assert part.returncode == 0 and "gpu_key" in part.stdout and "params/hardware.yaml" in part.stdout
    full = subprocess.run([*run, "arm", "--json"], capture_output=True, text=True, timeout=120)
    assert json.loads(full.stdout)["title"] == "ArmRecord"
    bad = subprocess.run([*run, "nosuch"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "HostInfo" in bad.stderr
