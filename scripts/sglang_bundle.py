"""Build, HERE, the trimmed SGLang 0.5.17 site folder that the H200 device recipe carries (issue 15).

    python scripts/sglang_bundle.py build   (default) wheels from the lock (cached in
                                            ~/.cache/spectrial/sglang-wheels), `pip install --no-deps
                                            --no-compile --target`, trims, checks, writes
                                            .device/sglang-0.5.17.tar.xz and .device/sglang-0.5.17.json,
                                            and keeps a copy in ~/.cache/spectrial/sglang-build/bundles/<lock
                                            and script sha256> that a fresh checkout copies instead of building
    python scripts/sglang_bundle.py check   re-check the tarball (size, contents) against its manifest
    python scripts/sglang_bundle.py lock    re-derive scripts/sglang_bundle.lock from the package index: the
                                            wheels' Requires-Dist (CPython 3.12, Linux x86_64) walked from
                                            ROOTS, minus the device image's packages and NOT_NEEDED

The device image (KINDS.md) has torch 2.11.0+cu130 and Python 3.12 but no network; the tarball unpacks
there into a folder put on PYTHONPATH, nothing is pip-installed there (docs/DEVICE.md, "SGLang on the
H200"), which also gives the facts, trims and pitfalls found on the device. Run it with the repo's venv
(`.venv/bin/python`); it needs only pip and packaging.
"""

from __future__ import annotations

import argparse
import ast
import base64
import csv
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from email.parser import Parser
from itertools import chain
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
try:
    from spectrial.errors import ConfigError, SpectrialError
except ImportError:  # run by a Python without spectrial installed: use the checkout's
    sys.path.insert(0, str(REPO / "lib"))
    from spectrial.errors import ConfigError, SpectrialError

SGLANG_VERSION = "0.5.17"
LOCK = REPO / "scripts" / "sglang_bundle.lock"
DEVICE_PREPARE = REPO / "scripts" / "device_prepare.sh"
DEVICE_DIR = REPO / ".device"
TARBALL = DEVICE_DIR / f"sglang-{SGLANG_VERSION}.tar.xz"
MANIFEST = DEVICE_DIR / f"sglang-{SGLANG_VERSION}.json"
CACHE = Path(os.environ.get("SPECTRIAL_SGLANG_WHEELS", Path.home() / ".cache/spectrial/sglang-wheels"))
BUILD_DIR = Path(os.environ.get("SPECTRIAL_SGLANG_BUILD", Path.home() / ".cache/spectrial/sglang-build"))
LIMIT_BYTES = 60 * 1024 * 1024

# What the bundle is for; everything else in the lock is their closure.
ROOTS = ("sglang==0.5.17", "sglang-kernel==0.4.5", "transformers==5.12.1", "tokenizers==0.22.2",
         # imported at module level on every server start but not in sglang's Requires-Dist (nor in the image):
         # the first device runs died in `import dill` (sampling/custom_logit_processor.py), then in
         # `from jsonschema import Draft202012Validator` (entrypoints/openai/serving_chat.py)
         "dill==0.4.0", "jsonschema==4.26.0",
         # SGLang's own benchmark tools beside spectrial (sglang.bench_serving, sglang.benchmark.one_batch_server):
         # sglang.benchmark.datasets imports `datasets` at module level (its MMMU loader); multiprocess 0.70.19
         # needs dill>=0.4.1, 0.70.18 keeps the dill that ran on the device
         "datasets==5.2.0", "multiprocess==0.70.18")

# Image packages carried anyway, at another version (the bundle comes first on PYTHONPATH).
REPLACE_IMAGE = {
    "transformers": "the image's 5.17.0 breaks every sglang.srt import ('qwen3_asr' is already used by a "
                    "Transformers config); sglang 0.5.17 pins 5.12.1",
    "tokenizers": "transformers 5.12.1 needs tokenizers<=0.23.0; the image has 0.23.2",
    # insurance, 45 kB: pydantic 2.14.4 needs >=4.16.0 and the image's version is not known here
    # (scripts/device_prepare.sh carries the same 4.16.0 for spectrial)
    "typing-extensions": "pydantic 2.14.4 needs typing-extensions>=4.16.0; the image's version is not known",
}

# Versions of image packages known from KINDS.md's pip list row (2026-11): a requirement these fail is an
# error at `lock` time (carry it: REPLACE_IMAGE). Image packages not listed here are taken as they are.
IMAGE_VERSIONS = {
    "accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
    "sentence-transformers": "6.0.1", "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "tokenizers": "0.23.2",
    "torch": "2.11.0", "torchaudio": "2.11.0", "torchvision": "0.26.0", "transformers": "5.17.0",
    "triton": "3.6.0", "onnx": "1.23.1", "jax": "0.11.2",
}

