"""TEST DOUBLE of `python -m sglang.launch_server`: protocol and process behaviour only, no inference.

IMITATES SGLang 0.5.17 as recorded in ../shared/reference/REAL_ENGINES.md, section "SGLang 0.5.17 on the
H200 device" (measured 2026-12-01 on the H200 device, real servers driven by spectrial), with log texts and
control flow checked against SGLang's source (tokenizer_manager.py, scheduler.py, http_server.py). Imitated:

1. Processes. The launched process (HTTP server + tokenizer manager) sets 16 variables of its own in its
   environment (_standin_common.SGLANG_OWN_ENV: 3 names from SGLang's source, 13 illustrative), then
   spawns (multiprocessing spawn, like SGLang) one `sglang::scheduler` per TP rank (the only "GPU
   holders"; `sglang::scheduler_TP<r>` when tp > 1) and one `sglang::detokenizer`; the first
   multiprocessing lock starts the real multiprocessing resource_tracker. The children rename themselves
   with the real `setproctitle` package after SGLang's imports assigned its own variables again: on Linux
   setproctitle overwrites the contiguous argv+environ block with the title and NUL padding, and glibc's
   re-assignment ended that block at the first of SGLang's variables (checked on kernel 6.18: variables
   assigned after setproctitle never reach /proc, which reads the exec-time block), so
   /proc/<pid>/environ of scheduler and detokenizer shows only the 16 variables SGLang set itself (the
   block starts with NULs: psutil's environ() returns {}), /proc/<pid>/cmdline shows the title, while
   os.environ still holds every launch variable and they take effect (SGLANG_SIMULATE_ACC_LEN,
   NCCL_*). Children ask for SIGKILL when their parent dies and keep the default SIGTERM disposition (SGLang
   installs no handler there; the resource_tracker ignores SIGTERM). All in the launcher's process group
   and session.
2. Readiness. Connection refused during imports and weight loading (--standin-import-s, --standin-load-s);
   `Engine startup timings (s): ...`, then uvicorn's start lines; `/health` 503 with an EMPTY body while
   the warm-up runs (--standin-warmup-s of "kernel builds", then SGLang's own warm-up `POST /generate`),
   then 200 together with `The server is fired up and ready to roll!`. Once up each `/health` runs a
   1-token generation and answers after ~1 s (SGLang checks once a second), 503 with `Health check
   failed...` after SGLANG_HEALTH_CHECK_TIMEOUT (default 20 s) without any output. `/server_info` answers
   200 while /health is still 503. uvicorn's access line for every request, as uvicorn writes it.
3. Stop. SIGTERM (before the HTTP server is up: default disposition, the launcher dies with -15) sets a
   flag (`SIGTERM received. signum=None frame=None. Draining requests and shutting down...`); a watchdog
   looks at it every 5 s, logs `Gracefully exiting... Remaining number of requests N. Remaining requests
   remaining_rids=[...].` every 5 s until no request is left (in-flight requests delay the stop;
   SGL_FORCE_SHUTDOWN=1: `... Force exiting.` without draining), then SIGKILLs every descendant and itself:
   exit status -9 on every clean stop (137 from a `sh -c '"$@"; echo $?'` wrapper), children left as
   zombies of whoever inherits them, 0-5 s after the signal plus the drain. Crash: with the double's
   STANDIN_CRASH_AFTER_REQUESTS=N the scheduler raises on the (N+1)-th client request (warm-up and health
   checks not counted), logs `Scheduler hit an exception: Traceback ...` and sends SIGQUIT to the launcher,
   which logs `SIGQUIT received. signum=None, frame=None. It usually means one child failed.`, pauses 5 s
   (/health hangs; 503 only after SGLANG_HEALTH_CHECK_TIMEOUT) and SIGKILLs the tree: -9 again.
4. Metrics and statistics. `/metrics` (--enable-metrics, prometheus_client): counters
   `sglang:num_requests_total`, `sglang:generation_tokens_total`, `sglang:prompt_tokens_total`,
   `sglang:spec_verify_calls_total` (only with speculation) with `_created` samples, labels engine_type and
   model_name; scheduler gauges (plus labels tp_rank, pp_rank, moe_ep_rank) of the LAST decode log window:
   `sglang:spec_accept_length`, `sglang:spec_accept_rate` (0.0 without speculation), `num_running_reqs`,
   `gen_throughput`, `token_usage`, `is_cuda_graph`; histograms time_to_first_token_seconds,
   inter_token_latency_seconds, e2e_request_latency_seconds; `startup_time_seconds{phase}`. `/generate`
   meta_info: prompt_tokens, completion_tokens, e2e_latency, decode_throughput and, with speculation,
   spec_verify_ct, spec_accept_length, spec_accept_rate, spec_num_correct_drafts, spec_num_proposed_drafts,
   spec_accept_histogram (verifies by accepted drafts), spec_accept_token_num, spec_draft_token_num.
   `/v1/completions`: no speculative statistics. `/server_info`: ServerArgs fields,
   internal_states[0].avg_spec_accept_length (run average, only with speculation), last_gen_throughput,
   memory_usage. max_running_requests reset to 48 with speculation, with SGLang's log line.
   SGLANG_SIMULATE_ACC_LEN (+ _METHOD match-expected|multinomial, _TOKEN_MODE fixed: token id 100),
   read in the scheduler, forces the accept length.
5. Logs. `[YYYY-mm-dd HH:MM:SS] Decode batch, #running-req: 1, #token: 116, token usage: 0.00, accept len:
   1.32, accept rate: 0.16, cuda graph: False, gen throughput (token/s): 108.18, #queue-req: 0` every
   --decode-log-interval (40) decode forwards (` TP<r>` inside the brackets when tp > 1; the first line
   after idle includes the idle gap), `Load weight end. elapsed=...`, `KV Cache is allocated. dtype: ...,
   #tokens: N, K size: ... GB, V size: ... GB`, `Engine startup timings (s): load_weight=...,
   kv_cache_allocation=..., scheduler_e2e=..., cuda_graph={prefill=..., ...}, tokenizer_e2e=...`, one
   ANSI-coloured deprecation line for --disable-cuda-graph (wording of the double; the device log had one).
6. Kept from the earlier double: SGLang's CLI subset and speculative rules (argparse errors exit 2), the
   timing model (--standin-decode-ms per plain token, --standin-verify-ms + steps x --standin-draft-ms per
   verify cycle, chain acceptance --standin-accept), NCCL-format INFO lines when NCCL_DEBUG=INFO,
   --standin-drop-worker-env / --standin-worker-setenv, --standin-legacy-server-info. No torch import.

Not imitated: torch inductor's compile workers (EAGLE-3 on the device: 21 processes), GPU memory, ZMQ, the
other 60 metric families, real kernel builds.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback
import urllib.request
from http.server import ThreadingHTTPServer

from sglang._standin_common import dump_stacks_on_sigusr1, kill_process_tree, log, set_own_env, uvicorn_line
from sglang._standin_http import make_handler
from sglang._standin_runtime import Runtime
from sglang.srt.server_args import ServerArgs, apply_speculative_rules

DEPRECATION = ("\x1b[33m--disable-cuda-graph is deprecated and will be removed in a future release. Use "
               "--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled instead.\x1b[0m")
WARMUP_BODY = b'{"text": "The capital city of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}'


def warmup_and_ready(rt: Runtime, url: str) -> None:
    """SGLang's warm-up thread: kernel builds, one `POST /generate`, then the server is up. A warm-up that fails
    is what SGLang's `_wait_and_warmup` does with it: `Initialization failed. warmup error: <traceback>` logged,
    then the whole process tree killed (spectrial then sees the engine exit before it became ready)."""
    time.sleep(rt.args.standin_warmup_s)
    req = urllib.request.Request(f"{url}/generate", data=WARMUP_BODY, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
    except Exception:
        log(f"Initialization failed. warmup error: {traceback.format_exc()}")
        kill_process_tree(os.getpid())
        return
    rt.server_status = "Up"
    log("The server is fired up and ready to roll!")


def main(argv: list[str]) -> None:
    """Parse, spawn, serve, warm up; then wait for signals."""
    dump_stacks_on_sigusr1()
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    apply_speculative_rules(args, log)
    if args.disable_cuda_graph:
        sys.stdout.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {DEPRECATION}\n")
    for path in filter(None, (args.model_path, args.speculative_draft_model_path)):
        if not os.path.exists(path):
            log(f"ERROR: {path!r} is not a local path (the test double downloads nothing)")
            sys.exit(1)
    shown = ", ".join(f"{k}={v!r}" for k, v in vars(args).items() if not k.startswith("standin_"))
    log(f"server_args=ServerArgs({shown})")
    rt = Runtime(args)
    time.sleep(args.standin_import_s)
    set_own_env()
    signal.signal(signal.SIGQUIT, rt.launch_phase_sigquit_handler)
    rt.launch_subprocesses()
    rt.startup_timings_line()
    try:
        httpd = ThreadingHTTPServer((args.host, args.port), make_handler(rt))
    except OSError as exc:
        log(f"ERROR: [Errno {exc.errno}] error while attempting to bind on address ({args.host!r}, {args.port}): "
            f"{exc.strerror}")
        kill_process_tree(os.getpid(), include_parent=False)
        sys.exit(1)
    httpd.daemon_threads = True
    rt.install_running_handlers()
    uvicorn_line(f"Started server process [{os.getpid()}]")
    uvicorn_line("Waiting for application startup.")
    uvicorn_line("Application startup complete.")
    uvicorn_line(f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    threading.Thread(target=httpd.serve_forever, name="uvicorn", daemon=True).start()
    threading.Thread(target=warmup_and_ready, args=(rt, f"http://{args.host}:{args.port}"), daemon=True).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
