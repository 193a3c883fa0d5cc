"""Notebook figures outside JupyterLab, the charts' encodings, and progress during long waits.

Fast: the display bundles (plotly JSON + a text/html that draws it + text/plain), plotly.js once per kernel,
nbconvert's HTML of such outputs, nbval's sanitiser for the committed notebooks, the figures' encodings on the
committed example records, the heartbeat lines of a wait, a build's time estimate.
Slow (notebook): `spectrial notebook 02` with tiny llama.cpp parameters (its section lines, no TCP warning), the
executed copy exported by `jupyter nbconvert --to html`, opened offline in headless Chromium: every figure drawn.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import nbformat.v4 as nbf
import plotly.graph_objects as go
import pytest
from rich.console import Console

from spectrial import progress
from spectrial.readers.explain import explain
from spectrial.readers.headline import headlines
from spectrial.readers.render import figures, plots
from spectrial.record.store import load_record

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "outputs" / "examples"
ONE_DEPTH = EXAMPLES / "local-cpu-demo" / "20261129-152448-02_eagle3-5522"  # draft-simple + eagle3 at k = 2
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]


def _shown(monkeypatch: pytest.MonkeyPatch, *figs: go.Figure) -> list[dict]:
    """The bundles `show_figure` displays in a fresh kernel (module state reset)."""
    import IPython.display

    out: list[dict] = []
    monkeypatch.setattr(IPython.display, "display", lambda bundle, raw=False: out.append(bundle))
    monkeypatch.setitem(figures._state, "plotlyjs_shown", False)
    monkeypatch.setattr(figures, "_figure_numbers", iter(range(1, 100)))
    for f in figs:
        figures.show_figure(f)
    return out


def _two() -> tuple[go.Figure, go.Figure]:
    return (go.Figure(go.Scatter(x=[1, 2], y=[3, 4]), layout={"title": "a </script> title"}),
            go.Figure(go.Bar(x=["x", "y"], y=[1, 2]), layout={"title": "bars"}))


def test_bundle_draws_with_plotlyjs_and_is_deterministic() -> None:
    fig, _ = _two()
    a, b = figures.figure_bundle(fig), figures.figure_bundle(fig)
    assert a == b  # no random ids: nbval compares executed notebooks exactly
    assert set(a) == {figures.PLOTLY_MIME, "text/html", "text/plain"}
    html = a["text/html"]
    assert "Plotly.newPlot(" in html and "<script src" not in html and "spectrial-plotlyjs" not in html
    assert html.count("</script>") == 1  # the title's "</script>" is escaped inside the script
    assert re.search(r'<div id="spectrial-fig-[0-9a-f]{12}"', html)


def test_show_figure_embeds_plotlyjs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from plotly.offline import get_plotlyjs

    monkeypatch.delenv(figures.PLOTLYJS_ENV, raising=False)
    first, second = _shown(monkeypatch, *_two())
    lib = get_plotlyjs()
    assert first["text/html"].count(lib) == 1 and lib not in second["text/html"]
    assert 'id="spectrial-fig-1"' in first["text/html"] and 'id="spectrial-fig-2"' in second["text/html"]
    assert first["text/plain"] == "<plotly figure: a </script> title>"


def test_nbval_sanitiser_equates_omitted_and_embedded_plotlyjs(monkeypatch: pytest.MonkeyPatch) -> None:
    from nbval.plugin import get_sanitize_patterns

    def sanitised(bundle: dict) -> str:
        s = bundle["text/html"]
        for regex, replace in get_sanitize_patterns((REPO / "tests" / "nbval_sanitize.cfg").read_text()):
            s = re.sub(regex, replace, s)
        return s

    monkeypatch.delenv(figures.PLOTLYJS_ENV, raising=False)
    embedded = _shown(monkeypatch, *_two())
    monkeypatch.setenv(figures.PLOTLYJS_ENV, "omit")
    omitted = _shown(monkeypatch, *_two())
    assert len(omitted[0]["text/html"]) < 20_000 < len(embedded[0]["text/html"])
    assert [sanitised(b) for b in embedded] == [sanitised(b) for b in omitted]


def test_nbconvert_html_draws_every_figure_with_one_plotlyjs(monkeypatch: pytest.MonkeyPatch) -> None:
    from nbconvert import HTMLExporter
    from plotly.offline import get_plotlyjs

    monkeypatch.delenv(figures.PLOTLYJS_ENV, raising=False)
    bundles = _shown(monkeypatch, *_two(), go.Figure(go.Scatter(x=[0], y=[0]), layout={"title": "third"}))
    nb = nbf.new_notebook(cells=[nbf.new_code_cell("show_figure(fig)", outputs=[
        nbf.new_output("display_data", data=b)]) for b in bundles])
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    assert body.count(get_plotlyjs()[:200]) == 1  # the library once, not per figure
    assert body.count("window.Plotly.newPlot(") == 3
    assert "&lt;plotly figure" not in body  # text/plain is not what nbconvert shows


def test_tau_chart_markers_share_their_lines_colour_and_have_legend_entries() -> None:
    fig = figures.explanation_figures(explain(load_record(ONE_DEPTH)))[0]
    assert fig.layout.title.text.startswith("Throughput a cycle can give")
    lines = {t.legendgroup: t for t in fig.data if t.mode == "lines"}
    dots = [t for t in fig.data if t.mode == "markers"]
    assert len(dots) == 2 and len({t.line.color for t in lines.values()}) == 2
    for d in dots:
        assert d.showlegend is not False and d.marker.color == lines[d.legendgroup].line.color


def test_acceptance_needed_with_one_depth_is_bars_per_arm() -> None:
    ex = explain(load_record(ONE_DEPTH))
    fig = next(f for f in figures.explanation_figures(ex) if "acceptance needed" in f.layout.title.text)
    assert "k = 2" in fig.layout.title.text
    bars = [t for t in fig.data if t.type == "bar"]
    assert bars and all(list(b.x) == ["draft-simple", "eagle3-synthetic"] for b in bars)
    assert all(t for b in bars for t in b.text)  # each bar says its value (or "out of reach")
    measured = [t for t in fig.data if t.type == "scatter"]
    assert {t.x[0] for t in measured} == {"draft-simple", "eagle3-synthetic"}  # measured alpha beside its bar


def test_acceptance_needed_over_depths_has_integer_k_ticks() -> None:
    record = next(p.parent for p in (EXAMPLES / "h200-sglang").glob("*sweep*/manifest.json"))
    fig = next(f for f in figures.explanation_figures(explain(load_record(record)))
               if "acceptance needed" in f.layout.title.text)
    assert fig.layout.xaxis.dtick == 1 and fig.layout.xaxis.tickmode == "linear"
    assert all(float(x).is_integer() for t in fig.data for x in t.x)


def test_break_even_scatter_has_one_legend_entry_per_arm_and_no_overlapping_labels() -> None:
    m = load_record(ONE_DEPTH)
    fig = plots.break_even_figure(m.arms)
    points = [t for t in fig.data if t.xaxis == "x2" and t.mode == "markers"]
    assert [t.name for t in points] == ["draft-simple", "eagle3-synthetic"]
    assert all("text" not in (t.mode or "") for t in fig.data if t.type == "scatter")
    bar = next(t for t in fig.data if t.type == "bar")
    assert list(bar.marker.color) == [t.marker.color for t in points]  # one colour per arm in both panels


def test_wait_heartbeat_lines(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPECTRIAL_PROGRESS", "line")
    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    bar = progress.Progress("waiting for vllm-eagle3", unit="probe", heartbeat=True)
    seen = []
    for t in range(0, 130):  # a probe every second, each "connection refused", for 130 s
        now[0] = 1000.0 + t
        bar.update(1)
        bar.set_postfix_str("ConnectError: [Errno 111] Connection refused")
        cap = capsys.readouterr()  # stdout inside a kernel (ipykernel imported), stderr elsewhere
        seen += [ln for ln in (cap.out + cap.err).splitlines() if ln]
    bar.close("ready after 130 probe(s)")
    assert seen[0] == ("[spectrial] waiting for vllm-eagle3: 5 s so far, 6 probe(s); last: ConnectError: "
                       "[Errno 111] Connection refused")
    secs = [int(re.search(r": (\d+) s so far", ln)[1]) for ln in seen]
    assert secs == [5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 90, 120]  # 5 s for a minute, then 30 s
    cap = capsys.readouterr()
    assert "ready after 130 probe(s)" in cap.out + cap.err


def test_build_estimate_from_the_cached_ninja_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from spectrial.engines import llamacpp_build as provision

    monkeypatch.setenv("SPECTRIAL_CACHE", str(tmp_path))
    monkeypatch.setattr(provision.os, "cpu_count", lambda: 4)
    assert provision.build_estimate(2)[0] == provision.REFERENCE_BUILD[1]  # the reference measurement: 2 jobs
    assert provision.build_estimate(2, cuda=True)[0] is None
    log = tmp_path / "llama.cpp" / "build" / "0.3.36-cpu-abc" / ".ninja_log"
    log.parent.mkdir(parents=True)
    log.write_text("# ninja log v5\n0\t100000\t1\ta.o\th\n0\t300000\t1\tb.o\th\n300000\t500000\t1\tc.o\th\n")
    secs, basis = provision.build_estimate(8)  # 600 core-seconds over 4 cores
    assert secs == provision.CONFIGURE_S + 150 and "600 core-seconds" in basis
    assert provision._clock(3725) == "1:02:05" and provision._clock(328) == "5:28"


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
                    reason="chromium not installed: run scripts/ensure-chromium.sh as root")
def test_notebook_02_nbconvert_html_draws_every_chart(tiny_params, write_params, tmp_path: Path) -> None:
    from test_report_browser import chromium

    out = Path(tiny_params["output_dir"])
    res = subprocess.run([*SPECTRIAL, "notebook", "02", "-p", f"params_file={write_params(tiny_params)}",
                          "-p", "steps=2", "-p", "repeats=2", "--output-dir", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert res.returncode == 0, res.stderr[-4000:]
    err = res.stderr
    assert "without encryption" not in err  # the kernel talks over ipc
    for line in ("[spectrial] notebook 02_eagle3.ipynb:", "1 · Kill the old server (cell", "3 · The baseline",
                 "[spectrial] waiting for llama-server-baseline: ready after", "cells executed"):
        assert line in err, err[-3000:]
    executed = next(out.glob("*/02_eagle3.ipynb"))
    # the run ends with its answer (`make demo` runs this command): the record's headline, after the paths
    buf = io.StringIO()
    for h in headlines(load_record(executed.parent)):
        h.print(Console(file=buf, width=80))
    said = res.stdout.replace("\r", "")
    assert buf.getvalue().strip() and buf.getvalue().strip() in said, said[-3000:]
    assert said.index(buf.getvalue().strip()) > said.index("report: "), said[-3000:]
    nb = nbformat.read(executed, as_version=4)
    n_fig = sum(figures.PLOTLY_MIME in (o.get("data") or {}) for c in nb.cells for o in c.get("outputs", []))
    assert n_fig >= 4

    conv = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(executed),
                           "--output-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert conv.returncode == 0, conv.stderr[-2000:]
    page = tmp_path / "02_eagle3.html"
    text = page.read_text()
    assert text.count('class="spectrial-plotlyjs"') == 1 and "&lt;plotly figure" not in text

    dom = chromium(tmp_path, "--dump-dom", page.resolve().as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert html.count('class="plot-container plotly"') == n_fig  # every figure built by plotly.js
    assert html.count('class="main-svg"') >= 2 * n_fig
    assert "holds no plotly.js" not in re.sub(r"<script\b.*?</script>", "", html, flags=re.S)
    assert html.count('class="trace scatter') + html.count('class="trace bars') >= n_fig  # traces inside them

    # a picture of the page for people (the DOM above is the check): tall enough for every figure
    shot = tmp_path / "nb02.png"
    res = chromium(tmp_path, "--window-size=1200,16000", f"--screenshot={shot}", page.resolve().as_uri())
    assert res.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", res.stderr[-2000:]
