"""spectrial's own overhead per protocol step, locally and over SSH, and its readiness detection latency.

For each host (this machine through `LocalHost`, and an `SSHHost` on a throwaway sshd on loopback that
this script starts, as the tests do) it runs the trial's protocol steps with spectrial's own functions on
a real llama-server with the tiny model, `--launches` times, and prints per step: commands run on the host,
SFTP operations, port-forward channels opened, their sum (round trips spectrial waits for) and seconds
(median over launches). One command's round trip (`true`) is measured first, for scale.

Readiness detection latency = the moment `Server.wait_ready` returns minus the server's own "model loaded"
instant: llama-server's log line carries the time since its start (`M.SS.mmm.uuu`), added to the process
start time the kernel reports (/proc/<pid>/stat, 10 ms ticks since boot; the sshd runs on this machine, so
one clock serves).
Target: < 0.5 s.

With `--trials N` it also runs N whole trials (params/local.yaml: three arms, llama.cpp, tiny models) locally
and over SSH with `run_trial`, and prints each step's seconds from the records (median over trials), summed
per step kind (launch, ready, stop, ... over the arms), with the SSH path's extra per start. Target: the SSH
path's own cost within ~1 s per start of the local one on loopback.

    python benchmarks/bench_host.py [--launches 3] [--requests 2] [--max-tokens 32] [--poll 0.1] [--trials 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pandas as pd

from spectrial.engines import get_engine
from spectrial.engines.llamacpp import ready_offset_s
from spectrial.engines.llamacpp_build import ensure_llama_server
from spectrial.hosts.fingerprint import host_fingerprint
from spectrial.hosts.gpu import wait_gpus_free
from spectrial.hosts.local import Host, LocalHost
from spectrial.hosts.ssh import SSHHost
from spectrial.measure.bench import run_requests
from spectrial.measure.workloads import bundled_items
from spectrial.models import ensure_tiny_models
from spectrial.params import TrialParams, load_params
from spectrial.protocol.trial import run_trial
from spectrial.record.store import manifest_json
from spectrial.servers.lifecycle import Server, stop_previous

TARGET_S = 0.5
STEP_KIND_RE = re.compile(r"^([a-z_]+)(?::.*)?$")
REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StepMeter:
    """Counts what each protocol step costs on one host: commands, SFTP operations, channels, seconds."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.rows: list[dict[str, Any]] = []

    def __call__(self, step: str, fn: Callable[[], Any]) -> Any:
        before = dict(self.host.counters)
        t0 = time.monotonic()
        out = fn()
        elapsed = time.monotonic() - t0
        after = self.host.counters
        row = {k: after[k] - before[k] for k in ("commands", "sftp", "channels")}
        self.rows.append({"step": step, **row, "round_trips": sum(row.values()), "seconds": elapsed})
        return out


def one_command_s(host: Host, n: int = 20) -> float:
    """Median seconds of `true` on the host: the price of one round trip through this transport."""
    times = []
    for _ in range(n):
        times.append(host.run(["true"]).elapsed_s)
    return statistics.median(times)


def started_since_boot_s(pid: int) -> float:
    """When `pid` started, in seconds since boot (/proc/<pid>/stat field 22, clock ticks of CLOCK_BOOTTIME).

    Not psutil's create_time(): that adds the boot time, which the kernel gives in whole seconds only.
    """
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 onwards
    return int(fields[22 - 3]) / os.sysconf("SC_CLK_TCK")


def ready_lag_s(server: Server, noticed_boot_s: float) -> float | None:
    """Seconds between llama-server's own "model loaded" and spectrial noticing readiness (same machine).

    `noticed_boot_s` is CLOCK_BOOTTIME when `wait_ready` returned; the server's instant is its start (10 ms
    ticks) plus the relative timestamp of its "model loaded" log line.
    """
    procs = [p for p in server.processes() if p.cmdline and p.cmdline[0].endswith("llama-server")]
    if not procs:
        return None
    started = started_since_boot_s(procs[0].pid)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # llama.cpp logs from a background thread: the line may lag a little
        offset = ready_offset_s(server.host.read_text(server.log_path))
        if offset is not None:
            return noticed_boot_s - (started + offset)
        time.sleep(0.02)
    return None


def protocol(host: Host, params: TrialParams, launches: int, poll_s: float, work: Path) -> tuple[list[dict], list]:
    """The trial's steps on `host`, `launches` times; returns per-step rows and readiness lags."""
    meter = StepMeter(host)
    engine = get_engine("llamacpp", params, host)
    meter("prepare (first: uploads on SSH)", engine.prepare)
    meter("prepare (again: all in place)", get_engine("llamacpp", params, host).prepare)
    prompts = bundled_items()
    path, payload = engine.request_target(params.request_format)
    lags = []
    state_dir = host.expand(params.state_dir)
    for i in range(launches):
        meter("kill_old_server", lambda: stop_previous(host, params.port, state_dir, 5))
        meter("verify_gpus_free", lambda: wait_gpus_free(host, timeout_s=5))
        meter("fingerprint", lambda: host_fingerprint(host))
        spec = dataclasses.replace(engine.launch_spec(params.arms[0]), poll_s=poll_s)
        srv = Server(host, spec, work_dir=str(work / f"run{i}"), state_dir=state_dir, tag=f"bench-host-{i}", grace_s=5)
        try:
            meter("launch", srv.start)
            meter("ready (includes model load)", lambda s=srv: s.wait_ready(120, progress=False))
            lags.append(ready_lag_s(srv, time.clock_gettime(time.CLOCK_BOOTTIME)))
            meter("env_check", srv.verify_env)

            def bench(s: Server = srv) -> None:
                with httpx.Client(timeout=10) as client:
                    engine.snapshot(client, s.base_url)
                    run_requests(s.base_url, prompts, n=params.repeats, max_tokens=params.max_tokens, path=path,
                                 payload=payload, stats_fn=engine.request_stats, progress=False)
                    engine.snapshot(client, s.base_url)
                s.host.read_text(s.log_path)

            meter("benchmark", bench)
        finally:
            meter("stop", srv.stop)
    return meter.rows, lags


