"""`spectrial logs`: read server logs into one table (`parse`) or summarise them (`summary`).

Mounted by the main CLI as ``app.add_typer(logs_app, name="logs")``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer

from spectrial.errors import SpectrialError
from spectrial.logs.api import parse, summary

app = typer.Typer(
    help="Read SGLang, vLLM, llama.cpp, NCCL, nvidia-smi and seed-style profile logs into one table.",
    no_args_is_help=True,
)

Files = Annotated[list[Path], typer.Argument(exists=True, dir_okay=False, readable=True,
                                             help="Log files (plain or .gz).")]
Kinds = Annotated[list[str] | None, typer.Option("--kind", "-k", help="Keep only this kind or engine, e.g. "
                                                 "decode, nccl, llamacpp:request_timing (repeatable).")]
Output = Annotated[Path | None, typer.Option("--output", "-o", help="Write .csv or .parquet (default: CSV on stdout).")]
Workers = Annotated[int | None, typer.Option("--workers", "-j", min=1, help="Processes reading a large plain file at "
                                             "once (default: one per CPU for files of 64 MiB and more; 1: one).")]


def _load(files: list[Path], kinds: list[str] | None, workers: int | None = None) -> pd.DataFrame:
    frames = []
    unparsed = 0
    for f in files:
        df = parse(f, kinds=kinds or None, workers=workers)
        unparsed += df.attrs["unparsed_lines"]
        df.insert(0, "file", str(f))
        frames.append(df)
    out = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    out.attrs["unparsed_lines"] = unparsed
    return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, default=str)
    return v


def _for_output(df: pd.DataFrame, parquet: bool) -> pd.DataFrame:
    """Drop columns no record filled; dicts (and lists, for CSV) become JSON text."""
    keep = [c for c in df.columns if c in ("file", "line", "engine", "kind", "timestamp") or df[c].notna().any()]
    out = df[keep].copy()
    for c in out.columns:
        if out[c].dtype == object:
            vals = out[c].dropna()
            if len(vals) and isinstance(vals.iloc[0], dict) or (not parquet and len(vals)
                                                                and isinstance(vals.iloc[0], (list, tuple))):
                out[c] = out[c].map(_jsonable)
    return out


def _fail(e: SpectrialError) -> None:
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(2)


@app.command("parse")
def parse_cmd(files: Files, kind: Kinds = None, output: Output = None, workers: Workers = None) -> None:
    """One row per record (columns no record filled are left out of the file)."""
    if output is not None and output.suffix.lower() not in (".csv", ".parquet"):
        raise typer.BadParameter(f"{output.name}: use a .csv or .parquet file name", param_hint="--output")
    try:
        df = _load(files, kind, workers)
    except SpectrialError as e:
        _fail(e)
    parquet = output is not None and output.suffix.lower() == ".parquet"
    out = _for_output(df, parquet)
    if output is None:
        typer.echo(out.to_csv(index=False), nl=False)
    elif parquet:
        out.to_parquet(output, index=False)
    else:
        out.to_csv(output, index=False)
    typer.echo(f"{len(df)} records from {len(files)} file(s); {df.attrs['unparsed_lines']} lines not recognised"
               + (f"; written to {output}" if output else ""), err=True)


@app.command("summary")
def summary_cmd(files: Files, kind: Kinds = None, workers: Workers = None) -> None:
    """Per engine and kind (and DP rank): record count and the median of the key metrics."""
    try:
        df = _load(files, kind, workers)
    except SpectrialError as e:
        _fail(e)
    table = summary(df)
    if table.empty:
        typer.echo("no records found")
    else:
        typer.echo(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    typer.echo(f"{len(df)} records; {df.attrs['unparsed_lines']} lines not recognised", err=True)
