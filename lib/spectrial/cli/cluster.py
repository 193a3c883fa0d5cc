"""`spectrial trial` / `spectrial sweep` with `cluster:` in the params: the units, then the merged summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from spectrial.interrupts import interruptible


def cluster_command(kind: str, params: Any, run_id: str | None, quiet: bool, require_complete: bool = False) -> None:
    """A trial or sweep with `cluster:`: its units in parallel, then the merged record's summary. Exit 0 (ok; a
    sweep: also partial unless --require-complete, then 3), 1 (failed; a trial with arms missing)."""
    from spectrial.cluster.fanout import run_cluster
    from spectrial.readers.cluster import summary_lines

    with interruptible():
        m = run_cluster(kind, params, run_id=run_id, progress=not quiet)  # type: ignore[arg-type]
    for line in summary_lines(m):
        typer.echo(line)
    typer.echo(f"run record: {Path(m.params.output_dir).expanduser().resolve() / m.run_id}"
               "/manifest.json")
    if m.status == "failed" or (m.status == "partial" and kind == "trial"):
        typer.secho(f"{m.kind} {m.status}: {m.reason}", fg="red", err=True)
        raise typer.Exit(1)
    if m.status == "partial":
        typer.secho(f"partial: {m.reason}", fg="yellow")
        if require_complete:
            raise typer.Exit(3)
