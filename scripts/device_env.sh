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
