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
# # 05 · The verify wall: what one speculative cycle costs, and when it pays
#
# Speculative decoding pays only when a cycle (draft `k` tokens, verify them in one target pass) commits
# more tokens than the time it takes would have decoded plainly. This notebook reads the record of a
# depth x acceptance sweep (baseline; EAGLE-3 with `k` = 1..6 drafted tokens at synthetic per-token
# acceptance `a`; the real random draft at `a` = 0) and answers, with `spectrial.analysis`:
#
# 1. **cycle time vs drafted tokens**, fitted as `cycle(k) = fixed + per_draft x k` (least squares),
#    split into drafting and verifying time from the `statistics` lines of the server log;
# 2. the **break-even accept length** per depth: `cycle(k) / baseline ms per token`;
# 3. **predicted vs measured throughput** across the grid: `tau(a, k) / cycle(k)` with
#    `tau = (1 - a^(k+1)) / (1 - a)`, and its median and worst error;
# 4. the baseline as a share of the **HBM roofline** (batch-1 decode streams every weight once per token).
#
# Input: a run record folder (`run_dir`) of `spectrial trial`, notebook 02 or notebook 03 (one concurrency
# level of it), or a folder of records, where the newest sweep is taken.

# %% tags=["parameters"]
run_dir = "outputs/examples/h200-llamacpp-8b"  # a run record, or a folder holding run records
out_dir = None  # where verify_wall.csv / verify_wall.json go (None: nowhere)
hardware = "h200_sxm"  # key of params/hardware.yaml for the roofline
shape = "llama3-8b"  # model shape when the record has no models.json (spectrial.models.SHAPES)
vocab_size = 128256  # vocabulary when the record has no models.json
bits_per_weight = 16  # f16 weights
concurrency = 1  # sweep records (notebook 03) measure several concurrency levels: analyse this one

# %%
import json
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from IPython.display import Markdown, display

from spectrial import analysis
from spectrial.records import list_runs, load_manifest


def sweep_points(manifest: dict) -> int:
    """Distinct depths among the completed synthetic speculative arms (a sweep has two or more)."""
    return len({a.get("steps") for a in manifest.get("arms", [])
                if a.get("status") == "ok" and a.get("method") != "none" and a.get("synthetic")
                and a.get("concurrency") in (None, concurrency)})


def find_record(path: str) -> Path | None:
    """`path` itself if it is a sweep record, else the newest sweep record under it, else None."""
    root = Path(path)
    candidates = [root] if (root / "manifest.json").is_file() else list_runs(root) if root.is_dir() else []
    sweeps = [p for p in candidates if sweep_points(load_manifest(p)) >= 2]
    return sweeps[-1] if sweeps else None


record = find_record(run_dir)
if record is None:
    display(Markdown(f"**No sweep record yet** under `{run_dir}`: a record needs completed synthetic EAGLE-3 "
                     "arms at two or more depths. Run the device recipe (`docs/DEVICE.md`), unpack its "
                     "records into `outputs/examples/h200-llamacpp-8b/`, or pass `run_dir`. "
                     "The cells below are skipped."))
else:
    manifest = load_manifest(record)
    gpus = (manifest.get("host", {}).get("fingerprint") or {}).get("gpus") or [{}]
    display(Markdown(f"**Record** `{record.name}` (status `{manifest['status']}`), host "
                     f"`{manifest['host'].get('name')}`, GPU {gpus[0].get('name', 'n/a')}, engine "
                     f"`{manifest.get('engine', {}).get('version', 'n/a')}`; "
                     f"{manifest['params'].get('repeats')} requests x {manifest['params'].get('max_tokens')} "
                     f"tokens per arm after {manifest['params'].get('warmup')} warm-up."))

# %% [markdown]
# ## The arms
# `k` is the draft depth (llama.cpp `--spec-draft-n-max`), `a` the per-token acceptance: the synthetic
# rate where one was set, else the rate that the measured accept length implies (0 for a random draft).

