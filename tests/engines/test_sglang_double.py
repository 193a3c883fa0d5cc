"""The SGLang test double (tests/standin/sglang) behaves as the real SGLang 0.5.17 did on the H200 device.

Each test starts the double directly, the way spectrial starts a server: `setsid sh -c '"$@"; echo $? > EXIT'
EXIT python -m sglang.launch_server ...` with PYTHONPATH=tests/standin, under a small harness process that is
a child subreaper (so the children SGLang leaves behind are reparented to it and stay visible as zombies
instead of being reaped by PID 1 at some moment), and always stops it. The facts checked are those recorded
in ../shared/reference/REAL_ENGINES.md ("SGLang 0.5.17 on the H200 device").
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sshd_plugin import free_port

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"
TARGET = STANDIN / "models" / "target"
DRAFT = STANDIN / "models" / "eagle3-draft"
EAGLE3 = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(DRAFT),
          "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]
SGLANG_OWN_VARS = 16  # what /proc showed of scheduler and detokenizer on the device

# the harness: child subreaper; starts the wrapped server in its own session; prints the sh pid, then how sh
# ended (reaping only sh); keeps the orphans it inherits as zombies until its stdin closes
HARNESS = r"""
import ctypes, subprocess, sys
ctypes.CDLL("libc.so.6").prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
log = open(sys.argv[1], "wb")
sh = subprocess.Popen(["sh", "-c", '"$@"; echo $? > "$0"', *sys.argv[2:]], stdout=log,
                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
print(sh.pid, flush=True)
print(sh.wait(), flush=True)
sys.stdin.read()
"""
ACCESS_503 = re.compile(r'^INFO:     127\.0\.0\.1:\d+ - "GET /health HTTP/1\.1" 503 Service Unavailable$', re.M)
ACCESS_200 = re.compile(r'^INFO:     127\.0\.0\.1:\d+ - "GET /health HTTP/1\.1" 200 OK$', re.M)
WARMUP_ACCESS = re.compile(r'^INFO:     127\.0\.0\.1:\d+ - "POST /generate HTTP/1\.1" 200 OK$', re.M)
TS = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\]"
DECODE_PLAIN = re.compile(TS + r" Decode batch, #running-req: 1, #token: \d+, token usage: \d\.\d\d, cuda graph: "
                          r"False, gen throughput \(token/s\): \d+\.\d\d, #queue-req: 0$", re.M)
DECODE_SPEC = re.compile(TS + r" Decode batch, #running-req: 1, #token: \d+, token usage: \d\.\d\d, accept len: "
                         r"(\d\.\d\d), accept rate: (\d\.\d\d), cuda graph: True, gen throughput \(token/s\): "
                         r"\d+\.\d\d, #queue-req: 0$", re.M)
STARTUP = re.compile(TS + r" Engine startup timings \(s\): load_weight=\d+\.\d\d, kv_cache_allocation=\d+\.\d\d, "
                     r"scheduler_e2e=\d+\.\d\d, cuda_graph=\{prefill=\d+\.\d\d, decode=\d+\.\d\d, "
                     r"target_verify=\d+\.\d\d, draft_prefill=\d+\.\d\d, draft_decode=\d+\.\d\d, "
                     r"draft_extend=\d+\.\d\d\}, tokenizer_e2e=\d+\.\d\d$", re.M)
KV_CACHE = re.compile(TS + r" KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: \d+, K size: \d+\.\d\d GB, "
                      r"V size: \d+\.\d\d GB$", re.M)
READY = "The server is fired up and ready to roll!"
SIGTERM_LINE = "SIGTERM received. signum=None frame=None. Draining requests and shutting down..."
DRAINED = "Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[]."



def raw_environ(pid: int) -> dict[str, str]:
    """/proc/<pid>/environ read as raw NUL-separated `K=V` entries (what an SSH `cat` would see)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().partition("=")[::2] for item in raw.split(b"\0") if b"=" in item)


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


