"""Trials fanned out over a pool of hosts without a scheduler (`cluster.executor: pool`): this machine ('local')
and a real sshd on loopback (tests/sshd_plugin.py), each host its own port (`pool.ports`), real llama-server
units. Each unit is a local `spectrial trial` process driving its host, one unit per host at a time: the units
run at once, each on its host with its own baseline; a third unit waits for a free host; the pool's time limit,
a host that cannot be reached and Ctrl-C of the controller each leave the unit records failed and why, the
merged record naming what is missing, and nothing running."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sshd_plugin import SshdServer, free_port
from test_cluster_slurm import leftovers

from spectrial.record.store import load_record
from spectrial.schema import Manifest

pytestmark = [pytest.mark.slow]  # and `ssh` where the test sshd is a host of the pool
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]
REPO = Path(__file__).resolve().parents[2]


def pool_params(tiny_params: dict[str, Any], sshd: SshdServer | None, port2: int, **cluster: Any) -> dict[str, Any]:
    """`tiny_params` over a pool: 'local' (the trial's port) and the test sshd (`port2`), or 'local' alone."""
    hosts, ports = ["local"], [tiny_params["port"]]
    extra: dict[str, Any] = {}
    if sshd is not None:
        hosts.append(sshd.spec)
        ports.append(port2)
        extra["ssh"] = {"key_filename": sshd.key_filename, "known_hosts": sshd.known_hosts}
    return {**tiny_params, **extra,
            "cluster": {"executor": "pool", "units": len(hosts), "max_parallel": len(hosts), **cluster,
                        "pool": {"hosts": hosts, "ports": ports}}}


def start(path: Path, run_id: str) -> subprocess.Popen[str]:
    """The controller, in its own session with Ctrl-C's default action (as a terminal would start it)."""
    return subprocess.Popen([*SPECTRIAL, "trial", str(path), "--run-id", run_id], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def merged(out: Path, run_id: str) -> tuple[Manifest, Path]:
    """The controller's merged record (`--run-id` names its folder)."""
    return load_record(out / run_id, settle=False), out / run_id


def when(stamp: str | None) -> datetime:
    assert stamp, "a unit record without a start or finish time"
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


@pytest.mark.ssh
def test_a_trial_over_a_pool_of_two_hosts_runs_its_units_at_once_each_on_its_host(
        sshd, tiny_params, write_params, tmp_path, port):
    run_id, port2 = f"pool-{os.getpid()}-a", free_port()
    proc = start(write_params(pool_params(tiny_params, sshd, port2)), run_id)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err
    m, run = merged(tmp_path / "outputs", run_id)
    c = m.cluster
    assert m.kind == "cluster-trial" and m.status == "ok" and c is not None and c.executor == "pool"
    assert [u.state for u in c.units] == ["ok", "ok"] and [u.arms for u in c.units] == [["draft"], ["eagle3"]]
    assert [u.host for u in c.units] == ["local", sshd.spec]
    ums = []
    for u in c.units:
        um = load_record(run / "units" / u.run_id)
        ums.append(um)
        assert um.status == "ok" and [a.name for a in um.arms] == ["baseline", *u.arms]  # its own baseline
        assert um.host.name == u.host and um.params["port"] == u.port
        arm = um.arm(u.arms[0])
        assert arm is not None
        (comp,) = [x for x in c.comparisons if x.unit == u.name]
        assert comp.arm == arm.name and comp.host == u.host
        assert (comp.speedup, comp.speedup_ci_low, comp.speedup_ci_high, comp.verdict) == \
            (arm.speedup, arm.speedup_ci_low, arm.speedup_ci_high, arm.verdict)
    assert ums[0].host.name != ums[1].host.name
    assert [u.port for u in c.units] == [port, port2]  # pool.ports: each host its own
    a, b = ums
    assert when(a.started_at) < when(b.finished_at) and when(b.started_at) < when(a.finished_at), \
        "the two units did not run at the same time"
    assert sorted(p.arm for p in c.pooled) == ["draft", "eagle3"] and not c.missing
    for p in c.pooled:  # one unit per arm: its figures as they are
        (comp,) = [x for x in c.comparisons if x.arm == p.arm]
        assert p.units == [comp.unit] and (p.speedup, p.speedup_ci_low, p.verdict) == \
            (comp.speedup, comp.speedup_ci_low, comp.verdict)
    assert not leftovers(run_id)


@pytest.mark.ssh
def test_more_units_than_hosts_wait_for_a_free_host_one_unit_per_host_at_a_time(
        sshd, tiny_params, write_params, tmp_path):
    run_id = f"pool-{os.getpid()}-d"
    proc = start(write_params(pool_params(tiny_params, sshd, free_port(), units=3)), run_id)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err
    m, run = merged(tmp_path / "outputs", run_id)
    c = m.cluster
    assert [u.state for u in c.units] == ["ok"] * 3 and [u.arms for u in c.units] == [["draft"], ["eagle3"], ["draft"]]
    spans: dict[str, list[tuple[datetime, datetime]]] = {}
    for u in c.units:
        um = load_record(run / "units" / u.run_id)
        assert um.host.name == u.host
        spans.setdefault(um.host.name, []).append((when(um.started_at), when(um.finished_at)))
    assert sorted(len(v) for v in spans.values()) == [1, 2], spans  # the third unit took the host freed first
    (first, second) = next(sorted(v) for v in spans.values() if len(v) == 2)
    assert first[1] <= second[0], "two units ran on one host at the same time"
    (draft,) = [p for p in c.pooled if p.arm == "draft"]  # one fingerprint key (one machine): pooled
    assert sorted(draft.units) == ["u0", "u2"] and draft.speedup_ci_low and draft.speedup_ci_high and c.comparable
    # inverse-variance pooling on the log scale: narrower than either unit's own interval
    widths = [math.log(x.speedup_ci_high / x.speedup_ci_low) for x in c.comparisons
              if x.arm == "draft" and x.speedup_ci_low and x.speedup_ci_high]
    assert len(widths) == 2 and math.log(draft.speedup_ci_high / draft.speedup_ci_low) < min(widths)
    assert not leftovers(run_id)


def test_a_unit_over_the_pools_time_limit_is_cancelled_and_its_record_says_why(tiny_params, write_params, tmp_path):
    run_id = f"pool-{os.getpid()}-b"
    # 12 s: the unit has started and written its record (under make test's load its start took over 4 s, seen),
    # and 300 repeats of 48 tokens per arm take far longer
    p = pool_params({**tiny_params, "repeats": 300, "max_tokens": 48}, None, 0, unit_timeout_s=12)
    t0 = time.monotonic()
    proc = start(write_params(p), run_id)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err  # no unit finished: the trial did not answer its question
    m, run = merged(tmp_path / "outputs", run_id)
    (u,) = m.cluster.units
    assert u.state == "cancelled" and "unit_timeout_s" in (u.reason or ""), u
    um = load_record(run / "units" / u.run_id)
    assert um.status == "failed" and "interrupted by SIGTERM" in (um.reason or ""), um.reason
    assert m.status == "failed" and any("draft" in x and "eagle3" in x and "cancelled" in x
                                        for x in m.cluster.missing), m.cluster.missing
    assert time.monotonic() - t0 < 60, "the unit ran on past its time limit"
    assert not leftovers(run_id)


@pytest.mark.ssh
def test_ctrl_c_of_the_controller_cancels_every_pool_unit(sshd, tiny_params, write_params, tmp_path):
    run_id = f"pool-{os.getpid()}-c"
    proc = start(write_params(pool_params({**tiny_params, "repeats": 300, "max_tokens": 48}, sshd, free_port())),
                 run_id)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # both units' servers up (tagged <run-id>-u0:..., <run-id>-u1:...)
        if all(_server_up(run_id, f"u{i}") for i in (0, 1)):
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.3)
    else:
        raise AssertionError(f"the two units' servers did not come up: {leftovers(run_id)}")
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    m, run = merged(tmp_path / "outputs", run_id)
    assert m.status == "failed" and "interrupted by Ctrl-C" in (m.reason or "")
    assert len(m.cluster.units) == 2
    for u in m.cluster.units:
        assert u.state == "cancelled", u
        um = load_record(run / "units" / u.run_id)
        # the unit says it was interrupted; or, cancelled before its handlers existed (a loaded machine starts
        # Python slowly; seen with `make test`'s two lanes) or killed after its grace (seen 2026-12-06: "abandoned:
        # pid N on vm that drove it is gone; cancelled: interrupted by Ctrl-C"), its record says who cancelled it
        # and why: the controller's Ctrl-C
        assert um.status == "failed" and ("interrupted by SIGTERM" in (um.reason or "")
                                          or "cancelled: interrupted by Ctrl-C" in (um.reason or "")), um.reason
    assert not leftovers(run_id)


def test_a_hung_unit_is_killed_after_its_grace_and_the_fan_out_stops_the_server_it_left(tiny_params, write_params,
                                                                                          tmp_path):
    """A unit that does not answer SIGTERM (stopped with SIGSTOP once its server is up: a hung controller) is
    SIGKILLed after its grace, as Slurm does after KillWait; its llama-server, in its own session, would outlive
    it: the fan-out runs the unit's kill step and says so in the unit's reason."""
    import psutil

    run_id = f"pool-{os.getpid()}-h"
    p = pool_params({**tiny_params, "repeats": 300, "max_tokens": 48, "stop_grace_s": 1}, None, 0)
    proc = start(write_params(p), run_id)
    deadline = time.monotonic() + 90
    while not _server_up(run_id, "u0"):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"the unit's server did not come up: {leftovers(run_id)}"
        time.sleep(0.3)
    (unit,) = [c for c in psutil.Process(proc.pid).children() if f"{run_id}-u0" in " ".join(c.cmdline())]
    unit.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert time.monotonic() - t0 >= 16, "SIGKILL came before the grace (stop_grace_s + 15 s) was over"
    m, _ = merged(tmp_path / "outputs", run_id)
    (u,) = m.cluster.units
    assert u.state == "cancelled" and "died by signal 9" in (u.reason or "") and "fan-out stopped" in u.reason, u
    assert not leftovers(run_id)


def _server_up(run_id: str, unit: str) -> bool:
    """A unit's llama-server runs (tagged with the unit's run id)."""
    return any("llama-server" in line for line in leftovers(f"{run_id}-{unit}"))


@pytest.mark.parametrize("on_failure", ["continue", "stop"])
def test_a_host_that_cannot_be_reached_fails_its_unit_and_the_others_go_on_or_stop_as_params_say(
        tiny_params, write_params, tmp_path, on_failure):
    run_id = f"pool-{os.getpid()}-e-{on_failure}"
    dead = f"ssh://root@127.0.0.1:{free_port()}"  # nothing listens there
    repeats = 2 if on_failure == "continue" else 300  # stop: the local unit is still running when it is cancelled
    p = {**tiny_params, "repeats": repeats, "max_tokens": 48, "ssh": {"connect_timeout": 3, "retries": 0},
         "cluster": {"executor": "pool", "units": 2, "max_parallel": 2, "on_unit_failure": on_failure,
                     "pool": {"hosts": ["local", dead]}}}
    proc = start(write_params(p), run_id)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err  # a trial with an arm missing did not answer its question
    m, run = merged(tmp_path / "outputs", run_id)
    local, remote = m.cluster.units
    assert remote.host == dead and remote.state == "failed" and "HostError" in (remote.reason or ""), remote
    assert load_record(run / "units" / remote.run_id).status == "failed"
    assert any(x.startswith("eagle3 (unit u1: failed") and "HostError" in x for x in m.cluster.missing)
    if on_failure == "continue":
        assert local.state == "ok" and m.status == "partial" and [p.arm for p in m.cluster.pooled] == ["draft"]
    else:
        assert local.state == "cancelled" and "on_unit_failure: stop" in (local.reason or ""), local
        um = load_record(run / "units" / local.run_id)
        # the unit says it was interrupted; or, cancelled before its handlers existed (a loaded machine starts
        # Python slowly; seen with `make test`'s two lanes) or killed after its grace (seen 2026-12-06: "abandoned:
        # pid N on vm that drove it is gone; cancelled: interrupted by Ctrl-C"), its record says who cancelled it
        # and why: the controller's Ctrl-C
        assert um.status == "failed" and ("interrupted by SIGTERM" in (um.reason or "")
                                          or "cancelled: interrupted by Ctrl-C" in (um.reason or "")), um.reason
        assert m.status == "failed" and any(x.startswith("draft (unit u0: cancelled") for x in m.cluster.missing)
    assert not leftovers(run_id)


def test_a_decide_run_on_units_decides_each_unit_and_pools_the_replicas(tiny_params, write_params, tmp_path):
    """`decide:` works per unit as on one host (rounds of interleaved starts until the arm's sequence settles);
    one speculative arm on two units is a replica, its two decided speed-ups pooled per fingerprint key."""
    run_id = f"pool-{os.getpid()}-decide"
    data = {**tiny_params, "arms": [{"name": "baseline"}, {"name": "draft", "method": "draft"}],
            "decide": {"min_rounds": 3, "max_rounds": 6}, "repeats": 3,
            "cluster": {"executor": "pool", "units": 2, "max_parallel": 1, "pool": {"hosts": ["local"]}}}
    proc = start(write_params(data), run_id)
    out, err = proc.communicate(timeout=400)
    m, run = merged(tmp_path / "outputs", run_id)
    c = m.cluster
    assert [u.arms for u in c.units] == [["draft"], ["draft"]], c.units
    for u in c.units:
        um = load_record(run / "units" / u.run_id)
        assert um.decide is not None and 3 <= um.decide.rounds <= 6 and um.decide.stopped, um.decide
        print(u.name, um.status, um.decide.rounds, um.decide.stopped)
        assert u.state == ("ok" if um.status == "ok" else "failed")
    (row,) = [p for p in c.pooled if p.arm == "draft"]
    ok = [u.name for u in c.units if u.state == "ok"]
    assert row.units == ok and len(ok) >= 1, (row, out, err)
    if len(ok) == 2:  # both decided: the pooled interval is narrower than either unit's on the log scale
        widths = [math.log(x.speedup_ci_high / x.speedup_ci_low) for x in c.comparisons if x.arm == "draft"]
        assert math.log(row.speedup_ci_high / row.speedup_ci_low) < min(widths)
