#!/usr/bin/env bash
# Issue 9, ON THE DEVICE (`nvidia-h200-x2`; one GPU used), from the repository root, with $OUT set.
# Needs the carried paths .device (stripped llama.cpp sources) and .whl (wheels): scripts/device_prepare.sh.
#
#   scripts/device_run.sh call1   setup, src, nccl, [build | models] in parallel, nb02, pack   (~6-8 min)
#   scripts/device_run.sh call2   setup, src, build*, models*, sweep, nb05, pack                 (~5-6 min)
#   scripts/device_run.sh PHASE.. any phases in order: setup src build models nccl nb02 sweep nb05 pack
#                                 (the call is named after them: `sweep nb05 pack` is `sweep-nb05-pack`)
#   scripts/device_run.sh all     everything in one go (more than one 10-minute call: see docs/DEVICE.md)
#   scripts/device_run.sh plan    the notebook-02 arms and the sweep's exact commands (anywhere; no GPU)
# (* skipped when this machine already has them: a warm machine keeps ~/.cache/spectrial and /tmp.)
# NCCL_MODE=before (default: the NCCL check of issue 10 alone, first) | parallel (beside the build) | skip.
#
# The sweep runs notebooks/03_sweep.ipynb on params/h200-8b.yaml (its arms are the grid) with a time budget
# that ends it cleanly; NB03=none runs the plain `spectrial trial` instead.
# Every phase prints its start, its end, its exit status and its seconds (also in timings.tsv). Work that
# starts servers stops at a deadline (BUDGET_S seconds after this script started, default 555) so that the
# records are packed inside the call's 600 s: the notebook cell, or the plain trial, gets SIGINT and its
# server is stopped. $OUT receives at most 3 files per call from this script:
#   $OUT/<run-id>.tar.gz             one per run record made in this call (the folder outputs/<run-id>/)
#   $OUT/device-<call>-<HHMMSS>.tar.gz the folder device-<call>-<HHMMSS>/ (HHMMSS: the call's start, UTC): this
#                                    call's device.log and timings.tsv, device-info.txt, gpu-samples.csv, build.log
#                                    (packs of several calls unpack side by side, never overwriting each other)
# plus, with the nccl phase, scripts/device_nccl_check.sh's 5 files under $OUT/nccl/.
set -uo pipefail

# shellcheck source=scripts/device_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
CALL=${1:-help}
for d in /usr/local/cuda/bin /opt/torch/.venv/bin; do
  [ -d "$d" ] && case ":$PATH:" in *":$d:"*) ;; *) PATH="$PATH:$d" ;; esac
done
export PATH
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=python3
SITE=${SITE:-/tmp/site}
MODELS=${MODELS:-/tmp/models/llama3-8b}
RUNS=${RUNS:-/tmp/spectrial-runs}
WORK=${WORK:-/tmp/spectrial-device}
PARAMS=${PARAMS:-params/h200-8b.yaml}
SRC_TAR=.device/llama.cpp-src.tar.xz
SRC_ROOT=$SPECTRIAL_CACHE/llama.cpp/src-stripped
SRC_DIR=$SRC_ROOT/llama.cpp
VOCAB=$SRC_DIR/models/ggml-vocab-llama-bpe.gguf
NB03=${NB03:-notebooks/03_sweep.ipynb}  # NB03=none: the plain `spectrial trial` instead
export PYTHONPATH="$SITE:$REPO/lib${PYTHONPATH:+:$PYTHONPATH}"
PHASES=" setup src build models nccl nb02 sweep nb05 pack "
[ $# -gt 0 ] || { sed -n '2,24p' "$0" >&2; exit 2; }
case "$CALL" in
  call1|call2|all|plan) ;;
  *)
    for p in "$@"; do
      [[ "$PHASES" == *" $p "* ]] || { sed -n '2,24p' "$0" >&2; [ "$p" = help ] || echo "unknown: $p" >&2; exit 2; }
    done
    CALL=$(IFS=-; echo "$*")  # a phase list: the call is named after its phases
    ;;
