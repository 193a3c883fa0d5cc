"""Notebook plumbing: run a notebook into its run record, and the small helpers notebooks call.

`run_notebook("02", {"steps": 2})` executes `notebooks/02_*.ipynb` with papermill, writing the executed
copy into `outputs/<run-id>/` next to the trial's manifest. While it runs it says where it is (spectrial.progress):
in a terminal a bar of cells with the current section, else one line per section; the kernel's own spectrial
lines (a server load's wait, the requests of an arm) are passed through as they come. The kernel talks over the
ipc transport (local Unix sockets), so ipykernel has no "running over TCP without encryption" to warn about.

When a user runs papermill directly (`papermill notebooks/02_eagle3.ipynb outputs/02_eagle3.ipynb -p steps 2`),
the notebook's last cell copies the output notebook (as papermill has saved it so far) into the run record and
notes its path.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from pydantic import JsonValue

from spectrial.errors import ConfigError
from spectrial.ownership import papermill_output_path
from spectrial.params import repo_root
from spectrial.progress import Progress
from spectrial.record.store import load_record, new_run_id, update_manifest
from spectrial.schema import Manifest


def find_notebook(name: str) -> Path:
    """A notebook by path or by number prefix ('02' -> notebooks/02_eagle3.ipynb)."""
    p = Path(name)
    if p.suffix == ".ipynb" and p.is_file():
        return p
    folder = repo_root() / "notebooks"
    hits = sorted(folder.glob(f"{name}*.ipynb"))
    if len(hits) != 1:
        known = ", ".join(x.name for x in sorted(folder.glob("*.ipynb")))
        raise ConfigError(f"notebook {name!r}: {'no' if not hits else 'several'} matches; known: {known}")
    return hits[0]


@dataclass(frozen=True)
class NotebookRun:
    """An executed notebook: its executed copy, and its run record's folder (None where it wrote none)."""

    notebook: Path
    run_dir: Path | None


_HEADING = re.compile(r"^#{1,3}\s+(.+)$", re.MULTILINE)


class _Relay:
    """A file for papermill's `stdout_file` / `stderr_file`: the kernel's spectrial lines ("[spectrial] ...")
    go to the progress display as they arrive; everything else stays in the executed notebook only."""

    def __init__(self, bar: Progress) -> None:
        self.bar, self._rest = bar, ""

    def write(self, text: str) -> int:
        *lines, self._rest = (self._rest + text).split("\n")
        for line in lines:
            if line.startswith("[spectrial"):
                self.bar.write(line)
        return len(text)

    def flush(self) -> None:
        pass


def _engine(bar: Progress, name: str) -> str:
    """Register, for one run, papermill's nbclient engine with a hook that reports each cell as it starts: the bar
    advances, and a markdown heading ("## 3 · The baseline") becomes the current section (a line in line mode).
    Returns the engine's name for `papermill.execute_notebook(engine_name=...)` (papermill's documented way to
    change how cells run: a registered engine)."""
    from papermill.engines import NBClientEngine, papermill_engines

    class SectionEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man: Any, kernel_name: str, **kwargs: Any) -> Any:
            start = nb_man.cell_start
            t0 = time.monotonic()

            def cell_start(cell: Any, cell_index: int | None = None, **kw: Any) -> Any:
                if cell_index:
                    bar.update(1)
                heading = _HEADING.search(cell.source) if cell.cell_type == "markdown" else None
                if heading:
                    section = heading[1].strip()
                    bar.set_postfix_str(section[:50])
                    if bar.mode == "line":
                        bar.write(f"[spectrial] {name}: {section} (cell {(cell_index or 0) + 1}/{len(nb_man.nb.cells)},"
                                  f" {time.monotonic() - t0:.1f} s)")
                return start(cell, cell_index, **kw)

            nb_man.cell_start = cell_start
            return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)

    engine = f"spectrial-{id(bar)}"
    papermill_engines.register(engine, SectionEngine)
    return engine


