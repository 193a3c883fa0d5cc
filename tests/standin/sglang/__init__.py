"""TEST DOUBLE of SGLang for spectrial's CI: NOT SGLang. No model, no GPU, no real inference.

spectrial's CI cannot run SGLang (no GPU, pinned torch builds, no weights), so this small package stands in
for it with SGLang's *protocol*: started with the exact real command line
`python -m sglang.launch_server --model-path ... --tp-size N --speculative-algorithm EAGLE3 ...` when
`PYTHONPATH=<repo>/tests/standin`, it spawns one worker process per TP rank with multiprocessing *spawn*
(as SGLang does), prints SGLang-format logs (startup, `Decode batch ... accept len` every
--decode-log-interval steps, the ready line), answers `/health` (503 until its warm-up), `/v1/models`,
`/server_info` (cumulative avg_spec_accept_length), `/metrics`, streaming `/v1/completions` and `/generate`.
Decoding is simulated by sleeping: `--standin-decode-ms` per token without speculation,
`--standin-verify-ms` per speculative cycle, each drafted token accepted with probability `--standin-accept`
(chain acceptance). Workers print NCCL-format `NCCL INFO ... set by environment to ...` lines for the NCCL_*
variables in their own environment when NCCL_DEBUG=INFO, imitating NCCL's log format so that spectrial's
evidence parser is exercised. Flags only this double understands start with `--standin-`.
"""

__version__ = "0.5.20+standin"
