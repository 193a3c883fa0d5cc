"""TEST DOUBLE: the `sglang::scheduler` process of the SGLang stand-in (see `sglang/launch_server.py`).

One per TP rank, started by the launcher with multiprocessing *spawn*. Like SGLang 0.5.17's
`run_scheduler_process` it asks for SIGKILL on parent death, renames itself with setproctitle (which blanks
the front of its /proc/<pid>/environ and its cmdline), loads "weights", allocates the "KV cache", captures
"cuda graphs" unless disabled, and then runs the scheduler loop. Rank 0 runs the simulated scheduler
(prefill, batched decode steps that sleep, speculative acceptance) and sends its outputs through the
detokenizer; an exception in the loop is logged as `Scheduler hit an exception: <traceback>` and reported to
the launcher with SIGQUIT, as SGLang does. Environment variables read here (inherited, so they take effect
although /proc no longer shows them): SGLANG_SIMULATE_ACC_LEN / _METHOD / _TOKEN_MODE (forced acceptance),
STANDIN_CRASH_AFTER_REQUESTS (the double's crash switch), NCCL_* (imitated NCCL INFO lines).
"""

from __future__ import annotations

import faulthandler
import math
import os
import queue
import random
import signal
import socket
import sys
import time
import traceback
from typing import Any

import setproctitle

from sglang._standin_common import dump_stacks_on_sigusr1, kill_itself_when_parent_died, log, reassign_own_env

NCCL_QUIET = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")
MAX_TOTAL_TOKENS = 100000
FIXED_TOKEN_ID = 100  # SGLANG_SIMULATE_ACC_TOKEN_MODE=fixed: every output token becomes id 100
NORMAL_TOKEN_ID = 7


def nccl_lines(rank: int, world: int) -> None:
    """Imitation of NCCL's INIT,ENV output for the NCCL_* variables in this process's os.environ."""
    if os.environ.get("NCCL_DEBUG", "").upper() != "INFO":
        return
    pid, host = os.getpid(), socket.gethostname().split(".")[0]
    pre = f"{host}:{pid}:{pid} [{rank}] NCCL INFO "
    out = [pre + "NCCL version 2.27.5+cuda12.9 (test double)"]
    out += [pre + f"{k} set by environment to {v}" for k, v in sorted(os.environ.items())
            if k.startswith("NCCL_") and k not in NCCL_QUIET]
    chans = int(os.environ.get("NCCL_MAX_NCHANNELS", "2") or 2)
    comm = f"0x{abs(hash((pid, rank))) % (1 << 40):x}"
    out.append(pre + f"comm {comm} rank {rank} nRanks {world} nNodes 1 localRanks {world} localRank {rank} MNNVL 0")
    out.append(pre + f"{chans} coll channels, 0 collnet channels, 0 nvls channels, {chans} p2p channels, "
                     f"{chans} p2p channels per peer")
    out.append(pre + f"comm {comm} rank {rank} nranks {world} cudaDev {rank} nvmlDev {rank} busId {rank + 1}000 "
                     "commId 0x1 - Init COMPLETE")
    sys.stdout.write("".join(line + "\n" for line in out))
    sys.stdout.flush()


class SimulatedAcceptance:
    """SGLang's SGLANG_SIMULATE_ACC_LEN: the accept length of each verify forced around a requested mean."""

    def __init__(self, rng: random.Random, steps: int) -> None:
        raw = os.environ.get("SGLANG_SIMULATE_ACC_LEN")
        self.target = float(raw) if raw not in (None, "") else None
        self.method = os.environ.get("SGLANG_SIMULATE_ACC_METHOD", "match-expected")
        self.fixed_tokens = os.environ.get("SGLANG_SIMULATE_ACC_TOKEN_MODE", "fixed") == "fixed"
        self.rng, self.steps = rng, steps

    @property
    def active(self) -> bool:
        return self.target is not None

    def accepted_drafts(self) -> int:
        """Drafted tokens accepted in one verify (the accept length minus the bonus token)."""
        assert self.target is not None
        top = self.steps + 1
        if self.method == "multinomial":
            length = int(round(min(max(self.rng.gauss(self.target, 1.0), 1.0), top)))
        else:  # match-expected: floor or ceil of the target, weighted so that the mean matches it
            t = min(max(self.target, 1.0), float(top))
            lower = int(math.floor(t))
            upper = lower + 1 if lower < top else lower
            length = upper if self.rng.random() < t - lower else lower
        return length - 1


