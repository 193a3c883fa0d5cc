"""Plotly figures and the verdict paragraph of a sweep record (no I/O: manifest in, Figure or text out)."""

from __future__ import annotations

import math
import statistics

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from spectrial.schema import Manifest, PointRecord

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def _scen_label(s: float | None) -> str:
    return "real acceptance" if s is None else f"synthetic a={s:g}"


def _spec(manifest: Manifest) -> list[PointRecord]:
    return [p for p in manifest.points if p.get("method") != "none"]


def _baselines(manifest: Manifest) -> dict[int, PointRecord]:
    """The first measured baseline point per concurrency level."""
    out: dict[int, PointRecord] = {}
    for p in manifest.points:
        if p.get("method") == "none" and p.get("status") == "ok":
            out.setdefault(p.concurrency, p)
    return out


def _setting_label(p: PointRecord) -> str:
    label = f"s{p.steps}"
    if p.topk not in (None, 1):
        label += f" t{p.topk} n{p.draft_tokens}"
    return label


def heatmap_figure(manifest: Manifest, value: str = "tok_s",
                   title: str = "Measured tok/s per setting and concurrency") -> go.Figure:
    """Setting (x) by concurrency (y), one panel per scenario; unmeasured cells are blank, the text shows the CI."""
    spec = _spec(manifest)
    scenarios = list(dict.fromkeys(p.scenario for p in spec))
    levels = sorted({p.concurrency for p in spec})
    fig = make_subplots(rows=max(len(scenarios), 1), cols=1, subplot_titles=[_scen_label(s) for s in scenarios],
                        vertical_spacing=0.18 if len(scenarios) > 1 else 0.1)
    for i, sc in enumerate(scenarios, 1):
        mine = [p for p in spec if p.scenario == sc]
        xs = list(dict.fromkeys(_setting_label(p) for p in sorted(mine, key=lambda p: (p.k, p.steps))))
        z, text = [], []
        for c in levels:
            row_z, row_t = [], []
            for x in xs:
                p = next((q for q in mine if q.concurrency == c and _setting_label(q) == x), None)
                v = p.get(value) if p and p.get("status") == "ok" else None
                row_z.append(v if v is not None else math.nan)
                if v is None and p is not None and p.get("status") == "not measured" and p.get("final_prediction"):
                    row_t.append(f"not measured<br>(predicted {p.final_prediction['tok_s']:.1f})"
                                 if value == "tok_s" else "not measured")
                elif v is None:
                    row_t.append("not measured" if not p or p.get("status") == "not measured" else "failed")
                elif value == "tok_s" and p.get("tok_s_ci_low") is not None:
                    row_t.append(f"{v:.1f}<br>[{p.tok_s_ci_low:.1f}, {p.tok_s_ci_high:.1f}]")
                else:
                    row_t.append(f"{v:.3g}")
            z.append(row_z)
            text.append(row_t)
        fig.add_trace(go.Heatmap(z=z, x=xs, y=[f"c={c}" for c in levels], text=text, texttemplate="%{text}",
                                 colorscale="Viridis", showscale=i == 1, colorbar={"title": value},
                                 hovertemplate="%{x} %{y}: %{text}<extra></extra>"), row=i, col=1)
    fig.update_layout(title=title, template="plotly_white", height=260 + 200 * max(len(scenarios), 1))
    return fig


def curves_figure(manifest: Manifest, title: str = "tok/s against draft depth") -> go.Figure:
    """Per scenario: measured tok/s (median, CI error bars) and the model's prediction against depth,
    one colour per concurrency level, the baseline as a dashed line of the same colour."""
    spec = _spec(manifest)
    scenarios = list(dict.fromkeys(p.scenario for p in spec))
    levels = sorted({p.concurrency for p in spec})
    base = _baselines(manifest)
    fig = make_subplots(rows=1, cols=max(len(scenarios), 1), subplot_titles=[_scen_label(s) for s in scenarios],
                        shared_yaxes=True)
    for i, sc in enumerate(scenarios, 1):
        for j, c in enumerate(levels):
            color = _COLORS[j % len(_COLORS)]
            mine = sorted((p for p in spec if p.scenario == sc and p.concurrency == c),
                          key=lambda p: (p.k, p.steps))
            ok = [p for p in mine if p.get("status") == "ok"]
            fig.add_scatter(x=[p.steps for p in ok], y=[p.tok_s for p in ok], mode="markers+lines",
                            name=f"measured c={c}", legendgroup=f"c{c}", showlegend=i == 1,
                            marker={"color": color, "size": 9}, line={"color": color, "width": 1},
                            error_y={"type": "data", "symmetric": False,
                                     "array": [(p.get("tok_s_ci_high") or p.tok_s) - p.tok_s for p in ok],
                                     "arrayminus": [p.tok_s - (p.get("tok_s_ci_low") or p.tok_s) for p in ok]},
                            row=1, col=i)
            pred = [p for p in mine if p.get("final_prediction")]
            if pred:
                fig.add_scatter(x=[p.steps for p in pred], y=[p.final_prediction["tok_s"] for p in pred],
                                mode="lines", name=f"model c={c}", legendgroup=f"c{c}", showlegend=i == 1,
                                line={"color": color, "dash": "dot"}, row=1, col=i)
            if c in base:
                fig.add_hline(y=base[c].tok_s, line_dash="dash", line_color=color, row=1, col=i,
                              annotation_text=f"baseline c={c}" if i == 1 else None)
        fig.update_xaxes(title_text="draft depth (steps)", row=1, col=i)
    fig.update_yaxes(title_text="tok/s per stream (median, CI)", row=1, col=1)
    fig.update_layout(title=title, template="plotly_white", height=460)
    return fig