esac
mkdir -p "$WORK" "$RUNS"
RECORDS="$WORK/records-$CALL-$T0.txt"   # run ids made in this call, packed by `pack`
MARKER="$WORK/start-$CALL-$T0"          # record folders newer than this were made in this call
: > "$RECORDS"; : > "$MARKER"
call_begin "$CALL"  # device_env.sh: $CALL_DIR holds this call's device.log and timings.tsv
trap 'sleep 0.5' EXIT  # let tee flush the last lines into the call's output
if [ "$CALL" = plan ]; then GPU_SLUG=plan GPU_ARCH=90; else gpu_identify; fi  # device_env.sh: GPU_KEY, GPU_SLUG; unknown: exit 2
if [ "$GPU_ARCH" != 90 ] && [ "$CALL" != plan ]; then  # params/h200-8b.yaml's CUDA build: engine_config.cuda_arch "90"
  echo "[device_run] GPU compute capability $GPU_ARCH: the recipe builds llama.cpp for sm_90 (params/h200-8b.yaml," \
       "engine_config.cuda_arch) and this script's build phase; set both to $GPU_ARCH for this GPU" >&2
  exit 2
fi

elapsed() { echo $(( $(date +%s) - T0 )); }
remaining() { echo $(( BUDGET_S - $(elapsed) )); }
say() { echo "[device_run +$(elapsed)s] $*"; }

phase() {  # phase NAME: run phase_NAME, print and record its seconds and status
  local name=$1 t rc
  t=$(date +%s)
  say "=== $name: start"
  "phase_$name"
  rc=$?
  call_timing "$name" "$(( $(date +%s) - t ))" "$rc"
  say "=== $name: rc=$rc in $(( $(date +%s) - t )) s"
  return "$rc"
}

