#!/usr/bin/env bash
# Issue 15, HERE: what the SGLang device calls carry (nothing of it is committed; all git-ignored).
#
#   scripts/device_sglang_prepare.sh          bundle + parts + wheels + check
#   scripts/device_sglang_prepare.sh bundle   .device/sglang-0.5.17.tar.xz (scripts/sglang_bundle.py: < 60 MiB)
#   scripts/device_sglang_prepare.sh parts    the tarball in two halves, one folder each for a call to carry:
#                                             .device/sglang-part1/, .device/sglang-part2/ (bundle.part and PART:
#                                             "<sha256> <tarball name> <k> <n>"); the device puts them together
#   scripts/device_sglang_prepare.sh wheels   .whl-sglang/cli: what spectrial's CLI needs beyond the image and
#                                             the bundle (invoke, tenacity, ahocorasick-rs, savvi,
#                                             py-markdown-table: 5 wheels, ~0.7 MB);
#                                             .whl-sglang/nb: what the notebooks need beyond those (papermill,
#                                             ipykernel, plotly, ...: device_prepare.sh's set minus the bundle's);
#                                             needs the bundle's manifest .device/sglang-0.5.17.json (`bundle`)
#   scripts/device_sglang_prepare.sh check    each documented call's payload under 48 MiB (the tool's limit is 64:
#                                             the rest is room for the working tree to grow): stage = tree + part1,
#                                             call1 = tree + part2 + cli, call2 = tree + nb (a warm machine keeps
#                                             what the calls before left); tests/house/test_device_payload.py too
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-.venv/bin/python}
TARBALL=.device/sglang-0.5.17.tar.xz
OUTW=.whl-sglang
PLATFORMS=(--platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# savvi (+ py-markdown-table): `decide:` (spectrial.analysis.sequential imports savvi.linear_regression only, so
# savvi's cvxpy requirement, for its other models, is left behind)
CLI_WHEELS=(invoke==2.2.1 tenacity==9.2.1 ahocorasick-rs==1.0.3 savvi==0.3.1 py-markdown-table==2.0.0)

say() { echo "[device_sglang_prepare] $*"; }

download() {  # download DIR SPEC...: cp312 manylinux wheels, no dependencies (the lists are complete)
  local dir=$1; shift
  mkdir -p "$dir"
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --abi cp312 --abi abi3 --abi none "${PLATFORMS[@]}" -d "$dir" "$@"
}

do_bundle() { "$PY" scripts/sglang_bundle.py; }

do_parts() {  # two halves of the tarball, each in the folder one call carries
  [ -f "$TARBALL" ] || { say "no $TARBALL: build the bundle first ($0 bundle)"; exit 1; }
  local sha size half k
  sha=$(sha256sum "$TARBALL" | cut -d' ' -f1)
  size=$(stat -c %s "$TARBALL")
  half=$(( (size + 1) / 2 ))
  rm -rf .device/sglang-part1 .device/sglang-part2
  mkdir -p .device/sglang-part1 .device/sglang-part2
  head -c "$half" "$TARBALL" > .device/sglang-part1/bundle.part
  tail -c "+$((half + 1))" "$TARBALL" > .device/sglang-part2/bundle.part
  for k in 1 2; do printf '%s %s %d 2\n' "$sha" "$(basename "$TARBALL")" "$k" > ".device/sglang-part$k/PART"; done
  [ "$(cat .device/sglang-part1/bundle.part .device/sglang-part2/bundle.part | sha256sum | cut -d' ' -f1)" = "$sha" ] \
    || { say "the two parts do not make the tarball again"; exit 1; }
  say "parts: $(stat -c %s .device/sglang-part1/bundle.part) + $(stat -c %s .device/sglang-part2/bundle.part) bytes of $TARBALL ($sha)"
}

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

do_check() {  # each documented call's payload (docs/DEVICE.md, section 7): the tree plus what it carries
  "$PY" -m pytest -q -p no:randomly tests/house/test_device_payload.py
}

case "${1:-all}" in
  bundle) do_bundle ;;
  parts) do_parts ;;
  wheels) do_wheels ;;
  check) do_check ;;
  all) do_bundle; do_parts; do_wheels; do_check ;;
  *) sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
