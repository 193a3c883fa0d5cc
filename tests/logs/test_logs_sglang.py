"""SGLang records: each era and the edge cases the public corpus names (exact values)."""

from __future__ import annotations

import math

import pytest

from spectrial.logs import parse

DP = ("[2026-01-02 03:04:05 DP0 TP0] Decode batch, #running-req: 6, #token: 800, token usage: 0.11, accept len: 2.40, "
      "accept rate: 0.60, cuda graph: True, gen throughput (token/s): 80.00, #queue-req: 1, \n"
      "[2026-01-02 03:04:05 DP1 TP4] Decode batch, #running-req: 7, #token: 900, token usage: 0.12, accept len: 2.50, "
      "accept rate: 0.75, cuda graph: True, gen throughput (token/s): 88.80, #queue-req: 0, \n")


def nan(v: object) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def test_dp_attention_prints_one_row_per_rank_with_both_ranks() -> None:
    df = parse(DP)
    assert list(df["kind"]) == ["decode", "decode"]
    assert list(df["dp_rank"]) == [0, 1] and list(df["tp_rank"]) == [0, 4]
    assert list(df["accept_len"]) == [2.4, 2.5] and list(df["queue_req"]) == [1, 0]  # trailing ", " is harmless
    assert list(df["accept_rate"]) == [0.6, 0.75]


def test_time_only_timestamp_and_old_period_separator() -> None:
    df = parse("[16:43:29 TP3] Decode batch. #running-req: 2, #token: 50, token usage: 0.01, "
               "gen throughput (token/s): 31.50, #queue-req: 0\n")
    r = df.iloc[0]
    assert (r["timestamp"], r["tp_rank"], r["running_req"], r["gen_throughput"]) == ("16:43:29", 3, 2, 31.5)
    assert nan(r["dp_rank"]) and nan(r["accept_len"]) and nan(r["graph"])


def test_record_glued_behind_a_tqdm_bar_is_found_with_its_own_timestamp() -> None:
    line = ("Capturing batches (bs=10 avail_mem=11.99 GB):   0%|          | 0/5 [00:00<?, ?it/s]"
            "[2026-06-08 07:21:05 TP1] Decode batch, #running-req: 1, #token: 64, token usage: 0.00, "
            "gen throughput (token/s): 84.39, #queue-req: 0\n")
    r = parse(line).iloc[0]
    assert (r["kind"], r["timestamp"], r["tp_rank"], r["running_req"], r["gen_throughput"]) == (
        "decode", "2026-06-08 07:21:05", 1, 1, 84.39)


def test_fields_in_any_order_and_unknown_fields_ignored() -> None:
    r = parse("Decode batch, gen throughput (token/s): 12.50, #queue-req: 3, #new-field: 9, cpu graph: False, "
              "#running-req: 4\n").iloc[0]
    assert (r["gen_throughput"], r["queue_req"], r["running_req"], r["graph"]) == (12.5, 3, 4, False)


def test_clipped_line_keeps_the_fields_that_survived() -> None:
    r = parse("[2026-05-28 02:59:59 TP0] Decode batch, #running-req: 45, #token: 44672, token usaccept rate: 0.32, "
              "npu graph: False, gen throughput (token/s): 863.65, #queue-req\n").iloc[0]
    assert (r["running_req"], r["num_token"], r["accept_rate"], r["graph"], r["gen_throughput"]) == (
        45, 44672, 0.32, False, 863.65)
    assert nan(r["token_usage"]) and nan(r["queue_req"]) and nan(r["accept_len"])


def test_prefill_cache_hit_rate_percent_becomes_a_fraction() -> None:
    r = parse("[16:43:29 TP0] Prefill batch. #new-seq: 4, #new-token: 8192, #cached-token: 291, cache hit rate: "
              "2.76%, token usage: 0.04, #running-req: 1, #queue-req: 38\n").iloc[0]
    assert r["kind"] == "prefill" and r["cache_hit_rate"] == pytest.approx(0.0276)
    assert (r["new_seq"], r["new_token"], r["cached_token"], r["queue_req"]) == (4, 8192, 291, 38)


