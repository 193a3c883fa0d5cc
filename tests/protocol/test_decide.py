"""`decide:` — interleave rounds of starts until every speculative arm is decided by a confidence sequence over the
paired rounds (spectrial.analysis.sequential; its validity by simulation is tests/analysis/test_sequential.py), on real llama.cpp;
and concurrency that is real: engine slots follow the requested concurrency, or the launch says why not."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from consistency import check_run

from spectrial.errors import ConfigError
from spectrial.params import load_params, parse_overrides
from spectrial.protocol.plan import dry_run
from spectrial.protocol.trial import run_trial
from spectrial.record.store import load_record

LOCAL = Path(__file__).resolve().parents[2] / "params" / "local.yaml"


def test_decide_parameters() -> None:
    p = load_params(LOCAL, {"decide": True})
    assert p.decide is not None and p.decide.max_rounds == 20 and p.decide.margin is None
    assert load_params(LOCAL, {"decide": False}).decide is None
    q = load_params(LOCAL, {"decide": {"margin": 0.03, "max_rounds": 8}})
    assert q.decide.margin == 0.03 and q.decide.max_rounds == 8
    with pytest.raises(ConfigError, match="decide: needs order interleaved or random"):
        load_params(LOCAL, {"decide": True, "order": "blocked"})
    with pytest.raises(ConfigError, match="max_rounds"):
        load_params(LOCAL, {"decide": {"min_rounds": 5, "max_rounds": 3}})
    with pytest.raises(ConfigError, match=r"decide.rounds: unknown parameter \(did you mean 'min_rounds' or "
                                          r"'max_rounds'\?\); allowed here: history, margin, max_minutes"):
        load_params(LOCAL, {"decide": {"rounds": 3}})
    # `-p decide=true -p decide.max_minutes=7` (either order): decide's defaults with one setting changed
    for over in (["decide=true", "decide.max_minutes=7"], ["decide.max_minutes=7", "decide=true"]):
        r = load_params(LOCAL, parse_overrides(over))
        assert r.decide is not None and r.decide.max_minutes == 7 and r.decide.max_rounds == 20
    with pytest.raises(ConfigError, match="repeats"):
        load_params(LOCAL, {"decide": {"repeats": 0}})


def test_llamacpp_slots_follow_the_concurrency() -> None:
    """-np follows concurrency and -c keeps each slot's context; fewer slots than streams is said at launch."""
    arms = dry_run(load_params(LOCAL, {"concurrency": 4}))
    argv = arms[0].argv
    assert argv[argv.index("-np") + 1] == "4" and argv[argv.index("-c") + 1] == str(1024 * 4)
    assert arms[0].notes == []
    with pytest.raises(ConfigError) as exc:  # issue 27: bad input, named, before anything starts
        dry_run(load_params(LOCAL, {"concurrency": 4, "engine_config.parallel": 2}))
    assert exc.value.parameter == "concurrency" and "engine_config.parallel" in str(exc.value)
    assert "validity.allow_queue" in exc.value.hint
    few = dry_run(load_params(LOCAL, {"concurrency": 4, "engine_config.parallel": 2, "validity.allow_queue": True}))
    argv = few[0].argv
    assert argv[argv.index("-np") + 1] == "2"
    assert any("concurrency 4 but the server runs 2 request(s) at once" in n for n in few[0].notes)
    assert "# note: concurrency 4" in few[0].display
    one = dry_run(load_params(LOCAL))[0].argv
    assert one[one.index("-np") + 1] == "1" and one[one.index("-c") + 1] == "1024"


