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

from spectrial.host import LocalHost
from spectrial.server import read_state

pytestmark = pytest.mark.slow
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupts_at_random_moments_always_stop_the_run(sig, tiny_params, write_params, tmp_path):
    rng = random.Random(int(sig))
    outcomes = []
    for i in range(6):
        out = tmp_path / f"out{i}"
        path = write_params({**tiny_params, "output_dir": str(out), "repeats": 3}, f"p{i}.yaml")
        proc = subprocess.Popen([*SPECTRIAL, "trial", str(path), "--quiet"], cwd=REPO, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        delay = rng.uniform(0.5, 8.0)
        time.sleep(delay)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)  # as a terminal does: the whole foreground process group
        rc = proc.wait(120)
        stderr = proc.stderr.read() if proc.stderr else ""
        runs = [p for p in out.iterdir() if (p / "manifest.json").is_file()] if out.exists() else []
        m = json.loads((runs[0] / "manifest.json").read_text()) if runs else None
        outcomes.append((round(delay, 2), rc, m["status"] if m else None))
        if rc == 0:  # the signal came after the end
            assert m is not None and m["status"] == "ok"
        else:
            assert rc == (130 if sig == signal.SIGINT else 143), (rc, stderr[-2000:])
            assert "interrupted by" in stderr
            if m is not None:  # a signal before the record existed leaves none; otherwise it says why
                reason = m["reason"] or ""
                assert m["status"] == "failed" and ("KeyboardInterrupt" in reason or "Terminated" in reason), reason
        assert not LocalHost().port_holders(tiny_params["port"]), outcomes
        st = read_state(LocalHost(), tiny_params["state_dir"], tiny_params["port"])
        assert st is None or not LocalHost().processes(int(st["pgid"])), outcomes
    print(signal.Signals(sig).name, "delay, exit code, record status:", outcomes)
    assert any(rc != 0 for _, rc, _ in outcomes), "no signal landed inside a run: the test proved nothing"
