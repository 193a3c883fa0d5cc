#!/usr/bin/env bash
# Issue 15, HERE: what the SGLang device calls carry (nothing of it is committed; all git-ignored).
#
#   scripts/device_sglang_prepare.sh          bundle + wheels + check
#   scripts/device_sglang_prepare.sh bundle   .device/sglang-0.5.17.tar.xz (scripts/sglang_bundle.py: < 60 MiB)
#   scripts/device_sglang_prepare.sh wheels   .whl-sglang/cli: what spectrial's CLI needs beyond the image and
#                                             the bundle (invoke, tenacity, ahocorasick-rs: 3 wheels, 0.6 MB);
#                                             .whl-sglang/nb: what the notebooks need beyond those (papermill,
#                                             ipykernel, plotly, ...: device_prepare.sh's set minus the bundle's);
#                                             needs the bundle's manifest .device/sglang-0.5.17.json (`bundle`)
#   scripts/device_sglang_prepare.sh check    each call's payload under 64 MiB: call1 = tree + tarball + cli,
#                                             call2 = tree + nb (the warm machine keeps what call1 unpacked)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-.venv/bin/python}
TARBALL=.device/sglang-0.5.17.tar.xz
OUTW=.whl-sglang
LIMIT=$((64 * 1024 * 1024))
PLATFORMS=(--platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
CLI_WHEELS=(invoke==2.2.1 tenacity==9.2.1 ahocorasick-rs==1.0.3)

say() { echo "[device_sglang_prepare] $*"; }

download() {  # download DIR SPEC...: cp312 manylinux wheels, no dependencies (the lists are complete)
  local dir=$1; shift
  mkdir -p "$dir"
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --abi abi3 --abi none "${PLATFORMS[@]}" -d "$dir" "$@"
}

do_bundle() { "$PY" scripts/sglang_bundle.py; }

do_wheels() {
  [ -f .device/sglang-0.5.17.json ] || { say "no .device/sglang-0.5.17.json: build the bundle first ($0 bundle)"; exit 1; }
  rm -rf "$OUTW" && mkdir -p "$OUTW"
  download "$OUTW/cli" "${CLI_WHEELS[@]}"
  # the notebook set: device_prepare.sh's WHEELS that the bundle does not already carry
  mapfile -t nb < <(bash -c 'source <(sed -n "/^WHEELS=(/,/^)/p" scripts/device_prepare.sh); printf "%s\n" "${WHEELS[@]}"' \
    | "$PY" -c '
import json, re, sys
carried = {re.sub(r"[-_.]+", "-", d["name"] if isinstance(d, dict) else d).lower()
           for d in json.load(open(".device/sglang-0.5.17.json"))["distributions"]}
for spec in sys.stdin.read().split():
    if re.sub(r"[-_.]+", "-", spec.split("==")[0]).lower() not in carried:
        print(spec)')
  download "$OUTW/nb" "${nb[@]}"
  say "cli: $(ls "$OUTW/cli" | wc -l) wheels, $(du -sb "$OUTW/cli" | cut -f1) bytes; nb: $(ls "$OUTW/nb" | wc -l) wheels, $(du -sb "$OUTW/nb" | cut -f1) bytes"
}

do_check() {
  local tree call1 call2
  tree=$(git ls-files -z | xargs -0 stat -c %s | awk '{s+=$1} END {print s}')
  tree=$((tree + $(git ls-files -z --others --exclude-standard | xargs -0 -r stat -c %s | awk '{s+=$1} END {print s+0}')))
  call1=$((tree + $(stat -c %s "$TARBALL") + $(du -sb "$OUTW/cli" | cut -f1)))
  call2=$((tree + $(du -sb "$OUTW/nb" | cut -f1)))
  say "working tree $((tree / 1024)) KiB; call1 (tree + $TARBALL + $OUTW/cli) $((call1 / 1024)) KiB; call2 (tree + $OUTW/nb) $((call2 / 1024)) KiB (limit 65536 KiB)"
  [ "$call1" -le "$LIMIT" ] || { say "call1 payload over 64 MiB: $(( (call1 - LIMIT) / 1024 )) KiB too much (the working tree grew? see docs/DEVICE.md, section 7)"; return 1; }
  [ "$call2" -le "$LIMIT" ] || { say "call2 payload over 64 MiB"; return 1; }
}

case "${1:-all}" in
  bundle) do_bundle ;;
  wheels) do_wheels ;;
  check) do_check ;;
  all) do_bundle; do_wheels; do_check ;;
  *) sed -n '2,13p' "$0" >&2; exit 2 ;;
esac
