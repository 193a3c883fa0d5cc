"""TEST DOUBLE: the per-TP-rank worker ("scheduler") process of the SGLang stand-in (see `sglang/__init__.py`).

Started by the launcher with multiprocessing *spawn*, so its `/proc/<pid>/environ` is the launcher's
environment at spawn time. Rank 0 runs the simulated scheduler (prefill, batched decode steps that sleep,
chain acceptance of drafted tokens) and prints SGLang-format `Prefill batch` / `Decode batch` lines; every
rank prints startup lines and, when NCCL_DEBUG=INFO is in its own environment, NCCL-format INFO lines.
"""

from __future__ import annotations

import os
import queue
import random
import socket
import sys
import time
from typing import Any

NCCL_QUIET = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")


def log(rank: int, msg: str) -> None:
    """One log line in SGLang's worker format `[YYYY-mm-dd HH:MM:SS TPr] msg`, written in one call."""
    sys.stdout.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')} TP{rank}] {msg}\n")
    sys.stdout.flush()


def nccl_lines(rank: int, world: int) -> None:
    """Imitation of NCCL's INIT,ENV output for the NCCL_* variables in this process's own environment."""
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


class Scheduler:
    """Rank 0's simulated batch scheduler."""

    def __init__(self, cfg: dict[str, Any], out_q: Any) -> None:
        self.cfg, self.out_q = cfg, out_q
        self.spec = cfg["speculative_algorithm"] is not None
        self.steps = int(cfg.get("speculative_num_steps") or 0)
        self.draft_tokens = int(cfg.get("speculative_num_draft_tokens") or 0)
        self.rng = random.Random(cfg.get("random_seed") or 0)
        self.running: dict[str, dict[str, Any]] = {}
        self.forward_ct_decode = 0
        self.spec_num_accepted_tokens = self.spec_num_forward_ct = 0
        self.spec_total_num_accepted_tokens = self.spec_total_num_forward_ct = 0
        self.tokens_since_log, self.last_log_t = 0, time.monotonic()
        self.verify_ms_sum, self.cycle_ms_sum, self.cycles_since_log = 0.0, 0.0, 0
        self.last_gen_throughput = 0.0
        self.t_next: float | None = None

    def state(self) -> dict[str, Any]:
        """What SGLang's get_internal_state returns that spectrial reads."""
        st: dict[str, Any] = {"last_gen_throughput": self.last_gen_throughput,
                              "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": 100000, "graph": 0.0}}
        if self.spec and self.spec_total_num_forward_ct > 0:
            st["avg_spec_accept_length"] = self.spec_total_num_accepted_tokens / self.spec_total_num_forward_ct
        return st

    def add(self, rid: str, prompt_tokens: int, max_new: int) -> None:
        """Prefill one request: its first token comes with the prefill."""
        time.sleep(self.cfg["standin_prefill_ms"] / 1000)
        log(0, f"Prefill batch, #new-seq: 1, #new-token: {prompt_tokens}, #cached-token: 0, token usage: 0.00, "
               f"#running-req: {len(self.running)}, #queue-req: 0, cuda graph: False, input throughput (token/s): "
               f"{prompt_tokens / max(self.cfg['standin_prefill_ms'], 1e-3) * 1000:.2f}")
        req = {"rid": rid, "prompt": prompt_tokens, "max_new": max_new, "done": 1, "verify": 0, "accepted": 0,
               "t0": time.monotonic()}
        self.emit(req, 1)
        if req["done"] < max_new:
            self.running[rid] = req
        self.t_next = None

    def emit(self, req: dict[str, Any], n: int) -> None:
        finished = req["done"] >= req["max_new"]
        meta: dict[str, Any] = {"id": req["rid"], "prompt_tokens": req["prompt"], "completion_tokens": req["done"],
                                "cached_tokens": 0, "e2e_latency": time.monotonic() - req["t0"],
                                "finish_reason": {"type": "length", "length": req["max_new"]} if finished else None}
        if self.spec and req["verify"] > 0:
            drafted = req["verify"] * max(self.draft_tokens - 1, 1)
            meta.update(spec_verify_ct=req["verify"], spec_accept_length=req["done"] / req["verify"],
                        spec_accept_rate=req["accepted"] / drafted, spec_accept_token_num=req["accepted"],
                        spec_draft_token_num=drafted)
        self.out_q.put(("tok", req["rid"], n, finished, meta))

    def pace(self, step_s: float) -> None:
        """Sleep so that steps follow a clock of `step_s` (the double's own overhead is absorbed, not added)."""
        now = time.monotonic()
        if self.t_next is None or now > self.t_next + step_s:
            self.t_next = now
        self.t_next += step_s
        time.sleep(max(self.t_next - time.monotonic(), 0.0))

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
        for rid in list(self.running):
            req = self.running[rid]
            acc = 0
            if self.spec:
                while acc < self.steps and self.rng.random() < c["standin_accept"]:
                    acc += 1
            n = min(1 + acc, req["max_new"] - req["done"])
            req["done"] += n
            committed_total += n
            if self.spec:
                req["verify"] += 1
                req["accepted"] += n - 1
                accepted_total += n - 1
            self.emit(req, n)
            if req["done"] >= req["max_new"]:
                del self.running[rid]
        self.forward_ct_decode += 1
        self.tokens_since_log += committed_total
        if self.spec:
            self.spec_num_accepted_tokens += accepted_total + bs
            self.spec_num_forward_ct += bs
        if self.forward_ct_decode % c["decode_log_interval"] == 0:
            self.log_decode(bs)

    def log_decode(self, bs: int) -> None:
        """SGLang's `Decode batch` line; flushes the interval's spec counters into the cumulative ones."""
        now = time.monotonic()
        self.last_gen_throughput = self.tokens_since_log / max(now - self.last_log_t, 1e-9)
        self.tokens_since_log, self.last_log_t = 0, now
        msg = f"Decode batch, #running-req: {bs}, #token: {bs * 64}, token usage: 0.00, "
        if self.spec and self.spec_num_forward_ct:
            accept_len = self.spec_num_accepted_tokens / self.spec_num_forward_ct
            rate = self.spec_num_accepted_tokens / (self.spec_num_forward_ct * max(self.draft_tokens, 1))
            self.spec_total_num_accepted_tokens += self.spec_num_accepted_tokens
            self.spec_total_num_forward_ct += self.spec_num_forward_ct
            self.spec_num_accepted_tokens = self.spec_num_forward_ct = 0
            msg += f"accept len: {accept_len:.2f}, accept rate: {rate:.2f}, "
        msg += f"cuda graph: True, gen throughput (token/s): {self.last_gen_throughput:.2f}, #queue-req: 0"
        log(0, msg)
        if self.spec and os.environ.get("EAGLE3_PROFILE") == "1" and self.cycles_since_log:
            v, cyc = self.verify_ms_sum / self.cycles_since_log, self.cycle_ms_sum / self.cycles_since_log
            log(0, f"Target verify: {v:.2f} ms/cyc ({100 * v / max(cyc, 1e-9):5.1f}%)")
            self.verify_ms_sum = self.cycle_ms_sum = 0.0
            self.cycles_since_log = 0


