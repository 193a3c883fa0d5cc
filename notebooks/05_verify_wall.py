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
# acceptance `a`; the real draft) and shows, with the analysis every record gets (`spectrial.readers.explain`):
#
# 1. **cycle time vs drafted tokens**, fitted as `cycle(k) = fixed + per_draft x k` (least squares) per
#    method and acceptance kind, split into drafting and verifying where the server log says; every cycle is on
#    the verdict's clock (accept length / tok/s: the cycle each arm's break-even is), the engine's own clock
#    (decode time / verify steps) only a cross-check column;
# 2. the **break-even accept length** per arm: `cycle / baseline ms per token` (= accept length / speed-up),
#    and the verdict;
# 3. **predicted vs measured throughput**: `tau(a, k) / cycle(k)` with `tau = (1 - a^(k+1)) / (1 - a)`;
# 4. the **acceptance needed** per depth, and the baseline against the **HBM roofline**.
#
# With several records (`run_dir` a list: e.g. llama.cpp and SGLang on the same GPU), each gets its sections
# and one figure per GPU kind puts their cycle costs side by side: a record is drawn only beside records of the
# same GPU kind (an H100's cycle beside an H200's says nothing of the engines). Each record's roofline is its own
# GPU's, as it recorded it (`host.gpu_key`, else the GPU name matched in params/hardware.yaml).

# %% tags=["parameters"]
run_dir = "outputs/examples/h200-llamacpp-8b"  # a run record or a folder of records; or a list of them
out_dir = None  # where verify_wall.csv / verify_wall.json go (None: nowhere)
hardware = None  # key of params/hardware.yaml for the roofline; None: the GPU each record ran on
shape = "llama3-8b"  # model shape when the record has no models.json (spectrial.models.SHAPES)
vocab_size = 128256  # vocabulary when the record has no models.json
bits_per_weight = 16  # f16 weights
concurrency = 1  # sweep records (notebook 03) measure several concurrency levels: analyse this one

# %%
import json
from pathlib import Path

import pandas as pd
from IPython.display import Markdown, display

from spectrial import analysis
from spectrial.errors import ConfigError
from spectrial.readers.explain import RooflineInputs, explain, recorded_gpu
from spectrial.readers.render.figures import cycle_lines_figure, show_explanation, show_figure
from spectrial.record.store import list_runs, load_record
from spectrial.schema import Manifest


def depths(m: Manifest) -> int:
    """Distinct depths among the completed speculative arms at this concurrency (a sweep has two or more)."""
    return len({a.steps for a in m.arms if a.measured and a.speculative and a.get("concurrency", 1) == concurrency
                and a.get("offered_rate") is None})


def find_record(path: str) -> Path | None:
    """`path` itself if it is a sweep record, else the newest sweep record under it, else None."""
    root = Path(path)
    candidates = [root] if (root / "manifest.json").is_file() else list_runs(root) if root.is_dir() else []
    return next((p for p in reversed(candidates) if depths(load_record(p)) >= 2), None)


records = [r for r in (find_record(p) for p in ([run_dir] if isinstance(run_dir, str) else run_dir)) if r]
if not records:
    display(Markdown(f"**No sweep record yet** under `{run_dir}`: a record needs completed speculative arms at "
                     "two or more depths. Run the device recipe (`docs/DEVICE.md`), unpack its records into "
                     "`outputs/examples/`, or pass `run_dir`. The cells below are skipped."))


def gpu_of(record: Path, m: Manifest) -> str:
    """The record's GPU as params/hardware.yaml keys it (`hardware` when given); a clear error when the record
    names none or one the table does not know."""
    if hardware:
        return hardware
    key, _n, name = recorded_gpu(m)
    if key is None:
        raise ConfigError(f"{record.name} ran on {name or 'no recorded GPU'!r}, which params/hardware.yaml does not "
                          "know: add it there (name, aliases as nvidia-smi prints it, bandwidth_gb_s) or pass "
                          "-p hardware=KEY")
    return key


