"""Observe-only trials (spectrial.protocol.observe) against real llama-servers the tests start themselves (their own
process groups), as a user's server would be: `spectrial observe URL` measures it as it is, never signals it,
and writes an uncontrolled record whose accept length is what the server's own counters moved."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import free_port

from spectrial.measure import metrics
from spectrial.readers.diagnose import diagnose
from spectrial.readers.headline import headline
from spectrial.record.store import load_record
from spectrial.schema import NO_BASELINE, Manifest

SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]
PFX = "llamacpp:spec_decode_"


class UserServer:
    """A llama-server started the way a user would (not by spectrial): its own session, its own log."""

    def __init__(self, binary: Path, models: Any, tmp: Path, *, spec: bool = True, with_metrics: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [str(binary), "-m", str(models.dir / "target.gguf"), "--host", "127.0.0.1", "--port", str(self.port),
                "-t", "1", "-c", "1024", "-np", "1", "--no-webui"]
        if with_metrics:
            argv.append("--metrics")
        if spec:
            argv += ["-md", str(models.dir / "draft-simple.gguf"), "--spec-type", "draft-simple",
                     "--spec-draft-n-max", "2"]
        self.log = tmp / f"user-server-{self.port}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"llama-server exited {self.proc.returncode}:\n{self.log.read_text()[-2000:]}"
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("llama-server not ready in 60 s")

    def alive(self) -> bool:
        return self.proc.poll() is None and httpx.get(f"{self.url}/health", timeout=5).status_code == 200

    def counters(self) -> dict[str, float]:
        with httpx.Client(timeout=10) as c:
            return metrics.snapshot(c, self.url)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture(scope="module")
def server(llama_server: Path, tiny_models: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UserServer]:
    s = UserServer(llama_server, tiny_models, tmp_path_factory.mktemp("observe-server"))
    yield s
    s.stop()


def observe(url: str, out: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPECTRIAL, "observe", url, "-p", f"output_dir={out}", "--quiet", *args],
                          capture_output=True, text=True, timeout=timeout)


def only_run(out: Path) -> Path:
    runs = sorted(p.parent for p in out.glob("*/manifest.json"))
    assert len(runs) == 1, runs
    return runs[0]


@pytest.mark.slow
def test_observe_measures_the_server_as_it_is(server: UserServer, tmp_path: Path) -> None:
    """No warm-up, so the counters the test reads around the whole command move by the window alone."""
    pid = server.proc.pid
    before = server.counters()
    res = observe(server.url, tmp_path, "-p", "warmup=0", "-p", "repeats=4", "-p", "max_tokens=24")
    after = server.counters()
    assert res.returncode == 0, res.stderr + res.stdout
    assert "Uncontrolled: no baseline beside it" in res.stdout and NO_BASELINE.split(":")[0] in res.stdout
    run = only_run(tmp_path)
    m = load_record(run)
    assert (m.kind, m.controlled, m.status) == ("observe", False, "ok")
    o = m.observed
    assert o is not None and o.url == server.url and o.engine == "llamacpp"
    props = httpx.get(f"{server.url}/props", timeout=5).json()
    assert o.version == props["build_info"] and o.found["version"] == "GET /props build_info"
    assert (o.method, o.engine_method, o.speculative) == ("draft", "draft-simple", True)
    assert "/slots" in o.found["method"] and o.model and o.model.endswith("target.gguf")
    assert "not the server's" in o.host_note and "not done" in o.env_check
    assert [a.name for a in m.arms] == ["observed"]  # one arm, no baseline
    a = m.arms[0]
    assert a.method == "draft" and a.status == "ok" and a.requests_ok == 4
    assert a.speedup is None and a.verdict is None and a.break_even_accept_len is None and NO_BASELINE in a.notes
    drafts = metrics.delta(before, after, PFX + "num_drafts_total")
    accepted = metrics.delta(before, after, PFX + "num_accepted_tokens_total")
    assert drafts and accepted is not None
    assert a.verify_steps == drafts and a.accepted == accepted
    assert a.accept_len == pytest.approx(1 + accepted / drafts, rel=1e-9)
    pos = metrics.delta_by_label(before, after, PFX + "num_accepted_tokens_per_pos_total", "position")
    assert a.per_position == pytest.approx([pos[k] / drafts for k in sorted(pos, key=int)])
    assert a.tok_s and a.tok_s_ci_low is not None and a.serving is not None and a.serving.ttft_ms is not None
    assert [s.env_check for s in m.starts] == [None] and m.starts[0].server.pid is None
    assert not any(s.name.startswith(("kill", "verify_gpus", "launch", "stop", "env_check")) for s in m.steps)
    assert (run / "requests.csv").is_file()
    assert server.proc.pid == pid and server.alive()  # never signalled
    h = headline(m)
    assert h.title.startswith("Uncontrolled: no baseline beside it") and "accept length" in h.title
    doc = subprocess.run([*SPECTRIAL, "doctor", str(run)], capture_output=True, text=True, timeout=60)
    assert doc.returncode == 0 and "[warning] Uncontrolled: an observe-only run" in doc.stdout, doc.stdout
    assert "no speed-up" in doc.stdout and "controlled trial" in doc.stdout
    d = diagnose(run)
    assert d.kinds()[0] == "uncontrolled" and all(f.severity == "info" for f in d.findings[1:]), d.text()


@pytest.mark.slow
def test_sigterm_mid_window_fails_the_record_and_leaves_the_server(server: UserServer, tmp_path: Path) -> None:
    pid = server.proc.pid
    proc = subprocess.Popen([*SPECTRIAL, "observe", server.url, "-p", f"output_dir={tmp_path}", "-p", "repeats=500",
                             "-p", "max_tokens=48", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = list(tmp_path.glob("*/manifest.json"))
        if found:
            data = json.loads(found[0].read_text())
            if any(s["name"] == "benchmark:observed" for s in data.get("steps", [])):
                break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    time.sleep(0.5)  # inside the window: requests in flight
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "interrupted by SIGTERM: the observed server was left as it was" in err
    m = load_record(only_run(tmp_path))
    assert m.status == "failed" and "SIGTERM" in (m.reason or "") and "never signalled" in (m.reason or "")
    assert m.starts[0].status == "failed" and "SIGTERM" in (m.starts[0].reason or "")
    assert m.arms[0].status == "failed"
    assert server.proc.pid == pid and server.alive()


@pytest.mark.slow
def test_refuses_what_it_cannot_observe(server: UserServer, llama_server: Path, tiny_models: Any,
                                        tmp_path: Path, write_params: Any) -> None:
    out = tmp_path / "out"
    # a URL that does not answer
    dead = f"http://127.0.0.1:{free_port()}"
    res = observe(dead, out)
    assert res.returncode == 2 and f"{dead} does not answer" in res.stderr and "curl" in res.stderr, res.stderr
    # not a base URL
    res = observe("127.0.0.1:8080/v1", out)
    assert res.returncode == 2 and "observe.url" in res.stderr and "http(s)://HOST:PORT" in res.stderr, res.stderr
    # two arms, or a baseline arm: observe measures the server as it is
    two = write_params({"arms": [{"name": "baseline"}, {"name": "draft", "method": "draft"}]}, "two.yaml")
    res = observe(server.url, out, "--params", str(two))
    assert res.returncode == 2 and "observe measures the server as it is: one arm" in res.stderr, res.stderr
    base = write_params({"arms": [{"name": "baseline"}]}, "base.yaml")
    res = observe(server.url, out, "--params", str(base))
    assert res.returncode == 2 and "one arm" in res.stderr and "spectrial trial" in res.stderr, res.stderr
    assert not list(out.glob("*/manifest.json"))  # refusals come before any record
    # a server without /metrics, a server without speculation (both started by the test, as a user would)
    for kwargs, want in (({"with_metrics": False}, "llama-server --metrics"),
                         ({"spec": False}, "does not speculate")):
        other = UserServer(llama_server, tiny_models, tmp_path, **kwargs)
        try:
            res = observe(other.url, out)
            assert res.returncode == 2 and want in res.stderr and other.url in res.stderr, res.stderr
            assert other.alive()
        finally:
            other.stop()
    assert not list(out.glob("*/manifest.json"))


def test_the_record_block_and_headline_without_a_server() -> None:
    """An observe manifest round-trips through JSON, and its headline says uncontrolled first."""
    fx = json.loads((Path(__file__).parent.parent / "fixtures/diagnose/seed_case_uncontrolled_94.json").read_text())
    m = Manifest.model_validate(json.loads(json.dumps(fx["record"])))
    assert m.observed is not None and m.observed.method == "eagle3" and not m.controlled
    h = headline(m)
    assert h.title.startswith("Uncontrolled: no baseline beside it — the server at http://gpu-host:8000")
    assert h.arms[0].verdict == "uncontrolled: no baseline beside it" and "94.0 tok/s" in h.arms[0].sentence()
    assert yaml.safe_dump(m.model_dump(mode="json"))  # serialisable as written


def test_observe_params_take_the_url_and_need_no_model(tmp_path: Path, write_params: Any) -> None:
    from spectrial.protocol.observe import observe_arm, observe_params
    from spectrial.schema import ObservedServer

    p = observe_params("http://127.0.0.1:9/", None, {"repeats": 2})
    assert p.observe is not None and p.observe.url == "http://127.0.0.1:9" and p.repeats == 2
    assert "arms" not in p.model_fields_set
    assert observe_arm(p, ObservedServer(url=p.observe.url, method="eagle3")).method == "eagle3"
    f = write_params({"arms": [{"name": "mine", "method": "ngram"}], "max_tokens": 16})
    q = observe_params("http://127.0.0.1:9", f, None)
    assert observe_arm(q, ObservedServer(url="http://127.0.0.1:9")).name == "mine" and q.max_tokens == 16
