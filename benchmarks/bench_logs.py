"""Benchmark `spectrial.logs.parse_tables` against `grep -c` on a >= 500 MB log built from the public corpus.

The log repeats every snippet of ../shared/corpus/public_logs.jsonl (all engines, in corpus order) until it
reaches --mb, in a temporary directory (never in the repository). `grep -c -E` counts the lines holding any of
the registry's markers (the same record types, one ERE alternation): it reads every line, as parse does.
parse_tables reads every record into one table per kind, in a child process so that its peak RSS
(ru_maxrss) is its own. grep and parse run interleaved in the same run, so both see the same machine load (the
load average is printed); each is run several times and the min and median are reported.

It prints the two figures of issue 28: parse's wall time over grep's (target <= 5x, goal 3x), and the tables'
memory (``DataFrame.memory_usage(deep=True)`` summed over the kinds, index included) over the log's size
(target < 1x). ``--wide`` times ``parse`` instead (the one wide frame of every kind, the issue-17 figure).

    python benchmarks/bench_logs.py                      # 500 MB, grep 5 runs, parse 3 runs
    python benchmarks/bench_logs.py --mb 100 --parse-runs 2
    python benchmarks/bench_logs.py --mix server         # only a running server's own log lines
    python benchmarks/bench_logs.py --workers 1          # one process (no worker processes)
    python benchmarks/bench_logs.py --wide               # the wide frame (parse) instead of the tables
    python benchmarks/bench_logs.py --arrow              # without the compiled line pass (arrow's kernels alone)

parse reads a file of 64 MiB and more with one worker process per CPU (spectrial.logs.parallel); --workers 1
measures one process. Wall and CPU time are both printed (the machine may be shared); CPU time is user +
system from getrusage, worker processes included.
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
import json, os, resource, sys, time
from spectrial.logs import driver, native, parse, parse_tables, parallel, registry
def cpu(who=resource.RUSAGE_SELF):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime, r.ru_stime
path, workers, wide = sys.argv[1], None if sys.argv[2] == "auto" else int(sys.argv[2]), sys.argv[3] == "wide"
rss_import = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
w0, (c0, s0) = time.perf_counter(), cpu()
got = (parse if wide else parse_tables)(path, workers=workers)
wall, (c1, s1), (cw, sw) = time.perf_counter() - w0, cpu(), cpu(resource.RUSAGE_CHILDREN)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
stats = parallel.last.as_dict() if parallel.last is not None else {"workers": 1, "segments": 1, "worker_peak_rss": 0}
if wide:
    shape = {"rows": len(got), "tables": 1, "columns": got.shape[1], "lines": got.attrs["lines"],
             "unparsed_lines": got.attrs["unparsed_lines"], "errors": len(got.attrs["parser_errors"]),
             "table_bytes": int(got.memory_usage(deep=True).sum())}
else:
    shape = {"rows": got.records, "tables": len(got), "columns": sum(t.shape[1] for t in got.values()),
             "lines": got.lines, "unparsed_lines": got.unparsed_lines, "errors": len(got.parser_errors),
             "table_bytes": got.memory_bytes()}
print(json.dumps({"wall_s": wall, "cpu_s": c1 - c0 + cw, "sys_s": s1 - s0 + sw, "workers_cpu_s": cw, **shape,
                  "automaton": driver.ahocorasick_rs is not None, "line_pass": native.status(), "log_bytes": os.path.getsize(path),
                  "block_readers": sum(hasattr(getattr(f, "vector", None), "spec") for f in registry.formats),
                  "rss_after_import": rss_import, "peak_rss": peak,
                  **{f"parallel_{k}": v for k, v in stats.items()}}))
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


def time_grep(path: Path, pattern: str) -> dict[str, float]:
    """`grep -c -E pattern path`: its wall and CPU time, and the count it prints."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run(["grep", "-c", "-E", pattern, str(path)], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "count": int(out.stdout.strip() or 0)}


