"""Issue 39 item 1: the configuration the engine resolved, read back from the running server and compared with what
the arm asked (spectrial.servers.configcheck). Real llama-server: an `extra_args` entry that overrides the params
(llama-server takes the last -np) fails the arm under `config_check: fail`, naming the setting, asked vs resolved
and where it was read; under `warn` the arm is measured and its validity warns; `diff` and the one comparability
answer see the resolved settings.
The SGLang double's case is in tests/engines/test_sglang_standin_trial.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spectrial.errors import MeasurementRejected
from spectrial.params import load_params
from spectrial.protocol.trial import run_trial
from spectrial.readers.diff import diff_runs
from spectrial.record import comparable as cmp
from spectrial.record.store import load_record, manifest_json
from spectrial.schema import ConfigCheckRecord
from spectrial.servers.configcheck import check, setting


# --- the comparison rule --------------------------------------------------------------------------------------
def test_each_state_of_a_setting() -> None:
    assert setting("slots", "slots", 2, 2, "GET /props total_slots").state == "match"
    assert setting("slots", "slots", 2, 1, "GET /props total_slots").state == "mismatch"
    assert setting("steps", "depth", 3, None, "not exposed").state == "unread"  # never a failure
    assert setting("dp", "dp", None, 1, "GET /server_info dp_size").state == "chosen"  # the engine's own choice
    assert setting("model", "m", "/a/b//target/", "/a/b/target", "x").state == "match"  # one path, two spellings
    assert setting("method", "m", "EAGLE3", "eagle3", "x").state == "match"
    low = setting("max_running", "max running", 64, 48, "GET /server_info max_running_requests", at_least=True)
    assert (low.state, low.asked) == ("mismatch", ">= 64")
    assert setting("max_running", "max running", 4, 48, "x", at_least=True).state == "match"


def test_the_check_says_what_differs_and_what_was_not_read() -> None:
    c = check([setting("slots", "slots (-np)", 2, 1, "GET /props total_slots"),
               setting("context", "context per slot", 512, 512, "GET /slots n_ctx"),
               setting("steps", "draft depth", 3, None, "not exposed")], "warn")
    assert c.ok is False and c.mode == "warn" and [s.key for s in c.mismatches] == ["slots"]
    assert c.summary == ("1 of 2 setting(s) resolved otherwise than asked: slots (-np): asked 2, resolved 1 "
                         "(GET /props total_slots); not exposed: steps")
    assert c.resolved == {"slots": 1, "context": 512} and c.key is not None
    same = check([setting("slots", "slots (-np)", 2, 2, "GET /props total_slots"),
                  setting("context", "context per slot", 512, 512, "GET /slots n_ctx")])
    assert same.ok is True and same.key != c.key  # another resolved configuration, another key
    assert check([setting("steps", "draft depth", 3, None, "not exposed")]).ok is None  # nothing read: unknown


# --- real llama-server --------------------------------------------------------------------------------------------
def _params(tiny_params: dict[str, Any], tmp: Path, **over: Any) -> dict[str, Any]:
    data = {**tiny_params, "output_dir": str(tmp / "outputs"), "repeats": 1, "max_tokens": 16, "concurrency": 2,
            "arms": [{"name": "baseline"}, {"name": "draft", "method": "draft"}]}
    data.update(over)
    return data


def _run(path: Path) -> Path:
    (run,) = [p for p in path.iterdir() if (p / "manifest.json").is_file()]
    return run


@pytest.mark.slow
def test_llama_server_resolving_other_slots_fails_the_arm_or_warns(tiny_params, tmp_path):
    # a clean run: everything read back matches (the draft depth is not exposed by llama-server: listed)
    clean = run_trial(load_params(data=_params(tiny_params, tmp_path / "a")), progress=False)
    for s in clean.manifest.starts:
        c = s.config_check
        assert c is not None and c.ok is True, c.summary if c else None
        got = {x.key: x for x in c.settings}
        assert got["slots"].resolved == 2 and got["slots"].where == "GET /props total_slots"
        assert got["context"].resolved == tiny_params["engine_config"]["ctx_size"]
    draft = {x.key: x for x in clean.manifest.arm("draft").config_check.settings}
    assert draft["method"].resolved == "draft-simple" and draft["draft_model"].state == "match"
    assert draft["steps"].state == "unread" and "reports no draft depth" in draft["steps"].where

    # -np 1 in the arm's extra_args overrides the params' 2 slots: the default (fail) stops before measuring it
    override = [{"name": "baseline"}, {"name": "draft", "method": "draft", "extra_args": ["-np", "1"]}]
    with pytest.raises(MeasurementRejected) as exc:
        run_trial(load_params(data=_params(tiny_params, tmp_path / "b", arms=override)), progress=False)
    e = exc.value
    assert e.check == "config_check" and e.arm == "draft" and isinstance(e.result, ConfigCheckRecord)
    assert "slots (-np): asked 2, resolved 1 (GET /props total_slots)" in str(e)
    assert "extra_args" in e.hint and "config_check: warn" in e.hint
    m = manifest_json(_run(tmp_path / "b" / "outputs"))
    assert m["status"] == "failed" and "resolved another configuration" in m["reason"]
    bad = [s for s in m["starts"] if s["arm"] == "draft"][0]
    assert bad["status"] == "failed" and bad["config_check"]["ok"] is False
    assert not any(st["name"].startswith("benchmark:draft") and st.get("ok") for st in m["steps"])

    # under warn the arm is measured; its validity warns (a warning: the verdict stands) and says the same
    warned = run_trial(load_params(data=_params(tiny_params, tmp_path / "c", arms=override, config_check="warn")),
                       progress=False)
    arm = warned.manifest.arm("draft")
    assert arm.status == "ok" and arm.config_check is not None and arm.config_check.ok is False
    (chk,) = [c for c in arm.validity.checks if c.name == "resolved_config"]
    assert chk.ok is False and chk.severity == "warning" and "resolved_config" in arm.validity.warnings
    assert "slots (-np): asked 2, resolved 1" in chk.summary and chk.evidence["resolved"]["slots"] == 1

    # diff and the one comparability answer see what the engine resolved
    a, b = _run(tmp_path / "a" / "outputs"), _run(tmp_path / "c" / "outputs")
    texts = [f.text for f in diff_runs(a, b)]
    assert any("arm draft resolved config" in t and "slots" in t for t in texts), texts
    assert any(t.startswith("arm draft in run B: the engine resolved another configuration") for t in texts)
    c = cmp.compare(load_record(a), load_record(b), arms=("draft", "draft"))
    assert [(d.field, d.a, d.b) for d in c.of("resolved config")] == [("slots", "as asked", 1),
                                                                        ("context", "as asked", 1024)]
