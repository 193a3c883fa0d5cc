"""Dry runs: the exact command and environment each arm would launch, touching nothing."""

from __future__ import annotations

from pydantic import BaseModel

from spectrial.engines import get_engine
from spectrial.host import LocalHost
from spectrial.params import TrialParams
from spectrial.secrets import mask_launch
from spectrial.server import TAG_VAR


class PlannedLaunch(BaseModel):
    """What one arm would launch (secrets masked), and the same as a shell snippet to read (`display`)."""

    arm: str
    host: str
    env: dict[str, str]
    argv: list[str]
    notes: list[str]
    display: str


def dry_run(params: TrialParams) -> list[PlannedLaunch]:
    """Per arm, the launch it would make; no host is contacted, nothing is built."""
    engine = get_engine(params.engine, params, LocalHost())
    engine.resolve_dry()
    out = []
    for arm in params.arms:
        spec = engine.launch_spec(arm)
        shown = mask_launch(spec.argv, spec.env)
        notes = "".join(f"# note: {n}\n" for n in spec.notes)
        display = (f"# arm {arm.name} on {params.host} ({arm.method})\n{notes}"
                   f"{shown.command}\n# plus {TAG_VAR}=<run-id:arm> so spectrial can find and stop what it started\n")
        out.append(PlannedLaunch(arm=arm.name, host=params.host, env=shown.env, argv=shown.argv,
                                 notes=list(spec.notes), display=display))
    return out
