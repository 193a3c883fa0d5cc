"""`spectrial logs parse|summary` through typer's CliRunner on the sub-app."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from spectrial.cli.logs import app

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"
VLLM = FIXTURES / "vllm_v1_2026_loggers_271.log"
LLAMA = FIXTURES / "llamacpp_server_0c1e570_lv4_synthetic.log"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_parse_to_stdout_csv(runner: CliRunner) -> None:
    res = runner.invoke(app, ["parse", str(VLLM), "--kind", "spec_metrics"])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(io.StringIO(res.stdout))
    assert df["kind"].tolist() == ["spec_metrics", "spec_metrics"]
    assert df["accepted"].tolist() == [264, 261] and df["file"].tolist() == [str(VLLM)] * 2
    assert json.loads(df.loc[0, "per_position"]) == [1.0, 1.0, 1.0]
    assert "running_req" not in df.columns  # columns no record filled are left out
    assert "2 records from 1 file(s)" in res.stderr


def test_parse_several_files_to_parquet_and_csv(runner: CliRunner, tmp_path: Path) -> None:
    gz = tmp_path / "llama.log.gz"
    gz.write_bytes(gzip.compress(LLAMA.read_bytes()))
    out = tmp_path / "out.parquet"
    res = runner.invoke(app, ["parse", str(VLLM), str(gz), "-o", str(out)])
    assert res.exit_code == 0, res.output
    df = pd.read_parquet(out)
    assert df.groupby("file")["kind"].count().to_dict() == {str(VLLM): 5, str(gz): 6}
    stats = df[df["kind"] == "spec_statistics"]
    assert stats["draft_ms_total"].tolist() == [168.345, 670.1]
    assert list(stats["per_position"].iloc[0]) == [0.824, 0.635, 0.471]
    csv = tmp_path / "out.csv"
    assert runner.invoke(app, ["parse", str(LLAMA), "-o", str(csv), "-k", "request_timing"]).exit_code == 0
    assert pd.read_csv(csv)["eval_ms"].tolist() == [1024.0, 2048.0]


def test_parse_server_args_dict_becomes_json(runner: CliRunner) -> None:
    res = runner.invoke(app, ["parse", str(FIXTURES / "sglang_server_args_fragment.log")])
    args = json.loads(pd.read_csv(io.StringIO(res.stdout))["args"].iloc[0])
    assert args["cuda_graph_bs"] == [1, 2, 4, 8, 12, 16, 24, 32] and args["enable_torch_compile"] is False


def test_summary_prints_medians(runner: CliRunner) -> None:
    res = runner.invoke(app, ["summary", str(LLAMA)])
    assert res.exit_code == 0, res.output
    rows = [line.split() for line in res.stdout.splitlines()]
    assert ["llamacpp", "request_timing", "None", "2", "gen_throughput", "2", "187.5"] in rows
    assert ["llamacpp", "spec_statistics", "None", "2", "draft_ms_total", "2", "419.2"] in rows


def test_errors_exit_2_with_the_fix(runner: CliRunner, tmp_path: Path) -> None:
    res = runner.invoke(app, ["parse", str(VLLM), "-o", str(tmp_path / "x.txt")])
    assert res.exit_code == 2 and ".csv or .parquet" in res.output
    res = runner.invoke(app, ["summary", str(VLLM), "-k", "decodes"])
    assert res.exit_code == 2 and "unknown ['decodes']" in res.output
    res = runner.invoke(app, ["parse", str(tmp_path / "missing.log")])
    assert res.exit_code == 2
