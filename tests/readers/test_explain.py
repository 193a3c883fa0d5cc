"""spectrial.readers.explain: the analysis section shared by notebooks 02 and 90 and by `spectrial report`.

Numbers are checked against hand-worked values, the closed form tau = (1 - a^(k+1)) / (1 - a) (Leviathan
et al. 2023), and the H200 sweep of shared/reference/LLAMACPP.md (cycle = 8.23 ms + 0.95 ms x k on the engine's
clock, throughput predicted with a median error of 2.7 % and a worst case of 10.8 %; spectrial fits the verdict's
clock, accept length / tok/s, which gives 8.27 + 0.95 k).
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pytest

from spectrial.readers.casestudy import load_case
from spectrial.readers.explain import Explanation, RooflineInputs, explain
from spectrial.readers.render.figures import explanation_cells, explanation_figures, figure_bundle

BASE = {"name": "baseline", "method": "none", "status": "ok", "tok_s": 100.0, "ms_per_token": 10.0}


def spec(name: str, k: int, cycle_ms: float | None, accept_len: float | None, tok_s: float | None,
         **extra: Any) -> dict[str, Any]:
    return {"name": name, "method": "eagle3", "status": "ok", "steps": k, "cycle_ms": cycle_ms,
            "accept_len": accept_len, "tok_s": tok_s, **extra}


def tau(a: float, k: int) -> float:
    """Leviathan et al.: expected tokens per cycle, written out independently of spectrial.analysis."""
    return sum(a ** i for i in range(k + 1))


def test_break_even_hand_worked() -> None:
    # 15 ms cycle / 10 ms per baseline token = 1.5 tokens; accept 2.0 pays by 0.5.
    # 25 ms cycle / 10 ms = 2.5 tokens; accept 2.4 falls 0.1 short.
    e = explain([BASE, spec("fast", 2, 15.0, 2.0, 133.3), spec("slow", 3, 25.0, 2.4, 96.0)])
    t = e.section("Break-even").table.set_index("arm")
    assert t.loc["fast", "break_even_accept_len"] == pytest.approx(1.5)
    assert t.loc["fast", "margin"] == pytest.approx(0.5)
    assert t.loc["fast", "pays"] == "yes" and t.loc["slow", "pays"] == "no"
    assert t.loc["slow", "break_even_accept_len"] == pytest.approx(2.5)
    assert t.loc["slow", "speedup"] == pytest.approx(0.96)
    assert "**does not pay**" in e.section("Break-even").text
    assert e.problems == []


def test_alpha_from_accept_len_follows_published_relation() -> None:
    # Arms whose accept lengths are tau(0.7, k): the alpha spectrial reports must be 0.7 at each depth.
    arms = [BASE] + [spec(f"k{k}", k, 8.0 + k, tau(0.7, k), tau(0.7, k) / (8.0 + k) * 1000) for k in (1, 2, 4)]
    model = explain(arms).section("Cycle-cost model").table
    assert model["alpha"].tolist() == pytest.approx([0.7, 0.7, 0.7], abs=1e-3)


def test_acceptance_needed_single_depth_uses_measured_cycle() -> None:
    # One depth (k=3, 20 ms cycle): 150 tok/s needs tau = 150 * 20 / 1000 = 3.0 tokens per cycle;
    # the alpha reported must reproduce tau = 3 through the closed form. 250 tok/s needs 5 > k + 1: unreachable.
    arms = [BASE, spec("k3", 3, 20.0, 2.2, 110.0)]
    e = explain(arms, target_tok_s=150)
    row = e.section("Acceptance needed").table.iloc[0]
    assert row["basis"] == "measured cycle" and row["accept_len_150_tok_s"] == pytest.approx(3.0)
    assert tau(row["alpha_150_tok_s"], 3) == pytest.approx(3.0, abs=1e-3)
    assert row["max_tok_s"] == pytest.approx(200.0)  # (k + 1) / 20 ms
    assert "only depth k=3 was measured" in e.section("Cycle-cost model").text
    far = explain(arms, target_tok_s=250).section("Acceptance needed")
    assert pd.isna(far.table.iloc[0]["alpha_250_tok_s"]) and "out of reach" in far.text


H200_SWEEP = [  # LLAMACPP.md "A finer H200 sweep": n_max, synthetic a, tok/s, mean len, cycle ms, draft ms/cycle
    (1, 0.6, 165.8, 1.55, 9.31, 0.74), (2, 0.6, 197.5, 1.97, 9.94, 1.39), (3, 0.6, 190.8, 2.04, 10.65, 1.98),
    (4, 0.6, 201.5, 2.38, 11.76, 2.67), (6, 0.6, 188.0, 2.52, 13.35, 3.84), (1, 0.9, 210.2, 1.90, 9.00, 0.75),
    (2, 0.9, 269.6, 2.71, 10.01, 1.38), (3, 0.9, 304.7, 3.54, 11.57, 2.03), (4, 0.9, 307.5, 3.98, 12.89, 2.71),
    (6, 0.9, 366.2, 5.20, 14.15, 3.86)]


def test_model_on_h200_sweep_matches_recorded_fit() -> None:
    """The model is fitted on the verdict's clock (accept length / tok/s: the cycle each arm's break-even is), worked
    out here by least squares and the closed form; LLAMACPP.md's 8.23 + 0.95 k ms (errors 2.7 % / 10.8 %) is the
    same sweep on the engine's clock, within 0.05 ms a cycle of it."""
    import numpy as np

    arms = [{"name": "baseline", "method": "none", "status": "ok", "tok_s": 187.1, "ms_per_token": 5.32}]
    arms += [spec(f"k{k}-a{a}", k, c, m, t, synthetic=True, synthetic_accept=a, draft_ms_per_cycle=d)
             for k, a, t, m, c, d in H200_SWEEP]
    e = explain(arms)
    fit = e.numbers.models["eagle3 synthetic"]
    ks = np.array([k for k, *_ in H200_SWEEP], dtype=float)
    cycles = np.array([m / t * 1000 for _, _, t, m, _, _ in H200_SWEEP])  # the decode rate's clock
    per_draft, fixed = np.polyfit(ks, cycles, 1)
    assert fit.fixed_ms == pytest.approx(fixed, abs=1e-6) and fit.per_draft_ms == pytest.approx(per_draft, abs=1e-6)
    assert fit.fixed_ms == pytest.approx(8.23, abs=0.05) and fit.per_draft_ms == pytest.approx(0.95, abs=0.005)
    errors = [abs(tau(a, k) / (fixed + per_draft * k) * 1000 / t - 1) for k, a, t, *_ in H200_SWEEP]
    err = e.section("Cycle-cost model").table["rel_error"].abs()
    assert err.median() == pytest.approx(float(np.median(errors)), abs=1e-4)
    assert err.max() == pytest.approx(max(errors), abs=1e-4)
    assert "drafting:" in e.section("Cycle-cost model").text  # draft/verify split fitted from draft_ms_per_cycle
    be = e.section("Break-even").table.set_index("arm")["break_even_accept_len"]
    # break-even = accept length / speed-up (= cycle / baseline ms per token, both on the decode rate's clock):
    # the table's rounded cycle 14.15 ms / 5.32 ms gives 2.660, its rates 5.20 / (366.2 / 187.1) give 2.657
    assert be["k6-a0.9"] == pytest.approx(5.20 / (366.2 / 187.1), abs=1e-3)
    assert be["k6-a0.9"] == pytest.approx(14.15 / 5.32, rel=0.005)


