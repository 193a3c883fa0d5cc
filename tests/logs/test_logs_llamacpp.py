"""llama.cpp records: request timings merged by slot/task or adjacency, draft acceptance of every format,
speculative statistics (exact values). Lines follow the format strings of llama.cpp 0c1e570 and the corpus."""

from __future__ import annotations

import math

import pytest

from spectrial.logs import parse


def nan(v: object) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def test_interleaved_slots_merge_by_slot_and_task() -> None:
    df = parse("""\
0.01.000.000 I slot print_timing: id  1 | task 9 | prompt eval time =      10.00 ms /    20 tokens (    0.50 ms per token,  2000.00 tokens per second)
0.01.000.001 I slot print_timing: id  0 | task 8 | prompt eval time =      30.00 ms /    40 tokens (    0.75 ms per token,  1333.33 tokens per second)
0.01.000.002 I slot print_timing: id  0 | task 8 |        eval time =     900.00 ms /   300 tokens (    3.00 ms per token,   333.33 tokens per second)
0.01.000.003 I slot print_timing: id  1 | task 9 |        eval time =     500.00 ms /   100 tokens (    5.00 ms per token,   200.00 tokens per second)
0.01.000.004 I slot print_timing: id  1 | task 9 |       total time =     510.00 ms /   120 tokens
0.01.000.005 I slot print_timing: id  0 | task 8 |       total time =     930.00 ms /   340 tokens
""")
    assert list(df["kind"]) == ["request_timing", "request_timing"]
    a, b = df.iloc[0], df.iloc[1]
    assert (a["line"], a["slot"], a["task"], a["prompt_ms"], a["eval_ms"], a["eval_tokens"], a["total_ms"]) == (
        1, 1, 9, 10.0, 500.0, 100, 510.0)
    assert (b["line"], b["slot"], b["task"], b["prompt_tokens"], b["gen_throughput"], b["total_ms"]) == (
        2, 0, 8, 40, 333.33, 930.0)
    assert a["timestamp"] == "0.01.000.000" and list(df["origin"]) == ["print_timing", "print_timing"]


def test_prefix_on_its_own_line_then_unprefixed_lines() -> None:
    head = "slot print_timing: id  0 | task 3 | \n"  # late-2024 builds: the message starts on the next line
    df = parse("slot      release: id  0 | task 0 | stop processing: n_past = 27, truncated = 0\n" + head +
               "prompt eval time =      21.74 ms /    11 tokens (    1.98 ms per token,   505.90 tokens per second)\n"
               "       eval time =     226.31 ms /    17 tokens (   13.31 ms per token,    75.12 tokens per second)\n"
               "      total time =     248.05 ms /    28 tokens\n" + head +
               "draft acceptance rate = 0.56556 ( 1376 accepted /  2433 generated)\n")
    assert list(df["kind"]) == ["request_timing", "draft_acceptance"]
    t, d = df.iloc[0], df.iloc[1]
    assert (t["slot"], t["task"], t["prompt_ms"], t["prompt_tokens"], t["eval_ms"], t["eval_tokens"]) == (
        0, 3, 21.74, 11, 226.31, 17)
    assert (t["gen_throughput"], t["total_ms"], t["line"], t["origin"]) == (75.12, 248.05, 3, "print_timing")
    assert (d["slot"], d["task"], d["accept_rate"], d["accepted"], d["drafted"]) == (0, 3, 0.56556, 1376, 2433)
    assert nan(d["accept_len"])


def test_mid_2024_server_format_with_id_slot_and_generation_eval() -> None:
    df = parse("""\
INFO [           print_timings] prompt eval time     =      29.44 ms /    10 tokens (    2.94 ms per token,   339.71 tokens per second) | tid="1" timestamp=1718 id_slot=2 id_task=7 t_prompt_processing=29.437
INFO [           print_timings] generation eval time =     400.00 ms /    20 runs   (   20.00 ms per token,    50.00 tokens per second) | tid="1" timestamp=1718 id_slot=2 id_task=7 t_token_generation=400
INFO [           print_timings]           total time =     429.44 ms | tid="1" timestamp=1718 id_slot=2 id_task=7 t_prompt_processing=29.437
""")
    r = df.iloc[0]
    assert len(df) == 1 and (r["slot"], r["task"], r["prompt_ms"], r["eval_ms"], r["eval_tokens"], r["total_ms"]) == (
        2, 7, 29.44, 400.0, 20, 429.44)
    assert r["origin"] == "print_timing"


