"""Rendering of the readers' analysis: plotly figures, notebook display and notebook cells (no numbers computed
here that the analysis does not already hold).

- :func:`figure_bundle` / :func:`show_figure`: a figure as a deterministic display bundle: plotly's JSON (JupyterLab
  and VS Code draw it), a ``text/html`` that draws it with plotly.js (what ``jupyter nbconvert --to html`` keeps) and
  a one-line ``text/plain``. No random element ids, so executed notebooks compare equal under nbval.
  :func:`show_figure` embeds plotly.js once per kernel, in the first figure's ``text/html``, so an exported page
  draws every figure offline (``SPECTRIAL_PLOTLYJS=omit`` leaves it out: the nbval notebooks kept in the repository).
- :func:`explanation_figures`, :func:`show_explanation`, :func:`explanation_cells`: the figures, the notebook
  display and the report cells of a :class:`~spectrial.readers.explain.Explanation`.
- :func:`cycle_lines_figure`: the fitted cycle line of several analyses side by side (notebook 05).
- :func:`matrix_figure`, :func:`baseline_figure`: the history's matrix as a heatmap, baselines over time.
"""

from __future__ import annotations

import hashlib
import html
import itertools
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from spectrial.readers import history
from spectrial.readers.explain import MAX_MODEL_K, Explanation, FigureName, Section, rounded
from spectrial.record.store import PLOTLYJS_CLASS

__all__ = ["PLOTLYJS_CLASS", "baseline_figure", "cycle_lines_figure", "explanation_cells", "explanation_figures",
           "figure_bundle", "figure_html", "matrix_figure", "plotlyjs_html", "show_explanation", "show_figure",
           "table_bundle"]

PLOTLY_MIME = "application/vnd.plotly.v1+json"
PLOTLYJS_ENV = "SPECTRIAL_PLOTLYJS"  # "omit": show_figure leaves plotly.js out (notebooks whose outputs are committed)
COLOURS = qualitative.Plotly  # plotly's default colourway: one colour per arm, its lines and markers alike
_state = {"plotlyjs_shown": False}
_figure_numbers = itertools.count(1)


# ------------------------------------------------------------------ figure output
def _title(fig_json: dict[str, Any]) -> str:
    title = (fig_json.get("layout") or {}).get("title") or {}
    return str((title.get("text") if isinstance(title, dict) else title) or "figure")


def _js(value: Any) -> str:
    """A value as a JavaScript literal safe inside a ``<script>`` element (no ``</`` or ``<!--`` in it)."""
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\!--")


def figure_html(fig_json: dict[str, Any], div_id: str) -> str:
    """A ``<div>`` and the script that draws a figure's JSON into it with the page's plotly.js (``window.Plotly``);
    without one, the div says so and how to get a drawn copy. No ``<script src>``: nothing is fetched."""
    spec = _js({"data": fig_json.get("data", []), "layout": fig_json.get("layout", {}),
                "config": fig_json.get("config") or {}})
    height = int((fig_json.get("layout") or {}).get("height") or 450)
    missing = _js(f"Figure \u201c{_title(fig_json)}\u201d is not drawn: this page holds no plotly.js (the notebook was "
                  f"executed with {PLOTLYJS_ENV}=omit, or the cell that embedded it was re-run). "
                  "`spectrial report RUN_DIR` writes a page that draws every figure.")
    return (f'<div id="{html.escape(div_id)}" class="spectrial-plotly" style="width:100%;height:{height}px"></div>\n'
            f'<script type="text/javascript">(function () {{ var f = {spec}, id = {_js(div_id)};\n'
            "function draw() { var el = document.getElementById(id); if (!el) { return; }\n"
            f"  if (!window.Plotly) {{ el.style.height = 'auto'; el.textContent = {missing}; return; }}\n"
            "  window.Plotly.newPlot(el, f.data, f.layout, Object.assign({responsive: true, displaylogo: false}, "
            "f.config)); }\n"
            "if (window.Plotly || document.readyState !== 'loading') { draw(); } "
            "else { document.addEventListener('DOMContentLoaded', draw); } })();</script>")


