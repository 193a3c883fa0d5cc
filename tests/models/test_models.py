"""spectrial.models: GGUF models written locally, checked by reading them back and by a real llama-server."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import httpx
import numpy as np
import pytest
from sshd_plugin import free_port as _free_port

from spectrial.errors import ConfigError
from spectrial.models import (
    LlamaShape,
    ModelSet,
    build_spm_vocab,
    describe,
    ensure_tiny_models,
    load_vocab_gguf,
    read_header,
    write_llama_pair,
    write_tiny_pair,
)
from spectrial.models.gguf_write import TensorSpec, tensor_data
from spectrial.models.pair import default_target_layers, eagle3_specs, get_shape, llama_specs

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. Once upon a time",
    "Speculative decoding drafts tokens with a small model and verifies them",
    "1, 2, 3, 4, 5, and then what comes next in this list of numbers?",
]


def vocab_gguf_path() -> Path:
    """The Llama-3 vocab-only GGUF of the pinned llama.cpp sources ($SPECTRIAL_VOCAB_GGUF overrides)."""
    if "SPECTRIAL_VOCAB_GGUF" in os.environ:
        return Path(os.environ["SPECTRIAL_VOCAB_GGUF"])
    from spectrial.engines.llamacpp_build import source_dir

    return source_dir() / "models" / "ggml-vocab-llama-bpe.gguf"


@pytest.fixture(scope="module")
def server_bin(llama_server: Path) -> Path:
    """spectrial's provisioned llama-server ($SPECTRIAL_LLAMA_SERVER overrides, e.g. a CUDA build)."""
    return Path(os.environ.get("SPECTRIAL_LLAMA_SERVER", llama_server))


@pytest.fixture(scope="module")
def vocab_gguf() -> Path:
    path = vocab_gguf_path()
    if not path.is_file():
        pytest.skip(
            f"no Llama-3 vocab GGUF at {path}: unpack llama-cpp-python 0.3.36's sdist or set "
            "SPECTRIAL_VOCAB_GGUF"
        )
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> ModelSet:
    t0 = time.perf_counter()
    ms = write_tiny_pair(tmp_path_factory.mktemp("tiny"))
    print(
        f"write_tiny_pair: {time.perf_counter() - t0:.2f} s, "
        f"{sum(f.bytes for f in ms.files.values()) / 1e6:.1f} MB"
    )
    return ms


# ------------------------------------------------------------ a real llama-server, started and stopped here



@contextlib.contextmanager
def run_server(
    binary: Path, model: Path, *args: object, log: Path, timeout_s: float = 120.0
) -> Iterator[httpx.Client]:
    """Start llama-server (1 thread, 127.0.0.1, free port), wait for /health 200, yield a client; stop it."""
    port = _free_port()
    argv = [
        str(binary),
        "-m",
        str(model),
        "-t",
        "1",
        "-c",
        "1024",
        "-np",
        "1",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *map(str, args),
    ]
    with log.open("w") as log_f:
        t0, deadline = time.monotonic(), time.monotonic() + timeout_s
        proc = subprocess.Popen(argv, stdout=log_f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300.0) as client:
                while True:
                    if proc.poll() is not None:
                        raise AssertionError(
                            f"llama-server exited {proc.returncode}: {argv}\n{log.read_text()[-3000:]}"
                        )
                    with contextlib.suppress(httpx.TransportError):
                        if client.get("/health").status_code == 200:
                            break
                    if time.monotonic() > deadline:
                        raise AssertionError(
                            f"llama-server not ready in {timeout_s} s\n{log.read_text()[-3000:]}"
                        )
                    time.sleep(0.05)
                print(f"llama-server ready in {time.monotonic() - t0:.2f} s: {' '.join(argv[3:])}")
                yield client
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def complete(client: httpx.Client, prompt: str, n: int = 96) -> dict[str, Any]:
    """Greedy /completion of exactly ``n`` tokens; returns the JSON (content, timings)."""
    r = client.post(
        "/completion",
        json={"prompt": prompt, "n_predict": n, "ignore_eos": True, "temperature": 0, "cache_prompt": False},
    )
    r.raise_for_status()
    out = r.json()
    assert out["timings"]["predicted_n"] == n
    return out


