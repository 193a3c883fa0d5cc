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
# # 90 · The original case: EAGLE-3 for Kimi-K2.5 on eight PCIe GPUs
#
# An engineer deployed EAGLE-3 speculative decoding for Kimi-K2.5 (a ~1T-parameter MoE, INT4) with
# SGLang, tensor parallel 8 over eight RTX PRO 6000 Blackwell GPUs linked only by PCIe. One run gave
# 94 tok/s against an 89 tok/s baseline; later runs gave 60 tok/s against 82. Hours went into NCCL
# variables before the arithmetic settled it: **a speculative cycle cost more than the draft could earn**.
#
# This notebook reads the case as a run record (`outputs/examples/case-kimi-k25-pcie/manifest.json`,
# the measured figures of `SEED_CASE.md`) with the same library that reads spectrial's own trials:
#
# 1. the measurements, and what they imply (cycle time, accept length) — labelled as derived;
# 2. the matrix the engineer built by hand;
# 3. the arithmetic that settled it: break-even, what accept length 2.1 gives, what 150 tok/s needs;
# 4. the analysis section of notebook 02, on the one session whose arms share a baseline;
# 5. why 94 and 60 tok/s cannot be compared;
# 6. what a spectrial trial would have recorded;
# 7. what `spectrial doctor` names on the case's own record, with the evidence for each cause.

# %% tags=["parameters"]
case_dir = "outputs/examples/case-kimi-k25-pcie"  # the case's run record (relative to the checkout)
base_tok_s = 82.0  # the re-measured baseline, tok/s
cycle_ms = 30.0  # one speculative cycle in the later session, ms (round figure)
accept_len = 2.1  # tokens per cycle the draft delivered
accept_k = 2  # drafted tokens per cycle of the run that reported accept_len
target_tok_s = 150.0  # the throughput that was hoped for

# %%
import pandas as pd
from IPython.display import Markdown, display

from spectrial import analysis
from spectrial.errors import SpectrialError
from spectrial.readers import casestudy, history
from spectrial.readers.explain import explain
from spectrial.readers.render.figures import matrix_figure, show_explanation, show_figure

pd.set_option("display.max_columns", None)
pd.set_option("display.width", 200)
try:
    case = casestudy.load_case(history.resolve_dir(case_dir))
    display(Markdown(f"**{case.name}**: {case.description}"))
except SpectrialError as exc:
    case = None
    display(Markdown(f"**The case record could not be read**: {exc}. Nothing below can be computed."))

# %% [markdown]
# ## 1 · What was measured
# One row per configuration, in the order of `SEED_CASE.md`. `tok_s`, `verify_ms` and `verify_share`
# are as reported (midpoints of reported ranges); `cycle_ms` and `accept_len` are **derived** where the
# record implies them — the `derived` column says how: cycle = verify / verify share, or accept length /
# tok/s; accept length = tok/s x cycle. The 5-step tuned run reported only its verify time, a lower bound
# on its cycle. Break-even and speed-up are against the baseline of the same session and NCCL state.

# %%
if case is not None:
    display(casestudy.case_table(case).round(3))

# %% [markdown]
# ## 2 · The matrix, as it was built by hand
# Throughput and verify time per configuration, one row per session and NCCL state. Reading across a
# row compares like with like; reading down a column mixes server starts. The 94 tok/s sits alone in a
# row whose environment nobody recorded.

# %%
if case is not None:
    rows = history.load_history(history.resolve_dir(case_dir)).table
    tok = history.matrix(rows, "tok_s", rows=("session", "nccl_env"))
    display(tok)
    display(history.matrix(rows, "verify_ms", rows=("session", "nccl_env")))
    show_figure(matrix_figure(tok, "tok/s by session, NCCL state and configuration"))

# %% [markdown]
# ## 3 · The arithmetic that settled it
# A cycle drafts k tokens and verifies them in one target pass; it commits tau tokens (accepted drafts
# plus the target's own). Against a baseline of T ms per token it pays only when tau > cycle / T.

# %%
if case is not None:
    kn = casestudy.key_numbers(base_tok_s, cycle_ms, accept_len, accept_k, target_tok_s)
    reach = {k: ("unreachable" if a is None else f"{a:.3f}") for k, a in kn.alpha_for_target.items()}
    display(Markdown(
        f"- Baseline {kn.base_tok_s:g} tok/s = {kn.base_ms_per_token:.3f} ms per token; a {kn.cycle_ms:g} ms cycle "
        f"costs the time of **{kn.break_even_accept_len:.2f} baseline tokens**: the break-even accept length.\n"
        f"- The draft delivered ~{kn.accept_len:g} tokens per cycle: **{kn.tok_s_at_accept_len:.1f} tok/s**, "
        f"{kn.speedup_at_accept_len:.2f}x the baseline. At k={kn.k} that accept length means a per-token "
        f"acceptance of alpha = {kn.alpha_of_accept_len:.3f} (tau = (1 - a^(k+1)) / (1 - a)).\n"
        f"- {kn.target_tok_s:g} tok/s at a {kn.cycle_ms:g} ms cycle needs **{kn.accept_len_for_target:.2f} tokens "
        f"per cycle**: per-token acceptance by depth k: "
        + ", ".join(f"k={k}: {v}" for k, v in reach.items()) + "."))

# %% [markdown]
# The acceptance 150 tok/s needs at each configuration's **own measured cycle** and depth
# (`alpha_needed` empty: out of reach even if every draft were accepted), next to the acceptance its
# accept length implies. The engineer's estimate of "~78 % at the deeper setting" falls between the
# two 5-step rows: it depends on which cycle one assumes, which the record pins down only as a range.

