"""Input: a path (plain or gzip), log text, bytes, a file object or an iterable of lines, read as blocks of
bytes that end with a newline."""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from spectrial.errors import ConfigError

Source = str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes] | IO[str] | Iterable[str | bytes]
"""What parse reads: a path (plain or gzip), log text, bytes, a file object or an iterable of lines."""
MAX_LINE_BYTES = 64 << 20
_PATHLIKE = re.compile(r"\.(log|txt|gz|out|err|jsonl)$")
_SPACE = re.compile(r"\s")


def is_path(s: str) -> bool:
    """Whether the string `s` names a file (True), is log text (False), or looks like a missing file
    (ConfigError naming the `source` parameter)."""
    if "\n" in s or len(s) > 4096:
        return False
    if os.path.isfile(s):
        return True
    looks = not _SPACE.search(s) and ("/" in s or os.sep in s or bool(_PATHLIKE.search(s)))
    if looks:
        raise ConfigError(f"source: no such file {s!r}; pass an existing path, or log text with a newline")
    return False


def _file_blocks(path: Path, size: int, errors: list[str]) -> Iterator[bytes]:
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError as e:
        raise ConfigError(f"source: cannot read {str(path)!r} ({e.strerror or e}); check the path") from e
    with fh:
        stream: IO[bytes] = gzip.GzipFile(fileobj=fh) if fh.read(2) == b"\x1f\x8b" else fh
        fh.seek(0)
        try:
            while block := stream.read(size):
                yield block
        except (OSError, EOFError, zlib.error) as e:  # truncated / half-written .gz
            errors.append(f"{path}: {e.__class__.__name__}: {e}")


def raw_blocks(source: Source, size: int, errors: list[str]) -> Iterator[bytes]:
    """Blocks of about `size` bytes of `source`; read errors (a cut .gz) are appended to `errors`."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        for i in range(0, len(data), size):
            yield data[i:i + size]
    elif isinstance(source, os.PathLike) or (isinstance(source, str) and is_path(source)):
        yield from _file_blocks(Path(source), size, errors)
    elif isinstance(source, str):
        for i in range(0, len(source), size):
            yield source[i:i + size].encode("utf-8", "replace")
    elif hasattr(source, "read"):
        while block := source.read(size):
            yield block.encode("utf-8", "replace") if isinstance(block, str) else bytes(block)
    elif isinstance(source, Iterable):
        buf: list[bytes] = []
        n = 0
        for item in source:
            s = bytes(item) if isinstance(item, (bytes, bytearray)) else str(item).encode("utf-8", "replace")
            if not s.endswith(b"\n"):
                s += b"\n"
            buf.append(s)
            n += len(s)
            if n >= size:
                yield b"".join(buf)
                buf, n = [], 0
        if buf:
            yield b"".join(buf)
    else:
        raise ConfigError(f"source: expected a path, log text, bytes or an iterable of lines, "
                          f"got {type(source).__name__}")


def line_blocks(raw: Iterator[bytes], size: int) -> Iterator[bytes]:
    """Re-cut raw blocks so that each ends with a newline (the last may not)."""
    rest = b""
    longest = max(4 * size, MAX_LINE_BYTES)
    for block in raw:
        cut = block.rfind(b"\n")  # `rest` has no newline: the block's last one ends the lines
        if cut < 0:
            data = rest + block if rest else block
            if len(data) < longest:
                rest = data
                continue
            yield data  # no newline in 64 MiB (binary data): split it, the line count is off by one then
            rest = b""
            continue
        if rest:
            yield b"".join((rest, memoryview(block)[:cut + 1]))  # one copy
        else:
            yield block if cut == len(block) - 1 else block[:cut + 1]
        rest = block[cut + 1:]
    if rest:
        yield rest
