"""`spectrial sweep PARAMS [-p NAME=VALUE]`: the command (mounted by spectrial.cli; imports stay lazy)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spectrial.errors import ConnectionLost, MeasurementRejected, RecordWriteError, SpectrialError
from spectrial.params import parse_overrides


def sweep_command(
        params_file: Annotated[Path, typer.Argument(help="YAML sweep params, e.g. params/sweep-local.yaml")],
        param: Annotated[list[str] | None, typer.Option("-p", "--param", help="Override NAME=VALUE (dotted names, "
                                                                                 "e.g. grid.steps=[1,2,4]).")] = None,
        run_id: Annotated[str | None, typer.Option(help="Run id (default: generated).")] = None,
        output_dir: Annotated[str | None, typer.Option(
            "--output-dir", help="Folder of run records (same as -p output_dir=DIR; default outputs).")] = None,
        quiet: Annotated[bool, typer.Option("--quiet", help="No progress output.")] = False,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan (server starts, time and its "
                                                                "basis) and the launches; touch nothing.")] = False,
        require_complete: Annotated[bool, typer.Option(
            "--require-complete", help="Exit 3 when the budget stopped the sweep (status partial) instead of 0.")
        ] = False,
        resume: Annotated[Path | None, typer.Option(
            "--resume", help="The record of this sweep that its budget stopped (outputs/<run-id>): its measured "
                             "starts are taken over into the new record, only the rest start a server.")
        ] = None) -> None:
    """Sweep speculative settings (grid or model-guided) and write the run record with the best per concurrency.

    Exit 0: the sweep finished (status ok), or its budget (budget_s, budget_restarts) stopped it before its plan
    was done (status partial: the last line, the record's reason and budget.not_measured name every setting it
    did not measure, with its prediction; no best is called "confirmed" while one of them could beat it).
    With --require-complete a partial sweep exits 3. 1: the sweep failed (a setting's start, the baseline, a lost
    connection); 2: bad input; 130 / 143 / 129: interrupted (Ctrl-C, SIGTERM, SIGHUP).
    """
    from spectrial.errors import RunFailed
    from spectrial.interrupts import interruptible
    from spectrial.sweep.params import load_sweep_params
    from spectrial.sweep.run import run_sweep

    try:
        overrides = parse_overrides(param)
        if output_dir is not None:
            overrides["output_dir"] = output_dir
        params = load_sweep_params(params_file, overrides)
        if dry_run:
            from spectrial.protocol.plan import sweep_plan

            taken, earlier_id = 0, None
            if resume is not None:  # what the resume saves: the starts it takes over are not started again
                from spectrial.sweep.resume import load_resumable, measured_starts

                m, _ = load_resumable(resume, params)
                taken, earlier_id = len(measured_starts(m)), m.run_id
                typer.echo(f"resuming {m.run_id} ({m.status}): {taken} of the plan's server starts are taken over "
                           "from its record, not started again; the estimate below counts only the rest")
            typer.echo(sweep_plan(params, taken_over=taken, resumed_from=earlier_id).text())
            return
        if params.trial.cluster is not None:
            if resume is not None:
                from spectrial.errors import ConfigError

                raise ConfigError("--resume: a cluster sweep is not resumed (each unit is its own sweep); "
                                  "drop --resume or the cluster: section")
            from spectrial.cli.cluster import cluster_command

            cluster_command("sweep", params, run_id, quiet, require_complete)
            return
        with interruptible():
            result = run_sweep(params, run_id=run_id, progress=not quiet, resume=resume)
    except RunFailed as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(1) from None
    except (ConnectionLost, MeasurementRejected, RecordWriteError) as exc:  # the sweep had started: record failed
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    except SpectrialError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    from rich.console import Console

    from spectrial.readers.headline import fit_table, paragraph, sweep_headlines
    from spectrial.readers.points import load_short, scenario_label
    from spectrial.sweep.params import Load

    console = Console()
    for h in sweep_headlines(result.manifest):
        h.print(console)
    best = result.best()
    if not best.empty:  # fitted to the terminal: the table, then each row's verdict wrapped between words
        best["load"] = [load_short(Load(r.concurrency, r.offered_rate)) for r in result.manifest.best]
        keep = [c for c in ("scenario", "load", "best", "runner_up", "ratio_to_runner_up") if c in best.columns]
        typer.echo("\nbest per scenario and load level, against the runner-up:")
        table = best[keep].round(3).astype(object).where(best[keep].notna(), None)
        console.print(fit_table(table.rename(columns={"ratio_to_runner_up": "ratio"})))
        for r in result.manifest.best:
            if r.verdict:
                console.print(paragraph(f"• {scenario_label(r.scenario)}, {Load(r.concurrency, r.offered_rate).text()}: "
                                        f"{r.verdict}", indent="  "))
    from spectrial.schema import SweepBudget
    from spectrial.sweep.result import partial_reason

    b = result.manifest.budget or SweepBudget()
    est = b.start_estimate
    typer.echo("")
    m = result.manifest
    taken = sum(1 for x in m.starts if x.replayed_from is not None) if m.resumed_from else 0
    console.print(paragraph(f"{b.restarts} server starts (grid: {b.grid_restarts}"
                            + (f"; {taken} taken over from {m.resumed_from}" if taken else "") + f"), {b.wall_s:.0f} s"
                            + (f"; a start takes ~{est.start_s:.0f} s ({est.how})" if est is not None and est.how
                               else "") + f"; stopped by: {b.stopped_by or 'plan done'}"))
    typer.echo(f"run record: {result.run_dir / 'manifest.json'}")
    partial = partial_reason(result.manifest)
    if partial:
        if console.is_terminal:  # wrapped between words on a terminal; one line (to grep) otherwise
            console.print(paragraph(f"partial: {partial}", style="yellow", indent="  "))
        else:
            typer.secho(f"partial: {partial}", fg="yellow")
        if require_complete:
            raise typer.Exit(3)
