"""The compiled passes: a LineFormat's patterns and `key: value` list over a batch of lines in one C call
(`linepass.c`, here), and the block readers compiled (`blockpass.c` and one C file per reader: :mod:`.blocks`).

The C files beside this one (shipped in the wheel) are built the first time a parse needs them, with the machine's
C compiler against the PCRE2 that grep links (``libpcre2-8.so.0``; no header needed), into one library in
``<cache>/native/native-<hash>/`` (`$SPECTRIAL_CACHE` or ``~/.cache/spectrial``), and called through ctypes (which
lets go of the GIL, so it overlaps the block readers as arrow's kernels did). It reads only lines of plain ASCII,
where PCRE2 and RE2 read the patterns alike; every other line goes through the arrow kernels
(:meth:`LineFormat.extract <spectrial.logs.formats.LineFormat.extract>`), which stay the reference: the parse
(:mod:`spectrial.logs.driver`) asks this pass first and arrow where it declines, and the tables are the same
either way (`tests/logs/test_logs_native.py` holds every registered format to it).

The driver hands the pass its chunk's lines and the rows to read, which C reads in place (no copy of them). The
captures of float columns are read in C too (``lp_floats``) where they are plain decimal numbers, on which Python's
float() and arrow's cast agree (both correctly rounded, as C's reading is); a column of a batch holding anything
else (inf, nan, ``1_000``, a space, a number that under- or overflows) is read as before, by
:func:`~spectrial.logs.columns.convert` (or `to_float` for a key), for arrow's cast decides on the whole column.
Text columns are trimmed (``lp_trim``) and coalesced as spans, and gathered once.

Without a C compiler or libpcre2, or with ``SPECTRIAL_LOGS_NATIVE=0``, the parse reads with arrow alone;
:func:`status` says which and why.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spectrial.cache import cache_root, publish
from spectrial.logs import chunks
from spectrial.logs.columns import ARROW_TYPES, convert, merge_captures, to_float

LineFormat = Any  # spectrial.logs.formats.LineFormat (not imported: this pass stands below the formats)

HERE = Path(__file__).parent
PCRE2 = "libpcre2-8.so.0"
CFLAGS = ("-O2", "-shared", "-fPIC", "-std=c11", "-Wall", "-Werror=implicit-function-declaration", "-Werror=int-conversion")
LIBRARY = "native.so"


def sources() -> list[Path]:
    """The C files built into the library (the headers they include are beside them)."""
    return sorted(HERE.glob("*.c"))
_lock = threading.Lock()
_state: list[tuple[Any, str]] = []  # (library or None, why), once loaded (a forked worker inherits it)


def enabled() -> bool:
    """Whether the compiled pass may be used (``SPECTRIAL_LOGS_NATIVE=0`` turns it off)."""
    return os.environ.get("SPECTRIAL_LOGS_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def _build(folder: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise OSError("no C compiler (cc or gcc) on PATH")
    folder.mkdir(parents=True)
    cmd = [cc, *CFLAGS, f"-I{HERE}", "-o", str(folder / LIBRARY), *map(str, sources()), f"-l:{PCRE2}", "-lm"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired as e:
        raise OSError(f"{cc} did not finish in 120 s") from e
    if done.returncode != 0:
        raise OSError(f"{' '.join(cmd)} failed: {(done.stderr or done.stdout).strip()[-400:]}")


def _usable(folder: Path) -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(str(folder / LIBRARY))
        return lib if lib.lp_version() == 2 and lib.bp_version() == 1 else None
    except (OSError, AttributeError):
        return None


def _load() -> tuple[Any, str]:
    if not enabled():
        return None, "off: SPECTRIAL_LOGS_NATIVE=0"
    try:
        ctypes.CDLL(PCRE2)
    except OSError:
        return None, f"off: {PCRE2} (PCRE2, which grep links) is not on this machine"
    cc = os.environ.get("CC") or "cc"
    digest = hashlib.sha256(repr((cc, CFLAGS)).encode())
    for src in sorted([*sources(), *HERE.glob("*.h")]):
        digest.update(src.name.encode() + b"\0" + src.read_bytes())
    folder = cache_root() / "native" / f"native-{digest.hexdigest()[:16]}"
    try:
        lib = publish(folder, _build, _usable)
    except Exception as e:  # no compiler, a read-only cache, ...: arrow reads instead
        return None, f"off: the compiled passes could not be built ({e})"
    _declare(lib)
    return lib, f"on: {folder / LIBRARY} (PCRE2 JIT)"


def _declare(lib: Any) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
    lib.lp_compile.restype = p
    lib.lp_compile.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    lib.lp_extract.restype = ctypes.c_int
    lib.lp_extract.argtypes = [i64, p, i64, p, p, ctypes.c_int, p, p, p, p, p, i32, p, ctypes.c_int, p, p, p,
                               ctypes.c_int, p, p]
    lib.lp_gather.restype = None
    lib.lp_gather.argtypes = [i64, p, p, i64, p, p, p]
    lib.cp_lines.restype = i64
    lib.cp_lines.argtypes = [p, i64, p, i64, p, p, p, p]
    lib.cp_markers.restype = i64
    lib.cp_markers.argtypes = [p, p, i64, i64, p, p, i32, p, p]
    lib.cp_count_lines.restype = i64
    lib.cp_count_lines.argtypes = [p, i64]
    lib.lp_floats.restype = None
    lib.lp_floats.argtypes = [i64, ctypes.c_int, p, i64, p, p, p, i64, ctypes.c_int, p, p, p]
    lib.lp_trim.restype = None
    lib.lp_trim.argtypes = [i64, p, i64, i32, i32, p, i64, p, p]


def library() -> Any:
    """The loaded library, or None (see :func:`status`); built once per cache, loaded once per process."""
    if not _state:
        with _lock:
            if not _state:
                _state.append(_load())
    return _state[0][0]


def status() -> str:
    """``on: <library>`` or ``off: <why>``."""
    library()
    return _state[0][1]


@dataclass
class Compiled:
    """A LineFormat's patterns as PCRE2 codes, and its keys, laid out for :func:`extract`."""

    codes: Any  # ctypes array of code pointers
    lits: Any
    litlens: np.ndarray
    ngroups: np.ndarray
    groups: np.ndarray
    width: int  # groups in all
    keydata: bytes
    keyoffs: np.ndarray
    keycol: np.ndarray
    key_columns: list[str]  # column per dense key-column index
    keep: list[Any]  # the buffers the pointers above point into
    fgroups: np.ndarray  # the groups of float columns (not `X__pct`), read by lp_floats at once
    fstart: np.ndarray  # their start and end within a line's spans (2 * group, 2 * group + 1)
    fend: np.ndarray
    findex: dict[int, int]  # group -> its row in lp_floats' answer
    pct_of: dict[int, int]  # group of column X -> group of X__pct in the same pattern
    kfloat: list[int]  # the float key columns (dense indexes)
    kstart: np.ndarray  # their value's start and end without `%` within a line's kspans
    kend: np.ndarray
    texts: frozenset[str]  # text columns of the patterns alone, without `X__pct`: trimmed and coalesced as spans


