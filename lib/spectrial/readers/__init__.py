"""The readers wing: what reads finished records and says what they mean (nothing of the protocol imports it).

Analysis (numbers and prose sections; no plotly, IPython or nbformat): `headline` (the answer per arm), `explain`
(break-even, cycle-cost model, acceptance needed, roofline), `history` (records and logs as one table),
`casestudy`, `diff` (two runs' findings), `sweep` (a sweep's points and verdict), `nccl` (an NCCL check's tables).
Rendering, in `spectrial.readers.render` (plotly figures, notebook display, the HTML report): `figures` (explain's
and the history's, and showing them), `plots`, `sweep`, `report`.
The doctor (`spectrial.readers.diagnose`) is a reader too, in its own package. A baseline's drift against earlier runs is
measured by the protocol (`spectrial.protocol.drift`) and written into the record; the readers show it.
"""
