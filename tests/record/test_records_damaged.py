"""Damaged run records never crash a reader (issue 37, part 3).

A folder of months of run records holds a broken one sooner or later (a full disk, a copy cut short). Copies of the
committed records under outputs/examples are damaged here the ways that happens (truncated, binary, zero-filled, valid
JSON of another type, a future schema, a missing field, over the size cap, a garbage requests.csv) and every reader is
run on them through the real command line: one record gives `error: <file>: damaged run record: <what>` and a hint,
exit 2, never a traceback; a reader of many records skips the damaged ones, names each with what is wrong, and goes on.
No damaged file is ever rewritten or deleted (every byte of every file of the folder is compared).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from spectrial.errors import RecordDamaged, SpectrialError
from spectrial.record.store import MAX_RECORD_BYTES_ENV, load_record, read_requests, read_table, settle_record

REPO = Path(__file__).resolve().parents[2]
CPU = REPO / "outputs" / "examples" / "local-cpu-demo" / "20261129-152448-02_eagle3-5522"
V1 = REPO / "tests" / "fixtures" / "records" / "v1-h200-8b-nb02.json"
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]


def run_cli(*args: str | Path, env: dict[str, str] | None = None, timeout: int = 300
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPECTRIAL, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


def copy_run(root: Path, name: str, started_at: str | None = None) -> Path:
    """A copy of the committed local CPU trial, as run `name` (started at `started_at`)."""
    run = root / name
    shutil.copytree(CPU, run)
    m = json.loads((run / "manifest.json").read_text())
    m["run_id"] = name
    if started_at is not None:
        m["started_at"] = started_at
    (run / "manifest.json").write_text(json.dumps(m, indent=2) + "\n")
    return run


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file under `folder` and the hash of its bytes."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def pad(raw: bytes) -> bytes:
    return raw.rstrip() + b" " * 300_000 + b"\n"  # valid JSON, only too large (under a cap of 200 kB)


def with_field(raw: bytes, **fields: object) -> bytes:
    return json.dumps({**json.loads(raw), **fields}).encode()


def without(raw: bytes, key: str) -> bytes:
    data = json.loads(raw)
    data.pop(key)
    return json.dumps(data).encode()


# damage -> (how, the problem the error must name, environment)
DAMAGE: dict[str, tuple[Callable[[bytes], bytes], str, dict[str, str]]] = {
    "truncated": (lambda raw: raw[: len(raw) // 2], "truncated: the JSON stops after", {}),
    "binary": (lambda raw: b"\x89PNG\r\n\x1a\n\xff\xfe" + raw[10:], "binary: not UTF-8 text (byte 0x89 at offset 0", {}),
    "zero-filled": (lambda raw: raw[:2000] + b"\x00" * 4096, "binary: a NUL byte at offset 2000", {}),
    "empty": (lambda raw: b"", "empty: 0 bytes and no JSON", {}),
    "a list": (lambda raw: b"[" + raw + b"]", "not a JSON object but a list", {}),
    "a number": (lambda raw: b"42\n", "not a JSON object but a number", {}),
    "future schema": (lambda raw: with_field(raw, schema_version=7, spectrial_version="9.0"),
                      "written in schema version 7 (by spectrial 9.0); this spectrial", {}),
    "no run_id": (lambda raw: without(raw, "run_id"), "missing required field(s): run_id", {}),
    "arms of another type": (lambda raw: with_field(raw, arms="none"), "fields missing or of the wrong type: arms", {}),
    "over the cap": (pad, "too large to be a record file: 3", {MAX_RECORD_BYTES_ENV: "200000"}),
}


def assert_refused(res: subprocess.CompletedProcess[str], path: Path, problem: str) -> None:
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out[-3000:]
    assert res.returncode == 2, (res.returncode, out[-2000:])
    assert f"error: {path}: damaged run record: " in res.stderr, res.stderr[-2000:]
    assert problem in res.stderr, (problem, res.stderr[-2000:])
    assert "hint: " in res.stderr


EVERY_COMMAND = ("truncated", "over the cap")  # the damages every command is shown; the rest go through two doors


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_every_command_refuses_a_damaged_manifest(tmp_path: Path, damage: str) -> None:
    """report, doctor, diff, gate (the damaged record as candidate, and as a --reference file) and migrate each say
    which file and what is wrong, exit 2, and leave the folder as it was: every command for a truncated record and
    one over the size cap; every other damage through `report` (a run folder) and `gate --reference` (a manifest file),
    the two ways a command reaches the one loader (each CLI call costs a Python start: `make test`'s time)."""
    how, problem, env = DAMAGE[damage]
    good = copy_run(tmp_path, "good")
    bad = copy_run(tmp_path, "bad")
    (bad / "manifest.json").write_bytes(how((bad / "manifest.json").read_bytes()))
    before = fingerprint(bad)
    manifest = bad / "manifest.json"
    commands = [["report", bad], ["doctor", bad], ["diff", good, bad], ["gate", bad, "--reference", good],
                ["gate", good, "--reference", manifest], ["migrate", bad]]
    for args in commands if damage in EVERY_COMMAND else [commands[0], commands[4]]:
        assert_refused(run_cli(*args, env=env), manifest, problem)
        assert fingerprint(bad) == before, f"{args[0]} changed the damaged record's folder"


@pytest.mark.parametrize("damage", ["garbage", "binary", "unterminated quote", "no arm column", "cut mid-row"])
def test_report_refuses_a_damaged_requests_csv(tmp_path: Path, damage: str) -> None:
    run = copy_run(tmp_path, "run")
    csv = run / "requests.csv"
    raw = csv.read_bytes()
    csv.write_bytes({"garbage": b"\x01\x02garbage;;;\nnot,a\n" + os.urandom(64).replace(b"\x00", b"x"),
                     "binary": b"\xff\xd8\xff\xe0" + raw,
                     "unterminated quote": raw[:300] + b'"never closed\n' + raw[300:],
                     "no arm column": raw.replace(b"arm,", b"army,", 1),
                     "cut mid-row": raw[: len(raw) // 2] + b'"'}[damage])
    before = fingerprint(run)
    res = run_cli("report", run)
    assert_refused(res, csv, "")
    assert fingerprint(run) == before and not (run / "report.html").exists()


def test_readers_of_many_records_skip_the_damaged_and_name_them(tmp_path: Path) -> None:
    """gate --history and report --output-dir go on past every damaged record, naming each with what is wrong."""
    runs = tmp_path / "runs"
    runs.mkdir()
    copy_run(runs, "a-earlier", "2026-11-29T15:00:00.000+00:00")
    cand = copy_run(runs, "b-candidate", "2026-11-29T16:00:00.000+00:00")
    damaged = {}
    for i, damage in enumerate(("truncated", "binary", "a list", "future schema", "zero-filled")):
        run = copy_run(runs, f"z{i}-{damage.replace(' ', '-')}", "2026-11-29T17:00:00.000+00:00")
        (run / "manifest.json").write_bytes(DAMAGE[damage][0]((run / "manifest.json").read_bytes()))
        damaged[run] = DAMAGE[damage][1]
    before = fingerprint(runs)

    res = run_cli("gate", cand, "--history", "5", "--runs-dir", runs)
    out = res.stdout + res.stderr
    assert "Traceback" not in out and "error:" not in out, out[-3000:]
    assert res.stdout.startswith("gate: ") and "b-candidate against a-earlier" in res.stdout, res.stdout[:500]
    for run, problem in damaged.items():
        assert f"note: skipped damaged record {run}: {problem}" in res.stdout, (run, res.stdout)

    res = run_cli("report", "--output-dir", runs)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    for run, problem in damaged.items():
        assert f"skipped damaged record {run}: {problem}" in res.stderr, (run, res.stderr)
    assert f"report: {cand / 'report.html'}" in res.stdout  # the newest readable record
    after = fingerprint(runs)
    assert {k: v for k, v in after.items() if k.startswith("z")} == {k: v for k, v in before.items()
                                                                     if k.startswith("z")}


def test_migrate_skips_the_damaged_and_keeps_a_copy_of_what_it_replaces(tmp_path: Path) -> None:
    """`spectrial migrate FOLDER`: the old record is rewritten with its original kept, also when a copy by that name
    exists already (an earlier migration's); the damaged record is named, left as it is, and the exit is 2."""
    runs = tmp_path / "runs"
    old = runs / "old"
    old.mkdir(parents=True)
    original = V1.read_bytes()
    (old / "manifest.json").write_bytes(original)
    (old / "manifest.v1.json").write_text('{"an": "earlier copy of another file"}\n')
    bad = copy_run(runs, "bad")
    (bad / "manifest.json").write_bytes(b'{"run_id": "bad", "status": "ok", "arms": [')
    before = fingerprint(bad)
    res = run_cli("migrate", runs)
    assert "Traceback" not in res.stderr and res.returncode == 2, res.stderr[-2000:]
    assert f"error: {bad / 'manifest.json'}: damaged run record: truncated" in res.stderr
    assert "1 damaged record(s) skipped and left as they are; 1 migrated or already current" in res.stderr
    assert f"{old}: schema 1 -> 3" in res.stdout
    assert fingerprint(bad) == before
    assert (old / "manifest.v1.json").read_text() == '{"an": "earlier copy of another file"}\n'
    assert (old / "manifest.v1.1.json").read_bytes() == original  # the file it replaced, byte for byte
    assert load_record(old).schema_version == 3


@pytest.mark.notebook
def test_notebook_04_skips_damaged_records(tmp_path: Path) -> None:
    """`spectrial notebook 04 -p runs_dir=DIR`: the history table of the readable records; each damaged one is named
    (in the terminal and the notebook's problems) and left as it is."""
    runs = tmp_path / "runs"
    runs.mkdir()
    copy_run(runs, "good")
    bad = {}
    for damage in ("truncated", "a list", "future schema"):
        run = copy_run(runs, damage.replace(" ", "-"))
        (run / "manifest.json").write_bytes(DAMAGE[damage][0]((run / "manifest.json").read_bytes()))
        bad[run] = DAMAGE[damage][1]
    before = fingerprint(runs)
    res = run_cli("notebook", "04", "-p", f"runs_dir={runs}", "--output-dir", tmp_path / "out", timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "Traceback" not in out, out[-3000:]
    for run, problem in bad.items():
        assert f"skipped damaged record {run}: {problem}" in out, (run, out[-3000:])
    (executed,) = (tmp_path / "out").rglob("04_history.ipynb")
    outputs = [o for c in json.loads(executed.read_text())["cells"] for o in c.get("outputs", [])]
    printed = "".join("".join(o.get("text", "")) for o in outputs if o.get("name") == "stdout")
    shown = json.dumps(outputs)
    assert "Read **1 run record(s)**" in shown and "**3 problem(s) found:**" in shown
    for run, problem in bad.items():
        assert f"[spectrial] skipped damaged record {run}: {problem}" in printed, printed
    assert fingerprint(runs) == before


# ------------------------------------------------------------------ the loader itself (in-process)
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_load_record_names_each_damage(tmp_path: Path, damage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    how, problem, env = DAMAGE[damage]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    run = copy_run(tmp_path, "r")
    (run / "manifest.json").write_bytes(how((run / "manifest.json").read_bytes()))
    before = fingerprint(run)
    with pytest.raises(RecordDamaged) as exc:
        load_record(run)
    assert exc.value.path == str(run / "manifest.json") and problem in exc.value.problem
    assert fingerprint(run) == before


def test_missing_manifest_and_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(RecordDamaged, match="missing: the folder holds no manifest.json"):
        load_record(tmp_path)
    with pytest.raises(RecordDamaged, match="missing: no such folder"):
        load_record(tmp_path / "nope")
    (tmp_path / "manifest.json").mkdir()
    with pytest.raises(RecordDamaged, match="not a regular file"):
        load_record(tmp_path)


def test_a_pipe_named_manifest_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "manifest.json")
    with pytest.raises(RecordDamaged, match="not a regular file"):
        load_record(tmp_path)


@pytest.mark.parametrize("damage,problem", [
    ("binary", "binary: not UTF-8 text"), ("zeros", "binary: a NUL byte"), ("empty", "empty: 0 bytes"),
    ("quote", "not a readable CSV table"), ("no arm", "no column arm"), ("wide", "a header row of 5001 columns"),
    ("tokens", "rows that are not requests"), ("stream", "stream.csv"),
])
def test_read_requests_names_each_damage(tmp_path: Path, damage: str, problem: str) -> None:
    run = copy_run(tmp_path, "r")
    raw = (run / "requests.csv").read_bytes()
    lines = raw.split(b"\n")
    header = lines[0].split(b",")
    bad = {"binary": b"\xff\xfe" + raw, "zeros": raw[:100] + b"\0" * 100, "empty": b"",
           "quote": raw + b'"x,' + b"y" * 10 + b"\n", "no arm": raw.replace(b"arm", b"arms", 1),
           "wide": b",".join([b"c"] * 5001) + b"\n", "tokens": None, "stream": raw}[damage]
    if damage == "tokens":  # a number column holding words: the rows cannot be requests
        i = header.index(b"tokens")
        row = lines[1].split(b",")
        row[i] = b"many"
        bad = b"\n".join([lines[0], b",".join(row), *lines[2:]])
    if damage == "stream":
        (run / "stream.csv").write_bytes(b"arm,index,event,t_ms,tokens\nbaseline,0,0,soon,1\n")
    (run / "requests.csv").write_bytes(bad)
    before = fingerprint(run)
    with pytest.raises(RecordDamaged) as exc:
        read_requests(run)
    assert problem in str(exc.value), str(exc.value)
    assert fingerprint(run) == before


def test_read_table_caps_its_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gpu.csv"
    path.write_text("a,b\n" + "1,2\n" * 1000)
    assert len(read_table(path)) == 1000
    monkeypatch.setenv(MAX_RECORD_BYTES_ENV, "100")
    with pytest.raises(RecordDamaged, match="too large to be a record file: 4004 bytes, over the cap of 100"):
        read_table(path)
    monkeypatch.setenv(MAX_RECORD_BYTES_ENV, "lots")
    with pytest.raises(SpectrialError, match=MAX_RECORD_BYTES_ENV):
        read_table(path)


def abandoned(run: Path, **fields: object) -> bytes:
    """The run's manifest as a SIGKILLed run leaves it: running, its controller on this host but another boot."""
    m = json.loads((run / "manifest.json").read_text())
    m.update(status="running", finished_at=None, controller={
        "host": socket.gethostname(), "boot_id": "another-boot", "pid": 1, "create_time": 1.0, "command": "x"},
        **fields)
    raw = json.dumps(m).encode()
    (run / "manifest.json").write_bytes(raw)
    return raw


@pytest.mark.parametrize("damage", [{"arms": [{"name": "baseline", "tok_s": "fast"}]}, {"schema_version": 4},
                                    {"starts": {"not": "a list"}}])
def test_settle_never_writes_a_record_it_cannot_parse(tmp_path: Path, damage: dict[str, object]) -> None:
    """An abandoned record (running, its controller gone) is marked failed when read, by load_record and by the
    kill step's settle_record, only when it parses in full; a damaged one is left byte for byte."""
    run = copy_run(tmp_path, "r")
    raw = abandoned(run, **damage)
    assert settle_record(run) is None
    assert (run / "manifest.json").read_bytes() == raw
    with pytest.raises(RecordDamaged):
        load_record(run)
    assert (run / "manifest.json").read_bytes() == raw
    ok = copy_run(tmp_path, "ok")
    abandoned(ok)
    assert load_record(ok).status == "failed"  # the readable one is settled, as before


def test_earlier_and_drift_skip_damaged_records_and_say_which(tmp_path: Path) -> None:
    from spectrial.protocol.drift import check_drift
    from spectrial.protocol.earlier import earlier, find

    runs = tmp_path / "runs"
    runs.mkdir()
    copy_run(runs, "a-earlier", "2026-11-29T15:00:00.000+00:00")
    bad = copy_run(runs, "z-bad", "2026-11-29T15:30:00.000+00:00")
    (bad / "manifest.json").write_bytes(b"[1, 2, 3]")
    now = load_record(copy_run(tmp_path, "now", "2026-11-29T16:00:00.000+00:00"))
    found, skipped = find(runs, now.params, fingerprint_key=now.fingerprint_key, exclude=now.run_id)
    assert [m.run_id for m in found] == ["a-earlier"]
    assert [(s.run, s.error.problem) for s in skipped] == [(bad, "not a JSON object but a list: a manifest is an "
                                                                 "object of named fields")]
    e = earlier(runs, now.params)
    assert e.skipped == 1 and "z-bad/manifest.json: not a JSON object but a list" in e.describe()
    drift = check_drift(now, runs)
    assert drift.checked and "1 damaged record(s) under" in drift.message and "z-bad/manifest.json" in drift.message
    assert (bad / "manifest.json").read_bytes() == b"[1, 2, 3]"


def test_history_reader_lists_damaged_records(tmp_path: Path) -> None:
    from spectrial.readers import history

    runs = tmp_path / "runs"
    runs.mkdir()
    copy_run(runs, "good")
    for damage in ("binary", "a number", "no run_id"):
        run = copy_run(runs, damage.replace(" ", "-"))
        (run / "manifest.json").write_bytes(DAMAGE[damage][0]((run / "manifest.json").read_bytes()))
    h = history.load_history(runs)
    assert set(h.records["run"]) == {"good"}
    assert sorted(s.run.name for s in h.skipped) == ["a-number", "binary", "no-run_id"]
    problems = dict(zip(h.issues["source"], h.issues["problem"], strict=True))
    for damage in ("binary", "a number", "no run_id"):
        assert problems[damage.replace(" ", "-")] == ("manifest.json unreadable, damaged record skipped: "
                                                      + next(s.error.problem for s in h.skipped
                                                             if s.run.name == damage.replace(" ", "-")))
        assert DAMAGE[damage][1] in problems[damage.replace(" ", "-")]


def test_writers_of_a_finished_record_leave_a_damaged_one_alone(tmp_path: Path) -> None:
    """update_manifest (a report or notebook linked into the record) and add_log_to_record (the kill step copying a
    gone run's server log) read the record in full first: a damaged one is RecordDamaged, and nothing is written."""
    from spectrial.record.store import add_log_to_record, update_manifest

    run = copy_run(tmp_path, "r")
    (run / "manifest.json").write_bytes(with_field((run / "manifest.json").read_bytes(), arms={"not": "a list"}))
    before = fingerprint(run)
    with pytest.raises(RecordDamaged, match="fields missing or of the wrong type: arms"):
        update_manifest(run, report="report.html")
    with pytest.raises(RecordDamaged, match="fields missing or of the wrong type: arms"):
        add_log_to_record(run, "logs/gone.log", "the server's last words\n")
    assert fingerprint(run) == before


def test_gate_refuses_a_binary_tolerances_file(tmp_path: Path) -> None:
    good = copy_run(tmp_path, "good")
    tol = tmp_path / "gate.yaml"
    tol.write_bytes(b"figures:\n  accept_len: \xff\xfe\x00\x01\n")
    res = run_cli("gate", good, "--reference", good, "-t", tol)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert f"error: --tolerances: {tol} is not YAML" in res.stderr and "hint: " in res.stderr