def plotlyjs_html() -> str:
    """plotly.js inline, in one ``<script class="spectrial-plotlyjs">`` (about 4.8 MB; it sets ``window.Plotly``)."""
    from plotly.offline import get_plotlyjs

    return f'<script type="text/javascript" class="{PLOTLYJS_CLASS}">{get_plotlyjs()}</script>\n'


def figure_bundle(fig: go.Figure, div_id: str | None = None, *, plotlyjs: bool = False) -> dict[str, Any]:
    """A display bundle of a figure: plotly's JSON mimetype, ``text/html`` drawing it with plotly.js (preceded by
    plotly.js itself when `plotlyjs`) and a one-line ``text/plain``.

    Unlike plotly's notebook renderers it holds no random element ids (`div_id` defaults to a hash of the figure),
    so executed notebooks compare equal under nbval; JupyterLab renders the JSON, nbconvert's HTML the
    ``text/html``, ``spectrial report`` draws the JSON with its own embedded plotly.js.
    """
    data = json.loads(fig.to_json())
    div_id = div_id or "spectrial-fig-" + hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
    return {PLOTLY_MIME: data, "text/html": (plotlyjs_html() if plotlyjs else "") + figure_html(data, div_id),
            "text/plain": f"<plotly figure: {_title(data)}>"}


def show_figure(fig: go.Figure) -> None:
    """Display a figure in a notebook through :func:`figure_bundle`: element ids numbered in display order, and
    plotly.js embedded with the first figure of the kernel (a placeholder script with ``SPECTRIAL_PLOTLYJS=omit``)."""
    from IPython.display import display

    first = not _state["plotlyjs_shown"]
    _state["plotlyjs_shown"] = True
    omit = os.environ.get(PLOTLYJS_ENV, "").lower() == "omit"
    bundle = figure_bundle(fig, f"spectrial-fig-{next(_figure_numbers)}", plotlyjs=first and not omit)
    if first and omit:
        bundle["text/html"] = (f'<script type="text/javascript" class="{PLOTLYJS_CLASS}">/* plotly.js left out: '
                               f'{PLOTLYJS_ENV}=omit */</script>\n' + bundle["text/html"])
    display(bundle, raw=True)


# ------------------------------------------------------------------ an Explanation's figures
def _wall_figure(ex: Explanation, _section: Section) -> go.Figure:
    base, spec, target = ex.base, ex.spec, ex.numbers.target_tok_s
    assert base is not None and base.tok_s is not None  # the break-even section names a figure only with one
    fig = go.Figure()
    kmax = max([a.k or 1 for a in spec] + [1])
    for i, a in enumerate(a for a in spec if a.cycle_ms):
        colour = COLOURS[i % len(COLOURS)]
        top = (a.k or kmax) + 1
        taus = [1 + i * (top - 1) / 20 for i in range(21)]
        fig.add_scatter(x=[rounded(t) for t in taus], y=[rounded(t / a.cycle_ms * 1000) for t in taus],
                        mode="lines", line={"color": colour}, legendgroup=a.name,
                        name=f"{a.name}: cycle {a.cycle_ms:.2f} ms")
        if a.accept_len is not None:
            fig.add_scatter(x=[rounded(a.accept_len)], y=[rounded(a.accept_len / a.cycle_ms * 1000)],
                            mode="markers", marker={"size": 11, "color": colour, "line": {"color": "white", "width": 1}},
                            legendgroup=a.name, name=f"{a.name}: measured (accept length {a.accept_len:.2f})")
    fig.add_hline(y=rounded(base.tok_s), line_dash="dash", line_color="#555",
                  annotation_text=f"baseline {base.tok_s:.1f} tok/s")
    if target and target != base.tok_s:
        fig.add_hline(y=rounded(target), line_dash="dot", line_color="#d62728",
                      annotation_text=f"target {target:g} tok/s")
    fig.update_layout(title="Throughput a cycle can give at each accept length (tau / cycle time)",
                      xaxis_title="accept length (tokens committed per cycle)", yaxis_title="tokens / s",
                      template="plotly_white", height=420)
    return fig


