"""Tiny CPU model sets (target + plain draft + EAGLE-3 draft) with tunable real acceptance, and their cache.

The knob: ``accept_knob`` in [0, 1] sets the residual-branch scale of the target's blocks beyond the
draft's (``tail_scale = 1 - accept_knob``). At 1 the target equals its one-block draft; at 0 its later
blocks run at full strength. ``embd_scale`` (default 10) makes token embeddings dominate the residual
stream, which lifts acceptance overall. ``MEASURED_ACCEPTANCE`` holds what llama-server measured. The
vocabulary carries a one-line chat template (``tokenizer.chat_template``, ``spectrial.models.vocab.CHAT_TEMPLATE``),
so llama-server serves ``/v1/chat/completions`` with the model's own template (workload ``request_format: chat``).

Measured on the default set (16 blocks, n_embd 256, f32, seed 0; llama-server 0c1e570 on 2 CPU cores,
``-t 1``, greedy, 3 prompts x 128 tokens; acceptance = draft_n_accepted / draft_n):

| accept_knob | 0 | 0.3 | 0.5 | 0.6 | 0.7 | 0.8 | 0.85 | 0.9 | 0.95 | 0.98 | 1 |
|---|---|---|---|---|---|---|---|---|---|---|---|
| n_max 2 | .05 | .16 | .29 | .40 | .59 | .66 | .81 | .89 | .94 | .98 | 1 |
| n_max 4 | .03 | .08 | .16 | .27 | .40 | .48 | .74 | .72 | .87 | .98 | 1 |
| n_max 8 | .01 | .04 | .08 | .14 | .24 | .32 | .61 | .63 | .80 | .98 | 1 |

Greedy output was identical with and without the draft at every value and n_max 2/4/8 (with f16
weights it was not: batched verification rounds differently on these near-flat distributions).
Does speculation pay on that CPU? Quiet machine, all arms interleaved, 3 rounds x 3 prompts: target
alone 5.1 ms/token (~197 tok/s; f16: 3.0 ms, ~330 tok/s), draft alone 0.3 ms. Speedup of draft-simple
at n_max 2 / 4 / 8: knob 0.5: 0.73 / 0.63 / 0.47 (loses); 0.8: 1.03 / 1.05 / 1.01 (break-even);
0.9: 1.27 / 1.49 / 1.48; 0.95: 1.28 / 1.59 / 2.19; 1.0: 1.30 / 1.70 / 2.21. ``-t 2`` on 2 shared cores
was 10-40x slower than ``-t 1`` whenever anything else ran: use ``-t 1``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spectrial.errors import ConfigError
from spectrial.models.pair import WRITER_VERSION, LlamaShape, ModelSet, write_model_set
from spectrial.models.vocab import build_spm_vocab

DTYPES: dict[str, type[np.floating]] = {"f16": np.float16, "f32": np.float32}
# accept_knob -> {spec-draft-n-max: measured draft-simple acceptance} for the default tiny set (table above).
MEASURED_ACCEPTANCE: dict[float, dict[int, float]] = {
    0.0: {2: 0.048, 4: 0.025, 8: 0.013},
    0.3: {2: 0.161, 4: 0.084, 8: 0.043},
    0.5: {2: 0.286, 4: 0.161, 8: 0.084},
    0.6: {2: 0.395, 4: 0.269, 8: 0.141},
    0.7: {2: 0.586, 4: 0.396, 8: 0.242},
    0.8: {2: 0.657, 4: 0.484, 8: 0.323},
    0.85: {2: 0.813, 4: 0.742, 8: 0.609},
    0.9: {2: 0.89, 4: 0.722, 8: 0.626},
    0.95: {2: 0.936, 4: 0.873, 8: 0.804},
    0.98: {2: 0.984, 4: 0.981, 8: 0.98},
    1.0: {2: 1.0, 4: 1.0, 8: 1.0},
}


class TinySpec(BaseModel):
    """Every parameter of a tiny set; its JSON is hashed into the cache directory name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(default=0, description="random seed of all weights")
    accept_knob: float = Field(
        default=0.9, ge=0.0, le=1.0, description="1 - residual scale of the target blocks beyond the draft's"
    )
    embd_scale: float = Field(
        default=10.0, gt=0.0, description="token_embd amplitude multiplier (both models)"
    )
    draft_layers: int = Field(default=1, ge=1, description="target blocks copied into draft-simple.gguf")
    n_layer: int = Field(default=16, ge=2, description="target blocks")
    n_embd: int = Field(default=256, ge=32, description="hidden size")
    n_ff: int = Field(default=768, ge=32, description="feed-forward size")
    n_head: int = Field(default=4, ge=1, description="attention heads")
    n_head_kv: int = Field(default=2, ge=1, description="key/value heads")
    n_vocab: int = Field(default=4096, ge=260, le=40000, description="tokens of the built SPM vocabulary")
    dtype: Literal["f16", "f32"] = Field(
        default="f32",
        description="weight type of 2-D tensors (f32 keeps batched and one-token greedy decoding identical)",
    )
    target_layers: tuple[int, int, int] | None = Field(
        default=None, description="eagle3.target_layers; None = [2, n_layer//2, n_layer-3] clamped"
    )

    @property
    def tail_scale(self) -> float:
        """Residual-branch scale of target blocks >= draft_layers."""
        return 1.0 - self.accept_knob

    def shape(self) -> LlamaShape:
        """The target's LlamaShape."""
        s = LlamaShape(
            n_layer=self.n_layer,
            n_embd=self.n_embd,
            n_ff=self.n_ff,
            n_head=self.n_head,
            n_head_kv=self.n_head_kv,
            n_ctx=4096,
        )
        s.check()
        return s

    def key(self) -> str:
        """Cache directory name: tiny-<writer version>-<12 hex of the spec's hash>."""
        return f"tiny-{WRITER_VERSION}-{hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]}"


