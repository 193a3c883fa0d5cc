"""A gate's tolerances (`spectrial gate --tolerances FILE`): per figure, how much worse the candidate may be than the
reference before it counts as a regression, and the smallest run-to-run spread to assume.

    confidence: 0.95                # z of the change's interval (two-sided)
    figures:
      accept_len:   {tolerance: 0.05, noise_floor: 0.01}   # relative: 95 % of the reference (TensorRT-LLM's rule)
      per_position: {tolerance: 0.05, kind: absolute, noise_floor: 0.01}  # acceptance probability per position
      speedup:      {tolerance: 0.05, noise_floor: 0.02}
      tok_s:        {tolerance: 0.10, noise_floor: 0.03}   # restarts move tok/s by a few % on an unchanged host
      ttft_ms:      {tolerance: 0.25, noise_floor: 0.05}   # lower is better: a rise beyond 25 % is a regression
      itl_ms:       {tolerance: 0.25, noise_floor: 0.05}
    arms: [eagle3]                  # default: every arm of the reference
    by_arm:                         # an arm's own tolerances over `figures`
      eagle3: {accept_len: {tolerance: 0.10}}
    allow: [hardware]               # differences that do not make the runs incomparable
    exit_codes: {regression: 1, inconclusive: 2, not comparable: 2}

A figure left out keeps its default; `gate: false` reports it without judging it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spectrial.errors import ConfigError

FigureName = Literal["accept_len", "per_position", "speedup", "tok_s", "ttft_ms", "itl_ms"]
# Differences between two runs that make them incomparable unless the tolerances file allows them.
Difference = Literal["hardware", "engine", "engine_version", "model", "workload", "sampling", "concurrency",
                     "resolved_config", "controlled"]


class FigureTolerance(BaseModel):
    """How one figure is judged."""

    model_config = ConfigDict(extra="forbid")

    tolerance: float = Field(ge=0, description="How much worse the candidate may be: a fraction of the reference "
                                               "(relative) or the figure's own units (absolute).")
    kind: Literal["relative", "absolute"] = "relative"
    noise_floor: float = Field(0.0, ge=0, description="Smallest standard error of the change to assume (the "
                                                      "tolerance's units): run-to-run spread no interval shows.")
    gate: bool = Field(True, description="False: report the figure, do not judge it.")


DEFAULT_FIGURES: dict[str, FigureTolerance] = {
    "accept_len": FigureTolerance(tolerance=0.05, noise_floor=0.01),
    "per_position": FigureTolerance(tolerance=0.05, kind="absolute", noise_floor=0.01),
    "speedup": FigureTolerance(tolerance=0.05, noise_floor=0.02),
    "tok_s": FigureTolerance(tolerance=0.10, noise_floor=0.03),
    "ttft_ms": FigureTolerance(tolerance=0.25, noise_floor=0.05),
    "itl_ms": FigureTolerance(tolerance=0.25, noise_floor=0.05),
}
DEFAULT_EXIT_CODES: dict[str, int] = {"pass": 0, "improvement": 0, "regression": 1, "inconclusive": 2,
                                      "not comparable": 2}


class GateTolerances(BaseModel):
    """The gate file: confidence, per-figure tolerances, arms, allowed differences, exit codes."""

    model_config = ConfigDict(extra="forbid")

    confidence: float = Field(0.95, gt=0.5, lt=1, description="Two-sided confidence of the change's interval.")
    figures: dict[FigureName, FigureTolerance] = Field(default_factory=dict)
    arms: list[str] | None = Field(None, description="Arms to gate (default: every arm of the reference).")
    by_arm: dict[str, dict[FigureName, FigureTolerance]] = Field(
        default_factory=dict, description="Per-arm tolerances over `figures` (e.g. a synthetic arm's wider one).")
    allow: list[Difference] = Field(default_factory=list, description="Differences that do not block the gate.")
    exit_codes: dict[Literal["pass", "improvement", "regression", "inconclusive", "not comparable"], int] = \
        Field(default_factory=dict)

    def figure(self, name: str, arm: str | None = None) -> FigureTolerance:
        """The tolerance of figure `name` (of `arm`: its own where `by_arm` gives one)."""
        own = self.by_arm.get(arm or "", {})
        return own.get(name) or self.figures.get(name) or DEFAULT_FIGURES[name]  # type: ignore[index, arg-type]

    def exit_code(self, outcome: str) -> int:
        return {**DEFAULT_EXIT_CODES, **self.exit_codes}.get(outcome, 2)


def load_tolerances(path: str | Path | None) -> GateTolerances:
    """The tolerances of `path` (defaults when None); a clear error naming the file and field when bad."""
    if path is None:
        return GateTolerances()
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--tolerances: {p} is not a file", parameter="tolerances",
                          hint="give a YAML gate file (see docs/GATES.md) or leave --tolerances out for the defaults")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as exc:  # binary or absurdly nested: not a gate file
        raise ConfigError(f"--tolerances: {p} is not YAML: {exc or type(exc).__name__}", parameter="tolerances",
                          hint="give a YAML gate file (see docs/GATES.md)") from None
    try:
        return GateTolerances.model_validate(data)
    except ValidationError as err:
        from spectrial.params import format_validation_error

        raise ConfigError(format_validation_error(err, str(p)), parameter="tolerances",
                          hint="figures: accept_len, per_position, speedup, tok_s, ttft_ms, itl_ms; allow: hardware, "
                               "engine, engine_version, model, workload, sampling, concurrency, resolved_config, "
                               "controlled") from None