def _workload_figure(ex: Explanation, _section: Section) -> go.Figure:
    fig = go.Figure()
    for a in (a for a in ex.spec if a.raw.categories):
        cats = [c.category for c in a.raw.categories]
        fig.add_bar(x=cats, y=[rounded(c.accept_len) for c in a.raw.categories], name=f"{a.name}: accept length")
        if a.raw.break_even_accept_len is not None:
            fig.add_scatter(x=cats, y=[rounded(a.raw.break_even_accept_len)] * len(cats), mode="lines+markers",
                            line={"dash": "dash"}, name=f"{a.name}: break-even")
    fig.update_layout(title="Accept length per workload category against each arm's break-even",
                      xaxis_title="workload category", yaxis_title="tokens committed per cycle", barmode="group",
                      template="plotly_white", height=400)
    return fig


def _model_figure(ex: Explanation, _section: Section) -> go.Figure:
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("cycle time vs depth", "predicted throughput vs depth"))
    for f in ex.fits:
        kmax = max(MAX_MODEL_K, max(a.k for a in f.arms))  # type: ignore[type-var]
        ks = [k for k in range(1, kmax + 1) if f.model.fixed_ms + f.model.per_draft_ms * k > 0]
        fig.add_scatter(x=[a.k for a in f.arms], y=[rounded(a.cycle_ms) for a in f.arms], mode="markers",
                        marker={"size": 10}, name=f"{f.method}: measured cycle", row=1, col=1)
        fig.add_scatter(x=ks, y=[rounded(f.model.cycle_ms(k)) for k in ks], mode="lines",
                        name=f"{f.method}: fitted", row=1, col=1)
        alphas = sorted({round(a.alpha, 2) for a in f.arms if a.alpha is not None} | {0.6, 0.8, 0.9})
        for al in alphas:
            fig.add_scatter(x=ks, y=[rounded(f.model.throughput(al, k)) for k in ks], mode="lines",
                            name=f"{f.method}: alpha {al:.2f}", row=1, col=2)
        have = [a for a in f.arms if a.tok_s is not None]
        fig.add_scatter(x=[a.k for a in have], y=[rounded(a.tok_s) for a in have], mode="markers",
                        marker={"size": 10, "symbol": "x"}, name=f"{f.method}: measured tok/s", row=1, col=2)
    if ex.base is not None:
        fig.add_hline(y=rounded(ex.base.tok_s), line_dash="dash", line_color="#555", row=1, col=2,
                      annotation_text="baseline")
    fig.update_xaxes(title_text="k (drafted tokens per cycle)")
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="tokens / s", row=1, col=2)
    fig.update_layout(title="Fitted cycle-cost model", template="plotly_white", height=440)
    return fig


