"""spectrial: controlled, reproducible trials of speculative decoding on real inference servers.

The package's floors are its folders (docs/HOUSE.md): `protocol/`, `servers/`, `measure/`, `hosts/`,
`provisioning/`, `engines/`, `logs/`, `analysis/`, `record/`, `readers/`, `cli/` and the protocols over them
(`sweep/`, `cluster/`, `gate/`, `nccl/`, `watch/`). Modules that stood at the top before issue 38 keep their old
names: `import spectrial.trial` is `spectrial.protocol.trial`, the same module object (so a patch through either
name is one patch).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

__version__ = "0.1.0"

# old name (below spectrial.) -> where it lives now; a package's submodules follow it
MOVED = {
    "nccl_cli": "cli.nccl", "sweep.cli": "cli.sweep", "cluster.cli": "cli.cluster", "gate.cli": "cli.gate",
    "watch.cli": "cli.watch", "logs.cli": "cli.logs", "notebooks": "cli.notebooks",
    "session": "protocol.session", "trial": "protocol.trial", "group": "protocol.group", "plan": "protocol.plan",
    "drift": "protocol.drift", "observe": "protocol.observe", "earlier": "protocol.earlier",
    "server": "servers.lifecycle", "envcheck": "servers.envcheck",
    "bench": "measure.bench", "workloads": "measure.workloads", "metrics": "measure.metrics",
    "httpread": "measure.httpread",
    "provision": "engines.llamacpp_build", "venvs": "engines.vllm_venv", "remote": "provisioning.remote",
    "provisioning.llamacpp": "engines.llamacpp_build", "provisioning.venvs": "engines.vllm_venv",
    "provisioning.cache": "cache",
    "host": "hosts.local", "ssh": "hosts.ssh", "srun": "hosts.srun", "tunnel": "hosts.tunnel",
    "connect": "hosts.connect", "fingerprint": "hosts.fingerprint", "gpu": "hosts.gpu", "testing": "hosts.memory",
    "figures": "analysis.figures", "serving": "analysis.serving", "validity": "analysis.validity",
    "sequential": "analysis.sequential", "categories": "analysis.categories",
    "records": "record.store", "migrate": "record.migrate",
    "diagnose": "readers.diagnose", "cluster.params": "params.cluster",
}


def moved_to(fullname: str) -> str | None:
    """The module an old name stands for now (`spectrial.trial` -> `spectrial.protocol.trial`), else None."""
    if not fullname.startswith(__name__ + "."):
        return None
    rest = fullname[len(__name__) + 1:]
    for old, new in MOVED.items():
        if rest == old or rest.startswith(old + "."):
            return f"{__name__}.{new}{rest[len(old):]}"
    return None


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old name as the module it stands for now: one module object under both names."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if moved_to(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(moved_to(spec.name) or spec.name)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system stamped the old name's spec on the module: give it back its own
        for name, spec in list(self._specs.items()):
            if spec is not None and spec.name == module.__name__:
                module.__spec__ = spec
                del self._specs[name]


if not any(isinstance(f, _OldNames) for f in sys.meta_path):
    sys.meta_path.insert(0, _OldNames())


def __getattr__(name: str) -> ModuleType:
    if name in MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
