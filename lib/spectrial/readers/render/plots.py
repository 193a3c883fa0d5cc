"""Plotly figures of trial results (no I/O: each function takes data and returns a Figure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from spectrial.analysis.figures import base_ms_per_token, is_baseline, pick_baseline, verdict_cycle_ms
from spectrial.analysis.serving import COLOURS, LATENCY_PANELS, latency_curves
from spectrial.readers.context import ContextCurve
from spectrial.schema import ArmRecord, DecideRecord, RequestRecord


def _ok(arms: list[ArmRecord]) -> list[ArmRecord]:
    return [a for a in arms if a.measured]


def tok_s_figure(arms: list[ArmRecord], title: str = "Decode throughput per arm") -> go.Figure:
    """Median tok/s per arm with the interquartile range as error bars, each request as a dot."""
    arms = _ok(arms)
    names = [a.name for a in arms]
    med = [float(a.tok_s) for a in arms]  # type: ignore[arg-type]
    fig = go.Figure()
    fig.add_bar(x=names, y=med, name="median tok/s",
                error_y={"type": "data", "symmetric": False,
                         "array": [(a.tok_s_q3 or m) - m for a, m in zip(arms, med, strict=True)],
                         "arrayminus": [m - (a.tok_s_q1 or m) for a, m in zip(arms, med, strict=True)]},
                marker_color=["#7f7f7f" if is_baseline(a) else "#1f77b4" for a in arms],
                text=[f"{v:.1f}" for v in med], textposition="outside")
    for a in arms:
        vals = a.tok_s_values
        fig.add_scatter(x=[a.name] * len(vals), y=vals, mode="markers", showlegend=False,
                        marker={"color": "black", "size": 5, "opacity": 0.6}, name=f"{a.name} requests")
    fig.update_layout(title=title, yaxis_title="tokens / s (per request)", xaxis_title="arm",
                      template="plotly_white", height=420)
    return fig


def break_even_figure(arms: list[ArmRecord],
                      title: str = "Cycle cost vs tokens committed per cycle") -> go.Figure:
    """Left: cycle time per arm (on the verdict's clock, `figures.verdict_cycle_ms`) against the baseline time
    per token. Right: accept length (x) against break-even accept length (y = cycle / baseline token time);
    points below the diagonal pay, points above lose."""
    arms = _ok(arms)
    base = pick_baseline(arms)
    spec = [a for a in arms if not is_baseline(a) and verdict_cycle_ms(a)]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("cycle time (ms)", "break-even vs achieved accept length"))
    colour = {a.name: COLOURS[1 + i % (len(COLOURS) - 1)] for i, a in enumerate(spec)}  # grey: the baseline
    fig.add_bar(x=[a.name for a in spec], y=[verdict_cycle_ms(a) for a in spec], name="cycle ms", showlegend=False,
                marker_color=[colour[a.name] for a in spec], row=1, col=1)
    base_ms = base_ms_per_token(base) if base else None
    if base_ms:
        fig.add_hline(y=base_ms, line_dash="dash", line_color="#7f7f7f", row=1, col=1,
                      annotation_text=f"baseline {base_ms:.2f} ms/token")
    pts = [a for a in spec if a.accept_len and a.break_even_accept_len]
    hi = max([float(a.accept_len) for a in pts] + [float(a.break_even_accept_len) for a in pts] + [2.0]) * 1.1  # type: ignore[arg-type]
    fig.add_scatter(x=[1, hi], y=[1, hi], mode="lines", line={"dash": "dot", "color": "#d62728"},
                    name="break-even (accept len = cycle / baseline token)", row=1, col=2)
    for a in pts:  # one legend entry per arm, its name in the hover: labels beside close points would overlap
        fig.add_scatter(x=[a.accept_len], y=[a.break_even_accept_len], mode="markers", name=a.name,
                        marker={"size": 11, "color": colour[a.name], "line": {"color": "white", "width": 1}},
                        hovertemplate=f"{a.name}<br>accept length %{{x:.2f}}<br>break-even %{{y:.2f}}<extra></extra>",
                        row=1, col=2)
    fig.update_xaxes(title_text="arm", row=1, col=1)
    fig.update_xaxes(title_text="achieved accept length (tokens / cycle)", row=1, col=2)
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="break-even accept length", row=1, col=2)
    fig.update_layout(title=title, template="plotly_white", height=440)
    return fig


def decide_figure(decide: DecideRecord, title: str = "Speed-up and its confidence sequence, round by round"
                  ) -> go.Figure:
    """A decide run's looks: per speculative arm the estimated speed-up after each paired round with its
    confidence sequence (infinite until enough rounds: not drawn), the line at 1 and the equivalence margin."""
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
    fig = go.Figure()
    for i, arm in enumerate(decide.arms):
        colour = palette[i % len(palette)]
        looks = [x for x in arm.looks if x.get("estimate") is not None]
        rounds = [x["round"] for x in looks]
        fig.add_scatter(x=rounds, y=[round(x["estimate"], 4) for x in looks], mode="lines+markers", name=arm.arm,
                        legendgroup=arm.arm, line={"color": colour})
        bounded = [x for x in looks if x.get("low") is not None and x.get("high") is not None]
        if bounded:
            fig.add_scatter(x=[x["round"] for x in bounded], y=[round(x["high"], 4) for x in bounded], mode="lines",
                            line={"color": colour, "dash": "dot"}, name=f"{arm.arm}: {decide.level:.0%} sequence",
                            legendgroup=arm.arm)
            fig.add_scatter(x=[x["round"] for x in bounded], y=[round(x["low"], 4) for x in bounded], mode="lines",
                            line={"color": colour, "dash": "dot"}, showlegend=False, legendgroup=arm.arm)
    fig.add_hline(y=1.0, line_color="#555", annotation_text="the baseline")
    if decide.margin:
        for y in (1 + decide.margin, 1 / (1 + decide.margin)):
            fig.add_hline(y=round(y, 4), line_dash="dash", line_color="#aaa")
    fig.update_layout(title=title, xaxis_title="paired rounds (one start of every arm each)",
                      yaxis_title="speed-up (decode rate / baseline's)", template="plotly_white", height=420)
    return fig


def accept_len_figure(values: dict[str, list[float]], token_weighted: dict[str, float | None],
                      title: str = "Accept length per request") -> go.Figure:
    """Each request's accept length per arm (a box with every request as a point), the token-weighted figure of
    the counters as a diamond beside it."""
    fig = go.Figure()
    for name, vals in values.items():
        fig.add_box(y=vals, name=name, boxpoints="all", jitter=0.3, pointpos=0, showlegend=False)
        tw = token_weighted.get(name)
        if tw is not None:
            fig.add_scatter(x=[name], y=[tw], mode="markers", marker={"symbol": "diamond", "size": 12,
                                                                      "color": "black"},
                            name="token-weighted", showlegend=name == next(iter(values)))
    fig.update_layout(title=title, yaxis_title="accept length (tokens per verify step)", template="plotly_white")
    return fig

def latency_figure(by_arm: Mapping[str, Sequence[RequestRecord]], *,
                   expected_tokens_per_chunk: Mapping[str, float | None] | None = None,
                   title: str = "Latency distributions per arm") -> go.Figure:
    """Percentile curves (x: ms, y: percentile) of TTFT, TPOT, ITL per token and E2E latency, one colour per
    arm (`spectrial.analysis.serving.latency_curves`: a figure the arm's stream granularity makes meaningless is left out)."""
    fig = make_subplots(rows=1, cols=4, subplot_titles=LATENCY_PANELS, shared_yaxes=True, horizontal_spacing=0.04)
    colour = {name: COLOURS[i % len(COLOURS)] for i, name in enumerate(by_arm)}
    shown: set[str] = set()
    for c in latency_curves(by_arm, expected_tokens_per_chunk=expected_tokens_per_chunk):
        fig.add_scatter(x=c.x, y=c.y, mode="lines", name=c.arm, legendgroup=c.arm, showlegend=c.arm not in shown,
                        line={"color": colour[c.arm]}, row=1, col=LATENCY_PANELS.index(c.panel) + 1)
        shown.add(c.arm)
    for col, label in enumerate(LATENCY_PANELS, start=1):
        fig.update_xaxes(title_text=label, row=1, col=col)
    fig.update_yaxes(title_text="percentile (requests; tokens for ITL)", row=1, col=1)
    fig.update_layout(title=title, template="plotly_white", height=420, legend_title_text="arm")
    return fig


def nccl_latency_figure(summary: pd.DataFrame, title: str = "All-reduce latency per message size") -> go.Figure:
    """p50 latency (slowest rank per call) per size, one line per set (and group), p10-p90 as error bars;
    log-scale axes."""
    fig = go.Figure()
    mx = summary[summary["rank"] == "max"]
    for (set_name, group), sub in mx.groupby(["set", "group"], sort=False):
        sub = sub.sort_values("size_bytes")
        label = set_name if group == "default" else f"{set_name} ({group} group)"
        fig.add_trace(go.Scatter(
            x=sub["size_bytes"], y=sub["p50_us"], mode="lines+markers", name=label,
            error_y={"type": "data", "symmetric": False, "array": sub["p90_us"] - sub["p50_us"],
                     "arrayminus": sub["p50_us"] - sub["p10_us"]},
            text=sub["size"], hovertemplate="%{text}: p50 %{y:.1f} us<extra>" + label + "</extra>"))
    fig.update_xaxes(type="log", title="message size (bytes)")
    fig.update_yaxes(type="log", title="latency per call (us, slowest rank; bars p10-p90)")
    fig.update_layout(title=title, template="plotly_white", legend_title="environment set")
    return fig


def context_figure(curves: Sequence[ContextCurve], title: str = "Across context lengths") -> go.Figure:
    """Per speculative arm across its context buckets (spectrial.readers.context): accept length (tokens per verify
    step) and the speed-up over the baseline's same bucket with its interval, against the prompt tokens as sent."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("accept length (tokens per verify step)",
                                                        "speed-up (decode tok/s per request over the baseline's)"))
    for c in curves:
        x = [b.prompt_tokens or b.tokens for b in c.buckets]
        fig.add_trace(go.Scatter(x=x, y=[b.accept_len for b in c.buckets], mode="lines+markers", name=c.arm,
                                 legendgroup=c.arm, hovertext=[b.category for b in c.buckets]), row=1, col=1)
        up = [(b.ci[1] - b.speedup) if b.ci and b.speedup is not None else None for b in c.buckets]
        down = [(b.speedup - b.ci[0]) if b.ci and b.speedup is not None else None for b in c.buckets]
        fig.add_trace(go.Scatter(x=x, y=[b.speedup for b in c.buckets], mode="lines+markers", name=c.arm,
                                 legendgroup=c.arm, showlegend=False,
                                 error_y={"type": "data", "array": up, "arrayminus": down},
                                 hovertext=[f"{b.category}: {b.verdict}" for b in c.buckets]), row=1, col=2)
        if c.collapses_at is not None:
            fig.add_vline(x=next(b.prompt_tokens or b.tokens for b in c.buckets if b.tokens == c.collapses_at),
                          line_dash="dot", row=1, col=1)
    fig.add_hline(y=1.0, line_dash="dash", row=1, col=2)
    fig.update_xaxes(type="log", title_text="prompt tokens (mean as sent)")
    fig.update_layout(title=title, height=380)
    return fig
