# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Which speculative setting is fastest here, found with few restarts
#
# Every speculative setting (draft depth, tree top-k, draft tokens) needs its own server start, and a large
# model takes minutes to load. A full grid restarts once per setting; this notebook can do that
# (`strategy = "grid"`) or search the grid with a model (`strategy = "guided"`):
#
# 1. **baseline**: the server without speculation, once per host fingerprint, every concurrency level;
# 2. **probes**: one setting per acceptance scenario, since one cycle-cost model serves them all (a cycle
#    drafts k tokens and verifies k + 1: its cost follows k, not the acceptance). The real draft's deepest
#    setting first (its per-position acceptance gives the whole curve), then a second depth for the cycle
#    model where acceptance is lowest, then for each synthetic rate a the depth predicted best with a^i as
#    its acceptance. Each server start measures every concurrency level in turn (the concurrency level is
#    only how many requests the client sends at once: it needs no restart);
# 3. **model**: the cycle-cost model `cycle_ms(k) = fixed + per_draft x k` per concurrency level, the
#    acceptance curve per scenario (from per-position acceptance where the engine reports it) and a level
#    offset per scenario predict the tok/s of every setting not measured yet;
# 4. **confirm**: measure the setting that, at the top of its predicted range (the model's own error, from
#    leave-one-out predictions), would hold the best measured tok/s below its CI, then the model's predicted
#    best if unmeasured; refit; stop when nothing left could change the answer beyond the noise (the issue's
#    yardstick: within the best's CI), or the budget ends.
#
# The same code runs from the shell: `spectrial sweep params/sweep-local.yaml -p strategy=grid`.

# %% tags=["parameters"]
params_file = "params/sweep-local.yaml"  # host, engine, models, grid, strategy, budget
strategy = None  # "grid" (every point) or "guided" (model-guided); None: as in the params file
steps = None  # grid of draft depths, e.g. [1, 2, 3, 4, 6]; None: as in the params file
concurrency = None  # grid of concurrency levels (batch sizes), e.g. [1, 2]
synthetic_accept = None  # grid of synthetic per-token acceptance rates (llama.cpp), e.g. [0.6, 0.9]
repeats = None  # measured requests per concurrency level and server start
restarts = None  # server starts per setting
max_tokens = None  # generated tokens per request
budget_s = None  # wall-clock budget in seconds
budget_restarts = None  # most server starts (the baseline's included)
overrides = {}  # any other parameter, dotted: {"engine_config.threads": 1, "grid.topk": [1]}
run_id = None  # run record id (None: generated)
output_dir = None  # folder of run records (None: as in the params file)
progress = True  # progress bars while servers load and requests run

# %%
from IPython.display import Markdown, display

from spectrial.cli.notebooks import attach_notebook, steps_table
from spectrial.readers import sweep as sweep_reader
from spectrial.readers.render import sweep as sweep_figures
from spectrial.readers.render.figures import show_figure
from spectrial.sweep import load_sweep_params, run_sweep

values = {"strategy": strategy, "grid.steps": steps, "grid.concurrency": concurrency,
          "grid.synthetic_accept": synthetic_accept, "repeats": repeats, "restarts": restarts,
          "max_tokens": max_tokens, "budget_s": budget_s, "budget_restarts": budget_restarts,
          "output_dir": output_dir}
sweep = load_sweep_params(params_file, {**{k: v for k, v in values.items() if v is not None}, **overrides})
t = sweep.trial
display(Markdown(
    f"**Sweep** `{t.name}` ({sweep.strategy}) on host `{t.host}` with engine `{t.engine}`, model `{t.model}`, "
    f"method `{sweep.method}`: {len(sweep.settings())} settings x concurrency {sweep.concurrency_levels()}, "
    f"{t.repeats} requests x {t.max_tokens} tokens per level and start, {t.restarts} start(s) per setting. "
    f"A full grid takes {(len(sweep.settings()) + 1) * t.restarts} server starts; budget: "
    f"{sweep.budget_restarts or 'no'} start limit, {sweep.budget_s or 'no'} s."))

# %% [markdown]
# ## Run the sweep
# One call measures, fits and decides; the run record (`manifest.json`) is rewritten after every step, so an
# interrupted sweep still says what it measured and why it stopped. No server is left running.

# %%
result = run_sweep(sweep, run_id=run_id, progress=progress)
print(f"run record: {result.run_dir}/manifest.json")

# %% [markdown]
# ## Server starts, in launch order
# Each start is one setting; its windows are the concurrency levels it measured (median tok/s per stream).
# `phase` says why the start happened: baseline, probe, confirm (guided) or grid.

# %%
result.starts()

# %%
steps_table(result.manifest).groupby("ok").size().rename("protocol steps by outcome")

# %% [markdown]
# ## Why each setting was measured
# The guided search's decisions in order: the probes (and why each one), then each setting whose prediction
# could beat the best measured one beyond the noise (with the prediction that chose it), then why it stopped.
# Below, every setting not measured: why (not needed, or the budget: then the sweep is `partial`), the
# final model's prediction per concurrency level with its range, and whether it could beat the best there.

# %%
dec = result.decisions()
display(dec[[c for c in ("phase", "setting", "reason") if c in dec.columns]])
b = result.manifest.budget
print("stopped by:", (b.stopped_by if b else None) or "the plan was done")
print(f"status: {result.status}" + (f" ({result.manifest.reason})" if result.status == "partial" else ""))
result.not_measured()

# %% [markdown]
# ## Every grid point
# `tok_s` is the median over requests of the server's per-request decode rate (per stream), with its bootstrap
# CI; `cycle_ms` = decode time / verify steps; `break_even_accept_len` = cycle time / the baseline's time per
# token at the same concurrency. `predicted_tok_s` is what the model said *before* the point was measured
# (guided); `final_predicted_tok_s` is the final model's value for every point, measured or not.

# %%
result.points().round(3)

# %%
show_figure(sweep_figures.heatmap_figure(result.manifest))

# %%
show_figure(sweep_figures.curves_figure(result.manifest))

# %% [markdown]
# ## The model against the measurements
# Left: accept length against depth; right: cycle time. Markers are measured, dotted lines the fitted model.
# Below: each prediction made before measuring, against the measurement.

# %%
show_figure(sweep_figures.components_figure(result.manifest))

# %%
show_figure(sweep_figures.prediction_figure(result.manifest))

# %% [markdown]
# ## Best setting per scenario and concurrency
# The best measured setting with its CI, against the baseline and against the runner-up (ratio of medians with
# its CI at `confirm_level`): "confirmed" when the CI excludes 1, "tied" when the two cannot be told apart.
# Never "confirmed" while a setting left unmeasured could beat it (`could_beat` names them: a partial sweep).

# %%
result.best().round(3)

# %% [markdown]
# ## Verdict

# %%
display(Markdown(sweep_reader.verdict(result.manifest)))

# %%
attach_notebook(result.run_dir)
print(f"status: {result.status}; record: {result.run_dir}")
