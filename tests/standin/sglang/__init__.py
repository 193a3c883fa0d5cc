"""TEST DOUBLE of SGLang for spectrial's CI: NOT SGLang. No model, no GPU, no real inference.

spectrial's CI cannot run SGLang (no GPU, pinned torch builds, no weights), so this small package stands in
for it: started with the exact real command line `python -m sglang.launch_server --model-path ...
--speculative-algorithm EAGLE3 ...` when `PYTHONPATH=<repo>/tests/standin`, it behaves as SGLang 0.5.17 did
on the H200 device (processes renamed with setproctitle, 503-then-200 readiness with a 1 s `/health`, exit
-9 on every stop, last-window gauges in `/metrics`, SGLang's log lines): see `sglang/launch_server.py` for
the recorded run it imitates and the list of imitated behaviours. Decoding is simulated by sleeping.
Flags only this double understands start with `--standin-`; its only environment switch of its own is
STANDIN_CRASH_AFTER_REQUESTS. Needs `setproctitle`, `psutil` and `prometheus_client` (no torch).
"""

__version__ = "0.5.17+standin"