def tiny_spec(**knobs: object) -> TinySpec:
    """Validate knobs into a TinySpec, turning pydantic's error into a ConfigError that names the knob."""
    try:
        return TinySpec(**knobs)  # type: ignore[arg-type]
    except ValidationError as e:
        bad = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"tiny model knobs: {bad} (known knobs: {sorted(TinySpec.model_fields)})") from e


def write_tiny_pair(
    outdir: str | Path,
    *,
    seed: int = 0,
    accept_knob: float = 0.9,
    embd_scale: float = 10.0,
    draft_layers: int = 1,
    n_layer: int = 16,
    n_embd: int = 256,
    n_ff: int = 768,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_vocab: int = 4096,
    dtype: Literal["f16", "f32"] = "f32",
    target_layers: tuple[int, int, int] | None = None,
) -> ModelSet:
    """Write target.gguf, draft-simple.gguf, eagle3.gguf and models.json into ``outdir`` (no download).

    Defaults: 16-block llama target, n_embd 256, n_ff 768, 4 heads / 2 KV heads, 4096-token SPM vocabulary
    with byte fallback, f32; draft = the target's block 0 + its embeddings, output norm and head; EAGLE-3
    draft with random weights, target_layers [2, 8, 13]. About 0.4 s and 79 MB on 2 cores.
    Acceptance per ``accept_knob``: the module docstring and MEASURED_ACCEPTANCE (valid for the default
    shape and seed; other shapes shift the curve).
    """
    spec = tiny_spec(
        seed=seed,
        accept_knob=accept_knob,
        embd_scale=embd_scale,
        draft_layers=draft_layers,
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_vocab=n_vocab,
        dtype=dtype,
        target_layers=target_layers,
    )
    return _write(outdir, spec)


def _write(outdir: str | Path, spec: TinySpec) -> ModelSet:
    return write_model_set(
        outdir,
        kind="tiny",
        shape=spec.shape(),
        vocab=build_spm_vocab(spec.n_vocab),
        seed=spec.seed,
        draft_layers=spec.draft_layers,
        embd_scale=spec.embd_scale,
        tail_scale=spec.tail_scale,
        dtype=DTYPES[spec.dtype],
        fill="normal",
        target_layers=None if spec.target_layers is None else list(spec.target_layers),
        knobs=spec.model_dump(mode="json"),
    )


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The cache root for models: ``cache_dir``, else spectrial's ($SPECTRIAL_CACHE or ~/.cache/spectrial)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    from spectrial.cache import cache_root as spectrial_cache

    return spectrial_cache()


def _usable(directory: Path, spec: TinySpec) -> ModelSet | None:
    try:
        ms = ModelSet.load(directory)
    except (OSError, ValueError):
        return None
    return ms if ms.is_complete() and ms.knobs == spec.model_dump(mode="json") else None


def ensure_tiny_models(cache_dir: str | Path | None = None, **knobs: object) -> ModelSet:
    """Return the cached tiny set for these knobs, writing it first if missing or incomplete.

    Location: ``<cache root>/models/tiny-<writer version>-<hash of knobs>/`` (see ``cache_root``). The set
    is written into a temporary sibling directory and renamed into place, so readers never see half a set.
    """
    from spectrial.cache import publish

    spec = tiny_spec(**knobs)
    return publish(cache_root(cache_dir) / "models" / spec.key(), lambda tmp: _write(tmp, spec),
                   lambda d: _usable(d, spec))