def acceptance(results: list[dict[str, Any]]) -> float:
    """Accepted / drafted tokens over several responses (0 when nothing was drafted)."""
    drafted = sum(r["timings"].get("draft_n", 0) for r in results)
    return sum(r["timings"].get("draft_n_accepted", 0) for r in results) / max(drafted, 1)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------- files, headers, vocabulary (fast)


def test_tiny_set_files_manifest_and_headers(tiny: ModelSet) -> None:
    manifest = json.loads(tiny.manifest.read_text())
    assert set(manifest["files"]) == {"target", "draft_simple", "eagle3"}
    for role, entry in manifest["files"].items():
        path = tiny.dir / entry["file"]
        assert path.stat().st_size == entry["bytes"]
        assert _sha256(path) == entry["sha256"], role
    t, d, e = describe(tiny.target), describe(tiny.draft_simple), describe(tiny.eagle3)
    assert (t["arch"], t["n_layer"], t["n_embd"], t["n_vocab"], t["tokenizer"]) == (
        "llama",
        16,
        256,
        4096,
        "llama",
    )
    assert (d["arch"], d["n_layer"], d["n_vocab"]) == ("llama", 1, 4096)
    assert (e["arch"], e["n_layer"], e["target_layers"], e["target_hidden_size"]) == (
        "eagle3",
        1,
        [2, 8, 13],
        256,
    )
    assert t["file_bytes"] == tiny.target.stat().st_size and t["n_params"] > d["n_params"]
    assert ModelSet.load(tiny.dir) == tiny


def test_fast_header_reader_agrees_with_gguf_reader(tiny: ModelSet) -> None:
    for path in (tiny.target, tiny.draft_simple, tiny.eagle3):
        ref, ours = gguf.GGUFReader(path), read_header(path)
        ref_kv = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
        assert ref_kv.keys() == ours.kv.keys()
        for key, value in ref_kv.items():
            assert ours.kv[key] == (pytest.approx(value) if isinstance(value, float) else value), key
        assert [
            (t.name, tuple(int(x) for x in reversed(t.shape)), int(t.tensor_type)) for t in ref.tensors
        ] == [(t.name, t.shape, t.ggml_type) for t in ours.tensors]
        assert [t.data_offset for t in ref.tensors] == [ours.data_offset + t.offset for t in ours.tensors]


def test_draft_is_the_targets_first_block_and_the_knob_scales_the_rest(tmp_path: Path) -> None:
    full = write_tiny_pair(
        tmp_path / "k0", accept_knob=0.0, n_layer=3, n_embd=64, n_ff=128, n_vocab=512, dtype="f32"
    )
    half = write_tiny_pair(
        tmp_path / "k5", accept_knob=0.5, n_layer=3, n_embd=64, n_ff=128, n_vocab=512, dtype="f32"
    )
    target = {t.name: np.array(t.data) for t in gguf.GGUFReader(half.target).tensors}
    draft = {t.name: np.array(t.data) for t in gguf.GGUFReader(half.draft_simple).tensors}
    assert set(draft) < set(target) and "blk.1.attn_q.weight" not in draft
    for name, data in draft.items():
        np.testing.assert_array_equal(data, target[name], err_msg=name)
    unscaled = {t.name: np.array(t.data) for t in gguf.GGUFReader(full.target).tensors}
    for name in ("blk.1.ffn_down.weight", "blk.2.attn_output.weight"):
        np.testing.assert_allclose(target[name], 0.5 * unscaled[name], rtol=1e-6)
    np.testing.assert_array_equal(target["blk.0.ffn_down.weight"], unscaled["blk.0.ffn_down.weight"])
    np.testing.assert_array_equal(target["blk.1.ffn_up.weight"], unscaled["blk.1.ffn_up.weight"])
    emb = target["token_embd.weight"]
    assert emb.shape == (512, 64) and 0.15 < float(emb.std()) < 0.25  # std 0.02 x embd_scale 10


def test_spm_vocab_has_byte_fallback_and_unique_pieces() -> None:
    v = build_spm_vocab(4096)
    assert v.size == 4096 == len(set(v.tokens)) == len(v.token_type) == len(v.scores or [])
    assert v.tokens[:3] == ["<unk>", "<s>", "</s>"] and v.tokens[3 + 0x41] == "<0x41>"
    assert v.token_type.count(int(gguf.TokenType.BYTE)) == 256
    assert "\u2581the" in v.tokens and "the" in v.tokens


