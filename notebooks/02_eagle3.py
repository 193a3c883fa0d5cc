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
# # 02 · Does speculation pay on this host? A controlled EAGLE-3 trial
#
# This notebook walks the protocol that the original investigation did by hand, one cell per step, every
# step written into the same run record (`outputs/<run-id>/manifest.json`):
#
# 1. **kill the old server** (only one spectrial started; anything else on the port is a refusal),
# 2. **verify the GPUs are free** (or record that the host has none) and fingerprint the host,
# 3. **the baseline**, then **each speculative arm**: launch with the environment on the command line, wait
#    until ready, verify the environment in every server process, benchmark, stop,
# 4. **compare** the arms with the baseline: throughput, accept length, cycle time, break-even, verdict,
# 5. **explain** why: break-even, cycle cost, acceptance needed, roofline.
#
# Every step can be re-run in the kernel (re-running an arm replaces its earlier starts; a server is stopped
# on any interrupt). The same steps in one call from the shell: `spectrial trial params/local.yaml -p steps=2`.

# %% tags=["parameters"]
params_file = "params/local.yaml"  # host, engine, models and arms
steps = None  # draft depth for speculative arms (None: as in the params file)
topk = None  # draft tree top-k (SGLang); llama.cpp drafts a chain (1)
draft_tokens = None  # tokens verified per cycle (SGLang); None: steps + 1
repeats = None  # measured requests per arm
max_tokens = None  # generated tokens per request (fixed length)
workload = None  # bundled | sharegpt | humaneval | a JSONL/JSON file, or a list: ["sharegpt", "humaneval"] (None: as in the params file)
request_format = None  # "chat" (the server's chat template) or "completion" (raw prompts); None: as in the params file
overrides = {}  # any other parameter, dotted: {"engine_config.threads": 1}
run_id = None  # run record id (None: generated)
output_dir = None  # folder of run records (None: as in the params file)
target_tok_s = None  # throughput the analysis aims at (None: 1.5x the baseline)
decide = None  # sample until decided: True, or {"margin": 0.03, "max_rounds": 20}; None: as in the params file
slo = None  # goodput objectives, e.g. {"ttft_ms": 500, "tpot_ms": 50}; None: as in the params file

# %%
from IPython.display import Markdown, display

from spectrial.cli.notebooks import attach_notebook, log_table, params_from_notebook, steps_table
from spectrial.protocol.trial import Trial
from spectrial.readers.explain import explain
from spectrial.readers.headline import headline
from spectrial.readers.render import plots
from spectrial.readers.render.figures import show_explanation, show_figure

params = params_from_notebook(params_file, overrides, steps=steps, topk=topk, draft_tokens=draft_tokens,
                              repeats=repeats, max_tokens=max_tokens, output_dir=output_dir, workload=workload,
                              request_format=request_format, decide=decide, slo=slo)
trial = Trial(params, run_id=run_id)  # states its plan first; a decide budget that cannot decide is refused here
display(Markdown("**Plan, before the first start** — " + "  \n".join(x.removeprefix("plan: ")
                                                                    for x in trial.plan.lines())))
display(Markdown(f"**Trial** `{params.name}` on host `{params.host}` with engine `{params.engine}`, "
                 f"model `{params.model}`, steps {params.steps}, {params.repeats} requests x "
                 f"{params.max_tokens} tokens per start, {params.restarts} start(s) per arm; arms: "
                 f"{', '.join(a.name for a in params.arms)}. Record: `{trial.run_dir}`"))

# %% [markdown]
# ## 1 · Kill the old server
# spectrial stops only what it started: the server its state file records for this port, found by the
# process group and session recorded at launch. Anything else holding the port is refused, with its pid
# and command line.

# %%
trial.kill_old_server()

# %% [markdown]
# ## 2 · Verify the GPUs are free, fingerprint the host
# GPU memory in use must be below `gpu_free_mib` on every GPU (spectrial waits up to `gpu_wait_s`); the
# fingerprint (driver, clocks, PCIe, CPU, kernel, engine build, model files) decides which runs are comparable.

# %%
trial.verify_gpus_free()

# %% [markdown]
# ## 3 · The baseline
# The baseline arm(s) (method `none`), measured in this session beside the speculative arms: never a number
# from another day. With `decide`, every arm runs here instead, in rounds of one start each (A B A B ...), until
# each speculative arm's speed-up is decided by a confidence sequence over the paired rounds (docs/STATISTICS.md).

# %%
if params.decide is not None:
    trial.run_arms()
    display(Markdown(f"**Decide**: {trial.manifest.decide.stopped}"))
else:
    for name in trial.baseline_arms:
        trial.run_arm(name)
trial.table_of(trial.baseline_arms)

# %% [markdown]
# ## 4 · The speculative arms
# Each arm: `restarts` server starts with the same environment, checked in `/proc/<pid>/environ` of every
# server process. Arms marked `synthetic` take the engine's benchmark-only synthetic acceptance: their timings
# are real, their acceptance is a parameter, not a property of the draft.

