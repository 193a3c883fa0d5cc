"""What one decoded token reads from memory: the target's weights and its KV cache per token of context.

At batch 1 every decode step streams every weight the step multiplies by (all matrices but the token embedding,
which is a row lookup; where the output head is tied to the embedding, that matrix is streamed as the head) and
the KV cache read so far. Read from the files' headers only (no tensor data):

    GGUF           the tensors' byte extents (successive offsets in the data section), less `token_embd.weight`
                   where an `output.weight` exists; KV per token from `<arch>.block_count`, `head_count_kv` and the
                   head size (embedding_length / head_count), f16 cache (llama.cpp's default)
    Hugging Face   the safetensors headers' `data_offsets` of every shard, less `*embed_tokens.weight` unless the
                   embeddings are tied (`tie_word_embeddings`); KV per token from config.json
                   (num_hidden_layers, num_key_value_heads, head_dim or hidden_size / num_attention_heads) at the
                   model's dtype (2 bytes for bf16/fp16, 4 for float32)

`streamed(path)` returns `Streamed(weights_bytes, kv_bytes_per_token, how)` or None when the files cannot say.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectrial.errors import ParseError
from spectrial.models.gguf_read import read_header

HEADER_CAP = 100 << 20  # a safetensors header larger than this is not a model's (a hostile or damaged file)
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "float8_e4m3fn": 1}


@dataclass(frozen=True)
class Streamed:
    """Bytes one decode step of one sequence reads: the weights, and the KV cache per token of its context."""

    weights_bytes: float
    kv_bytes_per_token: float | None
    how: str


def _gguf(path: Path) -> Streamed:
    hdr = read_header(path)
    kv = hdr.kv
    data = path.stat().st_size - hdr.data_offset
    ordered = sorted(hdr.tensors, key=lambda t: t.offset)
    sizes = {t.name: (nxt.offset if nxt is not None else data) - t.offset
             for t, nxt in zip(ordered, [*ordered[1:], None], strict=True)}
    total = float(sum(sizes.values()))
    tied = "output.weight" not in sizes
    embd = 0.0 if tied else float(sizes.get("token_embd.weight", 0))
    arch = kv.get("general.architecture", "")
    layers, heads = kv.get(f"{arch}.block_count"), kv.get(f"{arch}.attention.head_count")
    kv_heads, width = kv.get(f"{arch}.attention.head_count_kv", heads), kv.get(f"{arch}.embedding_length")
    per_token = None
    if all(isinstance(x, int) and x > 0 for x in (layers, heads, kv_heads, width)):
        per_token = 2.0 * layers * kv_heads * (width // heads) * 2  # K and V, f16
    how = (f"GGUF {path.name}: {total / 1e6:.1f} MB of tensors" + ("" if tied else
           f" less the token embedding ({embd / 1e6:.1f} MB, a row lookup)") + "; KV f16 from its header")
    return Streamed(total - embd, per_token, how)


def _safetensors_bytes(path: Path) -> dict[str, int]:
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > HEADER_CAP:
            raise ParseError(f"{path}: safetensors header of {n} bytes (over {HEADER_CAP}): not a model file")
        header: dict[str, Any] = json.loads(f.read(n))
    return {k: int(v["data_offsets"][1]) - int(v["data_offsets"][0]) for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v}


def _hf(folder: Path) -> Streamed | None:
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        return None
    sizes: dict[str, int] = {}
    for s in shards:
        sizes.update(_safetensors_bytes(s))
    cfg_path = folder / "config.json"
    cfg: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    total = float(sum(sizes.values()))
    tied = bool(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)))
    embd = 0.0 if tied else float(sum(v for k, v in sizes.items() if k.endswith("embed_tokens.weight")))
    layers, heads = text.get("num_hidden_layers"), text.get("num_attention_heads")
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or (text["hidden_size"] // heads if text.get("hidden_size") and heads else None)
    width = _DTYPE_BYTES.get(str(text.get("torch_dtype") or cfg.get("torch_dtype") or "bfloat16"), 2)
    per_token = 2.0 * layers * kv_heads * head_dim * width \
        if all(isinstance(x, int) and x > 0 for x in (layers, kv_heads, head_dim)) else None
    how = (f"safetensors in {folder.name}: {total / 1e6:.1f} MB of tensors" + ("" if tied or not embd else
           f" less the token embedding ({embd / 1e6:.1f} MB, a row lookup)") + "; KV from config.json")
    return Streamed(total - embd, per_token, how)


def streamed(path: str | Path) -> Streamed | None:
    """The target's bytes per decode step (see the module docstring); None when `path` is neither a GGUF file nor a
    folder of safetensors, or its headers cannot be read."""
    p = Path(path)
    try:
        if p.is_file() and p.suffix == ".gguf":
            return _gguf(p)
        if p.is_dir():
            return _hf(p)
    except (OSError, ValueError, KeyError, TypeError, ParseError, struct.error):
        return None
    return None
