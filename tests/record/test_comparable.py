"""One answer to "are two runs comparable?" (spectrial.record.comparable, issue 38): every category detected with
its reason, from the committed reference record (tests/golden/gate/manifest.json, a real llama.cpp trial) and a
copy that differs in exactly one thing; equal records comparable; and the gate, diff, drift, the history and the
doctor all asking the one function, for the same pair the same categories."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spectrial.record import comparable as cmp
from spectrial.record.comparable import CATEGORIES, WHY, Comparability, Facts, compare
from spectrial.record.store import as_manifest
from spectrial.schema import Manifest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "gate" / "manifest.json"
Edit = Callable[[dict[str, Any]], None]


def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


def edited(edit: Edit) -> Manifest:
    data = golden()
    edit(data)
    return as_manifest(data)


def _arm(d: dict[str, Any], name: str) -> dict[str, Any]:
    return next(a for a in d["arms"] if a["name"] == name)


def _resolved(slots: int) -> Edit:
    """The draft arm's configuration check as a llama.cpp start records it, its server resolving `slots` slots."""
    def edit(d: dict[str, Any]) -> None:
        _arm(d, "draft-simple")["config_check"] = {"mode": "fail", "ok": slots == 1, "settings": [
            {"setting": "slots (-np)", "key": "slots", "asked": 1, "resolved": slots, "where": "GET /props total_slots",
             "state": "match" if slots == 1 else "mismatch"},
            {"setting": "model file (-m)", "key": "model", "asked": "/a/target.gguf", "resolved": f"/home{slots}/t.gguf",
             "where": "GET /props model_path", "state": "match"}]}
    return edit


# one edit per category: the copy differs from the reference in that one thing (a third item: an edit made to both,
# for a category compared only where both runs record it)
ONE_THING: dict[str, tuple[Edit, ...]] = {
    "GPU": (lambda d: d["host"]["fingerprint"].update(gpus=[{"name": "NVIDIA H100 80GB HBM3"}]), "GPUs"),
    "host": (lambda d: d["host"]["fingerprint"].update(kernel="6.1.0"), "kernel"),
    "model": (lambda d: d["params"].update(model="tiny:other"), "target"),
    "model files": (lambda d: d["models"][0].update(head_tail_sha256="0000000000000000"), "file target.gguf"),
    "engine": (lambda d: d["engine"].update(name="vllm"), "name"),
    "engine version": (lambda d: d["engine"].update(version="version: 9999 (abc)"), "version"),
    "engine build": (lambda d: d["engine"]["binary_identity"].update(head_tail_sha256="0000000000000000"), "binary"),
    "workload": (lambda d: d["params"].update(max_tokens=7), "max_tokens"),
    "sampling": (lambda d: d["params"]["sampling"].update(temperature=0.7), "sampling"),
    "concurrency": (lambda d: d["params"].update(concurrency=4), "concurrency"),
    "repeats": (lambda d: d["params"].update(repeats=3), "repeats"),
    "configuration": (lambda d: _arm(d, "baseline")["argv"].__setitem__(-1, "2"), "-t"),
    "arm settings": (lambda d: _arm(d, "draft-simple").update(steps=4), "steps"),
    "resolved config": (_resolved(2), "slots", _resolved(1)),
    "fingerprint key": (lambda d: d.update(fingerprint_key="000000000000"), "key"),
    "session": (lambda d: d.update(run_id="another-run"), "run"),
}


def test_every_category_has_a_case_and_a_reason() -> None:
    assert set(ONE_THING) == set(CATEGORIES) == set(WHY)
    assert all(reason and fix for reason, fix in WHY.values())


@pytest.mark.parametrize("category", list(ONE_THING))
def test_each_category_is_detected_with_its_reason(category: str) -> None:
    edit, field, *both = ONE_THING[category]
    base: Edit = both[0] if both else (lambda d: None)
    a, b = edited(base), edited(lambda d: (base(d), edit(d)))
    c = compare(a, b)
    assert c.categories() == [category], [d.text() for d in c.differences]
    (d,) = c.differences
    assert (d.category, d.field, d.recorded) == (category, field, "both")
    assert (d.reason, d.fix) == WHY[category] and not c.comparable
    assert compare(a, b, ignore=[category]).comparable  # a reader that allows it
    assert compare(a, b, require=[x for x in CATEGORIES if x != category]).comparable
    assert compare(b, a).categories() == [category]  # either way round


def test_equal_records_are_comparable() -> None:
    a = as_manifest(golden())
    c = compare(a, as_manifest(golden()))
    assert isinstance(c, Comparability) and c.comparable and c.differences == []
    assert c.required == list(CATEGORIES)


def test_arms_compare_their_own_settings_and_launch() -> None:
    a = edited(lambda d: _arm(d, "draft-simple").update(env={"NCCL_PROTO": "LL"}))
    c = compare(a, a, arms=("draft-simple", "eagle3-synthetic"))
    assert c.categories() == ["configuration", "arm settings"]
    fields = {d.field for d in c.of("arm settings")}
    assert {"method", "draft"} <= fields and "steps" not in fields  # both depth 2
    assert compare(a, a, arms=("baseline", "baseline")).comparable