# Requirements not carried: not imported when serving a Llama with `--attention-backend triton
# --sampling-backend pytorch` (REAL_ENGINES.md; the server logs two harmless lines: `/v1/responses`
# disabled, `inkling` model skipped). Their own requirements are not walked.
NOT_NEEDED = {
    "llguidance": "grammar backend (xgrammar is the default and is carried)",
    "outlines": "grammar backend",
    "torchao": "quantisation",
    "sgl-deep-gemm": "DeepGEMM FP8 kernels",
    "modelscope": "model hub client",
    "anthropic": "Anthropic API adapter",
    "openai-harmony": "gpt-oss harmony format (/v1/responses disabled)",
    "torchcodec": "audio/video decoding",
    "helion": "kernel DSL",
    "nvidia-cutlass-dsl": "CuTe DSL kernels",
    "flash-attn-4": "FlashAttention 4 (Blackwell)",
    "mistral-common": "Mistral tokenizers",
    "smg-grpc-servicer": "gRPC servicers",
    "tilelang": "kernel DSL",
    "nvidia-cuda-nvcc": "CUDA compiler wheel (the image has nvcc 13.0)",
    "nvidia-cuda-cccl": "CUDA compiler headers wheel (the image's toolkit has them)",
    # not in REAL_ENGINES.md's list, found by this script: MLA kernels "for Blackwell SM100 and SM103" that
    # need nvidia-cutlass-dsl (not carried); sglang imports them only if find_spec finds them, and their
    # tokenspeed-triton alone is 65 MB as xz (more than the whole bundle may be)
    "tokenspeed-mla": "Blackwell-only MLA kernels (and their 95 MB tokenspeed-triton)",
    # also found by this script, each only imported inside try/except or for a feature a Llama on the H200
    # does not use; together 16.6 MiB as xz, without which the bundle is over 60 MiB (72.4 MiB with them)
    "nvidia-mathdx": "cuBLASDx headers (121 MiB) for sglang's MoE expert-parallel load balancer JIT (lplb)",
    "nvidia-cudnn-frontend": "FlashInfer's cuDNN attention/GEMM backends; `import cudnn` is in try/except "
                             "(CUDNN_AVAILABLE); it needs nvidia-cutlass-dsl, not carried",
    "nccl4py": "FlashInfer's MoE expert-parallel backend (flashinfer.moe_ep), not imported by `import flashinfer`",
    "cuda-tile": "FlashInfer's cuTile GEMMs (SM100+), gated by is_cuda_tile_available(); needs the "
                 "nvidia-cuda-tileiras toolchain, not carried",
}

# Removed after the install, as globs relative to the site folder (REAL_ENGINES.md: safe with
# `--attention-backend triton --sampling-backend pytorch`). PROTECTED paths are never removed.
TRIMS = (
    ("sgl_kernel/flash_ops.abi3.so", "FlashAttention 3 (1,071 MiB); triton attention is used"),
    ("sgl_kernel/sm100/common_ops.abi3.so", "Blackwell build of the common ops; the H200 loads sm90/"),
    ("sgl_kernel/infllm_ops.*.so", "InfLLM ops"),
    ("sgl_kernel/flashmla_ops.abi3.so", "FlashMLA (DeepSeek MLA)"),
    ("sglang/multimodal_gen", "diffusion serving"),
    ("sglang/test/*", "SGLang's test suite (but KEEP: what its benchmark tools import)"),
    ("sglang/srt/*/_core.*.so", "the three Rust extensions (HTTP/2 server, gRPC, multimodal); Python paths are used"),
    ("xgrammar/lib/libxgrammar.a", "static library, only for building against xgrammar"),
    ("bin", "console scripts (shebangs of this machine's Python) and py-spy's binary (stack dumps)"),
    # not in REAL_ENGINES.md's list: build-time files at the top level of the site, never imported
    ("build_backend.py", "PEP 517 build helper that flashinfer-python and torch-c-dlpack-ext both install"),
    ("tools", "sglang's build-time tools/get_version_tag.py (a top-level `tools` namespace otherwise)"),
    ("share", "IPython's man page"),
    # not in REAL_ENGINES.md's list either; together ~4 MB as xz, which the benchmark tools' `datasets` needed
    ("jedi/third_party", "typeshed/django stubs (13 MB) for IPython's tab completion, which nothing here uses"),
    ("zstandard/_cffi.*.so", "the CFFI backend (12 MB); CPython imports the C backend (backend_c)"),
)
PROTECTED = ("flashinfer/data/", "sgl_kernel/sm90/common_ops")
# Spared by TRIMS' globs: the modules of sglang.test that SGLang's benchmark tools import at module level
# (sglang.benchmark.one_batch_server -> test_utils, nightly_bench_utils; test_utils -> run_eval ->
# simple_eval_common). BENCH_MODULES' import closure (import_problems) checks that nothing else is missing.
KEEP = ("sglang/test/__init__.py", "sglang/test/test_utils.py", "sglang/test/nightly_bench_utils.py",
        "sglang/test/run_eval.py", "sglang/test/simple_eval_common.py")
# SGLang's benchmark tools, which must import from the bundle beside spectrial (a side-by-side measurement)
BENCH_MODULES = ("sglang.bench_serving", "sglang.benchmark.serving", "sglang.benchmark.datasets",
                 "sglang.bench_one_batch_server", "sglang.benchmark.one_batch_server")
# Must be in the tarball: FlashInfer's JIT sources (sgl_kernel.rmsnorm compiles norm.cu on first use; without
# them every server dies in its warm-up request) and the Hopper build of sgl_kernel's common ops.
MUST_HAVE = ("flashinfer/data/csrc/norm.cu", "sgl_kernel/sm90/common_ops.abi3.so", "sglang/launch_server.py",
             "transformers/__init__.py", "tokenizers/__init__.py", "sglang/benchmark/one_batch_server.py",
             "sglang/test/test_utils.py", "datasets/__init__.py")