def test_tile_and_normal_fills_are_deterministic_random_normals() -> None:
    spec = TensorSpec("blk.0.ffn_up.weight", (3000, 1500), np.float16)
    for fill in ("normal", "tile"):
        a, b = tensor_data(spec, 7, fill), tensor_data(spec, 7, fill)  # type: ignore[arg-type]
        np.testing.assert_array_equal(a, b)
        assert a.shape == (3000, 1500) and abs(float(a.std()) - 0.02) < 0.001 and abs(float(a.mean())) < 0.001
        assert not np.array_equal(a, tensor_data(spec, 8, fill))  # type: ignore[arg-type]
        other = TensorSpec("blk.1.ffn_up.weight", spec.shape, np.float16)
        assert not np.array_equal(a, tensor_data(other, 7, fill))  # type: ignore[arg-type]


def test_ensure_tiny_models_caches_and_repairs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECTRIAL_CACHE", str(tmp_path / "cache"))
    t0 = time.perf_counter()
    first = ensure_tiny_models(n_layer=2, n_vocab=600)
    print(f"ensure_tiny_models (write): {time.perf_counter() - t0:.2f} s")
    assert first.dir.parent == tmp_path / "cache" / "models" and first.dir.name.startswith("tiny-")
    stamp = first.target.stat().st_mtime_ns
    again = ensure_tiny_models(n_layer=2, n_vocab=600, seed=0)  # defaults spelled out: same key
    assert again.dir == first.dir and again.target.stat().st_mtime_ns == stamp
    other = ensure_tiny_models(n_layer=2, n_vocab=600, accept_knob=0.5)
    assert other.dir != first.dir and other.knobs["accept_knob"] == 0.5
    with first.eagle3.open("r+b") as f:  # an interrupted copy: truncated file
        f.truncate(100)
    repaired = ensure_tiny_models(n_layer=2, n_vocab=600)
    assert repaired.dir == first.dir and repaired.eagle3.stat().st_size == first.files["eagle3"].bytes
    assert sorted(p.name for p in (tmp_path / "cache" / "models").iterdir()) == sorted(
        [first.dir.name, other.dir.name]
    )
    explicit = ensure_tiny_models(cache_dir=tmp_path / "elsewhere", n_layer=2, n_vocab=600)
    assert explicit.dir.parent == tmp_path / "elsewhere" / "models" and explicit.dir.name == first.dir.name


def test_bad_knobs_raise_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="accept_knob"):
        ensure_tiny_models(cache_dir=tmp_path, accept_knob=1.5)
    with pytest.raises(ConfigError, match="no_such_knob"):
        ensure_tiny_models(cache_dir=tmp_path, no_such_knob=1)
    with pytest.raises(ConfigError, match="draft_layers"):
        write_tiny_pair(tmp_path / "x", n_layer=2, draft_layers=2)
    with pytest.raises(ConfigError, match="vocab_gguf"):
        write_llama_pair(tmp_path / "y", vocab_gguf=tmp_path / "missing.gguf", n_layers=2)
    with pytest.raises(ConfigError, match="shape"):
        write_llama_pair(tmp_path / "z", vocab_gguf=tmp_path, shape="llama9-1t")


_SMALL_REAL_VOCAB = LlamaShape(
    n_layer=4, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, n_ctx=2048, rope_freq_base=500000.0
)


def test_real_vocab_is_copied(tmp_path: Path, vocab_gguf: Path) -> None:
    ms = write_llama_pair(tmp_path, vocab_gguf=vocab_gguf, shape=_SMALL_REAL_VOCAB)
    src, dst = read_header(vocab_gguf).kv, read_header(ms.target).kv
    for key in ("model", "pre", "tokens", "token_type", "merges", "bos_token_id", "eos_token_id"):
        assert dst[f"tokenizer.ggml.{key}"] == src[f"tokenizer.ggml.{key}"], key
    e = describe(ms.eagle3)
    assert (e["n_vocab"], e["tokenizer"], e["target_layers"], e["target_hidden_size"]) == (
        128256,
        "gpt2",
        [1, 2, 2],
        128,
    )
    assert load_vocab_gguf(ms.draft_simple).tokens == load_vocab_gguf(vocab_gguf).tokens


