"""`spectrial report`: report.html from a run record, self-contained (plotly.js inlined, no external script)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import nbformat
import nbformat.v4 as nbf
import pytest
from plotly.offline import get_plotlyjs

from spectrial.errors import ConfigError, RecordDamaged
from spectrial.readers.casestudy import case_dir
from spectrial.readers.render.report import PLOTLY_MIME, build_notebook, latest_run, write_report

REPO = Path(__file__).resolve().parents[2]
SCRIPT_SRC = re.compile(r"<script\b[^>]*\bsrc\s*=", re.IGNORECASE)


def case_copy(tmp_path: Path) -> Path:
    run = tmp_path / "case"
    shutil.copytree(case_dir(), run)
    return run


def assert_offline(html: str) -> None:
    """No external script at all; plotly.js inlined exactly once; cdn.plot.ly only inside plotly.js itself."""
    assert not SCRIPT_SRC.search(html)
    js = get_plotlyjs()
    assert html.count(js[:300]) == 1
    assert html.count("cdn.plot.ly") == js.count("cdn.plot.ly")  # plotly.js's unused topojson default only


def test_report_from_manifest(tmp_path: Path) -> None:
    run = case_copy(tmp_path)
    out = write_report(run)
    assert out == run / "report.html"
    html = out.read_text()
    assert_offline(html)
    figures = sum(PLOTLY_MIME in (o.get("data") or {}) for c in build_notebook(json.loads(
        (case_dir() / "manifest.json").read_text())).cells for o in c.get("outputs", []))
    assert figures == 5  # two sessions x (break-even, acceptance needed) + the later session's cycle model
    assert html.count("Plotly.newPlot(") == figures
    assert "Analysis: session later" in html and "does not pay" in html and "eagle3-k2-restart" in html
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["report"] == "report.html" and "report.html" in manifest["files"]
    assert manifest["report_source"] == "manifest"
    assert manifest["arms"] == json.loads((case_dir() / "manifest.json").read_text())["arms"]


def execute(nb: nbformat.NotebookNode, cwd: Path) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=120, resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


@pytest.mark.notebook
def test_report_from_executed_notebook(tmp_path: Path) -> None:
    run = case_copy(tmp_path)
    out_nb = run / "90_case.ipynb"
    res = subprocess.run([sys.executable, "-m", "papermill", str(REPO / "notebooks" / "90_case_kimi_k25_pcie.ipynb"),
                          str(out_nb), "-p", "case_dir", str(run), "--cwd", str(REPO / "notebooks")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["notebook"] = out_nb.name
    (run / "manifest.json").write_text(json.dumps(manifest))
    html = write_report(run).read_text()
    assert_offline(html)
    nb = nbformat.read(out_nb, as_version=4)
    figures = sum(PLOTLY_MIME in (o.get("data") or {}) for c in nb.cells for o in c.get("outputs", []))
    assert figures >= 4 and html.count("Plotly.newPlot(") == figures
    assert "Why 94 and 60 tok/s cannot be compared" in html and "2.46 baseline tokens" in html
    assert "casestudy.load_case" not in html  # code hidden by default
    assert json.loads((run / "manifest.json").read_text())["report_source"] == out_nb.name


@pytest.mark.notebook
def test_plotly_renderer_outputs_are_made_offline(tmp_path: Path) -> None:
    """Figures shown with plotly's own renderers (JSON + HTML, or CDN-connected HTML only) still draw offline;
    tqdm progress bars on stderr are dropped, warnings kept."""
    code = ("import plotly.io as pio, plotly.graph_objects as go\n"
            "pio.renderers.default = {r!r}\n"
            "go.Figure(go.Scatter(y=[1, 3, 2]), layout_title_text={t!r}).show()")
    nb = nbf.new_notebook(cells=[nbf.new_markdown_cell("# renderers"),
                                 nbf.new_code_cell(code.format(r="plotly_mimetype+notebook", t="json-fig")),
                                 nbf.new_code_cell(code.format(r="notebook_connected", t="cdn-fig")),
                                 nbf.new_code_cell("import sys, warnings\nfrom tqdm import tqdm\n"
                                                   "for _ in tqdm(range(3), file=sys.stderr): pass\n"
                                                   "warnings.warn('keep this warning')")])
    execute(nb, tmp_path)
    raw = json.dumps(nb)
    assert "cdn.plot.ly/plotly-" in raw and "window.PlotlyConfig" in raw  # what plotly really emitted
    run = tmp_path / "run"
    run.mkdir()
    nbformat.write(nb, run / "nb.ipynb")
    (run / "manifest.json").write_text(json.dumps({"run_id": "r", "status": "ok", "arms": [], "files": [],
                                                   "notebook": "nb.ipynb"}))
    html = write_report(run).read_text()
    assert_offline(html)
    assert "json-fig" in html and "cdn-fig" in html
    assert html.count("Plotly.newPlot(") == 2
    assert "it/s]" in raw and "it/s]" not in html and "keep this warning" in html  # progress bars dropped only


def test_bad_run_dirs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="holds no manifest.json"):
        write_report(tmp_path)
    (tmp_path / "manifest.json").write_text("{broken")
    with pytest.raises(RecordDamaged, match="not valid JSON"):
        write_report(tmp_path)
    assert (tmp_path / "manifest.json").read_text() == "{broken" and not (tmp_path / "report.html").exists()
    with pytest.raises(ConfigError, match="no run record"):
        latest_run(tmp_path / "nothing")


def test_failed_run_still_gets_a_report(tmp_path: Path) -> None:
    run = tmp_path / "20261101-100000-failed-abcd"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({
        "run_id": run.name, "status": "failed", "reason": "GPUs busy: GPU 0 has 900 MiB in use", "name": "x",
        "kind": "trial", "started_at": "2026-11-01T10:00:00.000+00:00", "arms": [], "files": [],
        "notebook": "missing.ipynb"}))
    html = write_report(run).read_text()
    assert "GPUs busy" in html and "No arm was recorded" in html
    shutil.copytree(case_dir(), tmp_path / "zz-case")  # sorts last by name, but has no start time
    assert latest_run(tmp_path) == run


@pytest.mark.slow
def test_report_and_history_of_a_real_trial(tiny_params: dict, write_params: Callable[..., Path]) -> None:
    """A real local llama-server trial (baseline, draft, synthetic EAGLE-3): its record reads into history,
    explain finds nothing wrong with it, and its report draws every analysis figure offline."""
    from spectrial.protocol.trial import run_trial
    from spectrial.readers import history
    from spectrial.readers.explain import explain
    from spectrial.readers.render.figures import explanation_figures

    result = run_trial(write_params(tiny_params), progress=False)
    assert result.status == "ok"
    e = explain(result.manifest)
    assert e.problems == [] and e.numbers.baseline_tok_s == pytest.approx(result.arms[0].tok_s)
    h = history.load_history(tiny_params["output_dir"])
    assert h.issues.empty and len(h.table) == 3 and set(h.table["nccl_env"]) == {"none"}
    html = write_report(result.run_dir).read_text()
    assert_offline(html)
    # the explain sections' figures, the per-request accept lengths and the serving section's latency distributions
    assert html.count("Plotly.newPlot(") == len(explanation_figures(e)) + 2 and len(explanation_figures(e)) >= 2
    assert "Is the measurement valid?" in html and "Accept length per request" in html and "per-request mean" in html
    assert json.loads((result.run_dir / "manifest.json").read_text())["report"] == "report.html"
