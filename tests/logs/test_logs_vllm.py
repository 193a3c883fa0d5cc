"""vLLM records: V0 and every V1 era of the spec-decoding metrics, throughput lines, bench serve (exact values)."""

from __future__ import annotations

import math

import pytest

from spectrial.logs import parse


def nan(v: object) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


@pytest.mark.parametrize(("line", "expect"), [
    ("INFO 10-16 19:05:47 metrics.py:367] Speculative metrics: Draft acceptance rate: 0.642, System efficiency: "
     "0.598, Number of speculative tokens: 3, Number of accepted tokens: 8547, Number of draft tokens: 13311, "
     "Number of emitted tokens: 10616.",
     dict(accept_rate=0.642, accepted=8547, drafted=13311, num_spec_tokens=3, system_efficiency=0.598, emitted=10616,
          accept_len=None, timestamp="10-16 19:05:47")),
    ("INFO 07-24 04:00:31 metrics.py:316] Speculative metrics: Draft acceptance rate: 0.000, System efficiency: "
     "0.059, Number of speculative tokens: 16, Number of accepted tokens: 0, Number of draft tokens tokens: 42272, "
     "Number of emitted tokens tokens: 2642.",
     dict(accept_rate=0.0, accepted=0, drafted=42272, emitted=2642)),
    ("Speculative metrics: Draft acceptance rate: 1.000, Number of accepted tokens: 66, Number of draft tokens: 66, ",
     dict(accept_rate=1.0, accepted=66, drafted=66, timestamp=None)),
    ("SpecDecoding metrics: Draft acceptance rate: 100.0%, Accepted: 66 tokens, Drafted: 66 tokens",
     dict(accept_rate=1.0, accepted=66, drafted=66, accept_len=None)),
    ("INFO 06-06 14:20:34 [metrics.py:86] SpecDecoding metrics: Draft acceptance rate: 38.8%, Mean acceptance length: "
     "2.16, Accepted: 150 tokens, Drafted: 387 tokens, Per-position acceptance rate: 0.543, 0.357, 0.264",
     dict(accept_rate=0.388, accept_len=2.16, accepted=150, drafted=387, per_position=[0.543, 0.357, 0.264])),
    ("(APIServer pid=1) INFO 05-01 14:24:50 [metrics.py:101] SpecDecoding metrics: Mean acceptance length: 2.37, "
     "Accepted throughput: 8.90 tokens/s, Drafted throughput: 97.50 tokens/s, Accepted: 89 tokens, Drafted: 975 "
     "tokens, Per-position acceptance rate: 0.600, 0.385, 0.000, Avg Draft acceptance rate: 9.1%",
     dict(accept_len=2.37, accepted_throughput=8.9, drafted_throughput=97.5, accepted=89, drafted=975,
          per_position=[0.6, 0.385, 0.0], accept_rate=0.091, timestamp="05-01 14:24:50")),
])
def test_spec_metrics_every_era(line: str, expect: dict) -> None:
    df = parse(line + "\n")
    assert list(df["kind"]) == ["spec_metrics"]
    r = df.iloc[0]
    for col, want in expect.items():
        if want is None:
            assert nan(r[col]), col
        elif isinstance(want, list):
            assert r[col] == pytest.approx(want), col
        else:
            assert r[col] == (pytest.approx(want) if isinstance(want, float) else want), col


def test_throughput_v0_and_v1_with_dp_engines() -> None:
    df = parse("""\
INFO 07-24 04:00:31 metrics.py:295] Avg prompt throughput: 558.7 tokens/s, Avg generation throughput: 127.4 tokens/s, Running: 2 reqs, Swapped: 0 reqs, Pending: 5 reqs, GPU KV cache usage: 0.8%, CPU KV cache usage: 40.0%.
(APIServer pid=1) INFO 05-02 20:46:59 [loggers.py:271] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 35.2 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 56.1%, Prefix cache hit rate: 76.5%
(APIServer pid=1) INFO 05-02 20:46:59 [loggers.py:271] Engine 001: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 30.0 tokens/s, Running: 3 reqs, Waiting: 2 reqs, GPU KV cache usage: 10.0%, Prefix cache hit rate: 0.0%
""")
    assert list(df["kind"]) == ["throughput"] * 3
    v0, e0, e1 = (df.iloc[i] for i in range(3))
    assert (v0["prompt_throughput"], v0["gen_throughput"], v0["running_req"], v0["waiting_req"], v0["swapped_req"]) == (
        558.7, 127.4, 2, 5, 0)
    assert v0["kv_cache_usage"] == pytest.approx(0.008) and nan(v0["dp_rank"])  # GPU, not the CPU figure
    assert (e0["dp_rank"], e0["kv_cache_usage"], e0["cache_hit_rate"]) == (0, pytest.approx(0.561), pytest.approx(0.765))
    assert (e1["dp_rank"], e1["running_req"], e1["waiting_req"]) == (1, 3, 2)


def test_access_log_lines_are_http_access_records() -> None:
    df = parse('(APIServer pid=17943) INFO  127.0.0.1:53300 "POST /v1/completions HTTP/1.1" 200 OK\n'
               'INFO:     ::1:50352 - "POST /v1/completions HTTP/1.1" 200 OK\n')
    assert list(df["kind"]) == ["access", "access"] and set(df["engine"]) == {"http"}
    assert df["client"].tolist() == ["127.0.0.1:53300", "::1:50352"] and df["status"].tolist() == [200, 200]
    assert df["method"].tolist() == ["POST", "POST"] and df["path"].tolist() == ["/v1/completions"] * 2
    assert (df.loc[0, "process"], df.loc[0, "pid"]) == ("APIServer", 17943) and df.loc[1, "process"] is None
    assert df.attrs["unparsed_lines"] == 0


