"""SGLang adapter: exact argv, SGLang's own rules, version-aware flags, and host checks run against the
SGLang test double (tests/standin/sglang) through the real `python -m sglang.launch_server` command line."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest

from spectrial.engines import Window, get_engine
from spectrial.engines.sglang import (
    check_version_flags,
    cuda_graph_flag,
    parse_version,
    probe,
    server_info_snapshot,
    sglang_window_stats,
    speculative_args,
)
from spectrial.errors import ConfigError, ResourceBusyError
from spectrial.hosts.local import LocalHost
from spectrial.logs.api import ServerLog
from spectrial.params import Arm, load_params
from spectrial.record.store import manifest_json
from spectrial.schema import RequestRecord
from spectrial.servers.lifecycle import LaunchSpec, Server

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"
TARGET = STANDIN / "models" / "target"
EAGLE3_DRAFT = STANDIN / "models" / "eagle3-draft"
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]
NCCL_SIX = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
            "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}


def params_data(tmp_path: Path, port: int = 30999, engine_config: dict[str, Any] | None = None,
                **over: Any) -> dict[str, Any]:
    """A stand-in SGLang trial: baseline + EAGLE-3, tp 2, everything written under tmp_path."""
    cfg = {"python": sys.executable, "pythonpath": [str(STANDIN)], "tp_size": 2, **(engine_config or {})}
    return {"name": "sgl", "engine": "sglang", "model": str(TARGET), "draft": str(EAGLE3_DRAFT), "steps": 2,
            "topk": 1, "draft_tokens": 3, "port": port, "output_dir": str(tmp_path / "out"),
            "state_dir": str(tmp_path / "state"), "work_dir": str(tmp_path / "work"), "engine_config": cfg,
            "arms": [{"name": "baseline"}, {"name": "eagle3", "method": "eagle3"}], **over}


def engine_for(data: dict[str, Any]):  # type: ignore[no-untyped-def]
    return get_engine("sglang", load_params(data=data), LocalHost())


def dry_argv(data: dict[str, Any], arm: int = -1) -> list[str]:
    eng = engine_for(data)
    eng.resolve_dry()
    return eng.launch_spec(eng.params.arms[arm]).argv


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# --- the original deployment, as a dry run ---------------------------------------------------------------
def test_kimi_example_dry_run_prints_the_expert_command(tmp_path):
    res = subprocess.run([*SPECTRIAL, "trial", "params/examples/kimi-k25-pcie.yaml", "--dry-run", "--json"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    arms = {a["arm"]: a for a in json.loads(res.stdout)["launches"]}
    assert list(arms) == ["baseline", "eagle3"]
    common = ["python3", "-m", "sglang.launch_server", "--model-path", "/models/Kimi-K2.5-INT4", "--tp-size", "8",
              "--host", "0.0.0.0", "--port", "8000", "--trust-remote-code", "--mem-fraction-static", "0.88",
              "--num-continuous-decode-steps", "4", "--disable-custom-all-reduce", "--enable-metrics",
              "--disable-radix-cache"]  # issue 27: a prompt from the radix cache skips the prefill the others paid
    assert arms["baseline"]["argv"] == common
    assert arms["eagle3"]["argv"] == common + [
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/Kimi-K2.5-EAGLE3",
        "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]
    for a in arms.values():
        assert a["host"] == "ssh:kimi-pcie"
        assert NCCL_SIX.items() <= a["env"].items()
        assert a["env"]["NCCL_DEBUG"] == "INFO" and a["env"]["NCCL_DEBUG_SUBSYS"] == "INIT,ENV"
    from spectrial.protocol.plan import dry_run  # the text the CLI prints without --json

    display = dry_run(load_params(REPO / "params/examples/kimi-k25-pcie.yaml"))[1].display
    line = next(ln for ln in display.splitlines() if "--speculative-algorithm" in ln)
    assert line.startswith("NCCL_PROTO=LL NCCL_ALGO=Ring NCCL_P2P_LEVEL=SYS NCCL_MAX_NCHANNELS=16 "
                           "NCCL_BUFFSIZE=16777216 NCCL_NTHREADS=512 ")
    assert " python3 -m sglang.launch_server --model-path /models/Kimi-K2.5-INT4 --tp-size 8 " in line


# --- SGLang's rules ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("method,algo,has_draft", [("eagle3", "EAGLE3", True), ("eagle", "EAGLE", True),
                                                   ("nextn", "NEXTN", False), ("draft", "STANDALONE", True)])
def test_methods_map_to_sglang_algorithms(tmp_path, method, algo, has_draft):
    draft = str(tmp_path / "some-draft")
    data = params_data(tmp_path, arms=[{"name": "a", "method": method, "draft": draft if has_draft else None}],
                       draft=None)
    argv = dry_argv(data)
    assert flag(argv, "--speculative-algorithm") == algo
    assert ("--speculative-draft-model-path" in argv) is has_draft
    assert [flag(argv, f) for f in ("--speculative-num-steps", "--speculative-eagle-topk",
                                    "--speculative-num-draft-tokens")] == ["2", "1", "3"]


def test_ngram_writes_only_draft_tokens(tmp_path):
    argv = dry_argv(params_data(tmp_path, draft_tokens=None, arms=[{"name": "n", "method": "ngram", "steps": 4}]))
    assert flag(argv, "--speculative-algorithm") == "NGRAM" and flag(argv, "--speculative-num-draft-tokens") == "5"
    assert "--speculative-num-steps" not in argv and "--speculative-draft-model-path" not in argv


def test_topk1_contradictory_draft_tokens_is_an_error_or_a_warned_adjustment(tmp_path):
    with pytest.raises(ConfigError, match=r"draft_tokens: with topk 1 SGLang verifies steps \+ 1 = 3"):
        dry_argv(params_data(tmp_path, draft_tokens=5))
    with pytest.warns(UserWarning, match="adjusted to 3"):
        argv = dry_argv(params_data(tmp_path, draft_tokens=5, engine_config={"adjust_draft_tokens": True}))
    assert flag(argv, "--speculative-num-draft-tokens") == "3"


def test_tree_drafts_need_explicit_draft_tokens(tmp_path):
    with pytest.raises(ConfigError, match="with topk 4 give draft_tokens"):
        dry_argv(params_data(tmp_path, topk=4, draft_tokens=None, steps=5))
    argv = dry_argv(params_data(tmp_path, topk=4, draft_tokens=8, steps=5))
    assert [flag(argv, f) for f in ("--speculative-num-steps", "--speculative-eagle-topk",
                                    "--speculative-num-draft-tokens")] == ["5", "4", "8"]


def test_auto_params_leave_steps_topk_tokens_unset_and_refuse_explicit_ones(tmp_path):
    data = params_data(tmp_path, engine_config={"auto_speculative_params": True})
    data.pop("topk"), data.pop("draft_tokens")
    argv = dry_argv(data)
    assert flag(argv, "--speculative-algorithm") == "EAGLE3"
    assert not any(a.startswith("--speculative-num") or a == "--speculative-eagle-topk" for a in argv)
    with pytest.raises(ConfigError, match="remove topk, draft_tokens"):
        dry_argv(params_data(tmp_path, engine_config={"auto_speculative_params": True}))


def test_eagle3_draft_under_algorithm_eagle_is_flagged(tmp_path):
    with pytest.raises(ConfigError, match="accept length exactly 1.00"):
        speculative_args("eagle", 2, 1, None, "/m/Llama-EAGLE3-draft", adjust=False, auto=False, where="arms[x]")
    with pytest.raises(ConfigError, match="needs a draft model"):
        speculative_args("eagle3", 2, 1, None, None, adjust=False, auto=False, where="arms[x]")


def test_pass_through_cannot_contradict_spectrials_flags(tmp_path):
    for bad in (["--speculative-num-steps", "5"], ["--tp-size=4"], ["--port", "1"]):
        with pytest.raises(ConfigError, match="written by spectrial"):
            dry_argv(params_data(tmp_path, engine_config={"extra_args": bad}))


# --- version-aware flags ----------------------------------------------------------------------------------
@pytest.mark.parametrize("version,expected", [("0.5.10.post1", "--cuda-graph-max-bs"),
                                              ("0.5.13", "--cuda-graph-max-bs"),
                                              ("0.5.14", "--cuda-graph-max-bs-decode"),
                                              ("0.5.23", "--cuda-graph-max-bs-decode"),
                                              (None, "--cuda-graph-max-bs-decode")])
def test_cuda_graph_flag_follows_the_sglang_version(tmp_path, version, expected):
    assert cuda_graph_flag(parse_version(version)) == expected
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        argv = dry_argv(params_data(tmp_path, engine_config={"cuda_graph_max_bs": 8, "sglang_version": version}))
    assert any("sglang_version unset" in str(w.message) for w in seen) is (version is None)
    assert flag(argv, expected) == "8"


def test_flags_of_another_sglang_version_are_refused_before_launch():
    with pytest.raises(ConfigError, match="no --cuda-graph-max-bs .removed in 0.5.20"):
        check_version_flags(["--cuda-graph-max-bs", "8"], parse_version("0.5.20"), "extra_args")
    with pytest.raises(ConfigError, match="no --cuda-graph-max-bs-decode .added in 0.5.14"):
        check_version_flags(["--cuda-graph-max-bs-decode=8"], parse_version("0.5.10.post1"), "extra_args")
    check_version_flags(["--cuda-graph-max-bs", "8"], parse_version("0.5.19"), "extra_args")  # deprecated alias


# --- host checks against the stand-in --------------------------------------------------------------------
@pytest.mark.slow
def test_prepare_reads_version_source_and_checks_argv_with_the_hosts_parser(tmp_path):
    eng = engine_for(params_data(tmp_path))
    out = eng.prepare()
    v = eng.version()
    assert v.sglang_version == "0.5.17+standin" and v.package_dir == str(STANDIN / "sglang")
    assert out.models is not None and out.models["model"] == str(TARGET)
    assert any("accepted by SGLang 0.5.17+standin's own parser" in n for n in out.notes or [])
    assert any("no GPU" in n for n in out.notes or [])
    bad = engine_for(params_data(tmp_path, engine_config={"extra_args": ["--no-such-flag"]}))
    with pytest.raises(ConfigError, match="rejects the command: .*unrecognized arguments: --no-such-flag"):
        bad.prepare()
    with pytest.raises(ConfigError, match="'0.5.10' given but host local has SGLang '0.5.17"):
        engine_for(params_data(tmp_path, engine_config={"sglang_version": "0.5.10"})).prepare()


@pytest.mark.slow
def test_prepare_refuses_missing_paths_and_python_without_sglang(tmp_path):
    with pytest.raises(ConfigError, match="nope-draft' not found on host local"):
        engine_for(params_data(tmp_path, draft=str(tmp_path / "nope-draft"))).prepare()
    eng = engine_for(params_data(tmp_path, draft="some-org/some-eagle3-draft"))
    assert any("Hugging Face repo id (not checked)" in n for n in eng.prepare().notes or [])
    with pytest.raises(ConfigError, match="cannot import sglang"):
        engine_for(params_data(tmp_path, engine_config={"pythonpath": []})).prepare()
    renamed = tmp_path / "draft-b"  # an EAGLE-3 draft whose name does not say so: config.json does
    shutil.copytree(EAGLE3_DRAFT, renamed)
    data = params_data(tmp_path, arms=[{"name": "e", "method": "eagle", "draft": str(renamed)}])
    with pytest.raises(ConfigError, match="is an EAGLE-3 model"):
        engine_for(data).prepare()


@pytest.mark.slow
def test_tp_size_larger_than_the_hosts_gpus_is_refused(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"  # a test double of nvidia-smi reporting two idle GPUs
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$*\" in *query-gpu*) printf '0, GPU A, GPU-a, 0, 81559, 0\\n"
                   "1, GPU B, GPU-b, 0, 81559, 0\\n';; esac\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ConfigError, match="tp_size: 8 ranks need 8 GPUs; host local has 2"):
        engine_for(params_data(tmp_path, engine_config={"tp_size": 8})).prepare()


@pytest.mark.slow
def test_source_identity_records_commit_and_uncommitted_diff(tmp_path):
    checkout = tmp_path / "sglang-checkout"
    shutil.copytree(STANDIN / "sglang", checkout / "python" / "sglang")
    git = ["git", "-C", str(checkout), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-qm", "base"]):
        subprocess.run(git + cmd, check=True, capture_output=True)
    data = params_data(tmp_path, engine_config={"pythonpath": [str(checkout / "python")]})
    clean = engine_for(data)
    clean.prepare()
    g = clean.version().git
    assert g is not None and len(g.commit) == 40 and g.dirty is False and g.diff_sha256 is None
    patched = checkout / "python" / "sglang" / "_standin_worker.py"
    patched.write_text(patched.read_text() + "\n# local patch: print per-cycle timings\n")
    dirty = engine_for(data)
    dirty.prepare()
    g2 = dirty.version().git
    assert g2 is not None and g2.commit == g.commit and g2.dirty is True
    assert len(g2.diff_sha256 or "") == 64 and g2.diff_files == ["python/sglang/_standin_worker.py"]


@pytest.mark.slow
def test_port_in_use_is_refused_before_any_launch(tmp_path, port):
    from spectrial.protocol.trial import run_trial

    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(ResourceBusyError, match=f"port {port} on local is held by a process"):
            run_trial(load_params(data=params_data(tmp_path, port=port)), progress=False)
    runs = [p for p in (tmp_path / "out").iterdir() if (p / "manifest.json").is_file()]
    m = manifest_json(runs[0])
    assert m["status"] == "failed" and not any(s["name"].startswith("launch") for s in m["steps"])


@pytest.mark.slow
def test_generate_meta_info_and_legacy_server_info_from_a_running_server(tmp_path, port):
    data = params_data(tmp_path, port=port, engine_config={"extra_args": ["--standin-legacy-server-info"],
                                                           "decode_log_interval": 5, "enable_metrics": False})
    eng = engine_for(data)
    eng.prepare()
    spec = eng.launch_spec(eng.params.arms[1])
    srv = Server(LocalHost(), spec, work_dir=str(tmp_path / "w"), state_dir=str(tmp_path / "s"), tag="meta")
    with srv:
        srv.wait_ready(30, progress=False)
        final: dict[str, Any] = {}
        with httpx.Client(timeout=30) as client, client.stream(
                "POST", f"{srv.base_url}/generate", json=eng.generate_payload("one two three", 40)) as r:
            for line in r.iter_lines():
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    final = json.loads(line[5:])
        stats = eng.request_stats(final)
        with httpx.Client(timeout=10) as client:
            snap = server_info_snapshot(client, srv.base_url)
    verify = stats.server_spec_verify_ct
    assert stats.server_predicted_n == 40 and verify is not None and verify > 0
    assert stats.server_spec_accept_length == pytest.approx(40 / verify)
    assert stats.server_draft_n == verify * 2
    assert stats.server_draft_n_accepted is not None and 0 <= stats.server_draft_n_accepted <= stats.server_draft_n
    assert snap["server_info:fallback_get_server_info"] == 1.0
    assert 1.0 <= snap["server_info:avg_spec_accept_length"] <= 3.0


# --- window statistics: each source, best first -----------------------------------------------------------
def _reqs(n: int, tokens: int, tok_s: float) -> list[RequestRecord]:
    return [RequestRecord(tokens=tokens, client_tok_s=tok_s) for _ in range(n)]


def _window(before: dict[str, float], after: dict[str, float], reqs: list[RequestRecord], log: str,
            first_line: int = 1) -> Window:
    """A window of the EAGLE-3 arm of the stand-in params: counters, requests, the log from `first_line`."""
    arm = Arm(name="eagle3", method="eagle3")
    spec = LaunchSpec(argv=["python3"], env={}, port=1, probe=probe)
    return Window(arm, spec, before, after, reqs, ServerLog(log), first_line, max(first_line, len(log.splitlines())))


def test_window_stats_prefer_metrics_counters():
    before = {"sglang:spec_verify_calls_total{model_name=m}": 100.0,
              "sglang:generation_tokens_total{is_streaming=true,model_name=m}": 300.0,
              "sglang:num_requests_total{model_name=m}": 4.0}
    after = {"sglang:spec_verify_calls_total{model_name=m}": 160.0,
             "sglang:generation_tokens_total{is_streaming=true,model_name=m}": 429.0,
             "sglang:num_requests_total{model_name=m}": 7.0, "server_info:avg_spec_accept_length": 2.0}
    st = sglang_window_stats(_window(before, after, _reqs(3, 43, 100.0), ""), draft_tokens=3)
    assert st.source.startswith("metrics") and st.scoped
    assert st.verify_steps == 60 and st.accepted == 129 - 3 - 60 and st.drafted == 120
    assert st.tokens == 126 and st.decode_ms == pytest.approx(3 * 42 / 100.0 * 1000)


def test_window_stats_fall_back_to_decode_lines_then_to_the_unscoped_mean():
    log = "\n".join(["[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 1, #token: 9, token usage: 0.00, "
                     f"accept len: {x}, accept rate: 0.60, cuda graph: True, gen throughput (token/s): 1.00, "
                     "#queue-req: 0" for x in ("3.00", "2.00", "2.50")])
    st = sglang_window_stats(_window({}, {}, _reqs(2, 41, 50.0), log, first_line=2), draft_tokens=3)
    assert st.source.startswith("log (2") and st.accept_len == pytest.approx(2.25)
    assert st.verify_steps == pytest.approx(80 / 2.25)
    st2 = sglang_window_stats(_window({}, {"server_info:avg_spec_accept_length": 2.4}, _reqs(2, 41, 50.0), log,
                                      first_line=4), draft_tokens=3)
    assert st2.scoped is False and st2.accept_len == 2.4 and "not scoped" in " ".join(st2.notes)


def test_synthetic_accept_maps_to_sglangs_forced_accept_length(tmp_path):
    """A per-token rate a at steps k forces accept length 1 + a + ... + a^k through SGLANG_SIMULATE_ACC_LEN,
    on that arm's launch only; per-position rates give 1 + their sum; a baseline cannot take it."""
    data = params_data(tmp_path, steps=3, draft_tokens=None, engine_config={"sglang_version": "0.5.17"},
                       arms=[{"name": "baseline"}, {"name": "a75", "method": "eagle3", "synthetic_accept": 0.75},
                             {"name": "pp", "method": "eagle3", "synthetic_accept": [0.9, 0.5, 0.1]}])
    eng = engine_for(data)
    eng.resolve_dry()
    base, a75, pp = (eng.launch_spec(a) for a in eng.params.arms)
    assert "SGLANG_SIMULATE_ACC_LEN" not in base.env
    assert float(a75.env["SGLANG_SIMULATE_ACC_LEN"]) == pytest.approx(1 + 0.75 + 0.75 ** 2 + 0.75 ** 3, abs=1e-5)
    assert float(pp.env["SGLANG_SIMULATE_ACC_LEN"]) == pytest.approx(2.5)
    assert any("synthetic acceptance" in n for n in a75.notes)
    bad = engine_for(params_data(tmp_path, engine_config={"sglang_version": "0.5.17"},
                                 arms=[{"name": "b", "synthetic_accept": 0.5}]))
    bad.resolve_dry()
    with pytest.raises(ConfigError, match=r"arms\[b\].synthetic_accept: only speculative arms"):
        bad.launch_spec(bad.params.arms[0])


