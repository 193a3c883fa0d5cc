"""Secrets are masked in env/argv/records and their values redacted from copied text."""

from __future__ import annotations

import json

from spectrial.records import RunRecord
from spectrial.secrets import is_secret_name, mask_argv, mask_env, redact, secret_values


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