def sshd_host(root: Path) -> tuple[SSHHost, Any, Any]:
    """An SSHHost on a throwaway sshd on 127.0.0.1 (tests/sshd_plugin.py's pool), the sshd and the pool."""
    sys.path.insert(0, str(REPO / "tests"))
    from sshd_plugin import SshdPool

    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    pool = SshdPool(root)
    server = pool.start("127.0.0.1")
    return server.host(), server, pool


def trial_steps(n: int, root: Path, sshd: Any) -> pd.DataFrame:
    """Seconds per step kind (summed over the arms; median over `n` trials), local and over SSH, from records."""
    rows = []
    for label in ("local", "ssh"):
        over: dict[str, Any] = {"output_dir": str(root / label / "outputs"), "state_dir": str(root / label / "tstate"),
                                "work_dir": str(root / label / "twork"), "port": free_port()}
        if label == "ssh":
            over.update({"host": sshd.spec, "ssh.key_filename": sshd.key_filename, "ssh.known_hosts": sshd.known_hosts})
        for i in range(n):
            t0 = time.monotonic()
            result = run_trial(REPO / "params" / "local.yaml", over, progress=False)
            wall = time.monotonic() - t0
            m = manifest_json(result.run_dir)
            kinds: dict[str, float] = {}
            for step in m["steps"]:
                kind = STEP_KIND_RE.match(step["name"])
                key = kind[1] if kind else step["name"]
                kinds[key] = kinds.get(key, 0.0) + float(step.get("elapsed_s") or 0)
            rows += [{"host": label, "trial": i, "step": k, "seconds": v} for k, v in kinds.items()]
            rows.append({"host": label, "trial": i, "step": "(whole trial, wall)", "seconds": wall})
            rows.append({"host": label, "trial": i, "step": "(starts)", "seconds": len(m["starts"])})
    df = pd.DataFrame(rows).groupby(["step", "host"], sort=False)["seconds"].median().unstack("host")
    df["ssh_extra_s"] = df["ssh"] - df["local"]
    return df


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--poll", type=float, default=0.1, help="readiness poll interval (Server.wait_ready)")
    ap.add_argument("--trials", type=int, default=0, help="also run N whole 3-arm trials locally and over SSH")
    a = ap.parse_args()
    binary, models = ensure_llama_server(), ensure_tiny_models()
    trials = None
    with tempfile.TemporaryDirectory(prefix="bench-host-") as tmp:
        root = Path(tmp)
        ssh, sshd, pool = sshd_host(root / "sshd")
        try:
            if a.trials:
                trials = trial_steps(a.trials, root / "trials", sshd)
            tables, lags, rtt = [], {}, {}
            for label, host in (("local", LocalHost()), ("ssh", ssh)):
                params = load_params(data={
                    "model": "tiny:target", "engine_bin": "auto", "port": free_port(),
                    "repeats": a.requests, "max_tokens": a.max_tokens, "arms": [{"name": "baseline"}],
                    "state_dir": str(root / label / "state"), "ssh": {"cache_dir": str(root / label / "cache")},
                    "engine_config": {"threads": 1, "ctx_size": 512}})
                rtt[label] = one_command_s(host)
                rows, lags[label] = protocol(host, params, a.launches, a.poll, root / label / "work")
                df = pd.DataFrame(rows).groupby("step", sort=False).median(numeric_only=True)
                tables.append(df.add_prefix(f"{label}_"))
        finally:
            ssh.close()
            pool.stop_all()
    table = pd.concat(tables, axis=1)
    table["ssh_extra_s"] = table["ssh_seconds"] - table["local_seconds"]
    pd.set_option("display.width", 200)
    print(f"llama-server {binary} ; tiny model {models.dir / 'target.gguf'}")
    print(f"one command round trip: local {rtt['local'] * 1000:.1f} ms, ssh {rtt['ssh'] * 1000:.1f} ms\n")
    print("per protocol step (median over launches; round_trips = commands + sftp + channels):")
    print(table.round(3).to_string())
    if trials is not None:
        starts = trials.loc["(starts)", "ssh"]
        print(f"\nwhole trials (params/local.yaml, {a.trials} each; seconds per step kind summed over the arms, "
              "median over trials):")
        print(trials.round(2).to_string())
        extra = trials.drop(["(starts)", "(whole trial, wall)"])["ssh_extra_s"].sum()
        print(f"SSH path's own cost: {extra:.2f} s over {starts:.0f} starts = {extra / starts:.2f} s per start "
              f"(target ~1 s per start)")
    print(f"\nreadiness detection latency (wait_ready returns - server's own 'model loaded'), poll {a.poll} s:")
    for label, values in lags.items():
        vals = [v for v in values if v is not None]
        if not vals:
            print(f"  {label}: not measured (no 'model loaded' line)")
            continue
        verdict = "PASS" if max(vals) < TARGET_S else "FAIL"
        print(f"  {label}: median {statistics.median(vals) * 1000:.0f} ms, max {max(vals) * 1000:.0f} ms "
              f"over {len(vals)} launches -> {verdict} (target < {TARGET_S * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
