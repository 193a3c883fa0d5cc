"""The cluster's pure parts: how units are cut, Slurm's time limits and messages, and the pooled speed-up (its
formula checked by hand: inverse-variance weights on the log scale)."""

from __future__ import annotations

import math

import pytest

from spectrial.cluster.fanout import blocks
from spectrial.cluster.merge import pool_speedups, sweep_best
from spectrial.cluster.slurm import SlurmExecutor, parameter_of, scontrol_fields
from spectrial.errors import ConfigError
from spectrial.params import load_params
from spectrial.params.cluster import ClusterParams, time_limit_s
from spectrial.schema import PointRecord, UnitComparison


def test_blocks_spread_round_robin_and_replicate_when_units_outnumber_arms():
    assert blocks(["a", "b", "c"], 2) == [["a", "c"], ["b"]]
    assert blocks(["a", "b"], 2) == [["a"], ["b"]]
    assert blocks(["a"], 3) == [["a"], ["a"], ["a"]]  # replicas, pooled per fingerprint key
    assert blocks([], 2) == []


@pytest.mark.parametrize(("text", "seconds"), [("10", 600), ("1:30", 90), ("01:00:00", 3600), ("1-0", 86400),
                                                ("2-01:02:03", 2 * 86400 + 3723)])
def test_time_limit_reads_as_sbatch_does(text, seconds):
    assert time_limit_s(text) == seconds


def test_bad_cluster_params_name_the_parameter():
    with pytest.raises(ConfigError, match=r"cluster.slurm.time_limit"):
        load_params(data={"model": "m", "cluster": {"executor": "slurm", "slurm": {"time_limit": "soon"}}})
    with pytest.raises(ConfigError, match=r"pool.hosts"):
        load_params(data={"model": "m", "cluster": {"executor": "pool"}})
    with pytest.raises(ConfigError, match=r"cluster.executor"):
        load_params(data={"model": "m", "cluster": {"executor": "k8s"}})
    p = load_params(data={"model": "m", "cluster": {"executor": "slurm", "slurm": {"time_limit": 5}}})
    assert p.cluster is not None and p.cluster.slurm.time_limit_seconds() == 300


def test_slurm_messages_map_to_parameters():
    assert parameter_of("sbatch: error: invalid partition specified: nosuch") == "cluster.slurm.partition"
    assert parameter_of("sbatch: error: Invalid generic resource (gres) specification") == \
        "cluster.slurm.gpus_per_unit"
    assert parameter_of("Requested time limit is invalid (missing or exceeds some limit)") == \
        "cluster.slurm.time_limit"
    f = scontrol_fields("JobId=7 JobName=x JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15 NodeList=vm")
    assert f["JobState"] == "TIMEOUT" and f["ExitCode"] == "0:15" and f["NodeList"] == "vm"


def test_sbatch_options_carry_every_resource():
    c = ClusterParams.model_validate({"executor": "slurm", "slurm": {
        "partition": "gpu", "account": "lab", "time_limit": "00:30:00", "gpus_per_unit": 8, "cpus_per_unit": 16,
        "nodes_per_unit": 2, "mem": "64G", "sbatch_options": ["--exclusive"]}})
    opts = SlurmExecutor(c, env={"PATH": ""}).sbatch_options()
    assert opts[:7] == ["--time", "00:30:00", "--cpus-per-task", "16", "--nodes", "2", "--no-requeue"]
    for pair in (["--partition", "gpu"], ["--account", "lab"], ["--gres", "gpu:8"], ["--mem", "64G"]):
        i = opts.index(pair[0])
        assert opts[i:i + 2] == pair
    assert opts[-1] == "--exclusive" and "--ntasks-per-node" in opts


def test_a_missing_sbatch_is_a_clear_error():
    c = ClusterParams.model_validate({"executor": "slurm"})
    with pytest.raises(ConfigError, match="scontrol is not on PATH"):
        SlurmExecutor(c, env={"PATH": "/nonexistent"}).kill_wait_s()


def _comp(unit, speedup, lo, hi, key="k1", arm="eagle3"):
    return UnitComparison(arm=arm, unit=unit, fingerprint_key=key, status="ok", speedup=speedup,
                          speedup_ci_low=lo, speedup_ci_high=hi)


