"""Tokenizer vocabularies for generated GGUF models.

Two sources: a small SentencePiece-style ('llama' tokenizer) vocabulary built here from nothing
(specials, 256 byte-fallback tokens, then '▁'-word pieces, characters and letter n-grams), so any text
tokenizes; or a real vocabulary copied from a vocab-only GGUF such as llama.cpp's
``models/ggml-vocab-llama-bpe.gguf`` (Llama-3, 128256 tokens, 'gpt2' BPE with merges).
"""

from __future__ import annotations

import itertools
import string
from pathlib import Path

import gguf
from pydantic import BaseModel, ConfigDict, Field

from spectrial.errors import ConfigError
from spectrial.models.gguf_read import read_header

SPM_SPACE = "\u2581"  # '▁', SentencePiece's visible space
# The tiny models' chat template (tokenizer.chat_template): one line, like the HF tiny models' (spectrial.models.hf)
# but without the BOS, which llama-server adds itself (add_bos_token).
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ '\\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
# Token types as llama.cpp reads them (gguf.TokenType).
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = (
    int(gguf.TokenType.NORMAL),
    int(gguf.TokenType.UNKNOWN),
    int(gguf.TokenType.CONTROL),
    int(gguf.TokenType.BYTE),
)
_WORDS_TEXT = """the of and to a in is it you that he was for on are with as I his they be at one have
this from or had by hot word but what some we can out other were all there when up use your how said an
each she which do their time if will way about many then them write would like so these her long make
thing see him two has look more day could go come did number sound no most people my over know water than
call first who may down side been now find any new work part take get place made live where after back
little only round man year came show every good me give our under name very through just form sentence
great think say help low line differ turn cause much mean before move right boy old too same tell does
set three want air well also play small end put home read hand port large spell add even land here must
big high such follow act why ask men change went light kind off need house picture try us again animal
point mother world near build self earth father head stand own page should country found answer school
grow study still learn plant cover food sun four between state keep eye never last let thought city tree
cross farm hard start might story saw far sea draw left late run while press close night real life few
north open seem together next white children begin got walk example ease paper group always music those
both mark often letter until mile river car feet care second book carry took science eat room friend
began idea fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl
usual young ready above ever red list though feel talk bird soon body dog family direct pose leave song
measure door product black short numeral class wind question happen complete ship area half rock order
fire south problem piece told knew pass since top whole king space heard best hour better true during
hundred five remember step early hold west ground interest reach fast verb sing listen six table travel
less morning ten simple several vowel toward war lay against pattern slow center love person money serve
appear road map rain rule govern pull cold notice voice unit power town fine certain fly fall lead cry
dark machine note wait plan figure star box noun field rest correct able pound done beauty drive stood
contain front teach week final gave green quick develop ocean warm free minute strong special mind behind
clear tail produce fact street inch multiply nothing course stay wheel full force blue object decide
surface deep moon island foot system busy test record boat common gold possible plane stead dry wonder
laugh thousand ago ran check game shape equate miss brought heat snow tire bring yes distant fill east
paint language among model server token speed draft target decode request batch"""
_WORDS = _WORDS_TEXT.split()


