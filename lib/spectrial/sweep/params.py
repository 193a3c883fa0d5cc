"""Sweep parameters: a trial's parameters plus the grid, the strategy and the budget.

A sweep params file holds every trial key at the top level (or under `trial:`) plus the sweep keys of
`SweepParams` (`grid`, `method`, `strategy`, `budget_s`, `budget_restarts`, `confirm_level`, `margin_floor`).
The settings are the product of `grid:`'s lists, or, when the file lists speculative `arms` instead (a trial
params file used as it is), exactly those arms' settings (one method and draft; the baseline is always added).
Overrides are dotted as for trials (`-p grid.steps=[1,2,4]`, `-p repeats=2`, `-p engine_config.threads=1`).

Grid points are `Setting`s (steps, topk, draft tokens, synthetic acceptance) times load levels: concurrency levels
(a closed loop: `c` requests in flight, the next sent as one ends) and request-rate levels (`grid.request_rate`: an
open loop, each request sent at its seeded exponential arrival time, at most `grid.max_inflight` in flight).
What needs a server restart: every field of a `Setting`. What does not: the load level, which is only how the
client sends its requests, so one server start measures every level in turn.
llama.cpp's per-request `speculative.n_max` would let one start serve several depths, but this build
(commit 0c1e570, `tools/server/server-schema.cpp`) compiles those request fields out (`#if 0`) and
ignores them (tests/sweep/test_sweep.py checks this against the real server), so each depth is its own start.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from spectrial.engines.base import engine_class
from spectrial.errors import ConfigError
from spectrial.params import (
    Arm,
    Method,
    TrialParams,
    apply_override,
    did_you_mean,
    format_validation_error,
    read_params_yaml,
)
from spectrial.params import validate as validate_trial
from spectrial.schema import Load

Strategy = Literal["grid", "guided"]


class SweepGrid(BaseModel):
    """The values to sweep; an unset list takes the trial's own value (one point on that axis)."""

    model_config = ConfigDict(extra="forbid")

    steps: list[int] | None = Field(None, description="Draft depths (llama.cpp --spec-draft-n-max, SGLang "
                                                      "--speculative-num-steps).")
    topk: list[int] | None = Field(None, description="Draft tree top-k values (SGLang); llama.cpp: [1].")
    draft_tokens: list[int | None] | None = Field(
        None, description="Tokens verified per cycle (SGLang --speculative-num-draft-tokens); null = steps + 1, "
                          "the only value with topk 1.")
    concurrency: list[int] | None = Field(None, description="Concurrent request streams (batch sizes); all "
                                                            "levels are measured on each server start.")
    request_rate: list[float] | None = Field(
        None, description="Offered request rates, req/s: open-loop levels (seeded exponential arrivals, as `vllm "
                          "bench serve --request-rate`), measured on each server start after the concurrency levels, "
                          "at most `max_inflight` requests in flight.")
    max_inflight: int | None = Field(None, ge=2, description="Most requests in flight at a request-rate level (the "
                                                             "client's cap, as `vllm bench serve --max-concurrency`; "
                                                             "the engine's slots follow it). Default: the highest "
                                                             "concurrency level.")
    synthetic_accept: list[float | None] | None = Field(
        None, description="Per-token synthetic acceptance rates a (llama.cpp --spec-synth-rates a, a^2, ...; "
                          "SGLang SGLANG_SIMULATE_ACC_LEN; vLLM rejection_sample_method synthetic); "
                          "null = the draft's real acceptance. Each rate is a scenario with its own best setting.")

    @field_validator("steps", "topk", "concurrency")
    @classmethod
    def _positive(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(x < 1 for x in v)):
            raise ValueError("give a non-empty list of integers >= 1")
        return sorted(set(v)) if v is not None else None

    @field_validator("request_rate")
    @classmethod
    def _rates_positive(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and (not v or any(not 0 < x < 1e6 for x in v)):
            raise ValueError("give a non-empty list of request rates > 0, in requests per second (e.g. [1, 2, 4, 8])")
        return sorted(set(v)) if v is not None else None

    @field_validator("draft_tokens")
    @classmethod
    def _draft_tokens_ok(cls, v: list[int | None] | None) -> list[int | None] | None:
        if v is not None and (not v or any(x is not None and x < 2 for x in v)):
            raise ValueError("give a non-empty list of integers >= 2 (or null for steps + 1)")
        return v

    @field_validator("synthetic_accept")
    @classmethod
    def _rates_ok(cls, v: list[float | None] | None) -> list[float | None] | None:
        if v is not None and (not v or any(x is not None and not 0.0 <= x <= 1.0 for x in v)):
            raise ValueError("give a non-empty list of per-token rates in [0, 1] (or null)")
        return v


class SweepParams(BaseModel):
    """A sweep: the trial it varies (`trial`), the grid, how to search it and how much it may cost."""

    model_config = ConfigDict(extra="forbid")

    trial: TrialParams = Field(description="Host, engine, models, requests: everything a trial takes but arms.")
    grid: SweepGrid = Field(default_factory=SweepGrid, description="The settings and concurrency levels.")
    method: Method = Field("eagle3", description="Speculative method of every grid point (not 'none').")
    strategy: Strategy = Field("guided", description="'grid': measure every point. 'guided': baseline, a few "
                                                     "informative settings, fit the cycle-cost model and the "
                                                     "acceptance curve, then measure only what could be best. "
                                                     "Default 'guided', but 'grid' when the file lists "
                                                     "speculative arms (a trial file used as it is).")
    budget_s: float | None = Field(None, gt=0, description="Wall-clock budget in seconds, counted from the end "
                                                           "of preparation (builds, model files): no server start "
                                                           "begins that would be expected to end after it (a "
                                                           "start: the median warm start; the cold first start "
                                                           "counted once). A sweep it stops is `partial`.")
    budget_restarts: int | None = Field(None, ge=2, description="Most server starts (the baseline's included).")
    confirm_level: float = Field(0.9, gt=0.5, lt=1, description="Confidence level of the comparison between "
                                                                "the best setting and the runner-up.")
    policies: list[Arm] = Field(default_factory=list, description=(
        "The engines' own run-time depth control as arms (each with `policy`, `steps` the deepest it may draft; "
        "method and draft default to the sweep's): measured at every concurrency level after the static "
        "settings and compared there with the best static setting of the same run. Speculative arms with a "
        "`policy` in `arms` go here too."))
    margin_floor: float = Field(0.03, ge=0, lt=1, description="Guided: smallest relative prediction error e "
                                                              "assumed; an unmeasured setting is measured when "
                                                              "its prediction x (1 + e), measured, would hold "
                                                              "the best measured tok/s below its CI.")

    @field_validator("method")
    @classmethod
    def _speculative(cls, v: str) -> str:
        if v == "none":
            raise ValueError("a sweep varies speculative settings: choose eagle3, draft, eagle, nextn or ngram "
                             "(the baseline is measured anyway)")
        return v

    @model_validator(mode="after")
    def _policies_ok(self) -> SweepParams:
        moved = [a for a in self.trial.arms if a.policy is not None]
        if moved:  # policy arms listed among the arms: policies, not grid settings
            self.trial.arms = [a for a in self.trial.arms if a.policy is None]
            self.policies = [*self.policies, *moved]
        names = [a.name for a in self.policies]
        dup = sorted({n for n in names if names.count(n) > 1} | ({"baseline"} & set(names)))
        if dup:
            raise ValueError(f"policies: names must be unique and not 'baseline': {dup}")
        engine = engine_class(self.trial.engine)
        for i, a in enumerate(self.policies):
            if a.policy is None:
                raise ValueError(f"policies[{i}] ({a.name}): give its `policy` (the engine's run-time depth control)")
            if a.method == "none":
                self.policies[i] = a = a.model_copy(update={"method": self.method})
            engine.policy_launch(a.policy, self.trial.arm_steps(a), self.trial.arm_topk(a), f"policies[{a.name}]")
        return self

    @model_validator(mode="after")
    def _arms_as_grid(self) -> SweepParams:
        spec = [a for a in self.trial.arms if a.speculative]
        if not spec:
            return self
        if self.grid.model_dump(exclude_none=True, exclude={"concurrency", "request_rate", "max_inflight"}):
            raise ValueError("arms and grid: give the settings either as a grid (grid.steps, ...) or as a list of "
                             "speculative arms, not both")
        methods = sorted({a.method for a in spec})
        drafts = sorted({str(self.trial.arm_draft(a)) for a in spec})
        if len(methods) > 1 or len(drafts) > 1:
            raise ValueError(f"arms: a sweep varies steps/topk/draft tokens/synthetic acceptance of one method and "
                             f"draft; these arms use methods {methods} and drafts {drafts}: sweep them apart")
        odd = [a.name for a in spec if a.env or a.extra_args or isinstance(a.synthetic_accept, list)]
        if odd:
            raise ValueError(f"arms {odd}: per-arm env, extra_args and per-position synthetic rates are not grid "
                             "settings; put env/extra_args at the top level, give synthetic_accept as one rate")
        if "method" in self.model_fields_set and self.method != methods[0]:
            raise ValueError(f"method: {self.method!r} but the arms use {methods[0]!r}")
        self.method = methods[0]  # type: ignore[assignment]
        return self

    @model_validator(mode="after")
    def _rates_have_a_cap(self) -> SweepParams:
        if self.grid.request_rate and self.inflight_cap() < 2:
            raise ValueError(f"grid.request_rate: at most {self.inflight_cap()} request in flight is not an open loop "
                             "(each arrival would wait for the one before): set grid.max_inflight (e.g. 16; the "
                             "engine's slots follow it) or give grid.concurrency levels above 1")
        return self

    @model_validator(mode="after")
    def _no_context_buckets(self) -> SweepParams:
        if self.trial.context_buckets():
            raise ValueError("workload: prompt_tokens (context-length buckets) are measured by a trial, one window "
                             "per bucket; a sweep's points do not split by bucket: run `spectrial trial` with the "
                             "arms to compare (or drop prompt_tokens here)")
        return self

    @model_validator(mode="after")
    def _grid_fits_engine(self) -> SweepParams:
        t, g = self.trial, self.grid  # synthetic acceptance: each engine adapter says whether and how it forces it
        engine = engine_class(t.engine)
        if not engine.tree_drafts and any(k != 1 for k in (g.topk or [t.topk])):
            raise ValueError(f"grid.topk: {engine.label} drafts a chain; use [1]")
        return self

    # --- the grid ------------------------------------------------------------------------------------
    def settings(self) -> list[Setting]:
        """Every distinct setting of the grid (concurrency apart), in grid order (or the arms' order)."""
        t, g = self.trial, self.grid
        spec = [a for a in t.arms if a.speculative]
        combos = [(t.arm_steps(a), t.arm_topk(a), t.arm_draft_tokens(a), a.synthetic_accept) for a in spec] or \
            itertools.product(g.steps or [t.steps], g.topk or [t.topk], g.draft_tokens or [t.draft_tokens],
                              g.synthetic_accept or [None])
        out: list[Setting] = []
        for steps, topk, dt, rate in combos:
            if topk == 1:
                dt = steps + 1  # a chain verifies its drafts plus the target's own token
            elif dt is None:
                raise ConfigError(f"grid.draft_tokens: topk {topk} needs explicit draft tokens (tree nodes verified "
                                  "per cycle, e.g. [8] for steps 5 topk 4); null means steps + 1, valid for topk 1")
            s = Setting(steps=steps, topk=topk, draft_tokens=dt, synthetic_accept=rate)
            if s not in out:
                out.append(s)
        return out

    def policy_arms(self) -> list[Arm]:
        """The policies as the arms that launch them (the sweep's draft unless they name theirs)."""
        drafts = [a.draft for a in self.trial.arms if a.speculative and a.draft]
        return [a if a.draft or not drafts else a.model_copy(update={"draft": drafts[0]}) for a in self.policies]

    def concurrency_levels(self) -> list[int]:
        return self.grid.concurrency or [self.trial.concurrency]

    def rate_levels(self) -> list[float]:
        """The offered request rates (req/s) of the open-loop levels; [] when none."""
        return list(self.grid.request_rate or [])

    def inflight_cap(self) -> int:
        """Most requests in flight at a request-rate level: grid.max_inflight, else the highest concurrency level."""
        return self.grid.max_inflight or max(self.concurrency_levels())

    def loads(self) -> list[Load]:
        """Every load level a server start measures, in order: the concurrency levels, then the request rates."""
        return [*(Load(c) for c in self.concurrency_levels()),
                *(Load(self.inflight_cap(), r) for r in self.rate_levels())]

    def server_slots(self) -> int:
        """The most requests the client ever has in flight: the server slots the sweep needs."""
        return max([*self.concurrency_levels(), *([self.inflight_cap()] if self.rate_levels() else [])])

    def scenarios(self) -> list[float | None]:
        """Acceptance scenarios: each synthetic rate (None = the draft's real acceptance)."""
        return list(dict.fromkeys(s.synthetic_accept for s in self.settings()))

    def arm(self, setting: Setting) -> Arm:
        """The arm that launches `setting` (the draft of the listed arms, else the trial's `draft`)."""
        drafts = [a.draft for a in self.trial.arms if a.speculative and a.draft]
        return Arm(name=setting.name(self.method), method=self.method, steps=setting.steps, topk=setting.topk,
                   draft_tokens=setting.draft_tokens, synthetic_accept=setting.synthetic_accept,
                   draft=drafts[0] if drafts else None)

    def trial_params(self, arms: list[Arm] | None = None) -> TrialParams:
        """The trial the sweep runs, with `arms` (default: baseline + every setting + the policies) and enough
        server slots."""
        data = self.trial.model_dump(mode="json")
        data["arms"] = [a.model_dump(mode="json") for a in (arms or [Arm(name="baseline"),
                                                                     *map(self.arm, self.settings()),
                                                                     *self.policy_arms()])]
        # enough server slots for the most requests in flight, where the engine needs them said (llama.cpp: -np)
        data["engine_config"] = engine_class(self.trial.engine).with_slots(data.get("engine_config") or {},
                                                                          self.server_slots())
        return validate_trial(data, "sweep params (trial part)")


@dataclass(frozen=True)
class Setting:
    """One launch configuration of the grid: what a server start fixes."""

    steps: int
    topk: int
    draft_tokens: int
    synthetic_accept: float | None

    @property
    def k(self) -> int:
        """Draft tokens verified per cycle besides the target's own: the cycle-cost model's k."""
        return self.draft_tokens - 1

    def name(self, method: str) -> str:
        """Arm name, unique per setting: e.g. eagle3-s3-a0.8, eagle3-s5-t4-n8."""
        out = f"{method}-s{self.steps}"
        if self.topk != 1:
            out += f"-t{self.topk}-n{self.draft_tokens}"
        if self.synthetic_accept is not None:
            out += f"-a{self.synthetic_accept:g}"
        return out


SWEEP_KEYS = tuple(k for k in SweepParams.model_fields if k != "trial")


def _normalise(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """{'trial': {...}, sweep keys...} from either layout; unknown keys name both allowed sets."""
    if "trial" in raw:
        if not isinstance(raw["trial"], dict):
            raise ConfigError(f"{source}: `trial` must be a mapping of trial parameters")
        extra = sorted(set(raw) - {"trial", *SWEEP_KEYS})
        if extra:
            raise ConfigError(f"{source}: {', '.join(extra)}: unknown sweep parameter(s); with a `trial:` "
                              f"mapping the top level takes only {', '.join(('trial', *SWEEP_KEYS))}")
        return {**raw, "trial": dict(raw["trial"])}
    out: dict[str, Any] = {"trial": {}}
    for k, v in raw.items():
        (out if k in SWEEP_KEYS else out["trial"])[k] = v
    return out


def _check_trial_keys(trial: dict[str, Any], source: str) -> None:
    unknown = sorted(set(trial) - set(TrialParams.model_fields))
    if unknown:
        known = [*TrialParams.model_fields, *SWEEP_KEYS]
        unknown = [f"{k} (did you mean {' or '.join(close)}?)" if (close := did_you_mean(k, known)) else k
                   for k in unknown]
        raise ConfigError(f"{source}: {', '.join(unknown)}: unknown parameter(s); a sweep takes the trial "
                          f"parameters {', '.join(sorted(set(TrialParams.model_fields) - {'arms'}))} and the "
                          f"sweep parameters {', '.join(SWEEP_KEYS)}")


def load_sweep_params(path: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None,
                      data: dict[str, Any] | None = None) -> SweepParams:
    """Load a sweep params YAML (or a mapping), apply dotted overrides, validate."""
    source, raw = "sweep params", dict(data or {})
    if path is not None:
        loaded, source = read_params_yaml(path)
        raw = {**loaded, **raw}
    norm = _normalise(raw, source)
    for name, value in (overrides or {}).items():
        top = name.split(".")[0]
        if top in SWEEP_KEYS or top == "trial":
            apply_override(norm, name, value)
        else:
            apply_override(norm["trial"], name, value)
    _check_trial_keys(norm["trial"], source)
    listed = [a for a in norm["trial"].get("arms") or [] if isinstance(a, dict) and a.get("method", "none") != "none"]
    if listed and "strategy" not in norm:  # a trial file used as it is: measure what it lists unless told
        norm["strategy"] = "grid"
    norm["trial"].setdefault("arms", [{"name": "baseline"}])  # `arms` with speculative arms: the grid as a list
    try:
        return SweepParams.model_validate(norm)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source).replace("  - trial.", "  - ")) from None


def flat_params(params: SweepParams) -> dict[str, Any]:
    """The params as one flat mapping (trial keys and sweep keys side by side), as records and tools read them."""
    data = params.model_dump(mode="json")
    return {**data.pop("trial"), **data}
