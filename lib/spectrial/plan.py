"""Dry runs: the exact command and environment each arm would launch, touching nothing.

The command is meant to be pasted: spectrial's own names are shown as the paths a real run uses. A `tiny:` model
becomes the file (llama.cpp) or folder (vLLM, SGLang) of spectrial's model cache that a run writes it to, and
`engine_bin: auto` the cached build; on an SSH host both are uploaded into the host's cache (`ssh.cache_dir`),
and the plan shows that path, with a note saying where each came from.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from pydantic import BaseModel

from spectrial.engines import Engine, get_engine
from spectrial.errors import ConfigError
from spectrial.host import LocalHost
from spectrial.params import Arm, TrialParams
from spectrial.secrets import mask_launch
from spectrial.server import TAG_VAR


class PlannedLaunch(BaseModel):
    """What one arm would launch (secrets masked), and the same as a shell snippet to read (`display`)."""

    arm: str
    host: str
    env: dict[str, str]
    argv: list[str]
    notes: list[str]  # the engine's notes on this launch
    resolved: dict[str, str] = {}  # spectrial's names in the params (tiny:target, engine_bin auto) -> path used
    where: list[str] = []  # where each resolved name comes from (written here, built here, uploaded there)
    display: str


def tiny_model_path(engine: Engine, ref: str) -> Path:
    """Where a run writes spectrial's tiny model `ref` (`tiny:target`, ...) in this machine's cache, without
    writing it: llama.cpp reads a GGUF file, vLLM and SGLang a Hugging Face folder."""
    knobs = dict(getattr(engine.config, "tiny", {}) or {})
    if engine.name == "llamacpp":
        from spectrial.models.tiny import cache_root, tiny_spec

        return cache_root() / "models" / tiny_spec(**knobs).key() / f"{ref.removeprefix('tiny:')}.gguf"
    from spectrial.models.hf import hf_cache_root, hf_spec

    if ref not in engine.TINY_ROLES:  # as the real run would say, before anything starts
        raise ConfigError(f"{ref!r} is not one of spectrial's tiny HF models {sorted(engine.TINY_ROLES)} "
                          f"(engine {engine.name})", parameter="model")
    return hf_cache_root() / hf_spec(**knobs).key() / engine.TINY_ROLES[ref]


def _remote_path(local: Path, params: TrialParams) -> str:
    """`local` (a file of this machine's cache) as the host's cache holds it after the upload."""
    from spectrial.provision import cache_root

    try:
        rel = local.relative_to(cache_root())
    except ValueError:
        return str(local)
    return f"{params.ssh.cache_dir.rstrip('/')}/{rel.as_posix()}"


def resolved_names(params: TrialParams, engine: Engine, arm: Arm) -> tuple[dict[str, str], list[str]]:
    """{name as the params give it: path the launch uses} for the arm's `tiny:` models and an `auto` engine
    binary, and a note for each (written here / built here / uploaded to the host)."""
    remote = params.host != "local"
    refs = [params.model, params.arm_draft(arm) or ""] if arm.speculative else [params.model]
    names: dict[str, str] = {}
    notes: list[str] = []
    for ref in dict.fromkeys(r for r in refs if r.startswith("tiny:")):
        if remote and engine.name != "llamacpp":  # as the real run says
            raise ConfigError(f"{ref!r} (spectrial's tiny HF models) is written on the local host only; give a "
                              f"model path on {params.host}", parameter="model")
        local = tiny_model_path(engine, ref)
        names[ref] = _remote_path(local, params) if remote else str(local)
        notes.append(f"{ref} is spectrial's tiny model, written by a real run to {local} (seconds)"
                     + (f" and uploaded to {names[ref]} on {params.host}" if remote else ""))
    unresolved = [r for r in refs if r and not r.startswith("tiny:")]
    if unresolved:
        notes.append("model paths are read on the host that runs the server"
                     + (f" ({params.host}); nothing is uploaded for them" if remote else ""))
    if params.engine_bin == "auto" and params.engine == "llamacpp" and remote:
        binary = str(getattr(engine, "binary", "") or "")
        if binary:
            names[binary] = _remote_path(Path(binary), params)
            notes.append(f"engine_bin: auto is spectrial's llama.cpp build ({binary}), built here if missing and "
                         f"uploaded to {names[binary]} on {params.host}")
    return names, notes


def dry_run(params: TrialParams) -> list[PlannedLaunch]:
    """Per arm, the launch it would make; no host is contacted, nothing is built or written."""
    engine = get_engine(params.engine, params, LocalHost())
    engine.resolve_dry()
    out = []
    for arm in params.arms:
        names, resolved_notes = resolved_names(params, engine, arm)
        spec = engine.launch_spec(arm)
        argv = [_swap(a, names) for a in spec.argv]
        shown = mask_launch(argv, spec.env)
        notes = "".join(f"# note: {n}\n" for n in [*resolved_notes, *spec.notes])
        display = (f"# arm {arm.name} on {params.host} ({arm.method})\n{notes}"
                   f"{_home_unquoted(shown.command)}\n# plus {TAG_VAR}=<run-id:arm> so spectrial can find and stop what it started\n")
        out.append(PlannedLaunch(arm=arm.name, host=params.host, env=shown.env, argv=shown.argv,
                                 notes=list(spec.notes), resolved=names, where=resolved_notes, display=display))
    return out


def _swap(item: str, names: dict[str, str]) -> str:
    """An argv item with a spectrial name replaced by its path (`tiny:target`, `--model=tiny:target`, a JSON
    argument naming it)."""
    for ref, path in names.items():
        if ref in item:
            item = item.replace(ref, path)
    return item


def _home_unquoted(line: str) -> str:
    """A shell line whose quoted `'~/...'` words keep the `~` outside the quotes, so the remote shell expands it
    when the line is pasted there."""
    return re.sub(r"'~/([^']*)'", lambda m: "~/" + shlex.quote(m[1]), line)
