"""`spectrial nccl-check PARAMS`: the NCCL tuning check from the shell (the same call notebook 00 makes).

Mounted by `spectrial.cli` as `app.command("nccl-check")(nccl_check_command)`; runs alone as
`python -m spectrial.cli.nccl PARAMS [-p NAME=VALUE ...]`.
Exit codes: 0 every set ran, 1 a set failed (the record says why), 2 bad parameters.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from spectrial.errors import SpectrialError
from spectrial.params import parse_overrides

ParamOpt = Annotated[list[str] | None, typer.Option("-p", "--param",
                                                    help="Override NAME=VALUE (dotted, e.g. rounds=3).")]


def nccl_check_command(
        params_file: Annotated[Path, typer.Argument(help="YAML params, e.g. params/nccl-check-cpu.yaml")],
        param: ParamOpt = None,
        run_id: Annotated[str | None, typer.Option(help="Run id (default: generated).")] = None,
        quiet: Annotated[bool, typer.Option("--quiet", help="No progress lines.")] = False) -> None:
    """NCCL tuning check: per environment set, spawn one worker per GPU (gloo: CPU), record which variables
    each worker sees, what NCCL says it used, and all-reduce latency per message size."""
    import pandas as pd

    from spectrial.nccl import load_nccl_params, run_nccl_check
    from spectrial.readers import nccl as nccl_tables

    try:
        params = load_nccl_params(params_file, parse_overrides(param))
        result = run_nccl_check(params, run_id=run_id, progress=not quiet)
    except SpectrialError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        typer.echo(nccl_tables.visibility_table(result.manifest).to_string(index=False))
        summary = result.summary()
        if not summary.empty:
            cols = ["set", "group", "size", "role", "n", "p50_us", "p90_us", "p99_us"]
            typer.echo(summary[cols].round(1).to_string(index=False))
        settings = nccl_tables.settings_table(result.manifest)
        if not settings.empty:
            typer.echo(settings.drop(columns=["tuning"], errors="ignore").to_string(index=False))
    typer.echo(result.verdict())
    typer.echo(f"run record: {result.run_dir / 'manifest.json'} (status {result.status})")
    if result.status != "ok":
        raise typer.Exit(1)


app = typer.Typer(help="NCCL tuning check.", pretty_exceptions_enable=False, add_completion=False)
app.command("nccl-check")(nccl_check_command)

if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
