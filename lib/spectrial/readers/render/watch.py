"""The plotly figure of a watch: accept length and tok/s per interval over time, the changes found (dashed lines
with before -> after) and the gaps (shaded) and restarts (dotted) marked."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from spectrial.schema import WatchRecord

_SERIES = (("accept_len", "accept length", "#1f77b4"), ("tok_s", "generation tok/s", "#ff7f0e"))


def watch_figure(watch: WatchRecord, title: str = "watch") -> go.Figure:
    """Two panels sharing the time axis (seconds since the watch started, at each interval's end)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[label for _, label, _ in _SERIES])
    for row, (key, label, color) in enumerate(_SERIES, start=1):
        pts = [iv for iv in watch.intervals if getattr(iv, key) is not None]
        fig.add_trace(go.Scatter(x=[iv.end_s for iv in pts], y=[getattr(iv, key) for iv in pts], mode="lines+markers",
                                 name=label, line={"color": color},
                                 customdata=[[iv.index, iv.end, iv.requests_running, iv.requests_waiting] for iv in pts],
                                 hovertemplate="interval %{customdata[0]} (%{customdata[1]})<br>" + label
                                 + " %{y:.3f}<br>running %{customdata[2]}, waiting %{customdata[3]}<extra></extra>"),
                      row=row, col=1)
        for c in watch.changes:
            if c.series == key:
                fig.add_vline(x=c.at_s, line={"dash": "dash", "color": "#d62728"}, row=row, col=1,  # type: ignore[arg-type]
                              annotation_text=f"{c.before_mean:.3g} -> {c.after_mean:.3g} ({c.relative_change:+.0%})",
                              annotation_position="top left")
        for g in watch.gaps:
            end = g.end_s if g.end_s is not None else max([iv.end_s for iv in watch.intervals] or [g.start_s])
            fig.add_vrect(x0=g.start_s, x1=end, fillcolor="#7f7f7f", opacity=0.25, line_width=0, row=row, col=1,  # type: ignore[arg-type]
                          annotation_text="no answer" if row == 1 else None, annotation_position="top left")
        for iv in watch.intervals:
            if iv.reset:
                fig.add_vline(x=iv.end_s, line={"dash": "dot", "color": "#2ca02c"}, row=row, col=1,  # type: ignore[arg-type]
                              annotation_text="restart" if row == 1 else None)
    fig.update_xaxes(title_text="seconds since the watch started", row=2, col=1)
    fig.update_layout(title=title, height=620, showlegend=False, template="plotly_white")
    return fig
