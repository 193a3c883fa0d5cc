"""vLLM log records (V0 and V1, every era seen in public logs).

Kinds and columns (engine "vllm"):
- ``throughput`` (``[Engine 000: ]Avg prompt throughput: ...``): prompt_throughput, gen_throughput,
  running_req, waiting_req (V0 "Pending"), swapped_req, kv_cache_usage (fraction; printed in %),
  cache_hit_rate (fraction), dp_rank (the ``Engine NNN`` index).
- ``spec_metrics`` (V1 ``SpecDecoding metrics`` of every era, V0 ``Speculative metrics``): accept_len
  (``Mean acceptance length``; None where not printed), accept_rate (fraction; ``100.0%`` -> 1.0),
  accepted, drafted (also V0's ``Number of draft tokens tokens`` typo), per_position (list of floats),
  num_spec_tokens, system_efficiency, emitted, accepted_throughput, drafted_throughput, dp_rank.
- ``spec_summary`` (``examples/offline_inference/spec_decode.py`` summary): output_tokens, drafts,
  drafted, accepted, accept_len, per_position (from ``acceptance at token i``).
``vllm bench serve`` result blocks are read by the shared ``bench_serving`` format (engine "vllm").
"""

from __future__ import annotations

import re
from typing import Any

from spectrial.logs.core import LIST, NUM, TS_ISO, BlockFormat, BlockResult, LineFormat, Window, num, registry

TS = (r"(?:INFO|WARNING|WARN|DEBUG|ERROR|CRITICAL)\s+(?P<timestamp>[0-9]{2}-[0-9]{2} "
      r"[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?)")
ENGINE = r"Engine (?P<dp_rank>[0-9]+):"

registry.add(LineFormat(
    "vllm", "throughput", ("Avg prompt throughput",), (TS, TS_ISO, ENGINE),
    keys={"Avg prompt throughput": "prompt_throughput", "Avg generation throughput": "gen_throughput",
          "Running": "running_req", "Waiting": "waiting_req", "Pending": "waiting_req", "Swapped": "swapped_req",
          "GPU KV cache usage": "kv_cache_usage", "KV cache usage": "kv_cache_usage",
          "Prefix cache hit rate": "cache_hit_rate"},
    percent=("kv_cache_usage", "cache_hit_rate"),
    require=("prompt_throughput", "gen_throughput", "running_req"),
    key_metrics=("prompt_throughput", "gen_throughput", "running_req", "kv_cache_usage"),
))

registry.add(LineFormat(
    "vllm", "spec_metrics", ("SpecDecoding metrics", "Speculative metrics"),
    (TS, TS_ISO, ENGINE, rf"Per-position acceptance rate: (?P<per_position>{LIST})"),
    keys={"Mean acceptance length": "accept_len", "Draft acceptance rate": "accept_rate",
          "Avg Draft acceptance rate": "accept_rate", "Accepted": "accepted", "Number of accepted tokens": "accepted",
          "Drafted": "drafted", "Number of draft tokens": "drafted", "Number of draft tokens tokens": "drafted",
          "Number of speculative tokens": "num_spec_tokens", "System efficiency": "system_efficiency",
          "Number of emitted tokens": "emitted", "Number of emitted tokens tokens": "emitted",
          "Accepted throughput": "accepted_throughput", "Drafted throughput": "drafted_throughput"},
    types={"per_position": "list"}, percent=("accept_rate",),
    require=("accept_len", "accept_rate", "accepted", "drafted"),
    key_metrics=("accept_len", "accept_rate"),
))

_SUMMARY = {
    "total_num_output_tokens": "output_tokens", "num_drafts": "drafts", "num_draft_tokens": "drafted",
    "num_accepted_tokens": "accepted", "mean acceptance length": "accept_len",
}
_KV = re.compile(r"^\s*([a-z_ ]+?)\s*:\s*(\S+)\s*$")
_AT = re.compile(rf"^\s*acceptance at token ([0-9]+)\s*:\s*({NUM})")
_RULE = re.compile(r"^\s*-{5,}\s*$")


def spec_summary(w: Window) -> BlockResult:
    """The offline example's summary: `key: value` lines, then `acceptance at token i: x` lines."""
    rec: dict[str, Any] = {}
    pos: list[float] = []
    used = 0
    k = 0
    while (s := w[k]) is not None and k < 200:
        m = _KV.match(s)
        at = _AT.match(s)
        if at:
            pos.append(num(at.group(2)) or 0.0)
        elif m and m.group(1) in _SUMMARY:
            col = _SUMMARY[m.group(1)]
            if col in rec:
                break  # the next summary
            rec[col] = num(m.group(2))
        elif not _RULE.match(s):
            break
        k += 1
        used = k
    if not rec:
        return [], 0
    if pos:
        rec["per_position"] = pos
    return [(0, rec)], used


registry.add(BlockFormat(
    "vllm", "spec_summary",
    ("num_drafts:", "num_accepted_tokens:", "total_num_output_tokens:", "num_draft_tokens:",
     "mean acceptance length:"),
    spec_summary,
    {"output_tokens": "float", "drafts": "float", "drafted": "float", "accepted": "float",
     "accept_len": "float", "per_position": "list"},
    key_metrics=("accept_len",),
))