def test_fitted_model_reproduces_the_arms_it_was_fitted_on() -> None:
    # Arms generated from cycle = 6 + 0.5 k and alpha 0.8: the fit must return them exactly.
    arms = [BASE] + [spec(f"k{k}", k, 6 + 0.5 * k, tau(0.8, k), tau(0.8, k) / (6 + 0.5 * k) * 1000,
                          synthetic=True, synthetic_accept=0.8) for k in (1, 2, 3, 5)]
    e = explain(arms)
    t = e.section("Cycle-cost model").table
    assert e.numbers.models["eagle3 synthetic"].fixed_ms == pytest.approx(6.0)
    assert t["residual_ms"].abs().max() < 1e-6 and t["rel_error"].abs().max() < 1e-6
    assert t["predicted_tok_s"].tolist() == pytest.approx(t["tok_s"].tolist(), abs=0.01)


def test_roofline_from_the_case_record() -> None:
    case = load_case()
    later = [a for a in case.arms if a.session == "later"]
    e = explain(case.model_copy(update={"arms": later}))
    # 8 GPUs x 1792 GB/s = 14336 GB/s over 32e9 params x 4 bits / 8 = 16e9 bytes per token -> 896 tok/s
    assert e.numbers.roofline_tok_s == pytest.approx(896.0)
    assert e.numbers.baseline_roofline_fraction == pytest.approx(82.2 / 896.0)
    assert "9.2 %" in e.section("Roofline").text
    manual = explain([BASE], roofline=RooflineInputs(gpu="h200_sxm", params_b=8, bits_per_weight=16))
    assert manual.numbers.roofline_tok_s == pytest.approx(300.0)  # 4800 GB/s / 16 GB
    unknown = explain([BASE], roofline=RooflineInputs(gpu="no_such_gpu", params_b=8, bits_per_weight=16))
    assert "not in params/hardware.yaml" in unknown.section("Roofline").text


