"""Where each pattern the doctor names was seen in public, resolved or measured (the threads' own words are in
tests/fixtures/diagnose/, each fixture with its source)."""

from __future__ import annotations

from spectrial.params import repo_root
from spectrial.readers.diagnose.model import Source

_ROWS = (
    ("sglang#21272", "https://github.com/sgl-project/sglang/pull/21272",
     "SGLang PR #21272: an EAGLE-3 draft run as --speculative-algorithm EAGLE gives accept_len exactly 1.00"),
    ("vllm#6768", "https://github.com/vllm-project/vllm/issues/6768",
     "vLLM #6768: Medusa with 0 % draft acceptance"),
    ("fastrl#4", "https://github.com/mit-han-lab/fastrl/pull/4",
     "fastrl PR #4: above the adaptive threshold decode ran at accept len 1.00 without CUDA graphs"),
    ("eagle#298", "https://github.com/SafeAILab/EAGLE/issues/298",
     "EAGLE #298: EAGLE-3 on SGLang with --cuda-graph-max-bs 2 and a tree, slower than baseline at parallel > 1"),
    ("sglang#5274", "https://github.com/sgl-project/sglang/issues/5274",
     "SGLang #5274: EAGLE-3 stress test at concurrency 20 with --cuda-graph-max-bs 2, throughput dropped sharply"),
    ("vllm#49548", "https://github.com/vllm-project/vllm/issues/49548",
     "vLLM #49548: dynamic speculation downgrades CUDA graphs to PIECEWISE (59.6 -> 50.0 tok/s single stream)"),
    ("sglang#4247", "https://github.com/sgl-project/sglang/pull/4247",
     "SGLang PR #4247: EAGLE-3 without CUDA graphs 276 tok/s, with them 379 tok/s"),
    ("sglang#33483", "https://github.com/sgl-project/sglang/issues/33483",
     "SGLang #33483: running batch above the captured CUDA-graph sizes runs eager"),
    ("sglang#4543", "https://github.com/sgl-project/sglang/issues/4543",
     "SGLang #4543: MTP throughput drop fixed by raising --max-running-requests and --cuda-graph-bs"),
    ("eagle#269", "https://github.com/SafeAILab/EAGLE/issues/269",
     "EAGLE #269: as concurrency rises the tree's step latency grows 3x; maintainer: for bs > 1 do not use the tree"),
    ("specforge#339", "https://github.com/sgl-project/SpecForge/issues/339",
     "SpecForge #339: Qwen3-30B-A3B EAGLE-3 slower than baseline at bs 1 and 4 (tree configs included)"),
    ("angelslim#163", "https://github.com/Tencent/AngelSlim/issues/163",
     "AngelSlim #163: EAGLE-3 slower than baseline at bs 1-32 on an MoE target (verify activates more experts)"),
    ("tokenspeed#1305", "https://github.com/lightseekorg/tokenspeed/issues/1305",
     "tokenspeed #1305: raw random completion 3.93 tokens/iteration vs 1.94 with the chat template"),
    ("sglang#4716", "https://github.com/sgl-project/sglang/pull/4716",
     "SGLang PR #4716: send_one (raw prompt) acc_length 2.42 vs 5.88 on MT-bench with the system prompt"),
    ("sglang#34743", "https://github.com/sgl-project/sglang/pull/34743",
     "SGLang PR #34743: bench_serving read accept length from internal_states[0] (one DP rank, earlier workloads)"),
    ("sglang#16694", "https://github.com/sgl-project/sglang/pull/16694",
     "SGLang PR #16694: 'Acceptance length (server)' vs '(benchmark)': only the benchmark's own is the window's"),
    ("vllm#4840", "https://github.com/vllm-project/vllm/pull/4840",
     "vLLM PR #4840: a 125M draft at TP 2/4 is communication-bound; speculation loses (6.23 s vs 2.42 s)"),
    ("vllm#4632", "https://github.com/vllm-project/vllm/issues/4632",
     "vLLM #4632: draft at TP 1 cut proposal time from 5 to 1.5 ms/token"),
    ("engines-nccl", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html",
     "NCCL environment variables: NCCL reads NCCL_* when a communicator is created and logs 'NCCL_X set by "
     "environment to V' (measured on 2 H200s, spectrial ENGINES.md)"),
    ("rtx6kpro-startup", "https://github.com/local-inference-lab/rtx6kpro/blob/main/benchmarks/glm-startup-consistency.md",
     "rtx6kpro glm-startup-consistency: /proc/<pid>/environ of vLLM workers loses NCCL entries after setproctitle"),
    ("rtx6kpro-allreduce", "https://github.com/local-inference-lab/rtx6kpro/blob/main/benchmarks/kimi-glm-ar-benchmark-20260425.md",
     "rtx6kpro Kimi/GLM all-reduce benchmark: one communication env knob moved spec-decode throughput by a third on PCIe"),
    ("seed-case", "outputs/examples/case-kimi-k25-pcie/README.md",
     "the original case (outputs/examples/case-kimi-k25-pcie): 89 vs 82 tok/s baselines, a 94 tok/s run with an "
     "unrecorded environment"),
    ("vllm#53436", "https://github.com/vllm-project/vllm/issues/53436",
     "vLLM #53436: run-to-run throughput CV of 10-20 % at low concurrency"),
    ("llamacpp#14104", "https://github.com/ggml-org/llama.cpp/pull/14104",
     "llama.cpp PR #14104: the acceptance rate's meaning changed; logs before and after are not comparable"),
    ("ninfer#72", "https://github.com/ashalliants/ninfer-3090/pull/72",
     "ninfer-3090 PR #72: sw_power_cap active in 161-168 of 162-168 decode samples, SM clock 11 % below boost"),
    ("club3090#585", "https://github.com/noonghunna/club-3090/issues/585",
     "club-3090 #585: a 250 W power cap made every decode figure a uniform 0.90x"),
    ("sglang#34942", "https://github.com/sgl-project/sglang/issues/34942",
     "SGLang #34942: --profile-by-stage with EAGLE froze the server ~25 s; the next clean run's TTFT +65 %"),
    ("sglang#11110", "https://github.com/sgl-project/sglang/pull/11110",
     "SGLang PR #11110: profiling by stage prints 'PROFILER STARTING ... Traces will be saved to'"),
    ("llamacpp#24508", "https://github.com/ggml-org/llama.cpp/pull/24508",
     "llama.cpp PR #24508: draft depth 3 at 34 % acceptance 23.5 tok/s vs 26.7 without speculation"),
    ("vllm#16937", "https://github.com/vllm-project/vllm/pull/16937",
     "vLLM PR #16937: draft cost grows with K, so a higher accept length does not guarantee throughput"),
    ("vllm#53504", "https://github.com/vllm-project/vllm/issues/53504",
     "vLLM #53504: with MTP the first repeat of an identical prompt misses the prefix cache and re-prefills; "
     "without speculation the control hits at once"),
    ("speculators-validate",
     "https://github.com/vllm-project/speculators/blob/main/scripts/evaluate/throughput_interactivity.py",
     "speculators' throughput_interactivity.py validate: 8 load checks (achieved rate, queueing, prefix-cache "
     "hits < 5 %, steady state...) before a point is trusted"),
)



def absolute(url: str) -> str:
    """A source's address that works from any folder: a URL as is; a file of the project's own examples as a
    file:// URI resolved from the checkout (a relative path breaks from a run folder)."""
    if "://" in url:
        return url
    return (repo_root() / url).resolve().as_uri()


SOURCES: dict[str, Source] = {k: Source(key=k, url=absolute(u), title=t) for k, u, t in _ROWS}


def sources(*keys: str) -> list[Source]:
    """The sources named (KeyError names the unknown key and the known ones)."""
    try:
        return [SOURCES[k] for k in keys]
    except KeyError as exc:
        raise KeyError(f"unknown source {exc.args[0]!r}; known: {sorted(SOURCES)}") from None
