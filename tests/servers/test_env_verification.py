"""Environment verification: requested variables are looked up in /proc/<pid>/environ of the real server."""

from __future__ import annotations

import pytest

from spectrial.engines import get_engine
from spectrial.hosts.local import LocalHost
from spectrial.params import load_params
from spectrial.servers.lifecycle import Server

pytestmark = pytest.mark.slow


def test_planted_variable_found_and_missing_one_reported(tiny_params, tmp_path):
    params = load_params(data={**tiny_params, "env": {"SPECTRIAL_PLANTED": "42", "NCCL_ALGO": "Ring"}})
    host = LocalHost()
    engine = get_engine("llamacpp", params, host)
    engine.prepare()
    spec = engine.launch_spec(params.arms[0])
    assert spec.argv[0].endswith("llama-server")
    srv = Server(host, spec, work_dir=str(tmp_path / "w"), state_dir=str(tmp_path / "s"), tag="env-test")
    with srv:
        srv.wait_ready(60, progress=False)
        ok = srv.verify_env()
        assert ok.ok, ok.problems
        server_rows = [r for r in ok.processes if any("llama-server" in a for a in r.cmdline[:1])]
        assert server_rows and set(server_rows[0].present) == {"SPECTRIAL_PLANTED", "NCCL_ALGO"}
        bad = srv.verify_env({"SPECTRIAL_PLANTED": "41", "NCCL_PROTO": "LL"})
        assert not bad.ok
        text = " | ".join(bad.problems)
        assert "NCCL_PROTO missing from pid" in text and "llama-server" in text
        assert "SPECTRIAL_PLANTED='42' instead of '41'" in text


def test_secret_env_is_masked_in_the_check(tiny_params, tmp_path):
    params = load_params(data={**tiny_params, "env": {"HF_TOKEN": "hf_supersecret_value"}})
    host = LocalHost()
    engine = get_engine("llamacpp", params, host)
    engine.prepare()
    srv = Server(host, engine.launch_spec(params.arms[0]), work_dir=str(tmp_path / "w"),
                 state_dir=str(tmp_path / "s"), tag="env-secret")
    with srv:
        srv.wait_ready(60, progress=False)
        chk = srv.verify_env({"HF_TOKEN": "wrong-value-1234"})
    assert not chk.ok and "HF_TOKEN has another value" in " ".join(chk.problems)
    assert "hf_supersecret_value" not in repr(chk.processes) + repr(chk.requested) + repr(chk.problems)
