"""Results tables pasted as markdown (``a | b`` over ``-- | --``) or tabulate grids (``+====+``).

Kind ``results_table``: one row per table row, for tables whose header names speculative-decoding results
(an acceptance length or a throughput column and one more known column); other tables (e.g. a generic
``Key | Value`` summary) are ignored. Engine "vllm" when the table mentions vLLM, else "sglang" (SpecForge
/ ``bench_speculative`` / ``bench_serving`` sweeps). Columns: batch_size, tp_size, ep_size, steps, topk,
num_draft_tokens, gen_throughput, output_throughput, input_throughput, accept_len, latency, total_time_s,
method, max_concurrency, mean/median/p99 ttft and tpot in ms, per_user_throughput.
"""

from __future__ import annotations

import operator
import re
from typing import Any

from spectrial.logs.core import BlockFormat, BlockResult, FastResult, Rows, Text, Window, num, registry

TABLE_COLUMNS: dict[str, str] = {
    "batch_size": "float", "tp_size": "float", "ep_size": "float", "steps": "float", "topk": "float",
    "num_draft_tokens": "float", "gen_throughput": "float", "output_throughput": "float",
    "input_throughput": "float", "accept_len": "float", "latency": "float", "total_time_s": "float",
    "method": "str", "max_concurrency": "float", "mean_ttft_ms": "float", "median_ttft_ms": "float",
    "p99_ttft_ms": "float", "mean_tpot_ms": "float", "median_tpot_ms": "float", "p99_tpot_ms": "float",
    "per_user_throughput": "float",
}
ALIASES: dict[str, str] = {
    **{a: "batch_size" for a in ("bs", "batch_size", "batch size", "batch")},
    "tp": "tp_size", "tp_size": "tp_size", "ep": "ep_size", "ep_size": "ep_size",
    "steps": "steps", "num_steps": "steps", "topk": "topk", "eagle_topk": "topk",
    **{a: "num_draft_tokens" for a in ("num_draft_tokens", "num_draft", "num draft tokens", "num spec tokens",
                                       "draft_tokens")},
    **{a: "gen_throughput" for a in ("throughput", "decode throughput (toks/sec)", "gen throughput",
                                      "speed (token/s)", "throughput (token/s)", "tok/s")},
    "output_throughput": "output_throughput", "output throughput": "output_throughput",
    "input_throughput": "input_throughput",
    **{a: "accept_len" for a in ("accept_length", "acc len", "accept len", "accept length",
                                  "mean acceptance length", "acc_length", "acceptance length", "avg accept length",
                                  "accept_len")},
    "latency": "latency", "total time (sec)": "total_time_s", "method": "method",
    "max_concurrency": "max_concurrency", "per_user_throughput": "per_user_throughput",
    **{c: c for c in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
                      "p99_tpot_ms")},
}
_RESULT = ("accept_len", "gen_throughput", "output_throughput")
_BORDER = re.compile(r"^\s*\+[-=+:]+\+?\s*$")  # a grid rule: +----+----+


def _cells(line: str) -> list[str]:
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|"):
        s = s[:-1]
    return [c.strip() for c in s.split("|")]