def time_parse(path: Path, workers: str = "auto", wide: bool = False) -> dict[str, float]:
    """parse_tables (or parse, `wide`) in a child process: its own wall and CPU time around the call (its worker
    processes' CPU time included)."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), workers, "wide" if wide else "tables"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> str:
    """min and median of `values` (seconds)."""
    return f"min {min(values):.2f} s, median {statistics.median(values):.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=500, help="size of the generated log in MB (default 500)")
    ap.add_argument("--grep-runs", type=int, default=5, help="grep -c runs (min and median reported)")
    ap.add_argument("--parse-runs", type=int, default=3, help="parse runs (min and median reported)")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--workers", default="auto",
                    help="parse's worker processes: auto (one per CPU, at most 16, for files of 64 MiB and more) or a "
                         "number (1: none)")
    ap.add_argument("--wide", action="store_true", help="time parse (the one wide frame) instead of parse_tables")
    ap.add_argument("--mix", choices=["corpus", "server"], default="corpus",
                    help="corpus: every snippet (the issue's benchmark); server: only snippets that are a running "
                         "server's own log lines (SGLang/vLLM stats, NCCL, llama.cpp), no pasted tables or bench output")
    ap.add_argument("--arrow", action="store_true",
                    help="read with arrow's kernels alone (SPECTRIAL_LOGS_NATIVE=0: the compiled line pass off)")
    args = ap.parse_args()
    if args.arrow:
        os.environ["SPECTRIAL_LOGS_NATIVE"] = "0"  # the child parse inherits it

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="spectrial-bench-logs-") as tmp:
        path = Path(tmp) / "corpus-repeated.log"
        size = build_log(path, args.mb, args.corpus, args.mix)
        mb = size / 1e6
        pattern = grep_pattern()
        greps, parses = [], []
        for i in range(max(args.grep_runs, args.parse_runs)):  # interleaved: both see the same machine load
            if i < args.grep_runs:
                greps.append(time_grep(path, pattern))
            if i < args.parse_runs:
                parses.append(time_parse(path, args.workers, args.wide))
    load_after = os.getloadavg()
    g_walls, p_walls = [g["wall_s"] for g in greps], [p["wall_s"] for p in parses]
    g_wall, p_wall = statistics.median(g_walls), statistics.median(p_walls)
    g_cpu = statistics.median(g["cpu_s"] for g in greps)
    p_cpu = statistics.median(p["cpu_s"] for p in parses)
    p = parses[-1]
    what = "parse (one wide frame)" if args.wide else "parse_tables (a table per kind)"
    print(f"log: {mb:.0f} MB, {p['lines']:,} lines ({args.mix} snippets repeated), {os.cpu_count()} CPUs, "
          f"load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"grep -c -E ({len(pattern)} chars, {greps[0]['count']:,} matching lines) x{len(greps)}: {spread(g_walls)} "
          f"wall = {mb / g_wall:.0f} MB/s, {g_cpu:.2f} s CPU (median)")
    where = (f"{p['workers_cpu_s']:.2f} s in {p['parallel_workers']} worker processes over "
             f"{p['parallel_segments']} segments" if p["parallel_workers"] > 1 else "one process")
    print(f"{what} x{len(parses)}: {p['rows']:,} records in {p['tables']} table(s), {p['columns']} columns in all, "
          f"{p['unparsed_lines']:,} lines unparsed, {p['errors']} parser errors: {spread(p_walls)} wall = "
          f"{mb / p_wall:.1f} MB/s, {p_cpu:.2f} s CPU (median) of which {p['sys_s']:.2f} s system; {where} "
          f"(compiled passes {'on' if p['line_pass'].startswith('on') else p['line_pass']}: chunk scan, marker search, "
          f"line formats, {p['block_readers']} block readers; without them the marker search is "
          f"{'Aho-Corasick' if p['automaton'] else 'the RE2 union'})")
    ratio, best = p_wall / g_wall, min(p_walls) / min(g_walls)
    print(f"ratio parse/grep -c: {ratio:.1f}x wall, medians ({best:.1f}x of the mins; "
          f"{'met' if ratio <= 5 else 'NOT met'}: target <= 5x, goal 3x); {p_cpu / max(g_cpu, 1e-9):.1f}x CPU")
    mem = p["table_bytes"] / p["log_bytes"]
    print(f"memory: the tables {p['table_bytes'] / 1e6:.0f} MB (memory_usage(deep=True), summed) vs the log "
          f"{p['log_bytes'] / 1e6:.0f} MB: {mem:.2f}x ({'met' if mem < 1 else 'NOT met'}: target < 1x); "
          f"peak RSS {p['peak_rss'] / 2**20:.0f} MiB (after imports {p['rss_after_import'] / 2**20:.0f} MiB), "
          f"worker processes {p['parallel_worker_peak_rss'] / 2**20:.0f} MiB each at most")
    print("runs:", json.dumps({"grep": greps, "parse": parses}))


if __name__ == "__main__":
    main()