# manylinux up to 2.34: the sglang wheel (manylinux_2_34) ran on the device image, so its glibc is >= 2.34
PLATFORMS = tuple(f"manylinux_2_{m}_x86_64" for m in range(34, 4, -1)) + (
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64")
TARGET_FLAGS = ("--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
                "--abi", "abi3", "--abi", "none", *(a for p in PLATFORMS for a in ("--platform", p)))
DEVICE_TAGS = frozenset(chain(cpython_tags((3, 12), ["cp312", "abi3", "none"], PLATFORMS),
                               compatible_tags((3, 12), "cp312", PLATFORMS)))
MARKER_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython",
              "platform_release": "", "platform_version": "", "implementation_version": "3.12.3"}

LOCK_LINE = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>\S+)\s+--hash=sha256:(?P<sha256>[0-9a-f]{64})"
                       r"\s+#\s*(?P<file>\S+\.whl);\s*for (?P<needed_by>.*)$")
IMAGE_PACKAGES_RE = re.compile(r'^IMAGE_PACKAGES="([^"]*)"', re.M)
DEVICE_WHEELS_RE = re.compile(r"^WHEELS=\(([^)]*)\)", re.M)
PIP_NOISE = re.compile(r"Location '.*' is ignored|^\s*$")


def say(msg: str) -> None:
    """One progress line on stderr."""
    print(f"[sglang_bundle] {msg}", file=sys.stderr, flush=True)


# --- data: the lock file and the device image -------------------------------------------------------------
@dataclass
class Locked:
    """One carried wheel: project, version, file name, sha256, and who needs it."""

    name: str
    version: str
    file: str
    sha256: str
    needed_by: set[str] = field(default_factory=set)
    requires: list[str] = field(default_factory=list)
    extras: set[str] = field(default_factory=set)


def read_lock(path: Path = LOCK) -> dict[str, Locked]:
    """The lock file's entries by canonical project name; a malformed line is an error naming it."""
    if not path.is_file():
        raise ConfigError(f"lock: {path} is missing", parameter="lock",
                          hint="run `python scripts/sglang_bundle.py lock` (needs the package index)")
    out: dict[str, Locked] = {}
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        m = LOCK_LINE.match(line)
        if not m:
            raise ConfigError(f"lock: {path}:{no} is not `name==version --hash=sha256:... # file.whl; for ...`: "
                              f"{line!r}", parameter="lock", hint="re-run `scripts/sglang_bundle.py lock`")
        name = canonicalize_name(m["name"])
        if name in out:
            raise ConfigError(f"lock: {path}:{no} pins {name} twice", parameter="lock")
        out[name] = Locked(name, m["version"], m["file"], m["sha256"],
                           {s.strip() for s in m["needed_by"].split(",")})
    return out


def image_packages() -> set[str]:
    """The device image's packages (canonical names), from scripts/device_prepare.sh's IMAGE_PACKAGES (KINDS.md)."""
    m = IMAGE_PACKAGES_RE.search(DEVICE_PREPARE.read_text())
    if not m:
        raise ConfigError(f"image: no IMAGE_PACKAGES=\"...\" in {DEVICE_PREPARE}", parameter="image",
                          hint="the device image's package list lives there (KINDS.md)")
    return {canonicalize_name(n) for n in m.group(1).split()}


def device_wheel_pins() -> dict[str, str]:
    """Versions scripts/device_prepare.sh carries for spectrial (preferred here, so both sets agree)."""
    m = DEVICE_WHEELS_RE.search(DEVICE_PREPARE.read_text())
    pins = (Requirement(s) for s in (m.group(1).split() if m else []))
    return {canonicalize_name(r.name): str(next(iter(r.specifier)).version) for r in pins if r.specifier}


def active(req: Requirement, extras: Iterable[str]) -> bool:
    """Whether a Requires-Dist line applies on the device (CPython 3.12, Linux x86_64) for these extras."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**MARKER_ENV, "extra": e}) for e in ("", *extras))


def classify(req: Requirement, image: set[str]) -> str:
    """'skip' (NOT_NEEDED), 'image' (the device has it), or 'carry'; an image version known to fail is an error."""
    n = canonicalize_name(req.name)
    if n in NOT_NEEDED:
        return "skip"
    if n in image and n not in REPLACE_IMAGE:
        known = IMAGE_VERSIONS.get(n)
        if known and req.specifier and not req.specifier.contains(known, prereleases=True):
            raise ConfigError(f"image: the device has {n} {known} but {req} is required",
                              parameter="REPLACE_IMAGE", hint=f"carry {n}: add it to REPLACE_IMAGE")
        return "image"
    return "carry"


# --- lock: derive the closure from the package index -------------------------------------------------------
def pip_report(reqs: Sequence[str]) -> list[dict]:
    """pip's resolution report (no download of the wheels) for these requirements, each without its deps."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--no-deps", "--ignore-installed",
               "--disable-pip-version-check", "--report", f"{tmp}/r.json", "--target", f"{tmp}/t",
               *TARGET_FLAGS, *reqs]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            err = "\n".join(ln for ln in p.stderr.splitlines() if not PIP_NOISE.search(ln))
            raise SpectrialError(f"pip could not resolve {' '.join(reqs)}:\n{err[-3000:]}",
                                 hint="is the package index reachable? is the version out for cp312 x86_64?")
        return json.loads(Path(f"{tmp}/r.json").read_text())["install"]