# --- phases ----------------------------------------------------------------------------------------------
phase_setup() {  # wheels into $SITE (once per machine), device facts, a GPU clock/thermal sampler
  local stamp
  stamp=$(ls .whl/*.whl 2>/dev/null | sort | sha256sum | cut -c1-16)
  if [ "$(cat "$SITE/.stamp" 2>/dev/null)" != "$stamp" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
      || return 1
    echo "$stamp" > "$SITE/.stamp"
  else
    say "wheels already in $SITE"
  fi
  "$PY" -c 'import pydantic, plotly, papermill, ipykernel, gguf, invoke, spectrial.protocol.trial' || return 1
  {
    echo "== date"; date -u +%FT%TZ
    echo "== uname"; uname -a
    echo "== nproc"; nproc
    echo "== memory"; free -g
    echo "== disk"; df -h /tmp "$HOME"
    echo "== nvidia-smi"; nvidia-smi
    echo "== nvidia-smi -L"; nvidia-smi -L
    echo "== nvidia-smi topo -m"; nvidia-smi topo -m
    echo "== nvidia-smi -q (clocks, power, temperature, performance)"
    nvidia-smi -q -d CLOCK,POWER,TEMPERATURE,PERFORMANCE
    echo "== nvcc"; nvcc --version
    echo "== cmake"; cmake --version
    echo "== ninja"; ninja --version
    echo "== c++"; c++ --version
    echo "== python"; "$PY" -c 'import sys; print(sys.executable, sys.version)'
    echo "== pip list"; "$PY" -m pip list --format=freeze
  } > "$CALL_DIR/device-info.txt" 2>&1
  say "$(nproc) cores; $(nvidia-smi -L 2>/dev/null | wc -l) GPU(s): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  if [ ! -s "$WORK/gpu-samples.pid" ] || ! kill -0 "$(cat "$WORK/gpu-samples.pid")" 2>/dev/null; then
    nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu,memory.used,clocks_event_reasons.active \
      --format=csv,nounits -lms 1000 >> "$CALL_DIR/gpu-samples.csv" 2>/dev/null &
    echo $! > "$WORK/gpu-samples.pid"
  fi
}

phase_src() {  # unpack the stripped llama.cpp tree once per machine
  local want
  want=$(sha256sum "$SRC_TAR" | cut -c1-16) || return 1
  if [ "$(cat "$SRC_ROOT/.complete" 2>/dev/null)" = "$want" ]; then
    say "sources already in $SRC_DIR"; return 0
  fi
  rm -rf "$SRC_ROOT" && mkdir -p "$SRC_ROOT" && tar -C "$SRC_ROOT" -xJf "$SRC_TAR" || return 1
  echo "$want" > "$SRC_ROOT/.complete"
  say "unpacked $(du -sh "$SRC_DIR" | cut -f1) into $SRC_DIR"
}

phase_build() {  # llama-server, CUDA arch 90, ninja, all cores (spectrial.engines.llamacpp_build; cached)
  "$PY" - "$SRC_DIR" "$CALL_DIR" <<'EOF'
import os, shutil, sys, time
from pathlib import Path
from spectrial.engines.llamacpp_build import binary_path, build_key, cache_root, ensure_llama_server, server_version

src, work = Path(sys.argv[1]), Path(sys.argv[2])
cached = binary_path("llama-server", cuda=True, cuda_arch="90")
log = cache_root() / "llama.cpp" / "build" / f"{build_key(True, '90')}.log"
if cached.is_file():
    print(f"llama-server already built: {cached}")
else:
    t0 = time.monotonic()
    try:
        ensure_llama_server(cuda=True, cuda_arch="90", jobs=os.cpu_count(), src=src)
    finally:  # the build log travels back either way
        if log.is_file():
            shutil.copyfile(log, work / "build.log")
    print(f"build took {time.monotonic() - t0:.0f} s with {os.cpu_count()} jobs")
print(server_version(cached))
EOF
}

phase_models() {  # 8B-shaped target (real 128k vocab), EAGLE-3 draft, plain draft: /tmp, never the repo
  "$PY" - "$MODELS" "$VOCAB" <<'EOF'
import sys, time
from pathlib import Path
from spectrial.models import ModelSet, write_llama_pair

out, vocab = Path(sys.argv[1]), sys.argv[2]
try:
    ms = ModelSet.load(out)
    done = ms.is_complete()
except Exception:
    done = False
if done:
    print(f"models already written in {out}")
else:
    t0 = time.monotonic()
    ms = write_llama_pair(out, vocab_gguf=vocab, shape="llama3-8b")
    total = sum(f.bytes for f in ms.files.values())
    dt = time.monotonic() - t0
    print(f"wrote {total / 1e9:.2f} GB in {dt:.0f} s ({total / dt / 1e9:.2f} GB/s)")
for role, f in ms.files.items():
    print(f"{role}: {out / f.file} {f.bytes / 1e9:.2f} GB {f.arch} {f.n_layer} layer(s) sha256 {f.sha256[:12]}")
EOF
}

phase_nccl() {  # the NCCL tuning check of issue 10 (another helper's script), if it is in this tree
  if [ ! -x scripts/device_nccl_check.sh ]; then say "no scripts/device_nccl_check.sh: skipped"; return 0; fi
  local n extra=()
  n=$(nvidia-smi -L 2>/dev/null | wc -l)
  if [ "$n" -lt 2 ]; then  # one GPU: one rank (env visibility and NCCL's own evidence; no multi-GPU latency)
    say "only $n GPU: NCCL check with one rank"; extra=(-p world_size=1 -p rounds=1 -p iters=50)
  fi
  timeout -k 20 "${NCCL_TIMEOUT_S:-240}" scripts/device_nccl_check.sh "$OUT/nccl" params/nccl-check-h200x2.yaml \
    "${extra[@]}"
}

run_notebook() {  # run_notebook NB RUN_ID PARAMS_JSON: papermill into $RUNS/RUN_ID/, interrupted at the deadline
  local nb=$1 rid=$2 params=$3 t
  t=$(( $(remaining) - ${RESERVE_S:-40} ))
  if [ "$t" -lt 30 ]; then say "only $(remaining) s left: $nb not started"; return 124; fi
  mkdir -p "$RUNS/$rid"
  echo "$rid" >> "$RECORDS"
  say "$nb -> $RUNS/$rid (cell limit ${t} s)"
  "$PY" - "$nb" "$RUNS/$rid" "$t" "$params" <<'EOF'
import json, logging, sys
from pathlib import Path
import papermill as pm
from spectrial.record.store import dump_json, load_manifest

logging.basicConfig(level=logging.INFO, format="%(message)s")
nb, run_dir, limit, params = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
out = run_dir / nb.name
rc = 0
try:  # at the limit the kernel gets SIGINT: run_trial stops its server and records the arms not run
    pm.execute_notebook(str(nb), str(out), parameters=params, cwd=".", kernel_name="python3",
                        execution_timeout=limit, interrupt_on_timeout=True, log_output=True, progress_bar=False)
except Exception as exc:
    print(f"notebook {nb.name} failed: {type(exc).__name__}: {str(exc)[-2000:]}", file=sys.stderr)
    rc = 1
if (run_dir / "manifest.json").is_file():
    data = load_manifest(run_dir)
    data["notebook"] = out.name
    if out.name not in data.get("files", []):
        data.setdefault("files", []).append(out.name)
    dump_json(run_dir / "manifest.json", data)
sys.exit(rc)
EOF
}

# Notebook 02: a few arms of the grid, the executed notebook in its record.
NB02_ARMS='[{"name": "baseline", "method": "none"},
 {"name": "eagle3-a0.75-k3", "method": "eagle3", "steps": 3, "synthetic_accept": 0.75},
 {"name": "eagle3-random-k3", "method": "eagle3", "steps": 3},
 {"name": "draft-simple-k3", "method": "draft", "steps": 3, "draft": "'"$MODELS"'/draft-simple.gguf"}]'

phase_nb02() {
  local rid
  rid="$(date +%Y%m%d-%H%M%S)-$GPU_SLUG-8b-nb02"
  run_notebook notebooks/02_eagle3.ipynb "$rid" \
    "{\"params_file\": \"$PARAMS\", \"run_id\": \"$rid\", \"output_dir\": \"$RUNS\", \"overrides\": {\"arms\": $NB02_ARMS}}"
}

phase_sweep() {  # the grid of params/h200-8b.yaml: notebook 03 if present, else `spectrial trial`
  local rid t rc
  rid="$(date +%Y%m%d-%H%M%S)-$GPU_SLUG-8b-sweep"
  echo "$rid" > "$WORK/sweep-run-id"
  if [ -f "$NB03" ]; then
    # the arms of a trial file are the sweep's grid ("grid" strategy); its own budget ends it cleanly
    # 30 s before the cell limit (the SIGINT that stops a plain trial)
    t=$(( $(remaining) - ${RESERVE_S:-40} - 30 ))
    run_notebook "$NB03" "$rid" \
      "$(printf '{"params_file": "%s", "run_id": "%s", "output_dir": "%s", "budget_s": %d, "progress": false}' \
           "$PARAMS" "$rid" "$RUNS" "$(( t > 60 ? t : 60 ))" \
         | "$PY" -c 'import json,sys,os; d=json.load(sys.stdin); d.update(json.loads(os.environ.get("NB03_PARAMS") or "{}")); print(json.dumps(d))')"
    rc=$?
    # a sweep that started keeps its record (also when stopped at the deadline); one that never started
    # (no manifest: bad parameters, a missing module) gives way to the plain trial
    if [ "$rc" -eq 0 ] || [ -f "$RUNS/$rid/manifest.json" ]; then return "$rc"; fi
    say "notebook 03 failed before its sweep started: falling back to spectrial trial"
    rid="${rid}-trial"
    echo "$rid" > "$WORK/sweep-run-id"
  fi
  t=$(( $(remaining) - ${RESERVE_S:-40} ))
  if [ "$t" -lt 30 ]; then say "only $(remaining) s left: sweep not started"; return 124; fi
  echo "$rid" >> "$RECORDS"
  say "spectrial trial $PARAMS -> $RUNS/$rid (stopped with SIGINT after ${t} s)"
  timeout -s INT -k 30 "$t" "$PY" -m spectrial.cli trial "$PARAMS" -p "output_dir=$RUNS" --run-id "$rid" --quiet
}

phase_nb05() {  # the verify-wall analysis of the sweep record, executed into that record
  local rid
  rid=$(cat "$WORK/sweep-run-id" 2>/dev/null)
  if [ -z "$rid" ] || [ ! -f "$RUNS/$rid/manifest.json" ]; then say "no sweep record on this machine: skipped"; return 1; fi
  cp -f "$MODELS/models.json" "$RUNS/$rid/models.json" 2>/dev/null
  RESERVE_S=10 run_notebook_into notebooks/05_verify_wall.ipynb "$rid" \
    "{\"run_dir\": \"$RUNS/$rid\", \"out_dir\": \"$RUNS/$rid\"}"
}

run_notebook_into() {  # like run_notebook, into an existing record (already listed), no manifest rewrite
  local nb=$1 rid=$2 params=$3 t
  t=$(( $(remaining) - ${RESERVE_S:-40} ))
  if [ "$t" -lt 20 ]; then say "only $(remaining) s left: $nb not started"; return 124; fi
  grep -qx "$rid" "$RECORDS" || echo "$rid" >> "$RECORDS"
  "$PY" -m papermill "$nb" "$RUNS/$rid/$(basename "$nb")" --cwd . --no-progress-bar \
    --execution-timeout "$t" -y "$params"
}

phase_plan() {  # what nb02 and the sweep would launch, touching nothing (runs anywhere)
  echo "nb02-params: {\"params_file\": \"$PARAMS\", \"overrides\": {\"arms\": $(tr -d '\n' <<<"$NB02_ARMS")}}"
  "$PY" -m spectrial.cli trial "$PARAMS" --dry-run
}

phase_pack() {  # one tar.gz per record made in this call, one of this call's logs; each under 16 MiB
  local rid f limit=$((16 * 1024 * 1024))
  [ -s "$WORK/gpu-samples.pid" ] && kill "$(cat "$WORK/gpu-samples.pid")" 2>/dev/null && rm -f "$WORK/gpu-samples.pid"
  # the records this call listed, and any other record folder made since it started (a notebook's own run id)
  { cat "$RECORDS"; find "$RUNS" -mindepth 1 -maxdepth 1 -type d -newer "$MARKER" -printf '%f\n'; } \
    | sort -u | while read -r rid; do
    [ -f "$RUNS/$rid/manifest.json" ] || continue
    [ -f "$MODELS/models.json" ] && cp -f "$MODELS/models.json" "$RUNS/$rid/models.json"
    f="$OUT/$rid.tar.gz"
    tar -C "$RUNS" -czf "$f" "$rid"
    if [ "$(stat -c %s "$f")" -gt "$limit" ]; then
      say "$rid.tar.gz over 16 MiB: server logs cut to their last 20000 lines"
      for log in "$RUNS/$rid"/logs/*.log; do tail -n 20000 "$log" > "$log.tmp" && mv "$log.tmp" "$log"; done
      tar -C "$RUNS" -czf "$f" "$rid"
    fi
    say "packed $f ($(stat -c %s "$f") bytes)"
  done
  f=$(call_pack)  # device_env.sh: $CALL_DIR (device.log, timings.tsv, device-info.txt, gpu-samples.csv, build.log)
  say "packed $f ($(stat -c %s "$f") bytes); \$OUT holds: $(cd "$OUT" && find . -type f | tr '\n' ' ')"
}

parallel() {  # parallel PHASE...: run phases side by side; fails when any of them failed
  local p pids=() rc=0
  for p in "$@"; do phase "$p" & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return "$rc"
}

ready_to_serve() {  # the cached CUDA llama-server and the complete model set exist on this machine
  "$PY" - "$MODELS" <<'EOF'
import sys
from spectrial.models import ModelSet
from spectrial.engines.llamacpp_build import binary_path
ok = binary_path("llama-server", cuda=True, cuda_arch="90").is_file()
try:
    ok = ok and ModelSet.load(sys.argv[1]).is_complete()
except Exception:
    ok = False
sys.exit(0 if ok else 1)
EOF
}

abort() { say "$1"; phase pack; say "stopped after $(elapsed) s"; exit 1; }

# --- calls -----------------------------------------------------------------------------------------------
case "$CALL" in
  call1|all)
    { phase setup && phase src; } || abort "setup failed"
    case "${NCCL_MODE:-before}" in  # before: on an idle machine (its latencies are clean); parallel: saves ~2 min
      before) phase nccl; parallel build models ;;
      parallel) parallel build models nccl ;;
      *) parallel build models ;;
    esac
    ready_to_serve || abort "no llama-server or no models: see the build/models lines above"
    phase nb02
    if [ "$CALL" = all ]; then phase sweep; phase nb05; fi
    phase pack
    ;;
  call2)
    { phase setup && phase src; } || abort "setup failed"
    ready_to_serve || parallel build models
    ready_to_serve || abort "no llama-server or no models: see the build/models lines above"
    phase sweep
    phase nb05
    phase pack
    ;;
  plan)
    phase_plan
    ;;
  *)  # a list of phases (checked above)
    [ "$1" = setup ] || [ -f "$SITE/.stamp" ] || phase setup || abort "setup failed"
    for p in "$@"; do
      phase "$p" || { [ "$p" = pack ] && exit 1; abort "phase $p failed"; }
    done
    ;;
esac
say "done in $(elapsed) s"
