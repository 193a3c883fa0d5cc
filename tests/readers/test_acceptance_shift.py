"""Accept length must not depend on parallelism (issue 39 item 7; spectrial.record.acceptance): arms that share
draft, depth, sampling and workload accept alike whatever else differs; a shift beyond both intervals is a bug
signal that `spectrial diff` puts first. For real on llama-server: the same draft arm with 1 and 2 slots (`-np`)
accepts the same; a run whose engine is made to accept every draft behind the arm's back (`--spec-synth-rates` in
the arm's extra_args: its speculative settings unchanged, as an engine bug would leave them) is flagged."""

from __future__ import annotations

import pytest

from spectrial.params import load_params
from spectrial.protocol.trial import run_trial
from spectrial.readers.diff import diff_runs, format_findings
from spectrial.record.acceptance import AcceptShift, accept_shifts
from spectrial.record.store import load_record, read_requests
from spectrial.schema import RequestRecord


def _trial(tiny_params, tmp_path, name, draft_args=(), **engine_config):
    data = {**tiny_params, "output_dir": str(tmp_path / name), "repeats": 6, "max_tokens": 32,
            "arms": [{"name": "baseline"}, {"name": "draft", "method": "draft", "extra_args": list(draft_args)}],
            "engine_config": {**tiny_params["engine_config"], **engine_config}}
    return run_trial(load_params(data=data), progress=False).run_dir


def test_the_shift_text_and_its_three_outcomes():
    shift = AcceptShift(arm="eagle3", a=2.35, b=1.48, ci_a=(2.31, 2.39), ci_b=(1.45, 1.51), n_a=40, n_b=40,
                        differs_in=["eagle3: configuration: --dp '1' vs '8'"], flagged=True)
    assert shift.text().startswith("eagle3: accept length 2.350 [2.310, 2.390] (40 requests) -> 1.480")
    assert "bug signal" in shift.text() and "--dp '1' vs '8'" in shift.text()
    assert "overlap" in shift.model_copy(update={"flagged": False}).text()
    assert "no interval" in shift.model_copy(update={"flagged": None, "ci_b": None}).text()


@pytest.mark.slow
def test_acceptance_across_slots_is_the_same_and_a_hidden_change_is_flagged(tiny_params, tmp_path):
    one = _trial(tiny_params, tmp_path, "np1", parallel=1)
    two = _trial(tiny_params, tmp_path, "np2", parallel=2)
    forced = _trial(tiny_params, tmp_path, "forced", draft_args=["--spec-synth-rates", "1,1"], parallel=2)
    a, b, c = (load_record(r) for r in (one, two, forced))
    (same,) = accept_shifts(a, b, read_requests(one), read_requests(two))
    assert same.arm == "draft" and same.n_a == same.n_b == 6 and same.flagged is False, same
    assert any("-np" in d for d in same.differs_in), same.differs_in  # the slots are what differs
    (moved,) = accept_shifts(a, c, read_requests(one), read_requests(forced))
    assert moved.flagged is True and moved.b == pytest.approx(3.0) and moved.a < 2.9, moved
    assert any("--spec-synth-rates" in d for d in moved.differs_in), moved.differs_in
    text = format_findings(diff_runs(one, forced))
    first = text.splitlines()[2]  # after the comparability and change statements
    assert first.startswith("[acceptance] draft: accept length") and "bug signal" in first, text
    assert "[acceptance]" not in format_findings(diff_runs(one, two))
    # the gate and the history say it too: whatever the gated figures say, the shift is a note of the gate's record,
    # and an issue of the history beside the run that moved
    from spectrial.gate.params import GateTolerances
    from spectrial.gate.run import run_gate
    from spectrial.readers.history import load_history

    gate = run_gate(forced, GateTolerances(), reference=one)
    assert any(n.startswith("draft: accept length") and "bug signal" in n for n in gate.notes), gate.notes
    assert not any("bug signal" in n for n in run_gate(two, GateTolerances(), reference=one).notes)
    issues = load_history(tmp_path).issues
    flagged = issues[issues["problem"].str.contains("bug signal")]
    assert list(zip(flagged["source"], flagged["item"], strict=True)) == [(f"forced/{forced.name}", "draft")], issues
    # an arm whose own settings differ (here its recorded synthetic acceptance) is another experiment, not a shift
    declared = c.model_copy(deep=True)
    declared.arm("draft").synthetic_accept = 1.0
    assert accept_shifts(a, declared, read_requests(one), read_requests(forced)) == []


def test_an_arm_without_per_request_counts_has_no_verdict(tiny_params):
    from spectrial.schema import ArmRecord, Manifest

    arms = [ArmRecord(name="baseline", status="ok"), ArmRecord(name="d", method="draft", status="ok")]
    m = Manifest(run_id="r", arms=arms)
    counted = [RequestRecord(index=i, arm="d", server_draft_n=4, server_draft_n_accepted=2, server_verify_steps=2)
               for i in range(4)]
    (s,) = accept_shifts(m, m.model_copy(update={"run_id": "s"}), {"d": counted}, {"d": [RequestRecord(arm="d")]})
    assert s.flagged is None and s.b is None and s.a == pytest.approx(2.0)
