"""Results tables pasted as markdown (``a | b`` over ``-- | --``) or tabulate grids (``+====+``).

Kind ``results_table``: one row per table row, for tables whose header names speculative-decoding results
(an acceptance length or a throughput column and one more known column); other tables (e.g. a generic
``Key | Value`` summary) are ignored. Engine "vllm" when the table mentions vLLM, else "sglang" (SpecForge
/ ``bench_speculative`` / ``bench_serving`` sweeps). Columns: batch_size, tp_size, ep_size, steps, topk,
num_draft_tokens, gen_throughput, output_throughput, input_throughput, accept_len, latency, total_time_s,
method, max_concurrency, mean/median/p99 ttft and tpot in ms, per_user_throughput.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spectrial.logs.chunks import Chunk, Window
from spectrial.logs.columns import numbers
from spectrial.logs.formats import MORE, BlockFormat, BlockResult, Blocks, Record
from spectrial.logs.native import blocks as compiled
from spectrial.logs.registry import registry
from spectrial.logs.text import WS, num
from spectrial.logs.vector import ROW, SKIP, STOP, cells_of, head_char, np_bool, scan, texts_at, to_str_numpy

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
    recs: list[tuple[int, Record]] = []
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


_BORDER_V = rf"^{WS}*\+[-=+:]+\+?{WS}*$"
_PLANS: dict[str, tuple[int, tuple[tuple[int, str, bool], ...], bool] | None] = {}


def _plan(header: str) -> tuple[int, tuple[tuple[int, str, bool], ...], bool] | None:
    """What a header line says (cached by its text): cell count, the known columns (cell, name, is text)
    and whether it names vLLM; None for other tables."""
    try:
        return _PLANS[header]
    except KeyError:
        pass
    if len(_PLANS) > 4096:
        _PLANS.clear()
    names = [ALIASES.get(re.sub(r"\s+", " ", c.lower())) for c in _cells(header)]
    plan = None
    if sum(1 for n in names if n) >= 2 and any(n in _RESULT for n in names):
        fields = tuple((j, n, TABLE_COLUMNS[n] == "str") for j, n in enumerate(names) if n)
        plan = (len(names), fields, "vllm" in header.lower())
    _PLANS[header] = plan
    return plan


def results_table_vector(chunk: Chunk, at: np.ndarray) -> Blocks:
    """:func:`results_table` of all the chunk's tables at once (the rows split with column kernels)."""
    nb = len(at)
    header = np.empty(nb, object)
    for k in (-2, -1):  # the nearer line wins
        text, inside = texts_at(chunk, at, k)
        ok = inside & np_bool(pc.match_substring(text, "|")) & np_bool(pc.not_equal(pc.ascii_trim_whitespace(text), ""))
        header[ok] = to_str_numpy(text)[ok]
    plans = [_plan(h) if h is not None else None for h in header.tolist()]
    width = np.array([p[0] if p else 0 for p in plans], np.int64)
    tables = np.flatnonzero(width > 0)
    used = np.zeros(nb, np.int64)
    examined = np.ones(nb, np.int64)
    status = np.zeros(nb, np.int64)
    if not len(tables):
        return Blocks(used, examined, np.zeros(0, np.int64), np.zeros(0, np.int64), {}, status)

    def classify(text: pa.Array, block: np.ndarray, offset: np.ndarray) -> np.ndarray:
        pipe = np_bool(pc.match_substring(text, "|"))
        border = np_bool(pc.match_substring_regex(text, _BORDER_V))
        grid = np_bool(pc.equal(head_char(text), "+")) & border
        _, counts = cells_of(text)
        row = counts == width[tables[block]]
        return np.where(~pipe, np.where(border, SKIP, STOP), np.where(grid, SKIP, np.where(row, ROW, STOP)))

    sc = scan(chunk, at[tables], classify)
    rows = sc.rows(ROW)
    blk = sc.block[rows]
    text = sc.text.take(pa.array(rows))
    cells, _ = cells_of(text)
    starts = np.concatenate(([0], np.cumsum(width[tables[blk]])))[:-1]
    vllm_row = np_bool(pc.match_substring(text, "vllm", ignore_case=True))
    has = np.zeros(len(tables), dtype=bool)
    has[blk] = True
    vllm = np.array([bool(plans[t][2]) for t in tables.tolist()])  # type: ignore[index]
    vllm |= np.bincount(blk[vllm_row], minlength=len(tables)) > 0
    plan_ids: dict[tuple[tuple[int, str, bool], ...], int] = {}
    plan_of = np.array([plan_ids.setdefault(plans[t][1], len(plan_ids)) for t in tables.tolist()],  # type: ignore[index]
                       np.int64)
    cols: dict[str, np.ndarray] = {}
    nrec = len(rows)
    for fields, pid in plan_ids.items():  # each header's columns, over the rows of its tables
        mine = np.flatnonzero(plan_of[blk] == pid)
        for j, name, is_str in fields:
            if is_str:
                col = cols.setdefault(name, np.empty(nrec, object))
                col[mine] = to_str_numpy(cells.take(pa.array(starts[mine] + j)))
        nums = [(j, name) for j, name, is_str in fields if not is_str]
        if nums:  # every number cell of these tables in one go
            at = (starts[mine][None, :] + np.array([j for j, _ in nums])[:, None]).ravel()
            vals = numbers(cells.take(pa.array(at)), _cell_value)[0].reshape(len(nums), len(mine))
            for (_, name), v in zip(nums, vals, strict=True):
                cols.setdefault(name, np.full(nrec, np.nan))[mine] = v
    cols["engine"] = np.where(vllm[blk], "vllm", "sglang").astype(object)
    used[tables] = np.where(has, sc.end, 0)
    examined[tables] = sc.examined
    status[tables] = np.where(sc.more, MORE, 0)
    return Blocks(used, examined, tables[blk], sc.offset[rows], cols, status)


registry.add(BlockFormat(
    "sglang", "results_table", ("-|-", "- | -", ":|-", "-|:", ":|:", "- | :", ": | -", "+====", "+:==="),
    results_table, TABLE_COLUMNS, key_metrics=("gen_throughput", "output_throughput", "accept_len"), timestamps=(),
    lookback=2,
    vector=compiled.reader(compiled.Spec("results_table", tuple(c for c, t in TABLE_COLUMNS.items() if t == "float"),
                                         ("method",), {"engine": ("sglang", "vllm")}), results_table_vector),
))
