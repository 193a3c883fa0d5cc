"""Security at trial level, through real SSH (issue 7, part 4).

1. A whole trial with hostile values in every param that reaches a command line or a path on the host
   (env values, extra_args, model path, engine_bin, work_dir, state_dir, ssh.cache_dir): they arrive
   literally (the env check reads them back from /proc, the argv is recorded as given) and the canary file
   that any shell interpretation would create never exists.
2. Hostile values where only names or addresses belong (arm names, node addresses, rpc endpoints, host
   specs) are rejected by validation, before anything runs.
3. A secret env value is masked in the record and redacted from the server log copied back, although the
   server printed it; files spectrial writes on the host are user-only.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from sshd_plugin import SshdServer
from test_ssh_trial import ssh_params

from spectrial.errors import ConfigError
from spectrial.params import load_params
from spectrial.protocol.trial import run_trial
from spectrial.record.store import manifest_json

pytestmark = pytest.mark.ssh
C = "{canary}"
HOSTILE = [f"; touch {C}", f"$(touch {C})", f"`touch {C}`", f"x\ntouch {C}\n", f"it's '; touch {C}; echo '",
           f'say "hi"; touch "{C}" "', f"a && touch {C} || touch {C}", f"> {C}", "$HOME ${IFS} * ~ \\ !!"]
PATH_PART = f"p; $(touch {C}) `touch {C}` 'q' \"d\" & | > {C}x"  # a hostile path
LONG = "L" * 110_000 + f"$(touch {C})';touch {C}`touch {C}`"  # very long: the command line goes via a file


def hostile(value: str, canary: Path) -> str:
    return value.replace(C, str(canary))


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    d = tmp_path / "canary-dir"
    d.mkdir()
    return d / "PWNED"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.slow
def test_hostile_values_pass_literally_through_a_trial(sshd: SshdServer, tiny_params: dict[str, Any],
                                                       tiny_models: Any, llama_server: Path, canary: Path,
                                                       tmp_path: Path) -> None:
    base = tmp_path / "d" / hostile(PATH_PART, canary).lstrip("/")  # its '/' (the canary's path) nest folders
    base.mkdir(parents=True)
    model = base / "m" / f"{hostile(PATH_PART, canary).lstrip('/')} model.gguf"
    model.parent.mkdir(parents=True)
    model.symlink_to(tiny_models.dir / "target.gguf")
    wrapper = base / "llama-server wrapper"  # prints its environment, then becomes llama-server
    wrapper.write_text(f'#!/bin/sh\nenv | sort\nexec {json.dumps(str(llama_server))} "$@"\n')
    wrapper.chmod(0o700)
    secret = "s3cr3t-sec-9a8b7c6d"
    env = {f"SPECTRIAL_HOSTILE_{i}": hostile(v, canary) for i, v in enumerate(HOSTILE)}
    env["SPECTRIAL_HOSTILE_LONG"] = hostile(LONG, canary)
    env["API_TOKEN"] = secret
    alias = hostile(HOSTILE[0] + HOSTILE[1] + HOSTILE[3], canary)
    data = ssh_params(tiny_params, sshd, engine_bin=str(wrapper), model=str(model), env=env, warmup=0, repeats=1,
                      work_dir=str(base / "work"), state_dir=str(base / "state"),
                      arms=[{"name": "baseline", "extra_args": ["--alias", alias],
                             "env": {"SPECTRIAL_ARM": hostile(HOSTILE[2], canary)}},
                            {"name": "draft", "method": "draft", "draft": "tiny:draft-simple"}])  # uploaded
    data["ssh"]["cache_dir"] = str(base / "cache")
    result = run_trial(load_params(data=data), progress=False)
    m = manifest_json(result.run_dir)
    assert m["status"] == "ok", m["reason"]
    assert not canary.exists(), "a hostile value was interpreted by a shell"
    for start in m["starts"]:
        assert start["env_check"]["ok"], start["env_check"]["problems"]  # every value read back literally
    arm = m["arms"][0]
    assert arm["argv"][arm["argv"].index("--alias") + 1] == alias
    assert arm["argv"][arm["argv"].index("-m") + 1] == str(model)
    # the secret: masked in the record, redacted from the log the server printed it into
    run = Path(result.run_dir)
    log = (run / "logs" / "llama-server-baseline.log").read_text()
    assert "API_TOKEN=***" in log and f"SPECTRIAL_HOSTILE_0={env['SPECTRIAL_HOSTILE_0']}" in log
    for f in run.rglob("*"):
        if f.is_file():
            assert secret not in f.read_text(errors="replace"), f
    assert m["params"]["env"]["API_TOKEN"] == "***"
    # what spectrial wrote on the host is readable by the user only
    work = base / "work" / m["run_id"]
    assert mode(base / "work") == 0o700 and mode(work) == 0o700 and mode(base / "state") == 0o700
    written = {f.name: mode(f) for f in work.iterdir()}  # logs (+ exit files when an engine exits by itself)
    assert {"llama-server-baseline.log", "llama-server-draft.log"} <= set(written)
    assert set(written.values()) == {0o600}, written
    uploaded = [f for f in (base / "cache").rglob("*")]
    assert any(f.name == "draft-simple.gguf" for f in uploaded)
    for f in [base / "cache", *uploaded]:
        assert mode(f) == (0o700 if f.is_dir() else 0o600), f
    assert not canary.exists()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("arms", [{"name": hostile(HOSTILE[0], Path("/tmp/x"))}], "server name"),
    ("arms", [{"name": "../../escape"}], "server name"),
    ("arms", [{"name": "a\nb"}], "server name"),
    ("hosts", ["ssh://u@h1", {"host": "ssh://u@h2", "addr": "h2;touch x"}], "not a host name"),
    ("engine_config", {"rpc": ["h:1;touch x"]}, "HOST:PORT"),
    ("host", "ssh://u@h;touch x", "host"),
    ("host", "ssh:$(touch x)", "host"),
])
def test_hostile_names_are_rejected_before_anything_runs(tiny_params: dict[str, Any], field: str, value: Any,
                                                         message: str, tmp_path: Path) -> None:
    data = {**tiny_params, field: value}
    if field == "hosts":
        data.pop("host")
    with pytest.raises(ConfigError, match=message):
        run_trial(load_params(data=data), progress=False)
    for run in Path(tiny_params["output_dir"]).glob("*/manifest.json"):
        steps = json.loads(run.read_text())["steps"]
        assert not any(s["name"].startswith(("launch", "kill")) for s in steps)  # refused before the host
