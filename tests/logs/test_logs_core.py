"""The driver: sources, block boundaries, line numbers, unparsed counting, registry, kinds, summary."""

from __future__ import annotations

import gzip
import io
import re
from pathlib import Path

import pandas as pd
import pytest

from spectrial.errors import ConfigError
from spectrial.logs import BlockFormat, LineFormat, Registry, parse, register, registry, summary

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"
MIXED = "\n".join((FIXTURES / f"{n}.log").read_text() for n in (
    "sglang_decode_2026_comma", "sglang_bench_serving_ngram", "nvidia_smi_table_595", "sglang_server_args_wrapped_0.5.4",
    "llamacpp_cli_perf_and_speculative", "vllm_v1_2026_loggers_271", "nccl_tuning_table_2_8_3",
    "llamacpp_server_0c1e570_lv4_synthetic", "specforge_results_table_tp4", "nvidia_smi_topo_space_aligned"))


def test_every_source_kind_gives_the_same_table(tmp_path: Path) -> None:
    plain = tmp_path / "a.log"
    plain.write_text(MIXED)
    gz = tmp_path / "a.log.gz"
    gz.write_bytes(gzip.compress(MIXED.encode()))
    ref = parse(MIXED)
    assert len(ref) > 60 and ref.attrs["parser_errors"] == []
    for src in (plain, str(plain), gz, MIXED.encode(), MIXED.splitlines(), MIXED.splitlines(keepends=True),
                io.BytesIO(MIXED.encode()), io.StringIO(MIXED)):
        got = parse(src)
        pd.testing.assert_frame_equal(got, ref)
        assert got.attrs["unparsed_lines"] == ref.attrs["unparsed_lines"]


@pytest.mark.parametrize("block", [40, 333, 4096])
def test_small_blocks_give_the_same_table(block: int) -> None:
    ref = parse(MIXED)
    got = parse(MIXED, block_bytes=block)  # records and multi-line blocks cross block boundaries
    pd.testing.assert_frame_equal(got, ref)
    assert (got.attrs["unparsed_lines"], got.attrs["lines"]) == (ref.attrs["unparsed_lines"], ref.attrs["lines"])


def test_line_numbers_blank_lines_crlf_and_unparsed() -> None:
    text = ("hello\r\n\r\n[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 3, #token: 9, token usage: 0.10, "
            "gen throughput (token/s): 5.00, #queue-req: 0\r\n\r\nbye\r\n")
    df = parse(text)
    assert df["line"].tolist() == [3] and df.loc[0, "queue_req"] == 0 and df.loc[0, "gen_throughput"] == 5.0
    assert (df.attrs["lines"], df.attrs["unparsed_lines"]) == (5, 2)


def test_ansi_colours_real_and_mangled() -> None:
    text = ("\x1b[34m0.05.756.667\x1b[0m \x1b[32mI \x1b[0mslot print_timing: id  0 | task 0 | prompt eval time =  "
            "    21.74 ms /    11 tokens (    1.98 ms per token,   505.90 tokens per second)\n"
            "?[32mINFO?[0m 05-02 20:46:59 [loggers.py:271] Engine 000: Avg prompt throughput: ?[1m2.0?[0m tokens/s, "
            "Avg generation throughput: 35.2 tokens/s, Running: 1 reqs\n")
    df = parse(text)
    assert df["kind"].tolist() == ["request_timing", "throughput"]
    assert (df.loc[0, "timestamp"], df.loc[0, "prompt_ms"]) == ("0.05.756.667", 21.74)
    assert (df.loc[1, "prompt_throughput"], df.loc[1, "gen_throughput"]) == (2.0, 35.2)


def test_binary_noise_and_invalid_utf8_keep_line_numbers() -> None:
    data = (b"\xff\xfe\x00garbage\x80\n"
            b"Decode batch, #running-req: 1, #token: 2, token usage: 0.50, gen throughput (token/s): 3.00\n"
            b"\x00\x01\x02\n")
    df = parse(data)
    assert df["line"].tolist() == [2] and df.loc[0, "token_usage"] == 0.5
    assert df.attrs["unparsed_lines"] == 2


