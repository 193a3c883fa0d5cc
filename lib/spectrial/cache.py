"""spectrial's cache (`$SPECTRIAL_CACHE` or `~/.cache/spectrial`): its root, entries published whole (written
aside, renamed into place) and builds serialised by a file lock. Every heavy artifact (the llama.cpp build, engine
venvs, models, datasets) lives here, keyed by version."""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from spectrial.errors import ConfigError

T = TypeVar("T")


def cache_root() -> Path:
    """spectrial's cache folder (`$SPECTRIAL_CACHE` or `~/.cache/spectrial`)."""
    return Path(os.environ.get("SPECTRIAL_CACHE") or Path.home() / ".cache" / "spectrial").expanduser()


def publish(final: Path, write: Callable[[Path], None], usable: Callable[[Path], T | None]) -> T:
    """A cache entry at `final`: the one there when `usable` accepts it, else one written by `write` into a
    temporary sibling folder and renamed into place, so readers never see half an entry (a concurrent writer
    that wins the rename wins)."""
    if (entry := usable(final)) is not None:
        return entry
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        write(tmp)
        if final.exists() and usable(final) is None:
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if (entry := usable(final)) is None:  # lost a race to a writer whose entry is broken
                raise
            return entry
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if (entry := usable(final)) is None:
        raise ConfigError(f"cache_dir={final.parent}: wrote {final} but cannot read it back; check the folder "
                          "is writable and not shared with another writer version", parameter="cache_dir")
    return entry


@contextmanager
def locked(path: Path, what: str = "", progress: bool = True) -> Iterator[None]:
    """An exclusive lock on `path` for a cache entry's build; says so when another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress and what:
                _say(f"{what}: another process is building it; waiting for it to finish ...")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _say(msg: str) -> None:
    print(f"[spectrial provision] {msg}", file=sys.stderr, flush=True)
