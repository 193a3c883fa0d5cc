"""Benchmark `spectrial.logs.parse` against `grep -E` on a >= 500 MB log built from the public corpus.

The log repeats every snippet of ../shared/corpus/public_logs.jsonl (all engines, in corpus order) until it
reaches --mb, in a temporary directory (never in the repository). grep prints the lines holding any of the
registry's markers (the same record types, one ERE alternation) into a file: GNU grep stops at the first
match when its output is /dev/null, so the output goes to a real file. parse reads every record into the
table, in a child process so that its peak RSS (ru_maxrss) is its own; the RSS after the imports is reported
beside it, and the DataFrame's size is ``df.memory_usage(deep=True).sum()``. grep and parse run in the same
run, interleaved, so both see the same machine load (the load average is printed).

    python benchmarks/bench_logs.py                # 500 MB, grep 3 runs (median), parse 1 run
    python benchmarks/bench_logs.py --mb 100 --parse-runs 2
    python benchmarks/bench_logs.py --mix server   # only a running server's own log lines
    python benchmarks/bench_logs.py --workers 1    # one process (no worker processes)

Targets (issue 17): parse within 5x of grep's wall time (goal 3x); peak memory under 2x the DataFrame.
parse reads a file of 64 MiB and more with one worker process per CPU (spectrial.logs.parallel); --workers 1
measures one process. The run also times the empty table alone (the parse's result, all NaN/None, built in a
fresh process, with numpy's huge-page hint off as parse has it): what producing the result costs this machine
before anything is parsed. The DataFrame's deep size counts a string once per cell even where cells share one
object, so the peak is also put beside the table's blocks alone (a strict lower bound of its memory).
Wall and CPU time are both printed (the machine may be shared); CPU time is user + system from getrusage.
On a virtual machine that backs guest memory lazily, the first run after boot also pays for the first touch
of the DataFrame's memory: run it twice (--parse-runs 2) to see both.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "public_logs.jsonl"
CHILD = r"""
import json, resource, sys, time
from spectrial.logs import parse, markers, parallel
def cpu(who=resource.RUSAGE_SELF):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime, r.ru_stime
rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
w0, (c0, s0) = time.perf_counter(), cpu()
df = parse(sys.argv[1], workers=None if sys.argv[2] == "auto" else int(sys.argv[2]))
wall, (c1, s1), (cw, sw) = time.perf_counter() - w0, cpu(), cpu(resource.RUSAGE_CHILDREN)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
stats = parallel.last.as_dict() if parallel.last is not None else {"workers": 1, "segments": 1, "worker_peak_rss": 0}
print(json.dumps({"wall_s": wall, "cpu_s": c1 - c0 + cw, "sys_s": s1 - s0 + sw, "workers_cpu_s": cw,
                  "rows": len(df), "columns": df.shape[1],
                  "float_columns": int((df.dtypes == "float64").sum()), "object_columns": int((df.dtypes == object).sum()),
                  "unparsed_lines": df.attrs["unparsed_lines"], "lines": df.attrs["lines"],
                  "errors": len(df.attrs["parser_errors"]), "automaton": markers.ahocorasick_rs is not None,
                  "df_bytes": int(df.memory_usage(deep=True).sum()), "rss_after_import": rss_import,
                  "peak_rss": peak, **{f"parallel_{k}": v for k, v in stats.items()}}))
"""
# the empty table alone: what building the parse's result costs on this machine, before any parsing (fresh process)
FLOOR = r"""
import json, sys, time
import numpy as np, pandas as pd
from spectrial.logs import table
from spectrial.logs.api import madvise_hugepage
n, nf, no = (int(v) for v in sys.argv[1:4])
madvise_hugepage(False)  # as parse builds it (with numpy's huge-page hint a VM may take several times longer)
w0 = time.perf_counter()
fblock, oblock = table._blocks(nf, no, n)
df = pd.concat([pd.DataFrame({"line": np.arange(n)}), pd.DataFrame(oblock.T, dtype=object, copy=False),
                pd.DataFrame(fblock.T, copy=False)], axis=1)
