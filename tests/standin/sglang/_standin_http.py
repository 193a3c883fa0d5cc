"""TEST DOUBLE: the HTTP side of the SGLang stand-in (see `sglang/launch_server.py`).

Endpoints as SGLang 0.5.17 answers them: `/health` and `/health_generate` (503 with an empty body while
starting or shutting down, else a 1-token generation checked once a second), `/server_info` (every
ServerArgs field, `internal_states`, `version`; answers while /health is still 503) and the deprecated
`/get_server_info`, `/v1/models`, `/metrics` (with --enable-metrics), `POST /generate` (meta_info with the
speculative statistics), `POST /v1/completions` and `POST /v1/chat/completions` (no speculative statistics;
chat messages rendered with the model folder's `tokenizer_config.json` chat template, as SGLang renders them
with the Hugging Face tokenizer's: 400 without one). Every request is logged as
uvicorn logs it, when the response starts: `INFO:     127.0.0.1:PORT - "GET /health HTTP/1.1" 200 OK`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import sglang
from sglang._standin_common import access_line, log
from sglang._standin_metrics import CONTENT_TYPE
from sglang._standin_runtime import Runtime


def make_handler(rt: Runtime) -> type[BaseHTTPRequestHandler]:
    """HTTP handler bound to the runtime."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def version_string(self) -> str:
            return "uvicorn"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

        def _start(self, code: int, ctype: str | None, length: int | None) -> None:
            self.send_response_only(code)
            self.send_header("date", self.date_time_string())
            self.send_header("server", "uvicorn")
            if length is not None:
                self.send_header("content-length", str(length))
            else:
                self.send_header("Connection", "close")
                self.close_connection = True
            if ctype:
                self.send_header("content-type", ctype)
            self.end_headers()
            access_line(self.client_address, self.command, self.path, self.request_version, code)

        def _body(self, code: int, body: bytes, ctype: str | None) -> None:
            self._start(code, ctype, len(body))
            self.wfile.write(body)

        def _json(self, code: int, obj: Any) -> None:
            self._body(code, json.dumps(obj).encode(), "application/json")

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?")[0]
            legacy = rt.args.standin_legacy_server_info
            if path in ("/health", "/health_generate"):
                self._body(rt.health(), b"", None)
            elif path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": rt.model_name, "object": "model",
                                                             "owned_by": "sglang", "root": rt.model_name}]})
            elif path == "/server_info" and not legacy or path == "/get_server_info":
                if path == "/get_server_info" and not legacy:
                    log("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                        "Please use '/server_info' instead.")
                info = {k: v for k, v in vars(rt.args).items() if not k.startswith("standin_")}
                self._json(200, {**info, "max_total_num_tokens": 100000,
                                 "internal_states": [rt.internal_state()], "version": sglang.__version__})
            elif path == "/metrics" and rt.metrics is not None:
                self._body(200, rt.metrics.exposition(), CONTENT_TYPE)
            else:
                self._json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            n = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
            except json.JSONDecodeError:
                self._json(400, {"error": "invalid JSON"})
                return
            if self.path == "/v1/completions":
                self._completions(body)
            elif self.path == "/v1/chat/completions":
                self._chat_completions(body)
            elif self.path == "/generate":
                self._generate(body)
            else:
                self._json(404, {"detail": "Not Found"})

        def _run(self, prompt: Any, max_new: int) -> Iterator[tuple[int, dict[str, Any], int]]:
            st = rt.submit(max(1, len(str(prompt).split())), max_new)
            while True:
                k, finished, meta, tok = st.events.get(timeout=3600)
                yield k, meta, tok
                if finished:
                    return

        def _sse_start(self) -> None:
            self._start(200, "text/event-stream", None)

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
                total, meta = sum(k for k, _, _ in events), events[-1][1]
                self._json(200, {**base, "choices": [{"index": 0, "text": " tok" * total, "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": total,
                                           "total_tokens": meta["prompt_tokens"] + total}})
                return
            self._sse_start()
            meta: dict[str, Any] = {}
            for k, meta, _ in self._run(body.get("prompt", ""), max_new):
                fin = "length" if meta.get("finish_reason") else None
                self._send({**base, "choices": [{"index": 0, "text": " tok" * k, "logprobs": None,
                                                 "finish_reason": fin, "matched_stop": None}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                self._send({**base, "choices": [], "usage": {
                    "prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
                    "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"]}})
            self._send("[DONE]")

        def _chat_completions(self, body: dict[str, Any]) -> None:
            """Streaming chat as SGLang's OpenAI server sends it: a first chunk with the role, content deltas,
            the finish reason, the usage chunk when asked, [DONE]."""
            try:
                prompt = chat_prompt(rt.args.model_path, body.get("messages") or [])
            except ValueError as exc:
                self._json(400, {"object": "error", "message": str(exc), "type": "BadRequestError", "code": 400})
                return
            max_new = body.get("max_completion_tokens") or body.get("max_tokens") or 16
            cid = uuid.uuid4().hex
            base = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                    "model": body.get("model", "")}
            self._sse_start()
            self._send({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}]})
            meta: dict[str, Any] = {}
            for k, meta, _ in self._run(prompt, max_new):
                fin = "length" if meta.get("finish_reason") else None
                self._send({**base, "choices": [{"index": 0, "delta": {"content": " tok" * k}, "logprobs": None,
                                                 "finish_reason": fin, "matched_stop": None}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                self._send({**base, "choices": [], "usage": {
                    "prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
                    "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"]}})
            self._send("[DONE]")

        def _generate(self, body: dict[str, Any]) -> None:
            sp = body.get("sampling_params") or {}
            max_new = sp.get("max_new_tokens") or 16
            text, ids = "", []
            if not body.get("stream"):
                events = list(self._run(body.get("text", ""), max_new))
                ids = [tok for k, _, tok in events for _ in range(k)]
                self._json(200, {"text": " tok" * len(ids), "output_ids": ids, "meta_info": events[-1][1]})
                return
            self._sse_start()
            for k, meta, tok in self._run(body.get("text", ""), max_new):
                text += " tok" * k
                ids += [tok] * k
                self._send({"text": text, "output_ids": ids, "meta_info": meta})
            self._send("[DONE]")

    return Handler


def chat_prompt(model_path: str, messages: list[dict[str, Any]]) -> str:
    """The model's chat template (tokenizer_config.json) rendered with the generation prompt, as
    `tokenizer.apply_chat_template(messages, add_generation_prompt=True)` renders it."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    cfg_file = Path(model_path) / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    template = cfg.get("chat_template")
    if not template:
        raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set and no "
                         "template argument was passed!")

    def token(name: str) -> str:
        v = cfg.get(name) or ""
        return v.get("content", "") if isinstance(v, dict) else str(v)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=token("bos_token"), eos_token=token("eos_token"))
