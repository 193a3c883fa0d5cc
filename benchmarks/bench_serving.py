"""What the serving figures and the headline cost, on synthetic streams of known shape.

Builds N requests of T tokens each (speculative-looking streams: bursts of a few tokens per verify cycle, with
jitter), then times `spectrial.analysis.serving.serving_figures` (percentiles and their bootstrap CIs), the tables
written to requests.csv / stream.csv and read back, and the latency figure. Target: well under a second for
1,000 requests x 256 tokens on the 2-core machine, so that a trial's compare step never waits on it.

    python benchmarks/bench_serving.py [--requests 1000] [--tokens 256] [--boot 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from spectrial.analysis import serving
from spectrial.readers.render import plots
from spectrial.schema import RequestRecord


def streams(n: int, tokens: int, seed: int = 0) -> list[RequestRecord]:
    """n requests: TTFT ~30 ms, then bursts of 1-4 tokens every ~8 ms (events 0.05 ms apart in a burst)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t = 30.0 + rng.normal(0, 3)
        events, counts = [t], [1]
        while sum(counts) < tokens:
            t += 8.0 + rng.normal(0, 1)
            burst = int(min(rng.integers(1, 5), tokens - sum(counts)))
            for j in range(burst):
                events.append(t + 0.05 * j)
                counts.append(1)
        e2el = events[-1] + 1.0
        out.append(RequestRecord(index=i, arm="spec", restart=0, start=0, t_start=i * 1.0, t_end=i * 1.0 + e2el / 1000,
                                 tokens=tokens, chunks=len(events), ttft_ms=events[0], e2el_ms=e2el,
                                 tpot_ms=(e2el - events[0]) / (tokens - 1), events_ms=events, event_tokens=counts,
                                 event_tokens_exact=False))
    return out


def timed(fn, repeat: int) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    reqs = streams(a.requests, a.tokens)
    s, fig = timed(lambda: serving.serving_figures(reqs, expected_tokens_per_chunk=2.5, concurrency=1,
                                                   slo={"ttft_ms": 40, "tpot_ms": 5}, n_boot=a.boot), a.repeat)
    print(f"{a.requests} requests x {a.tokens} tokens, {a.boot} bootstrap resamples (median of {a.repeat})")
    print(f"  serving_figures      {s:7.3f} s   ITL p50 {fig.itl_ms.p50:.3f} ms/token, per chunk "  # type: ignore[union-attr]
          f"{fig.itl_chunk_ms.p50:.2f} ms, goodput {fig.goodput_fraction:.1%}")  # type: ignore[union-attr]
    s, frames = timed(lambda: (serving.requests_frame(reqs), serving.events_frame(reqs)), a.repeat)
    print(f"  requests/stream frames {s:5.3f} s   ({len(frames[1]):,} events)")  # type: ignore[index]
    s, _ = timed(lambda: serving.from_frames(*frames), a.repeat)  # type: ignore[misc]
    print(f"  read back            {s:7.3f} s")
    s, _ = timed(lambda: plots.latency_figure({"spec": reqs}, expected_tokens_per_chunk={"spec": 2.5}), a.repeat)
    print(f"  latency figure       {s:7.3f} s")


if __name__ == "__main__":
    main()