print(json.dumps({"wall_s": time.perf_counter() - w0}))
"""


# corpus `kind` prefixes of snippets that are a running server's own log (not pasted tables or benchmark output)
SERVER_KINDS = ("sglang_decode", "sglang_prefill", "sglang_startup", "vllm_spec_metrics", "vllm_throughput",
                "nccl_info", "nccl_tuning", "llamacpp_server", "llamacpp_spec")


def build_log(path: Path, mb: int, corpus: Path, mix: str = "corpus") -> int:
    """Write the corpus snippets over and over until the file has `mb` MB; returns its size in bytes."""
    recs = [json.loads(line) for line in corpus.read_text().splitlines() if line.strip()]
    texts = [r["text"] for r in recs if mix == "corpus" or r["kind"].startswith(SERVER_KINDS)]
    block = "".join(t if t.endswith("\n") else t + "\n" for t in texts).encode()
    target = mb * 1_000_000
    with open(path, "wb") as fh:
        written = 0
        while written < target:
            fh.write(block)
            written += len(block)
    return written


def grep_pattern() -> str:
    """One ERE alternation of every registered marker (what a user would grep for)."""
    from spectrial.logs import registry

    markers = sorted({m for f in registry.formats for m in f.markers}, key=len, reverse=True)
    return "|".join(re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", m) for m in markers)


def time_grep(path: Path, pattern: str, out: Path) -> dict:
    """grep's matching lines written to `out` (a file: to /dev/null GNU grep stops at the first match)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    with open(out, "wb") as fh:
        subprocess.run(["grep", "-E", pattern, str(path)], stdout=fh, check=False)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(out, "rb") as fh:
        count = sum(block.count(b"\n") for block in iter(lambda: fh.read(1 << 24), b""))
    return {"wall_s": wall, "cpu_s": cpu, "count": count, "out_bytes": out.stat().st_size}


