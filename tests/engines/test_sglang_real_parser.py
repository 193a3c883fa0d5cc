"""SGLang's own argument parser as the judge of every SGLang command line spectrial builds.

Real SGLang (0.5.10.post1) is installed into a throwaway venv outside the repository, cached under
~/.cache/spectrial/sglang-parser-venv/<version> (or $SPECTRIAL_CACHE): `pip install --no-deps sglang==V`, then
the import-time dependencies (torch resolves to the machine's local wheel; no GPU is needed to parse).
`sglang.srt.server_args.ServerArgs.add_cli_args(parser)` + `parser.parse_args(argv)` then validates each argv,
through the same `check_with_parser` that `prepare()` runs on a real SGLang host. Full `ServerArgs`
construction needs an accelerator and is not attempted. Skipped, with the reason, where pip cannot install.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spectrial.engines import get_engine
from spectrial.engines.sglang import check_with_parser
from spectrial.hosts.local import LocalHost
from spectrial.params import load_params

pytestmark = pytest.mark.slow
VERSION = "0.5.10.post1"
DEPS = ["numpy", "tqdm", "pybase64", "requests", "ipython", "pydantic", "aiohttp", "torch", "safetensors", "orjson",
        "packaging", "pillow", "starlette", "torchvision", "openai", "partial-json-parser", "huggingface-hub",
        "transformers", "pyzmq", "dill", "sentencepiece"]
REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SPECTRIAL_CACHE", "~/.cache/spectrial")).expanduser() / "sglang-parser-venv" / VERSION


@pytest.fixture(scope="module")
def sglang_python() -> str:
    """Python of the cached venv holding real SGLang (built on first use)."""
    py = CACHE / "bin" / "python"
    # installed, read from the distributions' metadata (importing sglang and torch here would cost ~5 s more:
    # the parse below imports them anyway, and a venv that cannot import fails it with the import error)
    probe = [str(py), "-c", "from importlib.metadata import version as v; v('torch'), v('torchvision'); "
             "print(v('sglang'))"]
    if py.is_file() and subprocess.run(probe, capture_output=True, text=True).stdout.strip() == VERSION:
        return str(py)
    steps = [[sys.executable, "-m", "venv", "--clear", str(CACHE)],
             [str(py), "-m", "pip", "install", "-q", "--no-deps", f"sglang=={VERSION}"],
             [str(py), "-m", "pip", "install", "-q", *DEPS]]
    for cmd in steps:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if res.returncode != 0:
            tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
            pytest.skip(f"cannot build the SGLang {VERSION} parser venv ({' '.join(cmd[:5])}...): {tail}")
    return str(py)


def sglang_argvs() -> list[tuple[str, list[str], dict[str, Any]]]:
    """(label, argv after `-m sglang.launch_server`, expected parsed values) for every shape spectrial writes."""
    cases: list[tuple[str, list[str], dict[str, Any]]] = []

    def add(label: str, data: dict[str, Any], expect: list[dict[str, Any]]) -> None:
        params = load_params(data=data) if "engine" in data else load_params(data["_file"], data["_over"])
        eng = get_engine("sglang", params, LocalHost())
        eng.resolve_dry()
        for arm, exp in zip(params.arms, expect, strict=True):
            argv = eng.launch_spec(arm).argv
            cases.append((f"{label}:{arm.name}", argv[argv.index("sglang.launch_server") + 1:], exp))

    kimi = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/Kimi-K2.5-EAGLE3",
            "speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3,
            "tensor_parallel_size": 8, "mem_fraction_static": 0.88, "host": "0.0.0.0", "port": 8000}
    add("kimi-k25-pcie", {"_file": REPO / "params/examples/kimi-k25-pcie.yaml",
                          "_over": {"engine_config.sglang_version": VERSION}},
        [{"speculative_algorithm": None, "tensor_parallel_size": 8}, kimi])
    base = {"name": "p", "engine": "sglang", "model": "/models/target", "draft": "/models/draft", "steps": 3,
            "engine_config": {"sglang_version": VERSION, "tp_size": 2, "cuda_graph_max_bs": 8,
                              "decode_log_interval": 10, "max_running_requests": 4, "random_seed": 1}}
    for method, algo in (("eagle3", "EAGLE3"), ("eagle", "EAGLE"), ("nextn", "NEXTN"), ("draft", "STANDALONE")):
        add(method, {**base, "arms": [{"name": method, "method": method}]},
            [{"speculative_algorithm": algo, "speculative_num_steps": 3, "speculative_eagle_topk": 1,
              "speculative_num_draft_tokens": 4, "cuda_graph_max_bs": 8, "tensor_parallel_size": 2}])
    add("ngram", {**base, "arms": [{"name": "ngram", "method": "ngram"}]},
        [{"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 4, "speculative_num_steps": None}])
    add("tree", {**base, "steps": 5, "topk": 4, "draft_tokens": 8, "arms": [{"name": "t", "method": "eagle"}]},
        [{"speculative_num_steps": 5, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}])
    auto = {**base, "engine_config": {**base["engine_config"], "auto_speculative_params": True}}
    add("auto", {**auto, "arms": [{"name": "a", "method": "eagle3"}]},
        [{"speculative_algorithm": "EAGLE3", "speculative_num_steps": None, "speculative_eagle_topk": None}])
    return cases


EXTRA = [["--model-path", "/m", "--cuda-graph-max-bs-decode", "8"], ["--model-path", "/m", "--cuda-graph-max-bs", "8"]]


@pytest.fixture(scope="module")
def judged(sglang_python) -> tuple[list[tuple[str, list[str], dict[str, Any]]], list[dict[str, Any]]]:
    """Every case and the two version probes, parsed in one run of SGLang's parser (its import takes ~30 s)."""
    cases = sglang_argvs()
    out = check_with_parser(LocalHost(), sglang_python, [argv for _, argv, _ in cases] + EXTRA)
    assert "import_error" not in out, out
    return cases, out["results"]


def test_every_sglang_argv_spectrial_builds_is_accepted_by_sglangs_own_parser(judged):
    cases, results = judged
    for (label, argv, expect), res in zip(cases, results, strict=False):
        assert res["ok"], f"{label}: SGLang {VERSION} rejects {argv}: {res.get('error')}"
        got = res["args"]
        for key, value in expect.items():
            assert got.get(key) == value, f"{label}: {key} parsed as {got.get(key)!r}, intended {value!r}"


def test_newer_sglang_flags_are_what_the_old_parser_rejects(judged):
    """Why flags are version-aware: 0.5.14+'s --cuda-graph-max-bs-decode does not exist in 0.5.10.post1."""
    bad, good = judged[1][-2:]
    assert not bad["ok"] and "unrecognized arguments: --cuda-graph-max-bs-decode 8" in bad["error"]
    assert good["ok"] and good["args"]["cuda_graph_max_bs"] == 8
