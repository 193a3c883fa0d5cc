"""TEST DOUBLE of `python -m sglang.launch_server` (see `sglang/__init__.py`): protocol only, no inference.

The launcher parses SGLang's CLI (argparse errors exit 2 like SGLang), applies SGLang's speculative rules,
exports what SGLang's launcher exports (NCCL_CUMEM_ENABLE, NCCL_NVLS_ENABLE, CUDA_DEVICE_MAX_CONNECTIONS),
spawns one worker per TP rank with multiprocessing spawn, then serves HTTP on --host/--port:
`/health` (503 until the warm-up request has run), `/v1/models`, `/server_info` (and the deprecated
`/get_server_info`), `/metrics` (--enable-metrics), `POST /v1/completions` and `POST /generate`
(streaming or not). SIGTERM stops the workers and the server.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import sglang
from sglang._standin_worker import run_worker
from sglang.srt.server_args import ServerArgs, apply_speculative_rules


def log(msg: str) -> None:
    """One line in SGLang's main-process format `[YYYY-mm-dd HH:MM:SS] msg`."""
    sys.stdout.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}\n")
    sys.stdout.flush()


class Runtime:
    """The launcher's state: workers, request routing, counters."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cfg = vars(args).copy()
        self.ready = False
        self.in_qs: list[Any] = []
        self.out_q: Any = None
        self.procs: list[Any] = []
        self.waiters: dict[str, queue.Queue] = {}
        self.lock = threading.Lock()
        self.counters = {"prompt": 0.0, "generation": 0.0, "requests": 0.0, "verify": 0.0}
        self.model_name = args.served_model_name or args.model_path

    def start_workers(self) -> None:
        ctx = mp.get_context("spawn")
        self.out_q = ctx.Queue()
        dropped = {k: os.environ.pop(k) for k in self.args.standin_drop_worker_env if k in os.environ}
        try:
            for rank in range(self.args.tp_size):
                q = ctx.Queue()
                p = ctx.Process(target=run_worker, args=(rank, self.cfg, q, self.out_q),
                                name=f"sglang::scheduler_TP{rank}", daemon=True)
                p.start()
                self.in_qs.append(q)
                self.procs.append(p)
        finally:
            os.environ.update(dropped)
        if dropped:
            log(f"(test double) workers spawned without {sorted(dropped)}")
        ready = 0
        deadline = time.monotonic() + 60
        while ready < self.args.tp_size:
            msg = self.out_q.get(timeout=max(deadline - time.monotonic(), 0.1))
            if msg[0] == "ready":
                ready += 1
        threading.Thread(target=self._route, daemon=True).start()

    def _route(self) -> None:
        while True:
            msg = self.out_q.get()
            with self.lock:
                w = self.waiters.get(msg[1])
            if w is not None:
                w.put(msg)

    def submit(self, prompt_tokens: int, max_new: int) -> tuple[str, queue.Queue]:
        rid = uuid.uuid4().hex
        w: queue.Queue = queue.Queue()
        with self.lock:
            self.waiters[rid] = w
        self.in_qs[0].put(("gen", rid, prompt_tokens, max_new))
        return rid, w

    def done(self, rid: str, meta: dict[str, Any]) -> None:
        with self.lock:
            self.waiters.pop(rid, None)
            self.counters["prompt"] += meta.get("prompt_tokens", 0)
            self.counters["generation"] += meta.get("completion_tokens", 0)
            self.counters["requests"] += 1
            self.counters["verify"] += meta.get("spec_verify_ct", 0)

    def internal_state(self) -> dict[str, Any]:
        rid = uuid.uuid4().hex
        w: queue.Queue = queue.Queue()
        with self.lock:
            self.waiters[rid] = w
        self.in_qs[0].put(("state", rid))
        try:
            return w.get(timeout=10)[4]
        finally:
            with self.lock:
                self.waiters.pop(rid, None)

    def metrics_text(self) -> str:
        labels = f'model_name="{self.model_name}"'
        c = self.counters
        lines = []
        for name, key, extra in (("prompt_tokens_total", "prompt", ',is_streaming="true"'),
                                 ("generation_tokens_total", "generation", ',is_streaming="true"'),
                                 ("num_requests_total", "requests", "")):
            lines += [f"# HELP sglang:{name} Test double counter.", f"# TYPE sglang:{name} counter",
                      f"sglang:{name}{{{labels}{extra}}} {c[key]}"]
        if self.args.speculative_algorithm:
            lines += ["# HELP sglang:spec_verify_calls_total Number of speculative decoding verification calls.",
                      "# TYPE sglang:spec_verify_calls_total counter",
                      f"sglang:spec_verify_calls_total{{{labels}}} {c['verify']}"]
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        for q in self.in_qs:
            q.put(("stop",))
        for p in self.procs:
            p.join(timeout=2)
            if p.is_alive():
                p.terminate()


def make_handler(rt: Runtime) -> type[BaseHTTPRequestHandler]:
    """HTTP handler bound to the runtime."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

        def _access(self, code: int) -> None:
            log(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.command} {self.path} '
                f'HTTP/1.1" {code} {"OK" if code == 200 else ""}'.rstrip())

        def _json(self, code: int, obj: Any) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self._access(code)

        def _plain(self, code: int, text: str = "") -> None:
            body = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self._access(code)

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate"):
                self._plain(200 if rt.ready else 503)
            elif path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": rt.model_name, "object": "model",
                                                             "owned_by": "sglang", "root": rt.model_name}]})
            elif path == "/server_info" and not rt.args.standin_legacy_server_info or path == "/get_server_info":
                if path == "/get_server_info" and not rt.args.standin_legacy_server_info:
                    log("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                        "Please use '/server_info' instead.")
                info = {k: v for k, v in vars(rt.args).items() if not k.startswith("standin_")}
                self._json(200, {**info, "internal_states": [rt.internal_state()], "version": sglang.__version__})
            elif path == "/metrics" and rt.args.enable_metrics:
                self._plain(200, rt.metrics_text())
            else:
                self._json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            n = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
            except json.JSONDecodeError:
                self._json(400, {"error": "invalid JSON"})
                return
            if not rt.ready:
                self._json(503, {"error": "server is starting"})
            elif self.path == "/v1/completions":
                self._completions(body)
            elif self.path == "/generate":
                self._generate(body)
            else:
                self._json(404, {"detail": "Not Found"})

        def _run(self, prompt: str, max_new: int):  # type: ignore[no-untyped-def]
            prompt_tokens = max(1, len(str(prompt).split()))
            rid, w = rt.submit(prompt_tokens, max(1, int(max_new)))
            while True:
                _, _, k, finished, meta = w.get(timeout=600)
                yield k, meta
                if finished:
                    rt.done(rid, meta)
                    return

        def _sse_start(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()

        def _send(self, obj: Any) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()

        def _completions(self, body: dict[str, Any]) -> None:
            max_new = body.get("max_tokens") or 16
            created, cid = int(time.time()), uuid.uuid4().hex
            base = {"id": cid, "object": "text_completion", "created": created, "model": body.get("model", "")}
            if not body.get("stream"):
                events = list(self._run(body.get("prompt", ""), max_new))
                total, meta = sum(k for k, _ in events), events[-1][1]
                self._json(200, {**base, "choices": [{"index": 0, "text": " tok" * total, "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": total,
                                           "total_tokens": meta["prompt_tokens"] + total}})
                return
            self._sse_start()
            meta: dict[str, Any] = {}
            for k, meta in self._run(body.get("prompt", ""), max_new):
                fin = "length" if meta.get("finish_reason") else None
                self._send({**base, "choices": [{"index": 0, "text": " tok" * k, "logprobs": None,
                                                 "finish_reason": fin, "matched_stop": None}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                self._send({**base, "choices": [], "usage": {
                    "prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
                    "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"]}})
            self._send("[DONE]")
            self._access(200)

        def _generate(self, body: dict[str, Any]) -> None:
            sp = body.get("sampling_params") or {}
            max_new = sp.get("max_new_tokens") or 16
            text, ids, meta = "", [], {}
            if not body.get("stream"):
                events = list(self._run(body.get("text", ""), max_new))
                total = sum(k for k, _ in events)
                self._json(200, {"text": " tok" * total, "output_ids": [7] * total, "meta_info": events[-1][1]})
                return
            self._sse_start()
            for k, meta in self._run(body.get("text", ""), max_new):
                text += " tok" * k
                ids += [7] * k
                self._send({"text": text, "output_ids": ids, "meta_info": meta})
            self._send("[DONE]")
            self._access(200)

    return Handler


def main(argv: list[str]) -> None:
    """Parse, spawn workers, serve, warm up, print the ready line."""
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv)
    apply_speculative_rules(args, lambda m: log(f"WARNING: {m}"))
    for path in filter(None, (args.model_path, args.speculative_draft_model_path)):
        if not os.path.exists(path):
            log(f"ERROR: {path!r} is not a local path (the test double downloads nothing)")
            sys.exit(1)
    shown = ", ".join(f"{k}={v!r}" for k, v in vars(args).items() if not k.startswith("standin_"))
    log(f"server_args=ServerArgs({shown})")
    for k, v in (("NCCL_CUMEM_ENABLE", "0"), ("NCCL_NVLS_ENABLE", "0"), ("CUDA_DEVICE_MAX_CONNECTIONS", "8")):
        os.environ.setdefault(k, v)
    rt = Runtime(args)
    try:
        httpd = ThreadingHTTPServer((args.host, args.port), make_handler(rt))
    except OSError as exc:
        log(f"ERROR: cannot bind {args.host}:{args.port}: {exc}")
        sys.exit(1)
    httpd.daemon_threads = True

    def on_term(signum: int, frame: Any) -> None:
        rt.stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    rt.start_workers()
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    log(f"INFO:     Started server process [{os.getpid()}]")
    log("INFO:     Waiting for application startup.")
    log("INFO:     Application startup complete.")
    log(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    time.sleep(args.standin_warmup_s)
    rid, w = rt.submit(4, 1)
    while not w.get(timeout=60)[3]:
        pass
    rt.done(rid, {})
    log('INFO:     127.0.0.1:0 - "POST /generate HTTP/1.1" 200 OK')
    rt.ready = True
    log("The server is fired up and ready to roll!")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