def test_roofline_says_what_the_record_lacks_and_which_fields_to_set(tmp_path: Any) -> None:
    """The H200 llama.cpp record names its GPU (nvidia-smi's "NVIDIA H200" = h200_sxm in params/hardware.yaml);
    the model's size is what it lacks, and the section names the record fields to set, not a Python call only.
    Set them in manifest.json (as the text says) and the roofline is computed: 8B at 16 bits on 4800 GB/s."""
    import shutil
    from pathlib import Path

    from spectrial.record.store import load_record

    run = Path(__file__).resolve().parents[2] / "outputs/examples/h200-llamacpp-8b/20261129-151515-h200-8b-nb02"
    text = explain(load_record(run)).section("Roofline").text
    assert "names its GPU (1 x NVIDIA H200 = `h200_sxm` in params/hardware.yaml)" in text
    assert "what is missing is the model's size: set `model_info.params_b` and `model_info.bits_per_weight`" in text
    assert "names no GPU" not in text and not text.startswith("Not computed: the record names no GPU")
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    m = json.loads((copy / "manifest.json").read_text())
    m["model_info"] = {"params_b": 8, "bits_per_weight": 16}
    (copy / "manifest.json").write_text(json.dumps(m))
    e = explain(load_record(copy))
    assert e.numbers.roofline_tok_s == pytest.approx(300.0) and "1 x NVIDIA H200 SXM" in e.section("Roofline").text
    cpu = Path(__file__).resolve().parents[2] / "outputs/examples/vllm-cpu/20261201-051233-02_eagle3-7e09"
    assert "names no GPU" in explain(load_record(cpu)).section("Roofline").text


BAD_INPUTS = {
    "baseline only": ([BASE], "No speculative arm completed"),
    "failed arm": ([BASE, {"name": "e3", "method": "eagle3", "status": "failed", "reason": "server exited 1"}],
                   "server exited 1"),
    "zero verify steps": ([BASE, spec("e3", 2, None, None, 50.0, verify_steps=0)], "0 verify steps"),
    "accept length below 1": ([BASE, spec("e3", 2, 12.0, 0.4, 50.0)], "0.4 < 1"),
    "no baseline": ([spec("e3", 2, 12.0, 1.8, 150.0)], "No baseline arm"),
    "failed run, no arms": ({"status": "failed", "reason": "GPUs busy", "arms": []}, "GPUs busy"),
    "arms missing": ({"status": "ok"}, "no list of arms"),
    "interrupted run": ({"status": "running", "arms": [BASE]}, "still marked **running**"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_is_reported_not_raised(case: str) -> None:
    source, expected = BAD_INPUTS[case]
    e = explain(source)
    assert isinstance(e, Explanation)
    text = e.markdown()
    assert expected in text
    assert [s.title for s in e.sections] == ["Input check", "Break-even", "Cycle-cost model", "Acceptance needed",
                                             "Roofline"]
    cells = explanation_cells(e)
    assert cells and all(c["cell_type"] in ("markdown", "code") for c in cells)
    json.dumps([figure_bundle(f) for f in explanation_figures(e)])


def test_sessions_are_flagged_when_mixed() -> None:
    e = explain(load_case())
    assert any("2 sessions (earlier, later)" in p for p in e.problems)


def test_figure_output_is_deterministic() -> None:
    arms = [BASE, spec("a", 2, 15.0, 2.0, 133.3), spec("b", 4, 19.0, 2.6, 136.8)]
    first = [json.dumps(figure_bundle(f), sort_keys=True) for f in explanation_figures(explain(arms))]
    second = [json.dumps(figure_bundle(f), sort_keys=True) for f in explanation_figures(explain(arms))]
    assert first == second and len(first) == 3
    bundle = json.loads(first[0])
    assert {"application/vnd.plotly.v1+json", "text/plain"} <= set(bundle)  # (+ text/html for exported HTML)
    assert "Throughput a cycle can give" in bundle["text/plain"]


def test_implausible_fit_and_recorded_verdict() -> None:
    # Two noisy depths: 4 ms at k=1 and 17 ms at k=3 give a negative fixed cost (-2.5 ms).
    # k1's record holds its speed-up interval (and a verdict that contradicts it): the verdict is the interval's,
    # so it cannot disagree with the speed-up; k3 has a single value and no interval.
    arms = [BASE, spec("k1", 1, 4.0, 1.9, 475.0, verdict="slower", speedup_ci_low=4.5, speedup_ci_high=5.0),
            spec("k3", 3, 17.0, 3.1, 3.1 / 17.0 * 1000)]  # cycles on the decode rate's clock: accept length / tok/s
    e = explain(arms)
    assert e.numbers.models["eagle3"].fixed_ms == pytest.approx(-2.5)
    assert "implausible fit" in e.section("Cycle-cost model").text
    t = e.section("Break-even").table.set_index("arm")
    assert t.loc["k1", "verdict"] == "faster" and t.loc["k1", "pays"] == "yes"
    assert t.loc["k1", "break_even_ci_low"] == pytest.approx(1.9 / 5.0, abs=1e-3)
    assert t.loc["k3", "verdict"] == "single value: no spread" and t.loc["k3", "pays"] == "yes"
