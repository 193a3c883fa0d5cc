"""Interrupts: SIGTERM handled as Ctrl-C is, and the few steps that must not be cut in half.

A server launch is one such step: between the spawn and the state file that names its process group, an
interrupt would leave a server nobody knows about. `deferred()` holds SIGINT and SIGTERM for the length of such
a step and delivers the first one caught right after it, to the handler that was in place before.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

HELD = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM (timeout, a CI cancel, a service manager): handled as Ctrl-C is, wherever the run is."""


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated("SIGTERM")


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM during the block; deliver the first one caught after it.

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
