"""The record's params, typed (issue 38, item 4): `spectrial.schema.RecordedParams`.

A manifest's params are validated once, when the manifest is read: the fields readers use are typed attributes
(`m.params.concurrency`), every other field is kept as written, and written back the params are the mapping as read,
byte for byte. No reader in lib/ goes back to re-reading them as a mapping (`.params.get(...)`, `.params[...]`).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from spectrial.errors import ConfigError, RecordDamaged
from spectrial.params import TrialParams
from spectrial.record.store import RunRecord, dump_json, load_record, read_manifest, trial_params
from spectrial.schema import Manifest, RecordedParams

REPO = Path(__file__).resolve().parents[2]
RECORDS = sorted([*REPO.glob("outputs/examples/**/manifest.json"), *REPO.glob("tests/golden/**/manifest.json"),
                  *(REPO / "tests" / "fixtures" / "records").glob("*.json")])
CASE = REPO / "outputs" / "examples" / "case-kimi-k25-pcie" / "manifest.json"
V1 = REPO / "tests" / "fixtures" / "records" / "v1-h200-8b-nb02.json"


def _params_text(path: Path) -> str:
    return json.dumps(json.loads(path.read_text())["params"], indent=2)


def test_the_committed_records_are_there() -> None:
    assert len(RECORDS) >= 15 and CASE in RECORDS and V1 in RECORDS
    assert all("params" in json.loads(p.read_text()) for p in RECORDS)


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_a_committed_record_read_and_written_again_holds_the_same_params(path: Path, tmp_path: Path) -> None:
    m = read_manifest(path)
    assert isinstance(m.params, RecordedParams)
    written = json.loads(path.read_text())["params"]
    assert m.params.as_dict() == written and list(m.params.keys()) == list(written)
    assert json.dumps(m.model_dump(mode="json")["params"], indent=2) == _params_text(path)
    # as RunRecord.save writes a manifest, and read back again
    out = tmp_path / "manifest.json"
    dump_json(out, m.model_dump(mode="python", serialize_as_any=True))
    assert _params_text(out) == _params_text(path)
    assert read_manifest(out).params == m.params
    # no committed record needs the leniency: every field it holds reads as written
    typed = {k: getattr(m.params, k) for k in written if k in RecordedParams.model_fields}
    assert typed == {k: written[k] for k in typed}


def test_typed_fields_of_an_old_record() -> None:
    m = read_manifest(V1)  # schema version 1
    p = m.params
    assert (p.engine, p.host, p.concurrency, p.output_dir) == ("llamacpp", "local", 1, "/tmp/spectrial-runs")
    assert isinstance(p.model, str) and isinstance(p.repeats, int) and isinstance(p.max_tokens, int)
    assert isinstance(p.env, dict) and isinstance(p.arms, list) and all(isinstance(a, dict) for a in p.arms)
    assert p.request_format is None and "request_format" not in p  # before workloads: not recorded


def test_typed_fields_of_the_hand_made_case() -> None:
    p = read_manifest(CASE).params
    assert p.workload == "single-stream decode (batch 1)"  # words, not sources
    assert isinstance(p.draft, dict) and p.draft["validation_accuracy"] == pytest.approx(0.747)
    assert p["draft"] == p.draft  # a held field reads as a mapping's too (notebooks)
    assert isinstance(p.launch_command, str) and p.engine is None
    assert "concurrency" not in p and p.concurrency == 1  # not recorded: the default readers take
    with pytest.raises(KeyError):
        p["concurrency"]


def test_defaults_where_a_record_leaves_fields_out() -> None:
    m = Manifest.model_validate({"run_id": "r", "status": "ok", "params": {"model": "m"}})
    p = m.params
    assert (p.model, p.host, p.output_dir, p.concurrency, p.baseline, p.rounds) == ("m", "local", "outputs", 1,
                                                                                    "default", 1)
    assert p.repeats is None and p.env is None and p.workload is None
    assert m.model_dump(mode="json")["params"] == {"model": "m"}  # the defaults are not written
    assert Manifest(run_id="r").model_dump(mode="json")["params"] == {}


def test_an_unknown_field_is_kept_in_its_place(tmp_path: Path) -> None:
    given = {"engine": "llamacpp", "brand_new": {"a": [1, 2.5, None]}, "concurrency": 2, "zzz": "last"}
    run = tmp_path / "r"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"run_id": "r", "status": "ok", "params": given}))
    m = load_record(run)
    assert m.params.brand_new == {"a": [1, 2.5, None]} and "brand_new" in m.params
    assert (m.params.model_extra or {})["zzz"] == "last" and m.params.concurrency == 2
    dump_json(run / "manifest.json", m.model_dump(mode="python", serialize_as_any=True))
    assert json.loads((run / "manifest.json").read_text())["params"] == given
    assert list(json.loads((run / "manifest.json").read_text())["params"]) == list(given)


def test_a_value_not_of_its_type_reads_as_the_default_and_is_written_as_it_was() -> None:
    given = {"concurrency": "many", "port": [1], "env": "X=1", "engine": "vllm"}
    m = Manifest.model_validate({"run_id": "r", "status": "ok", "params": given})
    assert (m.params.concurrency, m.params.port, m.params.env, m.params.engine) == (1, None, None, "vllm")
    assert "concurrency" in m.params
    assert m.model_dump(mode="json")["params"] == given


@pytest.mark.parametrize("params", [[1, 2], "x", 5, True])
def test_params_that_are_no_mapping_are_a_damaged_record(tmp_path: Path, params: object) -> None:
    raw = json.dumps({"run_id": "r", "status": "ok", "params": params}).encode()
    (tmp_path / "manifest.json").write_bytes(raw)
    with pytest.raises(RecordDamaged, match="params"):
        load_record(tmp_path)
    assert (tmp_path / "manifest.json").read_bytes() == raw


def test_writers_give_a_mapping_or_a_model_and_secrets_stay_masked(tmp_path: Path) -> None:
    rec = RunRecord(tmp_path, "t", params={"env": {"HF_TOKEN": "very-secret-value", "PLAIN": "x"}, "max_tokens": 8})
    assert rec.manifest.params.env == {"HF_TOKEN": "***", "PLAIN": "x"} and rec.manifest.params.max_tokens == 8
    text = rec.manifest_path.read_text()
    assert "very-secret-value" not in text and json.loads(text)["params"]["env"]["HF_TOKEN"] == "***"
    t = TrialParams(model="tiny:target", concurrency=3)
    rec2 = RunRecord(tmp_path, "t2", params=t)
    assert rec2.manifest.params.concurrency == 3 and rec2.manifest.params.as_dict() == t.model_dump(mode="json")
    assert load_record(rec2.dir).params == rec2.manifest.params


def test_a_field_set_on_the_model_is_written_as_set() -> None:
    m = Manifest.model_validate({"run_id": "r", "status": "ok", "params": {"b": 1, "concurrency": 2}})
    m.params.concurrency = 4
    m.params.port = 9000
    assert m.model_dump(mode="json")["params"] == {"b": 1, "concurrency": 4, "port": 9000}


def test_trial_params_validates_a_record_once_for_the_readers_that_need_the_full_model() -> None:
    m = read_manifest(REPO / "tests" / "golden" / "gate" / "manifest.json")
    t = trial_params(m)
    assert isinstance(t, TrialParams) and t.concurrency == m.params.concurrency and t.engine == m.params.engine
    with pytest.raises(ConfigError, match="case"):
        trial_params(read_manifest(CASE), "the case's params")


# ------------------------------------------------------------------ no reader goes back to the mapping
def _mapping_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """`X.params.get(...)`, `X.params[...]` and `X.get("params", ...)`: a record's params read as a mapping."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            owner = node.func.value
            of_params = isinstance(owner, ast.Attribute) and owner.attr == "params"  # X.params.get(...)
            params_of = (bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "params"
                         and not (isinstance(owner, ast.Name) and owner.id in _RAW_JSON_NAMES))  # X.get("params")
            if of_params or params_of:
                out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "params":
            out.append((node.lineno, ast.unparse(node)))
    return out


# names of raw JSON a module parses itself (a server's /slots and /props answers, a manifest mapping before it is
# validated): their "params" is no record's
_RAW_JSON_NAMES = {"s", "gen", "out"}


def test_no_reader_in_lib_reads_the_params_as_a_mapping() -> None:
    found = []
    for path in sorted((REPO / "lib" / "spectrial").rglob("*.py")):
        text = path.read_text()
        found += [f"{path.relative_to(REPO)}:{line}: {src}" for line, src in _mapping_reads(ast.parse(text))]
        found += [f"{path.relative_to(REPO)}: {ln.strip()}" for ln in text.splitlines() if ".params.get(" in ln]
    assert found == [], "read the typed fields (m.params.concurrency), not the mapping:\n" + "\n".join(found)


def test_the_guard_sees_what_it_guards() -> None:
    src = 'a = m.params.get("concurrency")\nb = ctx.params["workload"]\nc = manifest.get("params", {})\n' \
          'd = (s.get("params") or {}).get("speculative.types")\ne = m.params.concurrency\n'
    assert [line for line, _ in _mapping_reads(ast.parse(src))] == [1, 2, 3]
