"""The toolkit of vectorised block readers (:attr:`BlockFormat.vector
<spectrial.logs.formats.BlockFormat>`): walk all of a chunk's blocks of a format at once, classify and split
their lines with arrow kernels, answer :class:`~spectrial.logs.formats.Blocks`.

A reader mirrors its format's Python function: :func:`scan` is the ``while (s := w[k]) is not None`` loop over
every block at once, `classify` the loop body's decisions as codes (:data:`ROW`, :data:`SKIP`, :data:`LAST`,
:data:`STOP`); the helpers here are the string methods such loops use (``partition``, ``split``, ``strip``,
``lstrip()[:1]``, a table row's cells), with Python's semantics on plain text (the driver gives a reader
plain blocks only). A state the loop carries from line to line (a key seen twice, the last value of a
label) is applied afterwards, per block, with numpy (:func:`first_where`, :func:`last_per`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spectrial.logs.chunks import MAX_BLOCK_LINES, Chunk

STOP, ROW, SKIP, LAST = 0, 1, 2, 3
_END, _MORE = -1, -2


@dataclass
class Scan:
    """Lines read by :func:`scan`. Per consumed line: `block`, `offset`, `code`, `text` (with its newline).
    Per block: `end`
    (offset of the first line not consumed: the reference loop's final `k`), `examined` (offsets read)
    and `more` (the block runs past the chunk)."""

    block: np.ndarray
    offset: np.ndarray
    code: np.ndarray
    text: pa.Array
    end: np.ndarray
    examined: np.ndarray
    more: np.ndarray

    def rows(self, code: int = ROW) -> np.ndarray:
        """Indexes of the consumed lines with `code`."""
        return np.flatnonzero(self.code == code)


Classify = Callable[[pa.Array, np.ndarray, np.ndarray], np.ndarray]


def scan(chunk: Chunk, at: np.ndarray, classify: Classify, start: int = 1, first: int = 16, grow: int = 2) -> Scan:
    """Walk each block's lines from offset `start` on, as a loop ``while (s := w[k]) is not None`` would.

    ``classify(text, block, offset)`` gives each line (with its newline) a code: :data:`ROW` or :data:`SKIP`
    (consumed, the walk goes on), :data:`LAST` (consumed, the walk stops) or :data:`STOP` (not consumed,
    the walk stops). A walk also stops at the input's end or 20000 lines from the marker; it is marked
    `more` where it reaches the end of a chunk that is not the last. Lines are read in growing windows
    (`first` lines, then `grow` times as many), so the work follows the blocks' lengths: pick `first`
    near a typical block's length.
    """
    nb = len(at)
    end = np.zeros(nb, np.int64)
    examined = np.zeros(nb, np.int64)
    more = np.zeros(nb, dtype=bool)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, pa.Array]] = []
    active = np.arange(nb)
    lo, width = start, first
    while len(active):
        hi = min(lo + width, MAX_BLOCK_LINES)
        if hi <= lo:
            end[active] = lo
            examined[active] = lo
            break
        w = hi - lo
        blk = np.repeat(active, w)
        off = np.tile(np.arange(lo, hi), len(active))
        idx = at[blk] + off
        inside = idx < chunk.n
        code = np.full(len(idx), _END if chunk.final else _MORE, np.int64)
        isel = np.flatnonzero(inside)
        text = chunk.texts(idx[isel])
        if len(isel):
            code[isel] = classify(text, blk[isel], off[isel])
        grid = code.reshape(len(active), w)
        term = (grid == STOP) | (grid == LAST) | (grid < 0)
        has = term.any(axis=1)
        j = np.where(has, term.argmax(axis=1), w)
        tcode = grid[np.arange(len(active)), np.minimum(j, w - 1)]
        stops = has & (tcode == LAST)
        k_end = lo + j + stops  # consumed up to here
        consumed = (np.arange(w)[None, :] < (j + stops)[:, None]).ravel()
        csel = np.flatnonzero(consumed & inside)
        if len(csel):
            pos = np.full(len(idx), -1, np.int64)
            pos[isel] = np.arange(len(isel))
            parts.append((blk[csel], off[csel], code[csel], text.take(pa.array(pos[csel]))))
        done = active[has]
        end[done] = k_end[has]
        examined[done] = (lo + j + ((tcode == STOP) | (tcode == LAST)))[has]
        more[done] = (tcode == _MORE)[has]
        active = active[~has]
        lo, width = hi, width * grow
    if len(parts) == 1:  # one window: already in block, then offset order
        b, o, c, t = parts[0]
        return Scan(b, o, c, t, end, examined, more)
    if parts:
        b, o, c = (np.concatenate([p[i] for p in parts]) for i in range(3))
        t = pa.concat_arrays([p[3] for p in parts])
        order = np.lexsort((o, b))
        return Scan(b[order], o[order], c[order], t.take(pa.array(order)), end, examined, more)
    return Scan(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), pa.array([], pa.string()),
                end, examined, more)


def first_where(block: np.ndarray, offset: np.ndarray, mask: np.ndarray, nblocks: int) -> np.ndarray:
    """Per block: the smallest `offset` of its lines where `mask` holds (a large number where none)."""
    out = np.full(nblocks, np.iinfo(np.int64).max, np.int64)
    sel = np.flatnonzero(mask)
    np.minimum.at(out, block[sel], offset[sel])
    return out


def last_per(block: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Indexes of the last entry of each (block, key) pair, in entry order (entries sorted by block)."""
    if not len(block):
        return np.zeros(0, np.int64)
    order = np.lexsort((np.arange(len(block)), key, block))
    b, k = block[order], key[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (b[1:] != b[:-1]) | (k[1:] != k[:-1])
    return np.sort(order[last])


def texts_at(chunk: Chunk, at: np.ndarray, k: int) -> tuple[pa.Array, np.ndarray]:
    """Lines ``at + k`` (with their newline) and a mask of those inside the chunk ("" outside)."""
    idx = at + k
    inside = (idx >= 0) & (idx < chunk.n)
    out = np.full(len(at), "", object)
    sel = np.flatnonzero(inside)
    if len(sel):
        out[sel] = chunk.texts(idx[sel]).to_numpy(zero_copy_only=False)
    return pa.array(out, pa.string()), inside


def float_column(n: int, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A float64 record column: NaN, with `values` at `rows`."""
    out = np.full(n, np.nan)
    out[rows] = values
    return out


def object_column(n: int, rows: np.ndarray, values: Any) -> np.ndarray:
    """An object record column: None, with `values` at `rows`."""
    out = np.empty(n, object)
    out[rows] = values
    return out


def to_str_numpy(arr: pa.Array) -> np.ndarray:
    """An arrow string array as an object array of str (None for nulls)."""
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=object)


def split_once(text: pa.Array, sep: str) -> tuple[pa.Array, pa.Array]:
    """``s.partition(sep)`` of each string: (head, tail), tail null where `sep` is absent."""
    parts = pc.split_pattern(text, sep, max_splits=1)
    offs = parts.offsets.to_numpy(zero_copy_only=False)
    flat = parts.values
    lens = np.diff(offs)
    head = flat.take(pa.array(offs[:-1]))
    tail_at = offs[:-1] + 1
    tail = flat.take(pa.array(tail_at, mask=lens < 2))
    return head, tail


def head_char(text: pa.Array) -> pa.Array:
    """``s.lstrip()[:1]`` of each (plain) string."""
    return pc.utf8_slice_codeunits(pc.ascii_ltrim_whitespace(text), 0, 1)


def np_bool(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean arrow array as numpy (null -> False)."""
    return pc.fill_null(arr, False).to_numpy(zero_copy_only=False)


def np_int(arr: pa.Array) -> np.ndarray:
    """An integer arrow array as int64 numpy (null -> -1)."""
    return pc.fill_null(arr, -1).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def lookup(values: pa.Array, fn: Callable[[str], Any], names: list[str]) -> np.ndarray:
    """``names.index(fn(v))`` of each string (-1 where fn gives None or a name not in `names`), calling
    `fn` once per distinct string."""
    if not len(values):
        return np.zeros(0, np.int64)
    enc = pc.dictionary_encode(values)
    index = {n: i for i, n in enumerate(names)}
    ids = np.array([index.get(fn(v), -1) if v is not None else -1 for v in enc.dictionary.to_pylist()] + [-1],
                   np.int64)
    codes = np_int(enc.indices)
    return ids[codes]


def cells_of(text: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """The ``|``-separated cells of each (plain) line, stripped, one leading and one trailing ``|`` dropped
    (a markdown or grid table row): (all cells in order, cells per line)."""
    t = pc.ascii_trim_whitespace(text)
    lead = pc.starts_with(t, "|")
    t = pc.if_else(lead, pc.utf8_slice_codeunits(t, 1), t)
    t = pc.if_else(pc.ends_with(t, "|"), pc.utf8_slice_codeunits(t, 0, -1), t)
    parts = pc.split_pattern(t, "|")
    counts = np.diff(parts.offsets.to_numpy(zero_copy_only=False))
    return pc.ascii_trim_whitespace(parts.values), counts


def split_ws(text: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """``s.split()`` of each (plain) string: (all tokens in order, tokens per string, index of each
    string's first token)."""
    t = pc.ascii_trim_whitespace(text)
    parts = pc.ascii_split_whitespace(t)
    offs = parts.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    counts = np.diff(offs)
    empty = np_bool(pc.equal(t, ""))
    if empty.any():  # "" splits into [""]: no tokens
        keep = np.ones(len(parts.values), dtype=bool)
        keep[offs[:-1][empty]] = False
        counts = np.where(empty, 0, counts)
        tokens = parts.values.filter(pa.array(keep))
    else:
        tokens = parts.values
    first = np.concatenate(([0], np.cumsum(counts)))[:-1]
    return tokens, counts, first


def first_group(text: pa.Array, pattern: str) -> pa.Array:
    """The first capture group of `pattern`'s leftmost match in each string (null where none; every group
    of `pattern` must be named)."""
    return pc.struct_field(pc.extract_regex(text, pattern), [0])
