"""Rendering of the readers' analysis: plotly figures (`figures`: explain's and the history's, and showing them;
`plots`: a run's arms, decide rounds, accept lengths, serving latency curves, NCCL latency; `sweep`: a sweep's
heatmap, curves and predictions), and the HTML report (`report`). Nothing here computes a number the analysis does
not already hold; nothing below the readers imports it."""
