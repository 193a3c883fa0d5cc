"""vLLM adapter: `vllm serve` argv with one --speculative-config JSON, readiness, /metrics window deltas."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from spectrial.analysis.figures import arm_figures
from spectrial.engines import Window, get_engine
from spectrial.engines.vllm import probe
from spectrial.errors import ConfigError
from spectrial.hosts.local import LocalHost
from spectrial.logs.api import ServerLog
from spectrial.params import load_params
from spectrial.protocol.plan import dry_run
from spectrial.schema import RequestRecord


def vdata(tmp_path: Path, **over: Any) -> dict[str, Any]:
    return {"name": "v", "engine": "vllm", "model": "/models/Llama-3.1-8B", "draft": "/models/eagle3-llama",
            "steps": 3, "port": 8123, "output_dir": str(tmp_path / "out"),
            "engine_config": {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.9},
            "arms": [{"name": "baseline"}, {"name": "eagle3", "method": "eagle3"}], **over}


def argv_of(data: dict[str, Any], arm: int = -1) -> list[str]:
    eng = get_engine("vllm", load_params(data=data), LocalHost())
    eng.resolve_dry()
    return eng.launch_spec(eng.params.arms[arm]).argv


def spec_json(argv: list[str]) -> dict[str, Any]:
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_dry_run_writes_vllm_serve_with_one_speculative_config(tmp_path):
    arms = dry_run(load_params(data=vdata(tmp_path, env={"NCCL_PROTO": "LL"})))
    base, eagle = arms[0].argv, arms[1].argv
    assert base == ["vllm", "serve", "/models/Llama-3.1-8B", "--host", "127.0.0.1", "--port", "8123",
                    "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9",
                    "--no-enable-prefix-caching"]  # a cached prompt would skip the prefill the baseline paid
    assert eagle[:len(base)] == base and len(eagle) == len(base) + 2
    assert spec_json(eagle) == {"method": "eagle3", "model": "/models/eagle3-llama", "num_speculative_tokens": 3}
    assert arms[1].env == {"NCCL_PROTO": "LL"}


@pytest.mark.parametrize("method,expected", [
    ("eagle", {"method": "eagle", "model": "/models/eagle3-llama", "num_speculative_tokens": 3}),
    ("draft", {"method": "draft_model", "model": "/models/eagle3-llama", "num_speculative_tokens": 3}),
    ("nextn", {"method": "mtp", "num_speculative_tokens": 3}),
    ("ngram", {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}),
])
def test_methods_map_to_vllm_speculative_methods(tmp_path, method, expected):
    data = vdata(tmp_path, arms=[{"name": "a", "method": method}])
    data["engine_config"]["prompt_lookup_max"] = 4
    assert spec_json(argv_of(data)) == expected


def test_contradictions_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="topk: spectrial drives vLLM with a draft chain"):
        argv_of(vdata(tmp_path, topk=4))
    with pytest.raises(ConfigError, match="num_speculative_tokens \\+ 1 = 4"):
        argv_of(vdata(tmp_path, draft_tokens=6))
    with pytest.raises(ConfigError, match="needs a draft model"):
        argv_of(vdata(tmp_path, draft=None))
    data = vdata(tmp_path)
    data["engine_config"]["extra_args"] = ["--speculative-config", "{}"]
    with pytest.raises(ConfigError, match="written by spectrial"):
        argv_of(data)
    data = vdata(tmp_path)
    data["engine_config"]["speculative_extra"] = {"num_speculative_tokens": 9}
    with pytest.raises(ConfigError, match="come from the arm"):
        argv_of(data)


def test_prepare_without_vllm_fails_before_launch(tmp_path):
    data = vdata(tmp_path, engine_bin=str(tmp_path / "no-vllm"))
    with pytest.raises(ConfigError, match="does not run on host local"):
        get_engine("vllm", load_params(data=data), LocalHost()).prepare()


def _metrics(drafts: float, draft_tokens: float, accepted: float, pos: list[float]) -> str:
    lab = 'engine="0",model_name="m"'
    lines = ["# TYPE vllm:spec_decode_num_drafts counter", f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}",
             "# TYPE vllm:spec_decode_num_draft_tokens counter",
             f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {draft_tokens}",
             "# TYPE vllm:spec_decode_num_accepted_tokens counter",
             f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {accepted}",
             "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}'
              for i, v in enumerate(pos)]
    return "\n".join(lines) + "\n"


def test_window_counters_from_metrics_deltas(tmp_path):
    pages = iter([_metrics(10, 30, 20, [9, 7, 4]), _metrics(110, 330, 200, [89, 67, 44])])
    transport = httpx.MockTransport(lambda req: httpx.Response(200, text=next(pages)))
    eng = get_engine("vllm", load_params(data=vdata(tmp_path)), LocalHost())
    eng.resolve_dry()
    with httpx.Client(transport=transport) as client:
        before, after = eng.snapshot(client, "http://x"), eng.snapshot(client, "http://x")
    reqs = [RequestRecord(tokens=101, client_tok_s=100.0) for _ in range(3)]
    arm = eng.params.arms[1]
    st = eng.window_stats(Window(arm, eng.launch_spec(arm), before, after, reqs, ServerLog(""), 1, 0))
    assert (st.verify_steps, st.drafted, st.accepted) == (100, 300, 180)
    assert st.per_position == pytest.approx([0.8, 0.6, 0.4])
    fig = arm_figures(reqs, st, speculative=True)
    assert fig.accept_len == pytest.approx(2.8) and fig.draft_accept_rate == pytest.approx(0.6)
    assert fig.engine_cycle_ms == pytest.approx(3 * 1000 / 100)  # client decode time / verify steps
    assert fig.cycle_ms == pytest.approx(2.8 / 100 * 1000)  # accept length / decode rate


def test_probe_not_ready_while_refused_then_ready_on_health_200(port):
    with httpx.Client(timeout=2) as client:
        with pytest.raises(httpx.ConnectError):
            probe(client, f"http://127.0.0.1:{port}")

        class Health(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200 if self.path == "/health" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        srv = ThreadingHTTPServer(("127.0.0.1", port), Health)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            assert probe(client, f"http://127.0.0.1:{port}").ready
        finally:
            srv.shutdown()
            srv.server_close()


def test_the_vllm_probe_is_kept_while_the_environment_holds(tmp_path, monkeypatch) -> None:
    """Importing vllm to learn its version takes seconds a trial: the answer is kept in the cache under the
    environment's identity and asked again only when that changes (an install or removal in site-packages)."""
    import os
    import sys

    from spectrial.engines.base import get_engine
    from spectrial.hosts.local import LocalHost
    from spectrial.params import validate

    stub = tmp_path / "stub"
    (stub / "vllm").mkdir(parents=True)
    imports = tmp_path / "imports.txt"
    (stub / "vllm" / "__init__.py").write_text(
        f"__version__ = '9.9.9'\nopen({str(imports)!r}, 'a').write('imported\\n')\n")
    (stub / "vllm" / "config.py").write_text(
        "import dataclasses\n@dataclasses.dataclass\nclass SpeculativeConfig:\n    method: str = ''\n")
    monkeypatch.setenv("PYTHONPATH", str(stub))
    monkeypatch.setenv("SPECTRIAL_CACHE", str(tmp_path / "cache"))
    p = validate({"engine": "vllm", "model": "m", "arms": [{"name": "baseline"}]}, "test")
    engine = get_engine("vllm", p, LocalHost())
    for _ in range(3):
        probe = engine._probe_vllm(sys.executable)
        assert (probe.version, probe.speculative_fields) == ("9.9.9", ["method"])
    assert imports.read_text().count("imported") == 1  # asked once, then read from the cache
    entry = engine._probe_cache(sys.executable, None)
    assert entry is not None and entry.is_file() and entry.is_relative_to(tmp_path / "cache")
    entry.write_text("{not json")  # a damaged entry is probed again, not believed
    assert engine._probe_vllm(sys.executable).version == "9.9.9"
    assert imports.read_text().count("imported") == 2
    ident = engine.host.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    purelib = ident.stdout.strip()
    st = os.stat(purelib)
    try:  # an install moves site-packages' change time: a new identity, a new probe
        os.utime(purelib, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        engine._probe_vllm(sys.executable)
        assert imports.read_text().count("imported") == 3
    finally:
        os.utime(purelib, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_the_rendezvous_file_a_vllm_log_names_is_found_exactly():
    """vLLM's workers meet through /tmp/vllm_dist_<uuid4 hex> (vllm/utils/network_utils.py) and never remove it:
    the session removes what the log names, and nothing that only resembles it."""
    from spectrial.engines.vllm import rendezvous_files

    ok = "/tmp/vllm_dist_4aef26621db348e0800ec991f11e5ba7"
    log = (f"(EngineCore pid=1) INFO world_size=1 rank=0 local_rank=0 distributed_init_method=file://{ok} "
           f"backend=gloo\nagain distributed_init_method=file://{ok}\n"
           "distributed_init_method=file:///tmp/vllm_dist_../../etc/passwd backend=gloo\n"
           "distributed_init_method=file:///tmp/vllm_dist_4aef26621db348e0800ec991f11e5ba7x backend\n"
           "distributed_init_method=tcp://127.0.0.1:4000 backend=nccl\n")
    assert rendezvous_files(log) == [ok]