def test_pooled_speedup_is_the_inverse_variance_mean_on_the_log_scale():
    z = 1.959963984540054
    a, b = _comp("u0", 1.5, 1.3, 1.7), _comp("u1", 1.2, 1.0, 1.44)
    (row,) = pool_speedups([a, b], 0.95)
    se = [(math.log(1.7) - math.log(1.3)) / (2 * z), (math.log(1.44) - math.log(1.0)) / (2 * z)]
    w = [1 / s ** 2 for s in se]
    mean = (w[0] * math.log(1.5) + w[1] * math.log(1.2)) / sum(w)
    assert row.speedup == pytest.approx(math.exp(mean), abs=1e-4)
    assert row.speedup_ci_low == pytest.approx(math.exp(mean - z / math.sqrt(sum(w))), abs=1e-4)
    assert row.speedup_ci_high == pytest.approx(math.exp(mean + z / math.sqrt(sum(w))), abs=1e-4)
    assert row.units == ["u0", "u1"] and row.verdict == "faster" and row.note is None


def test_units_on_different_fingerprints_are_never_pooled():
    rows = pool_speedups([_comp("u0", 1.5, 1.3, 1.7, key="h200"), _comp("u1", 0.9, 0.8, 1.0, key="a100")])
    assert len(rows) == 2
    assert {r.fingerprint_key: r.speedup for r in rows} == {"h200": 1.5, "a100": 0.9}
    assert all("not comparable" in (r.note or "") for r in rows)


def test_failed_arms_are_not_pooled():
    bad = _comp("u1", 3.0, 2.0, 4.0)
    bad.status = "failed"
    (row,) = pool_speedups([_comp("u0", 1.5, 1.3, 1.7), bad])
    assert row.units == ["u0"] and row.speedup == 1.5


def test_sweep_best_per_fingerprint_key_with_runner_up():
    def pt(arm, tok_s, key="k", c=1, method="eagle3"):
        return PointRecord(id=arm, arm=arm, setting=arm, method=method, concurrency=c, status="ok", tok_s=tok_s,
                           fingerprint_key=key, speedup=tok_s / 100, unit="u0")

    rows = sweep_best([pt("baseline", 100, method="none"), pt("s1", 120), pt("s4", 150), pt("s2", 130, key="k2")])
    by_key = {r.fingerprint_key: r for r in rows}
    assert by_key["k"].best == "s4" and by_key["k"].runner_up == "s1" and by_key["k"].ratio_to_runner_up == 1.25
    # across units the speed-up ranks, not tok/s: s6 ran on a faster host (its baseline 300 tok/s), s3 gained more
    fast = pt("s6", 330)
    fast.speedup = 1.1
    slow = pt("s3", 200)
    slow.speedup = 1.6
    (row,) = sweep_best([fast, slow])
    assert row.best == "s3" and row.runner_up == "s6" and row.ratio_to_runner_up == round(1.6 / 1.1, 4)
    assert by_key["k2"].best == "s2" and by_key["k2"].runner_up is None
    assert all("fingerprint keys" in (r.note or "") for r in rows)


def test_a_job_judges_only_its_own_gpus():
    """CUDA_VISIBLE_DEVICES (Slurm's, or env:) narrows the GPU-free check to the run's GPUs: a neighbour's busy GPU
    on a shared node is not ours. The status is nvidia-smi's, parsed (spectrial.hosts.gpu.query) — built here by hand."""
    from spectrial.hosts.gpu import Gpu, GpuApp, GpuStatus, within

    st = GpuStatus(True, [Gpu(0, "H200", "GPU-a", 70000, 143000, 90), Gpu(1, "H200", "GPU-b", 3, 143000, 0)],
                   [GpuApp(4242, 70000, "GPU-a", "python other_job.py")])
    assert st.busy(1024)
    mine = within(st, "1")
    assert [g.index for g in mine.gpus] == [1] and not mine.apps and not mine.busy(1024)
    assert [g.index for g in within(st, "GPU-a").gpus] == [0] and within(st, "GPU-a").busy(1024)
    assert within(st, None) is st and within(st, "7") is st  # renumbered by a device cgroup: judge all it sees


def test_a_cluster_section_can_be_given_on_the_command_line():
    p = load_params("params/local.yaml", {"cluster.executor": "pool", "cluster.pool.hosts": ["local", "ssh:gpu2"]})
    assert p.cluster is not None and p.cluster.executor == "pool" and p.cluster.pool.hosts == ["local", "ssh:gpu2"]
    assert load_params("params/cluster-slurm.yaml").cluster.n_units() == 2
