"""Progress for people: a bar in a terminal or an interactive notebook, one quiet line elsewhere.

    terminal (stderr is a TTY)            tqdm's text bar, erased when done
    JupyterLab with ipywidgets            tqdm's notebook widget, hidden when done
    logs, CI, papermill, plain kernels    one line per finished bar ("waiting for llama-server-baseline:
                                          ready after 12 probes, 1.3 s"), nothing while it runs, except for
                                          a wait (`heartbeat=True`): a line with the elapsed time and the last
                                          state every 5 s in its first minute, then every 30 s
`SPECTRIAL_PROGRESS=bar|line|off` forces a mode.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any, Literal

Mode = Literal["bar", "widget", "line", "off"]


@functools.lru_cache(maxsize=1)
def _kernel_mode() -> Mode:
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return "line"
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return "line"
    from spectrial.ownership import papermill_output_path

    if papermill_output_path() is not None:
        return "line"  # an executed notebook keeps widget state; nobody watches it run
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return "line"
    return "widget"


def mode() -> Mode:
    """How progress is shown here (see the module docstring)."""
    forced = os.environ.get("SPECTRIAL_PROGRESS", "").lower()
    if forced in ("bar", "line", "off"):
        return forced  # type: ignore[return-value]
    if "ipykernel" in sys.modules:
        return _kernel_mode()
    return "bar" if sys.stderr.isatty() else "line"


HEARTBEAT_FIRST_S = 5.0  # a wait's line in line mode: every 5 s in its first minute,
HEARTBEAT_LATER_S = 30.0  # then every 30 s (a 9-minute model load: 28 lines)


def _in_kernel() -> bool:
    """Running inside a Jupyter kernel (not merely with ipykernel imported, as papermill's caller is)."""
    if "ipykernel" not in sys.modules:
        return False
    from IPython import get_ipython

    return type(get_ipython()).__name__ == "ZMQInteractiveShell"


def _out() -> Any:
    """Where a progress line goes: a kernel's stdout (a cell's output), else stderr."""
    return sys.stdout if _in_kernel() else sys.stderr


def _line(text: str) -> None:
    print(f"[spectrial] {text}", file=_out(), flush=True)


def note(text: str, enabled: bool = True) -> None:
    """A status line beside the bars (the plan, a decide run's round): "[spectrial] text" unless progress is off;
    in a terminal wrapped to its width between words, an interval "[a, b]" kept whole."""
    if not enabled or mode() == "off":
        return
    if mode() == "bar":
        import re
        import shutil
        import textwrap

        width = shutil.get_terminal_size((100, 24)).columns
        kept = re.sub(r"\[[^\]\n]{0,40}\]", lambda m: m[0].replace(" ", "\u00a0"), f"[spectrial] {text}")
        lines = textwrap.wrap(kept, width=max(width - 1, 40), subsequent_indent="    ", break_long_words=False,
                              break_on_hyphens=False)
        print("\n".join(x.replace("\u00a0", " ") for x in lines), file=_out(), flush=True)
        return
    _line(text)


class Progress:
    """A progress bar with tqdm's verbs (update, set_postfix_str, close), shown as `mode()` says."""

    def __init__(self, desc: str, total: int | None = None, unit: str = "it", enabled: bool = True,
                 heartbeat: bool = False) -> None:
        self.desc, self.total, self.unit = desc, total, unit
        self.n = 0
        self.postfix = ""
        self.t0 = time.monotonic()
        self.mode: Mode = mode() if enabled else "off"
        self.heartbeat = heartbeat
        self._next_beat = HEARTBEAT_FIRST_S
        self._bar: Any = None
        if self.mode == "bar":
            from tqdm.std import tqdm

            # a wait has no total: its line shows the elapsed time, the count and the last state
            fmt = "{desc}: {elapsed} elapsed, {n_fmt} " + unit + "(s){postfix}" if heartbeat and total is None else None
            self._bar = tqdm(total=total, desc=desc, unit=unit, leave=False, mininterval=0.5, bar_format=fmt)
        elif self.mode == "widget":
            from tqdm.notebook import tqdm as ntqdm

            self._bar = ntqdm(total=total, desc=desc, unit=unit, leave=False)

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)
        elif self.heartbeat and self.mode == "line":
            self.beat()

    def write(self, line: str) -> None:
        """A line beside the progress: above the bar in a terminal (the bar redrawn below it), as it is elsewhere
        (nothing when off)."""
        if self.mode == "bar" and self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        elif self.mode != "off":
            print(line, file=_out(), flush=True)

    def beat(self) -> None:
        """In line mode, a line with the elapsed time, the count and the last state when one is due (every
        `HEARTBEAT_FIRST_S` in the first minute, then every `HEARTBEAT_LATER_S`)."""
        secs = time.monotonic() - self.t0
        if self.mode != "line" or secs < self._next_beat:
            return
        state = f"; last: {self.postfix}" if self.postfix else ""
        _line(f"{self.desc}: {secs:.0f} s so far, {self.n} {self.unit}(s){state}")
        step = HEARTBEAT_FIRST_S if secs < 60 else HEARTBEAT_LATER_S
        self._next_beat = (secs // step + 1) * step

    def close(self, summary: str | None = None) -> None:
        """End the bar; in line mode print one line (`summary`, else the count and the time)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            return
        if self.mode != "line":
            return
        secs = time.monotonic() - self.t0
        text = summary or f"{self.n}{f'/{self.total}' if self.total else ''} {self.unit}"
        _line(f"{self.desc}: {text} ({secs:.1f} s)")
        self.mode = "off"

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def status(message: str, enabled: bool = True) -> None:
    """One line about a step that takes a while (a build, an install), in every mode but off."""
    if enabled and mode() != "off":
        print(f"[spectrial] {message}", file=sys.stderr, flush=True)