def test_draft_acceptance_formats_and_position_merge() -> None:
    df = parse("""\
0.02.000.000 I slot print_timing: id  0 | task 4 | draft acceptance = 0.62264 (  165 accepted /   265 generated), mean len =  2.85
0.02.000.001 I slot print_timing: id  0 | task 4 |      acc per pos = (0.805, 0.632, 0.483)
0.03.000.000 I slot print_timing: id  0 | task 5 | mean acceptance length =  2.92, acceptance rate per position = (0.900, 0.700)
""")
    assert list(df["kind"]) == ["draft_acceptance", "draft_acceptance"]
    a, b = df.iloc[0], df.iloc[1]
    assert (a["accept_rate"], a["accepted"], a["drafted"], a["accept_len"], a["task"]) == (0.62264, 165, 265, 2.85, 4)
    assert a["per_position"] == pytest.approx([0.805, 0.632, 0.483])
    assert (b["accept_len"], b["task"]) == (2.92, 5) and b["per_position"] == pytest.approx([0.9, 0.7])
    assert nan(b["accept_rate"])


def test_spec_statistics_line_with_durations() -> None:
    r = parse("0.07.100.006 I spec common_specu: statistics         ngram-map: #calls(b,g,a) =    3    120    118, "
              "#gen drafts =    100, #acc drafts =    60, #gen tokens =    400, #acc tokens =   150, "
              "dur(b,g,a) = 0.100, 12.500, 0.900 ms\n").iloc[0]
    assert (r["kind"], r["spec_type"], r["calls_begin"], r["calls_draft"], r["calls_accept"]) == (
        "spec_statistics", "ngram-map", 3, 120, 118)
    assert (r["drafts_gen"], r["drafts_acc"], r["tokens_gen"], r["tokens_acc"]) == (100, 60, 400, 150)
    assert (r["begin_ms_total"], r["draft_ms_total"], r["accept_ms_total"]) == (0.1, 12.5, 0.9)
    assert nan(r["accept_len"]) and r["per_position"] is None  # printed only once an accept call happened


def test_llama_speculative_summary_and_inf_speed() -> None:
    df = parse("""\
encoded   14 tokens in    0.054 seconds, speed:  258.250 t/s
decoded  673 tokens in   12.132 seconds, speed:   55.473 t/s

n_draft   = 5
n_predict = 673
n_drafted = 730
n_accept  = 526
accept    = 72.055%

llama_print_timings:      sample time =     0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)
""")
    assert list(df["kind"]) == ["request_timing", "draft_acceptance"]
    t, d = df.iloc[0], df.iloc[1]
    assert (t["prompt_tokens"], t["prompt_ms"], t["eval_tokens"], t["eval_ms"], t["gen_throughput"]) == (
        14, 54.0, 673, 12132.0, 55.473)
    assert t["origin"] == "speculative"
    assert (d["line"], d["draft_max"], d["drafted"], d["accepted"]) == (4, 5, 730, 526)
    assert d["accept_rate"] == pytest.approx(0.72055)


def test_in_flight_progress_and_compact_timings_json() -> None:
    df = parse('7.35.949.914 I slot print_timing: id  0 | task 785 | n_decoded =    102, tg =  17.48 t/s, tg_3s =  '
               '17.48 t/s\n{"content":"x","timings":{"prompt_n":12,"prompt_ms":30.5,"predicted_n":64,'
               '"predicted_ms":800.0,"predicted_per_second":80.0,"draft_n":90,"draft_n_accepted":45}}\n')
    assert list(df["kind"]) == ["gen_progress", "request_timing"]
    p, t = df.iloc[0], df.iloc[1]
    assert (p["n_decoded"], p["gen_throughput"], p["gen_throughput_3s"], p["task"]) == (102, 17.48, 17.48, 785)
    assert (t["prompt_tokens"], t["prompt_ms"], t["eval_tokens"], t["eval_ms"], t["gen_throughput"]) == (
        12, 30.5, 64, 800.0, 80.0)
    assert (t["drafted"], t["accepted"]) == (90, 45)


def test_lead_filter_columns_exist_even_without_records() -> None:
    df = parse("nothing here\n")
    for col in ("prompt_ms", "prompt_tokens", "eval_ms", "eval_tokens", "gen_throughput", "accept_rate", "accepted",
                "drafted", "accept_len", "per_position", "spec_type", "drafts_gen", "drafts_acc", "tokens_gen",
                "tokens_acc", "draft_ms_total"):
        assert col in df.columns
