"""Issue 40 item 2 for real on llama-server: a trial whose workload has context-length buckets measures each bucket
in its own window of every start, and its record gives, per bucket, prompt tokens as sent, accept length,
per-position acceptance and the speed-up over the baseline's same bucket; the headline says it across buckets. The
committed example records of the same at full size: outputs/examples/llamacpp-context and vllm-cpu-context."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectrial.measure.workloads import BUCKET_LOW
from spectrial.params import load_params
from spectrial.protocol.trial import run_trial
from spectrial.readers.context import context_curves
from spectrial.readers.headline import headline
from spectrial.record.store import load_record
from spectrial.schema import bucket_tokens

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_real_context_trial_measures_each_bucket_in_its_own_window(tiny_params, tmp_path):
    p = load_params(data={**tiny_params, "arms": tiny_params["arms"][:2], "steps": 3, "repeats": 3,
                          "request_format": "completion", "engine_config": {"threads": 1, "ctx_size": 1024},
                          "workload": [{"source": "sharegpt", "prompt_tokens": [512, 128], "n": 2}]})
    run_trial(p, progress=False, run_id="ctx")
    m = load_record(tmp_path / "outputs" / "ctx")
    assert m.status == "ok", m.reason
    for s in m.starts:  # one window per bucket, shortest first, each drawing only its bucket's prompts
        assert [w.category for w in s.windows] == ["ctx 128", "ctx 512"] and all(w.requests == 3 for w in s.windows)
    by = {a.name: {c.category: c for c in a.categories} for a in m.arms}
    for cats in by.values():
        for cat, c in cats.items():
            t = bucket_tokens(cat)
            assert c.requests_ok == 3 and BUCKET_LOW * t <= c.prompt_tokens <= t, (cat, c.prompt_tokens)
    for c in by["draft"].values():
        # the bucket's accept length (its requests' own counts) and its per-position acceptance (the log of its
        # own windows) are two readings of the same cycles
        assert c.accept_len is not None and len(c.per_position) == 3
        assert abs(1 + sum(c.per_position) - c.accept_len) < 0.05, (c.accept_len, c.per_position)
        assert c.speedup is not None and c.speedup_ci_low is not None and c.baseline_arm == "baseline"
    (curve,) = context_curves(m)
    assert [b.tokens for b in curve.buckets] == [128, 512]
    assert any(line.startswith("draft: accept length") for line in headline(m).context)
    assert "Context: draft: accept length" in headline(m).text()


def _example(name: str):
    (run,) = [p.parent for p in (REPO / "outputs" / "examples" / name).glob("*/manifest.json")]
    return load_record(run, settle=False)


def test_the_committed_vllm_context_example_holds_the_counting_truth_at_every_length():
    """outputs/examples/vllm-cpu-context (params/examples/vllm-cpu-context.yaml, real vLLM 0.32.0 CPU build, this
    VM): the counting EAGLE-3 accepts one drafted token in three cycles whatever the text, so every bucket's accept
    length (vLLM's own counters around each request) is 4/3 up to the rounding of 32-token requests, position 1
    accepts ~1/3 and positions 2-3 nothing; the reader finds no collapse."""
    m = _example("vllm-cpu-context")
    (eagle,) = [a for a in m.arms if a.name == "eagle3"]
    cats = {c.category: c for c in eagle.categories}
    assert list(cats) == ["ctx 128", "ctx 512", "ctx 1536"]
    for cat, c in cats.items():
        assert abs(c.accept_len - 4 / 3) < 0.05 and abs(c.per_position[0] - 1 / 3) < 0.05, (cat, c)
        assert c.per_position[1:] == [0.0, 0.0]
        assert BUCKET_LOW * bucket_tokens(cat) <= c.prompt_tokens <= bucket_tokens(cat)
    (curve,) = context_curves(m)
    assert curve.collapses_at is None and "no collapse over the measured range" in curve.text()
    for s in m.starts:
        assert [w.category for w in s.windows] == list(cats)


def test_the_committed_llamacpp_context_example_reads_as_recorded():
    """outputs/examples/llamacpp-context (params/examples/llamacpp-context.yaml, this VM, 2 cores, threads 1): the
    tiny draft-simple pair on real ShareGPT at 256, 1024 and 3072 prompt tokens, two starts per arm."""
    m = _example("llamacpp-context")
    (curve,) = context_curves(m)
    assert [b.tokens for b in curve.buckets] == [256, 1024, 3072]
    assert curve.text() == ("draft: accept length 3.98 at 256 prompt tokens, 4.35 at 3072; no collapse over the "
                            "measured range; pays at 3072 tokens")
    for b in curve.buckets:  # two readings of the same cycles: the requests' counts and the windows' log lines
        assert abs(1 + sum(b.per_position) - b.accept_len) < 0.05, b
    assert len(m.starts) == 4 and all(len(s.windows) == 3 for s in m.starts)


def test_the_report_shows_the_context_section_and_figure():
    from spectrial.readers.render.plots import context_figure
    from spectrial.readers.render.report import PLOTLY_MIME, context_cells

    m = _example("llamacpp-context")
    md, fig_cell = context_cells(m)
    assert md.source.startswith("## Across context lengths") and "- draft: accept length 3.98" in md.source
    assert PLOTLY_MIME in fig_cell.outputs[0]["data"]
    fig = context_figure(context_curves(m))
    acc, up = fig.data
    assert list(acc.y) == [b.accept_len for b in context_curves(m)[0].buckets] and up.error_y.array is not None