def test_vllm_and_sglang_name_their_slot_limits(tmp_path: Path) -> None:
    from spectrial.engines import get_engine
    from spectrial.hosts.local import LocalHost

    for engine, cfg, words in (("vllm", {"max_num_seqs": 2}, "--max-num-seqs"),
                               ("sglang", {"max_running_requests": 2}, "--max-running-requests")):
        data = {"engine": engine, "model": str(tmp_path), "concurrency": 8, "engine_config": cfg,
                "arms": [{"name": "baseline"}]}
        eng = get_engine(engine, load_params(data=data), LocalHost())
        eng.resolve_dry()
        with pytest.raises(ConfigError, match=words):
            eng.launch_spec(eng.params.arms[0])
        p = load_params(data={**data, "validity": {"allow_queue": True}})
        eng = get_engine(engine, p, LocalHost())
        eng.resolve_dry()
        spec = eng.launch_spec(p.arms[0])
        assert words in spec.argv and any(words in n and "queue" in n for n in spec.notes), spec.notes


@pytest.mark.slow
def test_a_decide_run_on_llamacpp_stops_by_itself(tiny_params, tmp_path):
    """Rounds of one start of the baseline and of each undecided arm until every speculative arm is settled or the
    round budget is spent; the record says how many starts and why; each arm's interval is its sequence at its last
    look, the point estimate the same pair's, the verdict and pays follow it, and the record's readers agree. A
    second run on the same host leans on the first one's spread (decisions from round 2) and says so."""
    params = {**tiny_params, "repeats": 5, "max_tokens": 32,
              "arms": [{"name": "baseline"}, {"name": "draft", "method": "draft"}],
              "decide": {"max_rounds": 9, "max_minutes": 8}}
    result = run_trial(load_params(data=params), progress=False, raise_on_failure=False)
    m = load_record(result.run_dir)
    d = m.decide
    assert d is not None and 3 <= d.rounds <= 9 and d.starts == 2 * d.rounds
    assert d.stopped.startswith(("decided after", "start budget", "time budget")), d.stopped
    assert len([s for s in m.starts if s.arm == "draft"]) == d.rounds
    assert m.plan is not None and m.plan.design == "decide" and m.plan.first_decision_round == 3
    seq = d.arms[0]
    assert seq.arm == "draft" and seq.first_look == 3 and len(seq.looks) == d.rounds
    # a look after each round; the pair count grows by one in a round whose two starts both measured (a start that
    # measured nothing, e.g. on a loaded machine, leaves that round unpaired), and the arm's rounds are the pairs
    measured = {(s.arm, s.restart) for s in m.starts if any(w.requests_ok for w in s.windows)}
    steps = [b["n"] - a["n"] for a, b in zip([{"n": 0}, *seq.looks], seq.looks, strict=False)]
    assert steps == [int(("baseline", i) in measured and ("draft", i) in measured) for i in range(d.rounds)], (
        steps, sorted(measured))
    assert seq.rounds == seq.looks[-1]["n"] > 0
    draft = m.arm("draft")
    assert draft.ci_basis.startswith("group-sequential repeated intervals over")
    if seq.ci_low is not None:
        assert (draft.speedup_ci_low, draft.speedup_ci_high) == (seq.ci_low, seq.ci_high)
        assert draft.speedup == seq.estimate and seq.ci_low <= seq.estimate <= seq.ci_high
    expected = {"faster": "faster", "slower": "slower"}.get(seq.status, "not distinguishable at this noise")
    assert draft.verdict == expected
    if d.stopped.startswith("decided"):
        assert seq.status in ("faster", "slower", "equivalent") and seq.decided_at == d.rounds
        assert math.isfinite(seq.ci_low) and math.isfinite(seq.ci_high)
    check_run(result.run_dir)
    again = run_trial(load_params(data=params), progress=False, raise_on_failure=False)
    m2 = load_record(again.run_dir)
    d2 = m2.decide
    why = (d2.history, m.status, m.reason, m.fingerprint_key, m2.fingerprint_key, m.started_at, m2.started_at)
    assert d2.prior_df == d.rounds * 2 - 2 and d2.prior_sd_log > 0, why  # baseline and draft: n - 1 each
    assert d2.arms[0].first_look == 2 and m2.plan.first_decision_round == 2
    assert "earlier run(s)" in d2.history and m.fingerprint_key in d2.history
    assert "prior spread" in d2.method
    check_run(again.run_dir)