# %%
def arm_frame(manifest: dict) -> tuple[pd.DataFrame, dict]:
    """Completed speculative arms as rows (k, a, measured figures) and the baseline arm."""
    arms = [a for a in manifest["arms"] if a.get("status") == "ok" and a.get("concurrency") in (None, concurrency)]
    base = next(a for a in arms if a.get("method") == "none")
    rows = []
    for a in arms:
        if a.get("method") == "none" or not a.get("cycle_ms"):
            continue
        k, tau = int(a["steps"]), a.get("accept_len") or 1.0
        rate = a.get("synthetic_accept")
        alpha = float(rate) if isinstance(rate, int | float) else analysis.required_alpha(min(max(tau, 1.0), k + 1), k)
        rows.append({"arm": a["name"], "k": k, "alpha": alpha, "synthetic": bool(a.get("synthetic")),
                     "tok_s": a["tok_s"], "tok_s_min": a.get("tok_s_min"), "tok_s_max": a.get("tok_s_max"),
                     "accept_len": tau, "accept_len_expected": analysis.expected_accept_len(alpha, k),
                     "cycle_ms": a["cycle_ms"], "draft_ms": a.get("draft_ms_per_cycle"),
                     "break_even_accept_len": a.get("break_even_accept_len"), "speedup": a.get("speedup")})
    return pd.DataFrame(rows).sort_values(["alpha", "k"], ascending=[False, True], ignore_index=True), base


if record is not None:
    arms, base = arm_frame(manifest)
    base_ms = base["decode_ms"] / base["tokens"]  # the trial's ms_per_token (decode time / tokens)
    display(Markdown(f"Baseline: **{base['tok_s']:.1f} tok/s** (min-max {base.get('tok_s_min', 0):.1f}-"
                     f"{base.get('tok_s_max', 0):.1f}), {base_ms:.2f} ms per token; "
                     f"{len(arms)} speculative arms."))
    display(arms.round(3))

# %% [markdown]
# ## Cycle time vs drafted tokens, and its split
# The model is fitted on the synthetic arms (their acceptance is set, their timings real); with drafting
# time per cycle known for every arm, the same least squares splits the cycle into draft and verify parts.

# %%
if record is not None:
    fit_rows = arms[arms["synthetic"]] if arms["synthetic"].sum() >= 2 else arms
    cols = ["k", "cycle_ms", "draft_ms"] if fit_rows["draft_ms"].notna().all() else ["k", "cycle_ms"]
    model = analysis.fit_cycle_model(fit_rows[cols])
    terms = {"fixed ms per cycle": model.fixed_ms, "ms per drafted token": model.per_draft_ms, "R^2": model.r2}
    if model.has_split:
        terms.update({"draft: fixed ms": model.draft_fixed_ms, "draft: ms per token": model.draft_per_token_ms,
                      "verify: fixed ms": model.verify_fixed_ms, "verify: ms per token": model.verify_per_token_ms})
    display(pd.Series(terms, name="cycle model").round(3).to_frame())
    ks = list(range(1, int(arms["k"].max()) + 1))
    split = pd.DataFrame({"k": ks, "cycle_ms": [model.cycle_ms(k) for k in ks]})
    if model.has_split:
        split["draft_ms"] = [model.draft_ms(k) for k in ks]
        split["verify_ms"] = [model.verify_ms(k) for k in ks]
    split["cycle_in_base_tokens"] = split["cycle_ms"] / base_ms
    display(split.round(3))

    fig = go.Figure()
    if model.has_split:
        fig.add_bar(x=ks, y=split["verify_ms"], name="verify (model)", marker_color="#aec7e8")
        fig.add_bar(x=ks, y=split["draft_ms"], name="draft (model)", marker_color="#ffbb78")
    for alpha, g in arms.groupby("alpha", sort=False):
        fig.add_scatter(x=g["k"], y=g["cycle_ms"], mode="markers", marker={"size": 10},
                        name=f"measured, a = {alpha:.2f}")
    fig.add_scatter(x=ks, y=split["cycle_ms"], mode="lines", line={"color": "black"},
                    name=f"fit {model.fixed_ms:.2f} + {model.per_draft_ms:.2f} k ms")
    fig.add_hline(y=base_ms, line_dash="dash", line_color="#7f7f7f",
                  annotation_text=f"baseline {base_ms:.2f} ms / token")
    fig.update_layout(barmode="stack", title="Cycle time vs drafted tokens", xaxis_title="drafted tokens k",
                      yaxis_title="ms per cycle", template="plotly_white", height=430)
    fig.show()