class Vocab(BaseModel):
    """A tokenizer as the GGUF ``tokenizer.ggml.*`` keys hold it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="tokenizer.ggml.model: 'llama' (SentencePiece) or 'gpt2' (BPE)")
    pre: str = Field(description="tokenizer.ggml.pre: pre-tokenizer name, e.g. 'default' or 'llama-bpe'")
    tokens: list[str] = Field(description="token strings, index = token id")
    token_type: list[int] = Field(description="gguf.TokenType per token")
    scores: list[float] | None = Field(default=None, description="SentencePiece scores (None for BPE)")
    merges: list[str] | None = Field(default=None, description="BPE merges (None for SentencePiece)")
    bos_id: int = Field(description="beginning-of-sequence token id")
    eos_id: int = Field(description="end-of-sequence token id")
    unk_id: int | None = Field(default=None, description="unknown token id, if the tokenizer has one")
    add_bos: bool = Field(default=True, description="tokenizer.ggml.add_bos_token")
    chat_template: str | None = Field(default=None, description="tokenizer.chat_template (Jinja), if any")
    source: str = Field(description="where it came from: 'built:spm-<n>' or the vocab GGUF path")

    @property
    def size(self) -> int:
        """Number of tokens (the model's n_vocab)."""
        return len(self.tokens)

    def add_to(self, w: gguf.GGUFWriter) -> None:
        """Write the tokenizer keys into a GGUF writer."""
        w.add_tokenizer_model(self.model)
        w.add_tokenizer_pre(self.pre)
        w.add_token_list(self.tokens)
        w.add_token_types(self.token_type)
        if self.scores is not None:
            w.add_token_scores(self.scores)
        if self.merges is not None:
            w.add_token_merges(self.merges)
        w.add_bos_token_id(self.bos_id)
        w.add_eos_token_id(self.eos_id)
        if self.unk_id is not None:
            w.add_unk_token_id(self.unk_id)
        w.add_add_bos_token(self.add_bos)
        w.add_add_eos_token(False)
        if self.chat_template:
            w.add_chat_template(self.chat_template)


def _spm_pieces() -> itertools.chain[str]:
    """Candidate word pieces in priority order (duplicates are dropped by the caller)."""
    chars = [c for c in string.printable if not c.isspace()]
    lower = string.ascii_lowercase
    bigrams = ["".join(p) for p in itertools.product(lower, repeat=2)]
    trigrams = ["".join(p) for p in itertools.product(lower, repeat=3)]
    return itertools.chain(
        [SPM_SPACE],
        (SPM_SPACE + w for w in _WORDS),
        _WORDS,
        chars,
        (SPM_SPACE + c for c in chars),
        bigrams,
        (SPM_SPACE + b for b in bigrams),
        trigrams,
        (SPM_SPACE + t for t in trigrams),
    )


def build_spm_vocab(n_vocab: int = 4096) -> Vocab:
    """Build a SentencePiece-style vocabulary of exactly ``n_vocab`` tokens (<unk>, <s>, </s>, bytes, pieces).

    Byte-fallback tokens <0x00>..<0xFF> make every UTF-8 text tokenizable; pieces get decreasing scores.
    """
    n_fixed = 3 + 256
    if not n_fixed + 1 <= n_vocab <= 40000:
        raise ConfigError(
            f"n_vocab={n_vocab}: must be in [{n_fixed + 1}, 40000] for the built SPM vocabulary"
        )
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [_UNKNOWN, _CONTROL, _CONTROL] + [_BYTE] * 256
    seen = set(tokens)
    for piece in _spm_pieces():
        if len(tokens) == n_vocab:
            break
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            types.append(_NORMAL)
    scores = [0.0] * n_fixed + [-float(i) for i in range(len(tokens) - n_fixed)]
    return Vocab(
        model="llama",
        pre="default",
        tokens=tokens,
        token_type=types,
        scores=scores,
        bos_id=1,
        eos_id=2,
        unk_id=0,
        add_bos=True,
        chat_template=CHAT_TEMPLATE,
        source=f"built:spm-{n_vocab}",
    )


def load_vocab_gguf(path: str | Path) -> Vocab:
    """Copy the tokenizer (model, pre, tokens, types, merges/scores, bos/eos/unk) from a GGUF file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"vocab_gguf={path}: file not found; pass e.g. "
            "vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf from the llama-cpp-python sdist"
        )
    kv = read_header(path).kv
    missing = [
        k
        for k in ("model", "tokens", "token_type", "bos_token_id", "eos_token_id")
        if f"tokenizer.ggml.{k}" not in kv
    ]
    if missing:
        raise ConfigError(
            f"vocab_gguf={path}: lacks tokenizer.ggml.{{{','.join(missing)}}}; "
            "pass a vocab-only GGUF from llama.cpp/models"
        )
    t = "tokenizer.ggml."
    return Vocab(
        model=kv[t + "model"],
        pre=kv.get(t + "pre", "default"),
        tokens=kv[t + "tokens"],
        token_type=kv[t + "token_type"],
        scores=kv.get(t + "scores"),
        merges=kv.get(t + "merges"),
        bos_id=kv[t + "bos_token_id"],
        eos_id=kv[t + "eos_token_id"],
        unk_id=kv.get(t + "unknown_token_id"),
        add_bos=bool(kv.get(t + "add_bos_token", True)),
        chat_template=kv.get("tokenizer.chat_template"),
        source=str(path),
    )
