"""Host groups: `hosts:` in params, SGLang rank argv, and a real two-host llama.cpp RPC trial over two sshd.

The RPC trial drives real processes: sshd on 127.0.0.1 (head, llama-server) and on 127.0.0.2 (worker,
`rpc-server -H 127.0.0.2`), both through SSH, and checks that the head really computed on the worker.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from sshd_plugin import SshdServer, free_port

from spectrial.engines.sglang import dist_init_addr, rank_argv
from spectrial.errors import ConfigError
from spectrial.hosts.local import LocalHost
from spectrial.params import load_params, validate
from spectrial.protocol.group import HostGroup
from spectrial.protocol.trial import run_trial
from spectrial.record.store import manifest_json
from spectrial.servers.lifecycle import Server, read_state

SGLANG_ARGV = ["python", "-m", "sglang.launch_server", "--model-path", "/m", "--tp", "8", "--port", "30000"]


# --- SGLang ranks (pure functions) ------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [0, 1, 3])
def test_sglang_rank_argv_adds_the_node_flags(rank: int) -> None:
    argv = rank_argv(SGLANG_ARGV, rank, 4, "10.0.0.1:50000")
    assert argv[:len(SGLANG_ARGV)] == SGLANG_ARGV
    assert argv[len(SGLANG_ARGV):] == ["--nnodes", "4", "--node-rank", str(rank), "--dist-init-addr",
                                       "10.0.0.1:50000"]


@pytest.mark.parametrize("existing", [
    ["--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "h:1"],
    ["--nnodes=2", "--node-rank=0", "--dist-init-addr=h:1"],
])
def test_sglang_rank_argv_replaces_existing_flags(existing: list[str]) -> None:
    head = [*SGLANG_ARGV[:4], *existing, *SGLANG_ARGV[4:]]
    argv = rank_argv(head, 2, 3, "h:1")
    assert argv == rank_argv(SGLANG_ARGV, 2, 3, "h:1")
    assert argv.count("--node-rank") == 1 and not any(a.startswith("--nnodes=") for a in argv)


def test_sglang_rank_outside_the_group_is_refused() -> None:
    with pytest.raises(ConfigError, match="rank 2 is outside 0..1"):
        rank_argv(SGLANG_ARGV, 2, 2, "h:1")


def test_dist_init_addr_from_the_params_or_the_head() -> None:
    assert dist_init_addr(SGLANG_ARGV, "10.0.0.1") == "10.0.0.1:50000"
    assert dist_init_addr([*SGLANG_ARGV, "--dist-init-addr", "h:7"], "10.0.0.1") == "h:7"
    assert dist_init_addr([*SGLANG_ARGV, "--dist-init-addr=h:8"], "10.0.0.1") == "h:8"


# --- engine hooks: what the group prepared goes into the launch command, explicitly -------------------------
def _dry_engine(engine: str, **over: Any):  # type: ignore[no-untyped-def]
    from spectrial.engines import get_engine

    data: dict[str, Any] = {"model": "/models/m", "engine": engine, "port": 31000, **over}
    if engine == "sglang":
        data["engine_config"] = {"python": "/usr/bin/python3", "tp_size": 2}
    eng = get_engine(engine, validate(data), LocalHost())
    eng.resolve_dry()
    return eng


def _workers(*addrs: str):  # type: ignore[no-untyped-def]
    from spectrial.engines import Worker, Workers

    return Workers("10.0.0.1", [Worker(LocalHost(), a, rank, binary="/opt/rpc-server")
                                for rank, a in enumerate(addrs, 1)])


def test_sglang_head_command_carries_rank_0_and_each_worker_its_rank() -> None:
    eng = _dry_engine("sglang")
    arm = eng.params.arms[0]
    alone = eng.launch_spec(arm)
    workers = _workers("10.0.0.2", "10.0.0.3")
    head = eng.launch_spec(arm, workers)
    assert "--nnodes" not in alone.argv  # nothing hidden in the engine: the same engine, no workers, one node
    assert head.argv == rank_argv(alone.argv, 0, 3, "10.0.0.1:50000")
    specs = eng.worker_specs(head, arm, workers)
    assert [(w.worker.rank, w.before_head, w.spec.http) for w in specs] == [(1, False, False), (2, False, False)]
    assert [w.spec.argv for w in specs] == [rank_argv(alone.argv, r, 3, "10.0.0.1:50000") for r in (1, 2)]
    assert eng.launch_spec(arm).argv == alone.argv  # asking with workers changed no state


def test_llamacpp_head_points_rpc_at_each_worker_and_workers_run_rpc_server() -> None:
    eng = _dry_engine("llamacpp", engine_bin="/opt/llama-server", engine_config={"rpc_port": 50070})
    arm = eng.params.arms[0]
    head = eng.launch_spec(arm, _workers("10.0.0.2"))
    assert head.argv[head.argv.index("--rpc") + 1] == "10.0.0.2:50070"
    assert "--rpc" not in eng.launch_spec(arm).argv
    (w,) = eng.worker_specs(head, arm, _workers("10.0.0.2"))
    assert w.before_head and w.spec.argv[:5] == ["/opt/rpc-server", "-H", "10.0.0.2", "-p", "50070"]
    assert eng.worker_port() == 50070


def test_an_engine_without_multi_node_refuses_workers() -> None:
    eng = _dry_engine("vllm")
    with pytest.raises(ConfigError, match="does not run one server over several nodes"):
        eng.prepare_workers("10.0.0.1", _workers("10.0.0.2").nodes)


# --- params ------------------------------------------------------------------------------------------------
def test_hosts_first_entry_is_the_head() -> None:
    p = validate({"model": "m", "hosts": ["ssh://a@10.0.0.1", {"host": "ssh://b@10.0.0.2", "addr": "192.168.1.2"}]})
    assert p.host == "ssh://a@10.0.0.1"
    assert [(n.host, n.addr) for n in p.hosts] == [("ssh://a@10.0.0.1", None), ("ssh://b@10.0.0.2", "192.168.1.2")]
    again = load_params(data=p.model_dump(mode="json"))  # round trip (overrides re-validate a dump)
    assert again.host == p.host and again.hosts == p.hosts


@pytest.mark.parametrize(("data", "message"), [
    ({"host": "ssh://x@h1", "hosts": ["ssh://x@h2"]}, "first node is the head"),
    ({"hosts": ["ssh://x@h1", "ssh://x@h1"]}, "may appear once"),
    ({"hosts": [{"host": "ssh://x@h1", "addr": "h1,evil:1"}]}, "not a host name"),
    ({"hosts": [{"host": "ssh://x@h1", "addr": "$(touch x)"}]}, "not a host name"),
    ({"hosts": [{"host": "ssh://x@h1", "port": 1}]}, "hosts.0.port: unknown parameter; allowed here: addr, host"),
    ({"engine_config": {"rpc": ["h:1,evil:2"]}}, None),
])
def test_bad_hosts_are_rejected(data: dict[str, Any], message: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        p = validate({"model": "m", **data})
        from spectrial.engines import get_engine  # engine_config is validated by the engine adapter

        get_engine(p.engine, p, LocalHost())
    if message:
        assert message in str(info.value)


# --- real processes through two sshd ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_sshd(sshd: SshdServer, sshd_factory: Callable[[int], list[SshdServer]]) -> tuple[SshdServer, SshdServer]:
    """The head's sshd (127.0.0.1) and a worker's sshd on its own loopback address (127.0.0.2 or next)."""
    (worker,) = sshd_factory(1)
    return sshd, worker


def group_params(tiny_params: dict[str, Any], head: SshdServer, worker: SshdServer, **over: Any) -> dict[str, Any]:
    """tiny_params on two nodes: head `head`, rpc-server on `worker` bound to the worker's own address."""
    params = {**tiny_params, "hosts": [head.spec, {"host": worker.spec, "addr": worker.address}],
              "ssh": {"key_filename": head.key_filename, "known_hosts": [head.known_hosts, worker.known_hosts]},
              "engine_config": {**tiny_params["engine_config"], "rpc_port": free_port(worker.address)}}
    params.pop("host")
    return {**params, **over}