def roofline_of(record: Path, m: Manifest) -> RooflineInputs:
    """The roofline's inputs: the record's GPU, the model's shape from the record's models.json (else `shape`), the
    KV cache read at the mean context of its requests."""
    from spectrial.models import SHAPES

    models_json = record / "models.json"
    if models_json.is_file():
        mset = json.loads(models_json.read_text())
        sh, n_vocab = mset["shape"], mset["vocab_size"]
    else:
        sh, n_vocab = SHAPES[shape].model_dump(), vocab_size
    reqs = record / "requests.csv"
    prompt_n = 0.0
    if reqs.is_file():
        rq = pd.read_csv(reqs)
        if "server_prompt_n" in rq and rq["server_prompt_n"].notna().any():
            prompt_n = float(rq["server_prompt_n"].median())
    context = prompt_n + (m.params.max_tokens or 0) / 2
    kv = analysis.kv_cache_bytes(sh["n_layer"], sh["n_head_kv"], sh["n_embd"] // sh["n_head"], context)
    p_b = analysis.streamed_params_b(sh["n_layer"], sh["n_embd"], sh["n_ff"], sh["n_head"], sh["n_head_kv"],
                                     n_vocab)
    return RooflineInputs(gpu=gpu_of(record, m), params_b=p_b, bits_per_weight=bits_per_weight, kv_bytes_per_token=kv)


analyses = []
for record in records:
    m = load_record(record)
    at_c = m.model_copy(update={"arms": [a for a in m.arms if a.get("concurrency", 1) == concurrency
                                         and a.get("offered_rate") is None]})  # a sweep's request rates apart
    roof = roofline_of(record, m)
    ex = explain(at_c, roofline=roof)
    analyses.append((record, m, roof, ex))
    gpus = (m.host.fingerprint.gpus if m.host.fingerprint is not None else None) or [{}]
    display(Markdown(f"## `{record.name}`: {m.engine.name} on {gpus[0].get('name', 'n/a')}\n\n"
                     f"Status `{m.status}`, engine `{m.engine.version or 'n/a'}`; "
                     f"{m.params.repeats} requests x {m.params.max_tokens} tokens per start, "
                     f"{m.params.restarts if 'restarts' in m.params else 1} start(s) per setting, "
                     f"concurrency {concurrency}."))
    show_explanation(ex)

# %% [markdown]
# ## Side by side: cycle cost per drafted token, per GPU kind
# The fitted cycle line of each record and method (synthetic acceptance, where the engine offers it, since a
# real draft's acceptance varies), with its measured points: where two engines run the same model on the same
# GPU, the gap between their lines is the engine's own overhead per cycle. Records of another GPU kind get a
# figure of their own.

# %%
by_gpu: dict[str, list] = {}
for record, m, roof, ex in analyses:
    by_gpu.setdefault(roof.gpu, []).append((f"{m.engine.name} ({record.name})", ex))
for gpu, labelled in by_gpu.items():
    others = [g for g in by_gpu if g != gpu]
    display(Markdown(f"**{gpu}**: {len(labelled)} record(s)"
                     + (f"; not drawn beside {', '.join(others)} (another GPU kind)" if others else "")))
    show_figure(cycle_lines_figure(labelled))

# %% [markdown]
# ## The table and the summary files
# Per speculative arm of the first record: the break-even figures and the model's prediction; with `out_dir`,
# `verify_wall.csv` (this table) and `verify_wall.json` (the fit, its errors, break-even per depth, roofline).

# %%
if analyses:
    record, m, roof, ex = analyses[0]
    be = ex.section("Break-even").table
    model_rows = ex.section("Cycle-cost model").table
    table = be.merge(model_rows[["arm", "alpha", "fitted_cycle_ms", "predicted_tok_s", "rel_error"]], on="arm",
                     how="left") if model_rows is not None and len(model_rows) else be
    display(table)
    fits = ex.numbers.models
    main = next((k for k in fits if "synthetic" in k), next(iter(fits), None))
    needed = ex.section("Acceptance needed").table
    per_depth = [] if needed is None or main is None else [
        {"k": int(r["k"]), "cycle_ms": r["cycle_ms"], "break_even_accept_len": r["accept_len_break_even"],
         "alpha_needed": r["alpha_break_even"], "max_accept_len": int(r["k"]) + 1}
        for r in needed[needed["source"] == main].to_dict("records")]
    n = ex.numbers
    fit = fits[main].model_dump() if main is not None else {}
    summary = {"record": record.name, "baseline_tok_s": n.baseline_tok_s,
               "baseline_ms_per_token": n.baseline_ms_per_token,
               "model": {**fit, "method": main}, "error_fitted_arms": fit.get("error"),
               "models": {k: f.model_dump() for k, f in fits.items()}, "break_even": per_depth,
               "roofline": {"gpu": roof.gpu, "streamed_params_b": roof.params_b,
                            "weight_bytes_per_token": n.weight_bytes_per_token,
                            "kv_bytes_per_token": n.kv_bytes_per_token,
                            "roofline_tok_s": n.roofline_tok_s,
                            "baseline_share_of_roofline": n.baseline_roofline_fraction}}
    if out_dir:
        dest = Path(out_dir)
        dest.mkdir(parents=True, exist_ok=True)
        table.to_csv(dest / "verify_wall.csv", index=False)
        (dest / "verify_wall.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
        print(f"wrote {dest / 'verify_wall.csv'} and {dest / 'verify_wall.json'}")
