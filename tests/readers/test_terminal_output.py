"""What the CLI prints fits the terminal (issue 36): in a real pty of 80 and of 100 columns (TIOCSWINSZ, no COLUMNS
in the environment, so rich measures the terminal as it does for a user), no arm name, number or interval of the
record is broken mid-word: the real `spectrial report` on committed records (its headline first), and the real
`spectrial trial` of the embedded default (params/local.yaml), whose record carries no validity warning."""

from __future__ import annotations

import fcntl
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from typing import Any

import pytest

from spectrial.readers.headline import Headline, headlines
from spectrial.record.store import load_record

REPO = Path(__file__).resolve().parents[2]
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]
EXAMPLES = REPO / "outputs" / "examples"
RECORDS = [EXAMPLES / "h200-sglang" / "h200-sglang-counting-091935",  # a trial with its environment verified
           EXAMPLES / "h200-sglang" / "h200-sglang-8b-sweep-083946"]  # a sweep: long point names
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_ATOM = re.compile(r"\S*\[[^\[\]\n]*\]\S*|\S+")
_INTERVAL = re.compile(r"\[-?\d[\d.]*, -?\d[\d.]*\]")


def run_in_pty(args: list[str], columns: int, timeout: float = 300) -> tuple[int, str]:
    """Run `args` with stdin, stdout and stderr on a pty of `columns` x 50; its exit status and what it printed
    (escape sequences removed; what a carriage return overwrote, too)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, cwd=REPO, env=env, close_fds=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer closed its end
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        else:
            proc.kill()  # the process this test started, by its pid
    finally:
        os.close(master)
    rc = proc.wait(30)
    text = _ESCAPES.sub("", out.decode(errors="replace")).replace("\r\n", "\n")
    return rc, "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))  # a carriage return overwrites


def expected(h: Headline) -> tuple[set[str], set[str], set[str]]:
    """What the terminal must show unbroken: arm names, intervals, and every word of what `Headline.rich` prints
    (the title and notes, the table, each speculative arm's sentence)."""
    arm_names = {a.arm for a in h.arms}
    shown = [h.title, h.partial, h.decided, h.environment, *(a.sentence() for a in h.arms if not a.baseline)]
    words = {w for line in shown if line for w in _ATOM.findall(line)}
    table = h.table(terminal=True)
    words |= {w for c in table.columns for w in str(c).split()}
    words |= {w for row in table.itertuples(index=False) for v in row if v is not None for w in _ATOM.findall(str(v))}
    intervals = {i for w in words for i in _INTERVAL.findall(w)}
    return arm_names, intervals, {w for w in words if len(w) >= 3} | arm_names | intervals


def _bounded(line: str, start: int, end: int) -> bool:
    return (start == 0 or line[start - 1] == " ") and (end >= len(line) or line[end] == " ")


def broken(lines: list[str], tokens: set[str]) -> list[str]:
    """Each token found split over two consecutive lines: folded in a table column (the pieces at the same left or
    right edge), or wrapped (one piece ends a line, the other starts the next)."""
    out = []
    for l1, l2 in zip(lines, lines[1:], strict=False):
        start2 = len(l2) - len(l2.lstrip())
        for t in tokens:
            for k in range(1, len(t)):
                a, b = t[:k], t[k:]
                if l1.rstrip().endswith(a) and l2[start2:].startswith(b) and _bounded(l1.rstrip(), len(l1.rstrip()) - len(a), len(l1.rstrip())) \
                        and _bounded(l2, start2, start2 + len(b)):
                    out.append(f"{t!r} wrapped: {l1.rstrip()!r} / {l2!r}")
                    continue
                for m in re.finditer(re.escape(a), l1):
                    p, q = m.start(), m.end()
                    if not _bounded(l1, p, q):
                        continue
                    if (l2[p:p + len(b)] == b and _bounded(l2, p, p + len(b))) or (
                            q - len(b) >= 0 and l2[q - len(b):q] == b and _bounded(l2, q - len(b), q)):
                        out.append(f"{t!r} folded: {l1!r} / {l2!r}")
    return out


def assert_unbroken(text: str, heads: list[Headline], columns: int) -> None:
    lines = text.splitlines()
    assert all(len(x) <= columns for x in lines), [x for x in lines if len(x) > columns]
    problems = []
    for h in heads:
        arm_names, intervals, tokens = expected(h)
        problems += [f"arm name {n!r} nowhere whole" for n in arm_names if not any(n in x for x in lines)]
        problems += [f"interval {i!r} nowhere whole" for i in intervals if not any(i in x for x in lines)]
        problems += broken(lines, tokens)
    problems += [f"an interval split over lines: {x!r}" for x in lines if x.count("[") != x.count("]")]
    assert not problems, "\n".join(problems[:20]) + "\n--- what the terminal showed:\n" + text


@pytest.mark.slow  # ~5 s each on 2 cores: the report is written (nbconvert) before the headline is printed
@pytest.mark.parametrize("columns", [80, 100])
@pytest.mark.parametrize("record", RECORDS, ids=[r.name for r in RECORDS])
def test_report_prints_the_headline_unbroken(record: Path, columns: int, tmp_path: Path) -> None:
    run = tmp_path / record.name
    shutil.copytree(record, run)  # `spectrial report` writes report.html beside the record: a copy, not the committed one
    rc, text = run_in_pty([*SPECTRIAL, "report", str(run)], columns)
    assert rc == 0, text
    heads = headlines(load_record(run))
    shown, _, path = text.rpartition("report: ")  # the headline, then the report's path (a path is not wrapped)
    assert heads[0].title.split(":")[0] in shown.replace("\n", " ") and path.strip().endswith("report.html")
    assert_unbroken(shown, heads, columns)
    if "counting" in record.name:  # what the environment check verified, once (issue 36, part 6)
        assert text.count("environment verified: NCCL_* 1 of 1") == 1, text


@pytest.mark.slow
def test_the_embedded_default_runs_without_a_warning_and_fits_80_columns(tmp_path: Path, llama_server: Any,
                                                                        tiny_models: Any) -> None:
    """`spectrial trial` with no file (the embedded default, engine_bin auto): its record carries no validity
    warning on any arm (steady state, warm-up, ... as planned by the params: tests/analysis/test_validity.py), and what it
    prints at 80 columns breaks no name, number or interval."""
    from conftest import free_port

    rc, text = run_in_pty([*SPECTRIAL, "trial", "-p", f"output_dir={tmp_path / 'out'}", "-p", f"port={free_port()}",
                           "-p", f"state_dir={tmp_path / 'state'}", "-p", f"work_dir={tmp_path / 'work'}",
                           "--no-report"], 80, timeout=600)
    assert rc == 0, text
    assert "using the embedded default params/local.yaml" in text.replace("\n", " ")
    (run,) = (tmp_path / "out").iterdir()
    m = load_record(run)
    assert m.params["repeats"] >= m.params.get("validity", {}).get("min_requests", 5)
    for a in m.arms:
        assert a.validity is not None and not a.validity.warnings and not a.validity.failed, (a.name, a.validity)
        assert {c.name: c.ok for c in a.validity.checks}["steady_state"] is True
    heads = headlines(m)
    first = text.index(heads[0].title[:30])  # the headline: from its title to the record's path (not wrapped)
    shown = text[first:].split("\nrun record: ")[0]
    assert "warning" not in shown  # the checks column says ok
    assert_unbroken(shown, heads, 80)
    notice = text[:text.index("params/local.yaml") + 80]  # the notice before the run, wrapped between words
    assert "no params file given: using the embedded default params/local.yaml" in notice
    assert not broken(notice.splitlines(), {"llama.cpp", "spectrial's", "params/local.yaml"})


@pytest.mark.slow
def test_a_partial_sweep_prints_unbroken_at_100_columns(tmp_path: Path, llama_server: Any, tiny_models: Any) -> None:
    """`spectrial sweep` (params/sweep-local.yaml, a grid its restart budget cuts at 3 starts): its headlines, the
    best-per-level table with its verdicts, the summary and the `partial:` line, wrapped between words."""
    from conftest import free_port

    from spectrial.sweep.result import partial_reason

    rc, text = run_in_pty([*SPECTRIAL, "sweep", "params/sweep-local.yaml", "-p", f"output_dir={tmp_path / 'out'}",
                           "-p", f"port={free_port()}", "-p", "strategy=grid", "-p", "budget_restarts=3",
                           "-p", "grid.steps=[1, 2, 3]", "-p", f"state_dir={tmp_path / 'state'}",
                           "-p", f"work_dir={tmp_path / 'work'}"], 100, timeout=600)
    assert rc == 0, text
    (run,) = (tmp_path / "out").iterdir()
    m = load_record(run)
    heads = headlines(m)
    first = text.index(heads[0].title[:30])
    shown = text[first:]
    assert "best per scenario and load level" in shown and "partial: stopped by the restart budget" in shown
    record_line = next(x for x in shown.splitlines() if x.startswith("run record: "))
    assert_unbroken(shown.replace(record_line, ""), heads, 100)
    words = {w for b in m.best for w in _ATOM.findall(b.verdict or "") if len(w) >= 3}
    words |= {w for w in _ATOM.findall(partial_reason(m) or "") if len(w) >= 3}
    assert not broken(shown.splitlines(), words), broken(shown.splitlines(), words)