def rpc_servers(port: int) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and p.info["cmdline"][0].endswith("rpc-server") and str(port) in p.info["cmdline"]]


@pytest.mark.ssh
@pytest.mark.slow
def test_two_host_rpc_trial(two_sshd: tuple[SshdServer, SshdServer], tiny_params: dict[str, Any]) -> None:
    head, worker = two_sshd
    data = group_params(tiny_params, head, worker, arms=[{"name": "baseline"}, {"name": "draft", "method": "draft"}])
    rpc_port = data["engine_config"]["rpc_port"]
    result = run_trial(load_params(data=data), progress=False)
    m = manifest_json(result.run_dir)
    assert m["status"] == "ok", m["reason"]
    endpoint = f"{worker.address}:{rpc_port}"
    assert [(n["node"], n["rank"], n["addr"]) for n in m["nodes"]] == [(head.spec, 0, "127.0.0.1"),
                                                                      (worker.spec, 1, worker.address)]
    assert m["nodes"][1]["binary"].endswith("/rpc-server")
    for arm in m["arms"]:
        assert arm["status"] == "ok" and arm["tok_s"] > 0
        assert arm["argv"][arm["argv"].index("--rpc") + 1] == endpoint
    # per-node steps ran on the worker too: GPU check, fingerprint, kill step
    steps = {s["name"]: s for s in m["steps"]}
    assert [n["node"] for n in steps["verify_gpus_free"]["nodes"]] == [worker.spec]
    assert [n["node"] for n in steps["kill_old_server"]["nodes"]] == [worker.spec]
    assert m["node_fingerprints"][0]["fingerprint"]["hostname"]
    run = Path(result.run_dir)
    for start in m["starts"]:
        (comp,) = start["server"]["companions"]
        h = comp["argv"].index("-H")
        assert comp["node"] == worker.spec and comp["argv"][h - 1].endswith("/rpc-server")
        assert comp["argv"][h:h + 4] == ["-H", worker.address, "-p", str(rpc_port)]
        assert comp["stop"]["how"] in ("TERM", "KILL") and comp["stop"]["port_free"]
        assert comp["ready_s"] is not None and comp["ready_s"] < start["ready_s"] + 60
        # the env check covered the worker's processes as well
        assert any(row.get("node") == worker.spec for row in start["env_check"]["processes"])
        head_log = (run / "logs" / f"llama-server-{start['arm']}.log").read_text()
        worker_log = (run / "logs" / f"rpc-server-{start['arm']}-node1.log").read_text()
        # the head put model tensors on the worker's device, and the worker served it
        assert re.search(rf"RPC\d*\[{re.escape(endpoint)}\].*buffer size", head_log), head_log[-3000:]
        assert "Accepted client connection" in worker_log, worker_log
    assert not rpc_servers(rpc_port), "rpc-server left running on the worker"
    assert not LocalHost().port_holders(tiny_params["port"])


