#!/usr/bin/env bash
# Issue 15, ON THE DEVICE (`nvidia-h200`), from the repository root, with $OUT set: real SGLang 0.5.17 (the
# trimmed bundle of scripts/sglang_bundle.py) driven by spectrial. Prepared here by
# scripts/device_sglang_prepare.sh. Calls on one machine kept warm (each within 30 s of the one before); every
# documented call carries under 48 MiB (tests/house/test_device_payload.py), so the bundle travels in two parts:
#
#   stage  carry .device/sglang-part1: the bundle's first half, kept on the machine (seconds)
#   call1  carry .device/sglang-part2, .whl-sglang/cli: the bundle put together (sha256 checked) and unpacked; the
#          8B-shaped random set written in the background; the counting pair's baseline through `spectrial trial`
#          (its start is SGLang's JIT warm-up, and the CUDA-graph probe: graphs on, else off for every later run);
#          the depth x forced-acceptance sweep on the 8B set, stopped by its time budget          (~9.5 min)
#   call2  carry .whl-sglang/nb: the rest of the sweep (call1's record resumed: its measured starts taken over,
#          only the others started; nothing when it is complete), notebook 05 (the SGLang sweep, and the committed
#          llama.cpp sweep beside it where it ran on the same GPU kind), then notebook 02 on the counting pair as
#          far as the call's time allows                                                         (~9 min)
#   faults carry .device/sglang-part2, .whl-sglang/cli (after a stage call): issue 26's faults on real SGLang (SIGKILL 2 s into
#          the EAGLE-3 benchmark, SIGHUP to the group 2 s into the baseline's), process lists and GPU memory
#          after each fault and after the next trial's kill step                                   (~5-6 min)
#   PHASE...  any of: stage setup models warm trial sweep nb02 nb05 chaos kill hup short pack (the call is named
#          after them: `setup sweep pack` is the call `setup-sweep-pack`)
#
# Records go to $RUNS; `pack` puts one $OUT/<run-id>.tar.gz per record made in the call and one
# $OUT/device-<call>-<HHMMSS>.tar.gz (HHMMSS: the call's start, UTC) holding the folder device-<call>-<HHMMSS>/:
# this call's device.log and timings.tsv (its phases only), device-info.txt, gpu-samples.csv, cuda-graph.txt.
# Packs of several calls unpack side by side without overwriting each other. Work that starts
# servers stops at BUDGET_S (555 s) after the script started: the sweep by its own time budget, the trial and
# the notebooks by SIGINT (spectrial stops its server and writes the record). EXTRA_P adds `-p NAME=VALUE`
# options to the CLI runs (a rehearsal here with the SGLang double: EXTRA_P="-p require_gpu=false ...").
# Run ids start with the lent GPU's params/hardware.yaml key (h100-sxm-..., h200-sxm-...; device_env.sh's
# gpu_identify): a GPU the table lacks stops the call before any start.
set -uo pipefail

# shellcheck source=scripts/device_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
CALL=${1:-help}
PHASES=" stage setup models warm trial sweep nb02 nb05 chaos kill hup short pack "
case "$CALL" in
  call1|call2|faults|faults2) ;;
  *)  # a list of phases: the call is named after them
    for p in "$@"; do
      [[ "$PHASES" == *" $p "* ]] || { sed -n '2,28p' "$0" >&2; [ "$p" = help ] || echo "unknown phase: $p" >&2; exit 2; }
    done
    [ $# -gt 0 ] || { sed -n '2,28p' "$0" >&2; exit 2; }
    CALL=$(IFS=-; echo "$*")
    ;;
esac
export CUDA_VISIBLE_DEVICES=0 SPECTRIAL_PROGRESS=line
for d in /usr/local/cuda/bin /opt/torch/.venv/bin; do
  [ -d "$d" ] && case ":$PATH:" in *":$d:"*) ;; *) PATH="$d:$PATH" ;; esac