def run_notebook(name: str, parameters: dict[str, JsonValue] | None = None, *, output_dir: str = "outputs",
                 run_id: str | None = None, kernel_name: str | None = None, progress: bool = True) -> NotebookRun:
    """Execute a notebook with papermill into `output_dir/<run-id>/`, noting the executed copy in its run record
    (the report of that record is a reader's: `spectrial notebook` writes it, `spectrial.readers.render.report`).
    `progress`: the cells and sections as they run, and the kernel's spectrial lines (module docstring)."""
    import nbformat
    import papermill as pm
    from traitlets.config import Config

    nb = find_notebook(name)
    run_id = run_id or new_run_id(nb.stem)
    out_dir = Path(output_dir).expanduser().resolve() / run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    out_nb = out_dir / nb.name
    params = {**(parameters or {}), "run_id": run_id, "output_dir": str(Path(output_dir).expanduser().resolve())}
    error: Exception | None = None
    cells = len(nbformat.read(nb, as_version=4).cells) + 1  # papermill adds its injected-parameters cell
    bar = Progress(f"notebook {nb.stem}", total=cells, unit="cell", enabled=progress)
    bar.write(f"[spectrial] notebook {nb.name}: {cells} cells with papermill -> {out_nb}")
    relay = _Relay(bar)
    try:
        pm.execute_notebook(str(nb), str(out_nb), parameters=params, cwd=str(repo_root()),
                            kernel_name=kernel_name, progress_bar=False, engine_name=_engine(bar, nb.stem),
                            stdout_file=relay, stderr_file=relay,
                            config=Config({"KernelManager": {"transport": "ipc"}}))
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: the kernel's trial stops its servers and says why
        bar.close("interrupted")
        interrupt_kernels(out_dir / "manifest.json")
        raise
    except Exception as exc:  # papermill keeps the partially executed notebook; the record says why
        error = exc
    bar.update(cells - bar.n)
    bar.close("failed" if error is not None else f"{cells} cells executed")
    manifest = out_dir / "manifest.json"
    if manifest.is_file():
        files = load_record(out_dir).files
        update_manifest(out_dir, notebook=out_nb.name, files=[*files, *([out_nb.name] if out_nb.name not in files
                                                                         else [])])
    if error is not None:
        where = (f"executed copy and run record in {out_dir}" if manifest.is_file()
                 else f"executed copy with the error: {out_nb}")
        raise ConfigError(f"notebook {nb.name} failed; {where}\n{error}", parameter="notebook")
    return NotebookRun(out_nb, out_dir if manifest.is_file() else None)


def interrupt_kernels(manifest: Path, timeout_s: float = 60.0) -> list[int]:
    """Send Ctrl-C (SIGINT) to the notebook kernels this process started and wait (up to `timeout_s`) until they
    have handled it: the run record is final, or the kernel has gone. Returns the kernels' pids."""
    import json
    import signal
    import time

    kernels = [p for p in psutil.Process().children(recursive=True)
               if any("ipykernel" in a for a in p.cmdline()[:4])]
    for k in kernels:
        with contextlib.suppress(psutil.Error):
            k.send_signal(signal.SIGINT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(k.is_running() for k in kernels):
        try:
            if json.loads(manifest.read_text()).get("status") not in ("running", "pending"):
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    return [k.pid for k in kernels]


def attach_notebook(run_dir: str | Path) -> str | None:
    """Copy the papermill output notebook (as saved so far) into the run record; returns the file name."""
    out = papermill_output_path()
    run_dir = Path(run_dir)
    if out is None or not out.is_file() or out.parent.resolve() == run_dir.resolve():
        return out.name if out is not None and out.parent.resolve() == run_dir.resolve() else None
    dest = run_dir / out.name
    shutil.copyfile(out, dest)
    files = load_record(run_dir).files
    update_manifest(run_dir, notebook=out.name, notebook_source=str(out),
                    files=[*files, *([out.name] if out.name not in files else [])])
    return out.name


def params_from_notebook(params_file: str, overrides: dict[str, JsonValue] | None = None, **values: Any):  # noqa: ANN201
    """TrialParams from a notebook's parameters cell: non-None values and `overrides` override the file."""
    from spectrial.params import load_params

    merged = {k: v for k, v in values.items() if v is not None}
    merged.update(overrides or {})
    return load_params(params_file, merged)


def steps_table(manifest: Manifest):  # noqa: ANN201
    """The protocol steps of a run as a table (name, ok, seconds, error)."""
    import pandas as pd

    rows = [{"step": s.name, "ok": s.ok, "seconds": s.elapsed_s, "error": s.error} for s in manifest.steps]
    return pd.DataFrame(rows, columns=["step", "ok", "seconds", "error"])


def log_table(manifest: Manifest):  # noqa: ANN201
    """Per server start, the medians spectrial's log parser read from the server's own log."""
    import pandas as pd

    rows = []
    for st in manifest.live_starts():
        for m in (st.log_summary or {}).get("metrics", []):
            rows.append({"arm": st.arm, "start": st.restart + 1, **m,
                         "metric": LOG_NAMES.get(m.get("metric"), m.get("metric"))})
    if not rows:
        return pd.DataFrame(columns=["arm", "start", "engine", "kind", "metric", "n", "median"])
    table = pd.DataFrame(rows).pivot_table(index=["arm", "start"], columns=["kind", "metric"], values="median",
                                           sort=False)
    table.columns = [f"{kind}: {metric}" for kind, metric in table.columns]  # one name per column
    return table


# the log parsers' column names as the record names the same concept (docs/FIGURES.md)
LOG_NAMES = {"accept_rate": "draft_accept_rate"}