@pytest.mark.ssh
def test_kill_step_stops_an_orphaned_worker(two_sshd: tuple[SshdServer, SshdServer], tiny_params: dict[str, Any],
                                             tmp_path: Path) -> None:
    """An rpc-server left by a dead kernel is found from its state file on the worker and stopped."""
    head, worker = two_sshd
    params = load_params(data=group_params(tiny_params, head, worker, arms=[{"name": "baseline"}]))
    from spectrial.engines import get_engine

    head_host = head.host()
    group = HostGroup.from_params(params, head_host)
    try:
        engine = get_engine("llamacpp", params, head_host)
        engine.prepare()
        workers = group.prepare(engine)
        srv = Server(head_host, engine.launch_spec(params.arms[0], workers), work_dir=str(tmp_path / "w"),
                     state_dir=params.state_dir, tag="orphan-test", run_id="orphan", arm="baseline")
        group.attach(srv, engine, params.arms[0], params, workers)
        (comp,) = srv.companions
        comp.server.start()  # only the worker, and never stopped: as if the kernel died right after
        comp.server.wait_ready(30, progress=False)
        orphan = comp.server.pid
        assert orphan and rpc_servers(params.engine_config["rpc_port"])
        (report,) = group.stop_previous(engine, params)
        assert report.node == worker.spec and report.previous is not None and report.previous.pgid == orphan
        assert report.action.startswith(f"stopped previous spectrial server of run orphan (pgid {orphan}: ")
        assert not rpc_servers(params.engine_config["rpc_port"])
        assert read_state(group.workers[0].host, params.state_dir, params.engine_config["rpc_port"]) is None
    finally:
        group.close()
