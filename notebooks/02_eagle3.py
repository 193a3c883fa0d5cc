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
# # 02 · Does speculation pay on this host? A controlled EAGLE-3 trial
#
# This notebook runs the protocol that the original investigation did by hand, every step recorded:
#
# 1. **kill the old server** (only one spectrial started; anything else on the port is a refusal),
# 2. **verify the GPUs are free** (or record that the host has none),
# 3. for each arm: **launch** with the environment on the command line, **wait until ready**,
#    **verify the environment** in every server process, **benchmark**, **stop**,
# 4. **compare** the arms: throughput, accept length, cycle time and the break-even accept length.
#
# The same code runs from the shell: `spectrial trial params/local.yaml -p steps=2`.

# %% tags=["parameters"]
params_file = "params/local.yaml"  # host, engine, models and arms
steps = None  # draft depth for speculative arms (None: as in the params file)
topk = None  # draft tree top-k (SGLang); llama.cpp drafts a chain (1)
draft_tokens = None  # tokens verified per cycle (SGLang); None: steps + 1
repeats = None  # measured requests per arm
max_tokens = None  # generated tokens per request (fixed length)
overrides = {}  # any other parameter, dotted: {"engine_config.threads": 1}
run_id = None  # run record id (None: generated)
output_dir = None  # folder of run records (None: as in the params file)
target_tok_s = None  # throughput the analysis aims at (None: 1.5x the baseline)

# %%
from IPython.display import Markdown, display

from spectrial import narrative, plots
from spectrial.notebooks import attach_notebook, log_table, params_from_notebook, steps_table
from spectrial.trial import run_trial

params = params_from_notebook(params_file, overrides, steps=steps, topk=topk, draft_tokens=draft_tokens,
                              repeats=repeats, max_tokens=max_tokens, output_dir=output_dir)
display(Markdown(f"**Trial** `{params.name}` on host `{params.host}` with engine `{params.engine}`, "
                 f"model `{params.model}`, steps {params.steps}, {params.repeats} requests x "
                 f"{params.max_tokens} tokens per arm; arms: {', '.join(a.name for a in params.arms)}."))

# %% [markdown]
# ## Run the protocol
# One call runs every step below and writes the run record as it goes; if anything fails, the record
# still says what happened (`status: failed` and the reason) and no server is left running.

# %%
result = run_trial(params, run_id=run_id)
print(f"run record: {result.run_dir}/manifest.json")

# %% [markdown]
# ## Protocol steps
# Each step with its duration: killing the old server, the GPU check, and per arm the launch, readiness,
# environment check, benchmark and stop.

# %%
steps_table(result.manifest)

# %% [markdown]
# ## Environment verification
# The variables requested for each arm, checked in `/proc/<pid>/environ` of every process of the server.

# %%
for arm in result.arms:
    chk = arm.get("env_check") or {}
    print(f"{arm['name']}: {chk.get('summary', 'not checked')}")

# %% [markdown]
# ## Results
# `tok_s` is the median over requests of the server-reported decode rate (q1/q3 its spread);
# `cycle_ms` = decode time / verify steps; `break_even_accept_len` = cycle time / baseline time per token.
# Arms marked `synthetic` take llama.cpp's benchmark-only synthetic acceptance: their timings are real,
# their acceptance is a parameter, not a property of the draft.

# %%
result.table().round(3)

# %%
plots.tok_s_figure(result.arms).show()

# %%
plots.break_even_figure(result.arms).show()

# %% [markdown]
# ## What the server logs say
# The same numbers from the other side: spectrial's log parser (`spectrial.logs`, one parser for every
# engine) reads each server's own log — per-request timings, draft acceptance and, with `-lv 4`, the
# cumulative speculative statistics (the drafting time that splits a cycle into drafting and verifying).

# %%
log_table(result.manifest).round(3)

# %% [markdown]
# ## Verdict

# %%
display(Markdown(narrative.verdict(result.arms)))

# %% [markdown]
# ## Why: break-even, cycle cost, acceptance needed, roofline
# The analysis notebook 90 applies to the original case, here on this run: what a speculative cycle costs in
# baseline tokens, the cycle-cost model where two or more depths ran, the per-token acceptance a target
# throughput needs at each depth, and the baseline against the memory-bandwidth roofline when the record
# names the GPU and the model.

# %%
from spectrial.explain import explain

explain(result.manifest, target_tok_s=target_tok_s).show()

# %%
attach_notebook(result.run_dir)
print(f"status: {result.status}; record: {result.run_dir}")
