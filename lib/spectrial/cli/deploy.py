"""`spectrial deploy RUN` and `spectrial calibration RUN`: what a sweep says to deploy, and its measured cycle costs
for simulators (mounted by spectrial.cli; imports stay lazy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from spectrial.errors import SpectrialError


def deploy_command(
        run_dir: Annotated[Path, typer.Argument(help="A sweep's run folder, e.g. outputs/<run-id>")],
        as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
        verify_params: Annotated[Path | None, typer.Option(
            "--verify-params", help="Write a trial params file that runs the deployed setting beside the baseline "
                                    "at each load level it rests on (`spectrial trial FILE`).")] = None,
        check: Annotated[Path | None, typer.Option(
            "--check", help="A finished trial of the deployed setting: did its speed-up hold the prediction?")]
        = None) -> None:
    """The configuration to deploy from a sweep over depth x load: per load level the setting that pays (or
    speculation off), as the engine takes it (vLLM's per-batch-size depth table, SGLang's or llama.cpp's flags),
    with the measured speed-up each choice rests on.

    Exit 0: written; 1: --check found that the deployed setting did not hold its predicted speed-up; 2: bad input.
    """
    import yaml

    from spectrial.readers.deploy import check_verification, deployment
    from spectrial.readers.deploy import verify_params as make_verify
    from spectrial.record.store import load_record

    try:
        m = load_record(run_dir)
        if m.kind != "sweep":
            raise SpectrialError(f"{run_dir} is a {m.kind} record, not a sweep's: deploy reads a sweep over depth "
                                 "x load (spectrial sweep PARAMS with grid.steps and grid.concurrency)")
        dep = deployment(m)
        typer.echo(dep.model_dump_json(indent=2) if as_json else dep.text())
        if verify_params is not None:
            verify_params.write_text(yaml.safe_dump(make_verify(m, dep), sort_keys=False))
            typer.echo(f"verify params: {verify_params} (run: spectrial trial {verify_params})")
        if check is not None:
            lines, held = check_verification(dep, load_record(check))
            for line in lines:
                typer.echo(line)
            if not held:
                raise typer.Exit(1)
    except SpectrialError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None


def calibration_command(
        run_dir: Annotated[Path, typer.Argument(help="A sweep's or trial's run folder")],
        out: Annotated[Path | None, typer.Option("--out", help="Write here: .json (the documented object) or .csv "
                                                              "(one row per point); default: JSON on stdout")] = None
        ) -> None:
    """The measured cycle costs for simulators of serving systems: verify time per cycle by depth and batch size,
    draft cost, accept length and per-position acceptance, with the fitted model's predicted-vs-measured residuals
    (docs/FIGURES.md, "Calibration data")."""
    from spectrial.readers.calibration import calibration
    from spectrial.record.store import load_record

    try:
        cal = calibration(load_record(run_dir))
    except SpectrialError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    if out is None:
        typer.echo(cal.model_dump_json(indent=2))
    elif out.suffix == ".csv":
        cal.frame().to_csv(out, index=False)
        typer.echo(f"calibration: {out} ({len(cal.points)} points)")
    else:
        out.write_text(json.dumps(cal.model_dump(mode="json"), indent=2))
        typer.echo(f"calibration: {out} ({len(cal.points)} points)")
