"""Property-based fuzzing of the streaming client's parser (issue 37): whatever bytes a server streams back (random
bytes, event streams of arbitrary JSON, mutations of real streams of llama.cpp, vLLM and SGLang), one request
returns a record (failures are data), never raises, never hangs, and never holds more token events than
max_tokens + the margin. `SPECTRIAL_FUZZ_EXAMPLES` raises the examples per property (CI: 150)."""

from __future__ import annotations

import json
import os
import time

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectrial.measure.bench import StreamLimits, stream_completion
from spectrial.measure.httpread import PROBE, BoundedTransport, Limits
from spectrial.schema import RequestRecord

EXAMPLES = int(os.environ.get("SPECTRIAL_FUZZ_EXAMPLES", "150"))
MAX_TOKENS = 8
LIMITS = StreamLimits(first_token_s=5, idle_s=5, per_token_s=1, margin=4, bytes_per_token=4096)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize=True)

REAL = [  # what the engines stream, as their own tests record it (tests/measure/test_bench_stream.py's patterns)
    b'data: {"choices":[{"text":"a","index":0,"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"text":"b","index":0,"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"text":"","index":0,"finish_reason":"length"}],"usage":{"prompt_tokens":3,'
    b'"completion_tokens":2},"timings":{"predicted_n":2,"predicted_ms":5.0,"draft_n":2,"draft_n_accepted":1}}\n\n'
    b"data: [DONE]\n\n",
    b'data: {"choices":[{"delta":{"role":"assistant","content":""}}],"usage":{"completion_tokens":0}}\n\n'
    b'data: {"choices":[{"delta":{"content":"x"}}],"usage":{"completion_tokens":2}}\n\n'
    b'data: {"choices":[{"delta":{},"finish_reason":"length"}],"usage":{"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n",
    b'data: {"text":"a","meta_info":{"completion_tokens":1}}\n\n'
    b'data: {"text":"ab","meta_info":{"completion_tokens":3,"spec_verify_ct":1}}\n\n'
    b"data: [DONE]\n\n",
]
KEYS = ["choices", "usage", "text", "delta", "content", "reasoning_content", "role", "meta_info", "completion_tokens",
        "prompt_tokens", "timings", "finish_reason", "predicted_n", "draft_n", "draft_n_accepted", "index"]
JSON = st.recursive(st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner,
                                                                                max_size=5), max_leaves=20)


def fetch(body: bytes, content_type: str = "text/event-stream") -> RequestRecord:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Type": content_type}, content=body)

    transport = BoundedTransport(Limits(deadline_s=10, read_s=10, max_bytes=PROBE.max_bytes),
                                 inner=httpx.MockTransport(handler))
    with httpx.Client(transport=transport) as client:
        t0 = time.monotonic()
        rec = stream_completion(client, "http://fuzz", {"prompt": "p", "max_tokens": MAX_TOKENS, "stream": True,
                                                          "ignore_eos": True},
                                None, 5, limits=LIMITS)
        assert time.monotonic() - t0 < 5
    assert isinstance(rec, RequestRecord)
    assert len(rec.events_ms or []) <= MAX_TOKENS + LIMITS.margin + 1
    return rec


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes(body: bytes) -> None:
    fetch(body)


@FUZZ
@given(st.lists(JSON, max_size=40), st.booleans())
def test_event_streams_of_arbitrary_json(objs: list, done: bool) -> None:
    body = b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) + (b"data: [DONE]\n\n" if done else b"")
    fetch(body)


@FUZZ
@given(st.sampled_from(REAL), st.data())
def test_mutations_of_real_streams(real: bytes, data: st.DataObject) -> None:
    body = bytearray(real)
    for _ in range(data.draw(st.integers(0, 8))):
        i = data.draw(st.integers(0, max(len(body) - 1, 0)))
        op = data.draw(st.sampled_from(["flip", "cut", "dup", "insert"]))
        if op == "flip" and body:
            body[i] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del body[i:]
        elif op == "dup":
            body[i:i] = body[i:i + data.draw(st.integers(1, 64))] * data.draw(st.integers(1, 50))
        else:
            body[i:i] = data.draw(st.binary(min_size=1, max_size=32))
    fetch(bytes(body))


def test_a_deeply_nested_event_and_a_huge_usage_are_data() -> None:
    """JSON nested past Python's recursion limit, and usage fields of the wrong types, are a failed request."""
    rec = fetch(b"data: " + b"[" * 200_000 + b"\n\n")
    assert rec.error is not None
    rec = fetch(b'data: {"choices":[{"text":"a"}],"usage":{"completion_tokens":"many"}}\n\ndata: [DONE]\n\n')
    assert isinstance(rec, RequestRecord)
    rec = fetch(b'data: {"choices":[{"text":"a"}],"usage":{"completion_tokens":1e300}}\n\ndata: [DONE]\n\n')
    assert rec.violation is not None or rec.error is not None
