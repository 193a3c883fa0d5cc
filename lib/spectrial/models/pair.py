"""Model sets: a llama target, a plain draft made of the target's own first layers, and an EAGLE-3 draft.

Layouts follow llama.cpp (shared/reference/LLAMACPP.md): numpy shapes are (out, in); norms are f32 ones.
The plain draft ('draft-simple.gguf') holds byte-identical copies of the target's ``token_embd``, first
``draft_layers`` blocks, ``output_norm`` and ``output``: it predicts what the target would predict
without its later blocks. ``tail_scale`` multiplies the residual branches (``attn_output``, ``ffn_down``)
of those later target blocks: 0 makes target == draft (acceptance ~100 %), larger values make them
disagree more. ``embd_scale`` multiplies ``token_embd`` (in both): larger embeddings dominate the
residual stream, so the layers matter less and acceptance rises.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import gguf
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from spectrial.errors import ConfigError
from spectrial.models.gguf_write import Fill, TensorSpec, Written, write_gguf
from spectrial.models.vocab import Vocab

WRITER_VERSION = "2"  # 2: the vocabulary carries a chat template (tokenizer.chat_template)
MANIFEST = "models.json"
FILES = {"target": "target.gguf", "draft_simple": "draft-simple.gguf", "eagle3": "eagle3.gguf"}
_EAGLE3_SEED_SALT = 1_000_003


class LlamaShape(BaseModel):
    """Hyper-parameters of a llama-architecture model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_layer: int = Field(ge=1, description="transformer blocks")
    n_embd: int = Field(ge=8, description="hidden size")
    n_ff: int = Field(ge=8, description="feed-forward size")
    n_head: int = Field(ge=1, description="attention heads")
    n_head_kv: int = Field(ge=1, description="key/value heads (GQA)")
    n_ctx: int = Field(default=4096, ge=64, description="llama.context_length (training context)")
    rope_freq_base: float = Field(default=10000.0, description="llama.rope.freq_base")
    rms_eps: float = Field(default=1e-5, description="llama.attention.layer_norm_rms_epsilon")

    @property
    def head_dim(self) -> int:
        """Size of one attention head."""
        return self.n_embd // self.n_head

    def check(self) -> None:
        """Raise ConfigError if heads do not divide the hidden size evenly."""
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ConfigError(f"shape {self}: n_embd must divide by n_head and n_head by n_head_kv")


SHAPES: dict[str, LlamaShape] = {
    "tiny": LlamaShape(n_layer=16, n_embd=256, n_ff=768, n_head=4, n_head_kv=2, n_ctx=4096),
    "llama3-8b": LlamaShape(
        n_layer=32, n_embd=4096, n_ff=14336, n_head=32, n_head_kv=8, n_ctx=8192, rope_freq_base=500000.0
    ),
}


def get_shape(shape: str | LlamaShape, n_layers: int | None = None) -> LlamaShape:
    """Look a shape up by name (or pass one through), optionally overriding its layer count."""
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise ConfigError(f"shape={shape!r}: unknown; use one of {sorted(SHAPES)} or a LlamaShape")
        shape = SHAPES[shape]
    if n_layers is not None:
        shape = shape.model_copy(update={"n_layer": n_layers})
    shape.check()
    return shape