def components_figure(manifest: Manifest, title: str = "Accept length and cycle time against depth"
                      ) -> go.Figure:
    """Left: accept length measured (markers) and modelled (dotted); right: cycle time, same encoding."""
    spec = _spec(manifest)
    levels = sorted({p.concurrency for p in spec})
    scenarios = list(dict.fromkeys(p.scenario for p in spec))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("accept length (tokens / cycle)", "cycle time (ms)"))
    for j, (sc, c) in enumerate((s, c) for s in scenarios for c in levels):
        color = _COLORS[j % len(_COLORS)]
        name = f"{_scen_label(sc)}, c={c}"
        mine = sorted((p for p in spec if p.scenario == sc and p.concurrency == c), key=lambda p: p.steps)
        ok = [p for p in mine if p.get("status") == "ok"]
        pred = [p for p in mine if p.get("final_prediction")]
        for col, key in ((1, "accept_len"), (2, "cycle_ms")):
            fig.add_scatter(x=[p.steps for p in ok], y=[p.get(key) for p in ok], mode="markers", name=name,
                            legendgroup=name, showlegend=col == 1, marker={"color": color, "size": 8}, row=1, col=col)
            if pred:
                fig.add_scatter(x=[p.steps for p in pred], y=[p.final_prediction[key] for p in pred],
                                mode="lines", line={"color": color, "dash": "dot"}, legendgroup=name,
                                showlegend=False, row=1, col=col)
    fig.update_xaxes(title_text="draft depth (steps)")
    fig.update_layout(title=title, template="plotly_white", height=420)
    return fig


def prediction_figure(manifest: Manifest, title: str = "Predicted before measuring vs measured"
                      ) -> go.Figure:
    """Each point measured after a prediction: the prediction (x) against the measurement (y, with CI)."""
    pts = [p for p in _spec(manifest) if p.get("prediction") and p.get("status") == "ok"]
    fig = go.Figure()
    if pts:
        xs = [p.prediction["tok_s"] for p in pts]
        ys = [p.tok_s for p in pts]
        lo, hi = min(xs + ys) * 0.9, max(xs + ys) * 1.1
        fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", line={"dash": "dot", "color": "#7f7f7f"},
                        name="prediction = measurement")
        fig.add_scatter(x=xs, y=ys, mode="markers+text", text=[f"{_setting_label(p)} c={p.concurrency}"
                                                               for p in pts],
                        textposition="top center", marker={"size": 10, "color": "#1f77b4"}, name="points",
                        error_y={"type": "data", "symmetric": False,
                                 "array": [(p.get("tok_s_ci_high") or p.tok_s) - p.tok_s for p in pts],
                                 "arrayminus": [p.tok_s - (p.get("tok_s_ci_low") or p.tok_s) for p in pts]})
    else:
        fig.add_annotation(text="no point was measured after a prediction (grid strategy, or the probes sufficed)",
                           showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(title=title, xaxis_title="predicted tok/s", yaxis_title="measured tok/s (median, CI)",
                      template="plotly_white", height=420)
    return fig


def _f(x: float | None, nd: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def verdict(manifest: Manifest) -> str:
    """A paragraph computed from the record: cost of the sweep, baseline, best per scenario and concurrency."""
    from spectrial.sweep.result import partial_reason

    b = manifest.get("budget") or {}
    parts = [f"The {manifest.get('strategy')} sweep used {b.get('restarts')} server starts (a full grid needs "
             f"{b.get('grid_restarts')}) and {_f(b.get('wall_s'), 0)} s; it measured {b.get('settings_measured')} of "
             f"{b.get('settings')} settings and stopped because: {b.get('stopped_by') or 'the plan was done'}."]
    partial = partial_reason(manifest)
    if partial:
        parts.insert(0, f"**Partial sweep**: {partial}.")
    for c, base in sorted(_baselines(manifest).items()):
        parts.append(f"At concurrency {c} the baseline decoded {_f(base.get('tok_s'))} tok/s per stream.")
    for row in manifest.get("best") or []:
        where = f"{_scen_label(row['scenario'])}, concurrency {row['concurrency']}"
        if not row.get("best"):
            parts.append(f"{where}: no setting measured.")
            continue
        s = (f"{where}: best **{row['best']}** at {_f(row['tok_s'])} tok/s "
             f"[{_f(row.get('tok_s_ci_low'))}, {_f(row.get('tok_s_ci_high'))}]")
        if row.get("speedup") is not None:
            s += f", {_f(row['speedup'], 2)}x the baseline ({row.get('vs_baseline') or 'no CI'})"
        s += f"; {row.get('verdict')}"
        if row.get("ratio_to_runner_up") is not None:
            s += (f" (ratio to {row['runner_up']} {_f(row['ratio_to_runner_up'], 3)} "
                  f"[{_f(row['ratio_ci_low'], 3)}, {_f(row['ratio_ci_high'], 3)}])")
        parts.append(s + ".")
    err = (manifest.get("model") or {}).get("in_sample_rel_error") or {}
    preds = [p for p in _spec(manifest) if p.get("prediction_error") is not None]
    if preds:
        e = [abs(p.prediction_error) for p in preds]
        parts.append(f"Predictions made before measuring were off by {statistics.median(e) * 100:.1f} % (median) "
                     f"and {max(e) * 100:.1f} % at worst over {len(e)} point(s).")
    elif err.get("median_abs") is not None:
        parts.append(f"The fitted model reproduces the measured points within {err['median_abs'] * 100:.1f} % "
                     f"(median; worst {err['max_abs'] * 100:.1f} %).")
    return " ".join(parts)