def test_llama3_8b_layout_matches_the_real_model() -> None:
    shape = get_shape("llama3-8b")
    specs = llama_specs(
        shape, 128256, n_layer=shape.n_layer, dtype=np.float16, embd_scale=1.0, tail_from=1, tail_scale=1.0
    )
    assert (
        len(specs) == 3 + 9 * 32 and sum(s.n_elements for s in specs) == 8_030_261_248
    )  # Llama-3-8B's count
    assert sum(s.nbytes for s in specs) < 16.1e9
    e3 = {s.name: s.shape for s in eagle3_specs(shape, 128256, 4096, dtype=np.float16)}
    assert e3["fc.weight"] == (4096, 3 * 4096) and e3["blk.0.attn_q.weight"] == (4096, 2 * 4096)
    assert e3["blk.0.attn_k.weight"] == (1024, 2 * 4096) and "token_embd.weight" not in e3
    assert default_target_layers(32) == [2, 16, 29]


# ---------------------------------------------------------------- real llama-server runs (slow)


@pytest.mark.slow
def test_draft_simple_acceptance_is_real_and_moves_with_the_knob(server_bin: Path, tmp_path: Path) -> None:
    measured: dict[float, float] = {}
    for knob in (0.5, 0.95):
        ms = write_tiny_pair(tmp_path / f"k{knob}", accept_knob=knob)
        with run_server(server_bin, ms.target, log=tmp_path / "base.log") as c:
            greedy = [complete(c, p)["content"] for p in PROMPTS]
        with run_server(
            server_bin,
            ms.target,
            "-md",
            ms.draft_simple,
            "--spec-type",
            "draft-simple",
            "--spec-draft-n-max",
            4,
            log=tmp_path / "spec.log",
        ) as c:
            results = [complete(c, p) for p in PROMPTS]
        assert [r["content"] for r in results] == greedy  # speculation must not change greedy output
        measured[knob] = acceptance(results)
        print(
            f"accept_knob {knob}: acceptance {measured[knob]:.3f}, "
            f"tok/s {[round(r['timings']['predicted_per_second']) for r in results]}"
        )
    assert 0.05 < measured[0.5] < 0.6 and 0.7 < measured[0.95] <= 1.0
    assert measured[0.95] > measured[0.5] + 0.2


@pytest.mark.slow
def test_eagle3_draft_loads_and_follows_synthetic_rates(
    server_bin: Path, tiny: ModelSet, tmp_path: Path
) -> None:
    spec = ("-md", tiny.eagle3, "--spec-type", "draft-eagle3", "--spec-draft-n-max", 2)
    with run_server(server_bin, tiny.target, *spec, log=tmp_path / "plain.log") as c:
        plain = [complete(c, p) for p in PROMPTS]
    with run_server(
        server_bin, tiny.target, *spec, "--spec-synth-rates", "0.8,0.64", log=tmp_path / "synth.log"
    ) as c:
        synth = [complete(c, p) for p in PROMPTS]
    assert "loading draft model" in (tmp_path / "synth.log").read_text()
    a_plain, a_synth = acceptance(plain), acceptance(synth)
    print(f"eagle3 acceptance: random draft {a_plain:.3f}, synthetic 0.8,0.64 {a_synth:.3f}")
    assert sum(r["timings"]["draft_n"] for r in plain) > 0 and a_plain < 0.1
    assert (
        sum(r["timings"]["draft_n_accepted"] for r in synth) > 0 and 0.5 < a_synth < 0.9
    )  # expect (0.8+0.64)/2


