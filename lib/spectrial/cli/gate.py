"""`spectrial gate CANDIDATE --reference REF | --history N`: exit 0 pass, 1 regression, 2 inconclusive or not
comparable (a tolerances file's `exit_codes` changes them), 2 also for bad input (the message says which)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spectrial.errors import ConfigError, SpectrialError


def gate_command(
        candidate: Annotated[Path, typer.Argument(help="The candidate run: a run folder or its manifest.json.")],
        reference: Annotated[Path | None, typer.Option(
            "--reference", "-r", help="A reference run: a run folder or a (committed) manifest.json.")] = None,
        history: Annotated[int | None, typer.Option(
            "--history", help="Instead of --reference: the last N finished runs of the candidate's fingerprint.")]
        = None,
        runs_dir: Annotated[Path | None, typer.Option(
            "--runs-dir", help="Where --history looks (default: the candidate's parent folder).")] = None,
        tolerances: Annotated[Path | None, typer.Option(
            "--tolerances", "-t", help="Gate file (YAML): per-figure tolerances, arms, allowed differences, exit "
                                       "codes (docs/GATES.md). Default: accept length -5 %, speed-up -5 %, ...")]
        = None,
        junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML here (CI test reports).")] = None,
        markdown: Annotated[Path | None, typer.Option(
            "--markdown", help="Write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY).")] = None,
        as_json: Annotated[Path | None, typer.Option(
            "--json", help="Write the gate record as JSON here ('-': print it instead of the table).")] = None,
        github: Annotated[bool, typer.Option(
            "--github", help="Print GitHub Actions annotations (workflow commands) after the table: the outcome and "
                             "each regression, inconclusive figure and reason the runs are not comparable.")] = False,
        gitlab_codequality: Annotated[Path | None, typer.Option(
            "--gitlab-codequality", help="Write a GitLab code-quality report here (artifacts: reports: "
                                         "codequality).")] = None,
        gitlab_metrics: Annotated[Path | None, typer.Option(
            "--gitlab-metrics", help="Write a GitLab metrics report here (artifacts: reports: metrics; OpenMetrics "
                                     "text).")] = None,
        ) -> None:
    """Gate a run against a reference: per arm and figure pass / regression / improvement / inconclusive, or not
    comparable (with the reason)."""
    from spectrial.gate import load_tolerances, report, run_gate
    from spectrial.gate.report import junit as junit_xml
    from spectrial.gate.report import markdown as md
    from spectrial.gate.report import text, write

    try:
        if github and as_json is not None and str(as_json) == "-":
            raise ConfigError("--github prints GitHub's workflow commands to standard output, where --json - prints "
                              "the record: write the record to a file (--json gate.json)", parameter="--json")
        tol = load_tolerances(tolerances)
        rec = run_gate(candidate, tol, reference=reference, last=history, runs_dir=runs_dir,
                       tolerances_file=str(tolerances) if tolerances else None)
        for path, content in ((junit, lambda: junit_xml(rec)), (markdown, lambda: md(rec)),
                              (as_json if as_json is not None and str(as_json) != "-" else None,
                               lambda: rec.model_dump_json(indent=2) + "\n"),
                              (gitlab_codequality, lambda: report.gitlab_codequality(rec)),
                              (gitlab_metrics, lambda: report.gitlab_metrics(rec))):
            if path is not None:
                write(path, content())
    except (SpectrialError, OSError) as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    if as_json is not None and str(as_json) == "-":
        typer.echo(rec.model_dump_json(indent=2))
    else:
        colour = {"regression": "red", "not comparable": "yellow", "inconclusive": "yellow"}.get(rec.outcome, "green")
        lines = text(rec).splitlines()
        typer.secho(lines[0], fg=colour, bold=True)
        for line in lines[1:]:
            typer.echo(line)
    if github:
        typer.echo(report.github(rec), nl=False)
    raise typer.Exit(rec.exit_code)
