"""Provision `llama-server` (and `rpc-server`): build from the pinned llama-cpp-python sdist, cache it.

The sdist is downloaded from the package index (`pip download`), only `vendor/llama.cpp` is unpacked,
and only the target a trial asks for is built: `llama-server` (what every trial runs), `rpc-server` the first
time a multi-host trial needs it (in the same build folder, so it compiles only its own two files then). Builds
are cached under `<cache>/llama.cpp/bin/<key>/`, keyed by the sdist version and the build flags, so each machine
builds once per configuration.
`<cache>` is `$SPECTRIAL_CACHE` or `~/.cache/spectrial`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import TextIO, TypeVar

from spectrial.cache import _say, cache_root, locked, publish  # noqa: F401 (their names here too)
from spectrial.errors import HostError
from spectrial.progress import Progress

_NINJA_RE = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE_RE = re.compile(r"^\[\s*(\d+)%\]")

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
# the sdist on PyPI's file host (a content-addressed path: PyPI's simple index links it), with its sha256
SDIST_URL = ("https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/"
             "llama_cpp_python-0.3.36.tar.gz")
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_MAX_BYTES = 200 << 20
TARGETS = {"llama-server": "llama-server", "rpc-server": "ggml-rpc-server"}  # installed name -> CMake target
BASE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_RPC=ON",
)


T = TypeVar("T")
REFERENCE_BUILD = (2, 299.0)  # (jobs, seconds): llama-server alone, a fresh 2-core machine (cold_demo.sh)
CONFIGURE_S = 15.0  # cmake's configure step before compiling


def build_flags(cuda: bool = False, cuda_arch: str = "90") -> list[str]:
    """CMake flags for a CPU build, or a CUDA build for `cuda_arch`."""
    flags = list(BASE_FLAGS)
    if cuda:
        flags += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}"]
    return flags


def build_key(cuda: bool = False, cuda_arch: str = "90") -> str:
    """Cache key: sdist version + flavour + hash of the flags."""
    flags = build_flags(cuda, cuda_arch)
    digest = hashlib.sha256(" ".join(flags).encode()).hexdigest()[:10]
    return f"{LLAMA_CPP_PYTHON_VERSION}-{'cuda' + cuda_arch if cuda else 'cpu'}-{digest}"


def binary_path(name: str = "llama-server", cuda: bool = False, cuda_arch: str = "90") -> Path:
    return cache_root() / "llama.cpp" / "bin" / build_key(cuda, cuda_arch) / name


def sdist(dest: Path | None = None) -> Path:
    """The pinned llama-cpp-python sdist, downloaded once into the cache and checked against its sha256: straight
    from PyPI's file host (under a second), else through `pip download` (which prepares the sdist's metadata first:
    ~55 s on a fresh 2-core machine; the way in when only a mirror that pip is told of can be reached)."""
    dest = dest or cache_root() / "llama.cpp" / "sdist"
    path = dest / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    if path.is_file():
        return path
    dest.mkdir(parents=True, exist_ok=True)
    _say(f"downloading llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} sdist (~76 MB) ...")
    why = _fetch_sdist(path)
    if why is None:
        return path
    _say(f"the direct download failed ({why}): trying pip download")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
           f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(dest)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 or not path.is_file():
        raise HostError("local", " ".join(cmd), res.returncode, res.stdout, res.stderr,
                               "the package index must be reachable; or set engine_bin to your own llama-server")
    if (got := hashlib.sha256(path.read_bytes()).hexdigest()) != SDIST_SHA256:
        path.unlink()
        raise HostError("local", " ".join(cmd), 0, "", f"sha256 {got}, expected {SDIST_SHA256}",
                        "the index served another file under the pinned version: check the index pip uses")
    return path


def _fetch_sdist(path: Path, timeout_s: float = 300.0) -> str | None:
    """The pinned sdist from SDIST_URL into `path` (bounded: a deadline, SDIST_MAX_BYTES, the pinned sha256);
    None when it is there, else why not."""
    import httpx

    tmp = path.with_name(path.name + f".{os.getpid()}.part")
    h, size, t_end = hashlib.sha256(), 0, time.monotonic() + timeout_s
    try:
        with httpx.stream("GET", SDIST_URL, timeout=30.0, follow_redirects=True) as resp, tmp.open("wb") as fh:
            if resp.status_code != 200:
                return f"HTTP {resp.status_code} from {SDIST_URL}"
            for chunk in resp.iter_bytes(1 << 20):
                size += len(chunk)
                if size > SDIST_MAX_BYTES or time.monotonic() > t_end:
                    return f"over {SDIST_MAX_BYTES} bytes or {timeout_s:.0f} s"
                h.update(chunk)
                fh.write(chunk)
        if h.hexdigest() != SDIST_SHA256:
            return f"sha256 {h.hexdigest()}, expected {SDIST_SHA256}"
        os.replace(tmp, path)
        return None
    except (httpx.HTTPError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        tmp.unlink(missing_ok=True)


def source_dir() -> Path:
    """`vendor/llama.cpp` of the sdist, unpacked once into the cache."""
    out = cache_root() / "llama.cpp" / "src" / LLAMA_CPP_PYTHON_VERSION
    marker = out / ".complete"
    if marker.is_file():
        return out / "llama.cpp"
    with locked(out.with_suffix(".lock")):
        if marker.is_file():
            return out / "llama.cpp"
        tar_path = sdist()
        prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with tarfile.open(tar_path) as tar:
            members = []
            for m in tar.getmembers():
                if m.name.startswith(prefix):
                    m.name = "llama.cpp/" + m.name[len(prefix):]
                    members.append(m)
            tar.extractall(tmp, members=members, filter="data")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        marker.touch()
    return out / "llama.cpp"


def ensure_llama_server(cuda: bool = False, cuda_arch: str = "90", jobs: int | None = None,
                        src: Path | None = None) -> Path:
    """Path of a cached `llama-server` built for this configuration; builds it the first time."""
    return ensure_binary("llama-server", cuda, cuda_arch, jobs, src)


def ensure_binary(name: str, cuda: bool = False, cuda_arch: str = "90", jobs: int | None = None,
                  src: Path | None = None) -> Path:
    """Path of a cached `name` (a key of `TARGETS`) built for this configuration; builds its target the first time,
    in the configuration's one build folder (a second binary reuses what the first compiled)."""
    if name not in TARGETS:
        raise ValueError(f"no llama.cpp target for {name!r}; known: {', '.join(TARGETS)}")
    binary = binary_path(name, cuda, cuda_arch)
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    key = build_key(cuda, cuda_arch)
    with locked(binary.parent.with_suffix(".lock"), name):
        if binary.is_file():
            return binary
        src = src or source_dir()
        build = cache_root() / "llama.cpp" / "build" / key
        jobs = jobs or os.cpu_count() or 2
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        first = not (build / "CMakeCache.txt").is_file()
        eta_s, basis = build_estimate(jobs, cuda) if first else (None, "reusing the objects already built")
        _say(f"building {name} ({key}) with {jobs} jobs; first time only: "
             f"{'about ' + _clock(eta_s) if eta_s else 'no estimate'} ({basis}) ...")
        t0 = time.monotonic()
        log = build.parent / f"{key}.log"
        build.parent.mkdir(parents=True, exist_ok=True)
        steps = ([["cmake", "-S", str(src), "-B", str(build), *generator, *build_flags(cuda, cuda_arch)]] if first
                 else []) + [["cmake", "--build", str(build), "--target", TARGETS[name], f"-j{jobs}"]]
        with log.open("a") as fh:
            for cmd in steps:
                fh.write(f"$ {' '.join(cmd)}\n")
                fh.flush()
                code = _run_with_progress(cmd, fh, "compiling" if "--build" in cmd else "configuring", eta_s)
                if code != 0:
                    tail = "\n".join(log.read_text().splitlines()[-30:])
                    raise HostError("local", " ".join(cmd), code, tail, "", f"full build log: {log}")
        binary.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(build / "bin" / TARGETS[name], binary.parent / f".{name}.tmp")
        os.replace(binary.parent / f".{name}.tmp", binary)
        _say(f"built in {time.monotonic() - t0:.0f} s -> {binary}")
    return binary


