"""`spectrial diff`: comparability and the change are two statements; the change compares like with like (each
arm's speed-up against its own run's baseline, with intervals), raw tok/s below with the baseline's own move;
defaults an older schema did not write are no difference; model files are paired by name and an unrecorded
identity is "not recorded".

Run B is the committed CPU demo record (a real llama-server trial, written by an older spectrial) copied, with
the figures named in each test changed by hand: the two real runs a user diffs are not committed, the change is.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spectrial.params import TrialParams
from spectrial.readers.diff import diff_runs, format_findings

REPO = Path(__file__).resolve().parents[2]
CPU = REPO / "outputs" / "examples" / "local-cpu-demo" / "20261129-152448-02_eagle3-5522"


def copy_run(tmp: Path, name: str, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    run = tmp / name
    shutil.copytree(CPU, run)
    m = json.loads((run / "manifest.json").read_text())
    m["run_id"] = name
    if edit is not None:
        edit(m)
    (run / "manifest.json").write_text(json.dumps(m))
    return run


def arm(m: dict[str, Any], name: str) -> dict[str, Any]:
    return next(a for a in m["arms"] if a["name"] == name)


def scale(a: dict[str, Any], keys: tuple[str, ...], f: float) -> None:
    for k in keys:
        if isinstance(a.get(k), list):
            a[k] = [v * f for v in a[k]]
        elif a.get(k) is not None:
            a[k] *= f


TOK = ("tok_s", "tok_s_values", "tok_s_ci_low", "tok_s_ci_high")
SPEEDUP = ("speedup", "speedup_ci_low", "speedup_ci_high")


def test_a_measured_change_is_said_apart_from_comparability(tmp_path: Path) -> None:
    """The same setup, draft-simple 20.5 % slower (its baseline unchanged): comparable, and the change is stated
    as measured (the speed-up intervals [1.11, 1.20] and [0.88, 0.95] are apart), not hidden under
    'no recorded difference'."""
    a = copy_run(tmp_path, "a")

    def slower(m: dict[str, Any]) -> None:
        x = arm(m, "draft-simple")
        scale(x, TOK + SPEEDUP, 0.795)
        x["verdict"] = "slower"

    r = diff_runs(a, copy_run(tmp_path, "b", slower))
    lines = format_findings(r).splitlines()
    assert lines[0] == "comparability: comparable: no recorded difference in machine, model, engine build, " \
        "workload or launch"
    assert lines[1] == ("change: draft-simple: speed-up against its own run's baseline 1.16x [1.11, 1.20] -> "
                        "0.92x [0.88, 0.95] (-20.5 %; intervals do not overlap: a measured change)"), lines[1]
    raw = next(x for x in lines if x.startswith("[results] arm draft-simple: 236.51 -> 188.03 tok/s"))
    assert "(-20.5 %; intervals do not overlap); its run's baseline moved 204.40 -> 204.40 tok/s (+0.0 %)" in raw


def test_the_headline_compares_like_with_like(tmp_path: Path) -> None:
    """A faster machine state: every arm and its baseline 50 % faster, speed-ups unchanged. Raw tok/s moved by
    half; the draft did not: the headline is the speed-up (no change), the raw lines show the baseline's move."""
    def faster(m: dict[str, Any]) -> None:
        for x in m["arms"]:
            scale(x, TOK, 1.5)

    r = diff_runs(copy_run(tmp_path, "a"), copy_run(tmp_path, "b", faster))
    assert r.headline is not None and r.headline.what == "speed-up" and abs(r.headline.rel) < 1e-9
    text = format_findings(r)
    assert "(+0.0 %; intervals overlap: within the noise)" in text.splitlines()[1]
    assert "[results] arm eagle3-synthetic: 179.43 -> 269.14 tok/s (+50.0 %; intervals do not overlap); its run's " \
           "baseline moved 204.40 -> 306.61 tok/s (+50.0 %)" in text


def test_defaults_an_older_schema_did_not_write_are_not_added(tmp_path: Path) -> None:
    """The CPU demo record predates sampling, validity, request_format, workload...: against the same params as
    today's spectrial writes them (every default filled), no parameter is "added"."""
    def today(m: dict[str, Any]) -> None:
        m["params"] = TrialParams.model_validate(m["params"]).model_dump(mode="json")

    b = copy_run(tmp_path, "b", today)
    written = json.loads((b / "manifest.json").read_text())["params"]
    assert {"sampling", "validity", "request_format", "workload"} <= set(written)  # what the old record lacks
    text = format_findings(diff_runs(copy_run(tmp_path, "a"), b))
    assert "[params]" not in text and "added" not in text, text
    assert text.splitlines()[0].startswith("comparability: comparable")


def test_model_files_paired_by_name_and_unrecorded_identity(tmp_path: Path) -> None:
    """The model set rebuilt in another folder (same files): no model line and still comparable; a file whose
    identity one run did not record is 'not recorded', never 'changed or absent'."""
    def moved(m: dict[str, Any]) -> None:
        for f in m["models"]:
            f["path"] = f["path"].replace("tiny-1-", "tiny-9-")

    def unrecorded(m: dict[str, Any]) -> None:
        moved(m)
        m["models"][0]["head_tail_sha256"] = None

    a = copy_run(tmp_path, "a")
    text = format_findings(diff_runs(a, copy_run(tmp_path, "b", moved)))
    assert "model file" not in text and text.splitlines()[0].startswith("comparability: comparable: no "), text
    text = format_findings(diff_runs(a, copy_run(tmp_path, "c", unrecorded)))
    lines = [x for x in text.splitlines() if "model file" in x]
    assert lines == ["[engine/model] model file target.gguf (/root/.cache/spectrial/models/tiny-1-4378f0821286/"
                     "target.gguf -> /root/.cache/spectrial/models/tiny-9-4378f0821286/target.gguf): identity not "
                     "recorded in run B"], lines
    assert "changed or absent" not in text


def test_cli_prints_comparability_then_the_change(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "spectrial.cli", "diff", str(CPU), str(copy_run(tmp_path, "b"))],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("comparability: comparable") and lines[1].startswith("change: draft-simple: speed-up")
    assert "(+0.0 %; intervals overlap: within the noise)" in lines[1]