done
export PATH
PY=${PY:-$(command -v python3)}
SGL_SITE=${SGL_SITE:-/tmp/sglang-site}
SITE=${SITE:-/tmp/site}
RUNS=${RUNS:-/tmp/spectrial-runs}
WORK=${WORK:-/tmp/spectrial-device}
TARBALL=${TARBALL:-.device/sglang-0.5.17.tar.xz}  # carried whole, or put together from its parts (phase stage)
WHEEL_DIRS=${WHEEL_DIRS:-.whl-sglang/cli .whl-sglang/nb}
COUNTING=${COUNTING:-params/h200-sglang-counting.yaml}
# notebook 02 starts SGLang twice (baseline, EAGLE-3): 172 s on a warm H100 (2026-12-06); not begun with less left
NB02_NEED_S=${NB02_NEED_S:-180}
SWEEP=${SWEEP:-params/sweep-h200-sglang-8b.yaml}  # another sweep: SWEEP=FILE
LLAMACPP_SWEEP=outputs/examples/h200-llamacpp-8b/20261129-151623-h200-8b-sweep
# the bundle FIRST: its transformers/tokenizers shadow the image's (REAL_ENGINES.md)
# $SHIM: placeholders for what the bundle does not carry but SGLang imports unconditionally (phase_setup)
SHIM=${SHIM:-/tmp/sglang-shim}
export PYTHONPATH="$SGL_SITE:$SITE:$REPO/lib:$SHIM"
# the DeepGEMM placeholder must never be taken for DeepGEMM (its configurer only tries `import deep_gemm`)
export SGLANG_ENABLE_JIT_DEEPGEMM=0
mkdir -p "$WORK" "$RUNS"
MARKER="$WORK/start-$CALL-$T0"
: > "$MARKER"
call_begin "$CALL"  # device_env.sh: $CALL_DIR holds this call's device.log and timings.tsv
trap 'sleep 0.5' EXIT
# device_env.sh: GPU_KEY, GPU_SLUG (the run ids' prefix); an unknown GPU stops here (exit 2); a fresh machine, whose
# bundle (pydantic, ...) is not unpacked yet, names it at the end of the setup phase
GPU_SLUG=""
gpu_identify soft

elapsed() { echo $(( $(date +%s) - T0 )); }
remaining() { echo $(( BUDGET_S - $(elapsed) )); }
say() { echo "[device_sglang +$(elapsed)s] $*"; }
graphs() { cat "$WORK/cuda-graph.txt" 2>/dev/null || echo on; }
graph_args() {  # -p overrides for CUDA graphs off (the probe of call1 decides)
  if [ "$(graphs)" = off ]; then
    echo '-p engine_config.extra_args=[--attention-backend,triton,--sampling-backend,pytorch,--disable-cuda-graph]'
  fi
}

phase() {
  local name=$1 t rc
  t=$(date +%s)
  say "=== $name: start"
  "phase_$name"
  rc=$?
  call_timing "$name" "$(( $(date +%s) - t ))" "$rc"
  say "=== $name: rc=$rc in $(( $(date +%s) - t )) s"
  return "$rc"
}

