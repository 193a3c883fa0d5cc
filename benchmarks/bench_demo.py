"""Where the demo's wall time goes: build (first/cached), model writing, model loading, benchmarking, overhead.

    python benchmarks/bench_demo.py [--params params/local.yaml] [-p NAME=VALUE ...]

Times `ensure_llama_server` (a cache hit unless the cache is empty), `ensure_tiny_models`, then a full trial,
and splits the trial's wall time with its own step timings: loading = launch + ready steps,
benchmarking = benchmark steps, spectrial's overhead = everything else (kill step, GPU check, fingerprints,
env checks, stops, records).
"""

from __future__ import annotations

import argparse
import time

from spectrial.params import load_params, parse_overrides
from spectrial.protocol.trial import run_trial


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params/local.yaml")
    ap.add_argument("-p", "--param", action="append", default=["steps=2"])
    a = ap.parse_args()
    from spectrial.engines.llamacpp_build import binary_path, ensure_llama_server
    from spectrial.models import ensure_tiny_models

    cached = binary_path().is_file()
    t0 = time.monotonic()
    ensure_llama_server()
    t_build = time.monotonic() - t0
    t0 = time.monotonic()
    ensure_tiny_models()
    t_models = time.monotonic() - t0
    params = load_params(a.params, parse_overrides(a.param))
    t0 = time.monotonic()
    res = run_trial(params, progress=False)
    wall = time.monotonic() - t0
    steps = res.manifest["steps"]

    def total(*prefixes: str) -> float:
        return sum(s["elapsed_s"] or 0 for s in steps if s["name"].startswith(prefixes))

    loading = total("launch:", "ready:")
    bench = total("benchmark:")
    print(f"llama-server: {'cached' if cached else 'built'} in {t_build:.1f} s; tiny models ready in {t_models:.2f} s")
    print(f"trial {res.run_dir.name}: {wall:.1f} s wall = loading {loading:.1f} s + benchmarking {bench:.1f} s "
          f"+ spectrial overhead {wall - loading - bench:.1f} s ({len(res.manifest['starts'])} server starts)")
    for s in steps:
        print(f"  {s['name']:<28} {s['elapsed_s']:>7.2f} s")


if __name__ == "__main__":
    main()
