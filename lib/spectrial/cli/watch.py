"""`spectrial watch URL`: the command (mounted by spectrial.cli; imports stay lazy)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from spectrial.errors import RecordWriteError, ServerMisbehaved, SpectrialError
from spectrial.schema import WatchRecord


def watch_command(
        url: Annotated[str | None, typer.Argument(
            help="Base URL of a running server, e.g. http://127.0.0.1:8080 (or --prometheus instead)")] = None,
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
        prometheus: Annotated[str | None, typer.Option(
            help="Read the server's history from this Prometheus server (its base URL) instead of watching it live: "
                 "the same counters, intervals, gaps, restarts and changes, in seconds.")] = None,
        selector: Annotated[str | None, typer.Option(
            help='With --prometheus: label matchers that pick the one server, e.g. \'job="vllm",instance="h1:8000"\'.')]
        = None,
        since: Annotated[str | None, typer.Option(
            help="With --prometheus: the range, back from --end (or now): 90s, 15m, 6h, 7d, 2w.")] = None,
        start: Annotated[str | None, typer.Option(
            help="With --prometheus: the range's start (ISO 8601, UTC where no zone is given, or Unix seconds).")]
        = None,
        end: Annotated[str | None, typer.Option(
            help="With --prometheus: the range's end (default: now).")] = None,
        follow: Annotated[bool, typer.Option(
            "--follow", help="With --prometheus: after the range, follow the new samples as they come (for "
                             "--duration, or until Ctrl-C).")] = False,
        push_gateway: Annotated[str | None, typer.Option(
            help="Push the change points to this Prometheus Pushgateway (its base URL) as series, live and at the end "
                 "(job spectrial-watch, run_id); `spectrial dashboard` draws them as annotations.")] = None,
        quiet: Annotated[bool, typer.Option("--quiet", help="No progress output.")] = False) -> None:
    """Watch a server spectrial did not start (never stopped, restarted or signalled): per interval accept length,
    per-position acceptance, drafted/accepted tokens, tok/s, requests running/waiting; changes found with
    ruptures; gaps and restarts recorded. A /metrics read takes at most the interval (a slow or silent one is a gap) and
    at most 32 MiB (a larger one is refused). Exit 0 done (record ok), 1 the record could not be written or the
    server broke the protocol (a /metrics bomb at the first read), 2 bad input
    (the server does not answer, has no /metrics), 130 / 143 / 129 interrupted (the record is written, status
    failed with the reason)."""
    from spectrial import interrupts
    from spectrial.errors import ConfigError
    from spectrial.record.store import opened
    from spectrial.watch.record import HistoryWatch, Watch, WatchOptions

    try:
        rng = _range(url, prometheus, selector, since, start, end, None if follow else duration, drive_rate)
        if follow and not prometheus:
            raise ConfigError("--follow: only with --prometheus (a live watch follows the server itself)",
                              parameter="follow")
        if follow and end:
            raise ConfigError("--follow and --end: a followed range has no end (--duration says how long to follow)",
                              parameter="follow")
        opts = WatchOptions(url=prometheus or url or "", interval_s=interval, duration_s=duration,
                            output_dir=output_dir, engine=engine, drive_rate=drive_rate,
                            params_file=str(params) if params else None, run_id=run_id, selector=selector,
                            start=rng[0] if rng else None, end=rng[1] if rng else None, follow=follow,
                            push_gateway=push_gateway)
        w = (HistoryWatch if prometheus else Watch)(opts, progress_on=not quiet, draw=_draw)
        w.check()  # bad input stops here, before a record exists
        with interrupts.interruptible("the record is written; the watched server was not touched"), \
                opened(w.open):
            what = "reading the history of" if prometheus else "watching"
            typer.echo(f"{what} {w.opts.url} ({w.engine}) every {interval:g} s; run record: "
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


def dashboard_command(
        output: Annotated[str, typer.Option(
            "--output", "-o", help="Where to write the dashboard's JSON ('-': standard output).")] = "-",
        provisioning: Annotated[Path | None, typer.Option(
            help="Also write, into this folder, the dashboard (spectrial-specdec.json) and a Grafana file provider "
                 "(spectrial.yaml) that loads it.")] = None) -> None:
    """The Grafana dashboard for speculative decoding: accept length, acceptance rate, per-position acceptance,
    drafted vs accepted tokens/s, tok/s and requests, for llama.cpp, vLLM and SGLang's own metric names (job and
    instance variables, any Prometheus datasource), with the change points `spectrial watch --push-gateway`
    pushed as annotations. Exit 0 written, 1 a file could not be written."""
    from spectrial.watch.grafana import PROVIDER, UID, dashboard_json

    text = dashboard_json()
    try:
        if provisioning is not None:
            provisioning.mkdir(parents=True, exist_ok=True)
            (provisioning / f"{UID}.json").write_text(text)
            (provisioning / "spectrial.yaml").write_text(PROVIDER.format(path=provisioning.resolve()))
            typer.echo(f"wrote {provisioning / (UID + '.json')} and {provisioning / 'spectrial.yaml'}", err=True)
        if output == "-":
            if provisioning is None:
                typer.echo(text, nl=False)
        else:
            Path(output).write_text(text)
            typer.echo(f"wrote {output}", err=True)
    except OSError as exc:
        typer.secho(f"error: cannot write the dashboard: {exc} (check the folder exists and is writable)", fg="red",
                    err=True)
        raise typer.Exit(1) from None


def _range(url: str | None, prometheus: str | None, selector: str | None, since: str | None, start: str | None,
           end: str | None, duration: float | None, drive_rate: float | None) -> tuple[float, float] | None:
    """The Prometheus range (Unix seconds), None for a live watch; ConfigError naming the flag that does not fit."""
    import time

    from spectrial.errors import ConfigError
    from spectrial.watch.prometheus import parse_duration, parse_time

    if not prometheus:
        extra = [f for f, v in (("--selector", selector), ("--since", since), ("--start", start), ("--end", end)) if v]
        if extra:
            raise ConfigError(f"{extra[0]}: only with --prometheus (a live watch reads the server itself)",
                              parameter=extra[0])
        if not url:
            raise ConfigError("URL: give the server's base URL (e.g. http://127.0.0.1:8080), or --prometheus URL to "
                              "read its history", parameter="url")
        return None
    if url:
        raise ConfigError(f"URL: {url} and --prometheus {prometheus}: give one (--selector picks the server in "
                          "Prometheus)", parameter="url")
    for flag, value in (("--duration", duration), ("--drive-rate", drive_rate)):
        if value is not None:
            raise ConfigError(f"{flag}: not with --prometheus (the history's range is --since or --start/--end; "
                              "--duration goes with --follow)", parameter=flag)
    t_end = parse_time(end, "--end") if end else time.time()
    if since and start:
        raise ConfigError("--since and --start: give one", parameter="since")
    if not since and not start:
        raise ConfigError("--since or --start: the range to read (e.g. --since 7d)", parameter="since")
    t_start = parse_time(start, "--start") if start else t_end - parse_duration(since or "")
    return t_start, t_end


def _draw(w: WatchRecord) -> str:
    """The watch's figure as a standalone HTML page (plotly, its JS inlined: the file opens offline)."""
    from spectrial.readers.render.watch import watch_figure

    return watch_figure(w, title=f"watch of {w.url}").to_html(include_plotlyjs=True, full_html=True)
