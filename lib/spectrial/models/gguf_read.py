"""Fast GGUF header reader: key/values and tensor infos, without touching tensor data.

``gguf.GGUFReader`` builds a numpy view per array element and needs ~18 s for the 128256-token Llama-3
vocabulary; this reads the same header (GGUF v2/v3, little-endian) in well under a second.
Output: ``GGUFHeader(version, kv: dict[str, GGUFValue], tensors: list[TensorInfo], data_offset)``; string arrays
become ``list[str]``, numeric arrays ``list`` of Python numbers.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from spectrial.errors import ParseError

_MAGIC = b"GGUF"
# GGUFValueType id -> (struct format, numpy dtype) for the fixed-size scalar types.
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"),
    1: ("<b", "<i1"),
    2: ("<H", "<u2"),
    3: ("<h", "<i2"),
    4: ("<I", "<u4"),
    5: ("<i", "<i4"),
    6: ("<f", "<f4"),
    7: ("<?", "?"),
    10: ("<Q", "<u8"),
    11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
_STRING, _ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry; ``shape`` is in numpy order (outermost first)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def n_elements(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))


GGUFValue = str | int | float | bool | list["GGUFValue"]  # a metadata value (arrays as Python lists)


@dataclass
class GGUFHeader:
    """Everything before the tensor data."""

    version: int
    kv: dict[str, GGUFValue] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)
    data_offset: int = 0


class _Buf:
    """Sequential reader over a memory-mapped file."""

    def __init__(self, mm: mmap.mmap) -> None:
        self.mm, self.pos = mm, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.mm):
            raise ParseError(f"truncated GGUF header at byte {self.pos} (wanted {n} more bytes)")
        b = self.mm[self.pos : self.pos + n]
        self.pos += n
        return b

    def u32(self) -> int:
        v = _U32.unpack_from(self.mm, self.pos)[0]
        self.pos += 4
        return v

    def u64(self) -> int:
        v = _U64.unpack_from(self.mm, self.pos)[0]
        self.pos += 8
        return v

    def string(self) -> str:
        return self.take(self.u64()).decode("utf-8", errors="replace")

    def strings(self, count: int) -> list[str]:
        out, mm, pos, unpack = [], self.mm, self.pos, _U64.unpack_from
        for _ in range(count):
            n = unpack(mm, pos)[0]
            out.append(mm[pos + 8 : pos + 8 + n].decode("utf-8", errors="replace"))
            pos += 8 + n
        self.pos = pos
        return out

    def value(self, vtype: int) -> GGUFValue:
        if vtype in _SCALARS:
            fmt = _SCALARS[vtype][0]
            return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.u32(), self.u64()
            if etype in _SCALARS:
                dt = np.dtype(_SCALARS[etype][1])
                return np.frombuffer(self.take(dt.itemsize * count), dtype=dt).tolist()
            if etype == _STRING:
                return self.strings(count)
            return [self.value(etype) for _ in range(count)]
        raise ParseError(f"unknown GGUF value type {vtype} at byte {self.pos}")


def read_header(path: str | Path) -> GGUFHeader:
    """Parse a GGUF file's header (magic, version, key/values, tensor infos) without reading tensor data."""
    path = Path(path)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        b = _Buf(mm)
        if len(mm) < 24 or b.take(4) != _MAGIC:
            raise ParseError(f"{path}: not a GGUF file (bad magic)")
        hdr = GGUFHeader(version=b.u32())
        if hdr.version not in (2, 3):
            raise ParseError(f"{path}: unsupported GGUF version {hdr.version}")
        n_tensors, n_kv = b.u64(), b.u64()
        try:
            for _ in range(n_kv):
                key = b.string()
                hdr.kv[key] = b.value(b.u32())
            for _ in range(n_tensors):
                name = b.string()
                dims = [b.u64() for _ in range(b.u32())]
                hdr.tensors.append(
                    TensorInfo(name=name, shape=tuple(reversed(dims)), ggml_type=b.u32(), offset=b.u64())
                )
        except struct.error as e:
            raise ParseError(f"{path}: truncated GGUF header at byte {b.pos}") from e
        align = int(hdr.kv.get("general.alignment", 32))
        hdr.data_offset = -(-b.pos // align) * align
    return hdr


def describe(path: str | Path) -> dict[str, GGUFValue | None]:
    """Model identity from a GGUF header: arch, name, layers, n_embd, n_ff, heads, vocab, params, bytes.

    For EAGLE-3 drafts also ``target_layers`` and ``target_hidden_size``. Reads only the header, so it is
    quick even for a 16 GB file.
    """
    path = Path(path)
    hdr = read_header(path)
    kv = hdr.kv
    arch = kv.get("general.architecture", "")
    tokens = kv.get("tokenizer.ggml.tokens")
    out: dict[str, GGUFValue | None] = {
        "path": str(path),
        "arch": arch,
        "name": kv.get("general.name"),
        "n_layer": kv.get(f"{arch}.block_count"),
        "n_embd": kv.get(f"{arch}.embedding_length"),
        "n_ff": kv.get(f"{arch}.feed_forward_length"),
        "n_head": kv.get(f"{arch}.attention.head_count"),
        "n_head_kv": kv.get(f"{arch}.attention.head_count_kv"),
        "n_vocab": len(tokens) if tokens is not None else kv.get(f"{arch}.vocab_size"),
        "tokenizer": kv.get("tokenizer.ggml.model"),
        "file_type": kv.get("general.file_type"),
        "n_tensors": len(hdr.tensors),
        "n_params": sum(t.n_elements for t in hdr.tensors),
        "file_bytes": path.stat().st_size,
        "gguf_version": hdr.version,
    }
    if f"{arch}.target_layers" in kv:
        out["target_layers"] = list(kv[f"{arch}.target_layers"])
        out["target_hidden_size"] = kv.get(f"{arch}.target_hidden_size")
    return out
