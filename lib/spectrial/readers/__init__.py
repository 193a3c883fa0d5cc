"""The readers wing: what reads finished records and says what they mean (nothing below imports it).

Analysis (numbers and prose sections; no plotly, IPython or nbformat):
`explain` (break-even, cycle-cost model, acceptance needed, roofline), `headline` (the answer per arm),
`history` (records and logs as one table), `casestudy`, `diff` (two runs' findings), `drift` (this baseline
against earlier ones).
Rendering (plotly figures, notebook display, the HTML report): `render` (figures of `explain`, show a
figure), `plots`, `nccl`, `sweep`, `report`.
The doctor (`spectrial.diagnose`) is a reader too, in its own package.
"""
