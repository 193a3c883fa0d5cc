"""TEST DOUBLE: the launched process's tokenizer manager in the SGLang stand-in (see `sglang/launch_server.py`).

Spawns the scheduler(s) and the detokenizer, routes their outputs to the HTTP handlers, runs SGLang's
`/health` generation, and stops as SGLang 0.5.17 does: a SIGTERM handler that only sets a flag, a watchdog
that looks at that flag every 5 s, drains the requests (`Gracefully exiting... Remaining number of
requests N ...` every 5 s) and then SIGKILLs the whole tree, itself last (exit status -9). A SIGQUIT from a
crashed scheduler ends the same way after a 5 s diagnostics pause.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sglang._standin_common import env_flag, kill_process_tree, log
from sglang._standin_detokenizer import run_detokenizer_process
from sglang._standin_metrics import Metrics
from sglang._standin_worker import run_scheduler_process
from sglang.srt.server_args import cuda_graph_enabled

WATCHDOG_POLL_S = 5.0  # SGLang's sigterm_watchdog: `while not self.gracefully_exit: await asyncio.sleep(5)`
DRAIN_POLL_S = 5.0
SIGQUIT_PAUSE_S = 5.0  # the diagnostics pause seen on the device before a crashed server is killed
STARTUP_TIMEOUT_S = 120.0


@dataclass
class ReqState:
    """One request in flight (SGLang's rid_to_state entry)."""

    rid: str
    kind: str  # "client", "warmup" (before the server is up) or "health"
    created: float = field(default_factory=time.monotonic)
    last: float = 0.0
    first: float | None = None
    events: queue.Queue = field(default_factory=queue.Queue)


class Runtime:
    """The launcher's state: children, request routing, health, metrics and the stop protocol."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.cfg = {**vars(args), "cuda_graph": cuda_graph_enabled(args)}
        self.model_name = args.served_model_name or args.model_path
        self.server_status = "Starting"  # -> "Up" after the warm-up; "UnHealthy" after a failed health check
        self.gracefully_exit = False
        self.rid_to_state: dict[str, ReqState] = {}
        self.lock = threading.Lock()
        self.last_receive_tstamp = 0.0
        self.health_timeout = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        self.metrics = Metrics(self.model_name, args.speculative_algorithm is not None, self.cfg["cuda_graph"]) \
            if args.enable_metrics else None
        self.in_q: Any = None
        self.out_q: Any = None
        self.timings: dict[str, Any] = {}
        self._seq = itertools.count()

    # --- processes ----------------------------------------------------------------------------------------
    def launch_subprocesses(self) -> None:
        """Spawn the schedulers and the detokenizer (with spawn, as SGLang does) and wait until all loaded."""
        ctx = mp.get_context("spawn")
        self.out_q, detok_q = ctx.Queue(), ctx.Queue()  # the first SemLock starts multiprocessing's resource_tracker
        dropped = {k: os.environ.pop(k) for k in self.args.standin_drop_worker_env if k in os.environ}
        try:
            for rank in range(self.args.tp_size):
                q = ctx.Queue()
                ctx.Process(target=run_scheduler_process, args=(rank, self.cfg, q, self.out_q, detok_q),
                            daemon=False).start()
                if rank == 0:
                    self.in_q = q
            ctx.Process(target=run_detokenizer_process, args=(detok_q, self.out_q), daemon=False).start()
        finally:
            os.environ.update(dropped)
        if dropped:
            log(f"(test double) workers spawned without {sorted(dropped)}")
        ready: dict[str, Any] = {}
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while len(ready) < self.args.tp_size:
            msg = self.out_q.get(timeout=max(deadline - time.monotonic(), 0.1))
            if msg[0] == "ready":
                ready[msg[1]] = msg[2]
        self.timings = ready["0"]["timings"]
        threading.Thread(target=self._route, name="handle_loop", daemon=True).start()

    def startup_timings_line(self) -> None:
        """`Engine startup timings (s): load_weight=..., ..., tokenizer_e2e=...` (and the startup gauges)."""
        t = self.timings
        graphs = ", ".join(f"{k}={v:.2f}" for k, v in t["cuda_graph"].items())
        tok = time.monotonic() - self.t0
        log(f"Engine startup timings (s): load_weight={t['load_weight']:.2f}, "
            f"kv_cache_allocation={t['kv_cache_allocation']:.2f}, scheduler_e2e={t['scheduler_e2e']:.2f}, "
            f"cuda_graph={{{graphs}}}, tokenizer_e2e={tok:.2f}")
        if self.metrics:
            self.metrics.startup_phases({"load_weight": t["load_weight"], "kv_cache_allocation":
                                         t["kv_cache_allocation"], "scheduler_e2e": t["scheduler_e2e"],
                                         "tokenizer_e2e": tok})

    def _route(self) -> None:
        """The tokenizer manager's handle loop: outputs of the detokenizer and replies of the scheduler."""
        while True:
            msg = self.out_q.get()
            self.last_receive_tstamp = time.time()
            kind, rid = msg[0], msg[1]
            if kind == "stats":
                if self.metrics:
                    self.metrics.scheduler_stats(msg[2])
                continue
            with self.lock:
                st = self.rid_to_state.get(rid)
                if st is not None and kind == "tok" and msg[3]:
                    del self.rid_to_state[rid]
            if st is None:
                continue
            if kind == "state":
                st.events.put(msg[2])
            elif kind == "tok":
                self._output(st, msg[2], msg[3], msg[4], msg[5])

    def _output(self, st: ReqState, n: int, finished: bool, meta: dict[str, Any], tok: int) -> None:
        now = time.monotonic()
        if st.first is None:
            st.first = now
            if self.metrics and st.kind != "health":
                self.metrics.first_token(now - st.created)
        elif self.metrics and st.kind != "health":
            self.metrics.chunk(now - st.last, n)
        st.last = now
        decode_s = now - st.first
        meta = {**meta, "e2e_latency": now - st.created,
                "decode_throughput": (meta["completion_tokens"] - 1) / decode_s if decode_s > 0 else 0.0}
        if finished and self.metrics and st.kind != "health":
            self.metrics.finished(meta, now - st.created)
        st.events.put((n, finished, meta, tok))

    # --- requests -----------------------------------------------------------------------------------------
    def submit(self, prompt_tokens: int, max_new: int, kind: str | None = None) -> ReqState:
        """Send a generation request to the scheduler (rank 0)."""
        kind = kind or ("client" if self.server_status != "Starting" else "warmup")
        prefix = f"HEALTH_CHECK_{time.time()}_" if kind == "health" else ""
        st = ReqState(prefix + uuid.uuid4().hex, kind)
        with self.lock:
            self.rid_to_state[st.rid] = st
        self.in_q.put(("gen", st.rid, prompt_tokens, max(1, int(max_new)), kind))
        return st

    def forget(self, rid: str) -> None:
        with self.lock:
            self.rid_to_state.pop(rid, None)

    def internal_state(self) -> dict[str, Any]:
        """Rank 0's internal state (waits for the scheduler, as SGLang's /server_info does)."""
        st = ReqState(f"state-{next(self._seq)}", "state")
        with self.lock:
            self.rid_to_state[st.rid] = st
        self.in_q.put(("state", st.rid))
        try:
            return st.events.get(timeout=600)
        finally:
            self.forget(st.rid)

    def health(self) -> int:
        """SGLang's /health (= /health_generate): a 1-token generation, checked once a second."""
        if self.gracefully_exit:
            log("Health check request received during shutdown. Returning 503.")
            return 503
        if self.server_status == "Starting":
            return 503
        tic = time.time()
        st = self.submit(1, 1, "health")
        while time.time() < tic + self.health_timeout:
            time.sleep(1)
            if self.last_receive_tstamp > tic:
                self.forget(st.rid)
                self.server_status = "Up"
                return 200
        self.forget(st.rid)
        log(f"Health check failed. Server couldn't get a response from detokenizer for last "
            f"{self.health_timeout:g} seconds. tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}. "
            f"last_heartbeat time: {time.strftime('%H:%M:%S', time.localtime(self.last_receive_tstamp))}")
        self.server_status = "UnHealthy"
        return 503

    # --- stopping -----------------------------------------------------------------------------------------
    def launch_phase_sigquit_handler(self, signum: int, frame: Any) -> None:
        log("Received sigquit from a child process. It usually means the child failed.")
        kill_process_tree(os.getpid())

    def install_running_handlers(self) -> None:
        """What the tokenizer manager installs with its handle loop (main thread only)."""
        signal.signal(signal.SIGTERM, lambda s, f: self.sigterm_handler())
        signal.signal(signal.SIGQUIT, lambda s, f: self.running_phase_sigquit_handler())
        threading.Thread(target=self.sigterm_watchdog, name="sigterm_watchdog", daemon=True).start()

    def sigterm_handler(self, signum: Any = None, frame: Any = None) -> None:
        log(f"SIGTERM received. {signum=} {frame=}. Draining requests and shutting down...")
        self.gracefully_exit = True

    def running_phase_sigquit_handler(self, signum: Any = None, frame: Any = None) -> None:
        log(f"SIGQUIT received. {signum=}, {frame=}. It usually means one child failed.")
        time.sleep(SIGQUIT_PAUSE_S)
        kill_process_tree(os.getpid())

    def sigterm_watchdog(self) -> None:
        """Poll the flag every 5 s; drain; then SIGKILL the tree including this process."""
        while not self.gracefully_exit:
            time.sleep(WATCHDOG_POLL_S)
        while True:
            with self.lock:
                remaining = [r for r, s in self.rid_to_state.items() if s.kind != "state"]
            if self.server_status == "UnHealthy":
                log("Signal SIGTERM received while health check failed. Force exiting.")
                break
            if env_flag("SGL_FORCE_SHUTDOWN"):
                log("Signal SIGTERM received while force shutdown flag set. Force exiting.")
                break
            log(f"Gracefully exiting... Remaining number of requests {len(remaining)}. "
                f"Remaining requests remaining_rids={remaining}.")
            if not remaining:
                break
            time.sleep(DRAIN_POLL_S)
        kill_process_tree(os.getpid(), include_parent=True)
