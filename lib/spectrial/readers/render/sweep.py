"""Plotly figures of a sweep record: the heatmap of a figure per setting and concurrency, tok/s and its parts
against depth, predictions against measurements (the selection of points: `spectrial.readers.sweep`)."""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from spectrial.readers.points import (
    baseline_points,
    load_of,
    load_order,
    load_short,
    scenario_label,
    setting_label,
    spec_points,
)
from spectrial.readers.sweep import fmt
from spectrial.schema import Manifest, PointRecord

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def _cell_text(p: PointRecord | None, v: float | None, value: str) -> str:
    if v is None and p is not None and p.status == "not measured" and p.final_prediction:
        return f"not measured<br>(predicted {p.final_prediction.tok_s:.1f})" if value == "tok_s" else "not measured"
    if v is None:
        return "not measured" if not p or p.status == "not measured" else "failed"
    if value == "tok_s" and p is not None and p.tok_s_ci_low is not None:
        return f"{v:.1f}<br>[{p.tok_s_ci_low:.1f}, {fmt(p.tok_s_ci_high)}]"
    return f"{v:.3g}"


def heatmap_figure(manifest: Manifest, value: str = "tok_s",
                   title: str = "Measured tok/s per setting and concurrency") -> go.Figure:
    """Setting (x) by concurrency (y), one panel per scenario; unmeasured cells are blank, the text shows the CI.
    `value`: a numeric field of the points (tok_s, accept_len, cycle_ms, speedup, ...)."""
    spec = spec_points(manifest)
    scenarios = list(dict.fromkeys(p.scenario for p in spec))
    levels = sorted({load_of(p) for p in spec}, key=load_order)
    fig = make_subplots(rows=max(len(scenarios), 1), cols=1, subplot_titles=[scenario_label(s) for s in scenarios],
                        vertical_spacing=0.18 if len(scenarios) > 1 else 0.1)
    for i, sc in enumerate(scenarios, 1):
        mine = [p for p in spec if p.scenario == sc]
        xs = list(dict.fromkeys(setting_label(p) for p in sorted(mine, key=lambda p: (p.k, p.steps))))
        z, text = [], []
        for c in levels:
            row_z, row_t = [], []
            for x in xs:
                p = next((q for q in mine if load_of(q) == c and setting_label(q) == x), None)
                v = getattr(p, value, None) if p is not None and p.status == "ok" else None
                row_z.append(v if v is not None else math.nan)
                row_t.append(_cell_text(p, v, value))
            z.append(row_z)
            text.append(row_t)
        fig.add_trace(go.Heatmap(z=z, x=xs, y=[load_short(c) for c in levels], text=text, texttemplate="%{text}",
                                 colorscale="Viridis", showscale=i == 1, colorbar={"title": value},
                                 hovertemplate="%{x} %{y}: %{text}<extra></extra>"), row=i, col=1)
    fig.update_layout(title=title, template="plotly_white", height=260 + 200 * max(len(scenarios), 1))
    return fig


def _ci_bars(points: list[PointRecord]) -> go.scatter.ErrorY:
    """Asymmetric error bars of tok/s from each point's CI (none where it has no CI)."""
    return go.scatter.ErrorY(type="data", symmetric=False,
                             array=[(p.tok_s_ci_high or p.tok_s or 0.0) - (p.tok_s or 0.0) for p in points],
                             arrayminus=[(p.tok_s or 0.0) - (p.tok_s_ci_low or p.tok_s or 0.0) for p in points])