def time_parse(path: Path, workers: str = "auto") -> dict:
    """parse in a child process: its own wall and CPU time around the call (its worker processes' CPU time
    included), and the child's whole CPU time (interpreter start and imports too) from getrusage(RUSAGE_CHILDREN)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), workers], capture_output=True, text=True,
                         check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["process_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=500, help="size of the generated log in MB (default 500)")
    ap.add_argument("--grep-runs", type=int, default=3, help="grep runs; the median is reported")
    ap.add_argument("--parse-runs", type=int, default=1, help="parse runs; the median is reported")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--floor-pause", type=float, default=30.0,
                    help="seconds idle before timing the empty table (a VM may take back memory left free)")
    ap.add_argument("--workers", default="auto",
                    help="parse's worker processes: auto (one per CPU, at most 16, for files of 64 MiB and more) or a number (1: none)")
    ap.add_argument("--mix", choices=["corpus", "server"], default="corpus",
                    help="corpus: every snippet (the issue's benchmark); server: only snippets that are a running "
                         "server's own log lines (SGLang/vLLM stats, NCCL, llama.cpp), no pasted tables or bench output")
    args = ap.parse_args()

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="spectrial-bench-logs-") as tmp:
        path = Path(tmp) / "corpus-repeated.log"
        size = build_log(path, args.mb, args.corpus, args.mix)
        mb = size / 1e6
        pattern = grep_pattern()
        greps, parses = [], []
        for i in range(max(args.grep_runs, args.parse_runs)):  # interleaved: both see the same machine load
            if i < args.grep_runs:
                greps.append(time_grep(path, pattern, Path(tmp) / "grep.out"))
            if i < args.parse_runs:
                parses.append(time_parse(path, args.workers))
        p = parses[-1]
        floors = []
        for pause in (args.floor_pause, 0):  # memory left alone for a while (as the parse found it), then at once
            time.sleep(pause)
            floors.append(json.loads(subprocess.run(
                [sys.executable, "-c", FLOOR, str(p["rows"]), str(p["float_columns"]), str(p["object_columns"] - 1)],
                capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])["wall_s"])
    load_after = os.getloadavg()
    g_wall = statistics.median(g["wall_s"] for g in greps)
    g_cpu = statistics.median(g["cpu_s"] for g in greps)
    p_wall = statistics.median(p["wall_s"] for p in parses)
    p_cpu = statistics.median(p["cpu_s"] for p in parses)
    p = parses[-1]
    print(f"log: {mb:.0f} MB, {p['lines']:,} lines ({args.mix} snippets repeated), {os.cpu_count()} CPUs, "
          f"load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"grep -E > file ({len(pattern)} chars, {greps[0]['count']:,} matching lines, "
          f"{greps[0]['out_bytes'] / 1e6:.0f} MB written): {g_wall:.2f} s wall = {mb / g_wall:.0f} MB/s, "
          f"{g_cpu:.2f} s CPU")
    p_proc = statistics.median(p["process_cpu_s"] for p in parses)
    where = (f"{p['workers_cpu_s']:.2f} s in {p['parallel_workers']} worker processes and a finalize helper over "
             f"{p['parallel_segments']} segments" if p["parallel_workers"] > 1 else "one process")
    print(f"parse: {p['rows']:,} records x {p['columns']} columns, {p['unparsed_lines']:,} lines unparsed, "
          f"{p['errors']} parser errors: {p_wall:.2f} s wall = {mb / p_wall:.1f} MB/s, "
          f"{p_cpu:.2f} s CPU of which {p['sys_s']:.2f} s system (page faults, mostly); {where} "
          f"(the child process in all, with start, imports, measuring the DataFrame's deep size and exit: "
          f"{p_proc:.2f} s CPU; "
          f"marker search: {'Aho-Corasick' if p['automaton'] else 'RE2 union'})")
    print(f"the empty table alone ({p['rows']:,} rows x {p['float_columns']} float + {p['object_columns']} object "
          f"columns, NaN/None, in a fresh process): {floors[0]:.2f} s = {floors[0] / g_wall:.1f}x grep after "
          f"{args.floor_pause:.0f} s idle, {floors[1]:.2f} s right after")
    ratio, cpu_ratio = p_wall / g_wall, p_cpu / max(g_cpu, 1e-9)
    verdict = "met" if ratio <= 5 else "NOT met"
    print(f"ratio parse/grep: {ratio:.1f}x wall ({verdict}: target <= 5x, goal 3x), {cpu_ratio:.1f}x CPU")
    spread = p_cpu / (os.cpu_count() or 1)
    print(f"parse's CPU time over all {os.cpu_count()} CPUs: {spread:.2f} s = {spread / g_wall:.1f}x grep (the wall "
          f"time with every CPU busy throughout: below it only with less CPU work)")
    mem = p["peak_rss"] / p["df_bytes"]
    everything = p["peak_rss"] + p["parallel_workers"] * p["parallel_worker_peak_rss"]
    print(f"memory: peak RSS {p['peak_rss'] / 2**20:.0f} MiB (after imports {p['rss_after_import'] / 2**20:.0f} MiB), "
          f"DataFrame {p['df_bytes'] / 2**20:.0f} MiB deep: peak/DataFrame {mem:.2f}x "
          f"(target < 2x: {'met' if mem < 2 else 'NOT met'}); with every worker process at its peak RSS "
          f"({p['parallel_workers']} x {p['parallel_worker_peak_rss'] / 2**20:.0f} MiB, pages shared with the parent "
          f"counted in each: an upper bound) {everything / 2**20:.0f} MiB = {everything / p['df_bytes']:.2f}x")
    # deep size counts a string once per cell even where cells share one object: the blocks alone are a strict
    # lower bound of the DataFrame's memory (8 bytes a cell, line column included)
    blocks = p["rows"] * p["columns"] * 8
    print(f"memory, strict: peak RSS / the DataFrame's blocks alone ({blocks / 2**20:.0f} MiB, no string objects) "
          f"{p['peak_rss'] / blocks:.2f}x (< 2x: {'met' if p['peak_rss'] < 2 * blocks else 'NOT met'})")
    print("runs:", json.dumps({"grep": greps, "parse": parses}))


if __name__ == "__main__":
    main()
