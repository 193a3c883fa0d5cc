"""`spectrial watch URL`: the command (mounted by spectrial.cli; imports stay lazy)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from spectrial.errors import RecordWriteError, ServerMisbehaved, SpectrialError
from spectrial.schema import WatchRecord


def watch_command(
        url: Annotated[str, typer.Argument(help="Base URL of a running server, e.g. http://127.0.0.1:8080")],
        interval: Annotated[float, typer.Option(help="Seconds between two /metrics reads.")] = 10.0,
        duration: Annotated[float | None, typer.Option(help="Stop after this many seconds (default: until "
                                                            "Ctrl-C).")] = None,
        output_dir: Annotated[str, typer.Option(help="Folder of run records.")] = "outputs",
        engine: Annotated[str, typer.Option(help="auto (from the metric names), llamacpp, vllm or sglang.")]
        = "auto",
        drive_rate: Annotated[float | None, typer.Option(
            help="Also send the --params workload at this many requests/s (default: off; the server gets only "
                 "what its users send).")] = None,
        params: Annotated[Path | None, typer.Option(help="Params file whose workload --drive-rate sends.")] = None,
        run_id: Annotated[str | None, typer.Option(help="Run id (default: generated).")] = None,
        quiet: Annotated[bool, typer.Option("--quiet", help="No progress output.")] = False) -> None:
    """Watch a server spectrial did not start (never stopped, restarted or signalled): per interval accept length,
    per-position acceptance, drafted/accepted tokens, tok/s, requests running/waiting; changes found with
    ruptures; gaps and restarts recorded. A /metrics read takes at most the interval (a slow or silent one is a gap) and
    at most 32 MiB (a larger one is refused). Exit 0 done (record ok), 1 the record could not be written or the
    server broke the protocol (a /metrics bomb at the first read), 2 bad input
    (the server does not answer, has no /metrics), 130 / 143 / 129 interrupted (the record is written, status
    failed with the reason)."""
    from spectrial import interrupts
    from spectrial.record.store import opened
    from spectrial.watch.record import Watch, WatchOptions

    try:
        opts = WatchOptions(url=url, interval_s=interval, duration_s=duration, output_dir=output_dir, engine=engine,
                            drive_rate=drive_rate, params_file=str(params) if params else None, run_id=run_id)
        w = Watch(opts, progress_on=not quiet, draw=_draw)
        w.check()  # bad input stops here, before a record exists
        with interrupts.interruptible("the record is written; the watched server was not touched"), \
                opened(w.open):
            typer.echo(f"watching {w.opts.url} ({w.engine}) every {interval:g} s; run record: "
                       f"{w.record.manifest_path if w.record else '?'}", err=True)
            record = w.run()
    except (RecordWriteError, ServerMisbehaved) as exc:  # the record, or a server that broke the protocol
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    except SpectrialError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    except ValidationError as exc:  # the options, named by their flags
        flags = {"interval_s": "--interval", "duration_s": "--duration", "drive_rate": "--drive-rate"}
        for e in exc.errors():
            name = str(e["loc"][0]) if e["loc"] else "?"
            typer.secho(f"error: {flags.get(name, name)}: {e['msg']} (got {e.get('input')!r})", fg="red", err=True)
        raise typer.Exit(2) from None
    from spectrial.readers.watch import summary

    typer.echo(summary(record.manifest))
    typer.echo(f"run record: {record.manifest_path}")


def _draw(w: WatchRecord) -> str:
    """The watch's figure as a standalone HTML page (plotly, its JS inlined: the file opens offline)."""
    from spectrial.readers.render.watch import watch_figure

    return watch_figure(w, title=f"watch of {w.url}").to_html(include_plotlyjs=True, full_html=True)