def resolve() -> tuple[dict[str, Locked], dict[str, set[str]], dict[str, set[str]], set[str]]:
    """Walk Requires-Dist from ROOTS: the carried wheels; who asked for image and NOT_NEEDED projects; and
    the version requirements on image packages whose image version is not known here (unchecked)."""
    # preferred versions: spectrial's device set, then the current lock's (re-locking adds, it does not drift)
    old = {n: e.version for n, e in read_lock().items()} if LOCK.is_file() else {}
    image, prefer = image_packages(), {**old, **device_wheel_pins()}
    chosen: dict[str, Locked] = {}
    from_image: dict[str, set[str]] = {}
    skipped: dict[str, set[str]] = {}
    unchecked: set[str] = set()
    pending = [(Requirement(r), "ROOTS") for r in ROOTS]
    conflicts: list[str] = []
    while pending:
        wanted: dict[str, list[tuple[Requirement, str]]] = {}
        later: list[tuple[Requirement, str]] = []
        for req, parent in pending:
            n, kind = canonicalize_name(req.name), classify(req, image)
            if kind != "carry":
                (skipped if kind == "skip" else from_image).setdefault(n, set()).add(parent)
                if kind == "image" and req.specifier and n not in IMAGE_VERSIONS:
                    unchecked.add(f"{n}{req.specifier} ({parent})")
            elif n in chosen:
                c = chosen[n]
                c.needed_by.add(parent)
                if not req.specifier.contains(c.version, prereleases=True):
                    conflicts.append(f"{parent} needs {req}, locked {n}=={c.version}")
                new, old = set(req.extras) - c.extras, set(c.extras)
                if new:
                    c.extras |= new
                    later += [(r, n) for r in map(Requirement, c.requires) if active(r, new) and not active(r, old)]
            else:
                wanted.setdefault(n, []).append((req, parent))
        if wanted:
            specs = []
            for n, rs in sorted(wanted.items()):
                spec = SpecifierSet()
                for r, _ in rs:
                    spec &= r.specifier
                extras = sorted({e for r, _ in rs for e in r.extras})
                if n in prefer and spec.contains(prefer[n], prereleases=True):
                    spec = SpecifierSet(f"=={prefer[n]}")
                specs.append(f"{n}{'[' + ','.join(extras) + ']' if extras else ''}{spec}")
            say(f"resolving {len(specs)}: {' '.join(specs)}")
            for item in pip_report(specs):
                meta, info = item["metadata"], item["download_info"]
                n = canonicalize_name(meta["name"])
                c = Locked(n, meta["version"], info["url"].rsplit("/", 1)[-1],
                           info.get("archive_info", {}).get("hashes", {}).get("sha256", ""),
                           {p for _, p in wanted[n]}, list(meta.get("requires_dist") or []),
                           {e for r, _ in wanted[n] for e in r.extras})
                if not c.sha256 or not c.file.endswith(".whl"):
                    raise SpectrialError(f"pip gave no sha256 wheel for {n}: {info}",
                                         hint="only index wheels can be locked")
                chosen[n] = c
                later += [(r, n) for r in map(Requirement, c.requires) if active(r, c.extras)]
        pending = later
    if conflicts:
        raise SpectrialError("lock: version conflicts:\n  " + "\n  ".join(conflicts),
                             hint="pin the conflicting project in ROOTS or extend NOT_NEEDED")
    return chosen, from_image, skipped, unchecked


def write_lock(chosen: dict[str, Locked], from_image: dict[str, set[str]], skipped: dict[str, set[str]],
               unchecked: set[str]) -> None:
    """Write the lock file: pip requirements format (`pip download --require-hashes -r` reads it)."""
    def listed(title: str, items: Iterable[str], sep: str = " ") -> list[str]:
        return textwrap.wrap(f"{title}: {sep.join(sorted(items))}", 108, initial_indent="# ",
                             subsequent_indent="#   ", break_on_hyphens=False)

    lines = [
        f"# SGLang {SGLANG_VERSION} for the H200 device image (CPython 3.12, manylinux x86_64): every wheel the",
        "# trimmed bundle carries, pinned with its sha256. Written by `python scripts/sglang_bundle.py lock`",
        "# from the wheels' Requires-Dist (markers for CPython 3.12 on Linux x86_64) walked from ROOTS; do not",
        "# edit by hand. `python scripts/sglang_bundle.py build` installs exactly these.",
        *listed("roots", ROOTS),
        *listed("carried although the image has them (REPLACE_IMAGE)", REPLACE_IMAGE),
        *listed("from the device image (not carried)", from_image),
        *listed("not needed (not carried, their requirements not walked)", skipped),
        *listed("required of the image at versions not known here (not checked)", unchecked, ", "),
    ]
    for n in sorted(chosen):
        c = chosen[n]
        lines.append(f"{n}=={c.version} --hash=sha256:{c.sha256}  # {c.file}; for {', '.join(sorted(c.needed_by))}")
    LOCK.write_text("\n".join(lines) + "\n")
    say(f"wrote {LOCK.relative_to(REPO)}: {len(chosen)} wheels; {len(from_image)} from the image, "
        f"{len(skipped)} not needed")


# --- imports: what SGLang's benchmark tools need from the bundle ------------------------------------------------
# import names of image packages that differ from their project names (the rest: '-' -> '_')
IMPORT_NAMES = {"pillow": "PIL", "pyyaml": "yaml", "opencv-python-headless": "cv2", "scikit-learn": "sklearn",
                "scikit-image": "skimage", "python-dateutil": "dateutil", "protobuf": "google",
                "nvidia-ml-py": "pynvml", "py-cpuinfo": "cpuinfo", "attrs": "attr", "markdown-it-py": "markdown_it",
                "cuda-bindings": "cuda", "pyzmq": "zmq"}
FOLLOW = ("sglang.bench", "sglang.test", "sglang.profiler", "sglang.utils", "sglang.global_config")


