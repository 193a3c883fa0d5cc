"""NCCL tuning check (issue 10): real spawned workers on the gloo backend (CPU), the run record, the CLI,
NCCL evidence read from NCCL-format log lines through spectrial.logs, and notebook 00 under papermill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
import yaml

from spectrial.errors import ConfigError
from spectrial.nccl import NcclCheckParams, load_nccl_check, load_nccl_params, run_nccl_check
from spectrial.nccl import evidence as ev
from spectrial.nccl import latency as nccl_latency
from spectrial.nccl.check import nccl_effect, parent_env
from spectrial.nccl.params import MULTICAST_OFF
from spectrial.nccl.worker import MARK_PREFIX
from spectrial.readers import nccl as nccl_tables
from spectrial.record.store import manifest_json

REPO = Path(__file__).resolve().parents[2]
SIZES = [8192, 14336]


def _need_torch() -> None:
    """The gloo path spawns real torch workers: without torch it must fail loudly, not skip."""
    try:
        import torch.distributed as dist
    except ImportError as exc:
        pytest.fail(f"torch is needed for the gloo path ({exc}): pip install torch==2.13.0 (CPU build)")
    assert dist.is_gloo_available()


def _tiny(tmp: Path, **kw: object) -> dict:
    base = {"name": "t", "backend": "gloo", "world_size": 2, "sizes_bytes": SIZES, "bandwidth_bytes": 65536,
            "iters": 6, "warmup": 1, "rounds": 1, "timeout_s": 90, "output_dir": str(tmp)}
    return {**base, **kw}


# ---------------------------------------------------------------- parameters
def test_env_set_forms_and_values():
    p = load_nccl_params(data={"backend": "gloo", "env_sets": {
        "default": {}, "tuned": {"NCCL_PROTO": "LL", "NCCL_BUFFSIZE": 16777216},
        "inw": {"how": "in_worker", "NCCL_ALGO": "Ring", "drop_in_rank": {1: ["NCCL_ALGO"]}},
        "explicit": {"env": {"NCCL_ALGO": "Tree"}, "how": "after_init"}}})
    assert p.env_sets["tuned"].env == {"NCCL_PROTO": "LL", "NCCL_BUFFSIZE": "16777216"}
    assert p.env_sets["tuned"].how == "launch"
    assert (p.env_sets["inw"].how, p.env_sets["inw"].drop_in_rank) == ("in_worker", {1: ["NCCL_ALGO"]})
    assert p.env_sets["explicit"].how == "after_init"
    # a dotted override reaches a variable in either form
    q = load_nccl_params(data={"backend": "gloo", "env_sets": {"default": {}, "tuned": {"NCCL_PROTO": "LL"}}},
                         overrides={"env_sets.tuned.NCCL_PROTO": "Simple", "env_sets.tuned.how": "in_worker"})
    assert (q.env_sets["tuned"].env, q.env_sets["tuned"].how) == ({"NCCL_PROTO": "Simple"}, "in_worker")


@pytest.mark.parametrize("data, needle", [
    ({"env_sets": {"x": {"NCCL_PROTO": "LL"}}}, "baseline"),
    ({"env_sets": {"default": {"NCCL_PROTO": "LL", "drop_in_rank": {1: ["NCCL_ALGO"]}}}}, "drop_in_rank"),
    ({"env_sets": {"default": {"hwo": "launch"}}}, "allowed here"),
    ({"sizes_bytes": [8191]}, "sizes_bytes"),
    ({"itres": 3}, "allowed here: backend"),
    ({"env_sets": {"default": {"NCCL_PROTO": True}}}, "NCCL_PROTO"),
    ({"backend": "nccl", "env_sets": {"default": {"NCCL_NVLS_ENABLE": 1}}}, "multicast"),
])
def test_bad_params_name_the_parameter(data, needle):
    with pytest.raises(ConfigError, match=needle):
        load_nccl_params(data=data)


def test_sizes_and_multicast_enforced_on_nccl_only():
    gpu = NcclCheckParams(backend="nccl")
    assert gpu.sizes()[-1] == (64 << 20, "bandwidth") and (14336, "decode") in gpu.sizes()
    assert all(gpu.launch_extras()[k] == v for k, v in MULTICAST_OFF.items())
    assert gpu.launch_extras()["NCCL_DEBUG"] == "INFO"
    cpu = NcclCheckParams(backend="gloo")
    assert cpu.sizes()[-1] == (4 << 20, "bandwidth") and cpu.launch_extras() == {}


def test_multicast_off_is_forced_on_every_nccl_launch(monkeypatch):
    from spectrial.nccl.check import _extras

    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "1")
    p = NcclCheckParams(backend="nccl")
    in_force, added, replaced = _extras(p, p.env_sets["tuned"])
    assert {k: in_force[k] for k in MULTICAST_OFF} == MULTICAST_OFF
    assert replaced == {"NCCL_NVLS_ENABLE": "1"} and "NVSHMEM_DISABLE_NVLS" not in added
    g = NcclCheckParams(backend="gloo")
    assert _extras(g, g.env_sets["tuned"]) == ({}, {}, {})


def test_parent_env_is_restored(monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.delenv("NCCL_PROTO", raising=False)
    with parent_env({"NCCL_PROTO": "LL"}, {"NCCL_ALGO"}):
        assert os.environ["NCCL_PROTO"] == "LL" and "NCCL_ALGO" not in os.environ
    assert os.environ["NCCL_ALGO"] == "Tree" and "NCCL_PROTO" not in os.environ


# ---------------------------------------------------------------- the gloo path end to end
@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """Two sets in real spawned workers: variables on the launch with one planted missing on rank 1, and
    variables assigned inside the workers; NCCL_ALGO=Tree leaks from the parent and must be scrubbed."""
    _need_torch()
    out = tmp_path_factory.mktemp("nccl")
    params = load_nccl_params(data=_tiny(out, baseline="planted", env_sets={
        "planted": {"NCCL_PROTO": "LL", "NCCL_BUFFSIZE": 16777216, "drop_in_rank": {1: ["NCCL_PROTO"]}},
        "inside": {"how": "in_worker", "NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NCCL_ALGO", "Tree")
        mp.delenv("NCCL_PROTO", raising=False)
        result = run_nccl_check(params, progress=False)
        assert os.environ["NCCL_ALGO"] == "Tree" and "NCCL_PROTO" not in os.environ
    return result


def _workers(result, set_name):
    s = next(s for s in manifest_json(result.run_dir)["sets"] if s["name"] == set_name)
    return {w["rank"]: w for w in s["workers"]}, s


def test_planted_missing_variable_is_reported_per_worker(cpu_run):
    workers, s = _workers(cpu_run, "planted")
    assert s["status"] == "ok"
    assert workers[0]["missing"] == [] and workers[0]["seen_in_proc"] == ["NCCL_BUFFSIZE", "NCCL_PROTO"]
    assert workers[1]["missing"] == ["NCCL_PROTO"] and workers[1]["not_in_proc"] == ["NCCL_PROTO"]
    assert workers[1]["values"]["NCCL_PROTO"] == {"requested": "LL", "os_environ": None, "proc": None}
    pids = {w["pid"] for w in workers.values()}
    assert len(pids) == 2 and os.getpid() not in pids
    vis = nccl_tables.visibility_table(cpu_run.manifest)
    row = vis[(vis["set"] == "planted") & (vis["rank"] == 1)].iloc[0]
    assert row["missing"] == "NCCL_PROTO"
    assert f"rank 1 round 0 (pid {workers[1]['pid']}): NCCL_PROTO" in cpu_run.verdict()


def test_in_worker_variables_are_in_os_environ_not_in_proc(cpu_run):
    workers, s = _workers(cpu_run, "inside")
    for w in workers.values():
        assert w["missing"] == [] and w["seen_in_os_environ"] == ["NCCL_ALGO", "NCCL_PROTO"]
        assert w["seen_in_proc"] == [] and w["proc_readable"] is True
        # the parent's NCCL_ALGO=Tree was kept off the launch: /proc shows no NCCL_ALGO at all
        assert w["values"]["NCCL_ALGO"]["proc"] is None
    assert s["removed_from_launch"] == ["NCCL_ALGO"]
    assert s["effect"]["status"].startswith("cannot tell: no NCCL")


def test_record_is_written(cpu_run):
    m = json.loads((cpu_run.run_dir / "manifest.json").read_text())
    assert (m["status"], m["kind"], m["world_size"]) == ("ok", "nccl_check", 2)
    assert sorted(m["files"]) == ["latency.csv", "nccl.log", "summary.csv"]
    assert [s["name"] for s in m["steps"]] == ["set:planted", "set:inside", "compare"]
    lat = pd.read_csv(cpu_run.run_dir / "latency.csv")
    sizes = SIZES + [65536]
    assert len(lat) == 2 * len(sizes) * 2 * 6 and (lat["us"] > 0).all()
    assert set(lat["role"]) == {"decode", "bandwidth"}
    summ = cpu_run.summary()
    assert len(summ) == 2 * len(sizes) and (summ["p50_us"] <= summ["p99_us"]).all()
    # 'max' is the slowest rank of each call
    one = lat[(lat["set"] == "inside") & (lat["size_bytes"] == 8192)]
    slowest = one.groupby("iter")["us"].max().median()
    got = summ[(summ["set"] == "inside") & (summ["size_bytes"] == 8192)]["p50_us"].iloc[0]
    assert got == pytest.approx(slowest)
    cmp = cpu_run.comparisons()
    assert list(cmp["set"].unique()) == ["inside"] and set(cmp["verdict"]) <= {"faster", "slower", "same"}
    log = (cpu_run.run_dir / "nccl.log").read_text()
    assert log.count("===== set ") == 4 and MARK_PREFIX in log
    back = load_nccl_check(cpu_run.run_dir)
    assert back.summary().equals(cpu_run.summary()) and "A/A check" in back.verdict()


def test_a_set_that_times_out_fails_the_record_not_the_caller(tmp_path):
    params = load_nccl_params(data=_tiny(tmp_path, timeout_s=0.3, env_sets={"default": {}}))
    result = run_nccl_check(params, progress=False)
    assert result.status == "failed" and "default" in manifest_json(result.run_dir)["reason"]
    assert "timeout_s=0.3 s passed" in manifest_json(result.run_dir)["sets"][0]["error"]
    assert result.latency.empty


def test_cli_runs_and_reports(tmp_path, write_params):
    _need_torch()
    pf = write_params(_tiny(tmp_path / "out", env_sets={"default": {}}))
    res = subprocess.run([sys.executable, "-m", "spectrial.cli.nccl", str(pf), "-p", "iters=4", "--quiet"],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "run record:" in res.stdout and "status ok" in res.stdout
    run = next((tmp_path / "out").iterdir())
    assert len(pd.read_csv(run / "latency.csv")) == 3 * 2 * 4
    bad = subprocess.run([sys.executable, "-m", "spectrial.cli.nccl", str(pf), "-p", "rounds=0"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 2 and "rounds" in bad.stderr


# ---------------------------------------------------------------- comparisons (pure)
def _lat(rows: list[tuple[int, str, float]], n: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    out = []
    for rnd, name, mu in rows:
        for i in range(n):
            for rank in (0, 1):
                out.append({"round": rnd, "set": name, "group": "default", "size_bytes": 8192, "role": "decode",
                            "rank": rank, "iter": i, "us": mu * (1 + 0.05 * rng.standard_normal())})
    return pd.DataFrame(out)


def test_round_to_round_drift_widens_the_interval():
    # within a round the sets differ by 10 %, but the baseline's two rounds differ by 30 %
    lat = _lat([(0, "default", 100.0), (1, "default", 130.0), (0, "tuned", 110.0), (1, "tuned", 110.0)])
    two = nccl_latency.compare_sets(lat, "default")
    one = nccl_latency.compare_sets(lat.drop(columns="round"), "default")
    assert two["verdict"].iloc[0] == "same"
    assert (two["ci_high"] - two["ci_low"]).iloc[0] > (one["ci_high"] - one["ci_low"]).iloc[0]
    slow = nccl_latency.compare_sets(_lat([(0, "default", 100.0), (1, "default", 101.0), (0, "tuned", 150.0),
                                     (1, "tuned", 152.0)]), "default")
    assert slow["verdict"].iloc[0] == "slower" and slow["ratio"].iloc[0] == pytest.approx(1.5, rel=0.05)


# ---------------------------------------------------------------- NCCL evidence from NCCL-format lines
FIRST = """vm:892:892 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
vm:892:920 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.
vm:892:920 [0] NCCL INFO comm 0x21b71640 rank {rank} nRanks 2 nNodes 1 localRanks 2 localRank {rank} MNNVL 0
vm:892:920 [0] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer
vm:892:920 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM"""
NEW = """vm:892:930 [0] NCCL INFO NCCL_PROTO set by environment to {proto}
vm:892:930 [0] NCCL INFO NCCL_BUFFSIZE set by environment to 16777216.
vm:892:930 [0] NCCL INFO comm 0x31c00000 rank {rank} nRanks 2 nNodes 1 localRanks 2 localRank {rank} MNNVL 0
vm:892:930 [0] NCCL INFO 16 coll channels, 16 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer
vm:892:930 [0] NCCL INFO   Algorithm   |            Tree                  |            Ring                  |
vm:892:930 [0] NCCL INFO   Protocol    |     LL |  LL128 | Simple |     LL |  LL128 | Simple |
vm:892:930 [0] NCCL INFO  Max NThreads |    512 |    640 |    512 |    512 |    640 |    512 |
vm:892:930 [0] NCCL INFO     AllReduce |    0.0/   0.0 |    0.0/   0.0 |    0.0/   0.0 |    8.4/  80.0 |    0.0/   0.0 |    0.0/   0.0 |"""


def _after_init_log(path: Path, rank: int, proto: str) -> Path:
    text = "\n".join([f"{MARK_PREFIX}first_communicator", FIRST.format(rank=rank), f"{MARK_PREFIX}new_group",
                      NEW.format(rank=rank, proto=proto), f"{MARK_PREFIX}measure",
                      "vm:892:892 [0] NCCL INFO AllReduce: 8192 Bytes -> Algo 1 proto 0 time 12.500000", ""])
    path.write_text(text)
    return path


def test_nccl_evidence_per_phase_and_effect(tmp_path):
    pytest.importorskip("spectrial.logs")
    e0 = ev.parse_rank_log(_after_init_log(tmp_path / "r0.log", 0, "LL"))
    e1 = ev.parse_rank_log(_after_init_log(tmp_path / "r1.log", 1, "Simple"))
    assert e0["error"] is None
    # the default group (first communicator) never saw NCCL_PROTO; the new group did
    assert "NCCL_PROTO" not in ev.set_by_environment(e0, ev.target_phases("launch"))
    assert ev.set_by_environment(e0, ev.target_phases("after_init"))["NCCL_PROTO"] == "LL"
    rows = {r["phase"]: r for r in ev.settings_rows("t", 0, e0)}
    assert (rows["first_communicator"]["coll_channels"], rows["new_group"]["coll_channels"]) == (24, 16)
    assert rows["first_communicator"]["transports"] == "P2P/CUMEM"
    assert rows["new_group"]["tuning"] == "AllReduce enabled: Ring/LL"
    assert rows["measure"]["tuning"] == "chosen per call: 8 KB Ring/LL"
    assert rows["first_communicator"]["nccl_version"] == "2.28.9+cuda13.0"
    params = NcclCheckParams(backend="nccl", env_sets={"default": {}, "t": {
        "how": "after_init", "NCCL_PROTO": "LL", "NCCL_BUFFSIZE": "16777216"}})
    nccl = [{"rank": r, "pid": 100 + r, "error": None,
             "set_by_environment": ev.set_by_environment(e, ev.target_phases("after_init"))}
            for r, e in ((0, e0), (1, e1))]
    eff = nccl_effect(params, params.env_sets["t"], nccl)
    assert eff["status"].startswith("not confirmed: rank 1 (pid 101) NCCL_PROTO=Simple (requested LL)")
    assert eff["per_rank"][0]["confirmed"] == ["NCCL_BUFFSIZE", "NCCL_PROTO"]
    eff_ok = nccl_effect(params, params.env_sets["t"], nccl[:1])
    assert eff_ok["status"].startswith("took effect on every rank")


# ---------------------------------------------------------------- GPUs, where there are two
@pytest.mark.gpu
def test_nccl_backend_on_two_gpus(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    params = load_nccl_params(data={**_tiny(tmp_path), "backend": "nccl", "env_sets": {
        "default": {}, "tuned": {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}}})
    result = run_nccl_check(params, progress=False)
    assert result.status == "ok"
    tuned = next(s for s in manifest_json(result.run_dir)["sets"] if s["name"] == "tuned")
    assert tuned["effect"]["status"].startswith("took effect on every rank")
    assert all(w["seen_in_proc"] for w in tuned["workers"])
    assert not nccl_tables.settings_table(result.manifest).empty


# ---------------------------------------------------------------- notebook 00
@pytest.mark.notebook
def test_papermill_notebook_00(tmp_path):
    _need_torch()
    out = tmp_path / "out.ipynb"
    # one set (two workers) keeps it fast; comparisons between sets are covered by `cpu_run`
    overrides = {"rounds": 1, "iters": 6, "warmup": 1, "sizes_bytes": SIZES, "bandwidth_bytes": 65536,
                 "baseline": "planted", "env_sets": {"planted": {"how": "in_worker", "NCCL_PROTO": "LL",
                                                                 "drop_in_rank": {1: ["NCCL_PROTO"]}}}}
    yml = yaml.safe_dump({"params_file": "params/nccl-check-cpu.yaml", "overrides": overrides,
                          "output_dir": str(tmp_path / "runs")})
    res = subprocess.run([sys.executable, "-m", "papermill", str(REPO / "notebooks" / "00_nccl_check.ipynb"),
                          str(out), "-y", yml, "--cwd", str(REPO)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    nb = nbformat.read(out, as_version=4)
    text = "\n".join(json.dumps(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code")
    assert "application/vnd.plotly.v1+json" in text and "Missing variables" in text
    assert "No NCCL output on `gloo`" in text
    run = next(p for p in (tmp_path / "runs").iterdir() if (p / "manifest.json").is_file())
    m = json.loads((run / "manifest.json").read_text())
    assert m["status"] == "ok" and m["notebook"] == "out.ipynb" and (run / "out.ipynb").is_file()
    assert "only one set" in text
    workers = {w["rank"]: w for w in m["sets"][0]["workers"]}
    assert workers[1]["missing"] == ["NCCL_PROTO"] and workers[0]["seen_in_proc"] == []
