"""Progress for people: a bar in a terminal or an interactive notebook, one quiet line elsewhere.

    terminal (stderr is a TTY)            tqdm's text bar, erased when done
    JupyterLab with ipywidgets            tqdm's notebook widget, hidden when done
    logs, CI, papermill, plain kernels    one line per finished bar ("waiting for llama-server-baseline:
                                          ready after 12 probes, 1.3 s"), nothing while it runs
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


class Progress:
    """A progress bar with tqdm's verbs (update, set_postfix_str, close), shown as `mode()` says."""

    def __init__(self, desc: str, total: int | None = None, unit: str = "it", enabled: bool = True) -> None:
        self.desc, self.total, self.unit = desc, total, unit
        self.n = 0
        self.postfix = ""
        self.t0 = time.monotonic()
        self.mode: Mode = mode() if enabled else "off"
        self._bar: Any = None
        if self.mode == "bar":
            from tqdm.std import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, leave=False, mininterval=0.5)
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
        print(f"[spectrial] {self.desc}: {text} ({secs:.1f} s)", file=sys.stdout if "ipykernel" in sys.modules
              else sys.stderr, flush=True)
        self.mode = "off"

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def status(message: str, enabled: bool = True) -> None:
    """One line about a step that takes a while (a build, an install), in every mode but off."""
    if enabled and mode() != "off":
        print(f"[spectrial] {message}", file=sys.stderr, flush=True)
