"""Random-weight GGUF model sets that llama.cpp's llama-server loads: written locally, never downloaded.

Public API:
- ``write_tiny_pair(outdir, *, seed, accept_knob, ...) -> ModelSet``: tiny target, draft-simple, EAGLE-3.
- ``ensure_tiny_models(cache_dir=None, **knobs) -> ModelSet``: the same, cached by knobs.
- ``write_llama_pair(outdir, *, vocab_gguf, shape="llama3-8b", n_layers=None, ...) -> ModelSet``: GPU sizes.
- ``describe(path) -> dict``: identity of any GGUF model from its header.
- ``ensure_hf_models(cache_dir=None, **knobs) -> HfModelSet`` / ``write_hf_models(outdir, **knobs)``:
  Hugging Face-format sets (target, plain draft, EAGLE-3) for vLLM/SGLang; ``kind='counting'`` has a
  known acceptance (``expected_acceptance``, ``simulate_counting``).
"""

from spectrial.models.gguf_read import describe, read_header
from spectrial.models.hf import (
    HfModelSet,
    HfSpec,
    ensure_hf_models,
    expected_acceptance,
    simulate_counting,
    write_hf_models,
)
from spectrial.models.llama import write_llama_pair
from spectrial.models.pair import SHAPES, WRITER_VERSION, LlamaShape, ModelFile, ModelSet
from spectrial.models.tiny import (
    MEASURED_ACCEPTANCE,
    TinySpec,
    cache_root,
    ensure_tiny_models,
    write_tiny_pair,
)
from spectrial.models.vocab import Vocab, build_spm_vocab, load_vocab_gguf

__all__ = [
    "HfModelSet",
    "HfSpec",
    "ensure_hf_models",
    "expected_acceptance",
    "simulate_counting",
    "write_hf_models",
    "MEASURED_ACCEPTANCE",
    "SHAPES",
    "WRITER_VERSION",
    "LlamaShape",
    "ModelFile",
    "ModelSet",
    "TinySpec",
    "Vocab",
    "build_spm_vocab",
    "cache_root",
    "describe",
    "ensure_tiny_models",
    "load_vocab_gguf",
    "read_header",
    "write_llama_pair",
    "write_tiny_pair",
]
