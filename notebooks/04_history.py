# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · History: every run, one table
#
# The original investigation compared numbers from different server starts, mined old logs with `grep`
# and kept its matrix of results by hand. This notebook reads **every run record** under `runs_dir`
# (and, optionally, a folder of plain server logs through spectrial's log parsers) into one tidy table,
# one row per arm, and builds the views that engineer built by hand:
#
# 1. what could not be read, or looks wrong (damaged records, skipped and named; failed runs and arms, zero verify
#    steps, accept length < 1);
# 2. the tidy table;
# 3. the matrix views: throughput, cycle time and break-even per host, engine version, session and NCCL
#    state (rows) and arm configuration (columns);
# 4. the baseline over time, per host — the number that drifted unnoticed in the original case;
# 5. plain logs, whose launch conditions are unknown: shown apart, never mixed into the matrices.
#
# Defaults read the committed example records only (`outputs/examples`), so this notebook's outputs
# are reproducible (`make test` re-executes it with nbval). Point `runs_dir` at `outputs` for your own runs.

# %% tags=["parameters"]
runs_dir = "outputs/examples"  # folder of run records (searched recursively for manifest.json)
logs_dir = None  # optional folder of plain server logs (SGLang, vLLM, llama.cpp, profile lines ...)

# %%
import pandas as pd
from IPython.display import Markdown, display

from spectrial.readers import history
from spectrial.readers.render.figures import baseline_figure, matrix_figure, show_figure

pd.set_option("display.max_columns", None)
pd.set_option("display.width", 200)
h = history.load_history(runs_dir, logs_dir)
for skip in h.skipped:  # a damaged record (truncated, binary, a future schema, ...) is left out and left as it is
    print(f"[spectrial] {skip.line()}")
rec = h.records
display(Markdown(f"Read **{rec['run'].nunique()} run record(s)** with {len(rec)} arm(s) from `{runs_dir}`"
                 + (f" and **{(h.table['source'] == 'log').sum()} parseable log file(s)** from `{logs_dir}`"
                    if logs_dir is not None else "") + "."))

# %% [markdown]
# ## 1 · Problems in the input
# Each line is a run, arm or file that could not be used, or whose numbers cannot be right. They stay in
# the table below (with their status) but drop out of the matrices.

# %%
if h.issues.empty:
    display(Markdown("No problem found: every record is readable and every arm completed with plausible counters."))
else:
    display(Markdown(f"**{len(h.issues)} problem(s) found:**"))
    display(h.issues)

# %% [markdown]
# ## 2 · The tidy table
# One row per arm. `derived` names the figures computed from others (e.g. a hand-measured record's cycle
# time = verify time / verify share); `baseline_arm` is the baseline of the same session and NCCL state
# against which `break_even_accept_len` and `speedup` were computed (empty: none in that session).

# %%
cols = ["run", "session", "host", "engine_version", "arm", "config", "status", "nccl_env", "tok_s", "n_values",
        "cycle_ms", "accept_len", "break_even_accept_len", "speedup", "baseline_arm"]
display(rec[cols].round(3) if len(rec) else Markdown("No run record to show."))

# %% [markdown]
# ## 3 · Matrix views
# Rows: host · engine version · session · NCCL state ("set, verified" only where spectrial checked the
# variables in every server process); columns: arm configuration. A row is one session: compare across a
# row, not down a column — a column mixes server starts and system states.

# %%
tok = history.matrix(h.table, "tok_s")
if tok.empty:
    display(Markdown("No completed arm with a throughput: no matrix to show."))
else:
    display(tok.round(2))
    show_figure(matrix_figure(tok, "Throughput (tok/s) by session and configuration"))

# %% [markdown]
# Cycle time (ms per speculative cycle; for baselines, ms per token) and the break-even accept length
# (cycle time / baseline ms per token: a speculative configuration pays only above it).

# %%
for values, title in (("cycle_ms", "cycle time, ms"), ("break_even_accept_len", "break-even accept length")):
    m = history.matrix(h.table, values)
    display(Markdown(f"**{title}**"))
    display(m.round(3) if not m.empty else Markdown(f"No arm has a {title}."))

# %% [markdown]
# ## 4 · Baseline over time, per host
# Completed baseline arms in time order (records without a date last, in their recorded order);
# `change_pct` compares each with the previous baseline of the same host and NCCL state. A change of
# several percent between sessions is exactly what made the original case's comparisons meaningless.

# %%
base = history.baseline_over_time(h.table)
if base.empty:
    display(Markdown("No completed baseline arm."))
else:
    display(base.round(2))
    show_figure(baseline_figure(h.table))

# %% [markdown]
# ## 5 · Plain logs
# Log files are summarised (medians over each file) by `spectrial.logs`; their launch conditions are
# unknown (`nccl_env` "unrecorded"), so they stay out of the matrices above.

# %%
if logs_dir is None:
    display(Markdown("No `logs_dir` given: pass a folder of server logs to include them."))
else:
    logs = h.table[h.table["source"] == "log"]
    if logs.empty:
        display(Markdown(f"Nothing parseable in `{logs_dir}` (see the problems above)."))
    else:
        display(logs[["run", "engine", "started_at", "tok_s", "accept_len", "accept_rate", "verify_ms"]].round(3))
        display(h.log_summary.round(3))