def _clock(secs: float) -> str:
    """Seconds as m:ss (h:mm:ss from an hour)."""
    m, sec = divmod(int(round(secs)), 60)
    return f"{m // 60}:{m % 60:02d}:{sec:02d}" if m >= 60 else f"{m}:{sec:02d}"


def _ninja_core_s(log: Path) -> float | None:
    """Seconds of compiling summed over the steps of a ninja log (`.ninja_log`: start and end ms per step)."""
    total = 0
    try:
        for line in log.read_text().splitlines():
            cols = line.split("\t")
            if not line.startswith("#") and len(cols) >= 2 and cols[0].isdigit() and cols[1].isdigit():
                total += int(cols[1]) - int(cols[0])
    except OSError:
        return None
    return total / 1000 if total > 0 else None


def build_estimate(jobs: int, cuda: bool = False) -> tuple[float | None, str]:
    """(seconds, basis): how long a build with `jobs` jobs should take. The measurement cached on this machine
    comes first: the compile time of the newest cached build of the same flavour (CPU or CUDA; its ninja log
    holds each step's time), divided among the jobs (at most the cores); else, for a CPU build, the reference
    measurement `REFERENCE_BUILD` (a fresh machine); a CUDA build without a measurement gets no estimate."""
    flavour = "cuda" if cuda else "cpu"
    logs = sorted((cache_root() / "llama.cpp" / "build").glob(f"*-{flavour}*/.ninja_log"),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    parallel = max(1, min(jobs, os.cpu_count() or jobs))
    for log in logs:
        if (core_s := _ninja_core_s(log)) is not None:
            return CONFIGURE_S + core_s / parallel, (f"the {log.parent.name} build on this machine compiled for "
                                                     f"{core_s:.0f} core-seconds")
    if cuda:
        return None, "no build measured on this machine yet; a CUDA build compiles every kernel: expect far longer"
    ref_jobs, ref_s = REFERENCE_BUILD
    return ref_s * ref_jobs / parallel, f"no build measured on this machine yet; measured: {ref_s:.0f} s with " \
                                        f"{ref_jobs} jobs on 2 quiet cores"


def _run_with_progress(cmd: list[str], log: TextIO, what: str, eta_s: float | None = None) -> int:
    """Run a build step, its output into `log`, showing the build tool's progress (ninja `[n/m]`, make
    `[ nn%]`) as a bar in a terminal, as a line every 10 % elsewhere with the elapsed time and the time left
    (from `eta_s`, the whole build's estimate, until a fifth is done; then from the rate so far)."""
    bar = Progress(f"llama.cpp: {what}", total=100, unit="%")
    shown = 0
    t0 = time.monotonic()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            m = _NINJA_RE.match(line) or _MAKE_RE.match(line)
            if not m:
                continue
            pct = int(int(m[1]) * 100 / max(1, int(m[2]))) if m.lastindex == 2 else int(m[1])
            if pct > shown:
                bar.update(pct - shown)
                if bar.mode == "line" and pct // 10 > shown // 10:
                    secs = time.monotonic() - t0
                    left = (eta_s - secs if eta_s and pct < 20 and eta_s > secs
                            else secs * (100 - pct) / max(pct, 1))
                    _say(f"{what}: {pct} % after {_clock(secs)}, about {_clock(left)} left")
                shown = pct
        code = proc.wait()
    bar.close(f"done (exit {code})")
    return code