@dataclass
class Double:
    """One started double: the harness, the `sh` wrapper (= process group and session) and its files."""

    harness: subprocess.Popen
    sh_pid: int
    port: int
    log: Path
    exit_file: Path
    t_start: float = field(default_factory=time.monotonic)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def launcher(self) -> psutil.Process:
        """The launched process (`python -m sglang.launch_server`), child of the sh wrapper."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            kids = psutil.Process(self.sh_pid).children()
            if kids:
                return kids[0]
            time.sleep(0.02)
        raise AssertionError("the wrapper started nothing")

    def group(self) -> list[psutil.Process]:
        """Every process of the server's process group, zombies included."""
        out = []
        for p in psutil.process_iter():
            try:
                if os.getpgid(p.pid) == self.sh_pid:
                    out.append(p)
            except (ProcessLookupError, psutil.Error):
                continue
        return out

    def live(self) -> list[psutil.Process]:
        out = []
        for p in self.group():
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.NoSuchProcess:
                continue
        return out

    def wait_ready(self, timeout: float = 150) -> None:  # a loaded machine (CI's two lanes) once took over 60 s
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5) as c:
            while time.monotonic() < deadline:
                try:
                    if c.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        raise AssertionError(f"not ready after {timeout} s:\n{self.diagnose()}")

    def diagnose(self) -> str:
        """What a double that did not become ready was doing: each live process of its group (status, command)
        and every thread's stack (the double's SIGUSR1 hook writes them to its log), then the log without the
        access lines of our own polling."""
        procs = []
        for p in self.live():
            with contextlib.suppress(psutil.Error, OSError):
                cmd = cmdline(p.pid)
                procs.append(f"{p.pid} {p.status()} {cmd[:120]}")
                if cmd.startswith("sglang::") or "sglang.launch_server" in cmd.split(" ", 3)[2:3]:
                    os.kill(p.pid, signal.SIGUSR1)  # the double's own processes only (not sh, not the tracker)
                    time.sleep(0.5)  # one at a time: their dumps share the log
        time.sleep(0.5)
        text = "\n".join(line for line in self.log_text().splitlines() if not line.startswith("INFO:     127.0.0.1:"))
        return "processes:\n" + "\n".join(procs) + "\nlog (access lines left out):\n" + text[-12000:]

    def wait_exit(self, timeout: float = 30) -> str:
        """What the wrapper wrote: the shell's `$?` of the launched process."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.exit_file.exists() and self.exit_file.read_text().strip():
                return self.exit_file.read_text().strip()
            time.sleep(0.02)
        raise AssertionError(f"no exit status after {timeout} s:\n{self.log_text()[-3000:]}")

    def wrapper_status(self, timeout: float = 30) -> int:
        """How the `sh` wrapper itself ended, as its parent saw it (a negative number: killed by that signal)."""
        assert self.harness.stdout is not None
        ready, _, _ = select.select([self.harness.stdout], [], [], timeout)
        assert ready, "the wrapper did not end"
        return int(self.harness.stdout.readline())

    def wait_gone(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.live() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not self.live(), [(p.pid, p.status()) for p in self.live()]

    def close(self) -> None:
        if self.live():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.sh_pid, signal.SIGKILL)
        if self.harness.stdin:
            self.harness.stdin.close()
        self.harness.wait(timeout=10)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Double]]:
    """Start the double (`python -m sglang.launch_server`) with extra args and environment; stop it after."""
    started: list[Double] = []

    def _start(*args: str, env: dict[str, str] | None = None, port: int | None = None) -> Double:
        port = port or free_port()
        n = len(started)
        log, exit_file = tmp_path / f"sglang-{n}.log", tmp_path / f"sglang-{n}.exit"
        argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(TARGET), "--host", "127.0.0.1",
                "--port", str(port), *args]
        full_env = {**os.environ, "PYTHONPATH": str(STANDIN), **(env or {})}
        harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(log), str(exit_file), *argv], env=full_env,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert harness.stdout is not None
        d = Double(harness, int(harness.stdout.readline()), port, log, exit_file)
        started.append(d)
        return d

    yield _start
    for d in started:
        d.close()


def generate(d: Double, max_new: int, timeout: float = 60) -> dict[str, Any]:
    r = httpx.post(f"{d.url}/generate", json={"text": "one two three", "sampling_params": {"max_new_tokens": max_new}},
                   timeout=timeout)
    assert r.status_code == 200, r.text
    return r.json()


def metrics(d: Double) -> dict[str, Any]:
    """`/metrics` parsed by prometheus_client: family name -> family."""
    r = httpx.get(f"{d.url}/metrics", timeout=10)
    assert r.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def sample(fams: dict[str, Any], family: str, suffix: str = "") -> float:
    return sum(s.value for s in fams[family].samples if s.name == family + suffix)


# --- 1. processes ---------------------------------------------------------------------------------------
def test_children_renamed_with_blanked_environ_yet_inherited_variables_take_effect(start):
    d = start(*EAGLE3[:4], "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
              "--speculative-num-draft-tokens", "4", "--standin-accept", "0.1", "--standin-verify-ms", "2",
              env={"NCCL_PROTO": "LL", "SGLANG_SIMULATE_ACC_LEN": "3.5"})
    d.wait_ready()
    launcher = d.launcher()
    kids = {p.pid: cmdline(p.pid) for p in launcher.children()}
    sched = [p for p, c in kids.items() if c == "sglang::scheduler"]
    detok = [p for p, c in kids.items() if c == "sglang::detokenizer"]
    tracker = [p for p, c in kids.items() if "from multiprocessing.resource_tracker import main" in c]
    assert len(sched) == 1 and len(detok) == 1 and len(tracker) == 1 and len(kids) == 3, kids
    for pid in (launcher.pid, *kids):  # one process group and one session: the wrapper's (setsid)
        assert os.getpgid(pid) == d.sh_pid and os.getsid(pid) == d.sh_pid
    assert raw_environ(launcher.pid)["NCCL_PROTO"] == "LL"
    assert raw_environ(tracker[0])["NCCL_PROTO"] == "LL"  # the tracker keeps its cmdline and environ
    for pid in sched + detok:
        env = raw_environ(pid)
        assert len(env) == SGLANG_OWN_VARS and "NCCL_CUMEM_ENABLE" in env, env
        assert "NCCL_PROTO" not in env and "SGLANG_SIMULATE_ACC_LEN" not in env and "PYTHONPATH" not in env
        assert Path(f"/proc/{pid}/environ").read_bytes().startswith(b"\0")  # so psutil's parser sees nothing
        assert psutil.Process(pid).environ() == {}
    # ... yet the scheduler's os.environ holds SGLANG_SIMULATE_ACC_LEN: forced accept length 3.5, not ~1.1
    meta = generate(d, 200)
    assert 3.2 < meta["meta_info"]["spec_accept_length"] < 3.8, meta["meta_info"]
    assert set(meta["output_ids"]) == {100}  # SGLANG_SIMULATE_ACC_TOKEN_MODE=fixed (the default)


# --- 2. readiness ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_refused_then_503_empty_then_200_and_each_health_takes_a_second(start):
    d = start("--standin-import-s", "0.5", "--standin-warmup-s", "1.5")
    seen: list[str] = []
    server_info_while_503: list[int] = []
    with httpx.Client(timeout=10) as c:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                r = c.get(f"{d.url}/health")
            except httpx.ConnectError:
                seen.append("refused")
                time.sleep(0.05)
                continue
            if r.status_code == 200:
                log_at_200 = d.log_text()
                seen.append("200")
                break
            assert r.status_code == 503 and r.content == b"" and "content-type" not in r.headers
            seen.append("503")
            info = c.get(f"{d.url}/server_info")
            server_info_while_503.append(info.status_code)
            assert "internal_states" in info.json() and info.json()["version"] == "0.5.17+standin"
            time.sleep(0.1)
        durations = []
        for _ in range(3):
            t = time.monotonic()
            assert c.get(f"{d.url}/health").status_code == 200
            durations.append(time.monotonic() - t)
    order = [k for i, k in enumerate(seen) if i == 0 or seen[i - 1] != k]
    assert order == ["refused", "503", "200"], seen
    assert server_info_while_503 and set(server_info_while_503) == {200}
    assert READY in log_at_200
    assert all(0.95 <= s < 1.8 for s in durations), durations
    text = d.log_text()
    assert ACCESS_503.search(text) and ACCESS_200.search(text)
    assert WARMUP_ACCESS.search(text).start() < text.index(READY)  # SGLang's own warm-up request


# --- 3. stop ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sigterm_drains_then_sigkills_its_tree_exit_137_children_zombies(start):
    d = start()
    d.wait_ready()
    launcher = d.launcher()
    kids = launcher.children()
    t0 = time.monotonic()
    os.kill(launcher.pid, signal.SIGTERM)
    status = d.wait_exit()
    elapsed = time.monotonic() - t0
    assert status == "137"  # SIGKILLed itself: -9 to a Popen, 128 + 9 to a shell
    assert elapsed < 6.5, elapsed  # the watchdog looks every 5 s
    text = d.log_text()
    assert text.index(SIGTERM_LINE) < text.index(DRAINED)
    assert text.rstrip().endswith("Killed")  # dash's report of its SIGKILLed child
    harness = d.harness.pid
    for k in kids:  # SIGKILLed by their parent, which never reaped them: zombies of whoever inherits them
        # a SIGKILL takes effect when the child is next scheduled: on a loaded machine it was seen still `running`
        # right after its parent's exit; it must be a zombie within a few seconds
        deadline = time.monotonic() + 5
        while k.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.02)
        assert k.status() == psutil.STATUS_ZOMBIE and k.ppid() == harness, (k.pid, k.status(), k.ppid())
    assert not d.live() and d.wrapper_status() == 0
    assert not [c for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == d.port]


@pytest.mark.slow
def test_group_sigterm_as_spectrial_sends_it_kills_wrapper_and_children_at_once(start):
    d = start()
    d.wait_ready()
    launcher = d.launcher()
    kids = [p for p in launcher.children() if cmdline(p.pid).startswith("sglang::")]
    os.killpg(d.sh_pid, signal.SIGTERM)
    time.sleep(0.5)
    for k in kids:  # scheduler and detokenizer keep SIGTERM's default action
        assert k.status() == psutil.STATUS_ZOMBIE
    assert d.wrapper_status(timeout=2) == -signal.SIGTERM  # the wrapper too: its `echo $?` never runs
    d.wait_gone(timeout=7)  # the launcher (and the resource_tracker, which ignores SIGTERM) until the watchdog
    assert DRAINED in d.log_text()
    assert not d.exit_file.exists()


@pytest.mark.slow
def test_inflight_request_delays_the_stop(start):
    d = start("--standin-decode-ms", "20")
    d.wait_ready()
    launcher = d.launcher()
    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(generate(d, 400)))
    worker.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    os.kill(launcher.pid, signal.SIGTERM)
    worker.join(timeout=30)
    done = time.monotonic() - t0
    assert d.wait_exit() == "137"
    stopped = time.monotonic() - t0
    assert result["meta_info"]["completion_tokens"] == 400  # drained, not cut
    assert re.search(r"Gracefully exiting\.\.\. Remaining number of requests 1\. Remaining requests "
                     r"remaining_rids=\['[0-9a-f]{32}'\]\.", d.log_text())
    assert DRAINED in d.log_text() and stopped > done > 5


@pytest.mark.slow
def test_force_shutdown_exits_without_draining(start):
    d = start("--standin-decode-ms", "20", env={"SGL_FORCE_SHUTDOWN": "1"})
    d.wait_ready()
    launcher = d.launcher()
    errors: list[Exception] = []

    def long_request() -> None:
        try:
            generate(d, 2000)
        except Exception as exc:  # cut by the kill
            errors.append(exc)

    worker = threading.Thread(target=long_request)
    worker.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    os.kill(launcher.pid, signal.SIGTERM)
    assert d.wait_exit() == "137"
    assert time.monotonic() - t0 < 6.5
    worker.join(timeout=10)
    assert errors and isinstance(errors[0], httpx.TransportError)
    text = d.log_text()
    assert "Signal SIGTERM received while force shutdown flag set. Force exiting." in text
    assert "Gracefully exiting" not in text


@pytest.mark.slow
def test_crash_logs_the_exception_hangs_health_then_ends_in_minus_9(start):
    d = start(env={"STANDIN_CRASH_AFTER_REQUESTS": "1", "SGLANG_HEALTH_CHECK_TIMEOUT": "2"})
    d.wait_ready()
    assert generate(d, 8)["meta_info"]["completion_tokens"] == 8  # the first client request is served
    errors: list[Exception] = []

    def doomed() -> None:
        try:
            generate(d, 8)
        except Exception as exc:
            errors.append(exc)

    t0 = time.monotonic()
    worker = threading.Thread(target=doomed)
    worker.start()
    time.sleep(0.3)
    t = time.monotonic()
    health = httpx.get(f"{d.url}/health", timeout=10)
    health_s = time.monotonic() - t
    assert health.status_code == 503 and 1.9 < health_s < 3.5  # hangs until SGLANG_HEALTH_CHECK_TIMEOUT
    assert d.wait_exit() == "137"
    assert 4.5 < time.monotonic() - t0 < 8
    worker.join(timeout=10)
    assert errors  # the request that hit the crash never got an answer
    text = d.log_text()
    assert re.search(TS + r" Scheduler hit an exception: Traceback \(most recent call last\):", text)
    assert "RuntimeError: CUDA error" in text
    assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in text
    assert "Health check failed. Server couldn't get a response from detokenizer for last 2 seconds." in text
    assert "Gracefully exiting" not in text


# --- 4. metrics and statistics -----------------------------------------------------------------------------
def test_metrics_counters_last_window_gauges_meta_info_and_server_info_with_eagle3(start):
    d = start(*EAGLE3, "--enable-metrics", "--decode-log-interval", "10", "--standin-verify-ms", "3")
    d.wait_ready()
    before = metrics(d)
    for name, kind in (("sglang:spec_verify_calls", "counter"), ("sglang:generation_tokens", "counter"),
                       ("sglang:num_requests", "counter"), ("sglang:spec_accept_length", "gauge"),
                       ("sglang:spec_accept_rate", "gauge")):
        assert before[name].type == kind, (name, before[name].type)
    for name in ("sglang:spec_verify_calls", "sglang:generation_tokens", "sglang:num_requests"):
        assert {s.name for s in before[name].samples} == {name + "_total"}
        assert before[name + "_created"].samples[0].value > 1.7e9  # prometheus_client's creation time
        assert all(set(s.labels) == {"engine_type", "model_name"} for s in before[name].samples)
    gauge = before["sglang:spec_accept_length"].samples[0]
    assert set(gauge.labels) == {"engine_type", "model_name", "tp_rank", "pp_rank", "moe_ep_rank"}
    metas = [generate(d, 120)["meta_info"] for _ in range(2)]
    after = metrics(d)
    gen = sample(after, "sglang:generation_tokens", "_total") - sample(before, "sglang:generation_tokens", "_total")
    ver = sample(after, "sglang:spec_verify_calls", "_total") - sample(before, "sglang:spec_verify_calls", "_total")
    assert gen == sum(m["completion_tokens"] for m in metas) == 240
    assert ver == sum(m["spec_verify_ct"] for m in metas)
    assert sample(after, "sglang:num_requests", "_total") - sample(before, "sglang:num_requests", "_total") == 2
    last_window = DECODE_SPEC.findall(d.log_text())[-1]  # the gauges are the last Decode batch window
    assert f"{sample(after, 'sglang:spec_accept_length'):.2f}" == last_window[0]
    assert f"{sample(after, 'sglang:spec_accept_rate'):.2f}" == last_window[1]
    for m in metas:
        assert {"spec_accept_length", "spec_verify_ct", "spec_accept_rate", "spec_num_correct_drafts",
                "spec_num_proposed_drafts", "spec_accept_histogram", "decode_throughput", "e2e_latency",
                "completion_tokens", "prompt_tokens"} <= set(m)
        hist = m["spec_accept_histogram"]
        assert sum(hist) == m["spec_verify_ct"] and len(hist) == 3
        assert sum(i * h for i, h in enumerate(hist)) == m["spec_num_correct_drafts"]
        assert m["spec_num_proposed_drafts"] == 2 * m["spec_verify_ct"]
        assert m["spec_accept_length"] == pytest.approx(m["completion_tokens"] / m["spec_verify_ct"])
        assert m["spec_accept_rate"] == pytest.approx(m["spec_num_correct_drafts"] / m["spec_num_proposed_drafts"])
    comp = httpx.post(f"{d.url}/v1/completions", json={"prompt": "a b", "max_tokens": 8}, timeout=30).json()
    assert "meta_info" not in comp and not any("spec" in k for k in json.dumps(comp).split('"'))
    info = httpx.get(f"{d.url}/server_info", timeout=10).json()
    state = info["internal_states"][0]
    assert 1.0 < state["avg_spec_accept_length"] <= 3.0 and state["last_gen_throughput"] > 0
    assert "memory_usage" in state and info["max_running_requests"] == 48 and info["speculative_num_steps"] == 2
    assert "Max running requests is reset to 48 for speculative decoding" in d.log_text()


def test_metrics_and_statistics_without_speculation(start):
    d = start("--enable-metrics", "--decode-log-interval", "10")
    d.wait_ready()
    meta = generate(d, 40)["meta_info"]
    fams = metrics(d)
    assert "sglang:spec_verify_calls" not in fams
    assert fams["sglang:spec_accept_length"].type == "gauge"
    assert sample(fams, "sglang:spec_accept_length") == 0.0 and sample(fams, "sglang:spec_accept_rate") == 0.0
    assert not any(k.startswith("spec_") for k in meta) and meta["completion_tokens"] == 40
    state = httpx.get(f"{d.url}/server_info", timeout=10).json()["internal_states"][0]
    assert "avg_spec_accept_length" not in state


# --- 5. logs -----------------------------------------------------------------------------------------------
def test_logs_decode_lines_every_40_forwards_startup_timings_kv_cache_and_deprecation(start):
    d = start("--disable-cuda-graph")
    d.wait_ready()
    generate(d, 100)  # 1 token from the prefill, then 99 decode forwards: a line at forwards 40 and 80
    text = d.log_text()
    assert len(DECODE_PLAIN.findall(text)) == 2, text
    assert STARTUP.search(text) and KV_CACHE.search(text)
    assert STARTUP.search(text).start() < text.index("INFO:     Uvicorn running on http://127.0.0.1:")
    ansi = [ln for ln in text.splitlines() if "\x1b[" in ln]
    assert len(ansi) == 1 and "--disable-cuda-graph" in ansi[0] and "deprecated" in ansi[0]
    assert httpx.get(f"{d.url}/metrics", timeout=10).status_code == 404  # no --enable-metrics: no /metrics


# --- 6. kept: SGLang's own argument parser ------------------------------------------------------------------
@pytest.mark.parametrize("bad,message", [(["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
                                         (["--cuda-graph-max", "8"], "ambiguous option")])
def test_sglang_argument_errors_exit_2(bad, message):
    res = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", str(TARGET), *bad],
                         env={**os.environ, "PYTHONPATH": str(STANDIN)}, capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and message in res.stderr
