"""spectrial.readers.history: run records and plain logs as one tidy table, the matrix views, bad input as issues."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spectrial.readers import history
from spectrial.readers.casestudy import CASE_NAME, case_dir
from spectrial.readers.render import figures as render

REPO = Path(__file__).resolve().parents[2]

# Real SGLang decode lines (sgl-project/sglang PR #22331 and PR #30047, shared/corpus/public_logs.jsonl).
SGLANG_PLAIN = """\
[2026-04-08 14:05:21 TP0] Decode batch, #running-req: 5, #token: 20800, token usage: 0.29, cuda graph: True, gen throughput (token/s): 144.95, #queue-req: 0
[2026-04-08 14:05:22 TP0] Decode batch, #running-req: 5, #token: 20800, token usage: 0.29, cuda graph: True, gen throughput (token/s): 140.27, #queue-req: 0
[2026-04-08 14:05:24 TP0] Decode batch, #running-req: 5, #token: 20800, token usage: 0.29, cuda graph: True, gen throughput (token/s): 136.39, #queue-req: 0
[2026-04-08 14:05:25 TP0] Decode batch, #running-req: 5, #token: 20800, token usage: 0.29, cuda graph: True, gen throughput (token/s): 139.89, #queue-req: 0
[2026-04-08 14:05:27 TP0] Decode batch, #running-req: 5, #token: 20800, token usage: 0.29, cuda graph: True, gen throughput (token/s): 144.10, #queue-req: 0
[2026-04-08 14:05:28 TP0] Decode batch, #running-req: 5, #token: 20800, token usage: 0.29, cuda graph: True, gen throughput (token/s): 157.64, #queue-req: 0
[2026-04-08 14:05:29 TP0] Decode batch, #running-req: 5, #token: 20800, token usage: 0.29, cuda graph: True, gen throughput (token/s): 153.78, #queue-req: 0
[2026-04-08 14:05:30 TP0] Decode batch, #running-req: 5, #token: 20800, token usage: 0.29, cuda graph: True, gen throughput (token/s): 157.11, #queue-req: 0
"""
SGLANG_SPEC = """\
[2026-07-04 05:01:33 TP0] Decode batch, #running-req: 40, #full token: 350592, full token usage: 0.74, mamba num: 160, mamba usage: 0.80, accept len: 3.13, accept rate: 0.71, npu graph: True, gen throughput (token/s): 155.34, #queue-req: 0
"""


def write_manifest(folder: Path, data: dict[str, Any] | str) -> None:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(data if isinstance(data, str) else json.dumps(data))


def trial_manifest(run_id: str, arms: list[dict[str, Any]], status: str = "ok", reason: str | None = None,
                   started_at: str = "2026-11-01T10:00:00.000+00:00") -> dict[str, Any]:
    return {"run_id": run_id, "status": status, "reason": reason, "name": "t", "kind": "trial",
            "started_at": started_at, "finished_at": None, "params": {}, "host": {"name": "box"},
            "engine": {"name": "llamacpp", "version": "version: 1 (0c1e570) | built with GNU 12.2.0"},
            "steps": [], "arms": arms, "files": [], "notebook": None}


BASE = {"name": "baseline", "method": "none", "status": "ok", "tok_s": 100.0, "ms_per_token": 10.0,
        "tok_s_values": [99.0, 100.0, 101.0], "env": {}, "argv": ["llama-server"]}


def test_committed_case_reads_into_the_matrix() -> None:
    h = history.load_history(case_dir().parent)
    case = h.table[h.table["run"] == CASE_NAME]
    assert len(case) == 8 and not (h.issues["source"] == CASE_NAME).any()
    # the other committed records' issues are real: the SGLang 8B sweep whose EAGLE-3 starts died in CUDA-graph
    # capture (deep_gemm), the SGLang counting trial cut at the device call's deadline, and the vLLM ngram arm
    # whose prompt lookup never drafted (0 verify cycles), and the two fault runs killed on purpose on the H200
    # (SIGKILL and SIGHUP mid-benchmark, outputs/examples/h200-sglang/faults: settled as failed by the next reader)
    found = {(s.split("/")[0], p.split(":")[0]) for s, p in zip(h.issues["source"], h.issues["problem"], strict=True)}
    assert found == {("h200-sglang", "run failed"), ("h200-sglang", "arm did not complete (status 'failed')"),
                     ("vllm-cpu", "0 verify steps")}, found
    failed = set(h.issues["source"][h.issues["problem"].str.startswith("run failed")])
    assert failed == {"h200-sglang/h200-sglang-8b-sweep-082758", "h200-sglang/h200-sglang-counting-091935",
                      "h200-sglang/faults/h200-sglang-chaos-kill-061143",
                      "h200-sglang/faults/h200-sglang-chaos-hup-062153"}, failed
    m = history.matrix(h.table, "tok_s", rows=("run", "session", "nccl_env"))
    assert m.loc[(CASE_NAME, "later", "set, unverified"), "eagle3 k=2"] == pytest.approx(60.5)
    assert m.loc[(CASE_NAME, "earlier", "unrecorded"), "eagle3 k=2"] == pytest.approx(94.0)
    assert list(m.columns)[0] == "baseline"
    base = history.baseline_over_time(h.table)
    drift = base[(base["run"] == CASE_NAME) & (base["arm"] == "baseline-restart")]["change_pct"].iloc[0]
    assert drift == pytest.approx((82.2 / 88.9 - 1) * 100)


def test_fill_derived_hand_worked() -> None:
    arm = {"name": "x", "method": "eagle3", "status": "ok", "steps": 2, "tok_s": 60.5, "verify_ms": 28.95,
           "verify_share": 0.97}
    d = history.fill_derived(arm)
    assert d["cycle_ms"] == pytest.approx(28.95 / 0.97)  # 29.845 ms
    assert d["accept_len"] == pytest.approx(60.5 * 28.95 / 0.97 / 1000)  # 1.806 tokens
    assert set(d["derived"]) == {"cycle_ms", "accept_len"}
    d2 = history.fill_derived({"method": "eagle3", "tok_s": 94.0, "accept_len": 2.1, "verify_ms": 19.14})
    assert d2["cycle_ms"] == pytest.approx(2.1 / 94.0 * 1000) and d2["accept_len"] == 2.1
    lower = history.fill_derived({"method": "eagle3", "tok_s": 50.0, "verify_ms": 20.0})
    assert lower["cycle_ms"] == 20.0 and "lower bound" in lower["derived"]["cycle_ms"]
    assert lower.get("accept_len") is None  # never derived from a lower bound
    recorded = history.fill_derived({"method": "eagle3", "cycle_ms": 9.9, "verify_ms": 5.0, "verify_share": 0.5})
    assert recorded["cycle_ms"] == 9.9 and "cycle_ms" not in recorded["derived"]


def test_bad_records_become_issues(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_manifest(runs / "a-failed", trial_manifest("a-failed", [
        BASE, {"name": "e3", "method": "eagle3", "status": "failed", "reason": "ServerError: exited 1"}],
        status="failed", reason="arm e3: exited 1"))
    write_manifest(runs / "b-empty", trial_manifest("b-empty", []))
    write_manifest(runs / "c-counters", trial_manifest("c-counters", [
        BASE, {"name": "zero", "method": "eagle3", "status": "ok", "steps": 2, "tok_s": 80.0, "verify_steps": 0},
        {"name": "low", "method": "draft", "status": "ok", "steps": 2, "tok_s": 80.0, "accept_len": 0.5,
         "cycle_ms": 12.0}]))
    write_manifest(runs / "d-broken", "{not json")
    h = history.load_history(runs)
    problems = "\n".join(f"{s} {i} {p}" for s, i, p in h.issues.itertuples(index=False))
    assert "a-failed  run failed: arm e3: exited 1" in problems
    assert "a-failed e3 arm did not complete" in problems and "ServerError" in problems
    assert "b-empty  no arms recorded" in problems
    assert "c-counters zero 0 verify steps" in problems
    assert "c-counters low accept length 0.5 < 1" in problems
    assert "d-broken  manifest.json unreadable" in problems
    assert len(h.table) == 5  # every arm stays in the table, with its status
    m = history.matrix(h.table, "tok_s")
    assert "eagle3 k=2" in m.columns and m.notna().sum().sum() == 4  # the failed arm is left out


def test_trial_rows_and_matrix(tmp_path: Path) -> None:
    nccl = {"NCCL_PROTO": "LL"}
    arm = {"name": "e3", "method": "eagle3", "status": "ok", "steps": 3, "tok_s": 150.0, "cycle_ms": 20.0,
           "accept_len": 3.0, "tok_s_values": [149.0, 150.0, 151.0], "argv": ["llama-server"]}
    write_manifest(tmp_path / "r1", trial_manifest("r1", [
        {**BASE, "env": nccl, "env_check": {"ok": True}}, {**arm, "env": nccl, "env_check": {"ok": True}}]))
    write_manifest(tmp_path / "r2", trial_manifest("r2", [BASE, {**arm, "steps": 1, "env": {}}],
                                                   started_at="2026-11-02T10:00:00.000+00:00"))
    h = history.load_history(tmp_path)
    t = h.table.set_index(["run", "arm"])
    assert t.loc[("r1", "e3"), "nccl_env"] == "set, verified" and t.loc[("r2", "e3"), "nccl_env"] == "none"
    assert t.loc[("r1", "e3"), "break_even_accept_len"] == pytest.approx(2.0)  # 20 ms / 10 ms
    assert t.loc[("r1", "e3"), "speedup"] == pytest.approx(1.5)
    assert t.loc[("r1", "e3"), "engine_version"] == "1 (0c1e570)"
    m = history.matrix(h.table)
    assert list(m.columns) == ["baseline", "eagle3 k=1", "eagle3 k=3"]
    over = history.baseline_over_time(h.table)
    assert over["when"].tolist() == ["2026-11-01 10:00", "2026-11-02 10:00"]
    same = h.table[h.table["run"] == "r1"].set_index("arm")
    assert history.incomparability(same.loc["baseline"].to_dict() | {"arm": "baseline", "k": 3},
                                   same.loc["e3"].to_dict() | {"arm": "e3"}) == []
    cross = history.incomparability(t.loc[("r1", "e3")].to_dict() | {"arm": "a", "run": "r1"},
                                    t.loc[("r2", "e3")].to_dict() | {"arm": "b", "run": "r2"})
    assert any("different sessions" in r for r in cross) and any("different NCCL states" in r for r in cross)
    assert any("k=3 vs k=1" in r for r in cross)


def test_log_folder(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "sub").mkdir(parents=True)
    (logs / "plain.log").write_text(SGLANG_PLAIN)
    (logs / "sub" / "spec.log").write_text(SGLANG_SPEC)
    (logs / "notes.txt").write_text("nothing a parser knows\njust words\n")
    h = history.load_history(None, logs)
    rows = h.table.set_index("run")
    assert rows.loc["plain.log", "tok_s"] == pytest.approx((144.10 + 144.95) / 2)  # median of 8 lines
    assert rows.loc["sub/spec.log", "accept_len"] == pytest.approx(3.13)
    assert rows.loc["sub/spec.log", "draft_accept_rate"] == pytest.approx(0.71)
    assert rows.loc["plain.log", "started_at"] == pd.Timestamp("2026-04-08 14:05:21", tz="UTC")
    assert (rows["nccl_env"] == "unrecorded").all()
    assert h.issues["problem"].str.contains("nothing parseable").sum() == 1
    assert set(h.log_summary["file"]) == {"plain.log", "sub/spec.log"}
    assert history.matrix(h.table).empty  # logs never enter the matrices


@pytest.mark.parametrize("make", ["missing", "empty-runs", "empty-logs"])
def test_empty_inputs(tmp_path: Path, make: str) -> None:
    empty = tmp_path / "e"
    if make != "missing":
        empty.mkdir()
    h = history.load_history(None, empty) if make == "empty-logs" else history.load_history(empty)
    assert len(h.issues) == 1 and h.table.empty
    assert history.matrix(h.table).empty and history.baseline_over_time(h.table).empty
    assert render.matrix_figure(history.matrix(h.table), "t").layout.title.text == "t (no data)"
    render.baseline_figure(h.table)


def run_notebook(name: str, out: Path, **params: str) -> str:
    """Execute a notebook with papermill; return its outputs as text (fails on a cell error)."""
    import subprocess
    import sys

    args = [a for k, v in params.items() for a in ("-p", k, v)]
    res = subprocess.run([sys.executable, "-m", "papermill", str(REPO / "notebooks" / name), str(out), *args,
                          "--cwd", str(REPO / "notebooks")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    nb = json.loads(out.read_text())
    text = json.dumps([c.get("outputs", []) for c in nb["cells"] if c["cell_type"] == "code"])
    assert '"output_type": "error"' not in text
    return text


@pytest.mark.notebook
def test_notebooks_say_what_is_wrong_with_bad_input(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_manifest(runs / "failed", trial_manifest("failed", [
        {"name": "baseline", "method": "none", "status": "failed", "reason": "ServerNotReady: timeout"}],
        status="failed", reason="arm baseline: ServerNotReady: timeout"))
    write_manifest(runs / "zero", trial_manifest("zero", [
        BASE, {"name": "e3", "method": "eagle3", "status": "ok", "steps": 2, "tok_s": 80.0, "verify_steps": 0,
               "accept_len": 0.5}]))
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "junk.log").write_text("no engine wrote this\n")
    text = run_notebook("04_history.ipynb", tmp_path / "04.ipynb", runs_dir=str(runs), logs_dir=str(logs))
    for claim in ("problem(s) found", "run failed: arm baseline: ServerNotReady", "0 verify steps",
                  "accept length 0.5 < 1", "nothing parseable (1 lines read)", "Nothing parseable in"):
        assert claim in text, claim
    text90 = run_notebook("90_case_kimi_k25_pcie.ipynb", tmp_path / "90.ipynb", case_dir=str(tmp_path / "none"))
    assert "The case record could not be read" in text90
