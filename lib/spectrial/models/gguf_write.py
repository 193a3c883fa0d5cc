"""Streaming GGUF writer for random-weight models: header first, then tensor data chunk by chunk.

Each tensor is described by a ``TensorSpec`` (name, numpy shape, dtype, init, std, scale). Its data is a
pure function of (seed, name, spec), so two files that name the same tensor with the same spec hold
identical bytes: that is how a draft shares the target's embeddings, first layers and output head.
Memory stays at one chunk (4 Mi elements) whatever the file size.

Fills: ``normal`` draws N(0, std*scale) per tensor from ``numpy.random.default_rng([seed, crc32(name)])``
(~40 M values/s on one core); ``tile`` cuts each tensor from one pre-drawn block of N(0, 1) values
at a per-tensor random offset (disk speed; values repeat with a period of ~4.2 M elements, fine for timing
work on big shapes); ``ones`` is for norm weights.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import gguf
import numpy as np

Fill = Literal["normal", "tile"]
CHUNK_ELEMS = 1 << 22
_POOL_ELEMS = 4_194_301  # a prime, so rows of power-of-two widths do not line up with the period


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to generate: numpy shape (out, in), dtype, init and amplitude."""

    name: str
    shape: tuple[int, ...]
    dtype: type[np.floating] = np.float16
    init: Literal["random", "ones"] = "random"
    std: float = 0.02
    scale: float = 1.0

    @property
    def n_elements(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes of data."""
        return self.n_elements * np.dtype(self.dtype).itemsize


@functools.lru_cache(maxsize=8)
def _pool(seed: int, dtype: str, amp: float) -> np.ndarray:
    """The pre-drawn block that ``tile`` cuts tensors from (cached per seed, dtype and amplitude)."""
    rng = np.random.default_rng([seed, 0x7113])
    block = rng.standard_normal(_POOL_ELEMS, dtype=np.float32)
    block *= np.float32(amp)
    return block.astype(dtype)


def _chunks(spec: TensorSpec, seed: int, fill: Fill) -> Iterator[np.ndarray]:
    """Yield the tensor's data, flat, in chunks of at most CHUNK_ELEMS elements."""
    n, dt = spec.n_elements, np.dtype(spec.dtype)
    if spec.init == "ones":
        for start in range(0, n, CHUNK_ELEMS):
            yield np.ones(min(CHUNK_ELEMS, n - start), dtype=dt)
        return
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    amp = spec.std * spec.scale
    if fill == "normal":
        for start in range(0, n, CHUNK_ELEMS):
            x = rng.standard_normal(min(CHUNK_ELEMS, n - start), dtype=np.float32)
            x *= np.float32(amp)
            yield x if dt == np.float32 else x.astype(dt)
        return
    pool = _pool(seed, dt.str, float(amp))
    pos = int(rng.integers(_POOL_ELEMS))
    left = n
    while left:
        m = min(left, _POOL_ELEMS - pos, CHUNK_ELEMS)
        yield pool[pos : pos + m]
        pos, left = (pos + m) % _POOL_ELEMS, left - m


def tensor_data(spec: TensorSpec, seed: int, fill: Fill = "normal") -> np.ndarray:
    """The whole tensor in memory, shaped (tests and small tensors only)."""
    return np.concatenate(list(_chunks(spec, seed, fill))).reshape(spec.shape)


def file_type_of(specs: Sequence[TensorSpec]) -> int:
    """general.file_type: 1 (mostly F16) if any 2-D tensor is f16, else 0 (all F32)."""
    return int(any(len(s.shape) > 1 and np.dtype(s.dtype) == np.float16 for s in specs))


_ARRAY_DTYPES = {
    gguf.GGUFValueType.INT32: "<i4",
    gguf.GGUFValueType.UINT32: "<u4",
    gguf.GGUFValueType.FLOAT32: "<f4",
}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


class _FastWriter(gguf.GGUFWriter):
    """GGUFWriter that packs long metadata arrays (a 128256-token vocabulary, 280147 merges) in bulk.

    gguf's own ``_pack_val`` packs them item by item (~9 s per file for the Llama-3 vocabulary); the bytes
    are the same (checked against ``gguf.GGUFReader`` in tests/models/test_models.py).
    """

    def _pack_val(
        self, val: Any, vtype: gguf.GGUFValueType, add_vtype: bool, sub_type: gguf.GGUFValueType | None = None
    ) -> bytes:
        if vtype != gguf.GGUFValueType.ARRAY or len(val) < 256 or self.endianess != gguf.GGUFEndian.LITTLE:
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        ltype = sub_type if sub_type is not None else gguf.GGUFValueType.get_type(val[0])
        if ltype != gguf.GGUFValueType.STRING and ltype not in _ARRAY_DTYPES:
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        head = _U32.pack(vtype) if add_vtype else b""
        return head + _U32.pack(ltype) + _U64.pack(len(val)) + _packed_items(val, ltype)


# id(list) -> (the list, its packed items): one vocabulary is packed once for the 3 files of a set.
_PACKED: dict[int, tuple[Sequence[Any], bytes]] = {}


def _packed_items(val: Sequence[Any], ltype: gguf.GGUFValueType) -> bytes:
    hit = _PACKED.get(id(val))
    if hit is not None and hit[0] is val:
        return hit[1]
    if ltype == gguf.GGUFValueType.STRING:
        enc = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in val]
        body = b"".join(itertools.chain.from_iterable((_U64.pack(len(e)), e) for e in enc))
    else:
        body = np.asarray(val, dtype=_ARRAY_DTYPES[ltype]).tobytes()
    if len(_PACKED) >= 8:
        _PACKED.clear()
    _PACKED[id(val)] = (val, body)
    return body


class _HashingFile:
    """File wrapper that sha256-hashes everything written through it (GGUFWriter needs only these methods)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.h = f, hashlib.sha256()

    def write(self, b: bytes | memoryview) -> int:
        self.h.update(b)
        return self.f.write(b)

    def tell(self) -> int:
        return self.f.tell()

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        self.f.close()


@dataclass(frozen=True)
class Written:
    """What ``write_gguf`` wrote."""

    path: Path
    nbytes: int
    sha256: str


def write_gguf(
    path: str | Path,
    arch: str,
    add_keys: Callable[[gguf.GGUFWriter], None],
    specs: Sequence[TensorSpec],
    *,
    seed: int,
    fill: Fill = "normal",
) -> Written:
    """Write one GGUF file: ``add_keys`` adds the metadata, then each spec's data is streamed and hashed."""
    path = Path(path)
    w = _FastWriter(path, arch)
    try:
        add_keys(w)
        w.add_file_type(file_type_of(specs))
        for s in specs:
            w.add_tensor_info(s.name, s.shape, np.dtype(s.dtype), s.nbytes)
        w.open_output_file()
        assert w.fout is not None
        fout = _HashingFile(w.fout[0])
        w.fout = [fout]  # type: ignore[list-item]
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        w.write_padding(fout, fout.tell())  # type: ignore[arg-type]
        for s in specs:
            for chunk in _chunks(s, seed, fill):
                fout.write(memoryview(np.ascontiguousarray(chunk)).cast("B"))
            w.write_padding(fout, s.nbytes)  # type: ignore[arg-type]
        fout.flush()
    finally:
        w.close()
    return Written(path=path, nbytes=path.stat().st_size, sha256=fout.h.hexdigest())