def test_half_written_gzip_keeps_what_was_read(tmp_path: Path) -> None:
    text = "".join(f"Decode batch, #running-req: {i}, #token: 1, token usage: 0.0, #queue-req: 0\n"
                   for i in range(5000))
    full = gzip.compress(text.encode())
    cut = tmp_path / "live.log.gz"
    cut.write_bytes(full[: len(full) * 2 // 3])
    df = parse(cut, block_bytes=4096)
    assert 0 < len(df) < 5000 and df["running_req"].tolist() == list(range(len(df)))
    assert "EOFError" in df.attrs["read_error"] or "Error" in df.attrs["read_error"]


def test_empty_input_has_the_full_schema() -> None:
    df = parse("")
    assert len(df) == 0 and df.attrs["unparsed_lines"] == 0
    assert {"line", "engine", "kind", "timestamp", "accept_len", "verify_ms", "transport", "memory_used_mib",
            "src", "link", "args"} <= set(df.columns)


def test_missing_files_and_bad_sources_name_the_parameter(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="source"):
        parse(tmp_path / "nope.log")
    with pytest.raises(ConfigError, match="source"):
        parse(str(tmp_path / "nope.log"))
    with pytest.raises(ConfigError, match="source"):
        parse(12345)
    assert len(parse("no path, just one log line without records")) == 0


def test_kinds_filter_by_kind_engine_or_pair() -> None:
    assert set(parse(MIXED, kinds="decode")["kind"]) == {"decode"}
    assert set(parse(MIXED, kinds=["nccl", "topology"])["kind"]) == {"tuning", "topology"}
    only = parse(MIXED, kinds="llamacpp:draft_acceptance")
    assert set(only["kind"]) == {"draft_acceptance"} and len(only) == 3
    with pytest.raises(ConfigError, match="kinds: unknown \\['decodes'\\].*decode"):
        parse(MIXED, kinds="decodes")


def test_a_new_line_format_is_one_small_function() -> None:
    reg = Registry()

    @reg.register("myengine", "step", markers=["step time:"], columns={"step_ms": "float", "phase": "str"})
    def step(line: str) -> dict | None:
        m = re.search(r"step time: ([0-9.]+) ms \((\w+)\)", line)
        return {"step_ms": float(m.group(1)), "phase": m.group(2)} if m else None

    reg.add(LineFormat("myengine", "tick", ("tick ",), (r"tick (?P<tick>[0-9]+)",)))
    df = parse("x\nstep time: 1.5 ms (draft)\nstep time: broken\ntick 7\n", registry=reg)
    assert df[["line", "kind", "step_ms", "phase", "tick"]].values.tolist()[0] == [2, "step", 1.5, "draft", None] or (
        df.loc[0, "tick"] != df.loc[0, "tick"])
    assert df["kind"].tolist() == ["step", "tick"] and df.loc[1, "tick"] == 7
    assert df.attrs["unparsed_lines"] == 2


def test_registry_rejects_clashing_markers_and_bad_patterns() -> None:
    with pytest.raises(ConfigError, match="already used"):
        register("x", "y", markers=["Decode batch"], columns=["a"])(lambda line: None)
    with pytest.raises(ConfigError, match="named group"):
        LineFormat("x", "y", ("m",), (r"([0-9]+)",))
    with pytest.raises(ConfigError, match="not a valid regex"):
        LineFormat("x", "y", ("m",), (r"(?P<a>[0-9+)",))
    assert ("sglang", "decode") in registry.kinds() and ("llamacpp", "spec_statistics") in registry.kinds()


def test_a_failing_block_function_is_reported_not_raised() -> None:
    reg = Registry()

    def boom(w: object) -> tuple:
        raise ValueError("bug")

    reg.add(BlockFormat("x", "y", ("BOOM",), boom, {"a": "float"}))
    reg.add(LineFormat("x", "z", ("ok ",), (r"ok (?P<v>[0-9]+)",)))
    df = parse("BOOM\nok 3\n", registry=reg)
    assert df["v"].tolist() == [3] and df.attrs["parser_errors"] == [(1, "x/y", "ValueError: bug")]


def test_summary_counts_medians_and_dp_ranks() -> None:
    text = "".join(f"[2026-01-01 00:00:0{i} DP{i % 2} TP0] Decode batch, #running-req: 1, #token: 1, token usage: "
                   f"0.1, accept len: {2 + i / 10:.2f}, gen throughput (token/s): {100 + i}.00, #queue-req: 0\n"
                   for i in range(6))
    text += "vm:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Ring\n"
    s = summary(parse(text))
    dec = s[(s["kind"] == "decode") & (s["metric"] == "gen_throughput")]
    assert dec[["dp_rank", "count", "n", "median"]].values.tolist() == [[0, 3, 3, 102.0], [1, 3, 3, 103.0]]
    acc = s[(s["kind"] == "decode") & (s["metric"] == "accept_len") & (s["dp_rank"] == 1)]
    assert acc["median"].tolist() == pytest.approx([2.3])
    env = s[s["kind"] == "env"]
    assert env[["count", "n"]].values.tolist() == [[1, 0]] and env["metric"].isna().all()
    assert summary(parse("")).empty


def test_parse_in_a_forked_child_after_the_parent_parsed() -> None:
    """The worker thread does not survive a fork: a child parses with its own (no hang)."""
    import multiprocessing

    text = MIXED * 20  # enough lines for the worker thread
    want = len(parse(text))
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_parse_into, args=(text, queue))
    child.start()
    child.join(120)
    assert child.exitcode == 0 and queue.get(timeout=5) == want


def _parse_into(text: str, queue: object) -> None:
    queue.put(len(parse(text)))  # type: ignore[attr-defined]