def curves_figure(manifest: Manifest, title: str = "tok/s against draft depth") -> go.Figure:
    """Per scenario: measured tok/s (median, CI error bars) and the model's prediction against depth,
    one colour per concurrency level, the baseline as a dashed line of the same colour."""
    spec = spec_points(manifest)
    scenarios = list(dict.fromkeys(p.scenario for p in spec))
    levels = sorted({load_of(p) for p in spec}, key=load_order)
    base = baseline_points(manifest)
    fig = make_subplots(rows=1, cols=max(len(scenarios), 1), subplot_titles=[scenario_label(s) for s in scenarios],
                        shared_yaxes=True)
    for i, sc in enumerate(scenarios, 1):
        for j, x in enumerate(levels):
            color, c = _COLORS[j % len(_COLORS)], load_short(x)
            mine = sorted((p for p in spec if p.scenario == sc and load_of(p) == x),
                          key=lambda p: (p.k, p.steps))
            ok = [p for p in mine if p.status == "ok"]
            fig.add_scatter(x=[p.steps for p in ok], y=[p.tok_s for p in ok], mode="markers+lines",
                            name=f"measured {c}", legendgroup=x.id, showlegend=i == 1,
                            marker={"color": color, "size": 9}, line={"color": color, "width": 1},
                            error_y=_ci_bars(ok), row=1, col=i)
            pred = [(p.steps, p.final_prediction) for p in mine if p.final_prediction]
            if pred:
                fig.add_scatter(x=[s for s, _ in pred], y=[f.tok_s for _, f in pred if f],
                                mode="lines", name=f"model {c}", legendgroup=x.id, showlegend=i == 1,
                                line={"color": color, "dash": "dot"}, row=1, col=i)
            if x in base:
                fig.add_hline(y=base[x].tok_s, line_dash="dash", line_color=color, row=1, col=i,
                              annotation_text=f"baseline {c}" if i == 1 else None)
        fig.update_xaxes(title_text="draft depth (steps)", row=1, col=i)
    fig.update_yaxes(title_text="tok/s per stream (median, CI)", row=1, col=1)
    fig.update_layout(title=title, template="plotly_white", height=460)
    return fig


def components_figure(manifest: Manifest, title: str = "Accept length and cycle time against depth"
                      ) -> go.Figure:
    """Left: accept length measured (markers) and modelled (dotted); right: cycle time, same encoding."""
    spec = spec_points(manifest)
    levels = sorted({load_of(p) for p in spec}, key=load_order)
    scenarios = list(dict.fromkeys(p.scenario for p in spec))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("accept length (tokens / cycle)", "cycle time (ms)"))
    for j, (sc, x) in enumerate((s, x) for s in scenarios for x in levels):
        color = _COLORS[j % len(_COLORS)]
        name = f"{scenario_label(sc)}, {load_short(x)}"
        mine = sorted((p for p in spec if p.scenario == sc and load_of(p) == x), key=lambda p: p.steps or 0)
        ok = [p for p in mine if p.status == "ok"]
        pred = [(p.steps, p.final_prediction) for p in mine if p.final_prediction]
        for col, measured, modelled in ((1, [p.accept_len for p in ok], [f.accept_len for _, f in pred if f]),
                                        (2, [p.cycle_ms for p in ok], [f.cycle_ms for _, f in pred if f])):
            fig.add_scatter(x=[p.steps for p in ok], y=measured, mode="markers", name=name,
                            legendgroup=name, showlegend=col == 1, marker={"color": color, "size": 8}, row=1, col=col)
            if pred:
                fig.add_scatter(x=[s for s, _ in pred], y=modelled, mode="lines", line={"color": color, "dash": "dot"},
                                legendgroup=name, showlegend=False, row=1, col=col)
    fig.update_xaxes(title_text="draft depth (steps)")
    fig.update_layout(title=title, template="plotly_white", height=420)
    return fig


