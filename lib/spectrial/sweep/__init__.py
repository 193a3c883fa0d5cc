"""Finding the best speculative setting with few server restarts: grid and model-guided sweeps.

    from spectrial.sweep import run_sweep
    result = run_sweep("params/sweep-local.yaml", {"strategy": "guided"})
    result.points(); result.best(); result.manifest.decisions

`spectrial sweep PARAMS [-p NAME=VALUE]` runs the same from the shell (`spectrial.cli.sweep.sweep_command`).
Parameters: `spectrial.sweep.params`; what is measured and when: `spectrial.sweep.run`; the model:
`spectrial.sweep.model`; the search's decisions: `spectrial.sweep.guided`; figures and the verdict:
`spectrial.readers.sweep`; replays of finished grids: `spectrial.sweep.replayer`; known worlds to judge a search
against the truth: `spectrial.sweep.world`. Names are imported on first use, so the command line stays quick to
start.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AcceptanceCurve": "model", "SweepModel": "model", "fit_acceptance": "model", "fit_sweep_model": "model",
    "Setting": "params", "SweepGrid": "params", "SweepParams": "params", "load_sweep_params": "params",
    "SweepResult": "result", "Sweep": "run", "points_table": "result", "probe_settings": "guided",
    "run_sweep": "run",
    "replay": "replayer", "judge": "replayer", "sweep_command": "cli", "World": "world", "simulate": "world",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'spectrial.sweep' has no attribute {name!r}")
    return getattr(importlib.import_module(f"spectrial.sweep.{_EXPORTS[name]}"), name)
