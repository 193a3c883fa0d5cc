"""Dry runs: the exact command and environment each arm would launch, touching nothing."""

from __future__ import annotations

import shlex
from typing import Any

from spectrial.engines import get_engine
from spectrial.host import LocalHost
from spectrial.params import TrialParams
from spectrial.secrets import mask_argv, mask_env
from spectrial.server import TAG_VAR


def dry_run(params: TrialParams) -> list[dict[str, Any]]:
    """Per arm: {"arm", "host", "env", "argv", "notes", "display"}; no host is contacted, nothing is built."""
    engine = get_engine(params.engine, params, LocalHost())
    engine.resolve_dry()
    out = []
    for arm in params.arms:
        spec = engine.launch_spec(arm)
        env, argv = mask_env(spec.env), mask_argv(spec.argv)
        env_words = [f"{k}={v}" for k, v in env.items()]
        line = shlex.join([*env_words, *argv])
        notes = "".join(f"# note: {n}\n" for n in spec.notes)
        display = (f"# arm {arm.name} on {params.host} ({arm.method})\n{notes}"
                   f"{line}\n# plus {TAG_VAR}=<run-id:arm> so spectrial can find and stop what it started\n")
        out.append({"arm": arm.name, "host": params.host, "env": env, "argv": argv, "notes": list(spec.notes),
                    "display": display})
    return out