def run_worker(rank: int, cfg: dict[str, Any], in_q: Any, out_q: Any) -> None:
    """Entry point of one spawned worker process."""
    parent = os.getppid()
    for item in cfg["standin_worker_setenv"]:
        k, _, v = item.partition("=")
        os.environ[k] = v  # set inside the running worker: reaches "NCCL", never /proc/<pid>/environ
    log(rank, f"Load weight begin. avail mem={79.1 - rank * 0.01:.2f} GB")
    nccl_lines(rank, cfg["tp_size"])
    time.sleep(cfg["standin_load_s"])
    log(rank, "Load weight end. type=StandinForCausalLM, dtype=torch.bfloat16, avail mem=61.20 GB, mem usage=17.90 GB.")
    log(rank, "KV Cache is allocated. #tokens: 100000, K size: 1.00 GB, V size: 1.00 GB")
    log(rank, "Memory pool end. avail mem=58.90 GB")
    log(rank, "Capture cuda graph begin. This can take up to several minutes. avail mem=58.80 GB")
    log(rank, "Capture cuda graph end. Time elapsed: 0.01 s. mem usage=0.10 GB. avail mem=58.70 GB.")
    out_q.put(("ready", rank, os.getpid()))
    sched = Scheduler(cfg, out_q) if rank == 0 else None
    while True:
        if os.getppid() != parent:
            return
        try:
            msg = in_q.get(timeout=0 if sched and sched.running else 0.5)
        except queue.Empty:
            msg = None
        if msg is not None:
            if msg[0] == "stop":
                return
            if sched is not None and msg[0] == "gen":
                sched.add(msg[1], msg[2], msg[3])
            elif sched is not None and msg[0] == "state":
                out_q.put(("state", msg[1], 0, True, sched.state()))
            continue
        if sched is not None and sched.running:
            sched.step()