def module_path(site: Path, name: str) -> Path | None:
    """The file (or package folder, or extension module) that `import name` finds in the site, or None."""
    base = site.joinpath(*name.split("."))
    for cand in (base / "__init__.py", base.with_suffix(".py")):
        if cand.is_file():
            return cand
    if base.is_dir() or (base.parent.is_dir() and any(base.parent.glob(base.name + ".*.so"))):
        return base
    return None


def module_imports(path: Path, name: str) -> list[tuple[str, str | None]]:
    """(module, imported name) pairs of the imports a module runs when imported: the module's body, class bodies
    and `if` blocks; not functions (lazy) nor `try` blocks (optional: an ImportError is caught there)."""
    tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, str | None]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                out.extend((a.name, None) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1])
                    mod = f"{base}.{mod}" if mod else base
                out.extend((mod, a.name) for a in node.names)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, (ast.ClassDef, ast.With)):
                visit(node.body)
    visit(tree.body)
    return out


def import_problems(site: Path, roots: Sequence[str] = BENCH_MODULES) -> list[str]:
    """What `import root` would miss, read statically from the site: a module of the bundle that is absent (trimmed,
    or never carried), or a top-level name that is neither in the bundle, nor the image, nor the standard library.
    Follows the imports of FOLLOW's modules (the benchmark tools, sglang.test); the modules of sglang.srt, which the
    server imports on the device, are only checked to exist."""
    image = {IMPORT_NAMES.get(n, n.replace("-", "_")) for n in image_packages()}
    problems: list[str] = []
    seen: set[str] = set()
    queue = [(r, "ROOTS") for r in roots]
    while queue:
        name, by = queue.pop()
        if name in seen:
            continue
        seen.add(name)
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top == "__future__":
            continue
        if module_path(site, top) is None:
            if top not in image:
                problems.append(f"{name} (imported by {by}): neither in the bundle nor in the device image")
            continue
        path = module_path(site, name)
        if path is None:
            problems.append(f"{name} (imported by {by}) is not in the bundle")
            continue
        parts = name.split(".")  # importing a.b.c runs a/__init__ and a/b/__init__ first
        queue += [(".".join(parts[:i]), name) for i in range(1, len(parts))]
        if not name.startswith(FOLLOW) or path.suffix != ".py":
            continue
        for mod, attr in module_imports(path, name):
            sub = f"{mod}.{attr}" if attr and attr != "*" else None
            queue.append((sub if sub and module_path(site, sub) else mod, name))
    return sorted(set(problems))


# --- build ----------------------------------------------------------------------------------------------
def sha256_of(path: Path) -> str:
    """sha256 hex digest of a file."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(lock: dict[str, Locked]) -> dict[str, Path]:
    """The locked wheels in CACHE by project: pip downloads those missing; a cached file whose sha256 is not
    the lock's is deleted and downloaded again."""
    CACHE.mkdir(parents=True, exist_ok=True)
    missing = []
    for c in lock.values():
        f = CACHE / c.file
        if f.is_file() and sha256_of(f) != c.sha256:
            say(f"{f} does not match its sha256 in the lock: downloading it again")
            f.unlink()
        if not f.is_file():
            missing.append(c)
    if missing:
        say(f"downloading {len(missing)} of {len(lock)} wheels into {CACHE} ...")
        t0 = time.monotonic()
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as req:
            req.write("".join(f"{c.name}=={c.version} --hash=sha256:{c.sha256}\n" for c in missing))
            req.flush()
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes",
                   "--disable-pip-version-check", "-d", str(CACHE), *TARGET_FLAGS, "-r", req.name]
            p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            err = "\n".join(ln for ln in p.stderr.splitlines() if not PIP_NOISE.search(ln))
            raise SpectrialError(f"download failed for {', '.join(c.file for c in missing)}:\n{err[-3000:]}",
                                 hint="is the package index reachable (pip download)? a hash mismatch means "
                                      "the index changed a file: re-run `lock`")
        for c in missing:
            f = CACHE / c.file
            if not f.is_file():
                raise SpectrialError(f"download: {c.file} is not in {CACHE} after pip download",
                                     hint="the index serves another file for this version: re-run `lock`")
            if sha256_of(f) != c.sha256:
                raise SpectrialError(f"download: {f} has sha256 {sha256_of(f)}, the lock says {c.sha256}",
                                     hint=f"delete {f} and re-run")
        say(f"downloaded {sum((CACHE / c.file).stat().st_size for c in missing) / 1e6:.1f} MB "
            f"in {time.monotonic() - t0:.0f} s")
    return {c.name: CACHE / c.file for c in lock.values()}