def _cell_value(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return num(text)


def results_table(w: Window) -> BlockResult:
    """Rows of a results table; the marker is its separator line, the header is the line above."""
    header = next((h for k in (-1, -2) if (h := w[k]) and h.strip() and "|" in h), None)
    if header is None:
        return [], 0
    names = [ALIASES.get(re.sub(r"\s+", " ", c.lower())) for c in _cells(header)]
    if sum(1 for n in names if n) < 2 or not any(n in _RESULT for n in names):
        return [], 0
    fields = [(j, n, TABLE_COLUMNS[n] == "str") for j, n in enumerate(names) if n]
    engine = "vllm" if "vllm" in header.lower() else "sglang"
    recs: list[tuple[int, dict[str, Any]]] = []
    k = 1
    while (s := w[k]) is not None:
        if "|" not in s:
            if _BORDER.match(s):
                k += 1
                continue
            break
        if s.lstrip().startswith("+") and _BORDER.match(s):
            k += 1
            continue
        cells = _cells(s)
        if len(cells) != len(names):
            break
        if engine == "sglang" and "vllm" in s.lower():
            engine = "vllm"
        recs.append((k, {n: (cells[j] if is_str else _cell_value(cells[j])) for j, n, is_str in fields}))
        k += 1
    return ([(off, {**r, "engine": engine}) for off, r in recs], k) if recs else ([], 0)


_BORDER_B = re.compile(_BORDER.pattern.encode())
_HEADERS: dict[bytes, tuple[int, Any, list[str], list[tuple[int, str]], bool] | None] = {}


def _header_plan(header: bytes) -> tuple[int, Any, list[str], list[tuple[int, str]], bool] | None:
    """What a header line says, cached by its text: cell count, a getter of the number cells and their
    columns, the text cells (index, column), and whether it names vLLM; None for other tables."""
    try:
        return _HEADERS[header]
    except KeyError:
        pass
    if len(_HEADERS) > 1024:
        _HEADERS.clear()
    text = header.decode()
    names = [ALIASES.get(re.sub(r"\s+", " ", c.lower())) for c in _cells(text)]
    plan = None
    if sum(1 for n in names if n) >= 2 and any(n in _RESULT for n in names):
        nums = [(j, n) for j, n in enumerate(names) if n and TABLE_COLUMNS[n] != "str"]
        strs = [(j, n) for j, n in enumerate(names) if n and TABLE_COLUMNS[n] == "str"]
        getter = (lambda cells: ()) if not nums else (
            (lambda cells, j=nums[0][0]: (cells[j],)) if len(nums) == 1 else operator.itemgetter(*(j for j, _ in nums)))
        plan = (len(names), getter, [n for _, n in nums], strs, "vllm" in text.lower())
    _HEADERS[header] = plan
    return plan


def results_table_fast(text: Text, i: int) -> FastResult | None:
    """:func:`results_table` over the plain bytes of the table."""
    above = text.lines_at(i - 2, 2)
    header = next((h for h in (above[1], above[0]) if h.strip() and b"|" in h), None)
    if header is None:
        return [], 0, 1
    plan = _header_plan(header)
    if plan is None:
        return [], 0, 1
    ncells, getter, num_n, strs, vllm = plan
    engine = "vllm" if vllm else "sglang"
    offsets: list[int] = []
    values: list[list[Any]] = []
    k = 1
    for s in text.iter_lines(i + 1):
        if b"|" not in s:
            if _BORDER_B.match(s):
                k += 1
                continue
            break
        t = s.strip()
        if t[:1] == b"+" and _BORDER_B.match(s):
            k += 1
            continue
        if t[:1] == b"|":
            t = t[1:]
        if t[-1:] == b"|":
            t = t[:-1]
        cells = t.split(b"|")
        if len(cells) != ncells:
            break
        if engine == "sglang" and b"vllm" in s.lower():
            engine = "vllm"
        vals = getter(cells)
        try:
            row = list(map(float, vals))  # float() ignores the spaces around a cell
        except ValueError:
            row = [_cell_value(v.strip().decode()) for v in vals]
        for j, _ in strs:
            row.append(cells[j].strip().decode())
        offsets.append(k)
        values.append(row)
        k += 1
    else:
        return None  # the table goes on past what was read
    if not offsets:
        return [], 0, k + 1
    for row in values:
        row.append(engine)
    return Rows(offsets, (*num_n, *(n for _, n in strs), "engine"), values), k, k + 1


registry.add(BlockFormat(
    "sglang", "results_table", ("-|-", "- | -", ":|-", "-|:", ":|:", "- | :", ": | -", "+====", "+:==="),
    results_table, TABLE_COLUMNS, key_metrics=("gen_throughput", "output_throughput", "accept_len"), timestamps=(),
    fast=results_table_fast, lookback=2,
))