graph_probe() {  # EAGLE-3 with CUDA graphs: can the draft worker's capture import what it lists? (else graphs off)
  # SGLang 0.5.17's EAGLEWorkerV2._capture_cuda_graphs imports the DSA, DeepSeek-V4 and FlashMLA backends on
  # CUDA only to list graph-capable backends (isinstance); dsa_backend does `import deep_gemm` at module level,
  # and DeepGEMM (sgl-deep-gemm) is not carried. A placeholder package lets that import pass; any use of it
  # raises, and SGLANG_ENABLE_JIT_DEEPGEMM=0 keeps SGLang's DeepGEMM configurer off it (triton attention and
  # bf16 weights never call DeepGEMM). Found on the device 2026-12-01: without it every EAGLE-3 start with
  # CUDA graphs died in "Capture draft extend CUDA graph" (ModuleNotFoundError: deep_gemm).
  mkdir -p "$SHIM/deep_gemm"
  cat > "$SHIM/deep_gemm/__init__.py" <<'PY'
"""Placeholder written by spectrial's scripts/device_sglang.sh: DeepGEMM is not in the trimmed SGLang bundle.
Importing works (SGLang imports it only to list graph-capable attention backends); using anything raises."""


def __getattr__(name):
    raise ImportError(f"deep_gemm.{name}: DeepGEMM is not carried by spectrial's trimmed SGLang bundle")
PY
  if "$PY" -c 'import torch; assert torch.cuda.is_available()
from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend
from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend
from sglang.srt.layers.attention.flashmla_backend import FlashMLABackend
from sglang.srt.layers import deep_gemm_wrapper
assert not deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM, "DeepGEMM placeholder taken for DeepGEMM"'; then
    say "CUDA-graph probe: the draft worker's imports pass (placeholder deep_gemm): graphs on"
  else
    say "CUDA-graph probe failed (above): CUDA graphs off for every run of this machine"
    echo off > "$WORK/cuda-graph.txt"
  fi
}