def wheel_requires(path: Path) -> list[str]:
    """A wheel's Requires-Dist lines (its METADATA); a broken zip is an error naming the wheel."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            if bad:
                raise SpectrialError(f"wheel {path.name}: member {bad} fails its CRC", hint=f"delete {path}")
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
            return Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []
    except zipfile.BadZipFile as e:
        raise SpectrialError(f"wheel {path.name}: not a zip ({e})", hint=f"delete {path} and re-run") from e


def check_closure(lock: dict[str, Locked], wheels: dict[str, Path]) -> list[str]:
    """Every carried wheel's applicable Requires-Dist (with the extras asked of it) is met by the lock, the
    image or NOT_NEEDED, as `lock` derived it; every wheel is for CPython 3.12 x86_64; ROOTS are pinned."""
    image, problems = image_packages(), []
    requires = {n: [Requirement(r) for r in wheel_requires(wheels[n])] for n in lock}
    asked: dict[str, set[str]] = {n: set() for n in lock}
    for root in map(Requirement, ROOTS):
        n = canonicalize_name(root.name)
        if n not in lock or not root.specifier.contains(lock[n].version, prereleases=True):
            problems.append(f"root {root} is not pinned as such in the lock")
        asked.setdefault(n, set()).update(root.extras)
    changed = True
    while changed:  # extras asked of a wheel can switch on requirements that ask extras of others
        changed = False
        for n, reqs in requires.items():
            for r in reqs:
                m = canonicalize_name(r.name)
                if m in asked and active(r, asked[n]) and not set(r.extras) <= asked[m]:
                    asked[m] |= set(r.extras)
                    changed = True
    for c in lock.values():
        name, version, _, tags = parse_wheel_filename(c.file)
        if name != c.name or version != Version(c.version):
            problems.append(f"{c.file} is not {c.name}=={c.version}")
        if not tags & DEVICE_TAGS:
            problems.append(f"{c.file}: not for CPython 3.12 on Linux x86_64")
        for r in requires[c.name]:
            if not active(r, asked[c.name]):
                continue
            try:
                kind = classify(r, image)
            except ConfigError as e:
                problems.append(f"{c.file}: {e}")
                continue
            n = canonicalize_name(r.name)
            if kind == "carry" and n not in lock:
                problems.append(f"{c.file} needs {r}: neither carried, nor in the image, nor NOT_NEEDED")
            elif kind == "carry" and not r.specifier.contains(lock[n].version, prereleases=True):
                problems.append(f"{c.file} needs {r}, the lock carries {n}=={lock[n].version}")
    return problems


def python312() -> str | None:
    """A CPython 3.12 here (PY312, python3.12 on PATH, pyenv), or None (also when PY312=-): then this
    Python's pip installs with `--python-version 3.12 --platform ...` (the same files: RECORD-checked)."""
    if os.environ.get("PY312") == "-":
        return None
    cands = [os.environ.get("PY312", ""), shutil.which("python3.12") or "",
             *sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.12*/bin/python3.12")))]
    for c in filter(None, cands):
        p = subprocess.run([c, "-c", "import sys, pip; print(sys.version_info[:2] == (3, 12))"],
                           capture_output=True, text=True)
        if p.returncode == 0 and p.stdout.strip() == "True":
            return c
    return None


def install(wheels: Iterable[Path], site: Path) -> str:
    """`pip install --no-index --no-deps --no-compile --target site` of the wheels; returns how (which pip)."""
    if site.exists():
        shutil.rmtree(site)
    py = python312()
    flags = [] if py else list(TARGET_FLAGS)
    how = f"{py} -m pip" if py else f"{sys.executable} -m pip with --python-version 3.12 --platform ..."
    cmd = [py or sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--disable-pip-version-check", "--no-cache-dir", "--target", str(site), *flags,
           *map(str, sorted(wheels))]
    say(f"installing into {site} ({how}) ...")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise SpectrialError(f"pip install --target {site} failed (exit {p.returncode}):\n{p.stderr[-3000:]}",
                             hint="set PY312 to a CPython 3.12 with pip, or check the wheels in " + str(CACHE))
    return how


def protected(rel: str) -> bool:
    """Whether a site-relative path is one the bundle must keep (PROTECTED), or a folder holding one."""
    rel = rel.rstrip("/") + "/"
    return any(rel.startswith(p) or p.startswith(rel) for p in PROTECTED)


def tree_bytes(path: Path) -> int:
    """Bytes of a file, or of all files under a folder (links not followed)."""
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() or f.is_symlink())


def apply_trims(site: Path) -> list[dict]:
    """Remove TRIMS from the site folder, sparing KEEP; a pattern that hits a PROTECTED path is an error."""
    removed = []
    for pattern, why in TRIMS:
        hits = [h for h in sorted(site.glob(pattern)) if h.relative_to(site).as_posix() not in KEEP]
        if not hits:
            raise SpectrialError(f"trim {pattern!r} matches nothing in {site}",
                                 hint="a locked wheel changed its layout: update TRIMS")
        for hit in hits:
            rel = hit.relative_to(site).as_posix()
            if protected(rel):
                raise SpectrialError(f"trim {pattern!r} would remove {rel}, which must stay (PROTECTED)",
                                     hint="narrow the pattern in TRIMS")
            size = tree_bytes(hit)
            shutil.rmtree(hit) if hit.is_dir() and not hit.is_symlink() else hit.unlink()
            removed.append({"path": rel, "bytes": size, "why": why})
    for cache in sorted(site.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache, ignore_errors=True)
    return removed


