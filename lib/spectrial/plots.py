"""Plotly figures of trial results (no I/O: each function takes data and returns a Figure)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots


def _ok(arms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in arms if a.get("status") == "ok" and a.get("tok_s")]


def tok_s_figure(arms: list[dict[str, Any]], title: str = "Decode throughput per arm") -> go.Figure:
    """Median tok/s per arm with the interquartile range as error bars, each request as a dot."""
    arms = _ok(arms)
    names = [a["name"] for a in arms]
    med = [a["tok_s"] for a in arms]
    fig = go.Figure()
    fig.add_bar(x=names, y=med, name="median tok/s",
                error_y={"type": "data", "symmetric": False,
                         "array": [(a.get("tok_s_q3") or a["tok_s"]) - a["tok_s"] for a in arms],
                         "arrayminus": [a["tok_s"] - (a.get("tok_s_q1") or a["tok_s"]) for a in arms]},
                marker_color=["#7f7f7f" if a.get("method") == "none" else "#1f77b4" for a in arms],
                text=[f"{v:.1f}" for v in med], textposition="outside")
    for a in arms:
        vals = a.get("tok_s_values") or []
        fig.add_scatter(x=[a["name"]] * len(vals), y=vals, mode="markers", showlegend=False,
                        marker={"color": "black", "size": 5, "opacity": 0.6}, name=f"{a['name']} requests")
    fig.update_layout(title=title, yaxis_title="tokens / s (per request)", xaxis_title="arm",
                      template="plotly_white", height=420)
    return fig


def break_even_figure(arms: list[dict[str, Any]],
                      title: str = "Cycle cost vs tokens committed per cycle") -> go.Figure:
    """Left: cycle time per arm against the baseline time per token.
    Right: accept length (x) against break-even accept length (y = cycle / baseline token time);
    points below the diagonal pay, points above lose."""
    arms = _ok(arms)
    base = next((a for a in arms if a.get("method") == "none"), None)
    spec = [a for a in arms if a.get("method") != "none" and a.get("cycle_ms")]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("cycle time (ms)", "break-even vs achieved accept length"))
    fig.add_bar(x=[a["name"] for a in spec], y=[a["cycle_ms"] for a in spec], name="cycle ms",
                marker_color="#1f77b4", row=1, col=1)
    if base and base.get("ms_per_token"):
        fig.add_hline(y=base["ms_per_token"], line_dash="dash", line_color="#7f7f7f", row=1, col=1,
                      annotation_text=f"baseline {base['ms_per_token']:.2f} ms/token")
    pts = [a for a in spec if a.get("accept_len") and a.get("break_even_accept_len")]
    hi = max([a["accept_len"] for a in pts] + [a["break_even_accept_len"] for a in pts] + [2.0]) * 1.1
    fig.add_scatter(x=[1, hi], y=[1, hi], mode="lines", line={"dash": "dot", "color": "#d62728"},
                    name="break-even (accept len = cycle / baseline token)", row=1, col=2)
    fig.add_scatter(x=[a["accept_len"] for a in pts], y=[a["break_even_accept_len"] for a in pts],
                    mode="markers+text", text=[a["name"] for a in pts], textposition="top center",
                    marker={"size": 11, "color": "#1f77b4"}, name="arms", row=1, col=2)
    fig.update_xaxes(title_text="arm", row=1, col=1)
    fig.update_xaxes(title_text="achieved accept length (tokens / cycle)", row=1, col=2)
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="break-even accept length", row=1, col=2)
    fig.update_layout(title=title, template="plotly_white", height=440)
    return fig