def _needed_figure(ex: Explanation, section: Section) -> go.Figure:
    """alpha needed per depth k: lines over integer k with each arm's measured alpha marked, or, where every source
    has one depth, bars per source (value written on each, "out of reach" where no alpha suffices)."""
    table = section.table
    assert table is not None  # the section names a figure only with its table
    fig = go.Figure()
    sources = list(dict.fromkeys(table["source"]))
    colour = {src: COLOURS[i % len(COLOURS)] for i, src in enumerate(sources)}
    ks = sorted({int(k) for k in table["k"]})
    one_k = len(ks) == 1
    dash = ("solid", "dash", "dot")
    for t, (lbl, tok_s) in enumerate(ex.targets):
        col = f"alpha_{lbl}"
        what = "break-even" if lbl == "break_even" else "the target"
        if one_k:
            g = table.drop_duplicates("source")
            vals = [None if pd.isna(v) else float(v) for v in g[col]]
            fig.add_bar(x=g["source"].tolist(), y=[0.0 if v is None else v for v in vals],
                        marker={"color": [colour[s] for s in g["source"]], "opacity": 1.0 if t == 0 else 0.55,
                                "pattern": {"shape": "" if t == 0 else "/"}},
                        text=["out of reach" if v is None else f"{v:.3f}" for v in vals], textposition="outside",
                        name=f"needed for {what} ({tok_s:.1f} tok/s)")
            continue
        for src, g in table.groupby("source", sort=False):
            gg = g.dropna(subset=[col])
            if len(gg):
                fig.add_scatter(x=[int(k) for k in gg["k"]], y=gg[col].tolist(), mode="lines+markers",
                                line={"color": colour[src], "dash": dash[t % len(dash)]}, legendgroup=str(src),
                                name=f"{src}: needed for {what} ({tok_s:.1f} tok/s)")
    fitted = {s for s in sources if s not in {a.name for a in ex.spec}}
    for a in ex.spec:
        if a.alpha is None or a.k is None:
            continue
        src = a.condition if a.condition in fitted else a.name
        x: Any = src if one_k else a.k
        fig.add_scatter(x=[x], y=[rounded(a.alpha)], mode="markers", legendgroup=str(src),
                        marker={"symbol": "diamond", "size": 12, "color": colour.get(src, "#333"),
                                "line": {"color": "black", "width": 1}},
                        name=f"{a.name}: measured alpha {a.alpha:.3f}" + (" (synthetic)" if a.synthetic else ""))
    if one_k:
        fig.update_layout(title=f"Per-token acceptance needed at k = {ks[0]} (the one depth run)",
                          xaxis_title="source (arm, or method's fitted model)", barmode="group")
    else:
        fig.update_layout(title="Per-token acceptance needed at each depth",
                          xaxis={"title": "k (drafted tokens per cycle)", "tickmode": "linear", "tick0": 1, "dtick": 1,
                                 "range": [ks[0] - 0.5, ks[-1] + 0.5]})
    fig.update_layout(yaxis_title="alpha needed (per-token acceptance)", yaxis_range=[0, 1.1],
                      template="plotly_white", height=420)
    return fig


_FIGURES: dict[FigureName, Callable[[Explanation, Section], go.Figure]] = {
    "break_even": _wall_figure, "workload": _workload_figure, "model": _model_figure, "needed": _needed_figure}


def _section_figures(ex: Explanation) -> list[go.Figure | None]:
    return [None if s.figure is None else _FIGURES[s.figure](ex, s) for s in ex.sections]


def explanation_figures(ex: Explanation) -> list[go.Figure]:
    """The figures of an analysis, in section order."""
    return [f for f in _section_figures(ex) if f is not None]


def show_explanation(ex: Explanation) -> None:
    """Display every section in a notebook: markdown, table, figure (deterministic output)."""
    from IPython.display import Markdown, display

    for s, fig in zip(ex.sections, _section_figures(ex), strict=True):
        display(Markdown(f"### {s.title}\n\n{s.text}"))
        if s.table is not None and len(s.table):
            display(s.table)
        if fig is not None:
            show_figure(fig)


def explanation_cells(ex: Explanation) -> list[Any]:
    """The sections as notebook cells with outputs (markdown cells; tables and figures as outputs)."""
    import nbformat.v4 as nbf

    cells: list[Any] = []
    for s, fig in zip(ex.sections, _section_figures(ex), strict=True):
        cells.append(nbf.new_markdown_cell(f"### {s.title}\n\n{s.text}"))
        outputs = []
        if s.table is not None and len(s.table):
            outputs.append(nbf.new_output("display_data", data=table_bundle(s.table)))
        if fig is not None:
            outputs.append(nbf.new_output("display_data", data=figure_bundle(fig)))
        if outputs:
            cells.append(nbf.new_code_cell("", outputs=outputs))
    return cells


