#!/usr/bin/env bash
# Run spectrial's NCCL tuning check (issue 10) on a multi-GPU device machine; leave the run record in OUT.
#
# Usage: scripts/device_nccl_check.sh OUT [PARAMS] [-p NAME=VALUE ...]
#   OUT     folder for the record: OUT/<run-id>/{manifest.json,latency.csv,summary.csv,nccl.log} and
#           OUT/console.log (5 files, 2 levels, each well under 16 MB)
#   PARAMS  default params/nccl-check-h200x2.yaml (2 GPUs, 4 sets x 2 rounds, ~1-2 min)
#   -p      overrides, as for `spectrial nccl-check` (e.g. -p rounds=1 -p iters=50)
# Environment:
#   PYTHON  interpreter with torch+CUDA+NCCL (default /opt/torch/.venv/bin/python3 if present, else python3)
#   WHEELS  folder of wheels for the modules this script reports missing; installed offline
#           (pip --no-index --find-links) into the interpreter's environment, else into a temp folder
# The machine needs no network: it runs from this repository copy (PYTHONPATH=lib), no install of spectrial.
# Exit: 0 ok, 1 a set failed (the record says why), 2 bad parameters, 3 missing modules.
set -euo pipefail

if [ $# -lt 1 ] || [ "${1:0:1}" = "-" ]; then
  sed -n '2,16p' "$0" >&2
  exit 2
fi
OUT=$1; shift
PARAMS=params/nccl-check-h200x2.yaml
if [ $# -gt 0 ] && [ "${1:0:1}" != "-" ]; then PARAMS=$1; shift; fi

cd "$(dirname "$0")/.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [ -z "${PYTHON:-}" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PYTHON=/opt/torch/.venv/bin/python3; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD/lib${PYTHONPATH:+:$PYTHONPATH}"

# import name -> pip name, for everything the parent and the workers import
MODULES="torch:torch numpy:numpy pandas:pandas pyarrow:pyarrow pydantic:pydantic yaml:pyyaml psutil:psutil invoke:invoke"

missing_modules() {
  "$PYTHON" - "$MODULES" <<'EOF'
import importlib, sys
miss = []
for pair in sys.argv[1].split():
    mod, pip = pair.split(":")
    try:
        importlib.import_module(mod)
    except Exception as exc:  # ImportError, or a broken install
        miss.append((mod, pip, f"{type(exc).__name__}: {exc}"))
for mod, pip, why in miss:
    print(f"{mod} {pip} {why}")
EOF
}

echo "python: $PYTHON ($("$PYTHON" -c 'import sys; print(sys.version.split()[0])'))"
MISSING=$(missing_modules)
if [ -n "$MISSING" ] && [ -n "${WHEELS:-}" ]; then
  PIPS=$(echo "$MISSING" | awk '{print $2}' | tr '\n' ' ')
  echo "installing from $WHEELS (offline): $PIPS"
  if "$PYTHON" -m pip --version >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    "$PYTHON" -m pip install -q --no-index --find-links "$WHEELS" $PIPS || {
      SITE=$(mktemp -d /tmp/spectrial-site.XXXX)
      # shellcheck disable=SC2086
      "$PYTHON" -m pip install -q --no-index --find-links "$WHEELS" --target "$SITE" $PIPS
      export PYTHONPATH="$PYTHONPATH:$SITE"
    }
  elif command -v uv >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    uv pip install -q --python "$PYTHON" --no-index --find-links "$WHEELS" $PIPS
  else
    echo "no pip for $PYTHON and no uv: cannot install from $WHEELS" >&2
  fi
  MISSING=$(missing_modules)
fi
if [ -n "$MISSING" ]; then
  echo "missing python modules for $PYTHON (import name, pip name, error):" >&2
  echo "$MISSING" | sed 's/^/  /' >&2
  echo "pip names: $(echo "$MISSING" | awk '{print $2}' | tr '\n' ' ')" >&2
  echo "carry their wheels (python $("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])'), no network here) and set WHEELS=DIR" >&2
  exit 3
fi

{
  echo "== nvidia-smi -L"; nvidia-smi -L 2>&1 || true
  echo "== nvidia-smi topo -m"; nvidia-smi topo -m 2>&1 || true
  echo "== multicast-off variables in this shell: NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE-unset}" \
       "TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST-unset}" \
       "NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS-unset} (spectrial adds them to every set)"
} 2>&1 | tee "$OUT/console.log"

# `python -c`, not `python -` (stdin): multiprocessing spawn re-imports a main *file*; <stdin> is none
read -r -d '' CODE <<'EOF' || true
import sys
import time

import pandas as pd

from spectrial.errors import SpectrialError
from spectrial.nccl import load_nccl_params, run_nccl_check
from spectrial.params import parse_overrides
from spectrial.readers import nccl as nccl_tables

params_file, out, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
pairs = [rest[i + 1] for i in range(len(rest) - 1) if rest[i] in ("-p", "--param")]
t0 = time.monotonic()
try:
    params = load_nccl_params(params_file, {**parse_overrides(pairs), "output_dir": out})
    result = run_nccl_check(params)
except SpectrialError as exc:
    print(f"error: {exc}")
    sys.exit(2)
pd.set_option("display.width", 220)
pd.set_option("display.max_columns", 30)
print(nccl_tables.visibility_table(result.manifest).to_string(index=False))
s = result.summary()
print(s[["set", "group", "size", "role", "n", "p50_us", "p90_us", "p99_us"]].round(1).to_string(index=False))
st = nccl_tables.settings_table(result.manifest)
print(st.to_string(index=False) if not st.empty else "no NCCL settings parsed")
c = result.comparisons()
print(c.round(3).to_string(index=False) if not c.empty else "no comparisons")
print(result.verdict())
print(f"run record: {result.run_dir} status {result.status} in {time.monotonic() - t0:.0f} s")
sys.exit(0 if result.status == "ok" else 1)
EOF
set +e
"$PYTHON" -c "$CODE" "$PARAMS" "$OUT" "$@" 2>&1 | tee -a "$OUT/console.log"
rc=${PIPESTATUS[0]}
exit "$rc"
