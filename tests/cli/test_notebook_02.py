"""Notebook 02 executed by papermill against a real local llama-server, with tiny parameters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.notebook, pytest.mark.slow]


def test_papermill_notebook_02(tiny_params, write_params, tmp_path):
    params_file = write_params(tiny_params)
    out = tmp_path / "out.ipynb"
    res = subprocess.run([sys.executable, "-m", "papermill", str(REPO / "notebooks" / "02_eagle3.ipynb"), str(out),
                          "-p", "params_file", str(params_file), "-p", "steps", "2", "-p", "repeats", "2",
                          "--cwd", str(REPO)], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    nb = nbformat.read(out, as_version=4)
    text = "\n".join(json.dumps(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code")
    assert "application/vnd.plotly.v1+json" in text and "IProgress" not in text
    # one cell per protocol step, each with its output; one verdict (the break-even section), not two
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    for step in ("trial.kill_old_server()", "trial.verify_gpus_free()", "trial.run_arm(name)", "trial.compare()",
                 "explain(trial.manifest"):
        assert sum(step in src for src in code) >= 1, step
    assert text.count("### Break-even") == 1 and "speculation **" in text
    runs = [p for p in Path(tiny_params["output_dir"]).iterdir() if (p / "manifest.json").is_file()]
    assert len(runs) == 1
    m = json.loads((runs[0] / "manifest.json").read_text())
    assert m["status"] == "ok" and [a["name"] for a in m["arms"]] == ["baseline", "draft", "eagle3"]
    assert m["notebook"] == "out.ipynb" and (runs[0] / "out.ipynb").is_file()