# ------------------------------------------------------------------ several analyses
def cycle_lines_figure(analyses: Sequence[tuple[str, Explanation]]) -> go.Figure:
    """The fitted cycle line of every (label, analysis) and method, with the measured points: where two engines
    run the same model on the same GPU, the gap between their lines is the engine's own overhead per cycle."""
    fig = go.Figure()
    for label, ex in analyses:
        table = ex.section("Cycle-cost model").table
        if table is None or not len(table):
            continue
        for method, g in table.groupby("method", sort=False):
            name = f"{label}: {method}"
            fig.add_scatter(x=g["k"].tolist(), y=g["cycle_ms"].tolist(), mode="markers", name=f"{name} (measured)")
            fit = ex.numbers.models[str(method)]
            ks = list(range(1, int(g["k"].max()) + 1))
            fig.add_scatter(x=ks, y=[round(fit.cycle_ms(k), 4) for k in ks], mode="lines",
                            name=f"{name}: {fit.fixed_ms:.2f} + {fit.per_draft_ms:.2f} k ms")
    fig.update_layout(title="Cycle time vs drafted tokens, every record", xaxis_title="drafted tokens k",
                      yaxis_title="ms per cycle", template="plotly_white", height=450)
    return fig


# ------------------------------------------------------------------ the history
def baseline_figure(table: pd.DataFrame) -> go.Figure:
    """Baseline tok/s over time, one line per host and NCCL state, min-max as error bars where recorded."""
    b = history.baseline_over_time(table)
    fig = go.Figure()
    for (host, env), g in b.groupby(["host", "nccl_env"], sort=False):
        lo = (g["tok_s"] - g["tok_s_min"]).fillna(0).round(4).tolist()
        hi = (g["tok_s_max"] - g["tok_s"]).fillna(0).round(4).tolist()
        fig.add_scatter(x=g["when"].tolist(), y=g["tok_s"].round(4).tolist(), mode="lines+markers",
                        name=f"{host} · NCCL {env}", text=g["arm"].tolist(),
                        error_y={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo})
    fig.update_layout(title="Baseline throughput over time, per host", xaxis_title="run (time order)",
                      yaxis_title="tokens / s", template="plotly_white", height=420,
                      xaxis={"type": "category", "categoryorder": "array",
                             "categoryarray": b["when"].drop_duplicates().tolist()})
    return fig


def matrix_figure(m: pd.DataFrame, title: str, fmt: str = ".1f") -> go.Figure:
    """A heatmap of a :func:`spectrial.readers.history.matrix` (empty cells blank), values written in the cells."""
    fig = go.Figure()
    if m.empty:
        fig.update_layout(title=title + " (no data)", template="plotly_white")
        return fig
    ylab = [" · ".join(str(x) for x in (i if isinstance(i, tuple) else (i,))) for i in m.index]
    z = [[None if pd.isna(v) else round(float(v), 4) for v in row] for row in m.to_numpy()]
    text = [["" if v is None else format(v, fmt) for v in row] for row in z]
    fig.add_heatmap(z=z, x=[str(c) for c in m.columns], y=ylab, text=text, texttemplate="%{text}",
                    colorscale="Viridis", hoverongaps=False)
    fig.update_layout(title=title, template="plotly_white", height=max(300, 60 * len(ylab) + 160),
                      yaxis={"autorange": "reversed"}, margin={"l": 360})
    return fig


def table_bundle(table: pd.DataFrame) -> dict[str, str]:
    """A table as a display bundle (html and plain text, no index)."""
    return {"text/html": table.to_html(index=False), "text/plain": table.to_string(index=False)}
