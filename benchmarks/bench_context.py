"""What building context-length buckets costs (issue 40 item 2): prompts of real ShareGPT turns filled to each
bucket, counted with a real tokenizer (the tiny target's tokenizer.json, or `--tokenizer FILE`) or with the byte
estimate. Each pair of turns is counted once (in batches of 64), each built prompt once more as sent, plus once
per whole pair trimmed. Target: a few seconds for 4 buckets up to 16k tokens x 4 items on the 2-core machine, small
beside one server start.

    python benchmarks/bench_context.py [--buckets 512,2048,8192,16384] [--n 4] [--tokenizer FILE] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from spectrial.measure.workloads import build_workload, estimate_lengths, local_lengths
from spectrial.params import load_params

TINY = Path.home() / ".cache" / "spectrial" / "models" / "hf"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--buckets", default="512,2048,8192,16384")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    buckets = [int(x) for x in a.buckets.split(",")]
    p = load_params(data={"name": "bench", "engine": "vllm", "model": "m", "arms": [{"name": "baseline"}],
                          "workload": [{"source": "sharegpt", "prompt_tokens": buckets, "n": a.n}]})
    tok = a.tokenizer or next((str(f) for f in sorted(TINY.glob("*/target/tokenizer.json"))), None)
    counters = [("byte estimate", estimate_lengths(False))]
    if tok:
        counters.append((f"tokenizer {tok}", local_lengths(tok, False)))
    for label, lengths in counters:
        times, wl = [], None
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            wl = build_workload(p, lengths=lengths, unit=label, context=max(buckets) + 1024)
            times.append(time.perf_counter() - t0)
        assert wl is not None
        src = wl.description.sources[0]
        print(f"{label}: {len(wl.items)} prompts in {statistics.median(times):.2f} s (median of {a.repeat}; "
              f"reading ShareGPT {wl.description.read_s:.2f} s of it); mean tokens as sent per bucket: "
              + ", ".join(f"{k} {v:.0f}" for k, v in (src.bucket_tokens or {}).items()))


if __name__ == "__main__":
    main()