def test_recorded_in_one_run_only_and_what_is_no_difference() -> None:
    a = as_manifest(golden())
    b = edited(lambda d: d["engine"].pop("version"))
    (d,) = compare(a, b).differences
    assert d.category == "engine version" and d.recorded == "a" and not compare(a, b).comparable
    # a model file's identity one run did not record, or a file only one run names: not known to differ
    c = edited(lambda d: d["models"][0].update(head_tail_sha256=None))
    assert compare(a, c).comparable
    e = edited(lambda d: d["models"].pop())
    assert compare(a, e).comparable
    # the model set rebuilt in another folder: paired by file name
    f = edited(lambda d: [m.update(path=m["path"].replace("tiny-2-", "tiny-9-")) for m in d["models"]])
    assert compare(a, f).comparable
    # another GPU: the GPU units, driver and clocks recorded with it in one run only say nothing more
    g = edited(lambda d: d["host"]["fingerprint"].update(gpus=[{"name": "H100", "uuid": "GPU-1",
                                                                "driver_version": "550"}]))
    assert compare(a, g).categories() == ["GPU"]
    # strict: a category a reader needs recorded, recorded in neither
    none = Facts(values={"host": {"host": None}})
    assert compare(none, none).comparable
    (d,) = compare(none, none, strict=["host"]).differences
    assert d.recorded == "neither"


# ------------------------------------------------------------------ the five readers ask the one function
@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str], bool]]:
    """Every call of the one function: (the caller's module, the categories that differ, comparable)."""
    import inspect

    seen: list[tuple[str, list[str], bool]] = []
    real = cmp.compare

    def spy(*args: Any, **kwargs: Any) -> Comparability:
        c = real(*args, **kwargs)
        caller = inspect.stack()[1].frame.f_globals["__name__"]
        seen.append((caller, c.categories(blocking=False), c.comparable))
        return c

    monkeypatch.setattr(cmp, "compare", spy)
    return seen


def _write(folder: Path, data: dict[str, Any]) -> Path:
    run = folder / data["run_id"]
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps(data))
    return run


def test_the_five_readers_go_through_the_one_function(tmp_path: Path, calls: list[tuple[str, list[str], bool]]
                                                      ) -> None:
    """The reference run and a later run of another engine version (the same fingerprint key, as a record whose
    key predates the version's count would have): each reader gets the same two categories from the one
    function, and keeps its own verdict by what it requires."""
    from spectrial.gate import GateTolerances, run_gate
    from spectrial.protocol.drift import check_drift
    from spectrial.readers import history
    from spectrial.readers.diagnose import diagnose
    from spectrial.readers.diff import comparability

    ref = golden()
    ref.update(run_id="ref", drift=None)
    cand = copy.deepcopy(ref)
    cand.update(run_id="cand", started_at="2026-12-06T10:00:00.000+00:00")
    cand["engine"]["version"] = "version: 9999 (abc)"
    run_ref, run_cand = _write(tmp_path, ref), _write(tmp_path, cand)
    a, b = as_manifest(cand), as_manifest(ref)
    want = ["engine version", "session"]

    gate = run_gate(run_cand, GateTolerances(), reference=run_ref)
    assert gate.outcome == "not comparable" and gate.exit_code == 2
    assert any(line.startswith("engine_version differs from ref") for line in gate.not_comparable)
    verdict = comparability(b, a)
    assert verdict.verdict == "not comparable: different engine build" and not verdict.comparable
    drift = check_drift(a, tmp_path)  # drift requires the fingerprint key, which stands for the build
    assert drift.checked and drift.n_earlier == 1
    rows = history.load_history(tmp_path).table.set_index(["run", "arm"])
    why = history.incomparability(rows.loc[("ref", "baseline")].to_dict() | {"run": "ref", "arm": "x"},
                                  rows.loc[("cand", "baseline")].to_dict() | {"run": "cand", "arm": "y"})
    assert any(r.startswith("different sessions") for r in why)
    assert any(r.startswith("different engine version") for r in why)

    by: dict[str, list[tuple[list[str], bool]]] = {}
    for caller, categories, comparable in calls:
        by.setdefault(caller, []).append((categories, comparable))
    assert by["spectrial.gate.judge"] == [(want, False)]
    assert by["spectrial.readers.diff"] == [(want, False)]
    assert by["spectrial.protocol.drift"] == [(want, True)]  # the earlier run counts: same key
    assert by["spectrial.readers.history"] == [(want, False)]

    calls.clear()  # the doctor: the drift it recomputes (the same pair)
    diagnose(run_cand)
    assert ("spectrial.protocol.drift", want, True) in calls, calls
    calls.clear()  # and its pairs of one configuration measured twice (the seed case), through the history's rows
    pair = diagnose(REPO / "outputs" / "examples" / "case-kimi-k25-pcie").of("not_comparable")
    assert pair and "different sessions" in pair[0].detail
    assert [c for c in calls if c[0] == "spectrial.readers.history" and "session" in c[1]], calls
