"""Secrets are masked in env/argv/records and their values redacted from copied text."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from sshd_plugin import free_port

from spectrial.errors import HostError, ServerError
from spectrial.hosts.local import LocalHost
from spectrial.params import load_params
from spectrial.protocol.plan import dry_run
from spectrial.record.store import RunRecord
from spectrial.secrets import is_secret_name, mask_argv, mask_env, mask_launch, redact, secret_values
from spectrial.servers.lifecycle import LaunchSpec, Probe, Server, read_state


def test_secret_names_by_whole_word():
    for name in ("HF_TOKEN", "OPENAI_API_KEY", "--api-key", "DB_PASSWORD", "ghToken", "AWS_SECRET_ACCESS_KEY"):
        assert is_secret_name(name), name
    for name in ("max_tokens", "draft_tokens", "num_token", "tokens_acc", "MONKEY", "NCCL_PROTO"):
        assert not is_secret_name(name), name


def test_mask_env_and_argv():
    env = {"HF_TOKEN": "hf_abc123", "NCCL_PROTO": "LL"}
    assert mask_env(env) == {"HF_TOKEN": "***", "NCCL_PROTO": "LL"}
    argv = ["serve", "--api-key", "sk-12345", "--hf-token=hf_zzz999", "--port", "8000"]
    assert mask_argv(argv) == ["serve", "--api-key", "***", "--hf-token=***", "--port", "8000"]
    assert set(secret_values(env, argv)) == {"hf_abc123", "sk-12345", "hf_zzz999"}
    assert redact("key=sk-12345 token hf_abc123", ["sk-12345", "hf_abc123"]) == "key=*** token ***"


def test_record_masks_params_and_redacts_artifacts(tmp_path):
    rec = RunRecord(tmp_path, "t", params={"env": {"MY_SECRET": "very-secret-value"}, "max_tokens": 64})
    rec.secrets = ["very-secret-value"]
    rec.write_text("logs/server.log", "started with very-secret-value in env\n")
    rec.finish("failed", "failed because very-secret-value leaked")
    text = (tmp_path / rec.run_id / "manifest.json").read_text()
    m = json.loads(text)
    assert m["params"]["env"]["MY_SECRET"] == "***" and m["params"]["max_tokens"] == 64
    assert "very-secret-value" not in text
    assert "very-secret-value" not in (tmp_path / rec.run_id / "logs" / "server.log").read_text()


ENV_SECRET, ARG_SECRET = "hf_env_secret_4711", "sk-arg-secret-0815"


def test_a_launch_is_masked_once_in_the_record_the_log_and_the_printed_command(tmp_path):
    """One masking (`mask_launch`) for every place a launch shows: the server's state file (the record on the
    host), the server log copied into the run record, the error that prints the command, the dry-run plan and a
    failed host command. A real server process prints both secrets and exits before it is ready."""
    argv = ["sh", "-c", 'echo "env $HF_TOKEN arg $2"; exit 7', "server", "--api-key", ARG_SECRET, "--port", "9"]
    env = {"HF_TOKEN": ENV_SECRET, "NCCL_PROTO": "LL"}
    shown = mask_launch(argv, env)
    assert shown.argv == [*argv[:5], "***", "--port", "9"] and shown.env == {"HF_TOKEN": "***", "NCCL_PROTO": "LL"}
    assert set(shown.secrets) == {ENV_SECRET, ARG_SECRET}
    assert shown.command == "HF_TOKEN='***' NCCL_PROTO=LL " + shlex.join(shown.argv)

    def leaked(text: str) -> bool:
        return ENV_SECRET in text or ARG_SECRET in text

    host = LocalHost()
    spec = LaunchSpec(argv=argv, env=env, port=free_port(), probe=lambda client, url: Probe(False, "never"),
                      name="masked")
    srv = Server(host, spec, work_dir=str(tmp_path / "work"), state_dir=str(tmp_path / "state"), tag="test-mask",
                 grace_s=2)
    with pytest.raises(ServerError) as err, srv:
        srv.start()
        state = read_state(host, srv.state_dir, spec.port)
        assert state is not None and state.argv == shown.argv and state.env == shown.env
        srv.wait_ready(30, progress=False)
    printed = str(err.value)
    assert not leaked(printed) and not leaked(err.value.command) and shown.argv_line in printed
    raw_log = Path(srv.log_path).read_text()
    assert ENV_SECRET in raw_log and ARG_SECRET in raw_log  # the server itself printed them

    rec = RunRecord(tmp_path / "runs", "t", params={"env": env})
    rec.add_secrets(shown.secrets)
    copied = rec.write_text("logs/masked.log", raw_log).read_text()
    assert copied.count("***") == 2 and not leaked(copied)  # once each, not `******`
    rec.finish("failed", printed)
    manifest = (tmp_path / "runs" / rec.run_id / "manifest.json").read_text()
    assert not leaked(manifest) and json.loads(manifest)["params"]["env"]["HF_TOKEN"] == "***"

    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "params" / "local.yaml").read_text())
    data["env"] = env
    data["arms"][0]["extra_args"] = ["--api-key", ARG_SECRET]
    plan = dry_run(load_params(data=data))
    assert all(not leaked(a.display) and "HF_TOKEN='***'" in a.display for a in plan)
    assert "--api-key '***'" in plan[0].display and plan[0].env["HF_TOKEN"] == "***"
    with pytest.raises(HostError) as failed:
        host.run(argv, env=env)
    assert failed.value.exit_code == 7 and not leaked(str(failed.value))
    assert "env 'HF_TOKEN=***'" in failed.value.command and "--api-key '***'" in failed.value.command