def compiled(fmt: LineFormat) -> Compiled | None:
    """`fmt` compiled for this process's library (once), or None where a pattern does not compile in PCRE2."""
    lib = library()
    if lib is None:
        return None
    got = fmt.__dict__.get("_native", fmt)
    if got is fmt:  # not compiled yet (None: PCRE2 refused a pattern); a forked worker inherits the codes
        with _lock:
            got = fmt.__dict__.get("_native", fmt)
            if got is fmt:
                got = _compile(lib, fmt)
                object.__setattr__(fmt, "_native", got)
    return got  # type: ignore[no-any-return]


def _compile(lib: Any, fmt: LineFormat) -> Compiled | None:
    import re

    codes, lits, litlens, ngroups, groups, keep = [], [], [], [], [], []
    err = ctypes.create_string_buffer(256)
    for pattern, names, literal in fmt._groups:  # type: ignore[attr-defined]
        raw = pattern.encode()
        code = lib.lp_compile(raw, len(raw), err, len(err))
        if not code:
            return None
        index = re.compile(pattern).groupindex
        codes.append(code)
        lit = (literal or "").encode()
        if not lit.isascii():
            lit = b""
        keep.append(lit)
        lits.append(ctypes.cast(ctypes.c_char_p(lit), ctypes.c_void_p).value if lit else None)
        litlens.append(len(lit))
        ngroups.append(len(names))
        groups.extend(index[n] for n in names)
    key_list = list(fmt.keys)
    key_cols = [fmt.keys[k] for k in key_list]
    dense = list(dict.fromkeys(key_cols))
    types = fmt.pattern_columns
    fgroups: list[int] = []
    pct_of: dict[int, int] = {}
    g0 = 0
    for _, names, _ in fmt._groups:  # type: ignore[attr-defined]
        for j, name in enumerate(names):
            if name.endswith("__pct"):
                continue
            if types[name] == "float":
                fgroups.append(g0 + j)
            if name + "__pct" in names:
                pct_of[g0 + j] = g0 + names.index(name + "__pct")
        g0 += len(names)
    kfloat = [c for c, name in enumerate(dense) if fmt.types.get(name, "float") == "float"]
    pcts = {n[:-5] for _, names, _ in fmt._groups for n in names if n.endswith("__pct")}  # type: ignore[attr-defined]
    texts = frozenset(c for c, t in types.items() if t == "str" and c not in pcts and c not in dense)
    encoded = [k.encode() for k in key_list]
    keyoffs = np.zeros(len(encoded) + 1, np.int32)
    keyoffs[1:] = np.cumsum([len(k) for k in encoded]) if encoded else []
    return Compiled(
        codes=(ctypes.c_void_p * max(len(codes), 1))(*codes), lits=(ctypes.c_void_p * max(len(lits), 1))(*lits),
        litlens=np.array(litlens or [0], np.int64), ngroups=np.array(ngroups or [0], np.int32),
        groups=np.array(groups or [0], np.int32), width=len(groups), keydata=b"".join(encoded) or b"\0",
        keyoffs=keyoffs, keycol=np.array([dense.index(c) for c in key_cols] or [0], np.int32),
        key_columns=dense, keep=keep, fgroups=np.array(fgroups, np.int32),
        fstart=np.array([2 * g for g in fgroups] or [0], np.int32),
        fend=np.array([2 * g + 1 for g in fgroups] or [0], np.int32),
        findex={g: k for k, g in enumerate(fgroups)}, pct_of=pct_of, kfloat=kfloat,
        kstart=np.array([3 * c for c in kfloat] or [0], np.int32),
        kend=np.array([3 * c + 2 for c in kfloat] or [0], np.int32), texts=texts)


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data  # type: ignore[no-any-return]


