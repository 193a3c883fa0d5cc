"""TEST DOUBLE of `sglang.srt.server_args`: the subset of SGLang's CLI that spectrial writes, plus `--standin-*`.

Flag names, aliases, choices and the argparse behaviour (unknown or ambiguous options exit with status 2)
follow SGLang 0.5.17, which has both `--cuda-graph-max-bs` (deprecated, removed in 0.5.20) and
`--cuda-graph-max-bs-decode` / `--cuda-graph-max-bs-prefill` (added in 0.5.14), the per-phase
`--cuda-graph-backend-{decode,prefill}` switches and the deprecated `--disable-cuda-graph`.
`ServerArgs.add_cli_args(parser)` has the same signature as SGLang's, so spectrial's host-side argument
check runs against this double unchanged.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

ALGORITHMS = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]


class ServerArgs:
    """Namespace helpers mirroring SGLang's ServerArgs (CLI registration and the speculative rules)."""

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        """Register the supported flags on `parser`."""
        a = parser.add_argument
        a("--model-path", "--model", dest="model_path", required=True, help="Path to model weights.")
        a("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
        a("--host", default="127.0.0.1")
        a("--port", type=int, default=30000)
        a("--trust-remote-code", action="store_true")
        a("--served-model-name", default=None)
        a("--mem-fraction-static", type=float, default=None)
        a("--cuda-graph-max-bs", type=int, default=None, help="deprecated alias (removed in 0.5.20)")
        a("--cuda-graph-max-bs-decode", type=int, default=None)
        a("--cuda-graph-max-bs-prefill", type=int, default=None)
        a("--cuda-graph-backend-decode", default=None)
        a("--cuda-graph-backend-prefill", default=None)
        a("--disable-cuda-graph", action="store_true", help="deprecated")
        a("--attention-backend", default=None)
        a("--sampling-backend", default=None)
        a("--num-continuous-decode-steps", type=int, default=1)
        a("--disable-custom-all-reduce", action="store_true")
        a("--max-running-requests", type=int, default=None)
        a("--decode-log-interval", type=int, default=40)
        a("--enable-metrics", action="store_true")
        a("--disable-radix-cache", action="store_true")
        a("--random-seed", type=int, default=None)
        a("--log-level", default="info")
        a("--speculative-algorithm", choices=ALGORITHMS, default=None)
        a("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path",
          default=None)
        a("--speculative-num-steps", type=int, default=None)
        a("--speculative-eagle-topk", type=int, default=None)
        a("--speculative-num-draft-tokens", type=int, default=None)
        s = parser.add_argument_group("stand-in only (test double)")
        s.add_argument("--standin-decode-ms", type=float, default=5.0, help="ms per token, no speculation")
        s.add_argument("--standin-verify-ms", type=float, default=12.0, help="ms per speculative verify cycle")
        s.add_argument("--standin-draft-ms", type=float, default=0.0, help="ms per drafted token")
        s.add_argument("--standin-accept", type=float, default=0.7, help="P(drafted token accepted)")
        s.add_argument("--standin-prefill-ms", type=float, default=3.0, help="ms per prefill")
        s.add_argument("--standin-import-s", type=float, default=0.2,
                       help="simulated Python imports before anything is spawned (connection refused)")
        s.add_argument("--standin-load-s", type=float, default=0.3, help="simulated weight load per worker")
        s.add_argument("--standin-warmup-s", type=float, default=0.2,
                       help="simulated kernel builds before the warm-up request (/health 503, HTTP up)")
        s.add_argument("--standin-drop-worker-env", action="append", default=[], metavar="VAR",
                       help="remove VAR from the environment the workers are spawned with")
        s.add_argument("--standin-worker-setenv", action="append", default=[], metavar="VAR=VALUE",
                       help="assign VAR inside each running worker (invisible in /proc/<pid>/environ)")
        s.add_argument("--standin-legacy-server-info", action="store_true",
                       help="serve only /get_server_info (older SGLang)")


def cuda_graph_enabled(ns: argparse.Namespace) -> bool:
    """False with the deprecated --disable-cuda-graph or both per-phase backends `disabled`."""
    return not (ns.disable_cuda_graph or ns.cuda_graph_backend_decode == "disabled")


def apply_speculative_rules(ns: argparse.Namespace, warn: Callable[[str], None]) -> None:
    """SGLang's rules: NEXTN -> EAGLE, steps unset needs topk/draft tokens unset, topk 1 forces D = S + 1."""
    algo = ns.speculative_algorithm
    if algo is None:
        return
    if algo == "NGRAM":
        ns.speculative_eagle_topk = 1
        if ns.speculative_num_draft_tokens is None:
            ns.speculative_num_draft_tokens = 12
        ns.speculative_num_steps = ns.speculative_num_draft_tokens - 1
        return
    if ns.speculative_num_steps is None:
        assert ns.speculative_eagle_topk is None and ns.speculative_num_draft_tokens is None
        ns.speculative_num_steps, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens = 3, 1, 4
    if ns.speculative_eagle_topk is None:
        ns.speculative_eagle_topk = 1
    if ns.speculative_eagle_topk == 1 and ns.speculative_num_draft_tokens != ns.speculative_num_steps + 1:
        warn("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
             "speculative_eagle_topk == 1")
        ns.speculative_num_draft_tokens = ns.speculative_num_steps + 1
    if ns.max_running_requests is None:
        ns.max_running_requests = 48
        warn("Max running requests is reset to 48 for speculative decoding. You can override this by "
             "explicitly setting --max-running-requests.")
