#!/usr/bin/env bash
# Issue 41: `make demo` as a fresh machine runs it, then again warm. A clone of this checkout's HEAD with empty
# caches (spectrial's: the llama.cpp sdist and build, the tiny models; pip's; uv's), `make demo` timed, then the same
# `make demo` again (everything cached). Prints both wall times, the phases (the Python install, the build, the
# trial) and the demo's last lines (the headline). Nothing outside WORK is touched; WORK is removed unless KEEP=1.
#   benchmarks/cold_demo.sh            (~6-8 min on 2 cores, most of it compiling llama-server)
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$(mktemp -d /tmp/cold-demo.XXXXXX)}
trap '[ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"' EXIT
git clone -q "$HERE" "$WORK/repo"
export SPECTRIAL_CACHE=$WORK/cache PIP_CACHE_DIR=$WORK/pip UV_CACHE_DIR=$WORK/uv
cd "$WORK/repo"
stamp() { date +%s.%N; }
run() {  # run NAME: `make demo` into $WORK/NAME.log, each line prefixed with its second; prints the wall time
  local t0 t1
  t0=$(stamp)
  make demo 2>&1 | while IFS= read -r line; do printf '%7.1f %s\n' "$(echo "$(stamp) - $t0" | bc)" "$line"; done \
    > "$WORK/$1.log"
  t1=$(stamp)
  printf '%s make demo: %.0f s\n' "$1" "$(echo "$t1 - $t0" | bc)"
}
echo "cold and warm make demo of $(git log -1 --format='%h %s' | cut -c1-80) on $(nproc) cores ($(uname -m))"
run cold
grep -E "installed spectrial|downloading|building llama-server|built in|waiting for llama-server-baseline|executed notebook" \
  "$WORK/cold.log" | cut -c1-150
run warm
echo "--- the warm demo's last lines:"
tail -n 12 "$WORK/warm.log" | cut -c1-160
