"""TEST DOUBLE: the `/metrics` families of the SGLang stand-in (with --enable-metrics), via prometheus_client.

As SGLang 0.5.17 exposes them: the tokenizer manager's counters and histograms (labels engine_type,
model_name; counted when a request finishes, health checks excluded, the warm-up request included) and the
scheduler's gauges (labels engine_type, model_name, tp_rank, pp_rank, moe_ep_rank) set once per decode log
window: `sglang:spec_accept_length` / `sglang:spec_accept_rate` are the LAST WINDOW's values (0.0 without
speculation), `sglang:spec_verify_calls_total` (counter) exists only with speculation. prometheus_client adds
the `_created` samples of counters and histograms. A subset of SGLang's 70 families.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
                   20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
SCHEDULER_GAUGES = {
    "num_running_reqs": "The number of running requests.",
    "num_used_tokens": "The number of used tokens.",
    "token_usage": "The token usage.",
    "gen_throughput": "The generation throughput (token/s).",
    "num_queue_reqs": "The number of requests in the waiting queue.",
    "spec_accept_length": "The average acceptance length of speculative decoding.",
    "spec_accept_rate": "The average acceptance rate of speculative decoding (`accepted tokens / total draft tokens` "
                        "in batch).",
    "is_cuda_graph": "Whether batch is using CUDA graph.",
}
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """The launcher's registry: tokenizer-side counters, scheduler gauges fed by the scheduler's stats."""

    def __init__(self, model_name: str, speculative: bool, cuda_graph: bool) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"model_name": model_name, "engine_type": "unified"}
        self.sched_labels = {**self.labels, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        r, names = self.registry, list(self.labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"sglang:{name}", doc, names, registry=r)

        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Number of generation tokens processed.")
        self.num_requests = counter("num_requests", "The number of processed requests.")
        self.verify_calls = counter("spec_verify_calls", "The number of speculative verify calls.") \
            if speculative else None
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              names, buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             names, buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in "
                             "seconds", names, buckets=LATENCY_BUCKETS, registry=r)
        self.startup = Gauge("sglang:startup_time_seconds", "Engine startup time per phase in seconds.",
                             [*names, "phase"], registry=r)
        self.gauges = {k: Gauge(f"sglang:{k}", doc, list(self.sched_labels), registry=r)
                       for k, doc in SCHEDULER_GAUGES.items()}
        for g in self.gauges.values():
            g.labels(**self.sched_labels).set(0.0)
        self.gauges["is_cuda_graph"].labels(**self.sched_labels).set(1.0 if cuda_graph else 0.0)
        for c in (self.prompt_tokens, self.generation_tokens, self.num_requests, self.verify_calls):
            if c is not None:
                c.labels(**self.labels)

    def startup_phases(self, phases: dict[str, float]) -> None:
        for phase, s in phases.items():
            self.startup.labels(**self.labels, phase=phase).set(s)

    def first_token(self, ttft_s: float) -> None:
        self.ttft.labels(**self.labels).observe(ttft_s)

    def chunk(self, gap_s: float, n: int) -> None:
        """Inter-token latency of one output chunk of n tokens."""
        if n > 0:
            self.itl.labels(**self.labels).observe(gap_s / n)

    def finished(self, meta: dict[str, Any], e2e_s: float) -> None:
        """One finished request (not a health check)."""
        self.prompt_tokens.labels(**self.labels).inc(meta.get("prompt_tokens", 0))
        self.generation_tokens.labels(**self.labels).inc(meta.get("completion_tokens", 0))
        self.num_requests.labels(**self.labels).inc()
        if self.verify_calls is not None:
            self.verify_calls.labels(**self.labels).inc(meta.get("spec_verify_ct", 0))
        self.e2e.labels(**self.labels).observe(e2e_s)

    def scheduler_stats(self, stats: dict[str, float]) -> None:
        """The scheduler's gauges of the last decode log window."""
        for k, v in stats.items():
            if k in self.gauges:
                self.gauges[k].labels(**self.sched_labels).set(v)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