def test_the_share_of_decode_steps_without_graphs_is_counted_per_window_from_real_logs():
    """Issue 39 item 5: each 'Decode batch' line says whether its steps ran with a CUDA graph; the window counts
    them (the arm's graph_off_share). Real lines: the H200 lifecycle log (SGLang 0.5.17, one decode line, eager at
    start-up) and a public log (fastrl PR 4: two eager lines at 48 running requests, accept length 1.00)."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    for name, lines, off in (("logs/sglang_0.5.17_h200_lifecycle.log", 1, 1),
                             ("diagnose/fastrl_pr4_accept_len_1.log", 2, 2)):
        log = (fixtures / name).read_text()
        st = sglang_window_stats(_window({}, {}, _reqs(2, 41, 50.0), log), draft_tokens=3)
        assert (st.graph_lines, st.graph_off_lines) == (lines, off), name
    # graphs on and off within one window: the share is the eager lines over the lines that say
    log = "\n".join(["[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 1, #token: 9, token usage: 0.00, "
                     f"accept len: 2.00, accept rate: 0.60, cuda graph: {g}, gen throughput (token/s): 1.00, "
                     "#queue-req: 0" for g in ("True", "False", "True", "True")])
    st = sglang_window_stats(_window({}, {}, _reqs(2, 41, 50.0), log), draft_tokens=3)
    assert (st.graph_lines, st.graph_off_lines) == (4, 1)
    from spectrial.analysis.figures import arm_figures

    f = arm_figures(_reqs(2, 41, 50.0), st, True, 0.95, 0)
    assert f.graph_off_share == 0.25


def test_an_adaptive_arms_drafted_tokens_are_unknown_not_made_up():
    """SGLang exports no drafted-token counter: a static arm's drafted = verify x (draft tokens - 1); under
    `--speculative-adaptive` the depth changes at run time, so that product would be made up (the H100 run of
    2026-12-06 recorded 7.0 per cycle for an adaptive arm from it): unknown, and said."""
    before = {"sglang:spec_verify_calls_total{model_name=m}": 100.0,
              "sglang:generation_tokens_total{is_streaming=true,model_name=m}": 300.0,
              "sglang:num_requests_total{model_name=m}": 4.0}
    after = {"sglang:spec_verify_calls_total{model_name=m}": 160.0,
             "sglang:generation_tokens_total{is_streaming=true,model_name=m}": 429.0,
             "sglang:num_requests_total{model_name=m}": 7.0}
    w = dataclasses.replace(_window(before, after, _reqs(3, 43, 100.0), ""),
                            arm=Arm(name="adaptive", method="eagle3", steps=7, policy={"adaptive": True}))
    st = sglang_window_stats(w, draft_tokens=8)
    assert st.verify_steps == 60 and st.accepted == 66 and st.drafted is None
    assert any("drafted tokens unknown" in n for n in st.notes)
