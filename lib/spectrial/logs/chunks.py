"""A chunk of the input: whole lines as one arrow string array over the raw bytes, and the Window that a
block format's Python function reads.

The driver cuts the input into chunks of whole lines. Each chunk starts with up to :data:`CONTEXT` lines
already handled (so that a block may look back at the lines above its marker) and ends where its input
block ended; a block that runs past the end is carried into the next chunk with the lines after it
(:class:`NeedMore`), so every block is read within one chunk.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import Executor, Future

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# ANSI colour sequences, also the ``?[32m`` form a terminal paste leaves
ANSI = r"(?:\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\n]*\x07|\?\[[0-9;]+m|\^\[\[[0-9;]*m)"
# ASCII bytes on which bytes and str methods differ (str.strip() strips \x1c-\x1f), or that a Window drops
# (a line's \r, ANSI's ESC): "plain" text has none of them; vectorised block readers read plain text only
NOT_PLAIN = b"\r\x1b\x1c\x1d\x1e\x1f"
_ANSI_PY = re.compile(ANSI)


def strip_ansi(text: str) -> str:
    """`text` without ANSI colour sequences (also the `?[32m` form a terminal paste leaves)."""
    return _ANSI_PY.sub("", text) if ("\x1b" in text or "?[" in text or "^[[" in text) else text


CONTEXT = 64  # lines above a marker line a block may read (Window: w[-1] .. w[-64])
MAX_BLOCK_LINES = 20000  # lines from a marker line on a block may read (Window: w[0] .. w[19999])


class NeedMore(BaseException):  # noqa: N818 - a signal, not an error; BaseException passes `except Exception`
    """A block asked for a line past the end of a chunk that is not the last one."""


class Chunk:
    """Whole lines of the input, local line 0 being global line `start` (0-based).

    Lines ``first ..`` are the chunk's own lines; those before are context (handled with the chunk before).
    ``lines`` holds each line with its newline, zero-copy over ``data``. `head`: local line 0 is the input's
    first line (default: where `start` is 0; a segment of a parallel parse numbers its lines from its own
    first one and says so itself).
    """

    __slots__ = ("data", "offs", "start", "first", "n", "final", "head", "lines", "has_ansi", "_offl", "_nb", "_bad",
                 "_ansi", "_bad_soon", "_ansi_pos")

    def __init__(self, data: bytes, start: int, first: int = 0, final: bool = True, head: bool | None = None) -> None:
        self._offl: list[int] | None = None
        self._nb: np.ndarray | None = None
        self._bad: np.ndarray | None = None
        self._ansi: np.ndarray | None = None
        self._bad_soon: Future[np.ndarray] | None = None
        self._ansi_pos: np.ndarray | None = None  # offsets of ESC, ``?[`` and ``^[[`` (found with the plain check)
        self.start, self.first, self.final = start, first, final
        self.head = start == 0 if head is None else head
        if not self._compiled(data):
            offs = line_offsets(data)
            lines = _string_array(data, offs)
            try:
                lines.validate(full=True)
            except pa.ArrowInvalid:  # invalid UTF-8 (binary noise): replace, keep the line structure
                data = data.decode("utf-8", "replace").encode("utf-8")
                offs = line_offsets(data)
                lines = _string_array(data, offs)
            self.data, self.offs, self.lines, self.n = data, offs, lines, len(offs) - 1
            self.has_ansi = b"\x1b" in data or any(rx.search(data) for rx in _PASTED)

    def _compiled(self, data: bytes) -> bool:
        """The lines, their plain and colour flags and their non-blank count in one compiled pass over the bytes
        (``cp_lines``); False where the library is off, the chunk is 2 GiB or more, or not valid UTF-8."""
        got = scan_lines(data)
        if got is None or not got[4]:
            return False
        offs, bad, colour, nonblank, _ = got
        n = len(offs) - 1
        self.data, self.offs, self.n = data, offs, n
        self.lines = _string_array(data, offs)
        flags = bad[:n].view(bool)
        if n and not data.endswith(b"\n") and not self.final:  # an incomplete last line is never plain
            flags[-1] = True
        self._bad = np.concatenate(([0], np.cumsum(flags)))
        colour_flags = colour[:n].view(bool)
        self.has_ansi = bool(colour_flags.any())
        self._ansi = np.append(colour_flags, False) if self.has_ansi else None
        self._nb = np.concatenate(([0], np.cumsum(nonblank[:n].view(bool))))
        return True

    # ------------------------------------------------------------ lines as Python text (a Window's view)
    @property
    def starts(self) -> list[int]:
        """Byte offsets of the local lines (and of the end), as a list."""
        if self._offl is None:
            self._offl = self.offs.tolist()
        return self._offl

    def line(self, i: int) -> str | None:
        """Local line `i` as a Window gives it: no line ending, no ANSI codes; None outside the input.

        Raises NeedMore for a line past the end of a chunk that is not the last one."""
        if i < 0:
            return None  # the chunk holds CONTEXT lines above its own ones, or the input starts here
        if i >= self.n:
            if self.final:
                return None
            raise NeedMore
        offl = self.starts
        s = self.data[offl[i]:offl[i + 1]].decode("utf-8", "replace").rstrip("\r\n")
        return strip_ansi(s) if self.has_ansi else s

    def lines_from(self, i: int, count: int) -> list[str]:
        """Up to `count` local lines from `i` on (fewer at the chunk's end), decoded in one go."""
        j = min(i + count, self.n)
        if j <= i:
            return []
        offl = self.starts
        text = self.data[offl[i]:offl[j]].decode("utf-8", "replace")
        if self.has_ansi:
            text = strip_ansi(text)
        out = text.split("\n")
        if len(out) > j - i:  # the text ended with a newline
            out.pop()
        if "\r" in text:
            out = [x.rstrip("\r") for x in out]
        return out

    def strings(self, idx: np.ndarray) -> list[str | None]:
        """Local lines at `idx` as a Window gives them (None outside the chunk)."""
        return [self.line(i) if 0 <= i < self.n else None for i in idx.tolist()]

    # ------------------------------------------------------------ lines as columns (vectorised readers)
    def texts(self, idx: np.ndarray) -> pa.Array:
        """Local lines at `idx` (all within the chunk) as an arrow string array, each with its newline (the
        last line of the input may have none): readers strip or split them, so a copy without the newline
        would only cost time."""
        return self.lines.take(pa.array(idx, pa.int64()))

    def plain(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per range: whether local lines a..b-1 are plain (printable ASCII without the bytes a Window changes
        or strips: \\r, ESC, \\x1c-\\x1f, the ``?[``/``^[[`` colour forms) and complete. Lines before the
        input's start and, in the last chunk, after its end are None to a Window and count as plain."""
        a = np.asarray(a, np.int64)
        if self.head:  # local line 0 is the input's first
            a = np.maximum(a, 0)
        b = np.asarray(b, np.int64)
        if self.final:
            b = np.minimum(b, self.n)
        ok = (a >= 0) & (b <= self.n)
        if not self.n:
            return ok
        if self._bad is None:
            self._bad = self._bad_soon.result() if self._bad_soon is not None else self._bad_lines()
        cum = self._bad
        return ok & (cum[np.clip(b, 0, self.n)] == cum[np.clip(a, 0, self.n)])

    def prepare_plain(self, pool: Executor) -> None:
        """Find the lines that are not plain in `pool`'s thread (numpy, mostly without the GIL) meanwhile."""
        if self._bad is None and self._bad_soon is None:
            self._bad_soon = pool.submit(self._bad_lines)

    def _bad_lines(self) -> np.ndarray:
        """Cumulative count of the lines that are not plain (a Window's text differs from the bytes)."""
        data = self.data
        # non-ASCII per line (one arrow pass over the lines), the rare control bytes and colour codes per byte
        bad = (np.zeros(self.n, dtype=bool) if data.isascii()
               else ~pc.string_is_ascii(self.lines).to_numpy(zero_copy_only=False))
        where = _control_bytes(data)
        if self.has_ansi:
            self._ansi_pos = _ansi_bytes(data)
            where.append(self._ansi_pos)
        if where:
            bad[np.searchsorted(self.offs, np.concatenate(where), side="right") - 1] = True
        if self.n and not data.endswith(b"\n") and not self.final:  # an incomplete last line is never plain
            bad[-1] = True
        return np.concatenate(([0], np.cumsum(bad)))

    def ansi(self, idx: np.ndarray) -> np.ndarray:
        """Which of the local lines `idx` hold an ANSI escape or a ``?[`` / ``^[[`` paste of one."""
        if not self.has_ansi:
            return np.zeros(len(idx), dtype=bool)
        if self._ansi is None:
            pos = self._ansi_pos if self._ansi_pos is not None else _ansi_bytes(self.data)
            flag = np.zeros(self.n + 1, dtype=bool)
            flag[np.searchsorted(self.offs, pos, side="right") - 1] = True
            self._ansi = flag
        return self._ansi[idx]

    # ------------------------------------------------------------ counting
    def nonblank_cum(self) -> np.ndarray:
        """Non-blank lines before each local line (n + 1 counts: the first 0, the last all of them)."""
        if self._nb is None:
            self._nb = np.concatenate(([0], np.cumsum(nonblank_lines(self.data, self.offs))))
        return self._nb

    def nonblank(self, a: int, b: int) -> int:
        """Non-blank lines among local lines a..b-1."""
        cum = self.nonblank_cum()
        return int(cum[min(max(b, 0), self.n)] - cum[min(max(a, 0), self.n)])

    def nonblank_ranges(self, a: np.ndarray, b: np.ndarray) -> int:
        """Non-blank lines in all the ranges a[j]..b[j]-1 together."""
        if not len(a):
            return 0
        cum = self.nonblank_cum()
        return int((cum[np.clip(b, 0, self.n)] - cum[np.clip(a, 0, self.n)]).sum())


Scan = Callable[[bytes], "tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool] | None"]
SCAN: list[Scan] = []  # the compiled chunk pass, where spectrial.logs.native is loaded (it puts itself here)


def scan_lines(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool] | None:
    """The compiled chunk pass over `data` (:func:`spectrial.logs.native.scan_lines`): line offsets (int32), per line
    the not-plain, colour and non-blank flags, and whether the bytes are valid UTF-8; None without it."""
    return SCAN[0](data) if SCAN else None


def nonblank_lines(data: bytes, offs: np.ndarray) -> np.ndarray:
    """Per line (`offs`: its line offsets): whether it holds more than its line ending."""
    lens = np.diff(offs)
    nonblank = lens > 1
    two = np.flatnonzero(lens == 2)
    if len(two):
        nonblank[two] = np.frombuffer(data, np.uint8)[offs[two]] != 13
    return nonblank


# the forms a pasted ESC takes, as literal regexes: re's literal search is several times faster here than
# numpy over every byte, and than `bytes in` (b"^[[" in 16 MiB of log: 10 ms, the regex 5 ms)
_PASTED = tuple(re.compile(re.escape(f)) for f in (b"?[", b"^[["))


def _ansi_bytes(data: bytes) -> np.ndarray:
    """Offsets where an ANSI escape (ESC) or a ``?[`` / ``^[[`` paste of one starts."""
    raw = np.frombuffer(data, np.uint8)
    pos = [np.flatnonzero(raw == 27)] if b"\x1b" in data else []
    for rx in _PASTED:
        found = np.fromiter((m.start() for m in rx.finditer(data)), np.int64)
        if len(found):
            pos.append(found)
    return np.concatenate(pos) if pos else np.zeros(0, np.int64)


def _control_bytes(data: bytes) -> list[np.ndarray]:
    """Offsets of the ASCII bytes of NOT_PLAIN other than ESC (ESC starts a colour code: :func:`_ansi_bytes`)."""
    raw = np.frombuffer(data, np.uint8)
    return [np.flatnonzero(raw == c) for c in NOT_PLAIN if c != 27 and bytes((c,)) in data]


def line_offsets(data: bytes) -> np.ndarray:
    """Byte offset of each line's start, then the end of the data (int32 where the data allows)."""
    a = np.frombuffer(data, np.uint8)
    step = 1 << 22
    parts = [np.flatnonzero(a[i:i + step] == 10) + (i + 1) for i in range(0, len(a), step)]
    ends = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if len(a) and a[-1] != 10:
        ends = np.append(ends, len(a))
    offs = np.zeros(len(ends) + 1, np.int32 if len(a) < 2**31 - 1 else np.int64)
    offs[1:] = ends
    return offs


def _string_array(data: bytes, offs: np.ndarray) -> pa.Array:
    typ = pa.string() if offs.dtype == np.int32 else pa.large_string()
    return pa.Array.from_buffers(typ, len(offs) - 1, [None, pa.py_buffer(offs), pa.py_buffer(data)])


class Window:
    """Lines around a marker line: ``w[0]`` is that line, ``w[1]`` the next, ``w[-1]`` the previous.

    Lines come without line ending and ANSI codes; outside the input (or more than 64 lines above, or
    20000 below) they are None.
    """

    __slots__ = ("_chunk", "_i", "_buf", "_end")

    def __init__(self, chunk: Chunk, i: int) -> None:
        self._chunk, self._i = chunk, i
        self._buf: list[str] = []
        self._end = False

    @property
    def line(self) -> int:
        """1-based line number of the marker line."""
        return self._chunk.start + self._i + 1

    def __getitem__(self, k: int) -> str | None:
        buf = self._buf
        if 0 <= k < len(buf):
            return buf[k]
        if k < 0:
            return self._chunk.line(self._i + k) if k >= -CONTEXT else None
        if k >= MAX_BLOCK_LINES:
            return None
        if not self._end:
            want = max(k + 1 - len(buf), 16, len(buf))  # read ahead, doubling (within the chunk)
            more = self._chunk.lines_from(self._i + len(buf), min(want, MAX_BLOCK_LINES - len(buf)))
            self._end = len(more) < want
            buf += more
            if k < len(buf):
                return buf[k]
        return self._chunk.line(self._i + k)  # past the chunk: None at the input's end, else NeedMore
