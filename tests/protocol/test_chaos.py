"""Chaos: faults delivered for real to `spectrial trial` on real llama.cpp, at aimed moments (the launch window,
mid-benchmark, while comparing, during a stop) and at random ones, to the process and to its process group:
SIGINT, SIGTERM, SIGHUP (also as a real terminal hang-up), SIGKILL. After each: the exit code is the documented
one, the record says failed and why (or, after SIGKILL, is marked abandoned by the next spectrial command), nothing
of the run is left (port, state file, processes), and the next trial on the same port runs ok and leaves nothing of
either run behind (after every SIGKILL, and after each signal and target's last moment: `make test`'s time).
Also: a second trial on a port whose run is alive is refused with that run's id; a full output_dir ends the run
cleanly.

The counts per signal and moment are printed (`pytest -s tests/protocol/test_chaos.py`) for the issue note.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import random
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from spectrial.errors import ResourceBusyError
from spectrial.hosts.local import LocalHost
from spectrial.params import load_params
from spectrial.protocol.trial import Trial, run_trial
from spectrial.record.store import load_record, manifest_json
from spectrial.servers.lifecycle import TAG_VAR, read_state

pytestmark = pytest.mark.slow
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]
REPO = Path(__file__).resolve().parents[2]
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129, signal.SIGKILL: -9}
WORDS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}
TALLY: Counter[tuple[str, str, str]] = Counter()


def _params(tiny_params: dict[str, Any], out: Path, **over: Any) -> dict[str, Any]:
    return {**tiny_params, "output_dir": str(out), "repeats": 2, "max_tokens": 16,
            "arms": [{"name": "baseline"}, {"name": "draft", "method": "draft"}], **over}


def _run_dir(out: Path) -> Path | None:
    runs = [p for p in out.iterdir() if (p / "manifest.json").is_file()] if out.exists() else []
    return runs[0] if runs else None


def _steps(out: Path) -> list[dict[str, Any]]:
    run = _run_dir(out)
    try:
        return json.loads((run / "manifest.json").read_text())["steps"] if run else []
    except (OSError, ValueError):
        return []


def _tagged(run_id: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and str(p.environ().get(TAG_VAR, "")).startswith(run_id + ":"):
                out.append(p)
        except psutil.Error:
            continue
    return out


def moment(name: str, out: Path, state_dir: str, port: int) -> Callable[[], bool]:
    """A condition that becomes true at the aimed moment of the run writing into `out`."""
    state = Path(state_dir) / f"server-{port}.json"

    def launching() -> bool:
        try:
            return json.loads(state.read_text()).get("status") == "launching"
        except (OSError, ValueError):
            return False

    def step(prefix: str, done: bool | None) -> Callable[[], bool]:
        return lambda: any(s["name"].startswith(prefix) and (done is None or (s.get("ok") is not None) == done)
                           for s in _steps(out))

    def spawned() -> bool:  # the launch window proper: the process exists, its pid is not recorded yet
        if not launching():
            return False
        run = _run_dir(out)
        return run is not None and bool(_tagged(run.name))

    return {"launch": launching, "spawned": spawned, "benchmark": step("benchmark:draft", False),
            "stop": step("stop:", None), "compare": step("compare", None)}[name]


def wait(cond: Callable[[], bool], proc: subprocess.Popen[Any] | None, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.002)
    return False


def after(first_out: Path, tiny_params: dict[str, Any], tmp_path: Path, label: str, next_trial: bool = True) -> str:
    """Nothing of the run left (its port free, its state file gone unless SIGKILL left it, no process of it), its
    record not running; with `next_trial`, first the next trial on the same port: ok, and nothing of either left."""
    run1 = _run_dir(first_out)
    port = tiny_params["port"]
    kill = None
    if next_trial:
        nxt = run_trial(load_params(data=_params(tiny_params, tmp_path / f"next-{label}",
                                                 arms=[{"name": "baseline"}], repeats=1)), progress=False)
        assert nxt.manifest.status == "ok", nxt.manifest.reason
        kill = next(s for s in nxt.manifest.steps if s.name == "kill_old_server").report
    assert not LocalHost().port_holders(port)
    assert read_state(LocalHost(), tiny_params["state_dir"], port) is None
    if run1 is None:
        return "no record"
    m1 = load_record(run1)  # a reader settles an abandoned record
    assert m1.status != "running", (label, m1.status)
    assert not _tagged(m1.run_id), [p.cmdline() for p in _tagged(m1.run_id)]
    return f"{m1.status}" + (f"; next kill step: {kill.action}" if kill is not None else "")


def one(sig: signal.Signals, target: str, at: str, tiny_params: dict[str, Any], write_params: Any,
        tmp_path: Path, label: str) -> tuple[int | None, str]:
    out = tmp_path / f"first-{label}"
    path = write_params(_params(tiny_params, out), f"{label}.yaml")
    proc = subprocess.Popen([*SPECTRIAL, "trial", str(path), "--quiet"], cwd=REPO, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    hit = wait(moment(at, out, tiny_params["state_dir"], tiny_params["port"]), proc) if at != "random" else True
    if at == "random":
        time.sleep(random.Random(label).uniform(0.3, 6.0))
    if proc.poll() is None:
        (os.killpg if target == "group" else os.kill)(proc.pid, sig)
    rc = proc.wait(120)
    stderr = proc.stderr.read() if proc.stderr else ""
    run = _run_dir(out)
    m = manifest_json(run) if run else None
    if rc == 0 or m is not None and m["status"] == "ok":  # the signal came after the record was final
        assert rc in (0, CODES[sig], -int(sig)), (label, rc, stderr[-2000:])
        outcome = "finished first"
    elif sig == signal.SIGKILL:
        assert rc == -9, (label, rc, stderr[-2000:])
        outcome = "killed"
    elif rc == -int(sig) and m is None:
        # the signal came while Python was still starting (a loaded machine makes start-up slow): its default
        # action ended the process before spectrial's handlers existed; nothing had started (`after` checks)
        outcome = "killed while starting"
    else:
        assert rc == CODES[sig], (label, rc, stderr[-3000:])
        if m is not None:
            assert m["status"] == "failed" and f"interrupted by {WORDS[sig]}" in (m["reason"] or ""), \
                (label, m["status"], m["reason"])
            ok_arms = [a["name"] for a in m["arms"] if a["status"] == "ok"]
            assert all(f"arm {n}:" not in (m["reason"] or "") for n in ok_arms), m["reason"]  # finished arms keep ok
        outcome = "interrupted"
    # the next trial on the same port after every SIGKILL (it must clear what the killed run left) and after each
    # target's last moment; after a caught signal the run must have left nothing, which `after` checks directly
    settled = after(out, tiny_params, tmp_path, label, next_trial=sig == signal.SIGKILL or at == "random")
    TALLY[(signal.Signals(sig).name, f"{target}@{at}", outcome if hit else outcome + " (moment missed)")] += 1
    return rc, settled


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL],
                         ids=lambda s: signal.Signals(s).name)
def test_faults_at_aimed_and_random_moments(sig, tiny_params, write_params, tmp_path):
    results = []
    for target in ("pid", "group"):
        for at in ("launch", "spawned", "benchmark", "stop", "compare", "random"):
            label = f"{signal.Signals(sig).name}-{target}-{at}"
            results.append((label, *one(sig, target, at, tiny_params, write_params, tmp_path, label)))
    for r in results:
        print(r)
    print(dict(TALLY))


def test_a_terminal_hang_up(tiny_params, write_params, tmp_path):
    """A real pty: the terminal closes mid-benchmark; spectrial gets SIGHUP, stops its server, records why and
    exits 129."""
    out = tmp_path / "tty"
    path = write_params(_params(tiny_params, out, repeats=20, max_tokens=64), "tty.yaml")
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session leader whose controlling terminal is the pty
        os.chdir(REPO)
        os.execv(sys.executable, [*SPECTRIAL, "trial", str(path)])
    screen: list[bytes] = []
    hang_up = threading.Event()

    def read() -> None:  # the terminal shows what it is sent (a full pty would block the writer); it polls, so
        with contextlib.suppress(OSError):  # that no read holds the master open once it is closed
            while not hang_up.is_set():
                if select.select([fd], [], [], 0.05)[0]:
                    screen.append(os.read(fd, 4096))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert wait(lambda: any(s["name"].startswith("benchmark:") for s in _steps(out)), None, 120), \
            b"".join(screen)[-2000:]
    finally:
        hang_up.set()
        reader.join(5)
        os.close(fd)  # the terminal goes away: the kernel sends SIGHUP to the session
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 129
    m = manifest_json(_run_dir(out))
    assert m["status"] == "failed" and "interrupted by SIGHUP" in m["reason"], m["reason"]
    assert not LocalHost().port_holders(tiny_params["port"])
    after(out, tiny_params, tmp_path, "tty")


def test_a_second_run_on_a_live_runs_port_is_refused(tiny_params, write_params, tmp_path):
    """Trial A is measuring; trial B on the same port is refused with A's run id and pid, and A finishes ok."""
    out = tmp_path / "a"
    path = write_params(_params(tiny_params, out, arms=[{"name": "baseline"}], repeats=30, max_tokens=64), "a.yaml")
    proc = subprocess.Popen([*SPECTRIAL, "trial", str(path), "--quiet"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert wait(lambda: any(s["name"].startswith("benchmark:") for s in _steps(out)), proc, 120)
        run_a = _run_dir(out)
        with pytest.raises(ResourceBusyError) as info:
            Trial(load_params(data=_params(tiny_params, tmp_path / "b")), progress=False).kill_old_server()
        msg = str(info.value)
        assert run_a.name in msg and f"pid {proc.pid}" in msg and "still going" in msg, msg
    finally:
        rc = proc.wait(300)
    assert rc == 0, proc.stderr.read() if proc.stderr else ""
    assert manifest_json(run_a)["status"] == "ok"


def test_full_output_dir_ends_the_run_cleanly(tiny_params, write_params, tmp_path):
    """output_dir on a 160 KiB tmpfs fills up mid-run: exit 1 with the folder and its free space named, no
    server left, no temp file, the record as complete as it could be written."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(mnt)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip()})")
    try:
        path = write_params(_params(tiny_params, mnt, repeats=4, max_tokens=64), "full.yaml")
        proc = subprocess.run([*SPECTRIAL, "trial", str(path), "--quiet"], cwd=REPO, capture_output=True,
                              text=True, timeout=300)
        print(proc.stderr[-1500:])
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "cannot write the run record file" in proc.stderr and "MiB free" in proc.stderr, proc.stderr[-2000:]
        assert str(mnt) in proc.stderr
        assert not list(mnt.rglob("*.tmp")), list(mnt.rglob("*.tmp"))
        assert not LocalHost().port_holders(tiny_params["port"])
        run = _run_dir(mnt)
        assert run is not None and json.loads((run / "manifest.json").read_text())["run_id"]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
    after(mnt, tiny_params, tmp_path, "disk")


def test_a_notebook_run_interrupted_stops_its_server_at_once(tiny_params, write_params, tmp_path):
    """`spectrial notebook 02` gets SIGTERM mid-benchmark: it hands Ctrl-C to the kernel, whose trial stops its
    server and records why, then exits 143; nothing is left for the next trial to clean."""
    out = tmp_path / "nb"
    path = write_params(_params(tiny_params, out, repeats=20, max_tokens=64), "nb.yaml")
    proc = subprocess.Popen([*SPECTRIAL, "notebook", "02", "-p", f"params_file={path}", "--output-dir", str(out)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait(lambda: any(s["name"].startswith("benchmark:") for s in _steps(out)), proc, 180), \
            proc.stderr.read() if proc.poll() is not None and proc.stderr else "no benchmark step"
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 143, proc.stderr.read()[-3000:] if proc.stderr else rc
    m = manifest_json(_run_dir(out))
    assert m["status"] == "failed" and "interrupted by Ctrl-C" in m["reason"], m["reason"]
    assert not LocalHost().port_holders(tiny_params["port"])
    assert not _tagged(m["run_id"])
    after(out, tiny_params, tmp_path, "notebook")


def test_sglang_double_killed_mid_benchmark(tmp_path, port, write_params):
    """The SGLang test double (tests/standin: it renames its workers as SGLang does): SIGKILL to spectrial
    mid-benchmark leaves the launcher, scheduler and detokenizer; the next trial stops all of them (by their tag
    and group) and marks the killed run's record abandoned."""
    from test_sglang_standin_trial import standin_params

    data = standin_params(tmp_path, port, repeats=30, max_tokens=64, output_dir=str(tmp_path / "first"))
    path = write_params(data, "sg.yaml")
    proc = subprocess.Popen([*SPECTRIAL, "trial", str(path), "--quiet"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert wait(lambda: any(s["name"].startswith("benchmark:") for s in _steps(tmp_path / "first")), proc, 180)
        run = _run_dir(tmp_path / "first")
        left = _tagged(run.name)
        proc.kill()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert left and all(p.is_running() for p in left), "the double's processes outlive the killed client"
    nxt = run_trial(load_params(data={**data, "output_dir": str(tmp_path / "second"), "repeats": 1}), progress=False)
    assert nxt.manifest.status == "ok", nxt.manifest.reason
    kill = next(s for s in nxt.manifest.steps if s.name == "kill_old_server").report
    assert kill.previous.run_id == run.name and len(kill.stopped) >= 2, kill
    assert not _tagged(run.name) and not LocalHost().port_holders(port)
    m1 = load_record(run)
    assert m1.status == "failed" and m1.reason.startswith("abandoned:"), m1.reason


@pytest.mark.parametrize("at", ["benchmark", "stop"])
def test_a_double_ctrl_c(at, tiny_params, write_params, tmp_path):
    """Ctrl-C twice, 0.2 s apart, mid-benchmark or while the server stops: the stop is not cut in half (the second
    one waits for it: no stale state file, nothing on the port), exit 130, and llama-server, busy with a request,
    is ended by its second SIGTERM instead of waiting out the grace period for SIGKILL."""
    out = tmp_path / f"double-{at}"
    path = write_params(_params(tiny_params, out, repeats=20, max_tokens=64, stop_grace_s=15), f"d-{at}.yaml")
    proc = subprocess.Popen([*SPECTRIAL, "trial", str(path), "--quiet"], cwd=REPO, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert wait(moment(at, out, tiny_params["state_dir"], tiny_params["port"]), proc, 120)
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGINT)
    rc = proc.wait(60)
    assert rc == 130, proc.stderr.read()[-2000:] if proc.stderr else rc
    assert read_state(LocalHost(), tiny_params["state_dir"], tiny_params["port"]) is None
    assert not LocalHost().port_holders(tiny_params["port"])
    m = manifest_json(_run_dir(out))
    stops = [s for s in m["steps"] if s["name"].startswith("stop:")]
    assert stops and all(s.get("elapsed_s") is not None and s["elapsed_s"] < 5 for s in stops), stops
    assert all(s["report"]["how"] == "TERM" for s in stops if s.get("report")), stops
    after(out, tiny_params, tmp_path, f"double-{at}")