# %%
if params.decide is None:
    for name in trial.experiment_arms:
        trial.run_arm(name)
trial.table_of(trial.experiment_arms)

# %% [markdown]
# ## 5 · Compare: the answer
# `tok_s` is each arm's decode rate per request (median over requests; the engine's own rate where it reports
# one), with its CI (bootstrap over starts then requests). The speed-up is tok/s over the baseline's, with its
# interval and verdict (in a `decide` run: the geometric mean of the paired per-round ratios, the same pair as
# its confidence sequence); break-even = accept length / speed-up (a cycle's time in baseline tokens), so an arm
# pays exactly when its speed-up's interval lies above 1. Every reader below (the figures, the analysis, the
# doctor, report.html) shows these numbers, on one clock (docs/FIGURES.md defines every figure).

# %%
trial.compare()
answer = headline(trial.manifest)
display(Markdown(answer.markdown()))
if trial.manifest.decide is not None:
    show_figure(plots.decide_figure(trial.manifest.decide))
answer.table()

# %% [markdown]
# ### Is the measurement valid?
# Before an arm is called faster or slower its measurement must pass the load checks (spectrial.analysis.validity, after
# Red Hat's `speculators`): achieved vs requested concurrency, no queue (TTFT), prefix-cache hits under 5 %, no
# outputs stopped short of a fixed length, a stream as fine as the decoding, and starts that agree. A failed
# INVALID check makes the verdict "invalid measurement". Then the accept length per request beside the
# token-weighted one of the counters (which leans towards the longest completions).

# %%
from spectrial.analysis.figures import accept_table
from spectrial.analysis.validity import checks_table

checks = checks_table(trial.manifest.arms)
display(checks[checks["result"] != "ok"] if len(checks) else Markdown("No checks recorded."))
acc = accept_table(trial.manifest.arms)
acc.round(3) if len(acc) else Markdown("No per-request accept length: the engine reports no per-request counts.")

# %% [markdown]
# ### Serving metrics
# What a serving benchmark reports, per arm: TTFT, TPOT, ITL per token (pooled over every gap of every request)
# and per delivered chunk, end-to-end latency (p50/p90/p99, ms), requests and output tokens per second of
# measurement (all streams together), goodput under `slo`. A figure the stream's granularity makes meaningless is
# left out, with the reason.

# %%
from spectrial.analysis import serving

display(serving.serving_table(trial.manifest.arms))
show_figure(plots.latency_figure(trial.requests_by_arm()))

# %% [markdown]
# ### Per workload category
# Acceptance depends on what is asked. With a workload of two categories or more (chat, code, ...): each arm over
# the requests of each category, with speed-up and verdict against the baseline's requests of the same category.
# `break_even_own` is the category's own line: its cycles' time over the baseline's time per token on the same
# prompts.

# %%
from spectrial.readers.render.report import workload_line

display(Markdown(f"**Workload**: {workload_line(trial.manifest.workload)}"))
cats = trial.categories()
cats.round(3) if len(cats) else Markdown("One category: the arms table above is the whole story.")

# %%
show_figure(plots.tok_s_figure(trial.manifest.arms))
show_figure(plots.break_even_figure(trial.manifest.arms))

# %% [markdown]
# ### The steps as recorded, and what the environment check found

# %%
display(steps_table(trial.manifest))
for arm in trial.manifest.arms:
    print(f"{arm.name}: {arm.env_check.summary if arm.env_check else 'not checked'}")

# %% [markdown]
# ### What the server logs say
# The same numbers from the other side: spectrial's log parser (`spectrial.logs`, one parser for every
# engine) reads each server's own log once per start — per-request timings, draft acceptance and, with
# `-lv 4`, llama.cpp's cumulative speculative statistics (the drafting time that splits a cycle).

# %%
log_table(trial.manifest).round(3)

# %% [markdown]
# ## 6 · Verdict and why: break-even, cycle cost, acceptance needed, roofline
# One verdict per arm (the break-even section): what a speculative cycle costs in baseline tokens, whether the
# accept length clears it, and the speed-up with its confidence interval; then the cycle-cost model where two
# or more depths ran, the per-token acceptance a target throughput needs at each depth, and the baseline
# against the memory-bandwidth roofline when the record names the GPU and the model.

# %%
show_explanation(explain(trial.manifest, target_tok_s=target_tok_s))

# %%
trial.close()

# %% [markdown]
# ## 7 · Why is speculation slower here? The doctor
# `spectrial doctor RUN_DIR` on this run's record, server logs and GPU samples: each cause found, ranked
# (critical: makes speculation lose by itself; warning: the measurement cannot say what it seems to; info),
# with its evidence (a record field or a log file:line), the fix, and the public thread where the pattern
# was seen.

# %%
from spectrial.readers.diagnose import diagnose

diagnose(trial.run_dir).show()

# %% [markdown]
# ## The answer

# %%
attach_notebook(trial.run_dir)
display(Markdown(headline(trial.manifest).markdown()))
print(f"status: {trial.manifest.status}; record: {trial.run_dir}")
