"""The guided search as a pure function: `decide(view)` reads a frozen view of the sweep and returns the next step
(`Measure` or `Stop`, with why); the same view gives the same step, and the view is never changed."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from spectrial.sweep import World, load_sweep_params
from spectrial.sweep.guided import CONFIRMED, Measure, Stop, SweepView, decide, probe_settings
from spectrial.sweep.model import MeasuredPoint, fit_sweep_model
from spectrial.sweep.params import Setting, SweepParams

WORLD = World(fixed_ms=8.0, per_draft_ms=0.9, real_p1=0.7, real_decay=0.8)


def sweep() -> SweepParams:
    return load_sweep_params(data={"name": "world", "model": "world:target", "draft": "world:draft",
                                   "grid": {"steps": [1, 2, 3, 4, 6, 8], "synthetic_accept": [0.6, 0.9],
                                            "concurrency": [1, 2]}}, overrides={"strategy": "guided"})


def view(p: SweepParams, measured: list[Setting], tried: list[Setting] | None = None) -> SweepView:
    """A view of `p` with `measured` measured exactly as WORLD says (CI 2 % below), `tried` started too."""
    levels = tuple(p.concurrency_levels())
    pts = tuple(MeasuredPoint(steps=s.steps, topk=s.topk, k=s.k, scenario=s.synthetic_accept, concurrency=c,
                              tok_s=WORLD.tok_s(s, c), accept_len=WORLD.accept_len(s), cycle_ms=WORLD.cycle_ms(s, c),
                              per_position=tuple(WORLD.per_position(s)), verify_steps=100.0,
                              tok_s_ci_low=0.98 * WORLD.tok_s(s, c), name=p.arm(s).name)
                for s in p.settings() if s in measured for c in levels)
    return SweepView(sweep=p, settings=tuple(p.settings()), levels=levels, measured=pts,
                     tried=frozenset([*measured, *(tried or [])]),
                     baseline_cycle_ms={c: WORLD.cycle_ms(None, c) for c in levels}, n_starts=1 + len(measured),
                     model=fit_sweep_model(pts))


def decided(v: SweepView) -> Measure | Stop:
    """decide(v), checked to be pure: the view is unchanged and a second call gives the same step."""
    before = copy.deepcopy(v)
    first = decide(v)
    assert v == before and v.sweep.model_dump() == before.sweep.model_dump()
    assert decide(v) == first and decide(before) == first
    return first


def test_the_first_probes_are_chosen_before_any_measurement() -> None:
    p = sweep()
    step = decided(view(p, []))
    assert isinstance(step, Measure) and step.phase == "probe" and step.model is None and not step.predictions
    assert [x.setting for x in step.picks] == probe_settings(p)
    assert all(x.reason.startswith("informative setting: depth") for x in step.picks)


def test_the_search_asks_for_a_second_k_then_confirms() -> None:
    p = sweep()
    deepest = [s for s in p.settings() if s.steps == 8 and s.synthetic_accept == 0.9]
    step = decided(view(p, deepest))
    assert isinstance(step, Measure) and step.phase == "probe" and len(step.picks) == 1
    (pick,) = step.picks
    assert pick.setting.k != 8 and pick.setting.synthetic_accept == 0.6  # the group of lowest acceptance
    assert pick.reason.startswith("a second k for the cycle-cost model") and step.model is not None
    two_k = [*deepest, pick.setting]
    nxt = decided(view(p, two_k))  # both scenarios measured, a cycle model: what could beat the best
    assert isinstance(nxt, Measure) and nxt.phase == "confirm" and nxt.picks[0].setting not in two_k
    assert "predicted" in nxt.picks[0].reason and nxt.score is not None and nxt.score > 1


def test_a_confirmation_carries_its_predictions_and_the_search_stops_confirmed() -> None:
    p = sweep()
    measured: list[Setting] = []
    for _ in range(len(p.settings())):  # play the search against the exact world until it stops
        step = decided(view(p, measured))
        if isinstance(step, Stop):
            break
        if step.phase == "confirm":
            (pick,) = step.picks
            assert step.score is not None and step.score > 0 and set(step.predictions) == {1, 2}
            for c, pred in step.predictions.items():
                assert pred.tok_s == pytest.approx(WORLD.tok_s(pick.setting, c), rel=0.05)
                assert pred.margin is not None and pred.made_after_starts == 1 + len(measured)
        measured += [x.setting for x in step.picks]
    assert isinstance(step, Stop) and step.reason in (CONFIRMED, "every setting measured")
    assert len(measured) < len(p.settings())  # an exact world: the model spares some starts
    for sc in p.scenarios():  # and the true best of every scenario and level was measured
        for c in p.concurrency_levels():
            best = max((s for s in p.settings() if s.synthetic_accept == sc), key=lambda s: WORLD.tok_s(s, c))
            assert best in measured, (sc, c, best)


def test_every_setting_tried_stops_and_a_failed_start_counts_as_tried() -> None:
    p = sweep()
    settings = p.settings()
    assert decided(view(p, settings[:-1], tried=settings[-1:])) == Stop("every setting measured")
    v = view(p, settings[:2])
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.n_starts = 0  # type: ignore[misc]
