"""The committed sweep records under outputs/examples load as typed records (best, decisions, budget, model) and
give the numbers they gave before those became models: each figure below was read from the files (and the verdict
from `spectrial.sweep.figures.verdict`, as it then was) before the change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectrial.readers import sweep as sweep_reader
from spectrial.record.store import load_record
from spectrial.schema import BestRecord, SweepBudget, SweepDecision
from spectrial.sweep.result import budget_text, not_measured, sweep_status

EXAMPLES = Path(__file__).resolve().parents[2] / "outputs" / "examples"

# run folder -> (status, [(scenario, concurrency, best, tok_s, tok_s_ci_low, ratio_to_runner_up, verdict)],
#                budget (restarts, grid_restarts, wall_s, settings_measured, settings, stopped_by),
#                model (margin, {level: (fixed_ms, per_draft_ms)}, in-sample median |error|),
#                (grid settings, start of the grid decision's reason))
EXPECTED = {
    "20261129-151623-h200-8b-sweep": (
        "ok",
        [(None, 1, "eagle3-s1", 109.60147613846921, 109.28254509190663, 1.3686348942732582,
          "confirmed: faster than the runner-up"),
         (0.9, 1, "eagle3-s6-a0.9", 383.4430782509582, 349.7366688610928, 1.0077425427839772,
          "tied with eagle3-s5-a0.9 within the noise (not distinguishable at this noise)"),
         (0.6, 1, "eagle3-s2-a0.6", 206.7323399911956, 205.84901822127077, 1.0024815987949531,
          "tied with eagle3-s3-a0.6 within the noise (not distinguishable at this noise)"),
         (0.75, 1, "eagle3-s6-a0.75", 270.3608203701505, 252.32260484004232, 1.0173995742082143,
          "tied with eagle3-s5-a0.75 within the noise (not distinguishable at this noise)")],
        (21, 21, 236.49, 20, 20, None),
        (0.03, {1: (8.388839296142478, 0.8607023447314057)}, 0.025090202005920548),
        (20, "measure all 20 settings and the baseline, 1 start(s) each, order interleaved")),
    "h200-sglang-8b-sweep-083946": (
        "ok",
        [(0.9, 1, "eagle3-s6-a0.9", 726.5625743925162, 725.3202056178444, 1.3274146368326685,
          "confirmed: faster than the runner-up")],
        (4, 4, 364.95, 3, 3, None),
        (0.03, {1: (5.530037738290421, 0.2498174796252483)}, 0.003333820899436568),
        (3, "measure all 3 settings and the baseline, 1 start(s) each, order interleaved")),
    "h200-sglang-8b-sweep-082758": (
        "failed",
        [(0.9, 1, None, None, None, None, "no setting measured")],
        (3, 4, 383.88, 2, 3, "time budget: 384 s used of 444 s, and a start takes ~128 s"),
        (0.03, {}, None),
        (3, "measure all 3 settings and the baseline, 1 start(s) each, order interleaved")),
}

VERDICT_083946 = (
    "The grid sweep used 4 server starts (a full grid needs 4) and 365 s; it measured 3 of 3 settings and stopped "
    "because: the plan was done. At concurrency 1 the baseline decoded 211.0 tok/s per stream. synthetic a=0.9, "
    "concurrency 1: best **eagle3-s6-a0.9** at 726.6 tok/s [725.3, 740.4], 3.44x the baseline (faster); confirmed: "
    "faster than the runner-up (ratio to eagle3-s3-a0.9 1.327 [1.286, 1.368]). The fitted model reproduces the "
    "measured points within 0.3 % (median; worst 1.1 %).")


# example folders written after the typed records, each checked by its own test
LATER = {"llamacpp-load-crossover": "tests/sweep/test_load_crossover.py",
         "llamacpp-rate-crossover": "tests/sweep/test_request_rates.py",
         "h100-sglang-rate-crossover": "tests/sweep/test_request_rates.py",
         "vllm-cpu-load-policy": "tests/sweep/test_load_crossover.py",
         "h100-sglang": "tests/sweep/test_sweep_resume.py"}


def committed_sweeps(later: bool = False) -> list[Path]:
    """Every committed run folder whose manifest is a sweep's (those of LATER's folders only with `later`)."""
    return sorted(p.parent for p in EXAMPLES.rglob("manifest.json")
                  if json.loads(p.read_text()).get("kind", "").startswith("sweep")
                  and (later or p.parent.parent.name not in LATER))


def test_every_committed_sweep_record_is_checked() -> None:
    assert sorted(p.name for p in committed_sweeps()) == sorted(EXPECTED)
    assert {p.parent.name for p in committed_sweeps(later=True)} - {p.parent.name for p in committed_sweeps()} \
        == set(LATER)


@pytest.mark.parametrize("run", committed_sweeps(), ids=lambda p: p.name)
def test_a_committed_sweep_record_gives_the_same_numbers(run: Path) -> None:
    status, best, budget, model, (n_settings, grid_reason) = EXPECTED[run.name]
    m = load_record(run, settle=False)
    assert m.status == status and sweep_status(m) == status
    assert all(isinstance(b, BestRecord) for b in m.best) and isinstance(m.budget, SweepBudget)
    assert [(b.scenario, b.concurrency, b.best, b.tok_s, b.tok_s_ci_low, b.ratio_to_runner_up, b.verdict)
            for b in m.best] == best
    assert m.decisions == [SweepDecision(phase="grid", setting=None, reason=grid_reason)]
    b = m.budget
    assert (b.restarts, b.grid_restarts, b.wall_s, b.settings_measured, b.settings, b.stopped_by) == budget
    assert b.not_measured is None and b.start_estimate is None  # written before those existed
    margin, cycle, in_sample = model
    assert m.model is not None and m.model.margin == margin
    assert {c: (f.fixed_ms, f.per_draft_ms) for c, f in m.model.cycle.items()} == cycle
    assert m.model.in_sample_rel_error is not None and m.model.in_sample_rel_error.median_abs == in_sample
    assert m.grid is not None and len(m.grid.settings) == n_settings and m.grid.concurrency == [1]
    for p in m.points:  # the final model's prediction of every point it could predict, typed
        if p.final_prediction is not None:
            assert p.final_prediction.tok_s > 0 and p.final_prediction.accept_len >= 1
    assert sweep_reader.verdict(m).startswith(f"The grid sweep used {budget[0]} server starts")


def test_committed_records_read_in_words_as_before() -> None:
    sglang = load_record(EXAMPLES / "h200-sglang" / "h200-sglang-8b-sweep-083946", settle=False)
    assert sweep_reader.verdict(sglang) == VERDICT_083946
    llama = load_record(EXAMPLES / "h200-llamacpp-8b" / "20261129-151623-h200-8b-sweep", settle=False)
    assert "best **eagle3-s1** at 109.6 tok/s [109.3, 111.9], 0.57x the baseline (slower)" in sweep_reader.verdict(llama)
    assert sweep_reader.verdict(llama).endswith("within 2.5 % (median; worst 12.0 %).")
    stopped = load_record(EXAMPLES / "h200-sglang" / "h200-sglang-8b-sweep-082758", settle=False)
    (left,) = not_measured(stopped)  # an older record: what it skipped, from its points
    assert left.setting == "eagle3-s6-a0.9" and left.could_beat_at == [1] and left.predicted[0].tok_s is None
    assert budget_text(stopped) == (
        "stopped by the time budget: 384 s used of 444 s, and a start takes ~128 s; 1 of 3 settings not measured; "
        "1 could be faster than the best measured: eagle3-s6-a0.9 (no prediction: the model cannot predict it, so "
        "it could be faster)")