# %% [markdown]
# ## Break-even accept length per depth
# A cycle of depth `k` pays only if it commits more than `cycle(k) / baseline ms per token` tokens; the
# per-token acceptance that reaches that length is the bar a draft must clear at that depth.

# %%
if record is not None:
    be = split[["k", "cycle_ms"]].copy()
    be["break_even_accept_len"] = [analysis.break_even_accept_len(c, base_ms) for c in be["cycle_ms"]]
    be["alpha_needed"] = [analysis.required_alpha(t, k) if 1 <= t <= k + 1 else None
                          for t, k in zip(be["break_even_accept_len"], be["k"], strict=True)]
    be["max_accept_len"] = be["k"] + 1
    display(be.round(3))

# %% [markdown]
# ## Predicted vs measured throughput
# Prediction = `expected_accept_len(a, k) / cycle(k)`; bars show each arm's min-max over requests.

# %%
if record is not None:
    pred = analysis.prediction_errors(model, arms)
    err_fit = pred.loc[pred["synthetic"], "rel_error"].abs()
    err_all = pred["rel_error"].abs()
    fig = go.Figure()
    for alpha, g in pred.groupby("alpha", sort=False):
        fig.add_scatter(x=g["k"], y=g["tok_s"], mode="markers", name=f"measured, a = {alpha:.2f}",
                        marker={"size": 10},
                        error_y={"type": "data", "symmetric": False, "array": g["tok_s_max"] - g["tok_s"],
                                 "arrayminus": g["tok_s"] - g["tok_s_min"]})
        fig.add_scatter(x=g["k"], y=g["predicted_tok_s"], mode="lines", line={"dash": "dot"},
                        name=f"predicted, a = {alpha:.2f}")
    fig.add_hline(y=base["tok_s"], line_dash="dash", line_color="#7f7f7f",
                  annotation_text=f"baseline {base['tok_s']:.1f} tok/s")
    fig.update_layout(title="Throughput: cost model vs measurement", xaxis_title="drafted tokens k",
                      yaxis_title="tokens / s", template="plotly_white", height=450)
    fig.show()
    display(Markdown(f"Model error on the synthetic arms it was fitted to: median **{err_fit.median():.1%}**, "
                     f"max **{err_fit.max():.1%}** ({len(err_fit)} arms); on every speculative arm: median "
                     f"{err_all.median():.1%}, max {err_all.max():.1%} "
                     f"(worst: `{pred.loc[err_all.idxmax(), 'arm']}`)."))

# %% [markdown]
# ## The baseline against the HBM roofline
# At batch 1 each token streams every weight but the embedding table (one row is read) plus the KV cache
# read so far; the roofline is bandwidth / bytes per token.

# %%
def streamed_params(n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int, n_vocab: int) -> float:
    """Weights read per decoded token by a llama model (all matrices but token_embd), in parameters."""
    hd = n_embd // n_head
    per_layer = n_embd * n_head * hd * 2 + n_embd * n_head_kv * hd * 2 + 3 * n_embd * n_ff
    return float(n_layer * per_layer + n_vocab * n_embd)