def _alternating(xs: list[float]) -> list[str]:
    """Text positions for point labels: above and below in turn along x."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    pos = [""] * len(xs)
    for n, i in enumerate(order):
        pos[i] = "top center" if n % 2 == 0 else "bottom center"
    return pos


def prediction_figure(manifest: Manifest, title: str = "Predicted before measuring vs measured"
                      ) -> go.Figure:
    """Each point measured after a prediction: the prediction (x) against the measurement (y, with CI)."""
    pts = [(p, p.prediction) for p in spec_points(manifest) if p.prediction and p.status == "ok"]
    fig = go.Figure()
    if pts:
        xs = [f.tok_s for _, f in pts if f]
        ys = [p.tok_s or 0.0 for p, _ in pts]
        lo, hi = min(xs + ys) * 0.9, max(xs + ys) * 1.1
        fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"dash": "dot", "color": "#7f7f7f"},
                        name="prediction = measurement")
        fig.add_scatter(x=xs, y=ys, mode="markers+text", text=[f"{setting_label(p)} {load_short(load_of(p))}"
                                                               for p, _ in pts],
                        # labels alternate above and below in x order, so neighbours do not overlap
                        textposition=_alternating([f.tok_s for _, f in pts if f]),
                        marker={"size": 10, "color": "#1f77b4"}, name="points",
                        error_y=_ci_bars([p for p, _ in pts]))
    else:
        fig.add_annotation(text="no point was measured after a prediction (grid strategy, or the probes sufficed)",
                           showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(title=title, xaxis_title="predicted tok/s", yaxis_title="measured tok/s (median, CI)",
                      template="plotly_white", height=420)
    return fig


__all__ = ["components_figure", "curves_figure", "heatmap_figure", "prediction_figure"]


def pareto_figure(manifest: Manifest, title: str = "tok/s per user against total tok/s") -> go.Figure:
    """The serving view (issue 40): each setting (and the baseline) as a line over the concurrency levels, total
    output tok/s of the window (all streams) on x, decode tok/s per request (per user) on y; the hover adds the
    speed-up with its interval and the goodput under `slo:` where set (`spectrial.readers.crossover`)."""
    from spectrial.readers.crossover import Level, crossovers

    fig = go.Figure()
    bases = baseline_points(manifest)
    for rates in (False, True):  # the concurrency levels' baseline line, and the request rates' (dotted)
        base = [p for x, p in bases.items() if (x.rate is not None) == rates]
        if base:
            fig.add_scatter(x=[p.serving.output_tok_s if p.serving else None for p in base], y=[p.tok_s for p in base],
                            mode="markers+lines", name="baseline" + (" (request rates)" if rates else ""),
                            line={"color": "black", "dash": "dot" if rates else "dash"},
                            text=[load_short(load_of(p)) for p in base], textposition="top center",
                            hovertemplate="baseline %{text}<br>%{x:.1f} tok/s all streams<br>%{y:.1f} tok/s per user"
                                          "<extra></extra>")
    for i, c in enumerate(crossovers(manifest)):
        def where(lv: Level) -> str:
            return f"c={lv.concurrency}" if lv.offered_rate is None else f"{lv.offered_rate:g} req/s"

        hover = [f"{where(lv)}: {lv.speedup:.2f}x" + (f" [{lv.ci[0]:.2f}, {lv.ci[1]:.2f}]" if lv.ci else "")
                 + (f", goodput {lv.goodput:.2f} req/s" if lv.goodput is not None else "")
                 + (" (invalid measurement)" if lv.invalid else "") if lv.speedup is not None
                 else where(lv) for lv in c.levels]
        axis = "" if c.axis == "concurrency" else ", request rates"
        fig.add_scatter(x=[lv.output_tok_s for lv in c.levels], y=[lv.tok_s for lv in c.levels],
                        mode="markers+lines", name=f"{c.setting} ({scenario_label(c.scenario)}{axis})",
                        line={"dash": "dot" if c.axis != "concurrency" else "solid"},
                        marker={"color": _COLORS[i % len(_COLORS)], "size": 9,
                                "symbol": ["x" if lv.invalid else "circle" for lv in c.levels]},
                        hovertext=hover, hoverinfo="text+name")
    fig.update_xaxes(title_text="output tok/s, all streams (window)")
    fig.update_yaxes(title_text="tok/s per user (decode, median over requests)")
    fig.update_layout(title=title, template="plotly_white", height=460)
    return fig
