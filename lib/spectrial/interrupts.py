"""Interrupts: SIGTERM and SIGHUP handled as Ctrl-C is, and the few steps that must not be cut in half.

A server launch is one such step: between the spawn and the state file that names its process group, an
interrupt would leave a server nobody knows about. `deferred()` holds SIGINT and SIGTERM for the length of such
a step and delivers the first one caught right after it, to the handler that was in place before.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM (timeout, a CI cancel, a service manager): handled as Ctrl-C is, wherever the run is."""


class HungUp(Terminated):
    """SIGHUP (the terminal closed, the SSH session dropped): handled as Ctrl-C is, wherever the run is."""


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated("SIGTERM")


def on_sighup(signum: int, frame: FrameType | None) -> None:
    raise HungUp("SIGHUP")


EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129}


_STOPPING: list[str] = []  # the interrupt being handled (the first one); later ones wait for its cleanup
_COMMAND: list[bool] = []  # set once this process is the `spectrial` command (`as_command`), not a library user


def as_command() -> None:
    """This process is the `spectrial` command: a signal outside a run exits at once (`install_exit`), and stays so
    after each run. A program that imports spectrial (a notebook, a test) keeps its own handlers around runs."""
    if not _COMMAND:
        _COMMAND.append(True)
    install_exit()


def _once(exc: type[KeyboardInterrupt], what: str) -> Callable[[int, FrameType | None], None]:
    """A handler that raises `exc` the first time; while that interrupt's cleanup runs (servers stopping, the
    record being written), a second signal only says so: a double Ctrl-C must not cut the cleanup in half."""
    def handler(signum: int, frame: FrameType | None) -> None:
        if _STOPPING:
            with contextlib.suppress(OSError, ValueError):
                print(f"spectrial: still stopping after {_STOPPING[0]}: servers are being stopped and the record "
                      "written (SIGKILL would leave them to the next run)", file=sys.stderr)
            return
        _STOPPING.append(what)
        raise exc(what)

    return handler


def install() -> None:
    """For a run: SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt, Terminated and HungUp in the main thread,
    once; a signal that follows, while the first one's cleanup runs, is reported and otherwise waits (SIGINT
    stays ignored when the process started with it ignored: a shell's background job)."""
    if threading.current_thread() is threading.main_thread():
        _STOPPING.clear()
        signal.signal(signal.SIGTERM, _once(Terminated, "SIGTERM"))
        signal.signal(signal.SIGHUP, _once(HungUp, "SIGHUP"))
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, _once(KeyboardInterrupt, "Ctrl-C"))


def install_exit() -> None:
    """Until a run starts (`install`): SIGINT / SIGTERM / SIGHUP exit at once with 130 / 143 / 129 (nothing is
    running that needs stopping; a traceback from the middle of an import would say nothing)."""
    if threading.current_thread() is threading.main_thread():
        for sig, code in ((signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)):
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, lambda signum, frame, code=code: _exit(code))


def _exit(code: int) -> None:
    import contextlib
    import sys

    name = {130: "Ctrl-C", 143: "SIGTERM", 129: "SIGHUP"}.get(code, "a signal")
    with contextlib.suppress(OSError, ValueError):  # a hung-up terminal cannot take it
        print(f"spectrial: interrupted by {name} outside a run: nothing of a run was running", file=sys.stderr)
    raise SystemExit(code)


def ignore() -> None:
    """The run was interrupted and is over: further SIGINT / SIGTERM / SIGHUP are ignored while the process exits
    (a second Ctrl-C must not turn exit 130 into a death by signal during the interpreter's shutdown)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)


def exit_code(exc: KeyboardInterrupt) -> int:
    """The documented exit code of an interrupt: 130 (Ctrl-C), 143 (SIGTERM), 129 (SIGHUP)."""
    return 129 if isinstance(exc, HungUp) else 143 if isinstance(exc, Terminated) else 130


def name(exc: KeyboardInterrupt) -> str:
    return "SIGHUP" if isinstance(exc, HungUp) else "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP during the block; deliver the first one caught after it.

    Only the main thread receives signals, so elsewhere this does nothing. A held signal whose previous
    disposition was the default action is re-raised with that action in place; an ignored one stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, FrameType | None]] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        caught.append((signum, frame))

    before = {s: signal.signal(s, hold) for s in HELD}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        if caught:
            signum, frame = caught[0]
            handler = before[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def describe(exc: BaseException) -> str:
    """An exception as a failure reason: an interrupt by its signal, anything else by its type and message."""
    if isinstance(exc, KeyboardInterrupt):
        return f"interrupted by {name(exc)}"
    return f"{type(exc).__name__}: {exc}"


@contextlib.contextmanager
def interruptible(done: str = "servers stopped, the record says why") -> Iterator[None]:
    """Stop the run on SIGTERM or SIGHUP as on Ctrl-C (servers stopped, the record written with the reason), then
    exit 130 (Ctrl-C), 143 (SIGTERM) or 129 (SIGHUP): the commands' wrapper (spectrial trial, sweep, ...); `done`
    says what was done about it."""
    import typer  # only the commands need it; this module is imported before anything slow

    main = threading.current_thread() is threading.main_thread()
    before = {s: signal.getsignal(s) for s in HELD} if main else {}

    def after(interrupted: bool) -> None:
        """The command: a later signal exits at once (130 / 143 / 129), or is ignored once interrupted (a second
        Ctrl-C must not turn exit 130 into a death by signal). Called in-process by a program that imports
        spectrial (a notebook, a test): its own handlers again, as they were."""
        if _COMMAND and interrupted:
            ignore()
        elif _COMMAND:
            install_exit()
        else:
            for s, handler in before.items():
                if handler is not None:
                    signal.signal(s, handler)

    install()
    try:
        yield
    except KeyboardInterrupt as exc:
        after(True)  # the run is over; a second Ctrl-C changes nothing now
        with contextlib.suppress(OSError):  # a hung-up terminal cannot take the message
            typer.secho(f"interrupted by {name(exc)}: {done}", fg="red", err=True)
        raise typer.Exit(exit_code(exc)) from None
    except BaseException:
        after(False)
        raise
    else:
        after(False)