if record is not None:
    from spectrial.models import SHAPES

    models_json = record / "models.json"
    if models_json.is_file():
        mset = json.loads(models_json.read_text())
        sh, n_vocab, source = mset["shape"], mset["vocab_size"], "models.json of the record"
    else:
        sh, n_vocab, source = SHAPES[shape].model_dump(), vocab_size, f"shape {shape!r} (no models.json)"
    p_stream = streamed_params(sh["n_layer"], sh["n_embd"], sh["n_ff"], sh["n_head"], sh["n_head_kv"], n_vocab)
    w_bytes = analysis.weight_bytes(p_stream / 1e9, bits_per_weight)
    reqs = record / "requests.csv"
    prompt_n = 0.0
    if reqs.is_file():
        rq = pd.read_csv(reqs)
        if "server_prompt_n" in rq:
            prompt_n = float(rq["server_prompt_n"].median())
    context = prompt_n + manifest["params"]["max_tokens"] / 2
    kv = analysis.kv_cache_bytes(sh["n_layer"], sh["n_head_kv"], sh["n_embd"] // sh["n_head"], context)
    gpu = analysis.load_hardware()[hardware]
    roof = analysis.decode_roofline_tok_s(w_bytes, gpu.bandwidth_gb_s, kv)
    util = analysis.bandwidth_utilisation(base["tok_s"], w_bytes, gpu.bandwidth_gb_s, kv)
    roofline = {"gpu": gpu.name, "bandwidth_gb_s": gpu.bandwidth_gb_s, "model_from": source,
                "streamed_params_b": p_stream / 1e9, "weight_bytes_per_token": w_bytes,
                "kv_bytes_per_token": kv, "mean_context_tokens": context, "roofline_tok_s": roof,
                "baseline_tok_s": base["tok_s"], "baseline_share_of_roofline": util,
                "achieved_bandwidth_gb_s": base["tok_s"] * (w_bytes + kv) / 1e9}
    display(pd.Series(roofline, name="roofline").to_frame())
    display(Markdown(f"The baseline runs at **{util:.0%}** of the {gpu.name} roofline ({roof:.0f} tok/s for "
                     f"{(w_bytes + kv) / 1e9:.2f} GB per token at {gpu.bandwidth_gb_s:.0f} GB/s): "
                     f"{base['tok_s'] * (w_bytes + kv) / 1e9:.0f} GB/s achieved."))

# %% [markdown]
# ## The table: each depth and acceptance
# Measured tok/s with its spread, accept length, cycle time, break-even accept length, the model's
# prediction and its error. Saved as `verify_wall.csv` (and the fitted terms as `verify_wall.json`).

# %%
if record is not None:
    table = pred[["arm", "k", "alpha", "synthetic", "tok_s", "tok_s_min", "tok_s_max", "speedup", "accept_len",
                  "accept_len_expected", "cycle_ms", "draft_ms", "break_even_accept_len", "predicted_tok_s",
                  "rel_error"]]
    display(table.round(3))
    summary = {"record": record.name, "baseline_tok_s": base["tok_s"], "baseline_ms_per_token": base_ms,
               "model": {"fixed_ms": model.fixed_ms, "per_draft_ms": model.per_draft_ms, "r2": model.r2,
                         "draft_fixed_ms": model.draft_fixed_ms, "draft_per_token_ms": model.draft_per_token_ms,
                         "verify_fixed_ms": model.verify_fixed_ms, "verify_per_token_ms": model.verify_per_token_ms,
                         "fitted_on": fit_rows["arm"].tolist()},
               "error_fitted_arms": {"median": err_fit.median(), "max": err_fit.max(), "n": int(len(err_fit))},
               "error_all_arms": {"median": err_all.median(), "max": err_all.max(), "n": int(len(err_all))},
               "break_even": be.to_dict(orient="records"), "roofline": roofline}
    if out_dir:
        dest = Path(out_dir)
        dest.mkdir(parents=True, exist_ok=True)
        table.to_csv(dest / "verify_wall.csv", index=False)
        (dest / "verify_wall.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
        print(f"wrote {dest / 'verify_wall.csv'} and {dest / 'verify_wall.json'}")