class Scheduler:
    """Rank 0's simulated batch scheduler."""

    def __init__(self, cfg: dict[str, Any], out_q: Any, detok_q: Any, prefix: str) -> None:
        self.cfg, self.out_q, self.detok_q, self.prefix = cfg, out_q, detok_q, prefix
        self.spec = cfg["speculative_algorithm"] is not None
        self.steps = int(cfg.get("speculative_num_steps") or 0)
        self.draft_tokens = int(cfg.get("speculative_num_draft_tokens") or 0)
        self.graph = cfg["cuda_graph"]
        self.rng = random.Random(cfg.get("random_seed") or 0)
        self.sim = SimulatedAcceptance(self.rng, self.steps)
        crash = os.environ.get("STANDIN_CRASH_AFTER_REQUESTS", "")
        self.crash_after = int(crash) if crash.strip() else None
        self.client_requests = 0
        self.running: dict[str, dict[str, Any]] = {}
        self.forward_ct_decode = 0
        self.spec_num_accepted_tokens = self.spec_num_forward_ct = 0
        self.spec_total_num_accepted_tokens = self.spec_total_num_forward_ct = 0
        self.tokens_since_log, self.last_log_t = 0, time.monotonic()
        self.verify_ms_sum, self.cycle_ms_sum, self.cycles_since_log = 0.0, 0.0, 0
        self.last_gen_throughput = 0.0
        self.t_next: float | None = None

    def state(self) -> dict[str, Any]:
        """What SGLang's get_internal_state returns that spectrial reads (avg: the run's average)."""
        st: dict[str, Any] = {"last_gen_throughput": self.last_gen_throughput,
                              "memory_usage": {"weight": 17.9, "kvcache": 2.0, "token_capacity": MAX_TOTAL_TOKENS,
                                               "graph": 0.1 if self.graph else 0.0},
                              "effective_max_running_requests_per_dp": self.cfg["max_running_requests"]}
        if self.spec and self.spec_total_num_forward_ct > 0:
            st["avg_spec_accept_length"] = self.spec_total_num_accepted_tokens / self.spec_total_num_forward_ct
        return st

    def add(self, rid: str, prompt_tokens: int, max_new: int, kind: str) -> None:
        """Prefill one request: its first token comes with the prefill."""
        if kind == "client":
            self.client_requests += 1
            if self.crash_after is not None and self.client_requests > self.crash_after:
                self.run_batch_with_failure()
        time.sleep(self.cfg["standin_prefill_ms"] / 1000)
        log(f"Prefill batch, #new-seq: 1, #new-token: {prompt_tokens}, #cached-token: 0, token usage: 0.00, "
            f"#running-req: {len(self.running)}, #queue-req: 0, input throughput (token/s): "
            f"{prompt_tokens / max(self.cfg['standin_prefill_ms'], 1e-3) * 1000:.2f}, "
            f"cuda graph: {self.graph}", self.prefix)
        req = {"rid": rid, "prompt": prompt_tokens, "max_new": max_new, "done": 1, "verify": 0, "accepted": 0,
               "hist": [0] * (self.steps + 1)}
        self.emit(req, 1)
        if req["done"] < max_new:
            self.running[rid] = req
        self.t_next = None

    def run_batch_with_failure(self) -> None:
        """STANDIN_CRASH_AFTER_REQUESTS: the forward of the next request fails (an exception, as on a GPU)."""
        raise RuntimeError(f"CUDA error: an illegal memory access was encountered (test double: "
                           f"STANDIN_CRASH_AFTER_REQUESTS={self.crash_after} reached)")

    def emit(self, req: dict[str, Any], n: int) -> None:
        finished = req["done"] >= req["max_new"]
        meta: dict[str, Any] = {"id": req["rid"], "prompt_tokens": req["prompt"], "completion_tokens": req["done"],
                                "cached_tokens": 0,
                                "finish_reason": {"type": "length", "length": req["max_new"]} if finished else None}
        if self.spec and req["verify"] > 0:
            proposed = req["verify"] * max(self.draft_tokens - 1, 1)
            meta.update(spec_verify_ct=req["verify"], spec_accept_length=req["done"] / req["verify"],
                        spec_accept_rate=req["accepted"] / proposed, spec_accept_token_num=req["accepted"],
                        spec_draft_token_num=proposed, spec_num_correct_drafts=req["accepted"],
                        spec_num_proposed_drafts=proposed, spec_accept_histogram=list(req["hist"]))
        tok = FIXED_TOKEN_ID if self.spec and self.sim.active and self.sim.fixed_tokens else NORMAL_TOKEN_ID
        self.detok_q.put(("tok", req["rid"], n, finished, meta, tok))

    def pace(self, step_s: float) -> None:
        """Sleep so that steps follow a clock of `step_s` (the double's own overhead is absorbed, not added)."""
        now = time.monotonic()
        if self.t_next is None or now > self.t_next + step_s:
            self.t_next = now
        self.t_next += step_s
        time.sleep(max(self.t_next - time.monotonic(), 0.0))

    def accepted_drafts(self) -> int:
        if self.sim.active:
            return self.sim.accepted_drafts()
        acc = 0
        while acc < self.steps and self.rng.random() < self.cfg["standin_accept"]:
            acc += 1
        return acc

    def step(self) -> None:
        """One batched decode step (a verify cycle when speculating)."""
        c = self.cfg
        step_ms = c["standin_draft_ms"] * self.steps + c["standin_verify_ms"] if self.spec else c["standin_decode_ms"]
        self.pace(step_ms / 1000)
        if self.spec:
            self.verify_ms_sum += c["standin_verify_ms"]
            self.cycle_ms_sum += step_ms
            self.cycles_since_log += 1
        bs, accepted_total, committed_total = len(self.running), 0, 0
        used = sum(r["prompt"] + r["done"] for r in self.running.values())
        for rid in list(self.running):
            req = self.running[rid]
            acc = self.accepted_drafts() if self.spec else 0
            n = min(1 + acc, req["max_new"] - req["done"])
            req["done"] += n
            committed_total += n
            if self.spec:
                req["verify"] += 1
                req["accepted"] += n - 1
                req["hist"][n - 1] += 1
                accepted_total += n - 1
            self.emit(req, n)
            if req["done"] >= req["max_new"]:
                del self.running[rid]
        self.forward_ct_decode += 1
        self.tokens_since_log += committed_total
        if self.spec:
            self.spec_num_accepted_tokens += accepted_total + bs
            self.spec_num_forward_ct += bs
            self.spec_total_num_accepted_tokens += accepted_total + bs
            self.spec_total_num_forward_ct += bs
        if self.forward_ct_decode % c["decode_log_interval"] == 0:
            self.log_decode(bs, used)

    def log_decode(self, bs: int, used: int) -> None:
        """SGLang's `Decode batch` line and the scheduler gauges of this log window."""
        now = time.monotonic()
        self.last_gen_throughput = self.tokens_since_log / max(now - self.last_log_t, 1e-9)
        self.tokens_since_log, self.last_log_t = 0, now
        usage = used / MAX_TOTAL_TOKENS
        msg = f"Decode batch, #running-req: {bs}, #token: {used}, token usage: {usage:.2f}, "
        accept_len = accept_rate = 0.0
        if self.spec and self.spec_num_forward_ct:
            accept_len = self.spec_num_accepted_tokens / self.spec_num_forward_ct
            accept_rate = (accept_len - 1) / max(self.draft_tokens - 1, 1)
            self.spec_num_accepted_tokens = self.spec_num_forward_ct = 0
            msg += f"accept len: {accept_len:.2f}, accept rate: {accept_rate:.2f}, "
        msg += f"cuda graph: {self.graph}, gen throughput (token/s): {self.last_gen_throughput:.2f}, #queue-req: 0"
        log(msg, self.prefix)
        self.out_q.put(("stats", "", {"num_running_reqs": bs, "num_used_tokens": used, "token_usage": usage,
                                      "gen_throughput": self.last_gen_throughput, "num_queue_reqs": 0,
                                      "spec_accept_length": accept_len, "spec_accept_rate": accept_rate}))
        if self.spec and os.environ.get("EAGLE3_PROFILE") == "1" and self.cycles_since_log:
            v, cyc = self.verify_ms_sum / self.cycles_since_log, self.cycle_ms_sum / self.cycles_since_log
            log(f"Target verify: {v:.2f} ms/cyc ({100 * v / max(cyc, 1e-9):5.1f}%)", self.prefix)
            self.verify_ms_sum = self.cycle_ms_sum = 0.0
            self.cycles_since_log = 0

    def event_loop(self, in_q: Any) -> None:
        """Receive requests, run prefill and decode steps; returns on ("stop",)."""
        while True:
            try:
                msg = in_q.get_nowait() if self.running else in_q.get(timeout=0.5)
            except queue.Empty:
                msg = None
            if msg is not None:
                if msg[0] == "stop":
                    return
                if msg[0] == "gen":
                    self.add(msg[1], msg[2], msg[3], msg[4])
                elif msg[0] == "state":
                    self.out_q.put(("state", msg[1], self.state()))
                continue
            if self.running:
                self.step()