def test_startup_records_of_both_capture_eras_and_ready() -> None:
    df = parse("""\
[2026-06-08 07:20:53 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1106304, K size: 25.32 GB, V size: 25.32 GB
[2025-11-30 12:50:15] Capture cuda graph end. Time elapsed: 5.37 s. mem usage=1.44 GB. avail mem=38.05 GB.
[2026-01-02 03:04:01 TP0] Capture target verify CUDA graph end. bs=[1, 2, 4], elapsed=12.34 s, mem usage=1.50 GB, avail mem=20.00 GB.
[2026-01-02 03:04:06 TP0] Capture cuda graph bs [1, 2, 4, 8]
[2026-01-02 03:04:07 TP0] The server is fired up and ready to roll!
""")
    assert list(df["kind"]) == ["kv_cache", "graph_capture", "graph_capture", "ready"]
    assert (df.loc[0, "kv_tokens"], df.loc[0, "k_gb"], df.loc[0, "v_gb"]) == (1106304, 25.32, 25.32)
    assert (df.loc[1, "graph_name"], df.loc[1, "phase"], df.loc[1, "elapsed_s"], df.loc[1, "mem_gb"]) == (
        "main", "end", 5.37, 1.44)
    assert (df.loc[2, "graph_name"], df.loc[2, "elapsed_s"], df.loc[2, "mem_gb"], df.loc[2, "avail_mem_gb"]) == (
        "target verify", 12.34, 1.5, 20.0)
    assert df.loc[3, "line"] == 5 and df.loc[3, "timestamp"] == "2026-01-02 03:04:07"
    assert df.attrs["unparsed_lines"] == 1  # the `bs [...]` list line


def test_server_args_hard_wrapped_mid_token_is_joined() -> None:
    text = ("[2025-11-06 01:22:00] server_args=ServerArgs(model_path='/m/Qwen3-4B', tp_size=2, max_total_token\n"
            "s=None, speculative_algorithm='EAGLE3', cuda_graph_bs=[1, 2, 4], json_model_override_args='{}', "
            "mem_fraction_static=0.88)\n[2025-11-06 01:22:01] next record\n")
    df = parse(text)
    assert len(df) == 1 and df.loc[0, "line"] == 1
    assert df.loc[0, "args"] == {"model_path": "/m/Qwen3-4B", "tp_size": 2, "max_total_tokens": None,
                                 "speculative_algorithm": "EAGLE3", "cuda_graph_bs": [1, 2, 4],
                                 "json_model_override_args": "{}", "mem_fraction_static": 0.88}
    assert df.attrs["unparsed_lines"] == 1


def test_vllm_config_dump_is_not_taken_for_server_args() -> None:
    text = ("INFO 10-16 19:05:47 llm_engine.py:237] Initializing an LLM engine with config: model='m', "
            "chunked_prefill_size=None, disable_cuda_graph=False, mem_fraction_static=0.9\n")
    assert len(parse(text)) == 0


ROWS = [("Backend:", "sglang"), ("Traffic request rate:", "inf"), ("Max reqeuest concurrency:", "not set"),
        ("Successful requests:", "80"), ("Benchmark duration (s):", "12.50"),
        ("Output token throughput (tok/s):", "2000.50"), ("Total token throughput (tok/s):", "4000.25"),
        ("Concurrency:", "3.50"), ("Accept length:", "3.21"), "Time to First Token", ("Mean TTFT (ms):", "50.00"),
        ("Median TTFT (ms):", "45.00"), "Time per Output Token (excl. 1st token)", ("Median TPOT (ms):", "6.50"),
        "Inter-Token Latency", ("Median ITL (ms):", "6.40")]
# as sglang.bench_serving prints it: `{:<40} {:<10}` rows (trailing padding kept), `{:-^50}` section rules
BENCH = "\n".join(["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
                   *(f"{r[0]:<40} {r[1]:<10}" if isinstance(r, tuple) else f"{r:-^50}" for r in ROWS), "=" * 50,
                   "[2026-01-02 03:04:05 TP0] Decode batch, #running-req: 1, #token: 5, token usage: 0.00, "
                   "gen throughput (token/s): 9.00, #queue-req: 0", ""])


def test_bench_serving_block_with_typo_padding_and_sections() -> None:
    df = parse(BENCH)
    assert list(df["kind"]) == ["bench_serving", "decode"]
    b = df.iloc[0]
    assert (b["engine"], b["backend"], b["request_rate"], b["successful_requests"], b["duration_s"]) == (
        "sglang", "sglang", math.inf, 80, 12.5)
    assert nan(b["max_concurrency"])  # "not set", spelled `reqeuest` in that era
    assert (b["output_throughput"], b["total_throughput"], b["concurrency"], b["accept_len"]) == (
        2000.5, 4000.25, 3.5, 3.21)
    assert (b["median_ttft_ms"], b["median_tpot_ms"], b["median_itl_ms"], b["mean_ttft_ms"]) == (45.0, 6.5, 6.4, 50.0)
    assert df.iloc[1]["line"] == 19 and df.attrs["unparsed_lines"] == 0


def test_bench_one_batch_server_and_send_one_lines() -> None:
    df = parse("batch size: 1\nlast generation throughput: 72.69 tok/s\nacc_length: 2.31\n\n"
               "acc_length=2.42\nspeed=100.43 token/s\n")
    assert list(df["kind"]) == ["bench_one_batch", "bench_one_batch"]
    assert (df.loc[0, "gen_throughput"], df.loc[0, "accept_len"], df.loc[0, "line"]) == (72.69, 2.31, 2)
    assert (df.loc[1, "gen_throughput"], df.loc[1, "accept_len"], df.loc[1, "line"]) == (100.43, 2.42, 5)