def check_record(site: Path, trimmed: list[dict]) -> tuple[int, list[str]]:
    """Every file a distribution's RECORD lists is there with its sha256, except what was trimmed, and no
    file is claimed by two distributions unless it was trimmed; returns (files checked, problems)."""
    gone = [t["path"] for t in trimmed]
    owners: dict[str, list[str]] = {}
    rows = []
    for record in sorted(site.glob("*.dist-info/RECORD")):
        for row in csv.reader(record.read_text().splitlines()):
            if len(row) < 2 or not row[1] or row[0].startswith(("..", "/")) or "__pycache__" in row[0]:
                continue
            owners.setdefault(row[0], []).append(record.parent.name)
            rows.append((record, row))
    checked, problems = 0, []
    for rel, dists in sorted(owners.items()):
        if len(dists) > 1 and not any(rel == g or rel.startswith(g + "/") for g in gone):
            problems.append(f"{rel} is installed by {' and '.join(dists)} (one overwrote the other)")
    for record, row in rows:
        rel = row[0]
        if any(rel == g or rel.startswith(g + "/") for g in gone) or len(owners[rel]) > 1:
            continue
        f = site / rel
        algo, _, want = row[1].partition("=")
        if not f.is_file():
            problems.append(f"{record.parent.name}: {rel} is missing")
            continue
        got = base64.urlsafe_b64encode(hashlib.new(algo, f.read_bytes()).digest()).rstrip(b"=").decode()
        checked += 1
        if got != want:
            problems.append(f"{record.parent.name}: {rel} does not match its RECORD hash")
    if not checked:
        problems.append(f"no RECORD file was checked in {site}")
    return checked, problems