def load_model(rank: int, cfg: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The startup lines of one rank and the times that `Engine startup timings` reports."""
    t0 = time.monotonic()
    log(f"Load weight begin. avail mem={139.1 - rank * 0.01:.2f} GB", prefix)
    nccl_lines(rank, cfg["tp_size"])
    time.sleep(cfg["standin_load_s"])
    load_s = time.monotonic() - t0
    log(f"Load weight end. elapsed={load_s:.2f} s, type=StandinForCausalLM, dtype=torch.bfloat16, "
        "avail mem=121.20 GB, mem usage=17.90 GB.", prefix)
    t1 = time.monotonic()
    log(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {MAX_TOTAL_TOKENS}, K size: 1.00 GB, "
        "V size: 1.00 GB", prefix)
    log("Memory pool end. avail mem=118.90 GB", prefix)
    kv_s = time.monotonic() - t1
    phases = ("target_verify", "draft_decode", "draft_extend") if cfg["speculative_algorithm"] else ("decode",)
    graphs = dict.fromkeys(("prefill", "decode", "target_verify", "draft_prefill", "draft_decode",
                            "draft_extend"), 0.0)
    if cfg["cuda_graph"]:
        for phase in phases:
            t2 = time.monotonic()
            log(f"Capture {phase} cuda graph begin. This can take up to several minutes. avail mem=118.80 GB",
                prefix)
            time.sleep(0.01)
            graphs[phase] = time.monotonic() - t2
            log(f"Capture {phase} cuda graph end. Time elapsed: {graphs[phase]:.2f} s. mem usage=0.10 GB. "
                "avail mem=118.70 GB.", prefix)
    return {"load_weight": load_s, "kv_cache_allocation": kv_s, "cuda_graph": graphs}


def run_scheduler_process(rank: int, cfg: dict[str, Any], in_q: Any, out_q: Any, detok_q: Any) -> None:
    """Entry point of one spawned scheduler process (what SGLang's run_scheduler_process does, in order)."""
    t_start = time.monotonic()
    reassign_own_env()  # SGLang's imports, before the process is configured
    kill_itself_when_parent_died()
    prefix = f" TP{rank}" if cfg["tp_size"] > 1 else ""
    setproctitle.setproctitle(f"sglang::scheduler{prefix.replace(' ', '_')}")
    faulthandler.enable()
    dump_stacks_on_sigusr1()
    parent = os.getppid()
    for item in cfg["standin_worker_setenv"]:
        k, _, v = item.partition("=")
        os.environ[k] = v  # set inside the running worker: reaches "NCCL", never /proc/<pid>/environ
    try:
        timings = load_model(rank, cfg, prefix)
        timings["scheduler_e2e"] = time.monotonic() - t_start
        out_q.put(("ready", str(rank), {"pid": os.getpid(), "timings": timings}))
        if rank != 0:  # the other TP ranks hold their GPU and follow rank 0's batches (not simulated)
            while True:
                time.sleep(3600)
        Scheduler(cfg, out_q, detok_q, prefix).event_loop(in_q)
    except Exception:
        log(f"Scheduler hit an exception: {traceback.format_exc()}", prefix)
        os.kill(parent, signal.SIGQUIT)
