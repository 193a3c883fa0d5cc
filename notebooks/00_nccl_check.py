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
# # 00 · NCCL tuning: did the variables reach the workers, and do they help decode-size all-reduces?
#
# In the original case six NCCL variables (`NCCL_PROTO=LL NCCL_ALGO=Ring NCCL_P2P_LEVEL=SYS
# NCCL_MAX_NCHANNELS=16 NCCL_BUFFSIZE=16777216 NCCL_NTHREADS=512`) were credited with moving a TP8 baseline
# from ~63 to ~82-89 tok/s, and hours went into finding out whether they reached the spawned workers.
# Tensor-parallel decode does one small all-reduce per layer (a few KB to a few hundred KB per token), so
# latency, not bandwidth, decides.
#
# This notebook settles both questions on the host it runs on. For every **environment set** it starts one
# process per GPU with multiprocessing *spawn* (as SGLang does), and every worker:
#
# 1. records which requested variables it sees in its `os.environ` and in `/proc/<pid>/environ`,
# 2. keeps NCCL's own debug output (`NCCL_DEBUG=INFO`), whose `NCCL_X set by environment to V`, channel and
#    tuning lines are the only proof of what NCCL used,
# 3. times all-reduces at decode message sizes and one bandwidth size.
#
# A set's variables can be put on the workers' launch (`launch`), assigned in the worker before the first
# communicator (`in_worker`: used by NCCL, invisible in `/proc`), or after it (`after_init`: only a new
# group sees them). With `backend: gloo` the same code runs on CPU: no NCCL, but the visibility checks hold.
#
# The same code runs from the shell: `spectrial nccl-check params/nccl-check-cpu.yaml`.

# %% tags=["parameters"]
params_file = "params/nccl-check-cpu.yaml"  # backend, environment sets, sizes (GPU: params/nccl-check-h200x2.yaml)
overrides = {}  # any other parameter, dotted: {"rounds": 3, "env_sets.tuned.NCCL_PROTO": "Simple"}
run_id = None  # run record id (None: generated)
output_dir = None  # folder of run records (None: as in the params file)

# %%
import pandas as pd
from IPython.display import Markdown, display

from spectrial.cli.notebooks import attach_notebook, steps_table
from spectrial.nccl import load_nccl_params, run_nccl_check
from spectrial.nccl.latency import human_bytes
from spectrial.readers import nccl as nccl_tables
from spectrial.readers.render.figures import show_figure
from spectrial.readers.render.plots import nccl_latency_figure

params = load_nccl_params(params_file, {**({"output_dir": output_dir} if output_dir else {}), **overrides})
sizes = ", ".join(f"{human_bytes(s)} ({role})" for s, role in params.sizes())
display(Markdown(
    f"**Check** `{params.name}`: backend `{params.backend}`, {params.world_size or 'all GPUs'} ranks, "
    f"{params.rounds} round(s) of fresh workers per set, {params.iters} timed calls per size after "
    f"{params.warmup} warm-up; sizes {sizes}; sets: "
    + ", ".join(f"`{n}` ({s.how}, {len(s.env)} variables)" for n, s in params.env_sets.items())
    + f"; baseline `{params.baseline}`."))

# %% [markdown]
# ## Run every set
# One call spawns the workers set by set (the order rotates between rounds, so no set always starts
# first) and writes the run record as it goes: `manifest.json`, `latency.csv` (every timed call),
# `summary.csv` and `nccl.log` (every rank's output).

# %%
result = run_nccl_check(params, run_id=run_id)
print(f"run record: {result.run_dir}/manifest.json (status {result.status})")
steps_table(result.manifest)

# %% [markdown]
# ## 1. Did the variables reach every worker?
# Per set and worker (rank, pid): how many requested variables were in its `os.environ` (what NCCL reads
# through `getenv`) and in `/proc/<pid>/environ` (what `ps e` and a check from outside see), and which were
# missing. `missing` is the failure that matters; `not_in_proc` alone is what `in_worker` and `after_init`
# sets look like. On NCCL runs the requested variables include the multicast-off and debug variables that
# spectrial adds to every launch.

# %%
vis = nccl_tables.visibility_table(result.manifest)
vis

# %%
missing = vis[vis["missing"] != ""]
if missing.empty:
    display(Markdown("Every worker had every requested variable in its `os.environ`."))
else:
    display(Markdown("**Missing variables:** " + "; ".join(
        f"set `{r.set}` rank {r.rank} (pid {r.pid}): {r.missing}" for r in missing.itertuples())))

# %% [markdown]
# ## 2. What NCCL says it used
# From each rank's NCCL debug output: the variables NCCL reports `set by environment`, ranks and nodes,
# channel counts, transports and (with `NCCL_DEBUG_SUBSYS=TUNING`) the algorithm/protocol pairs its tuning
# table enables. Per communicator phase: `first_communicator` (the default group), `new_group` (an
# `after_init` set's second group). Empty on gloo: there is no NCCL output to read.

# %%
settings = nccl_tables.settings_table(result.manifest)
if settings.empty:
    display(Markdown(f"No NCCL output on `{params.backend}`: what NCCL would use cannot be told here."))
settings if not settings.empty else None

# %% [markdown]
# ## 3. Latency per message size
# Each call is timed with a device sync (CPU: wall clock) after the ranks are aligned; a collective's
# latency is its slowest rank's, so the table and the figure use the maximum over ranks of each call.
# Percentiles pool the rounds.

# %%
summary = result.summary()
summary[["set", "group", "size", "role", "n", "p10_us", "p50_us", "p90_us", "p99_us"]].round(1)

# %%
show_figure(nccl_latency_figure(result.summary()))

# %% [markdown]
# ## 4. Versus the baseline, per size
# `ratio` = median of the set / median of the baseline (below 1: faster), with a bootstrap interval that
# resamples rounds (worker starts), then calls; `same` means the interval includes 1.

# %%
cmp = result.comparisons()
cmp.round(3) if not cmp.empty else pd.DataFrame({"note": ["only one set: nothing to compare"]})

# %% [markdown]
# ## Verdict

# %%
display(Markdown(result.verdict()))

# %%
attach_notebook(result.run_dir)
print(f"status: {result.status}; record: {result.run_dir}")