def pack(site: Path, out: Path) -> None:
    """Deterministic tar (sorted, fixed mtime, root-owned) of the site folder's contents, xz -9 (its 64 MiB window
    finds repeats across files: 1.8 MB smaller than -6, for ~15 % more time; 65 MiB of memory to unpack)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    names = sorted(p.name for p in site.iterdir())
    tar = subprocess.Popen(["tar", "-C", str(site), "--sort=name", "--mtime=2024-01-01 00:00Z", "--owner=0",
                            "--group=0", "--numeric-owner", "--exclude=__pycache__", "-cf", "-", *names],
                           stdout=subprocess.PIPE)
    with tmp.open("wb") as f:
        xz = subprocess.run(["xz", "-9", f"-T{min(2, os.cpu_count() or 1)}", "-c"], stdin=tar.stdout, stdout=f)
    tar.stdout.close()  # type: ignore[union-attr]
    if tar.wait() or xz.returncode:
        tmp.unlink(missing_ok=True)
        raise SpectrialError(f"tar | xz failed (tar {tar.returncode}, xz {xz.returncode}) writing {out}")
    tmp.replace(out)


def tarball_names(path: Path) -> list[str]:
    """Member names of the tarball (reads it through)."""
    with tarfile.open(path, "r:xz") as t:
        return t.getnames()


def check_tarball(path: Path = TARBALL, trimmed: Sequence[str] = ()) -> dict:
    """The tarball exists, is <= LIMIT_BYTES, holds MUST_HAVE and none of the trimmed paths; its figures."""
    if not path.is_file():
        raise SpectrialError(f"no tarball at {path}", hint="run `python scripts/sglang_bundle.py build`")
    size = path.stat().st_size
    if size > LIMIT_BYTES:
        raise SpectrialError(f"{path.name} is {size / 2**20:.1f} MiB, over the {LIMIT_BYTES / 2**20:.0f} MiB limit",
                             hint="trim more (TRIMS / NOT_NEEDED) or look for a wheel that grew")
    names = set(tarball_names(path))
    missing = [m for m in MUST_HAVE if m not in names]
    if missing:
        raise SpectrialError(f"{path.name} lacks {', '.join(missing)}",
                             hint="FlashInfer's data/ and sgl_kernel/sm90/common_ops must be carried")
    leaked = sorted(n for n in names for t in trimmed if n == t or n.startswith(t + "/"))
    if leaked:
        raise SpectrialError(f"{path.name} holds trimmed paths: {', '.join(leaked[:10])}")
    jit = sum(n.startswith(PROTECTED[0]) for n in names)
    return {"tarball_bytes": size, "sha256": sha256_of(path), "members": len(names),
            "flashinfer_data_members": jit}


def restore_built(kept: Path, lock_sha: str, script_sha: str) -> dict | None:
    """The tarball and manifest a build of this lock and this script left in `kept` (BUILD_DIR/bundles/<key>),
    copied into .device/ when they still match (a fresh clone then skips the ~2 min of install and xz -9);
    None when there is none or it does not match."""
    tarball, manifest_file = kept / TARBALL.name, kept / MANIFEST.name
    if not (tarball.is_file() and manifest_file.is_file()):
        return None
    try:
        manifest = json.loads(manifest_file.read_text())
    except ValueError:
        return None
    if (manifest.get("lock_sha256"), manifest.get("script_sha256")) != (lock_sha, script_sha) or manifest.get(
            "sha256") != sha256_of(tarball):
        return None
    DEVICE_DIR.mkdir(parents=True, exist_ok=True)
    partial = DEVICE_DIR / f".{TARBALL.name}.partial"
    shutil.copyfile(tarball, partial)
    partial.replace(TARBALL)
    MANIFEST.write_text(manifest_file.read_text())
    say(f"{TARBALL.relative_to(REPO)}: the build of this lock and this script kept in {kept} (--force rebuilds)")
    return manifest


def keep_built(kept: Path) -> None:
    """Keep a copy of the tarball and its manifest, keyed by the lock's and this script's sha256, for the next
    checkout (written aside, then renamed: other checkouts share BUILD_DIR)."""
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".bundle-", dir=kept.parent))
    except OSError as e:
        say(f"could not keep the build in {kept}: {e}")
        return
    try:
        shutil.copyfile(TARBALL, tmp / TARBALL.name)
        shutil.copyfile(MANIFEST, tmp / MANIFEST.name)
        shutil.rmtree(kept, ignore_errors=True)
        tmp.rename(kept)
    except OSError as e:  # only a cache: the build itself succeeded
        say(f"could not keep the build in {kept}: {e}")
        shutil.rmtree(tmp, ignore_errors=True)


def build(force: bool = False) -> dict:
    """Download, install, trim, check, pack and describe the bundle; skipped when it is up to date."""
    t_start = time.monotonic()
    lock = read_lock()
    lock_sha, script_sha = sha256_of(LOCK), sha256_of(Path(__file__))
    kept = BUILD_DIR / "bundles" / f"{lock_sha[:16]}-{script_sha[:16]}"  # built before, by any checkout
    if not force and TARBALL.is_file() and MANIFEST.is_file():
        old = json.loads(MANIFEST.read_text())
        if (old.get("lock_sha256"), old.get("script_sha256"), old.get("sha256")) == (
                lock_sha, script_sha, sha256_of(TARBALL)):
            say(f"{TARBALL.relative_to(REPO)} is up to date with the lock and this script (--force rebuilds)")
            if not (kept / TARBALL.name).is_file():
                keep_built(kept)
            return old
    if not force:
        restored = restore_built(kept, lock_sha, script_sha)
        if restored is not None:
            return restored
    t0 = time.monotonic()
    wheels = download(lock)
    t_download = time.monotonic() - t0
    problems = check_closure(lock, wheels)
    if problems:
        raise SpectrialError("the locked wheels do not close over their requirements:\n  " + "\n  ".join(problems),
                             hint="re-run `python scripts/sglang_bundle.py lock`")
    site = BUILD_DIR / "site"
    how = install(wheels.values(), site)
    installed_bytes = tree_bytes(site)
    trimmed = apply_trims(site)
    checked, problems = check_record(site, trimmed)
    missing = [m for m in MUST_HAVE if not (site / m).is_file()]
    problems += import_problems(site)
    if missing or problems:
        raise SpectrialError("the installed site is incomplete:\n  " + "\n  ".join(missing + problems[:20]))
    dists = {}
    for d in sorted(site.glob("*.dist-info")):
        name, version = d.name[: -len(".dist-info")].rsplit("-", 1)
        dists[canonicalize_name(name)] = version
    if set(dists) != set(lock):
        raise SpectrialError(f"installed distributions differ from the lock: {sorted(set(dists) ^ set(lock))}")
    unpacked = tree_bytes(site)
    say(f"packing {unpacked / 2**20:.1f} MiB ({len(dists)} distributions) with xz -9 ...")
    t0 = time.monotonic()
    candidate = BUILD_DIR / TARBALL.name  # checked outside .device/, which a device call carries whole
    pack(site, candidate)
    t_pack = time.monotonic() - t0
    try:
        figures = check_tarball(candidate, [t["path"] for t in trimmed])
    except SpectrialError as e:
        raise SpectrialError(f"{e}\n(the rejected tarball: {candidate}; {TARBALL} is unchanged)") from e
    DEVICE_DIR.mkdir(parents=True, exist_ok=True)
    partial = DEVICE_DIR / f".{TARBALL.name}.partial"
    shutil.move(candidate, partial)
    partial.replace(TARBALL)
    manifest = {
        "tarball": TARBALL.name, **figures, "limit_bytes": LIMIT_BYTES,
        "unpacked_bytes": unpacked, "installed_bytes_before_trims": installed_bytes,
        "wheel_bytes": sum(p.stat().st_size for p in wheels.values()), "distributions": dists,
        "replaced_image_packages": REPLACE_IMAGE, "not_carried": NOT_NEEDED, "trimmed": trimmed,
        "must_have": list(MUST_HAVE), "record_files_checked": checked, "installed_with": how,
        "lock": LOCK.relative_to(REPO).as_posix(), "lock_sha256": lock_sha,
        "script_sha256": script_sha,
        "seconds": {"download": round(t_download, 1), "pack": round(t_pack, 1),
                    "total": round(time.monotonic() - t_start, 1)},
        "unpack": f"mkdir -p /tmp/sglang-site && tar -C /tmp/sglang-site -xJf .device/{TARBALL.name}; "
                  "PYTHONPATH=/tmp/sglang-site",
    }
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    keep_built(kept)
    say(f"wrote {TARBALL.relative_to(REPO)}: {figures['tarball_bytes'] / 1e6:.1f} MB "
        f"({figures['tarball_bytes'] / 2**20:.1f} MiB of {LIMIT_BYTES / 2**20:.0f}), {len(dists)} distributions, "
        f"{unpacked / 2**20:.1f} MiB unpacked; manifest {MANIFEST.relative_to(REPO)}")
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: build (default), check, lock."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs="?", default="build", choices=("build", "check", "lock"))
    ap.add_argument("--force", action="store_true", help="build: rebuild even when the tarball is up to date")
    args = ap.parse_args(argv)
    try:
        if args.command == "lock":
            write_lock(*resolve())
        elif args.command == "check":
            if not MANIFEST.is_file():
                raise SpectrialError(f"no manifest {MANIFEST}", hint="run `python scripts/sglang_bundle.py build`")
            manifest = json.loads(MANIFEST.read_text())
            figures = check_tarball(TARBALL, [t["path"] for t in manifest["trimmed"]])
            if manifest.get("sha256") != figures["sha256"]:
                raise SpectrialError(f"{TARBALL.name} does not match {MANIFEST.name}", hint="rebuild: build --force")
            say(f"{TARBALL.name}: {figures['tarball_bytes'] / 2**20:.1f} MiB, {figures['members']} members, ok")
        else:
            build(force=args.force)
    except SpectrialError as e:
        print(f"sglang_bundle {args.command}: FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
