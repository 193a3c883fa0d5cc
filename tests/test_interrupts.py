"""An interrupt always stops the run: Ctrl-C (SIGINT to the terminal's process group) or SIGTERM (timeout, a CI
cancel, a service manager) at random moments of a real `spectrial trial` against llama-server: the command exits
non-zero (130 / 143), its server is stopped, and the record says `failed` and why. A signal that lands after
the trial finished leaves a complete record and exit 0."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spectrial import interrupts
from spectrial.host import LocalHost
from spectrial.server import read_state

SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupts_at_random_moments_always_stop_the_run(sig, tiny_params, write_params, tmp_path):
    rng = random.Random(int(sig))

    def start(i: int) -> tuple[subprocess.Popen, Path]:
        out = tmp_path / f"out{i}"
        path = write_params({**tiny_params, "output_dir": str(out), "repeats": 3}, f"p{i}.yaml")
        # a shell's background job (CI) inherits SIGINT ignored; a terminal's foreground job does not
        return subprocess.Popen([*SPECTRIAL, "trial", str(path), "--quiet"], cwd=REPO, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)), out

    t0 = time.monotonic()  # one whole trial first: the moments are drawn over its length on this machine
    proc, _ = start(99)
    assert proc.wait(300) == 0, proc.stderr.read() if proc.stderr else ""
    whole = time.monotonic() - t0
    outcomes = []
    for i in range(6):
        proc, out = start(i)
        delay = rng.uniform(0.5, whole * 1.1)
        time.sleep(delay)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)  # as a terminal does: the whole foreground process group
        rc = proc.wait(120)
        stderr = proc.stderr.read() if proc.stderr else ""
        runs = [p for p in out.iterdir() if (p / "manifest.json").is_file()] if out.exists() else []
        m = json.loads((runs[0] / "manifest.json").read_text()) if runs else None
        outcomes.append((round(delay, 2), rc, m["status"] if m else None))
        if rc == 0 or (m is not None and m["status"] == "ok"):
            # the signal came after the end, or once the record was whole (closing, printing the table, exiting)
            assert m is not None and m["status"] == "ok" and rc in (0, -sig, 130 if sig == signal.SIGINT else 143)
        elif m is None:  # during start-up (Python's imports, typer's parsing): nothing had started
            assert rc in (-sig, 130 if sig == signal.SIGINT else 143), (round(delay, 2), rc, stderr[-2000:])
        else:  # inside the run: the record says why, the command says it was interrupted
            assert rc == (130 if sig == signal.SIGINT else 143), (rc, stderr[-2000:])
            assert "interrupted by" in stderr, (round(delay, 2), rc, m["status"], stderr[-2000:])
            reason = m["reason"] or ""
            said = "interrupted by Ctrl-C" if sig == signal.SIGINT else "interrupted by SIGTERM"
            assert m["status"] == "failed" and said in reason, reason
        assert not LocalHost().port_holders(tiny_params["port"]), outcomes
        st = read_state(LocalHost(), tiny_params["state_dir"], tiny_params["port"])
        assert st is None or not LocalHost().processes(int(st.pgid or 0)), outcomes
    print(signal.Signals(sig).name, "delay, exit code, record status:", outcomes)
    assert any(st == "failed" for _, _, st in outcomes), "no signal landed inside a run: the test proved nothing"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_launch_is_not_cut_in_half(sig):
    """Inside `deferred()` a signal waits; right after the block it reaches the handler in place before."""
    old = signal.signal(signal.SIGTERM, interrupts.on_sigterm)
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)  # CI may start us with SIGINT ignored
    done = []
    try:
        with pytest.raises(KeyboardInterrupt) as err, interrupts.deferred():
            os.kill(os.getpid(), sig)
            time.sleep(0.05)  # the signal has arrived; the step goes on
            done.append("state written")
        assert done == ["state written"]
        assert isinstance(err.value, interrupts.Terminated) == (sig == signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is interrupts.on_sigterm  # handlers restored
    finally:
        signal.signal(signal.SIGTERM, old)
        signal.signal(signal.SIGINT, old_int)


def test_an_interrupt_in_a_steps_first_write_still_closes_the_step(tmp_path, monkeypatch):
    """The aimed moment of the double Ctrl-C test: the interrupt lands while `step` writes the step's start; the
    step must still end with ok false, its error and its elapsed time (it once stayed open in the record)."""
    from spectrial.records import RunRecord

    rec = RunRecord(tmp_path, "t")
    real = RunRecord.save
    calls = []

    def save(self):
        real(self)
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt("Ctrl-C")

    monkeypatch.setattr(RunRecord, "save", save)
    with pytest.raises(KeyboardInterrupt), rec.step("stop:x"):
        pytest.fail("the body must not run after the interrupt")
    on_disk = json.loads(rec.manifest_path.read_text())["steps"][0]
    assert on_disk["ok"] is False and on_disk["elapsed_s"] is not None and "KeyboardInterrupt" in on_disk["error"]


def test_an_interrupt_before_invoke_starts_the_command_reaches_the_caller(monkeypatch):
    """An interrupt inside invoke before it set the command up is the interrupt, not invoke's AttributeError."""
    from invoke.runners import Runner

    def interrupted(self, command, **kw):
        raise KeyboardInterrupt("Ctrl-C")

    monkeypatch.setattr(Runner, "_run_body", interrupted)
    with pytest.raises(KeyboardInterrupt):
        LocalHost().run("true")
