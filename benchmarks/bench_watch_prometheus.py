"""How long `spectrial watch --prometheus` takes to analyse 7 days of 1-minute history (issue 42).

Builds a llama-server's 7 days of counters at one sample a minute (10,080 per series): 2 requests/s of 64 tokens,
accept length 2.44 (forced acceptance 0.8 at 2 draft steps) that falls to 1.39 on day 4 at 12:00, a restart on
day 5 (the counters start again from 0) and a 30-minute outage on day 6; backfills it into a private Prometheus
TSDB with `promtool tsdb create-blocks-from openmetrics` (Debian's prometheus package), starts Prometheus on it
(loopback, no scraping) and times the watch, end to end (a fresh process: Python start, the queries, the
intervals, the change points, the record and its figure) and the Prometheus queries alone. Prints the change
points found against the truth.

    python benchmarks/bench_watch_prometheus.py              # 7 days, step 60 s
    python benchmarks/bench_watch_prometheus.py --days 1
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]
P = "llamacpp:"
LABELS = 'job="llama",instance="gpu-host-1:8080"'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def history(days: int, step: int, end: int) -> tuple[str, dict[str, float]]:
    """OpenMetrics text of the counters (one family after another, each series in time order) and the truth."""
    n = days * 86400 // step
    start = end - (n - 1) * step
    change_at = start + 3 * 86400 + 12 * 3600 if days >= 4 else start + n * step // 2
    restart_at = start + 4 * 86400 + 6 * 3600 if days >= 5 else None
    outage = (start + 5 * 86400, start + 5 * 86400 + 1800) if days >= 6 else None
    rnd = random.Random(0)
    rows: dict[str, list[tuple[int, float]]] = {k: [] for k in (
        "spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
        "tokens_predicted_total", "requests_processing", "requests_deferred")}
    totals = dict.fromkeys(rows, 0.0)
    for i in range(n):
        t = start + i * step
        if outage and outage[0] <= t < outage[1]:
            continue
        if restart_at is not None and restart_at <= t < restart_at + step:
            totals = dict.fromkeys(rows, 0.0)
        a = 0.8 if t < change_at else 0.3
        requests = 2 * step + rnd.choice((-1, 0, 0, 1))
        tokens = 64 * requests
        accept_len = 1 + a + a * a
        steps = round(tokens / accept_len)
        totals["tokens_predicted_total"] += tokens
        totals["spec_decode_num_drafts_total"] += steps
        totals["spec_decode_num_draft_tokens_total"] += 2 * steps
        totals["spec_decode_num_accepted_tokens_total"] += tokens - steps
        totals["requests_processing"] = rnd.choice((0, 1, 1, 2))
        totals["requests_deferred"] = 0
        for k in rows:
            rows[k].append((t, totals[k]))
    lines = []
    for k, series in rows.items():
        lines.append(f"# TYPE {P}{k} gauge")
        lines += [f"{P}{k}{{{LABELS}}} {v:.0f} {t}" for t, v in series]
    lines.append("# EOF")
    truth = {"start": start, "end": end, "change_at": change_at, "before": 1 + 0.8 + 0.64, "after": 1 + 0.3 + 0.09,
             "restart_at": restart_at or math.nan, "outage_s": (outage[1] - outage[0]) if outage else 0}
    return "\n".join(lines) + "\n", truth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--step", type=int, default=60, help="seconds between two samples (and the watch's interval)")
    args = ap.parse_args()
    prom, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prom or not promtool:
        sys.exit("needs Debian's prometheus package (prometheus and promtool): scripts/ensure-prometheus.sh")
    end = int(time.time()) // args.step * args.step - 600
    text, truth = history(args.days, args.step, end)
    with tempfile.TemporaryDirectory(prefix="spectrial-bench-prom-") as tmp:
        d = Path(tmp)
        (d / "history.om").write_text(text)
        t = time.perf_counter()
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(d / "history.om"), str(d / "tsdb")],
                       check=True, capture_output=True, timeout=1800)
        backfill = time.perf_counter() - t
        (d / "prometheus.yml").write_text("global: {scrape_interval: 1m}\nscrape_configs: []\n")
        port = free_port()
        proc = subprocess.Popen([prom, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'tsdb'}",
                                 "--storage.tsdb.retention.time=30d", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    sys.exit("prometheus did not get ready in 120 s")
                time.sleep(0.2)
            from spectrial.watch.prometheus import Prometheus

            p = Prometheus(url)
            t = time.perf_counter()
            h = p.history('job="llama"', truth["start"], truth["end"], args.step)
            queries = time.perf_counter() - t
            p.close()
            t = time.perf_counter()
            res = subprocess.run([*SPECTRIAL, "watch", "--prometheus", url, "--selector", 'job="llama"', "--start",
                                  str(truth["start"]), "--end", str(truth["end"]), "--interval", str(args.step),
                                  "--output-dir", str(d / "out"), "--run-id", "bench", "--quiet"],
                                 capture_output=True, text=True, timeout=1800)
            whole = time.perf_counter() - t
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        if res.returncode != 0:
            sys.exit(res.stdout + res.stderr)
        w = json.loads((d / "out" / "bench" / "manifest.json").read_text())["watch"]
    found = [(c["series"], c["at"][:16], round(c["before_mean"], 2), round(c["after_mean"], 2)) for c in w["changes"]]
    print(f"history: {args.days} days at {args.step} s = {len(h.times):,} steps x {len(h.snapshots[0]) or 6} series; "
          f"backfill (promtool) {backfill:.1f} s")
    print(f"the queries alone (query_range, pieces of <= 11,000 steps): {queries:.2f} s")
    print(f"spectrial watch --prometheus, end to end (fresh process, record and figure): {whole:.2f} s")
    print(f"intervals {len(w['intervals']):,}, gaps {len(w['gaps'])}, resets {w['resets']}; changes {found}")
    import datetime as dt

    extra = (" a restart," if not math.isnan(truth["restart_at"]) else "") + (
        f" a {truth['outage_s'] / 60:.0f}-minute outage" if truth["outage_s"] else "")
    print(f"truth: accept length {truth['before']:.2f} -> {truth['after']:.2f} in the minute before "
          f"{dt.datetime.fromtimestamp(truth['change_at'], dt.UTC):%Y-%m-%dT%H:%M} (the interval ending there);"
          f"{extra or ' nothing else'}")


if __name__ == "__main__":
    main()
