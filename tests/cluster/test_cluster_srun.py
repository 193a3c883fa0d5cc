"""A host group inside a Slurm job: the head in the batch step, a llama.cpp rpc-server worker on `srun:NODE`
(its own job step, reached with `srun --overlap`, never SSH), on the real local cluster (tests/slurm_plugin.py).
The head really computes on the worker, the env check covers the worker's processes, and when the unit ends no
rpc-server and no job step is left."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from sshd_plugin import free_port
from test_cluster_slurm import leftovers, merged, start
from test_host_group_rpc import rpc_servers

from spectrial.errors import ConfigError
from spectrial.params import load_params
from spectrial.record.store import load_record


def test_srun_host_outside_a_job_says_what_is_missing(monkeypatch):
    from spectrial.hosts.connect import get_host

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ConfigError, match="SLURM_JOB_ID is not set"):
        get_host("srun:node1")


def test_a_slurm_unit_refuses_ssh_around_the_scheduler(tmp_path):
    from spectrial.cluster.fanout import unit_hosts

    p = load_params(data={"model": "m", "hosts": ["local", "ssh://me@gpu2"]})
    with pytest.raises(ConfigError, match="srun:NODE"):
        unit_hosts(p)
    ok = load_params(data={"model": "m", "hosts": ["local", {"host": "srun:gpu2", "addr": "10.0.0.2"}]})
    assert [h["host"] for h in unit_hosts(ok)] == ["local", "srun:gpu2"]


@pytest.mark.slurm
@pytest.mark.slow
def test_a_host_group_over_two_srun_tasks(slurm, tiny_params: dict[str, Any], write_params, tmp_path: Path):
    rpc_port = free_port()
    data = {**tiny_params, "hosts": ["local", {"host": f"srun:{slurm.node}", "addr": "127.0.0.1"}],
            "engine_config": {**tiny_params["engine_config"], "rpc_port": rpc_port},
            "arms": [{"name": "baseline"}, {"name": "draft", "method": "draft"}],
            "cluster": {"executor": "slurm", "units": 1, "max_parallel": 1,
                        "slurm": {"time_limit": "10", "cpus_per_unit": 2, "poll_s": 0.5}}}
    proc = start(write_params(data), slurm)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    m, run = merged(tmp_path / "outputs")
    (u,) = m.cluster.units
    unit_dir = run / "units" / u.run_id
    um = load_record(unit_dir)
    assert um.status == "ok", um.reason
    raw = um.model_dump()
    worker = f"srun:{slurm.node}"
    assert [(n["node"], n["rank"]) for n in raw["nodes"]] == [("local", 0), (worker, 1)]
    endpoint = f"127.0.0.1:{rpc_port}"
    for start_ in raw["starts"]:
        (comp,) = start_["server"]["companions"]
        assert comp["node"] == worker and comp["argv"][comp["argv"].index("-H") - 1].endswith("/rpc-server")
        assert comp["stop"]["port_free"]
        assert any(row.get("node") == worker for row in start_["env_check"]["processes"])
        head_log = (unit_dir / "logs" / f"llama-server-{start_['arm']}.log").read_text()
        worker_log = (unit_dir / "logs" / f"rpc-server-{start_['arm']}-node1.log").read_text()
        assert re.search(rf"RPC\d*\[{re.escape(endpoint)}\].*buffer size", head_log), head_log[-3000:]
        assert "Accepted client connection" in worker_log, worker_log
    assert not rpc_servers(rpc_port), "rpc-server left running"
    assert not leftovers(m.run_id) and not slurm.job_ids()