@pytest.mark.slow
def test_real_vocab_set_runs_in_llama_server(server_bin: Path, vocab_gguf: Path, tmp_path: Path) -> None:
    ms = write_llama_pair(
        tmp_path / "m", vocab_gguf=vocab_gguf, shape=_SMALL_REAL_VOCAB, accept_knob=0.95, dtype="f32"
    )  # f32: batched verification rounds like one-token decoding
    with run_server(server_bin, ms.target, log=tmp_path / "base.log") as c:
        greedy = [complete(c, p, n=48)["content"] for p in PROMPTS]
        tokens = c.post("/tokenize", json={"content": "Hello world, ünïcödé ✓"}).json()["tokens"]
    assert len(tokens) >= 5 and max(tokens) < 128256
    with run_server(
        server_bin,
        ms.target,
        "-md",
        ms.draft_simple,
        "--spec-type",
        "draft-simple",
        log=tmp_path / "simple.log",
    ) as c:
        results = [complete(c, p, n=48) for p in PROMPTS]
    assert [r["content"] for r in results] == greedy and acceptance(results) > 0.3
    with run_server(
        server_bin,
        ms.target,
        "-md",
        ms.eagle3,
        "--spec-type",
        "draft-eagle3",
        "--spec-draft-n-max",
        2,
        "--spec-synth-rates",
        "0.8,0.64",
        log=tmp_path / "eagle3.log",
    ) as c:
        assert acceptance([complete(c, p, n=48) for p in PROMPTS]) > 0.4


@pytest.mark.gpu
@pytest.mark.slow
def test_llama3_8b_set_on_gpu(server_bin: Path, vocab_gguf: Path, tmp_path: Path) -> None:
    """The full 8B-shaped set (16 GB target) on CUDA llama-server: baseline, EAGLE-3 synthetic, draft-simple.

    $SPECTRIAL_8B_DIR, if set, is where the set is (re)used or written; else a temporary folder.
    """
    out = Path(os.environ.get("SPECTRIAL_8B_DIR", str(tmp_path / "8b")))
    try:
        ms = ModelSet.load(out)
        assert ms.is_complete() and ms.shape.n_layer == 32
        print(f"reusing the 8B set in {out} (written in {ms.write_seconds} s)")
    except (OSError, ValueError, AssertionError):
        t0 = time.perf_counter()
        ms = write_llama_pair(out, vocab_gguf=vocab_gguf)
        print(f"write_llama_pair(llama3-8b): {time.perf_counter() - t0:.1f} s")
    t, e = describe(ms.target), describe(ms.eagle3)
    assert (t["n_layer"], t["n_embd"], t["n_vocab"], e["target_layers"], e["target_hidden_size"]) == (
        32,
        4096,
        128256,
        [2, 16, 29],
        4096,
    )
    gpu = ("-ngl", 99, "-c", 4096)
    summary: dict[str, Any] = {"sizes_gb": {k: round(f.bytes / 1e9, 2) for k, f in ms.files.items()}}
    arms = {
        "baseline": (),
        "eagle3_synth_0.75": (
            "-md",
            ms.eagle3,
            "--spec-type",
            "draft-eagle3",
            "-ngld",
            99,
            "--spec-draft-n-max",
            3,
            "--spec-synth-rates",
            "0.75,0.5625,0.421875",
        ),
        "eagle3_random": (
            "-md",
            ms.eagle3,
            "--spec-type",
            "draft-eagle3",
            "-ngld",
            99,
            "--spec-draft-n-max",
            3,
        ),
        "draft_simple": (
            "-md",
            ms.draft_simple,
            "--spec-type",
            "draft-simple",
            "-ngld",
            99,
            "--spec-draft-n-max",
            4,
        ),
    }
    for arm, args in arms.items():
        t0 = time.monotonic()
        with run_server(server_bin, ms.target, *gpu, *args, log=tmp_path / f"{arm}.log", timeout_s=300) as c:
            ready_s = time.monotonic() - t0
            complete(c, "warm up", n=16)
            results = [complete(c, p, n=256) for p in PROMPTS]
        summary[arm] = {
            "ready_s": round(ready_s, 1),
            "acceptance": round(acceptance(results), 3),
            "tok_s": [round(r["timings"]["predicted_per_second"], 1) for r in results],
        }
    print(json.dumps(summary))
    assert (
        0.4 < summary["eagle3_synth_0.75"]["acceptance"] < 0.8
        and summary["eagle3_random"]["acceptance"] < 0.1
    )
    assert summary["draft_simple"]["acceptance"] > 0.4  # accept_knob 0.99: ~0.67 measured
