# Sourced first by the device scripts (scripts/device_run.sh, scripts/device_sglang.sh): the repository root as
# the working folder, $OUT checked, the clock and budget every phase reads, the cache, NVLink multicast off.
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
REPO=$PWD
: "${OUT:?OUT is not set: run this through the device tool (or set OUT=some/folder)}"
mkdir -p "$OUT"
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-555}
export SPECTRIAL_CACHE=${SPECTRIAL_CACHE:-$HOME/.cache/spectrial}
# NVLink multicast stays off (KINDS.md), here and in everything started from here
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYDEVD_DISABLE_FILE_VALIDATION=1

# One folder per call, named like the call's pack: `call_begin NAME` (NAME: the call, or its phases joined by
# '-') sets CALL_ID=NAME-HHMMSS (the start, UTC) and CALL_DIR=$WORK/device-$CALL_ID, which holds this call's
# device.log (its output only: nothing is appended across calls) and timings.tsv (its phases only).
# `call_pack FILE...` writes $OUT/device-$CALL_ID.tar.gz: that folder, with FILEs (paths under $WORK, those
# that exist) copied in, so unpacking several calls' packs side by side never overwrites a file.
call_begin() {
  CALL_ID="$1-$(date -u -d "@$T0" +%H%M%S)"
  CALL_DIR="$WORK/device-$CALL_ID"
  mkdir -p "$CALL_DIR"
  printf 'call\tphase\tseconds\trc\n' > "$CALL_DIR/timings.tsv"
  exec > >(tee "$CALL_DIR/device.log") 2>&1
}
call_timing() {  # call_timing PHASE SECONDS RC: one row of this call's timings.tsv
  printf '%s\t%s\t%s\t%s\n' "$CALL_ID" "$1" "$2" "$3" >> "$CALL_DIR/timings.tsv"
}
call_pack() {
  local f
  for f in "$@"; do [ -f "$WORK/$f" ] && cp -f "$WORK/$f" "$CALL_DIR/"; done
  tar -C "$WORK" --warning=no-file-changed -czf "$OUT/device-$CALL_ID.tar.gz" "device-$CALL_ID"
  echo "$OUT/device-$CALL_ID.tar.gz"
}

# The lent GPU (issue 41), once per call, before any server start: GPU_NAME as nvidia-smi prints it, GPU_KEY its
# params/hardware.yaml key (spectrial.analysis.gpu_key: h100_sxm, h200_sxm, ...), GPU_SLUG the run ids' prefix
# (h100-sxm), GPU_ARCH its compute capability without the dot (90). A GPU the table lacks stops the call (exit 2)
# saying what to add. SPECTRIAL_GPU_NAME stands in for nvidia-smi's name (a rehearsal on a machine without one);
# with neither, GPU_SLUG is `nogpu`. Needs $PY and a PYTHONPATH that finds spectrial; `gpu_identify soft` returns 3
# instead when spectrial's dependencies are not importable yet (a fresh machine before its setup phase).
gpu_identify() {
  local name rc
  name=${SPECTRIAL_GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)}
  GPU_ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
  GPU_ARCH=${GPU_ARCH:-90}
  if [ -z "$name" ]; then
    GPU_NAME="" GPU_KEY="" GPU_SLUG=nogpu
    echo "[device] no GPU found by nvidia-smi: run ids say nogpu"
  else
    GPU_KEY=$("$PY" -c 'import sys
try:
    from spectrial.analysis import gpu_key
    from spectrial.errors import ConfigError
except ImportError as exc:
    print(f"[device] cannot name the GPU yet ({exc}): after the setup phase", file=sys.stderr)
    sys.exit(3)
try:
    print(gpu_key(sys.argv[1]))
except ConfigError as exc:
    sys.exit(f"[device] {exc}")' "$name")
    rc=$?
    if [ "$rc" = 3 ] && [ "${1:-}" = soft ]; then return 3; fi
    [ "$rc" = 0 ] || exit 2
    GPU_NAME=$name GPU_SLUG=${GPU_KEY//_/-}
    echo "[device] GPU: $GPU_NAME = $GPU_KEY (params/hardware.yaml), compute capability $GPU_ARCH; run ids start $GPU_SLUG-"
  fi
  export GPU_NAME GPU_KEY GPU_SLUG GPU_ARCH
}