def test_results_tables_known_and_unknown() -> None:
    text = ("bs | steps | topk | num_draft | throughput | acc len\n-- | -- | -- | -- | -- | --\n"
            "1 | 3 | 1 | 4 | 159.78 | 1.86\n4 | 3 | 3 | 8 | 426.46 | 2.27\n\n"
            "| Key | Value |\n|---|---|\n| Time taken (s) | 77.8 |\n")
    df = parse(text)
    assert list(df["kind"]) == ["results_table", "results_table"]
    assert df.loc[1, ["batch_size", "steps", "topk", "num_draft_tokens", "gen_throughput", "accept_len"]].tolist() == [
        4, 3, 3, 8, 426.46, 2.27]
    assert df.loc[0, "line"] == 3 and (df["engine"] == "sglang").all()


def test_startup_timings_with_cuda_graph_phases() -> None:
    r = parse("[2026-12-01 03:34:55] Engine startup timings (s): load_weight=154.93, kv_cache_allocation=0.44, "
              "scheduler_e2e=243.89, cuda_graph={prefill=64.55, decode=4.58, target_verify=0.00}, "
              "tokenizer_e2e=257.64\n").iloc[0]
    assert (r["kind"], r["load_weight_s"], r["kv_cache_allocation_s"], r["scheduler_e2e_s"]) == (
        "startup_timings", 154.93, 0.44, 243.89)
    assert r["tokenizer_e2e_s"] == 257.64 and r["cuda_graph_s"] == pytest.approx(69.13)
    empty = parse("Engine startup timings (s): load_weight=1.00, cuda_graph={}, tokenizer_e2e=2.00\n").iloc[0]
    assert nan(empty["cuda_graph_s"]) and empty["load_weight_s"] == 1.0 and nan(empty["scheduler_e2e_s"])


def test_stop_and_crash_events_tell_a_clean_exit_from_a_crash() -> None:
    df = parse("[2026-12-01 03:35:09] SIGTERM received. signum=None frame=None. Draining requests and shutting down...\n"
               "[2026-12-01 03:35:10] Gracefully exiting... Remaining number of requests 0. Remaining requests "
               "remaining_rids=[].\n"
               "[2026-12-01 03:36:11 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
               "[2026-12-01 03:36:12] Received sigquit from a child process. It usually means the child failed.\n")
    assert list(df["kind"]) == ["event"] * 4 and set(df["engine"]) == {"sglang"}
    assert df["event"].tolist() == ["sigterm", "graceful_exit", "scheduler_exception", "sigquit"]
    assert df.loc[2, "tp_rank"] == 0 and df.loc[2, "message"].startswith("Scheduler hit an exception: Traceback")
    assert df.loc[1, "timestamp"] == "2026-12-01 03:35:10"


def test_an_ansi_coloured_deprecation_warning_does_not_break_the_next_record() -> None:
    text = ("[2026-12-01 03:34:01] \x1b[1;33mThe argument --disable-cuda-graph is deprecated.\x1b[0m\n"
            "[2026-12-01 03:34:57] Decode batch, #running-req: 1, #token: 116, token usage: 0.00, accept len: 1.32, "
            "accept rate: 0.16, cuda graph: False, gen throughput (token/s): 108.18, #queue-req: 0\n")
    df = parse(text)
    assert list(df["kind"]) == ["event", "decode"]
    assert (df.loc[0, "event"], df.loc[0, "message"]) == ("deprecation", "The argument --disable-cuda-graph is deprecated.")
    assert (df.loc[1, "accept_len"], df.loc[1, "gen_throughput"], df.loc[1, "graph"]) == (1.32, 108.18, False)
    assert df.attrs["unparsed_lines"] == 0


def test_kv_cache_dtype_and_uvicorn_access_lines() -> None:
    df = parse("[2026-06-08 07:20:53 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1106304, "
               "K size: 25.32 GB, V size: 25.32 GB\n"
               '[2026-12-01 03:34:56] INFO:     127.0.0.1:41198 - "GET /health HTTP/1.1" 503 Service Unavailable\n'
               'INFO:     127.0.0.1:41178 - "GET /model_info HTTP/1.1" 200 OK\n')
    assert list(df["kind"]) == ["kv_cache", "access", "access"]
    assert df.loc[0, "kv_dtype"] == "torch.bfloat16" and df.loc[0, "kv_tokens"] == 1106304
    assert df["status"].tolist()[1:] == [503, 200] and df["path"].tolist()[1:] == ["/health", "/model_info"]
    assert df.loc[1, "timestamp"] == "2026-12-01 03:34:56" and df.loc[2, "engine"] == "http"