# %%
if case is not None:
    needed = casestudy.needed_table(case, target_tok_s)
    display(needed)
    draft_acc = case.params["draft"]["validation_accuracy"]
    tau5 = analysis.expected_accept_len(draft_acc, 5)
    display(Markdown(
        f"If the draft's validation accuracy ({draft_acc:.1%}) held as a per-token acceptance, 5 drafted tokens "
        f"would commit {tau5:.2f} per cycle: {analysis.spec_throughput(tau5, cycle_ms):.0f} tok/s at a "
        f"{cycle_ms:g} ms cycle. The measured accept length (~{accept_len:g} at k={accept_k}, alpha "
        f"{analysis.required_alpha(accept_len, accept_k):.2f}) says it does not: validation accuracy is not "
        "chain acceptance."))

# %% [markdown]
# ## 4 · The analysis section, on one session
# The same analysis notebook 02 prints for its own trial, on the later session: one baseline and two
# speculative depths measured around the same restart (the 3-step arm came from a separate `nohup`
# launch). Two depths let the cycle-cost model be fitted; with two points it passes through both, so the
# extrapolation to deeper drafts is a hypothesis to test, not a measurement.

# %%
if case is not None:
    later = explain(case.model_copy(update={"arms": casestudy.case_arms(case, "later")}), target_tok_s=target_tok_s)
    show_explanation(later)

# %% [markdown]
# ## 5 · Why 94 and 60 tok/s cannot be compared
# The two EAGLE-3 runs of the same depth (2 steps, 3 draft tokens) delivered the same kind of accept
# length, yet one ran at 94 tok/s and the other at 60.5. What the record says about each pair:

# %%
if case is not None:
    drift = casestudy.baseline_drift(case)
    for a, b in (("eagle3-k2-interactive", "eagle3-k2-restart"), ("eagle3-k2-interactive", "eagle3-k3-nohup")):
        p = casestudy.pair(case, a, b)
        display(Markdown(
            f"**{a}** ({p.a.tok_s:g} tok/s, cycle {p.a.cycle_ms:.2f} ms) vs **{b}** "
            f"({p.b.tok_s:g} tok/s, cycle {p.b.cycle_ms:.2f} ms): throughput ratio "
            f"{p.tok_s_ratio:.2f}, cycle ratio {p.cycle_ratio:.2f}.\n\n"
            + "\n".join(f"- {r}" for r in p.reasons)))
    display(Markdown(
        f"Between the sessions the tuned baseline itself moved by **{drift:+.1%}** (88.9 -> 82.2 tok/s) with no "
        "repetition to say how much of that is noise. Verify time per cycle at the same depth went from 19.14 to "
        "28.95 ms (+51 %): the system changed between the two launches, not the draft. Only a baseline measured "
        "beside each arm, with the environment verified in the server processes, could have said which launch "
        "was representative."))

# %% [markdown]
# ## 6 · What a spectrial trial would have recorded
# `spectrial trial` (or notebook 02) runs the protocol the case did by hand — kill the old server, check
# the GPUs are free, then per arm: launch with the environment on the command line, wait until ready,
# **check the variables in `/proc/<pid>/environ` of every server process**, warm up, benchmark several
# requests, stop — and writes each step into the run record. The table shows, per measurement of the
# case, which of the fields such a record holds were captured (True) or not (False).

# %%
if case is not None:
    cov = casestudy.coverage(case)
    display(cov)
    display(Markdown(f"{int(cov.to_numpy().sum())} of {cov.size} fields recorded. What each field is: "
                     + "; ".join(f"`{k}`: {v}" for k, v in casestudy.TRIAL_FIELDS.items()) + "."))

# %% [markdown]
# ## Key numbers

# %%
if case is not None:
    display(pd.DataFrame([
        ("break-even accept length (82 tok/s, 30 ms cycle)", round(kn.break_even_accept_len, 3)),
        ("tok/s at accept length 2.1 and a 30 ms cycle", round(kn.tok_s_at_accept_len, 1)),
        ("speed-up at accept length 2.1", round(kn.speedup_at_accept_len, 3)),
        ("per-token acceptance implied by 2.1 at k=2", round(kn.alpha_of_accept_len, 3)),
        ("accept length 150 tok/s needs at 30 ms", round(kn.accept_len_for_target, 3)),
        ("acceptance 150 tok/s needs at k=5, 30 ms", round(kn.alpha_for_target[5], 3)),
        ("least acceptance for 150 tok/s, fitted later-session model", later.numbers.min_alpha_for_target),
        ("baseline drift between sessions", round(drift, 4)),
        ("baseline share of the bandwidth roofline", round(later.numbers.baseline_roofline_fraction, 4)),
    ], columns=["quantity", "value"]))

# %% [markdown]
# ## 7 · What the doctor says
# `spectrial doctor outputs/examples/case-kimi-k25-pcie` runs every detector of `spectrial.readers.diagnose` on the
# record: the same causes the investigation spent a day on, named with the record field that shows each one
# and the public thread where the pattern was seen. Ranked: critical (makes speculation lose by itself), then
# warnings (the measurement cannot say what it seems to), then information.

# %%
if case is not None:
    from spectrial.readers.diagnose import diagnose

    doctor = diagnose(history.resolve_dir(case_dir))
    doctor.show()

# %% [markdown]
# The three things the original investigation could not see, as the doctor names them: the NCCL environment
# that was never verified, the baseline that moved from 89 to 82 tok/s between sessions, and the 94 tok/s run
# that nothing can be compared with.

# %%
if case is not None:
    display(Markdown("\n".join(
        f"- **{kind}** ({f.severity}): {f.title}\n"
        + "".join(f"    - `{e.where}` = `{e.text}`\n" for e in f.evidence[:4])
        for kind in ("env_not_in_effect", "stale_baseline", "not_comparable") for f in doctor.of(kind))))
