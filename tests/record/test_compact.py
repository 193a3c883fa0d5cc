"""Compacted records (issue 41): `spectrial compact` gzips a finished record's server logs and token events in
place, every reader reads them as before, the reads stay bounded (a gzip bomb stops at the cap), and the committed
examples stay compact, so the working tree that every device call carries stays small."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spectrial.errors import RecordDamaged
from spectrial.readers.diagnose import diagnose
from spectrial.record.store import (
    COMPACT_PATTERNS,
    PLOTLYJS_CLASS,
    compact_record,
    list_runs,
    read_record_bytes,
    read_requests,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "outputs" / "examples"
RATE = next((EXAMPLES / "llamacpp-rate-crossover").iterdir())


def _plain(tmp_path: Path) -> Path:
    """A copy of a committed record as spectrial wrote it (inflated)."""
    run = tmp_path / RATE.name
    shutil.copytree(RATE, run)
    for gz in run.rglob("*.gz"):
        gz.with_suffix("").write_bytes(gzip.decompress(gz.read_bytes()))
        gz.unlink()
    m = (run / "manifest.json").read_text().replace('.log.gz"', '.log"').replace('"stream.csv.gz"', '"stream.csv"')
    (run / "manifest.json").write_text(m)
    return run


def test_compact_reads_back_the_same(tmp_path: Path) -> None:
    run = _plain(tmp_path)
    before = read_requests(run)
    logs = {p.name: p.read_bytes() for p in (run / "logs").iterdir()}
    found = diagnose(run).text()
    done = compact_record(run)
    assert sorted(done.files) == sorted([*(f"logs/{n}" for n in logs), "stream.csv"])
    assert done.after < done.before / 5  # text logs and token events compress about tenfold
    assert not (run / "stream.csv").exists() and (run / "stream.csv.gz").is_file()
    after = read_requests(run)
    assert before.keys() == after.keys() and all(a == b for k in before for a, b in zip(before[k], after[k],
                                                                                          strict=True))
    assert sum(map(len, after.values())) > 100 and any(r.events_ms for rs in after.values() for r in rs)
    for name, data in logs.items():  # read through the one capped reader, byte for byte
        assert read_record_bytes(run / "logs" / name) == data
    assert diagnose(run).text().replace(".log.gz", ".log") == found  # the doctor reads the same lines
    files = __import__("json").loads((run / "manifest.json").read_text())["files"]
    assert "stream.csv.gz" in files and all(not f.endswith(".log") for f in files)
    again = compact_record(run)  # a compacted record is left as it is
    assert again.files == [] and (run / "stream.csv.gz").read_bytes() == gzip.compress(
        gzip.decompress((run / "stream.csv.gz").read_bytes()), compresslevel=9, mtime=0)


def test_compact_leaves_plotlyjs_out_of_executed_notebooks(tmp_path: Path) -> None:
    """A notebook executed on a device embeds plotly.js (~4.8 MB) with its first figure; compacting keeps the
    figures (their JSON and their drawing code) and puts a placeholder where plotly.js was."""
    import json

    import nbformat
    import plotly.graph_objects as go

    from spectrial.readers.render.figures import figure_bundle

    run = _plain(tmp_path)
    fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[4, 5, 6]))
    first, second = figure_bundle(fig, "f1", plotlyjs=True), figure_bundle(fig, "f2")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("show()", outputs=[
        nbformat.v4.new_output("display_data", data=b) for b in (first, second)])])
    nbformat.write(nb, run / "02_eagle3.ipynb")
    size = (run / "02_eagle3.ipynb").stat().st_size
    assert size > 3_000_000
    done = compact_record(run)
    assert "02_eagle3.ipynb (plotly.js left out)" in done.files
    after = nbformat.read(run / "02_eagle3.ipynb", as_version=4)  # still a valid notebook
    (o1, o2) = after.cells[0].outputs
    html = "".join(o1.data["text/html"])
    assert (run / "02_eagle3.ipynb").stat().st_size < size / 20 and "plotly.js left out by spectrial compact" in html
    assert html.count(f'class="{PLOTLYJS_CLASS}"') == 1 and html.endswith(first["text/html"].split("</script>\n", 1)[1])
    assert json.loads(json.dumps(o1.data["application/vnd.plotly.v1+json"])) == first["application/vnd.plotly.v1+json"]
    assert o2.data == second  # a figure without plotly.js is untouched
    assert compact_record(run).files == []  # and a compacted notebook is left as it is
    (run / "broken.ipynb").write_text('{"cells": [ <script class="spectrial-plotlyjs">')  # cut short: left alone
    assert compact_record(run).files == [] and (run / "broken.ipynb").read_text().endswith("spectrial-plotlyjs\">")


def test_compact_refuses_a_running_record(tmp_path: Path) -> None:
    run = _plain(tmp_path)
    m = (run / "manifest.json").read_text().replace('"status": "ok"', '"status": "running"', 1)
    (run / "manifest.json").write_text(m)
    with pytest.raises(Exception, match="running; compact it once its run has finished"):
        compact_record(run)
    assert (run / "stream.csv").is_file()


def test_a_gzip_bomb_stops_at_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECTRIAL_MAX_RECORD_BYTES", str(1 << 20))
    (tmp_path / "stream.csv.gz").write_bytes(gzip.compress(b"0" * (64 << 20)))  # 64 KiB that inflate to 64 MiB
    with pytest.raises(RecordDamaged, match="inflates to more than the cap of 1048576 bytes"):
        read_record_bytes(tmp_path / "stream.csv")
    (tmp_path / "x.log.gz").write_bytes(gzip.compress(b"line\n" * 1000)[:-12])
    with pytest.raises(RecordDamaged, match="cut short|not a readable gzip"):
        read_record_bytes(tmp_path / "x.log")


def test_the_cli_compacts_a_folder_of_records(tmp_path: Path) -> None:
    run = _plain(tmp_path / "runs")
    res = subprocess.run([sys.executable, "-m", "spectrial.cli", "compact", str(tmp_path / "runs")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"{run}: 4 file(s) compacted" in res.stdout and "1 record(s):" in res.stdout
    res = subprocess.run([sys.executable, "-m", "spectrial.cli", "compact", str(tmp_path / "nothing")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "no run record under" in res.stderr


def test_committed_examples_are_compact() -> None:
    """Every committed record carries its logs and token events gzipped (`spectrial compact outputs/examples`):
    the working tree travels with every device call, whose payload must stay under 48 MiB."""
    loose = [p.relative_to(REPO).as_posix() for run in list_runs(EXAMPLES) for pat in COMPACT_PATTERNS
             for p in run.glob(pat) if p.is_file()]
    assert not loose, f"run `spectrial compact outputs/examples` before committing: {loose[:5]}"
    heavy = [p.relative_to(REPO).as_posix() for p in EXAMPLES.rglob("*.ipynb") if p.stat().st_size > 2_000_000]
    assert not heavy, f"notebooks with plotly.js embedded: run `spectrial compact outputs/examples`: {heavy}"