def test_v1_process_prefix_is_read_on_every_kind() -> None:
    df = parse("(APIServer pid=1) INFO 05-02 20:46:59 [loggers.py:271] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
               "Avg generation throughput: 35.2 tokens/s, Running: 1 reqs, Waiting: 0 reqs\n"
               "(EngineCore_DP0 pid=214) INFO 05-02 20:47:00 [metrics.py:101] SpecDecoding metrics: Mean acceptance "
               "length: 1.50, Accepted: 5 tokens, Drafted: 30 tokens\n"
               "INFO 05-02 20:47:01 [metrics.py:101] SpecDecoding metrics: Mean acceptance length: 1.50\n")
    assert df["process"].tolist() == ["APIServer", "EngineCore_DP0", None]
    assert df["pid"].tolist()[:2] == [1, 214] and nan(df.loc[2, "pid"])
    assert df.loc[0, "dp_rank"] == 0 and df.loc[1, "accept_len"] == 1.5


def test_v1_engine_config_line_with_speculative_config() -> None:
    r = parse("(EngineCore pid=7) INFO 12-01 03:03:44 [core.py:133] Initializing a V1 LLM engine (v0.26.0) with config: "
              "model='/m/llama', speculative_config=SpeculativeConfig(method='draft_model', model='/m/draft', "
              "num_spec_tokens=5), tokenizer='/m/llama', max_seq_len=512, enforce_eager=True, seed=0\n").iloc[0]
    assert (r["kind"], r["version"], r["model"], r["process"], r["pid"]) == ("engine_config", "0.26.0", "/m/llama",
                                                                             "EngineCore", 7)
    assert (r["spec_method"], r["spec_model"], r["num_spec_tokens"]) == ("draft_model", "/m/draft", 5)
    assert r["args"]["max_seq_len"] == 512 and r["args"]["enforce_eager"] is True
    assert r["args"]["speculative_config"].startswith("SpeculativeConfig(method='draft_model'")
    none = parse("INFO 12-01 03:03:44 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='m', "
                 "speculative_config=None, seed=0\n").iloc[0]
    assert none["model"] == "m" and none["spec_method"] is None and nan(none["num_spec_tokens"])


def test_non_default_args_complete_and_elided() -> None:
    full = parse("(APIServer pid=3) INFO 12-01 03:03:33 [api_utils.py:286] non-default args: {'model_tag': '/m', "
                 "'port': 8123, 'max_model_len': 512, 'speculative_config': {'method': 'ngram', "
                 "'num_speculative_tokens': 3, 'prompt_lookup_max': 3}}\n").iloc[0]
    assert (full["kind"], full["engine"], full["spec_method"], full["num_spec_tokens"]) == (
        "server_args", "vllm", "ngram", 3)
    assert full["args"] == {"model_tag": "/m", "port": 8123, "max_model_len": 512,
                            "speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                                   "prompt_lookup_max": 3}}
    cut = parse("INFO 12-01 03:03:33 [api_utils.py:286] non-default args: {'host': '127.0.0.1', 'port': 81\n").iloc[0]
    assert cut["args"] == {"host": "127.0.0.1", "port": 81} and cut["spec_method"] is None


def test_eagle3_auxiliary_layers() -> None:
    r = parse("(Worker pid=18112) INFO 12-01 03:03:54 [gpu_model_runner.py:5243] Using auxiliary layers from "
              "speculative config: (2, 16, 29)\n").iloc[0]
    assert (r["kind"], r["aux_layers"], r["process"]) == ("aux_layers", [2.0, 16.0, 29.0], "Worker")


def test_docker_timestamp_prefix_keeps_the_engine_timestamp() -> None:
    df = parse("2026-05-12T07:51:39.301802920Z (APIServer pid=1) INFO 05-12 07:51:39 [loggers.py:271] Engine 000: "
               "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 76.6 tokens/s, Running: 8 reqs, "
               "Waiting: 0 reqs, GPU KV cache usage: 57.3%, Prefix cache hit rate: 0.0%\n")
    assert df.loc[0, "timestamp"] == "05-12 07:51:39" and df.loc[0, "gen_throughput"] == 76.6


def test_offline_spec_decode_summary_with_positions() -> None:
    df = parse("--------------------------------------------------\ntotal_num_output_tokens: 16990\nnum_drafts: 4816\n"
               "num_draft_tokens: 33712\nnum_accepted_tokens: 12208\nmean acceptance length: 3.53\n"
               "--------------------------------------------------\nacceptance at token 0: 0.81\n"
               "acceptance at token 1: 0.60\nacceptance at token 2: 0.45\nDone.\n")
    r = df.iloc[0]
    assert (r["kind"], r["line"], r["drafts"], r["drafted"], r["accepted"], r["accept_len"]) == (
        "spec_summary", 2, 4816, 33712, 12208, 3.53)
    assert r["per_position"] == [0.81, 0.6, 0.45]
    assert df.attrs["unparsed_lines"] == 2  # the first rule and "Done."


def test_vllm_bench_serve_block_is_marked_vllm() -> None:
    df = parse("============ Serving Benchmark Result ============\n"
               "Successful requests:                     16\nFailed requests:                         0\n"
               "Maximum request concurrency:             1\nBenchmark duration (s):                  38.06\n"
               "Output token throughput (tok/s):         39.96\n---------------Speculative Decoding---------------\n"
               "Acceptance rate (%):                     62.50\nAcceptance length:                       2.88\n"
               "==================================================\n")
    r = df.iloc[0]
    assert (r["engine"], r["kind"], r["max_concurrency"], r["failed_requests"], r["output_throughput"]) == (
        "vllm", "bench_serving", 1, 0, 39.96)
    assert (r["accept_rate"], r["accept_len"]) == (0.625, 2.88)
