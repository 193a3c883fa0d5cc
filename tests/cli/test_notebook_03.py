"""Notebook 03 executed by papermill: grid and guided sweeps on the local llama.cpp pair, and the SGLang stand-in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
import yaml

from spectrial.record.store import load_record

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "03_sweep.ipynb"
STANDIN = REPO / "params" / "examples" / "sweep-sglang-standin.yaml"
pytestmark = [pytest.mark.notebook, pytest.mark.slow]


def run_notebook(tmp_path: Path, params_file: Path, strategy: str, steps: list[int],
                 overrides: dict[str, Any]) -> tuple[str, dict[str, Any], Path]:
    """Execute notebook 03 into tmp_path; returns (all code outputs as text, the manifest, the run folder)."""
    out = tmp_path / f"03-{strategy}.ipynb"
    values = {"params_file": str(params_file), "strategy": strategy, "steps": steps, "concurrency": [1, 2],
              "repeats": 2, "max_tokens": 16, "output_dir": str(tmp_path / "outputs"), "progress": False,
              "overrides": overrides}
    res = subprocess.run([sys.executable, "-m", "papermill", str(NOTEBOOK), str(out), "-y", yaml.safe_dump(values),
                          "--cwd", str(REPO)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    nb = nbformat.read(out, as_version=4)
    text = "\n".join(json.dumps(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code")
    runs = [p for p in (tmp_path / "outputs").iterdir() if (p / "manifest.json").is_file()]
    assert len(runs) == 1
    m = json.loads((runs[0] / "manifest.json").read_text())
    assert m["status"] == "ok" and m["kind"] == "sweep" and m["strategy"] == strategy
    assert m["notebook"] == out.name and (runs[0] / out.name).is_file()
    assert text.count("application/vnd.plotly.v1+json") >= 4 and "server starts (a full grid needs" in text
    return text, m, runs[0]


def tiny_sweep(tiny_params: dict[str, Any]) -> dict[str, Any]:
    data = {k: v for k, v in tiny_params.items() if k not in ("arms", "steps", "output_dir")}
    data.update(name="nb03", draft="tiny:eagle3", method="eagle3", grid={"synthetic_accept": [0.8]})
    return data


@pytest.mark.parametrize("strategy", ["grid", "guided"])
def test_notebook_03_local_pair(strategy, tiny_params, write_params, tmp_path):
    params_file = write_params(tiny_sweep(tiny_params), "sweep.yaml")
    text, m, run = run_notebook(tmp_path, params_file, strategy, [1, 2, 4], {})
    settings = {p["setting"] for p in m["points"] if p["method"] != "none"}
    measured = {s["arm"] for s in m["starts"] if s["arm"] != "baseline"}
    if strategy == "grid":
        assert measured == settings and len(m["starts"]) == 4
    else:
        assert [s["phase"] for s in m["starts"][:3]] == ["baseline", "probe", "probe"]
        assert len(m["starts"]) <= 4
    best = load_record(run).best  # the typed record: one best per concurrency level, each a measured setting
    assert {b.concurrency for b in best} == {1, 2} and all(b.best in settings for b in best)
    assert "best **eagle3-s" in text and (run / "requests.csv").is_file()


def test_notebook_03_sglang_standin(tmp_path, port):
    if not (REPO / "tests" / "standin" / "sglang" / "launch_server.py").is_file() or not STANDIN.is_file():
        pytest.skip("the SGLang stand-in (tests/standin/sglang) is not in this checkout")
    overrides = {"port": port, "state_dir": str(tmp_path / "state"), "work_dir": str(tmp_path / "work"),
                 "engine_config.python": sys.executable}  # the double needs what SGLang's env has (psutil, ...)
    text, m, _ = run_notebook(tmp_path, STANDIN, "guided", [1, 2, 4], overrides)
    assert m["engine"]["name"] == "sglang" and m["grid"]["restart_fields"][:3] == ["steps", "topk", "draft_tokens"]
    spec = [p for p in m["points"] if p["method"] != "none" and p["status"] == "ok"]
    # the stand-in accepts each drafted token with probability 0.7: accept length near tau(0.7, steps)
    for p in spec:
        tau = (1 - 0.7 ** (p["steps"] + 1)) / 0.3
        assert abs(p["accept_len"] - tau) < 0.25 * p["steps"] + 0.3, (p["id"], p["accept_len"], tau)
    assert any(s["arm"] == "eagle3-s4" and s["phase"] == "probe" for s in m["starts"])
    assert "best **eagle3-s" in text
