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
