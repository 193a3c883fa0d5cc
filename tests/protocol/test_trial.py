"""The controlled trial end to end on a real local llama-server: CLI, record, failures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spectrial.errors import ConfigError
from spectrial.hosts.local import LocalHost
from spectrial.protocol.trial import run_trial
from spectrial.record.store import manifest_json

pytestmark = pytest.mark.slow
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]


def only_run(outputs: Path) -> Path:
    runs = [p for p in outputs.iterdir() if (p / "manifest.json").is_file()]
    assert len(runs) == 1, runs
    return runs[0]


def test_cli_trial_writes_complete_record(tiny_params, write_params, tmp_path):
    path = write_params(tiny_params)
    res = subprocess.run([*SPECTRIAL, "trial", str(path), "-p", "steps=3", "-p", "repeats=2", "--quiet"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    run = only_run(Path(tiny_params["output_dir"]))
    m = manifest_json(run)
    assert m["status"] == "ok" and m["reason"] is None
    assert m["params"]["steps"] == 3
    arms = {a["name"]: a for a in m["arms"]}
    assert list(arms) == ["baseline", "draft", "eagle3"]
    base, draft, eagle = arms["baseline"], arms["draft"], arms["eagle3"]
    for a in arms.values():
        assert a["status"] == "ok" and a["tok_s"] > 0 and a["argv"][0].endswith("llama-server")
        assert a["requests_ok"] == 2 and a["env_check"]["ok"]
    assert base["accept_len"] == 1.0 and base["break_even_accept_len"] == pytest.approx(1.0)
    # a real draft: accepted tokens counted by the server, accept length between 1 and steps + 1
    assert 0 < draft["accepted"] <= draft["drafted"] and 1.0 < draft["accept_len"] <= 4.0
    assert draft["verify_steps"] > 0 and draft["cycle_ms"] > 0
    assert draft["break_even_accept_len"] == pytest.approx(draft["cycle_ms"] / base["ms_per_token"])
    assert "--spec-draft-n-max" in draft["argv"] and draft["argv"][draft["argv"].index("--spec-draft-n-max") + 1] == "3"
    # the EAGLE-3 arm is labelled synthetic and carries the rates a, a^2, a^3 on its command line
    assert eagle["synthetic"] is True
    assert eagle["argv"][eagle["argv"].index("--spec-synth-rates") + 1] == "0.8,0.64,0.512"
    assert eagle["accepted"] > 0
    steps = [s["name"] for s in m["steps"]]
    assert steps[:3] == ["prepare", "kill_old_server", "verify_gpus_free"]
    assert steps.index("launch:baseline") < steps.index("benchmark:baseline") < steps.index("stop:baseline") \
        < steps.index("launch:draft")
    assert all(s["ok"] for s in m["steps"])
    assert (run / "requests.csv").is_file() and (run / "logs" / "llama-server-draft.log").is_file()
    assert "baseline" in res.stdout and "manifest.json" in res.stdout
    assert not LocalHost().port_holders(tiny_params["port"])


def test_missing_model_fails_before_launch_with_record(tiny_params, tmp_path):
    with pytest.raises(ConfigError, match="model file .* not found"):
        run_trial(None or _params(tiny_params, model=str(tmp_path / "nope.gguf")), progress=False)
    m = manifest_json(only_run(Path(tiny_params["output_dir"])))
    assert m["status"] == "failed" and "not found" in m["reason"]
    assert not any(s["name"].startswith("launch") for s in m["steps"])


def test_server_crash_marks_arm_failed_and_keeps_others(tiny_params, tmp_path):
    bad = tmp_path / "bad-draft.gguf"
    bad.write_bytes(b"GGUF" + b"\x01" * 100)
    p = _params(tiny_params, arms=[{"name": "baseline"}, {"name": "broken", "method": "draft", "draft": str(bad)}])
    from spectrial.errors import RunFailed

    with pytest.raises(RunFailed) as e:
        run_trial(p, progress=False)
    m = manifest_json(e.value.result.run_dir)
    assert m["status"] == "failed" and "broken" in m["reason"]
    arms = {a["name"]: a for a in m["arms"]}
    assert arms["baseline"]["status"] == "ok" and arms["broken"]["status"] == "failed"
    assert "exited before it became ready" in arms["broken"]["reason"]
    assert not LocalHost().port_holders(tiny_params["port"])
    assert json.loads((Path(e.value.result.run_dir) / "manifest.json").read_text())["status"] == "failed"


def test_dry_run_touches_nothing(tiny_params, write_params):
    path = write_params({**tiny_params, "env": {"NCCL_PROTO": "LL", "API_TOKEN": "s3cr3t-value"}})
    res = subprocess.run([*SPECTRIAL, "trial", str(path), "--dry-run", "--json"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    arms = json.loads(res.stdout)["launches"]
    assert [a["arm"] for a in arms] == ["baseline", "draft", "eagle3"]
    assert arms[0]["env"] == {"NCCL_PROTO": "LL", "API_TOKEN": "***"}
    assert "s3cr3t-value" not in res.stdout
    assert not Path(tiny_params["output_dir"]).exists()


def _params(tiny_params: dict, **over):
    from spectrial.params import load_params

    return load_params(data={**tiny_params, **over})