def extract(fmt: LineFormat, lines: pa.Array, rows: np.ndarray | None = None) -> dict[str, pa.Array] | None:
    """`fmt.extract(lines)` (with `rows`: `fmt.extract(lines.take(rows))`, read in place, without the copy),
    computed by the compiled pass (arrow for lines that are not plain ASCII); None where the pass cannot read these
    lines (no library, a pattern PCRE2 refuses, not a plain string array, no lines)."""
    if lines.type != pa.string() or lines.null_count or not len(lines):
        return None
    comp = compiled(fmt)
    if comp is None:
        return None
    lib = library()
    nlines = len(lines)
    if rows is not None:
        rows = np.ascontiguousarray(rows, np.int64)
        if not len(rows):
            return None
    n = nlines if rows is None else len(rows)
    _, obuf, dbuf = lines.buffers()
    offs = np.frombuffer(obuf, np.int32, nlines + 1, lines.offset * 4)
    data = np.frombuffer(dbuf, np.uint8) if dbuf is not None and dbuf.size else np.zeros(1, np.uint8)
    ncol = len(comp.key_columns)
    spans = np.empty((n, max(comp.width, 1), 2), np.int32)
    kspans = np.empty((n, max(ncol, 1), 3), np.int32)
    plain = np.empty(n, np.uint8)
    npat = len(fmt._groups)  # type: ignore[attr-defined]
    rc = lib.lp_extract(n, None if rows is None else _ptr(rows), nlines, _ptr(offs), _ptr(data), npat,
                        ctypes.addressof(comp.codes), ctypes.addressof(comp.lits), _ptr(comp.litlens),
                        _ptr(comp.ngroups), _ptr(comp.groups), comp.width, _ptr(spans), len(fmt.keys), comp.keydata,
                        _ptr(comp.keyoffs), _ptr(comp.keycol), ncol, _ptr(kspans), _ptr(plain))
    if rc != 0:
        return None
    out: dict[str, pa.Array | None] = {}  # in arrow's order of the columns; None: in `floats` or `texts`
    floats: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # float columns as numpy (values, valid)
    texts: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # text columns as trimmed spans (start -1: null)
    if fmt.keys:
        _key_columns(fmt, comp, kspans, data, n, out, floats)
    types = fmt.pattern_columns
    nf = len(comp.fgroups)
    if nf:
        vals, valid, odd = _numbers(spans, 2 * spans.shape[1], comp.fstart, comp.fend, data, nf, n, blank_odd=False)
    g0 = 0
    for _, names, _ in fmt._groups:  # type: ignore[attr-defined]
        others: dict[str, pa.Array] = {}
        for j, name in enumerate(names):
            g = g0 + j
            if name.endswith("__pct"):
                continue
            out.setdefault(name, None)
            pg = comp.pct_of.get(g, -1)
            k = comp.findex.get(g)
            if name in comp.texts:  # trimmed, "" as null (before the trim), the first pattern's text kept
                a, b = _trimmed(spans, g, data)
                prev = texts.get(name)
                texts[name] = (a, b) if prev is None else (np.where(prev[0] >= 0, prev[0], a),
                                                           np.where(prev[0] >= 0, prev[1], b))
                continue
            if k is None:  # a bool or list column (or text with keys or %): arrow's conversion, as LineFormat.extract
                others[name] = _strings(spans[:, g, 0], spans[:, g, 1], data)
                if pg >= 0:
                    others[name + "__pct"] = _strings(spans[:, pg, 0], spans[:, pg, 1], data)
                continue
            if odd[k]:  # a capture that is not a plain number: the column as convert() reads it
                typed = convert(_strings(spans[:, g, 0], spans[:, g, 1], data), "float")
                v = typed.to_numpy(zero_copy_only=False)
                ok = pc.is_valid(typed).to_numpy(zero_copy_only=False)
            else:
                v, ok = vals[k], valid[k]
            if pg >= 0:  # divided by 100 where X__pct captured something
                v = np.where(spans[:, pg, 1] > spans[:, pg, 0], v / 100.0, v)
            prev = floats.get(name)
            floats[name] = (v, ok) if prev is None else (np.where(prev[1], prev[0], v), prev[1] | ok)
        g0 += len(names)
        if others:
            merge_captures(out, others, types)  # type: ignore[arg-type]
    cols = {name: a if a is not None else _float_array(*floats[name]) if name in floats else
            _strings(*texts[name], data) for name, a in out.items()}
    odd_rows = np.flatnonzero(plain == 0)
    if len(odd_rows):
        take = odd_rows if rows is None else rows[odd_rows]
        cols = _merge(cols, fmt.extract(lines.take(pa.array(take))), odd_rows, n, types)
    return cols