def default_target_layers(n_layer: int) -> list[int]:
    """EAGLE-3's usual low/middle/high target layers ([2, 16, 29] for 32 layers), clamped and sorted."""
    return sorted(min(max(i, 0), n_layer - 1) for i in (2, n_layer // 2, n_layer - 3))


def llama_specs(
    shape: LlamaShape,
    n_vocab: int,
    *,
    n_layer: int,
    dtype: type[np.floating],
    embd_scale: float,
    tail_from: int,
    tail_scale: float,
) -> list[TensorSpec]:
    """Tensors of a llama model with the first ``n_layer`` blocks of ``shape``; blocks >= tail_from scaled."""
    d, hd = shape.n_embd, shape.head_dim
    specs = [
        TensorSpec("token_embd.weight", (n_vocab, d), dtype, scale=embd_scale),
        TensorSpec("output_norm.weight", (d,), np.float32, "ones"),
        TensorSpec("output.weight", (n_vocab, d), dtype),
    ]
    for i in range(n_layer):
        r = tail_scale if i >= tail_from else 1.0
        b = f"blk.{i}."
        specs += [
            TensorSpec(b + "attn_norm.weight", (d,), np.float32, "ones"),
            TensorSpec(b + "attn_q.weight", (shape.n_head * hd, d), dtype),
            TensorSpec(b + "attn_k.weight", (shape.n_head_kv * hd, d), dtype),
            TensorSpec(b + "attn_v.weight", (shape.n_head_kv * hd, d), dtype),
            TensorSpec(b + "attn_output.weight", (d, shape.n_head * hd), dtype, scale=r),
            TensorSpec(b + "ffn_norm.weight", (d,), np.float32, "ones"),
            TensorSpec(b + "ffn_gate.weight", (shape.n_ff, d), dtype),
            TensorSpec(b + "ffn_up.weight", (shape.n_ff, d), dtype),
            TensorSpec(b + "ffn_down.weight", (d, shape.n_ff), dtype, scale=r),
        ]
    return specs


def eagle3_specs(
    shape: LlamaShape, n_vocab: int, target_hidden: int, *, dtype: type[np.floating]
) -> list[TensorSpec]:
    """Tensors of a one-block EAGLE-3 draft (no token_embd: llama.cpp uses the target's)."""
    d, hd = shape.n_embd, shape.head_dim
    b = "blk.0."
    return [
        TensorSpec("fc.weight", (d, 3 * target_hidden), dtype),
        TensorSpec("output_norm.weight", (d,), np.float32, "ones"),
        TensorSpec("output.weight", (n_vocab, d), dtype),
        TensorSpec(b + "attn_norm.weight", (d,), np.float32, "ones"),
        TensorSpec(b + "attn_norm_2.weight", (d,), np.float32, "ones"),
        TensorSpec(b + "attn_q.weight", (shape.n_head * hd, 2 * d), dtype),
        TensorSpec(b + "attn_k.weight", (shape.n_head_kv * hd, 2 * d), dtype),
        TensorSpec(b + "attn_v.weight", (shape.n_head_kv * hd, 2 * d), dtype),
        TensorSpec(b + "attn_output.weight", (d, shape.n_head * hd), dtype),
        TensorSpec(b + "ffn_norm.weight", (d,), np.float32, "ones"),
        TensorSpec(b + "ffn_gate.weight", (shape.n_ff, d), dtype),
        TensorSpec(b + "ffn_up.weight", (shape.n_ff, d), dtype),
        TensorSpec(b + "ffn_down.weight", (d, shape.n_ff), dtype),
    ]


def _arch_keys(w: gguf.GGUFWriter, name: str, shape: LlamaShape, n_layer: int, vocab: Vocab) -> None:
    w.add_name(name)
    w.add_block_count(n_layer)
    w.add_context_length(shape.n_ctx)
    w.add_embedding_length(shape.n_embd)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_freq_base(shape.rope_freq_base)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_vocab_size(vocab.size)
    w.add_rope_dimension_count(shape.head_dim)
    vocab.add_to(w)


class ModelFile(BaseModel):
    """One written GGUF file."""

    model_config = ConfigDict(extra="forbid")

    file: str = Field(description="file name inside the set's directory")
    arch: str = Field(description="general.architecture")
    n_layer: int = Field(description="block_count")
    bytes: int = Field(description="file size")
    sha256: str = Field(description="sha256 of the whole file")


Knob = str | int | float | bool | list[int] | None  # a generation parameter's value (target_layers: a list)


class ModelSet(BaseModel):
    """A written target + plain draft + EAGLE-3 draft, as recorded in ``models.json``."""

    model_config = ConfigDict(extra="forbid")

    dir: Path = Field(description="directory holding the files and models.json")
    writer_version: str = Field(description="models WRITER_VERSION that wrote the set")
    kind: str = Field(description="'tiny' or the llama shape name")
    seed: int = Field(description="random seed of all weights")
    knobs: dict[str, Knob] = Field(description="every generation parameter (what the cache key hashes)")
    shape: LlamaShape = Field(description="target shape")
    draft_layers: int = Field(description="blocks of the target copied into the plain draft")
    vocab_size: int = Field(description="tokens in the shared vocabulary")
    vocab_source: str = Field(description="'built:spm-N' or the vocab GGUF it was copied from")
    eagle3_target_layers: list[int] = Field(description="eagle3.target_layers")
    files: dict[str, ModelFile] = Field(description="role ('target', 'draft_simple', 'eagle3') -> file")
    write_seconds: float = Field(description="wall time the writer took")

    @property
    def target(self) -> Path:
        """Path of target.gguf."""
        return self.dir / self.files["target"].file

    @property
    def draft_simple(self) -> Path:
        """Path of draft-simple.gguf (use with --spec-type draft-simple)."""
        return self.dir / self.files["draft_simple"].file

    @property
    def eagle3(self) -> Path:
        """Path of eagle3.gguf (use with --spec-type draft-eagle3)."""
        return self.dir / self.files["eagle3"].file

    @property
    def manifest(self) -> Path:
        """Path of models.json."""
        return self.dir / MANIFEST

    def paths(self) -> dict[str, Path]:
        """Role -> path: 'target', 'draft_simple', 'eagle3' and 'manifest' (models.json)."""
        return {**{role: self.dir / f.file for role, f in self.files.items()}, "manifest": self.manifest}

    @classmethod
    def load(cls, directory: str | Path) -> ModelSet:
        """Read ``models.json`` of a written set (its ``dir`` is where it is now)."""
        directory = Path(directory)
        data = json.loads((directory / MANIFEST).read_text())
        data["dir"] = directory
        return cls.model_validate(data)

    def is_complete(self) -> bool:
        """True when every file exists with the recorded size (cheap check; sha256 is not re-hashed)."""
        return all(
            (self.dir / f.file).is_file() and (self.dir / f.file).stat().st_size == f.bytes
            for f in self.files.values()
        )


def write_model_set(
    outdir: str | Path,
    *,
    kind: str,
    shape: LlamaShape,
    vocab: Vocab,
    seed: int,
    draft_layers: int,
    embd_scale: float,
    tail_scale: float,
    dtype: type[np.floating],
    fill: Fill,
    target_layers: list[int] | None,
    knobs: dict[str, Knob],
) -> ModelSet:
    """Write target.gguf, draft-simple.gguf, eagle3.gguf and models.json into ``outdir``."""
    if not 1 <= draft_layers < shape.n_layer:
        raise ConfigError(
            f"draft_layers={draft_layers}: must be in [1, {shape.n_layer - 1}] (< target n_layer)"
        )
    target_layers = default_target_layers(shape.n_layer) if target_layers is None else list(target_layers)
    if len(target_layers) != 3 or not all(0 <= i <= shape.n_layer for i in target_layers):
        raise ConfigError(f"target_layers={target_layers}: need exactly 3 layer ids in [0, {shape.n_layer}]")
    t0 = time.perf_counter()
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    common = {"dtype": dtype, "embd_scale": embd_scale, "tail_from": draft_layers, "tail_scale": tail_scale}
    written: dict[str, tuple[Written, str, int]] = {}

    def llama(role: str, n_layer: int) -> None:
        specs = llama_specs(shape, vocab.size, n_layer=n_layer, **common)
        wr = write_gguf(
            out / FILES[role],
            "llama",
            lambda w: _arch_keys(w, f"spectrial-{kind}-{role}", shape, n_layer, vocab),
            specs,
            seed=seed,
            fill=fill,
        )
        written[role] = (wr, "llama", n_layer)

    def eagle3_keys(w: gguf.GGUFWriter) -> None:
        _arch_keys(w, f"spectrial-{kind}-eagle3", shape, 1, vocab)
        w.add_array("eagle3.target_layers", target_layers)
        w.add_uint32("eagle3.target_hidden_size", shape.n_embd)

    llama("target", shape.n_layer)
    llama("draft_simple", draft_layers)
    wr = write_gguf(
        out / FILES["eagle3"],
        "eagle3",
        eagle3_keys,
        eagle3_specs(shape, vocab.size, shape.n_embd, dtype=dtype),
        seed=seed + _EAGLE3_SEED_SALT,
        fill=fill,
    )
    written["eagle3"] = (wr, "eagle3", 1)
    ms = ModelSet(
        dir=out,
        writer_version=WRITER_VERSION,
        kind=kind,
        seed=seed,
        knobs=knobs,
        shape=shape,
        draft_layers=draft_layers,
        vocab_size=vocab.size,
        vocab_source=vocab.source,
        eagle3_target_layers=target_layers,
        files={
            role: ModelFile(file=w.path.name, arch=arch, n_layer=n, bytes=w.nbytes, sha256=w.sha256)
            for role, (w, arch, n) in written.items()
        },
        write_seconds=round(time.perf_counter() - t0, 3),
    )
    (out / MANIFEST).write_text(ms.model_dump_json(indent=2, exclude={"dir"}) + "\n")
    return ms
