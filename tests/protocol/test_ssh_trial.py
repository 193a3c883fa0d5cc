"""The trial through real SSH (sshd on loopback) runs exactly as locally: CLI, notebook 02, uploads, tunnel.

`params/local.yaml` with only the host (and the sshd's key/known_hosts) changed runs through
`ssh://root@127.0.0.1:<port>`: spectrial uploads its llama-server build and tiny models into the host's
cache (user-only modes, skipped the second time), reaches the server through a local port forward, and
fetches the logs back into the run record.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from sshd_plugin import SshdServer

from spectrial.engines import get_engine
from spectrial.engines.llamacpp import ready_offset_s
from spectrial.hosts.local import LocalHost
from spectrial.hosts.ssh import SSHHost
from spectrial.params import load_params
from spectrial.record.store import manifest_json
from spectrial.servers.lifecycle import Server

REPO = Path(__file__).resolve().parents[2]
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]
pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def ssh_options(server: SshdServer, **over: Any) -> dict[str, Any]:
    """The `ssh:` params block for one of the test sshd (its key and known_hosts)."""
    return {"key_filename": server.key_filename, "known_hosts": server.known_hosts, **over}


def ssh_params(tiny_params: dict[str, Any], server: SshdServer, **over: Any) -> dict[str, Any]:
    """`tiny_params` aimed at `server` through SSH, with `over` on top."""
    return {**tiny_params, "host": server.spec, "ssh": ssh_options(server), **over}


def only_run(outputs: Path) -> Path:
    runs = [p for p in outputs.iterdir() if (p / "manifest.json").is_file()]
    assert len(runs) == 1, runs
    return runs[0]


def started_since_boot_s(pid: int) -> float:
    """When `pid` started, in seconds of CLOCK_BOOTTIME (/proc/<pid>/stat field 22; psutil's create_time adds
    a boot time rounded to whole seconds)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[22 - 3]) / os.sysconf("SC_CLK_TCK")


def mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_cli_runs_params_local_through_ssh(sshd: SshdServer, tmp_path: Path, port: int, llama_server: Path,
                                           tiny_models: Any) -> None:
    remote_cache = tmp_path / "host-cache"  # not the local cache, so the uploads really happen
    over = {"host": sshd.spec, "ssh.key_filename": sshd.key_filename, "ssh.known_hosts": sshd.known_hosts,
            "ssh.cache_dir": str(remote_cache),
            # the rest only keeps the test small and private: fewer requests, one thread, own folders and port
            "repeats": 2, "warmup": 0, "max_tokens": 16, "engine_config.threads": 1, "engine_config.ctx_size": 512,
            "port": port, "output_dir": str(tmp_path / "outputs"), "state_dir": str(tmp_path / "state"),
            "work_dir": str(tmp_path / "work")}
    args = [a for k, v in over.items() for a in ("-p", f"{k}={v}")]
    res = subprocess.run([*SPECTRIAL, "trial", str(REPO / "params" / "local.yaml"), *args, "--quiet"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    run = only_run(tmp_path / "outputs")
    m = manifest_json(run)
    assert m["status"] == "ok" and m["host"]["name"] == sshd.spec
    # issue 31: the key path is recorded as given (not a secret), with the client and host key fingerprints
    assert m["params"]["ssh"]["key_filename"] == sshd.key_filename
    ssh = m["host"]["ssh"]
    assert ssh["key_filenames"] == [sshd.key_filename] and ssh["host_key_type"] == "ssh-ed25519"
    assert ssh["host_key_sha256"].startswith("SHA256:") and ssh["key_sha256"][0].startswith("SHA256:")
    assert [(a["name"], a["status"]) for a in m["arms"]] == [("baseline", "ok"), ("draft-simple", "ok"),
                                                            ("eagle3-synthetic", "ok")]
    assert m["arms"][1]["accepted"] > 0 and m["arms"][2]["synthetic"] is True
    # the build and the tiny models were uploaded into the host's cache, same layout as the local cache
    eng = m["engine"]
    assert eng["binary"] == f"{remote_cache}/llama.cpp/bin/{llama_server.parent.name}/llama-server"
    assert "version" in eng["version"]  # the uploaded binary ran on the host
    for path in eng["models"].values():
        assert path.startswith(f"{remote_cache}/models/") and Path(path).is_file()
    uploads = {Path(u["path"]).name: u for u in eng["uploads"]}
    assert set(uploads) == {"llama-server", "target.gguf", "draft-simple.gguf", "eagle3.gguf"}
    assert all(u["uploaded"] and u["bytes"] == Path(u["local"]).stat().st_size for u in uploads.values())
    assert mode(eng["binary"]) == 0o700 and all(mode(p) == 0o600 for p in eng["models"].values())
    for d in [remote_cache, *Path(eng["binary"]).parents]:
        if remote_cache in (d, *d.parents):
            assert mode(d) == 0o700, d
    # the client reached each server through a local port forward, never the server's port directly
    for start in m["starts"]:
        assert start["server"]["url"].startswith("http://127.0.0.1:")
        assert not start["server"]["url"].endswith(f":{port}")
        assert start["server"]["stop"]["port_free"] and start["env_check"]["ok"]
    assert "model loaded" in (run / "logs" / "llama-server-baseline.log").read_text()
    assert not LocalHost().port_holders(port)
    # a second prepare finds everything in place and uploads nothing
    params = load_params(REPO / "params" / "local.yaml", {**over, "ssh.known_hosts": sshd.known_hosts})
    host = SSHHost.from_spec(sshd.spec, **params.ssh.connect_options())
    try:
        again = get_engine("llamacpp", params, host).prepare()
    finally:
        host.close()
    assert [u.uploaded for u in again.uploads or []] == [False] * 4


def test_readiness_is_noticed_quickly_through_the_tunnel(ssh_host: SSHHost, sshd: SshdServer,
                                                         tiny_params: dict[str, Any], tmp_path: Path) -> None:
    params = load_params(data=ssh_params(tiny_params, sshd))
    engine = get_engine("llamacpp", params, ssh_host)
    engine.prepare()
    srv = Server(ssh_host, engine.launch_spec(params.arms[0]), work_dir=str(tmp_path / "w"),
                 state_dir=params.state_dir, tag="ready-latency", grace_s=5)
    with srv:
        srv.wait_ready(120, progress=False)
        noticed = time.clock_gettime(time.CLOCK_BOOTTIME)
        (proc,) = [p for p in srv.processes() if p.cmdline and p.cmdline[0].endswith("llama-server")]
        started = started_since_boot_s(proc.pid)  # same machine: the kernel's start time (10 ms ticks)
        offset = None
        deadline = time.monotonic() + 5
        while offset is None and time.monotonic() < deadline:  # the log thread may lag behind the state flip
            offset = ready_offset_s(ssh_host.read_text(srv.log_path))
            time.sleep(0.05)
        assert offset is not None, srv.log_tail()
        lag = noticed - (started + offset)
        assert srv.base_url != f"http://127.0.0.1:{params.port}"
    print(f"readiness noticed {lag * 1000:.0f} ms after the server's own 'model loaded' (through SSH)")
    assert -0.05 < lag < 1.0  # benchmarks/bench_host.py holds the 0.5 s target; CI on shared cores gets slack


@pytest.mark.notebook
def test_notebook_02_through_ssh_masks_secrets(sshd: SshdServer, tiny_params: dict[str, Any], write_params,
                                               tmp_path: Path) -> None:
    secret = "s3cr3t-nb-7f1d9c"
    data = ssh_params(tiny_params, sshd, env={"API_TOKEN": secret, "SPECTRIAL_PLAIN": "visible"},
                      arms=[{"name": "baseline"}, {"name": "draft", "method": "draft"}], warmup=0)
    params_file = write_params(data)
    out = tmp_path / "out.ipynb"
    res = subprocess.run([sys.executable, "-m", "papermill", str(REPO / "notebooks" / "02_eagle3.ipynb"), str(out),
                          "-p", "params_file", str(params_file), "-p", "repeats", "2", "--cwd", str(REPO)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    nb = nbformat.read(out, as_version=4)
    text = "\n".join(json.dumps(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code")
    assert sshd.spec in text and "The baseline takes" in text
    run = only_run(Path(tiny_params["output_dir"]))
    m = manifest_json(run)
    assert m["status"] == "ok" and m["host"]["name"] == sshd.spec
    assert m["params"]["env"] == {"API_TOKEN": "***", "SPECTRIAL_PLAIN": "visible"}
    assert all(s["env_check"]["ok"] for s in m["starts"])  # the real value reached the server
    for f in [out, *run.rglob("*")]:
        if f.is_file():
            assert secret not in f.read_text(errors="replace"), f
    assert secret not in res.stdout + res.stderr
