"""Write safetensors files tensor by tensor, chunk by chunk, so memory stays bounded at any model size.

A tensor is described by its name, shape, safetensors dtype and a ``rows(a, b)`` function returning rows
``[a, b)`` of its first axis (for 1-D tensors: elements). The header is written first (every size is
known), then each tensor's bytes in chunks of about ``CHUNK_ELEMS`` elements. The result is read back
with the ``safetensors`` library's header parser as a check.

Random bf16 weights are made from random bits, not sampled floats: sign and 7 mantissa bits random, the
exponent 2^-7 or 2^-6 (one random bit), so every value lies in ±[0.0078, 0.031) (rms ~0.018). That runs at
memory speed. Values are a pure function of (seed, key, block), blocks of ``BLOCK_ELEMS`` elements, so
any row range - or an arbitrary row gather - can be regenerated without writing the whole tensor.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CHUNK_ELEMS = 1 << 23  # elements per write (16 MB of bf16)
BLOCK_ELEMS = 1 << 20  # elements per random block (the unit of reproducibility)
NP_DTYPES: dict[str, type[np.generic]] = {"BF16": np.uint16, "I64": np.int64, "BOOL": np.bool_, "F32": np.float32}
BF16_ONE = 0x3F80
_SIGN_EXP_LOW_MANTISSA = 0x80FF  # keep sign, lowest exponent bit, 7 mantissa bits
_EXP_2_MINUS_7 = 0x3C00  # exponent field 120 (low bit clear): 2^-7

Rows = Callable[[int, int], np.ndarray]


@dataclass(frozen=True)
class Tensor:
    """One tensor to write: ``rows(a, b)`` returns rows [a, b) of axis 0 in the storage dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    rows: Rows

    @property
    def row_elems(self) -> int:
        """Elements per row of axis 0."""
        return int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tensor."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(NP_DTYPES[self.dtype]).itemsize


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> float32, exact."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


class RandomBf16:
    """A reproducible random bf16 tensor: ``rows`` for streaming, ``take`` for row gathers."""

    def __init__(self, seed: int, key: str, shape: tuple[int, ...], scale: float = 1.0) -> None:
        self.seed, self.key, self.shape, self.scale = seed, key, shape, scale
        self.n_rows = shape[0]
        self.row_elems = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        self.block_rows = max(1, BLOCK_ELEMS // self.row_elems)
        self._key_hash = zlib.crc32(key.encode())

    def _block(self, b: int) -> np.ndarray:
        n = min(self.block_rows, self.n_rows - b * self.block_rows)
        rng = np.random.Generator(np.random.PCG64([self.seed, self._key_hash, b]))
        raw = np.frombuffer(rng.bytes(2 * n * self.row_elems), dtype=np.uint16)
        bits = (raw & _SIGN_EXP_LOW_MANTISSA) | _EXP_2_MINUS_7
        if self.scale != 1.0:
            bits = f32_to_bf16(bf16_to_f32(bits) * np.float32(self.scale))
        return bits.reshape(n, self.row_elems)

    def take(self, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` (any order, repeats allowed), shaped (len(idx), *shape[1:])."""
        idx = np.asarray(idx, dtype=np.int64)
        out = np.empty((len(idx), self.row_elems), dtype=np.uint16)
        blocks = idx // self.block_rows
        for b in np.unique(blocks):
            sel = blocks == b
            out[sel] = self._block(int(b))[idx[sel] - b * self.block_rows]
        return out.reshape((len(idx), *self.shape[1:]))

    def rows(self, a: int, b: int) -> np.ndarray:
        """Rows [a, b)."""
        return self.take(np.arange(a, b))

    def tensor(self, name: str, dtype: str = "BF16") -> Tensor:
        """This source as a Tensor called ``name``."""
        return Tensor(name, self.shape, dtype, self.rows)


def const_tensor(name: str, shape: tuple[int, ...], value: float = 0.0) -> Tensor:
    """A bf16 tensor filled with ``value`` (0 and 1 are exact)."""
    bits = int(f32_to_bf16(np.array([value], dtype=np.float32))[0])
    return Tensor(name, shape, "BF16", lambda a, b: np.full((b - a, *shape[1:]), bits, dtype=np.uint16))


def array_tensor(name: str, array: np.ndarray, dtype: str) -> Tensor:
    """A small tensor held in memory (``array`` already in the storage dtype of ``dtype``)."""
    arr = np.ascontiguousarray(array, dtype=NP_DTYPES[dtype])
    return Tensor(name, tuple(arr.shape), dtype, lambda a, b: arr[a:b])


def write_safetensors(path: str | Path, tensors: list[Tensor], metadata: dict[str, str] | None = None) -> int:
    """Stream ``tensors`` into a safetensors file at ``path``; returns its size in bytes."""
    path = Path(path)
    header: dict[str, object] = {"__metadata__": {"format": "pt", **(metadata or {})}}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with path.open("wb") as fh:
        fh.write(len(head).to_bytes(8, "little"))
        fh.write(head)
        for t in tensors:
            step = max(1, CHUNK_ELEMS // t.row_elems)
            written = 0
            for a in range(0, t.shape[0], step):
                chunk = np.ascontiguousarray(t.rows(a, min(a + step, t.shape[0])), dtype=NP_DTYPES[t.dtype])
                fh.write(chunk.tobytes())
                written += chunk.nbytes
            if written != t.nbytes:
                raise ValueError(f"{path}: tensor {t.name} produced {written} bytes, expected {t.nbytes}")
    size = path.stat().st_size
    _check(path, tensors)
    return size


def _check(path: Path, tensors: list[Tensor]) -> None:
    """Parse the written header with the safetensors library and compare names, dtypes and shapes."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        for t in tensors:
            sl = f.get_slice(t.name)
            if sl.get_dtype() != t.dtype or tuple(sl.get_shape()) != t.shape:
                raise ValueError(f"{path}: {t.name} reads back as {sl.get_dtype()} {sl.get_shape()}")


def read_bf16(path: str | Path, name: str) -> np.ndarray:
    """A bf16 tensor of a safetensors file as float32 (numpy has no bfloat16; the bytes are read directly)."""
    path = Path(path)
    with path.open("rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        entry = json.loads(fh.read(n))[name]
        if entry["dtype"] != "BF16":
            raise ValueError(f"{path}: {name} is {entry['dtype']}, not BF16")
        a, b = entry["data_offsets"]
        fh.seek(8 + n + a)
        bits = np.frombuffer(fh.read(b - a), dtype=np.uint16)
    return bf16_to_f32(bits).reshape(entry["shape"])