def _numbers(spans: np.ndarray, rowstride: int, start: np.ndarray, end: np.ndarray, data: np.ndarray, ncols: int,
             n: int, *, blank_odd: bool) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """lp_floats: per column (values, valid as bool) of its plain numbers, and its count of other spans."""
    vals = np.empty((ncols, n), np.float64)
    valid = np.empty((ncols, n), np.uint8)
    odd = np.empty(ncols, np.int64)
    library().lp_floats(n, ncols, _ptr(spans), rowstride, _ptr(start), _ptr(end), _ptr(data), len(data),
                        int(blank_odd), _ptr(vals), _ptr(valid), _ptr(odd))
    return vals, valid.view(bool), odd.tolist()


def _trimmed(spans: np.ndarray, g: int, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group `g`'s captures as `convert(.., "str")` reads them, as spans: start -1 where none or empty."""
    n = len(spans)
    a = np.empty(n, np.int32)
    b = np.empty(n, np.int32)
    library().lp_trim(n, _ptr(spans), 2 * spans.shape[1], 2 * g, 2 * g + 1, _ptr(data), len(data), _ptr(a), _ptr(b))
    return a, b


def _float_array(values: np.ndarray, valid: np.ndarray) -> pa.Array:
    """A float64 arrow array over `values` (contiguous), null where not `valid`."""
    n = len(values)
    nulls = n - int(np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(pa.float64(), n, [bitmap, pa.py_buffer(np.ascontiguousarray(values))], nulls)


def _strings(starts: np.ndarray, ends: np.ndarray, data: np.ndarray) -> pa.Array:
    """The spans' text as one arrow string array (null where a span's start is -1)."""
    n = len(starts)
    valid = starts >= 0
    lengths = np.where(valid, ends - starts, 0).astype(np.int32)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    buf = np.empty(max(int(offsets[-1]), 1), np.uint8)
    starts, ends = np.ascontiguousarray(starts), np.ascontiguousarray(ends)
    library().lp_gather(n, _ptr(starts), _ptr(ends), 1, _ptr(data), _ptr(offsets), _ptr(buf))
    nulls = int(n - valid.sum())
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(buf), bitmap, nulls)


def _key_columns(fmt: LineFormat, comp: Compiled, kspans: np.ndarray, data: np.ndarray, n: int,
                 out: dict[str, pa.Array | None], floats: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """The `key: value` columns, as LineFormat's arrow reading makes them (only those found on some line), into
    `out` (text and bool columns) and `floats` (float columns as numpy values and valid, NaN as null)."""
    nf = len(comp.kfloat)
    if nf:
        vals, valid, odd = _numbers(kspans, 3 * len(comp.key_columns), comp.kstart, comp.kend, data, nf, n,
                                    blank_odd=True)
    for c, name in enumerate(comp.key_columns):
        start = kspans[:, c, 0]
        found = start >= 0
        if not found.any():
            continue
        typ = fmt.types.get(name, "float")
        if typ == "float":
            k = comp.kfloat.index(c)
            if odd[k]:  # a value that is not a plain number: to_float, as LineFormat.extract reads the column
                rows = np.flatnonzero(found)
                full = np.full(n, np.nan)
                full[rows] = to_float(_strings(start[rows], kspans[rows, c, 2], data))
            else:
                full = vals[k]
            if name in fmt.percent:
                full = np.where(found & (kspans[:, c, 2] < kspans[:, c, 1]), full / 100.0, full)
            out[name] = None
            floats[name] = (full, ~np.isnan(full))
        else:
            rows = np.flatnonzero(found)
            token = _strings(start[rows], kspans[rows, c, 1], data).to_numpy(zero_copy_only=False)
            full_o = np.full(n, None, object)
            full_o[rows] = (token == "True").tolist() if typ == "bool" else token
            out[name] = pa.array(full_o, type=pa.bool_() if typ == "bool" else pa.string())


def _merge(out: dict[str, pa.Array], odd_cols: dict[str, pa.Array], odd: np.ndarray, n: int,
           types: dict[str, str]) -> dict[str, pa.Array]:
    """`out` (every line; the odd ones empty) with rows `odd` taken from `odd_cols` (arrow's reading of them)."""
    where = np.arange(n)
    where[odd] = n + np.arange(len(odd))
    take = pa.array(where)
    merged: dict[str, pa.Array] = {}
    for name in [*out, *(c for c in odd_cols if c not in out)]:
        typ = ARROW_TYPES.get(types.get(name, "float"), pa.string())
        a = out.get(name)
        b = odd_cols.get(name)
        a = pa.nulls(n, (b.type if b is not None else typ)) if a is None else a
        b = pa.nulls(len(odd), a.type) if b is None else b.cast(a.type)
        merged[name] = pa.concat_arrays([a, b]).take(take)
    return merged


def scan_lines(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool] | None:
    """The compiled chunk pass (``cp_lines``, chunkpass.c) over `data`: line offsets (int32), per line the not-plain,
    colour and non-blank flags (uint8), and whether the bytes are valid UTF-8; None where the library is off or the
    data is 2 GiB or more. (:class:`~spectrial.logs.chunks.Chunk` reads with it through ``chunks.SCAN``.)"""
    lib = library()
    if lib is None or len(data) >= 2**31 - 1:
        return None
    raw = np.frombuffer(data, np.uint8) if data else np.zeros(1, np.uint8)
    utf8 = ctypes.c_int32(0)
    cap = len(data) // 32 + 16  # room for lines of 32 bytes on average; counted exactly where they are shorter
    for _ in range(2):
        offs = np.empty(cap + 1, np.int32)
        bad, colour, nonblank = (np.empty(cap, np.uint8) for _ in range(3))
        n = lib.cp_lines(raw.ctypes.data, len(data), offs.ctypes.data, cap, bad.ctypes.data, colour.ctypes.data,
                         nonblank.ctypes.data, ctypes.byref(utf8))
        if n >= 0:
            return offs[:n + 1], bad[:n], colour[:n], nonblank[:n], bool(utf8.value)
        cap = data.count(b"\n") + 1
    return None


def count_lines(data: bytes) -> int:
    """The lines of `data` (its newlines, and a last line without one), as ``len(line_offsets(data)) - 1``:
    compiled (``cp_count_lines``, memchr) where the library is on."""
    lib = library()
    if lib is None or not data:
        return data.count(b"\n") + (data[-1:] not in (b"", b"\n"))
    raw = np.frombuffer(data, np.uint8)
    return int(lib.cp_count_lines(raw.ctypes.data, len(data)))


chunks.SCAN[:] = [scan_lines]
