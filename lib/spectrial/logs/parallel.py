"""A large plain log file read by several processes at once, joined into exactly the sequential result.

The file is cut at newlines into segments of 8-32 MB. Worker processes (forked: they have the parent's
formats, a user's own ones included) each take segments from the parent, one at a time, and read each with
the sequential driver (:meth:`Plan.feed <spectrial.logs.driver.Plan.feed>`): lines numbered from the
segment's first one, the CONTEXT lines above it in view, and past its end only as far as a block that runs
over it needs. A segment's records go back to the parent as columns (arrow and numpy arrays).

The parent joins the segments in file order. Where the segment before read D lines into this one, those
lines are the segment before's: this segment's records there are dropped, and its counts (lines, blank,
recognised) lose what they counted there. From line D on this segment read what the sequential parse
reads, because both start afresh there (nothing claims line D), unless one of this segment's own blocks
runs across line D: then the parent reads the segment again from line D itself. Finalizers (a format's
pass over all its rows) and the table are the parent's, as in a sequential parse.

The parent reads a segment itself when a worker fails or dies; workers are stopped, never left behind, when
the parse ends or is interrupted. Without ``fork`` (or inside a daemonic process, which may not start
children) the parse is sequential.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import mmap
import multiprocessing
import multiprocessing.connection
import multiprocessing.reduction
import os
import pickle
import resource
import signal
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from spectrial.errors import ConfigError
from spectrial.logs import native
from spectrial.logs.chunks import CONTEXT, line_offsets
from spectrial.logs.driver import MAX_ERRORS, Batch, Plan, cpus, line_rows, numpy_part, rows_frame
from spectrial.logs.formats import Finalizer, Format, LineFormat, finalizer

MIN_BYTES = 64 << 20  # smaller files are read by one process (starting workers would cost more than it gains)
SEGMENT_MIN = 8 << 20
SEGMENT_MAX = 32 << 20
AHEAD = 2  # segments given to a worker at once: the one it reads and the next
SEGMENTS_PER_WORKER = 4  # more segments than workers: the fast ones take more, the parent joins while they read
MAX_WORKERS = 16  # by default (workers=None): past this the parent, which joins the segments, is the bottleneck
OVERRUN_FIRST = 64 << 10  # a segment reads past its end in pieces of this size, doubling


@dataclass
class Segment:
    """What a worker found in one segment. Lines are numbered from the segment's first (1-based in records,
    0-based in `claims`); `done` lines were read (at least `own`, the segment's lines: more where a block ran
    over its end)."""

    index: int
    own: int
    done: int
    line_parts: list[list[tuple[np.ndarray, dict[str, pa.Array | np.ndarray]]]]
    block_parts: list[list[Batch]]
    claims: tuple[np.ndarray, np.ndarray]
    nonblank: np.ndarray  # np.packbits of the segment's own lines' nonblank flags
    total: int
    blank: int
    recognised: int
    errors: list[tuple[int, str, str]]
    peak_rss: int = 0
    # formats with a row-wise finalize: (line of each record before finalize, the finalized rows) or the error
    finalized: dict[int, tuple[np.ndarray, Any] | str] = field(default_factory=dict)


@dataclass
class Stats:
    """How a parallel parse went (:data:`last`)."""

    workers: int
    segments: int
    reread: int = 0  # segments the parent read again from where the segment before stopped
    by_parent: int = 0  # segments the parent read because a worker failed
    worker_peak_rss: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, int]:
        return {"workers": self.workers, "segments": self.segments, "reread": self.reread,
                "by_parent": self.by_parent, "worker_peak_rss": max(self.worker_peak_rss, default=0)}


def workers_for(source: Any, workers: int | None) -> tuple[Path, int] | None:
    """(path, worker count) when `source` is a plain file worth reading in parallel, else None.

    `workers`: None for one per CPU (at most MAX_WORKERS; files of MIN_BYTES and more), 1 for none, N for at
    most N."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers: must be a whole number >= 1 (1: no worker processes) or None (one per CPU), "
                          f"got {workers!r}")
    if workers == 1 or not isinstance(source, (str, os.PathLike)):
        return None
    path = Path(source)
    try:
        if not path.is_file():
            return None
        size = path.stat().st_size
        with open(path, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
    except (OSError, ValueError):  # e.g. log text that is not a file name: the sequential reader says what is wrong
        return None
    if gz or size < (MIN_BYTES if workers is None else 2 * SEGMENT_MIN):
        return None
    if (not sys.platform.startswith("linux") or "fork" not in multiprocessing.get_all_start_methods()
            or multiprocessing.current_process().daemon):  # fork is safe with these libraries on Linux only
        return None
    n = min(workers or min(cpus(), MAX_WORKERS), -(-size // SEGMENT_MIN))
    return (path, n) if n > 1 else None


# ---------------------------------------------------------------- cutting and reading segments
def cut(fd: int, size: int, workers: int) -> list[tuple[int, int]]:
    """Byte ranges of whole lines covering the file: about SEGMENTS_PER_WORKER per worker, 8-32 MB each, as many for
    each worker (the same size throughout: the parent joins segments as they come, and the first come soonest so;
    measured on 16 CPUs, segments shrinking towards the end were 12-30 % slower)."""
    target = min(max(size // (workers * SEGMENTS_PER_WORKER), SEGMENT_MIN), SEGMENT_MAX)
    rounds = -(-size // (workers * target))  # a whole number of segments per worker: none waits for the other's last
    target = max(min(-(-size // (workers * rounds)), SEGMENT_MAX), 1)
    bounds = [0]
    while bounds[-1] < size:
        bounds.append(_line_start_after(fd, bounds[-1] + target, size))
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _line_start_after(fd: int, pos: int, size: int) -> int:
    """The first line start at or after `pos` (after a newline), or the file's end."""
    if pos >= size:
        return size
    at, step = pos - 1, 1 << 16
    while at < size:
        data = os.pread(fd, step, at)
        k = data.find(b"\n")
        if k >= 0:
            return min(at + k + 1, size)
        at += len(data)
        step = min(step * 2, 64 << 20)
        if not data:
            break
    return size


def _context(fd: int, a: int) -> tuple[bytes, int, bool]:
    """The CONTEXT lines before byte `a` (a line start): (bytes, line count, whether they start the file)."""
    if a == 0:
        return b"", 0, True
    width = 1 << 14
    while True:
        lo = max(a - width, 0)
        data = os.pread(fd, a - lo, lo)
        ends = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
        if len(ends) > CONTEXT:
            cut_at = int(ends[len(ends) - CONTEXT - 1]) + 1
            return data[cut_at:], CONTEXT, False
        if lo == 0:
            return data, len(ends), True
        width *= 4


def _pieces(fd: int, data: bytes, b: int, size: int, block_bytes: int) -> Iterator[bytes]:
    """The segment's bytes in blocks that end at a newline (line_blocks passes them on without copying them again),
    then the file after it in small, growing pieces (read only if needed). A segment of up to SEGMENT_MAX bytes
    is one block, as it was read (not copied again; one chunk instead of two: measured, two 31 MB segments,
    0.64 s CPU vs 0.68 s with 16 MiB blocks, the least of 4 runs each)."""
    first = max(block_bytes, len(data)) if len(data) <= SEGMENT_MAX else block_bytes
    i = 0
    while i < len(data):
        end = data.rfind(b"\n", i, i + first) + 1 if i + first < len(data) else len(data)
        if end <= i:  # no newline in a whole block: cut it where it is (line_blocks joins the pieces)
            end = i + first
        yield data[i:end]
        i = end
    pos, step = b, OVERRUN_FIRST
    while pos < size:
        piece = os.pread(fd, min(step, size - pos), pos)
        if not piece:
            return
        yield piece
        pos += len(piece)
        step = min(step * 2, block_bytes)


def read_segment(formats: Sequence[Format], path: Path, a: int, b: int, index: int = 0,
                 block_bytes: int = 16 << 20, threads: bool = False, size: int | None = None) -> Segment:
    """Read the lines in bytes [a, b) of `path` (`a` and `b` at line starts) as the sequential parse reads them;
    past `b` (to finish a block) up to byte `size` at most (the file's size when the parse began: a log that
    grows meanwhile is read as it was)."""
    from spectrial.logs.source import line_blocks

    plan = Plan(formats, threads=threads, claims=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = min(os.fstat(fd).st_size, size if size is not None else 1 << 62)
        ctx, ctx_n, head = _context(fd, a)
        data = os.pread(fd, b - a, a)
        own = native.count_lines(data)  # the segment's own lines
        plan.nonblank = np.zeros(own, bool)  # which are not blank: filled from the chunks' own pass (feed)
        done = plan.feed(line_blocks(_pieces(fd, data, b, size, block_bytes), block_bytes), context=ctx,
                         context_lines=ctx_n, head=head, own_lines=own)
    finally:
        os.close(fd)
    finalized: dict[int, tuple[np.ndarray, Any] | str] = {}
    for i, fmt in enumerate(plan.formats):  # a row-wise finalize: here, for this segment's rows
        if isinstance(fmt, LineFormat) and fmt.rowwise and fmt.finalize is not None and plan.line_parts[i]:
            lines, cols = line_rows(fmt, plan.line_parts[i])
            plan.line_parts[i] = []
            try:
                finalized[i] = (lines, fmt.finalize(rows_frame(lines, cols)))  # type: ignore[call-arg]
            except Exception as e:  # reported by the parent, as a sequential parse reports it
                finalized[i] = f"{type(e).__name__}: {e}"
    for i, fmt in enumerate(plan.formats):  # the other line formats' columns as the tables hold them: made here,
        if isinstance(fmt, LineFormat) and plan.line_parts[i] and not _helped(fmt):  # in the workers, not in the
            plan.line_parts[i] = [numpy_part(fmt, part) for part in plan.line_parts[i]]  # parent that joins
    for i, sink in enumerate(plan.sinks):  # a format's Python-function records: as a batch of columns
        if sink.n:
            fmt = plan.formats[i]
            plan.block_parts[i].append(sink.batch({"timestamp": "str", "engine": "str", "kind": "str",
                                                   **fmt.columns}))
    claims = plan.claims or []
    starts = np.concatenate([c[0] for c in claims]) if claims else np.zeros(0, np.int64)
    ends = np.concatenate([c[1] for c in claims]) if claims else np.zeros(0, np.int64)
    return Segment(index, own, done, plan.line_parts, plan.block_parts, (starts, ends),
                   np.packbits(plan.nonblank),
                   plan.total, plan.blank, plan.recognised,
                   plan.errors, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, finalized)


# ---------------------------------------------------------------- joining
def _straddles(seg: Segment, at: int) -> bool:
    """Whether one of the segment's blocks runs across its local line `at` (begins before, ends after)."""
    starts, ends = seg.claims
    return bool(((starts < at) & (ends > at)).any())


def _suffix(keep: np.ndarray) -> int | None:
    """Where the kept rows begin, if they are the rows from there on (else None)."""
    at = int(np.argmax(keep))
    return at if keep[at:].all() else None


def join(plan: Plan, seg: Segment, line0: int, drop: int) -> None:
    """Add the segment's records to `plan`, its lines shifted by `line0`, without those on its first `drop`
    lines (read by the segment before; no block of this segment runs across line `drop`).

    Line formats' records become numpy columns here (the parent does it while the workers read on); those of a
    format whose finalize is a Finalizer class are fed to it, in file order."""
    dropped_rows = 0
    for f, parts in enumerate(seg.line_parts):
        fmt = plan.formats[f]
        if not parts or not isinstance(fmt, LineFormat):
            continue
        mine, helped = [], _helped(fmt)
        for lines, cols in parts:
            if drop:
                keep = lines > drop
                if not keep.all():
                    dropped_rows += int((~keep).sum())
                    if not keep.any():
                        continue
                    at = _suffix(keep)
                    if at is not None:  # the rows in line order: the kept ones are a slice (no copy)
                        lines, cols = lines[at:], {c: v[at:] for c, v in cols.items()}
                    else:
                        mask = pa.array(keep)
                        lines, cols = lines[keep], {c: v.filter(mask) if isinstance(v, pa.Array) else v[keep]
                                                    for c, v in cols.items()}
            mine.append((lines + line0, cols) if helped else numpy_part(fmt, (lines + line0, cols)))
        if not mine:
            continue
        if helped:
            _feed(plan, f, fmt, mine)
        else:
            plan.line_parts[f].extend(mine)
    for f, got in seg.finalized.items():
        fmt = plan.formats[f]
        done = plan.finalizers.get(f)
        if done is None:
            done = plan.finalizers[f] = Finalized()
        assert isinstance(done, Finalized)
        if isinstance(got, str):  # the format's rows are left out, as a sequential parse leaves them out
            if not done.failed:
                done.failed = True
                plan.errors.append((line0 + 1, f"{fmt.engine}/{fmt.kind}", got))
            continue
        lines, df = got
        if drop:
            dropped_rows += int((lines <= drop).sum())
            df = df[df["line"].to_numpy() > drop]
        if len(df):
            df = df.copy() if drop else df
            df["line"] = df["line"].to_numpy() + line0
            done.parts.append(df)
    for f, batches in enumerate(seg.block_parts):
        for b in batches:
            if drop:
                keep = b.lines > drop
                if not keep.any():
                    continue
                if not keep.all():
                    at = _suffix(keep)
                    b = b.take(keep) if at is None else Batch(b.lines[at:], {c: v[at:] for c, v in b.columns.items()})
            plan.block_parts[f].append(Batch(b.lines + line0, b.columns))
    for line, where, msg in seg.errors:
        if line > drop and len(plan.errors) < MAX_ERRORS:
            plan.errors.append((line + line0, where, msg))
    total, blank, recognised = seg.total, seg.blank, seg.recognised
    if drop:
        flags = np.unpackbits(seg.nonblank, count=seg.own).astype(bool)
        cum = np.concatenate(([0], np.cumsum(flags)))
        starts, ends = seg.claims
        early = starts < drop
        total -= drop
        blank -= drop - int(cum[drop])
        recognised -= dropped_rows + int((cum[ends[early]] - cum[starts[early]]).sum())
    plan.total += total
    plan.blank += blank
    plan.recognised += recognised


def _helped(fmt: Format) -> bool:
    """Whether the format's rows go to a Finalizer, part by part (a helper process's, in a parallel parse): its
    text columns stay arrow until the helper reads them (pickled out of band from the worker to the parent and
    on to the helper; as numpy objects each string was pickled and read back twice: measured, 500 MB log, the
    parent's CPU while the workers read went from 0.6 to 0.42 s)."""
    return isinstance(fmt, LineFormat) and isinstance(fmt.finalize, type) and issubclass(fmt.finalize, Finalizer)


def _feed(plan: Plan, f: int, fmt: LineFormat, parts: list[tuple[np.ndarray, dict[str, np.ndarray]]]) -> None:
    """The rows of `parts` to format `f`'s finalizer."""
    fin = plan.finalizers.get(f)
    if isinstance(fin, Helper):
        fin.feed_parts(parts)  # the helper makes the DataFrame (the parent has enough to do)
        return
    if fin is None:
        fin = plan.finalizers[f] = finalizer(fmt)
    fin.feed(rows_frame(*line_rows(fmt, parts)))


class Finalized(Finalizer):
    """The rows of a format with a row-wise finalize, finalized segment by segment in the workers."""

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.failed = False

    def feed(self, df: Any) -> None:  # pragma: no cover - the parts come finalized
        raise NotImplementedError

    def finish(self) -> Any:
        import pandas as pd

        if self.failed or not self.parts:
            return pd.DataFrame({"line": np.zeros(0, np.int64)})
        return self.parts[0] if len(self.parts) == 1 else pd.concat(self.parts, ignore_index=True)


class Helper(Finalizer):
    """A format's Finalizer run in a helper process while the workers read: the rows go to it as they are
    joined (through a queue, so the parent does not wait for it), `finish` waits for its result. Should the
    helper fail or die, the rows (kept here too) are finalized in this process."""

    def __init__(self, fmt: LineFormat, ctx: Any) -> None:
        self.fmt = fmt
        self.parts: list[Any] = []
        self.queue = ctx.Queue()
        self.result, out = ctx.Pipe()  # a socket pair: the result's memory file is handed over through it
        self.proc = ctx.Process(target=_helper, args=(fmt, self.queue, out), daemon=True,
                                name="spectrial-logs-finalize")
        self.proc.start()
        out.close()
        self.done = False

    def feed(self, df: Any) -> None:  # pragma: no cover - the parallel join gives it parts
        raise NotImplementedError

    def feed_parts(self, parts: list[tuple[np.ndarray, dict[str, np.ndarray]]]) -> None:
        """The next records (line formats' numpy parts, in file order)."""
        self.parts.append(parts)
        self.queue.put(parts)

    def finish(self) -> Any:
        status, got = "error", None
        try:
            self.queue.put(None)
            status, got = self.result.recv()
            if isinstance(got, Packed):
                got = _unpack(self.result, got)
        except (EOFError, OSError):
            pass
        finally:
            self.close()
        if status == "ok":
            return got
        local = finalizer(self.fmt)  # the helper failed: here, where an error is reported as a parser error
        for parts in self.parts:
            local.feed(rows_frame(*line_rows(self.fmt, parts)))
        return local.finish()

    def close(self, abort: bool = False) -> None:
        """Wait for the helper to end (`abort`: stop it at once)."""
        if self.done:
            return
        self.done = True
        self.queue.cancel_join_thread()  # what it has not read is not needed (it answered, or it is stopped)
        self.queue.close()
        self.result.close()
        if abort:
            self.proc.kill()
        reap([self.proc])


def _helper(fmt: LineFormat, queue: Any, out: Any) -> None:
    """A helper process: feed the rows from `queue` to the format's Finalizer until None, send the result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.disable()  # its records are dicts in a list: the collector would walk them all, again and again
    fin, error = finalizer(fmt), None
    while (parts := queue.get()) is not None:
        if error is None:
            try:
                fin.feed(rows_frame(*line_rows(fmt, parts)))
            except Exception as e:  # the parent finalizes again itself and reports it
                error = e
    fd = None
    try:
        if error is None:
            result = fin.finish()
            fd, layout = _pack(result)
            out.send(("ok", result if fd is None else layout))
            if fd is not None:
                multiprocessing.reduction.send_handle(out, fd, os.getppid())
        else:
            out.send(("error", repr(error)))
    except Exception as e:
        out.send(("error", repr(e)))
    finally:
        if fd is not None:
            os.close(fd)


def close(plan: Plan) -> None:
    """Stop the helper processes of `plan` that are still running (a parse that failed before its table)."""
    for fin in plan.finalizers.values():
        if isinstance(fin, Helper):
            fin.close(abort=True)


# ---------------------------------------------------------------- workers
last: Stats | None = None
"""The Stats of this process's last parallel parse (for benchmarks and diagnostics)."""
_JOB: tuple[Sequence[Format], Path, list[tuple[int, int]], int, int] | None = None  # what forked workers read


def _worker(conn: multiprocessing.connection.Connection) -> None:
    """A worker process: read the segments the parent names until it sends None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (it stops the workers)
    assert _JOB is not None
    keep_freed_memory()
    gc.disable()  # see the note above keep_freed_memory
    formats, path, segments, block_bytes, size = _JOB
    while True:
        try:
            k = conn.recv()
        except (EOFError, OSError):
            return
        if k is None:
            return
        fd = None
        try:
            a, b = segments[k]
            seg = read_segment(formats, path, a, b, k, block_bytes, size=size)
            fd, layout = _pack(seg)
            msg: tuple[str, int, Any] = ("ok", k, seg if fd is None else layout)
        except Exception as e:  # the parent reads the segment itself (and raises what it raises there)
            msg = ("error", k, f"{type(e).__name__}: {e}")
        try:
            conn.send(msg)
            if fd is not None:
                multiprocessing.reduction.send_handle(conn, fd, os.getppid())
        except (OSError, ValueError):
            return
        finally:
            if fd is not None:
                os.close(fd)


@dataclass
class Packed:
    """Where a segment's pickle lies in the memory file a worker hands over: the pickle's own bytes first, then
    its buffers (numpy and arrow arrays, pickled out of band), each at its offset."""

    size: int
    head: int
    buffers: list[tuple[int, int]]  # (offset, length)


def _pack(obj: Any) -> tuple[int | None, Packed | None]:
    """`obj` (a segment, a finalized table) pickled into an anonymous memory file (memfd), for the parent to map
    instead of reading it through the pipe (which copies every byte twice there): (its descriptor, layout);
    (None, None) where the system has no memfd (the object then goes through the pipe)."""
    if not hasattr(os, "memfd_create"):
        return None, None
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    try:
        fd = os.memfd_create("spectrial-logs-segment", os.MFD_CLOEXEC)
    except OSError:
        return None, None
    try:
        views = [memoryview(head), *(b.raw() for b in buffers)]
        places, at = [], 0
        for v in views:
            places.append((at, v.nbytes))
            at += v.nbytes
        os.ftruncate(fd, max(at, 1))
        for v, (off, _) in zip(views, places, strict=True):
            done = 0
            while done < v.nbytes:
                done += os.pwrite(fd, v[done:], off + done)
        return fd, Packed(at, len(head), places[1:])
    except BaseException:
        os.close(fd)
        raise


def _unpack(conn: multiprocessing.connection.Connection, layout: Packed) -> Any:
    """What a worker or helper packed (see :func:`_pack`): its memory file mapped copy-on-write (the arrays are
    views of it, writable, never copied here)."""
    fd = multiprocessing.reduction.recv_handle(conn)
    try:
        mm = mmap.mmap(fd, layout.size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    view = memoryview(mm)
    return pickle.loads(view[:layout.head], buffers=[view[a:a + n] for a, n in layout.buffers])


# The worker and helper processes run with the cyclic garbage collector off, as the parse that forks them runs
# (api.parse_tables), whoever starts them: they live for one parse, and what they make holds no cycles to speak
# of (measured, a worker's 8 segments of a 500 MB log read with the collector on: 111 collections took 0.08-0.1 s
# of its 3-3.7 s; with it off, 35 objects were left in cycles and the peak RSS was the same).


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep the memory it frees for the next allocations (a worker process's only: it
    allocates the same large arrays chunk after chunk, and ends when the parse does). By default arrays over
    a threshold are mmap'ed and given back on free, so each chunk's arrays fault in fresh pages, which costs
    much on a VM that backs guest memory lazily (measured, 100 MB in one process: 25 % fewer page faults,
    0.1-0.2 s less system time). Returns whether glibc took the settings."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    return all([mallopt(m_mmap_threshold, 32 << 20) == 1,  # glibc's maximum (arrays below it: from the heap)
                mallopt(m_trim_threshold, 1 << 30) == 1,  # freed heap goes back only past 1 GiB free
                mallopt(m_top_pad, 64 << 20) == 1])  # it grows in 64 MiB steps


def read(plan: Plan, path: Path, workers: int, block_bytes: int) -> Stats:
    """Read `path` into `plan` with `workers` processes (see the module docstring)."""
    global _JOB, last
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        segments = cut(fd, size, workers)
    finally:
        os.close(fd)
    stats = last = Stats(workers=min(workers, len(segments)), segments=len(segments))
    results: dict[int, Segment] = {}
    pending = list(range(len(segments)))[::-1]  # a stack: pop() gives the next segment in file order
    mine: list[int] = []  # segments the parent reads itself (a worker failed)
    procs: list[Any] = []
    conns: dict[Any, list[int]] = {}  # connection -> the segments its worker was given (it reads the first)
    ctx = multiprocessing.get_context("fork")
    _JOB = (plan.formats, path, segments, block_bytes, size)
    for fmt in plan.formats:  # the compiled line pass built and loaded here once: the forked workers inherit it
        if isinstance(fmt, LineFormat):
            native.compiled(fmt)
    finished = False
    try:
        with warnings.catch_warnings():  # Python 3.12+: "use of fork() may lead to deadlocks" (the workers
            warnings.simplefilter("ignore", DeprecationWarning)  # only parse: they take no lock of other threads)
            for f, fmt in enumerate(plan.formats):  # a format's Finalizer class: in a helper process
                if _helped(fmt):
                    with contextlib.suppress(OSError):  # no process to spare: it runs here, as the rows come
                        plan.finalizers[f] = Helper(fmt, ctx)
            for _ in range(stats.workers):
                parent_end, child_end = ctx.Pipe()
                p = ctx.Process(target=_worker, args=(child_end,), daemon=True, name="spectrial-logs-worker")
                try:
                    p.start()
                except OSError:  # no more processes (a limit): those started read, else the parent alone
                    parent_end.close()
                    child_end.close()
                    break
                child_end.close()
                procs.append(p)
                conns[parent_end] = []
        stats.workers = len(procs)
        for r in range(AHEAD):  # round after round: the workers read the segments in file order
            for c in list(conns):
                _assign(c, conns, pending, mine, r + 1)
        state = _Join(plan, segments, path, block_bytes, stats, size)
        while state.next < len(segments):
            if state.next in results:
                state.add(results.pop(state.next))
                continue
            live = [c for c, ks in conns.items() if ks]
            if not live or state.next in mine:  # the parent reads what no worker reads or could read
                k = state.next if state.next in mine else mine[0] if mine else pending[-1]
                for todo in (mine, pending):
                    if k in todo:
                        todo.remove(k)
                a, b = segments[k]
                results[k] = read_segment(plan.formats, path, a, b, k, block_bytes, threads=plan.threads, size=size)
                stats.by_parent += 1
                continue
            for c in multiprocessing.connection.wait(live):
                try:
                    status, k2, got = c.recv()
                    if isinstance(got, Packed):
                        got = _unpack(c, got)
                except (EOFError, OSError):  # the worker died: its segments are the parent's
                    mine.extend(conns.pop(c))
                    continue
                conns[c].remove(k2)
                if status == "ok":
                    results[k2] = got
                    stats.worker_peak_rss.append(got.peak_rss)
                else:
                    mine.append(k2)
                _assign(c, conns, pending, mine)
        finished = True
    finally:
        _JOB = None
        for c in conns:
            with contextlib.suppress(OSError, ValueError):
                c.send(None)
        for p in procs:
            if not finished:  # interrupted or failed: the workers still reading are stopped, not waited for
                p.kill()
        reap(procs)  # every worker is idle now and ends at once
        for c in conns:
            c.close()
    return stats


def reap(procs: list[Any]) -> None:
    """Wait for `procs` (told to end, or killed) in a thread of this process, killing any that is still there
    after 5 s: a process of a few hundred MB takes tens of ms to give its memory back as it exits (measured: the
    helper, 60 ms), which the tables need not wait for."""

    def wait() -> None:
        for p in procs:
            with contextlib.suppress(OSError, ValueError):  # reaped meanwhile (multiprocessing.active_children)
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)

    threading.Thread(target=wait, daemon=True, name="spectrial-logs-reap").start()


def _assign(c: Any, conns: dict[Any, list[int]], pending: list[int], mine: list[int], upto: int = AHEAD) -> None:
    """Give the worker at `c` segments up to AHEAD (the next one queued while it reads: it never waits for the
    parent, busy joining, to name its next; measured, 2 workers: 0.1-0.2 s less wall for 500 MB). The last round
    goes one at a time, to whichever worker is free first."""
    ks = conns[c]
    while pending and len(ks) < upto and (not ks or len(pending) > len(conns)):
        k = pending.pop()
        try:
            c.send(k)
        except (OSError, ValueError):  # the worker is gone
            mine.extend(conns.pop(c))
            mine.append(k)
            return
        ks.append(k)


class _Join:
    """The segments joined in file order: where each begins (global line) and how far the one before read."""

    def __init__(self, plan: Plan, segments: list[tuple[int, int]], path: Path, block_bytes: int, stats: Stats,
                 size: int) -> None:
        self.plan, self.segments, self.path, self.block_bytes, self.stats = plan, segments, path, block_bytes, stats
        self.size = size
        self.next = 0
        self.line0 = 0  # global 0-based line of segment `next`'s first line
        self.overlap = 0  # lines of segment `next` that the segments before read

    def add(self, seg: Segment) -> None:
        drop, shift = self.overlap, 0
        if drop >= seg.own:  # read entirely by the segments before
            self.overlap = drop - seg.own
        else:
            if drop and _straddles(seg, drop):  # its state at `drop` is not the sequential one: read it again
                seg, shift = self._reread(seg, drop), drop
                drop = 0
            join(self.plan, seg, self.line0 + shift, drop)
            self.overlap = seg.done - seg.own
        self.line0 += seg.own + shift
        self.next += 1

    def _reread(self, seg: Segment, drop: int) -> Segment:
        """The segment read again from its local line `drop` on (in the parent)."""
        a, b = self.segments[seg.index]
        fd = os.open(self.path, os.O_RDONLY)
        try:
            data = os.pread(fd, b - a, a)
        finally:
            os.close(fd)
        start = a + int(line_offsets(data)[drop])
        self.stats.reread += 1
        return read_segment(self.plan.formats, self.path, start, b, seg.index, self.block_bytes,
                            threads=self.plan.threads, size=self.size)