phase_stage() {  # the bundle's parts this call carries (.device/sglang-part*/), kept on the machine until all are here
  local d sha name k n have
  mkdir -p "$WORK/bundle"
  for d in ${PARTS_GLOB:-.device/sglang-part*/}; do  # PARTS_GLOB: other part folders (a rehearsal here)
    [ -f "$d/PART" ] || continue
    read -r sha name k n < "$d/PART"
    cp -f "$d/bundle.part" "$WORK/bundle/$sha.$k-of-$n"
    echo "$name" > "$WORK/bundle/$sha.name"
    say "staged part $k of $n of $name"
  done
  for f in "$WORK"/bundle/*.name; do  # every bundle whose parts are all here: put it together, checked
    [ -f "$f" ] || continue
    sha=$(basename "$f" .name); name=$(cat "$f")
    n=$(ls "$WORK/bundle/$sha".1-of-* 2>/dev/null | head -1 | sed 's/.*-of-//')
    [ -n "$n" ] || continue
    have=$(ls "$WORK/bundle/$sha".*-of-"$n" 2>/dev/null | wc -l)
    if [ -f "$WORK/bundle/$name" ] && [ "$(sha256sum "$WORK/bundle/$name" | cut -d' ' -f1)" = "$sha" ]; then continue; fi
    if [ "$have" -lt "$n" ]; then
      say "$name: $have of $n parts on this machine; the next call carries the rest (docs/DEVICE.md, section 7)"
      continue
    fi
    for k in $(seq 1 "$n"); do cat "$WORK/bundle/$sha.$k-of-$n"; done > "$WORK/bundle/$name.tmp"
    [ "$(sha256sum "$WORK/bundle/$name.tmp" | cut -d' ' -f1)" = "$sha" ] \
      || { say "$name: the parts do not make the bundle again (sha256 differs): carry them again"; return 1; }
    mv "$WORK/bundle/$name.tmp" "$WORK/bundle/$name"
    say "put $name together from its $n parts"
  done
  [ -f "$TARBALL" ] || [ ! -f "$WORK/bundle/$(basename "$TARBALL")" ] || TARBALL="$WORK/bundle/$(basename "$TARBALL")"
  return 0
}

phase_setup() {  # the bundle into $SGL_SITE and the carried wheels into $SITE (once per machine), device facts
  phase_stage || return 1
  if [ -f "$TARBALL" ] && [ "$(cat "$SGL_SITE/.sha" 2>/dev/null)" != "$(sha256sum "$TARBALL" | cut -c1-16)" ]; then
    rm -rf "$SGL_SITE" && mkdir -p "$SGL_SITE" && tar -C "$SGL_SITE" -xJf "$TARBALL" || return 1
    sha256sum "$TARBALL" | cut -c1-16 > "$SGL_SITE/.sha"
    say "unpacked the SGLang bundle: $(du -sh "$SGL_SITE" | cut -f1)"
  fi
  [ -f "$SGL_SITE/.sha" ] || { say "no SGLang bundle on this machine (a fresh machine: carry its parts, docs/DEVICE.md)"; return 1; }
  for d in $WHEEL_DIRS; do
    [ -d "$d" ] || continue
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$d"/*.whl \
      || return 1
    say "installed $(ls "$d" | wc -l) wheels from $d"
  done
  [ -f "$SGL_SITE/sglang/launch_server.py" ] || { say "no sglang in $SGL_SITE"; return 1; }
  graph_probe || return 1
  "$PY" -c 'import spectrial.protocol.session, spectrial.models.hf' || return 1
  # decide: (spectrial.analysis.sequential) needs savvi, carried in .whl-sglang/cli: its model is built, not just found
  "$PY" -c 'from spectrial.analysis.sequential import _savvi_model; _savvi_model(0.95, 1.0); print("savvi: ok")' \
    || say "savvi does not load: decide: trials would be refused on this machine"
  [ -n "$GPU_SLUG" ] || gpu_identify
  {
    echo "== date"; date -u +%FT%TZ
    echo "== nvidia-smi"; nvidia-smi
    echo "== nvidia-smi -q (clocks, power, temperature, performance)"; nvidia-smi -q -d CLOCK,POWER,TEMPERATURE,PERFORMANCE
    echo "== nproc"; nproc
    echo "== python"; "$PY" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__)'
    echo "== image versions the bundle could not check"; "$PY" -m pip show numba timm regex cuda-bindings typing-extensions 2>&1 | grep -E "^(Name|Version)"
  } > "$CALL_DIR/device-info.txt" 2>&1
  if [ ! -s "$WORK/gpu-samples.pid" ] || ! kill -0 "$(cat "$WORK/gpu-samples.pid")" 2>/dev/null; then
    nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu,memory.used,clocks_event_reasons.active \
      --format=csv,nounits -lms 1000 >> "$CALL_DIR/gpu-samples.csv" 2>/dev/null &
    echo $! > "$WORK/gpu-samples.pid"
  fi
}

phase_models() {  # the HF sets into the cache (`tiny:` refs of the params resolve there): counting, 8B random
  SETS=${SETS:-counting random8b} "$PY" - <<'EOF'
import os, time
from spectrial.models.hf import ensure_hf_models
sets = {"counting": {"kind": "counting"}, "random8b": {"kind": "random", "shape": "llama3-8b"}}
for knobs in (sets[s] for s in os.environ["SETS"].split()):
    t0 = time.monotonic()
    m = ensure_hf_models(**knobs)
    size = sum(f.bytes for f in m.files.values()) / 1e9
    print(f"{knobs}: {m.dir} ({size:.2f} GB) in {time.monotonic() - t0:.0f} s")
EOF
}

run_trial() {  # run_trial PARAMS RUN_ID [-p ...]: the CLI trial, SIGINT at the deadline
  local params=$1 rid=$2 t; shift 2
  t=$(( $(remaining) - 40 ))
  if [ "$t" -lt 60 ]; then say "only $(remaining) s left: $rid not started"; return 124; fi
  # shellcheck disable=SC2046
  timeout -s INT -k 40 "$t" "$PY" -m spectrial.cli trial "$params" -p "output_dir=$RUNS" --run-id "$rid" "$@" \
    $(graph_args) ${EXTRA_P:-}
}

phase_warm() {  # the counting pair's first start: SGLang's JIT builds, and whether CUDA graphs work here
  local rid
  rid=$GPU_SLUG-sglang-counting-cli-$(date +%H%M%S)
  if run_trial "$COUNTING" "$rid" -p restarts=1 -p repeats=2 -p 'arms=[{"name":"baseline"}]'; then
    say "CUDA graphs: $(graphs)"; return 0
  fi
  # graphs off only when the server's own log blames them (a missing module is no reason to lose graphs)
  if [ "$(graphs)" = on ] && grep -qiE "cuda.?graph|graph capture|capture_one_batch" "$RUNS/$rid"/logs/*.log 2>/dev/null; then
    say "the server failed in CUDA-graph capture: trying again with --disable-cuda-graph"
    echo off > "$WORK/cuda-graph.txt"
    run_trial "$COUNTING" "$rid-nograph" -p restarts=1 -p repeats=2 -p 'arms=[{"name":"baseline"}]'
  else
    return 1
  fi
}

phase_trial() {  # the counting pair through the CLI, as notebook 02 runs it (2 starts per arm)
  run_trial "$COUNTING" "$GPU_SLUG-sglang-counting-$(date +%H%M%S)"
}

phase_sweep() {  # the depth x forced-acceptance grid on the 8B set, stopped by its own time budget; a sweep of the
  # same file that an earlier call's budget stopped is resumed (its measured starts taken over, only the rest
  # started: `spectrial sweep --resume`); a complete one is not run again. SWEEP_RESUME=no: always a new sweep.
  local rid b prev status resume=()
  prev=$(cat "$WORK/sweep-run-id" 2>/dev/null)
  if [ -n "$prev" ] && [ -f "$RUNS/$prev/manifest.json" ] && [ "${SWEEP_RESUME:-auto}" != no ] \
      && [ "$(cat "$WORK/sweep-file" 2>/dev/null)" = "$SWEEP" ]; then
    status=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["status"])' "$RUNS/$prev/manifest.json")
    case "$status" in
      ok) say "the sweep of $SWEEP is complete ($prev): not run again"; return 0 ;;
      partial|failed) resume=(--resume "$RUNS/$prev"); say "resuming $prev ($status): what it measured is taken over" ;;
    esac
  fi
  rid=$GPU_SLUG-sglang-8b-sweep-$(date +%H%M%S)
  [ "$SWEEP" = params/sweep-h200-sglang-8b.yaml ] || rid=$GPU_SLUG-$(basename "$SWEEP" .yaml)-$(date +%H%M%S)  # named as its file
  echo "$rid" > "$WORK/sweep-run-id"
  echo "$SWEEP" > "$WORK/sweep-file"
  b=$(( $(remaining) - 90 ))
  if [ "$b" -lt 60 ]; then say "only $(remaining) s left: sweep not started"; return 124; fi
  say "sweep $rid, budget $b s, CUDA graphs $(graphs)"
  # shellcheck disable=SC2046
  timeout -s INT -k 40 $(( b + 60 )) "$PY" -m spectrial.cli sweep "$SWEEP" -p "output_dir=$RUNS" -p "budget_s=$b" \
    --run-id "$rid" --quiet "${resume[@]}" $(graph_args) ${EXTRA_P:-}
}

run_notebook() {  # run_notebook NB OUT_NB PARAMS_JSON NEED: not started with less than NEED s left (a notebook cut
  # by the call's deadline is a failed record and no answer); the next call2 runs it
  local nb=$1 out=$2 params=$3 need=${4:-60} t
  t=$(( $(remaining) - 30 ))
  if [ "$t" -lt "$need" ]; then
    say "only $(remaining) s left and $nb needs ~$need s: not started; the next call2 runs it (a complete sweep is not run again)"
    return 124
  fi
  "$PY" -m papermill "$nb" "$out" --cwd . --no-progress-bar --execution-timeout "$t" -y "$params"
}

phase_nb02() {  # notebook 02 on the counting pair, into its own record
  local rid over
  rid=$GPU_SLUG-sglang-counting-nb02-$(date +%H%M%S)
  mkdir -p "$RUNS/$rid"
  over='{}'
  [ "$(graphs)" = off ] && over='{"engine_config.extra_args": ["--attention-backend", "triton", "--sampling-backend", "pytorch", "--disable-cuda-graph"]}'
  run_notebook notebooks/02_eagle3.ipynb "$RUNS/$rid/02_eagle3.ipynb" \
    "{\"params_file\": \"$COUNTING\", \"run_id\": \"$rid\", \"output_dir\": \"$RUNS\", \"overrides\": $over}" \
    "$NB02_NEED_S"
}

phase_nb05() {  # notebook 05: the SGLang sweep, and the committed llama.cpp sweep (same shapes) drawn beside it
  # only where it ran on the same GPU kind (notebook 05 groups records by their GPU)
  local rid
  rid=$(cat "$WORK/sweep-run-id" 2>/dev/null)
  if [ -z "$rid" ] || [ ! -f "$RUNS/$rid/manifest.json" ]; then say "no sweep record on this machine: skipped"; return 1; fi
  touch "$RUNS/$rid"  # packed by this call
  run_notebook notebooks/05_verify_wall.ipynb "$RUNS/$rid/05_verify_wall.ipynb" \
    "{\"run_dir\": [\"$RUNS/$rid\", \"$LLAMACPP_SWEEP\"], \"out_dir\": \"$RUNS/$rid\"}" 30
}

procs() {  # what runs of SGLang, spectrial and its GPU sampler, and the GPU's memory
  ps -eo pid,pgid,sid,stat,args --sort=pid | grep -E "sglang|nvidia-smi .*-lms|spectrial.cli|ipykernel|inductor" \
    | grep -v -E "grep|device_sglang" | cut -c1-200
  echo "GPU memory used (MiB): $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | tr '\n' ' ')"
}

next_step() {  # the next trial's kill step and GPU check (a new Trial: kill_old_server, verify_gpus_free), and
  # what any spectrial reader now says of the faulted run's record
  local rid=$1
  "$PY" - "$COUNTING" "$RUNS" "$rid" <<'PY'
import sys, time
from spectrial.protocol.trial import Trial
from spectrial.record.store import load_record
params, runs, rid = sys.argv[1:]
t0 = time.monotonic()
t = Trial(params, {"output_dir": runs + "/next-steps", "arms": [{"name": "baseline"}]}, progress=False)
kill = t.kill_old_server()
gpus = t.verify_gpus_free()
t.close()
print(f"next kill step ({time.monotonic() - t0:.1f} s): {kill['action']}")
print(f"  stopped: {[p['command'][:90] for p in kill.get('stopped', [])]}")
print(f"  abandoned: {kill.get('abandoned')}")
print(f"  GPUs free after it: {[g['memory_used_mib'] for g in gpus['gpus']]} MiB used")
m = load_record(f"{runs}/{rid}")
print(f"the faulted record now: {m.status}: {m.reason}")
PY
}

fault_run() {  # fault_run RID SIGNAL STEP TARGET [-p ...]: a CLI trial; SIGNAL 2 s into STEP, to the pid or group
  local rid=$1 sig=$2 step=$3 target=$4 pid rc; shift 4
  setsid "$PY" -m spectrial.cli trial "$COUNTING" -p "output_dir=$RUNS" --run-id "$rid" -p repeats=200 \
    $(graph_args) ${EXTRA_P:-} "$@" > "$WORK/$rid.out" 2>&1 &
  pid=$!
  "$PY" - "$RUNS/$rid/manifest.json" "$step" "$pid" <<'PY'
import json, os, sys, time
path, step, pid = sys.argv[1:]
deadline = time.monotonic() + 400
while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
    try:
        if any(s["name"].startswith(step) for s in json.load(open(path))["steps"]):
            break
    except (OSError, ValueError, KeyError):
        pass
    time.sleep(0.2)
PY
  sleep 2
  say "$rid: SIG$sig to the $target 2 s into $step"
  if [ "$target" = group ]; then kill -s "$sig" -- "-$pid"; else kill -s "$sig" "$pid"; fi
  wait "$pid"; rc=$?
  say "$rid: spectrial exited $rc; $(tail -n 2 "$WORK/$rid.out" | tr '\n' ' ')"
  sleep 2
  say "processes right after:"; procs
  next_step "$rid"
  say "processes after the next step:"; procs
}

phase_kill() {  # issue 26: SIGKILL to spectrial 2 s into the EAGLE-3 benchmark
  fault_run "$GPU_SLUG-sglang-chaos-kill-$(date +%H%M%S)" KILL "benchmark:eagle3" pid -p 'arms=[{"name":"eagle3","method":"eagle3"}]'
}

phase_hup() {  # issue 26: SIGHUP to spectrial's group 2 s into the baseline's benchmark
  fault_run "$GPU_SLUG-sglang-chaos-hup-$(date +%H%M%S)" HUP "benchmark:baseline" group -p 'arms=[{"name":"baseline"}]'
}

phase_chaos() { phase_kill; phase_hup; }

phase_short() {  # the counting pair once per arm, few requests: the serving figures from SGLang's own token counts
  run_trial "$COUNTING" "$GPU_SLUG-sglang-counting-serving-$(date +%H%M%S)" -p repeats=4
}

phase_pack() {  # one tar.gz per record made or touched in this call (each under 16 MiB), one of the logs
  local rid f limit=$((16 * 1024 * 1024))
  [ -s "$WORK/gpu-samples.pid" ] && kill "$(cat "$WORK/gpu-samples.pid")" 2>/dev/null && rm -f "$WORK/gpu-samples.pid"
  find "$RUNS" -mindepth 1 -maxdepth 1 -type d -newer "$MARKER" -printf '%f\n' | sort | while read -r rid; do
    [ -f "$RUNS/$rid/manifest.json" ] || continue
    f="$OUT/$rid.tar.gz"
    tar -C "$RUNS" -czf "$f" "$rid"
    if [ "$(stat -c %s "$f")" -gt "$limit" ]; then
      for log in "$RUNS/$rid"/logs/*.log; do tail -n 20000 "$log" > "$log.tmp" && mv "$log.tmp" "$log"; done
      tar -C "$RUNS" -czf "$f" "$rid"
    fi
    say "packed $f ($(stat -c %s "$f") bytes)"
  done
  f=$(call_pack cuda-graph.txt)  # device_env.sh: $CALL_DIR with the machine's CUDA-graph verdict
  say "packed $f; \$OUT holds: $(cd "$OUT" && find . -type f | tr '\n' ' ')"
}

abort() { say "$1"; phase pack; exit 1; }

case "${1:-help}" in
  faults)
    phase setup || abort "setup failed"
    phase chaos
    phase pack
    ;;
  faults2)
    phase setup || abort "setup failed"
    phase hup
    phase short
    phase pack
    ;;
  call1)
    phase setup || abort "setup failed"
    SETS=random8b phase models > "$CALL_DIR/models.log" 2>&1 &  # the counting set: written by the trial's prepare
    models=$!
    phase warm || abort "the counting baseline failed: see its record"
    wait "$models"; cat "$CALL_DIR/models.log"
    phase sweep
    phase pack
    ;;
  call2)
    phase setup || abort "setup failed (no bundle: this is a fresh machine, start again with stage and call1)"
    phase sweep  # what call1's budget left of the sweep (resumed), or nothing when it is complete
    phase nb05
    phase nb02
    phase pack
    ;;
  *)  # a list of phases (checked above)
    for p in "$@"; do phase "$p" || { [ "$p" = pack ] && exit 1; abort "phase $p failed"; }; done
    ;;
esac
say "done in $(elapsed) s"
