"""The compiled block readers: a BlockFormat's reader in C (``bp_<name>`` in ``<name>.c`` beside this file, on the
shared part in ``blockpass.c``), answering :class:`~spectrial.logs.formats.Blocks` for all of a chunk's marker
lines in one call.

A format registers ``vector=reader(spec, arrow_reader)``: the driver (and the tests) call that one function, which
runs the C reader where the library is on (:func:`spectrial.logs.native.status`) and the arrow reader
(:mod:`spectrial.logs.vector`) otherwise; both give what the format's Python function gives (the reference:
`tests/logs/test_logs_vector.py` holds each to it, with the library on and off). A C reader DECLINEs any block it
is not sure to read as Python does; the driver then asks the Python function.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spectrial.logs.chunks import Chunk
from spectrial.logs.formats import Blocks, VectorBlock
from spectrial.logs.native import _strings, library

_i64, _i32, _p = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p


class _Chunk(ctypes.Structure):
    _fields_ = [("data", _p), ("offs", _p), ("n", _i64), ("final", _i32), ("head", _i32)]


class _Out(ctypes.Structure):
    _fields_ = [("n", _i64), ("cap", _i64), ("nf", _i32), ("ns", _i32), ("nc", _i32),
                ("block", ctypes.POINTER(_i64)), ("offset", ctypes.POINTER(_i64)),
                ("f", ctypes.POINTER(ctypes.c_double)), ("s", ctypes.POINTER(_i32)), ("c", ctypes.POINTER(_i32))]


@dataclass(frozen=True)
class Spec:
    """A C block reader: its name (the function ``bp_<name>``) and the columns of its records, in the order the C
    code numbers them: `floats` (NaN: absent), `strings` (text of the log; None: absent) and `codes` (column ->
    the names its codes stand for; None: absent)."""

    name: str
    floats: tuple[str, ...]  # (`strings` come as arrow string arrays: see Batch)
    strings: tuple[str, ...] = ()
    codes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


_declared: dict[str, Any] = {}
_lock = threading.Lock()


def _function(lib: Any, spec: Spec) -> Any:
    """The C function of `spec`, declared once; None where the library's reader names other columns than `spec`
    (a C file and its Spec out of step: the arrow reader reads instead)."""
    fn = _declared.get(spec.name, _declared)
    if fn is _declared:
        with _lock:
            fn = getattr(lib, f"bp_{spec.name}")
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.POINTER(_Chunk), _p, _i64, _p, _p, _p, ctypes.POINTER(_Out)]
            lib.bp_free.restype = None
            lib.bp_free.argtypes = [ctypes.POINTER(_Out)]
            if columns(lib, spec.name) != "|".join(",".join(c) for c in (spec.floats, spec.strings, spec.codes)):
                fn = None
            _declared[spec.name] = fn
    return fn


def columns(lib: Any, name: str) -> str:
    """The columns the C reader `name` numbers (``bp_<name>_columns``): floats, strings and codes, each
    comma-separated, the three joined by ``|``."""
    return ctypes.cast(ctypes.addressof(ctypes.c_char.in_dll(lib, f"bp_{name}_columns")),
                       ctypes.c_char_p).value.decode()  # type: ignore[union-attr]


def read(spec: Spec, chunk: Chunk, at: np.ndarray) -> Blocks | None:
    """The C reader's answer for the marker lines `at` of `chunk`, or None where it cannot run (no library, a
    chunk of 2 GiB or more, a C reader out of step with `spec`, memory)."""
    lib = library()
    if lib is None or chunk.offs.dtype != np.int32:
        return None
    fn = _function(lib, spec)
    if fn is None:
        return None
    at = np.ascontiguousarray(at, np.int64)
    nb = len(at)
    used, examined, status = (np.zeros(nb, np.int64) for _ in range(3))
    data = np.frombuffer(chunk.data, np.uint8) if chunk.data else np.zeros(1, np.uint8)
    ch = _Chunk(data.ctypes.data, chunk.offs.ctypes.data, chunk.n, int(chunk.final), int(chunk.head))
    out = _Out(0, 0, len(spec.floats), len(spec.strings), len(spec.codes))
    try:
        if fn(ctypes.byref(ch), at.ctypes.data, nb, used.ctypes.data, examined.ctypes.data, status.ctypes.data,
              ctypes.byref(out)) != 0:
            return None
        n = int(out.n)
        cols: dict[str, np.ndarray] = {}
        if n:
            block = np.ctypeslib.as_array(out.block, (n,)).copy()
            offset = np.ctypeslib.as_array(out.offset, (n,)).copy()
            if spec.floats:
                f = np.ctypeslib.as_array(out.f, (n, len(spec.floats)))
                cols.update({c: f[:, j].copy() for j, c in enumerate(spec.floats)})
            if spec.strings:
                s = np.ctypeslib.as_array(out.s, (n, len(spec.strings), 2))
                for j, c in enumerate(spec.strings):  # arrow text, as far as the tables (no Python str per cell)
                    cols[c] = _strings(s[:, j, 0].copy(), s[:, j, 1].copy(), data)
            if spec.codes:
                k = np.ctypeslib.as_array(out.c, (n, len(spec.codes)))
                for j, (c, names) in enumerate(spec.codes.items()):
                    table = np.array([*names, None], object)
                    cols[c] = table[k[:, j]]  # -1: the last entry, None
        else:
            block = offset = np.zeros(0, np.int64)
    finally:
        lib.bp_free(ctypes.byref(out))
    return Blocks(used, examined, block, offset, cols, status)


def reader(spec: Spec, arrow: VectorBlock) -> VectorBlock:
    """A format's vectorised reader: the C reader `spec` where the library is on, else `arrow`."""

    def vector(chunk: Chunk, at: np.ndarray) -> Blocks:
        got = read(spec, chunk, at)
        return arrow(chunk, at) if got is None else got

    vector.__name__ = vector.__qualname__ = f"{spec.name}_vector"
    vector.__doc__ = f"The compiled reader bp_{spec.name}, else {arrow.__name__}."
    vector.arrow = arrow  # type: ignore[attr-defined]  # (the tests hold both to the Python function)
    vector.spec = spec  # type: ignore[attr-defined]
    return vector
