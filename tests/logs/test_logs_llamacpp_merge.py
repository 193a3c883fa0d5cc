"""The llama.cpp merge (MergeRecords: per-line captures -> request_timing / draft_acceptance / gen_progress rows)
held to the merge it replaced, kept below verbatim: the same rows, order, values and dtypes on generated llama.cpp
logs (server slots and tasks interleaved, prefix lines on their own, mid-2024 id_slot lines, llama-cli perf prints,
llama-speculative summaries, lines left out, draft, progress and graphs-reused lines), cut into parts anywhere,
and on generated per-line captures of every shape (the rare mixes the fast merge leaves to `_Merger.row`)."""

from __future__ import annotations

import math
import random
from collections import namedtuple
from typing import Any

import numpy as np
import pandas as pd
import pytest

from spectrial.logs import llamacpp, parse
from spectrial.logs.llamacpp import (
    _DRAFT_WANTED,
    _EVENTS,
    _NEAR,
    _REQ_WANTED,
    DRAFT_COLUMNS,
    PROGRESS_COLUMNS,
    REQUEST_COLUMNS,
)

Key = Any
Record = dict[str, Any]
_FIELDS = ("line", "timestamp", "slot", "task", "origin", "t_name", "t_ms", "t_n", "t_tps", "io_name", "io_n",
           "io_s", "io_tps", "da_rate", "da_acc", "da_gen", "da_len", "ml_len", "pp", "nd_key", "nd_val", "pg_n",
           "pg_tg", "pg_tg3", "graphs_reused", "hdr", "event", "req", "draft")
_Row = namedtuple("_Row", _FIELDS)  # noqa: PYI024


# ---------------------------------------------------------------- the merge before (reference)
def _nan(v: Any) -> bool:
    return v is None or v != v  # NaN is the only value unequal to itself (rows come with None for NaN)


class OldMerger:
    """llamacpp._Merger before the fast merge (commit 31a997c), verbatim."""

    def __init__(self) -> None:
        self.rows: list[Record] = []
        self.req: dict[Key, Record] = {}
        self.draft: dict[Key, Record] = {}
        self.last_req: dict[Key, Record] = {}
        self.hdr_key: Key = None
        self.hdr_line = -100
        self.hdr_ts: str | None = None
        self.hdr_origin: str | None = None

    def key(self, r: Any) -> tuple[Key, str | None]:
        """(slot, task) of the row, or of the bare prefix line just above it; and a fallback timestamp."""
        if not _nan(r.slot):
            return (r.slot, None if _nan(r.task) else r.task), None
        if self.hdr_key is not None and r.line - self.hdr_line <= _NEAR:
            self.hdr_line = r.line
            return self.hdr_key, self.hdr_ts
        return None, None

    def origin(self, r: Any, from_header: bool) -> str:
        """Who printed the timing: a server slot, the whole-context perf print, or llama-speculative."""
        if not _nan(r.origin):
            return "print_timing" if r.origin.startswith("print_timing") else r.origin
        if from_header and self.hdr_origin:
            return self.hdr_origin
        return "speculative" if not _nan(r.io_name) else "unknown"

    @staticmethod
    def near(rec: Record | None, key: Key, line: int) -> bool:
        return rec is not None and (key is not None or line - rec["_last"] <= _NEAR)

    def emit(self, store: dict[Key, Record], key: Key) -> None:
        rec = store.pop(key, None)
        if rec is None:
            return
        wanted = _REQ_WANTED if rec["kind"] == "request_timing" else _DRAFT_WANTED
        if any((v := rec.get(c)) is not None and v == v for c in wanted):
            self.rows.append(rec)
            if rec["kind"] == "request_timing":
                self.last_req[key] = rec

    def open(self, store: dict[Key, Record], key: Key, base: Record, kind: str) -> Record:
        self.emit(store, key)
        rec = store[key] = {**base, "kind": kind}
        return rec

    def get(self, store: dict[Key, Record], key: Key, base: Record, kind: str, free: tuple[str, ...]) -> Record:
        """The open record of `key` if it is near and has none of `free` yet, else a new one."""
        rec = store.get(key)
        if self.near(rec, key, base["line"]) and all(  # type: ignore[union-attr]
                (v := rec.get(c)) is None or v != v for c in free):  # type: ignore[union-attr]
            return rec  # type: ignore[return-value]
        return self.open(store, key, base, kind)

    def row(self, r: Any) -> None:
        if not r.event:  # a bare `slot print_timing: id 0 | task 0 |` line
            if not _nan(r.hdr):
                self.hdr_key = None if _nan(r.slot) else (r.slot, None if _nan(r.task) else r.task)
                self.hdr_line = r.line
                self.hdr_ts = r.timestamp
                self.hdr_origin = "print_timing"
            return
        key, hdr_ts = self.key(r)
        ts = r.timestamp if not _nan(r.timestamp) else hdr_ts
        base = {"line": r.line, "timestamp": ts, "_last": r.line,
                "slot": key[0] if key else math.nan, "task": (key[1] if key and key[1] is not None else math.nan)}
        if r.req:
            self._request(r, key, base, self.origin(r, key is not None and _nan(r.slot)))
        if r.draft:
            self._draft(r, key, base)
        if not _nan(r.pg_n):
            self.rows.append({**base, "kind": "gen_progress", "n_decoded": r.pg_n, "gen_throughput": r.pg_tg,
                              "gen_throughput_3s": r.pg_tg3})

    def _request(self, r: Any, key: Key, base: Record, origin: str) -> None:
        name = r.t_name if not _nan(r.t_name) else r.io_name
        if _nan(name):
            if not _nan(r.graphs_reused):
                last = self.last_req.get(key)
                if last is not None and r.line - last["_last"] <= _NEAR:
                    last["graphs_reused"] = r.graphs_reused
            return
        ms, n, tps = (r.t_ms, r.t_n, r.t_tps) if r.t_name is not None else (
            None if r.io_s is None else r.io_s * 1000.0, r.io_n, r.io_tps)
        if name in ("prompt eval", "encoded"):
            rec = self.open(self.req, key, base, "request_timing")
            rec.update(prompt_ms=ms, prompt_tokens=n, prompt_throughput=tps, origin=origin)
        elif name in ("eval", "generation eval", "decoded", "generated"):
            rec = self.get(self.req, key, base, "request_timing", ("eval_ms",))
            rec.setdefault("origin", origin)
            if _nan(tps) and not _nan(n) and not _nan(ms) and ms > 0:
                tps = n / ms * 1000.0
            rec.update(eval_ms=ms, eval_tokens=n, gen_throughput=tps, _last=r.line)
        elif name == "total":
            rec = self.req.get(key)
            if self.near(rec, key, r.line) and _nan(rec.get("total_ms")):  # type: ignore[union-attr]
                rec["total_ms"] = ms  # type: ignore[index]
                rec["_last"] = r.line  # type: ignore[index]
                self.emit(self.req, key)

    def _draft(self, r: Any, key: Key, base: Record) -> None:
        if not _nan(r.da_rate):
            rec = self.open(self.draft, key, base, "draft_acceptance")
            rec.update(accept_rate=r.da_rate, accepted=r.da_acc, drafted=r.da_gen, accept_len=r.da_len)
        if not _nan(r.ml_len) or not _nan(r.pp):
            free = tuple(c for c, v in (("accept_len", r.ml_len), ("per_position", r.pp)) if not _nan(v))
            rec = self.get(self.draft, key, base, "draft_acceptance", free)
            if not _nan(r.ml_len):
                rec["accept_len"] = r.ml_len
            if not _nan(r.pp):
                rec["per_position"] = list(r.pp)
            rec["_last"] = r.line
        if not _nan(r.nd_key):
            if r.nd_key == "n_draft":
                rec = self.open(self.draft, key, base, "draft_acceptance")
                rec["draft_max"] = r.nd_val
            elif r.nd_key != "n_predict":
                col = {"n_drafted": "drafted", "n_accept": "accepted", "accept": "accept_rate"}[r.nd_key]
                rec = self.get(self.draft, key, base, "draft_acceptance", (col,))
                rec[col] = r.nd_val  # `accept = 32.143%` arrives as 0.32143
                rec["_last"] = r.line

    def finish(self) -> pd.DataFrame:
        for store in (self.req, self.draft):
            for key in list(store):
                self.emit(store, key)
        for rec in self.rows:
            rec.pop("_last", None)
        cols = ["line", "timestamp", "kind", *REQUEST_COLUMNS, *DRAFT_COLUMNS, *PROGRESS_COLUMNS]
        return pd.DataFrame(self.rows, columns=cols)



def old_feed(m: OldMerger, df: pd.DataFrame) -> None:
    """MergeRecords.feed before the fast merge, verbatim."""
    df = df.sort_values("line", kind="stable")
    notna = {c: df[c].notna().to_numpy() for c in _EVENTS}
    event = np.logical_or.reduce(list(notna.values()))
    flags = {"event": event, "req": notna["t_name"] | notna["io_name"] | notna["graphs_reused"],
             "draft": notna["da_rate"] | notna["ml_len"] | notna["pp"] | notna["nd_key"]}
    columns = []
    for c in _FIELDS:
        if c in flags:
            columns.append(flags[c].tolist())
        elif c not in df:
            columns.append([None] * len(df))
        else:
            v = df[c].to_numpy()
            if v.dtype == np.float64:  # NaN (not printed) -> None, as the merger tests for
                v = np.where(np.isnan(v), None, v.astype(object))
            columns.append(v.tolist())
    for r in map(_Row._make, zip(*columns, strict=True)):
        m.row(r)



def old_merge(parts: list[pd.DataFrame]) -> pd.DataFrame:
    m = OldMerger()
    for df in parts:
        old_feed(m, df)
    return m.finish()


def new_merge(parts: list[pd.DataFrame]) -> pd.DataFrame:
    m = llamacpp.MergeRecords()
    for df in parts:
        m.feed(df)
    return m.finish()


def outcome(merge: Any, parts: list[pd.DataFrame]) -> pd.DataFrame | tuple[str, str]:
    try:
        return merge([p.copy() for p in parts])
    except Exception as e:  # noqa: BLE001 - the same error either way
        return type(e).__name__, str(e)


def assert_same(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """The new merge gives exactly the old one's frame: columns, dtypes, and each value's repr (None is not NaN,
    a list is a list), or the same error."""
    ref, got = outcome(old_merge, parts), outcome(new_merge, parts)
    if isinstance(ref, tuple) or isinstance(got, tuple):
        assert got == ref
        return ref
    assert list(got.columns) == list(ref.columns)
    assert list(got.dtypes) == list(ref.dtypes)
    assert got.index.equals(ref.index)
    for c in ref.columns:
        assert [repr(v) for v in got[c].tolist()] == [repr(v) for v in ref[c].tolist()], c
    pd.testing.assert_frame_equal(got, ref, check_exact=True)
    return ref


def cuts(df: pd.DataFrame, rng: random.Random) -> list[pd.DataFrame]:
    """The rows (sorted by line) cut into 1-6 parts anywhere, as the parser feeds them."""
    at = sorted(rng.sample(range(1, len(df)), min(len(df) - 1, rng.randint(0, 5)))) if len(df) > 1 else []
    return [df.iloc[a:b] for a, b in zip([0, *at], [*at, len(df)], strict=True)]


# ---------------------------------------------------------------- generated llama.cpp logs
def _f(rng: random.Random, lo: float = 0.5, hi: float = 5000.0) -> float:
    return round(rng.uniform(lo, hi), 2)


def _timing(rng: random.Random, name: str, pad: int = 17) -> str:
    """`prompt eval time = X ms / N tokens (Y ms per token, Z tokens per second)` and its variants."""
    ms, n = _f(rng), rng.randint(1, 2000)
    label = f"{name} time".rjust(pad)
    if name == "total":
        return f"{label} = {ms:10.2f} ms / {n:5d} tokens" if rng.random() < 0.8 else f"{label} = {ms:10.2f} ms"
    if name == "load":
        return f"{label} = {ms:10.2f} ms"
    unit = "runs  " if name in ("sample", "sampling") or rng.random() < 0.2 else "tokens"
    tps = "inf" if rng.random() < 0.05 else f"{n / ms * 1000:.2f}"
    tail = f" ({ms / n:8.2f} ms per token, {tps:>8} tokens per second)" if rng.random() < 0.85 else ""
    return f"{label} = {ms:10.2f} ms / {n:5d} {unit}{tail}"


def _server(rng: random.Random, slot: int, task: int) -> list[str]:
    """One request of a llama-server slot: its print_timing lines, in one of the prefix styles, some left out."""
    style = rng.choice(["keyed", "keyed", "header", "id_slot", "bare"])
    body = [_timing(rng, "prompt eval"), _timing(rng, "eval"), _timing(rng, "total")]
    if rng.random() < 0.6:
        body.append(f"   graphs reused = {rng.randint(0, 300):10d}")
    if rng.random() < 0.6:
        g = rng.randint(0, 900)
        a = rng.randint(0, g)
        if rng.random() < 0.5:
            body.append(f"draft acceptance = {a / max(g, 1):.5f} ({a:5d} accepted / {g:5d} generated), mean len = "
                        f"{rng.uniform(1, 4):5.2f}")
        else:
            body.append(f"draft acceptance rate = {a / max(g, 1):.5f} ({a:5d} accepted / {g:5d} generated)")
        if rng.random() < 0.6:
            body.append("     acc per pos = (" + ", ".join(f"{rng.random():.3f}" for _ in range(rng.randint(1, 4)))
                        + ")")
        if rng.random() < 0.3:
            body.append(f"mean acceptance length = {rng.uniform(1, 4):5.2f}, acceptance rate per position = "
                        f"({rng.random():.3f}, {rng.random():.3f})")
    if rng.random() < 0.1:
        rng.shuffle(body)
    body = [b for b in body if rng.random() > 0.12]  # lines lost (a cut log, a filter)
    prefix = f"slot print_timing: id {slot:2d} | task {task} | "
    if style == "keyed":
        return [prefix + b.lstrip() if rng.random() < 0.5 else prefix + b for b in body]
    if style == "header":
        return [prefix, *body]
    if style == "id_slot":
        return [f"INFO [           print_timings] {b} | tid=\"1\" timestamp=1718 id_slot={slot} id_task={task}"
                for b in body if "time" in b]
    return body


def _progress(rng: random.Random, slot: int, task: int) -> list[str]:
    word = rng.choice(["n_decoded", "n_gen"])
    tail = f", tg_3s = {_f(rng, 1, 99):6.2f} t/s" if rng.random() < 0.7 else ""
    return [f"slot print_timing: id {slot:2d} | task {task} | {word} = {rng.randint(1, 999):6d}, tg = "
            f"{_f(rng, 1, 99):6.2f} t/s{tail}" for _ in range(rng.randint(1, 4))]


def _cli(rng: random.Random) -> list[str]:
    who = rng.choice(["llama_perf_context_print", "llama_print_timings"])
    names = ["load", "prompt eval", "eval", "total"]
    if who == "llama_print_timings":
        names.insert(1, "sample")
    lines = [f"{who}: {_timing(rng, n)}" for n in names if rng.random() > 0.1]
    if rng.random() < 0.3:
        lines.insert(0, f"llama_perf_sampler_print: {_timing(rng, 'sampling')}")
    return lines


def _speculative(rng: random.Random) -> list[str]:
    out = []
    if rng.random() < 0.8:
        out.append(f"encoded {rng.randint(1, 99):4d} tokens in {rng.uniform(0, 3):8.3f} seconds, speed: "
                   f"{_f(rng, 1, 500):8.3f} t/s")
    if rng.random() < 0.5:
        out.append(f"decoded {rng.randint(1, 999):4d} tokens in {rng.uniform(0, 30):8.3f} seconds, speed: "
                   f"{_f(rng, 1, 99):8.3f} t/s")
    else:
        out.append(f"generated {rng.randint(1, 999)} tokens in {rng.uniform(0, 300):.3f} seconds, speed: "
                   f"{_f(rng, 0, 9):.3f} t/s")
    if rng.random() < 0.3:
        out.append("")
    drafted = rng.randint(1, 900)
    block = [f"n_draft   = {rng.randint(1, 16)}", f"n_predict = {rng.randint(1, 999)}", f"n_drafted = {drafted}",
             f"n_accept  = {rng.randint(0, drafted)}", f"accept    = {rng.uniform(0, 100):.3f}%"]
    out += [b for b in block if rng.random() > 0.1]
    if rng.random() < 0.5:
        out.insert(0, out.pop())  # the summary printed before the counts
    return out


NOISE = ["", "slot      release: id  0 | task 0 | stop processing: n_past = 27, truncated = 0",
         "srv  update_slots: all slots are idle", "main: server is listening on http://127.0.0.1:8080", "---"]


def generated_log(seed: int) -> str:
    """Requests of several slots and tasks, llama-cli and llama-speculative output, interleaved line by line."""
    rng = random.Random(seed)
    streams: list[list[str]] = []
    task = 0
    for _ in range(rng.randint(4, 30)):
        kind = rng.random()
        slot = rng.randint(0, 3)
        if kind < 0.5:
            streams.append(_server(rng, slot, task))
        elif kind < 0.65:
            streams.append(_progress(rng, slot, task))
        elif kind < 0.8:
            streams.append(_cli(rng))
        else:
            streams.append(_speculative(rng))
        task += 1 if rng.random() < 0.9 else 0
    live, lines = streams[: rng.randint(1, 3)], []
    waiting = streams[len(live):]
    while live:
        s = rng.choice(live)
        lines.append(s.pop(0))
        if not s:
            live.remove(s)
            if waiting:
                live.append(waiting.pop(0))
        if rng.random() < 0.08:
            lines.append(rng.choice(NOISE))
    stamped = rng.random() < 0.6
    t = 0.0
    out = []
    for ln in lines:
        t += rng.uniform(0, 0.3)
        if stamped and ln and rng.random() < 0.95:
            ms = int(t * 1e6)
            ln = f"{ms // 60_000_000}.{ms // 1_000_000 % 60:02d}.{ms // 1000 % 1000:03d}.{ms % 1000:03d} I {ln}"
        out.append(ln)
    return "\n".join(out) + "\n"


def captures(text: str, monkeypatch: pytest.MonkeyPatch) -> pd.DataFrame:
    """The per-line captures the parser gives the merge for `text` (every part, together)."""
    parts: list[pd.DataFrame] = []
    feed = llamacpp.MergeRecords.feed

    def keep(self: llamacpp.MergeRecords, df: pd.DataFrame) -> None:
        parts.append(df.copy())
        feed(self, df)

    with monkeypatch.context() as m:
        m.setattr(llamacpp.MergeRecords, "feed", keep)
        parse(text, workers=1)
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]


def test_generated_logs_merge_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    kinds = set()
    for seed in range(120):
        df = captures(generated_log(seed), monkeypatch)
        rng = random.Random(seed)
        out = assert_same([df])
        for _ in range(3):
            assert_same(cuts(df, rng))
        kinds |= set(out["kind"]) | {o for o in out["origin"].tolist() if isinstance(o, str)}
    # the logs hold every kind and origin the merge makes
    assert kinds >= {"request_timing", "draft_acceptance", "gen_progress", "print_timing", "speculative",
                     "llama_perf_context_print", "llama_print_timings"}


# ---------------------------------------------------------------- generated captures, every shape
FLOATS = [c for c in _FIELDS[2:26] if c not in ("origin", "t_name", "io_name", "pp", "nd_key", "hdr")]
ORIGINS = ["print_timing", "print_timings", "llama_perf_context_print", "llama_print_timings"]
T_NAMES = ["prompt eval", "eval", "generation eval", "total", "load", "sampling", "sample"]
ND_KEYS = ["n_draft", "n_predict", "n_drafted", "n_accept", "accept"]


def _num(rng: random.Random, p_nan: float = 0.15) -> float:
    r = rng.random()
    if r < p_nan:
        return math.nan
    if r < p_nan + 0.03:
        return 0.0
    if r < p_nan + 0.05:
        return math.inf
    return round(rng.uniform(0, 3000), rng.choice([0, 2, 5]))


def _fields(rng: random.Random, shape: str) -> dict[str, Any]:
    r: dict[str, Any] = {}
    if shape in ("t", "mix") and (shape == "t" or rng.random() < 0.3):
        r.update(t_name=rng.choice(T_NAMES), t_ms=_num(rng, 0.05), t_n=_num(rng, 0.3), t_tps=_num(rng, 0.4))
    if shape in ("io", "mix") and (shape == "io" or rng.random() < 0.3):
        r.update(io_name=rng.choice(["encoded", "decoded", "generated"]), io_n=_num(rng), io_s=_num(rng) / 1000,
                 io_tps=_num(rng, 0.3))
    if shape in ("da", "mix") and (shape == "da" or rng.random() < 0.3):
        r.update(da_rate=rng.random(), da_acc=_num(rng, 0.05), da_gen=_num(rng, 0.05), da_len=_num(rng, 0.5))
    if shape in ("ml", "mlpp", "mix") and (shape != "mix" or rng.random() < 0.3):
        r["ml_len"] = _num(rng, 0)
    if shape in ("pp", "mlpp", "mix") and (shape != "mix" or rng.random() < 0.3):
        r["pp"] = [rng.random() for _ in range(rng.randint(0, 3))]
    if shape in ("nd", "mix") and (shape == "nd" or rng.random() < 0.3):
        r.update(nd_key=rng.choice(ND_KEYS), nd_val=_num(rng, 0.02))
    if shape in ("pg", "mix") and (shape == "pg" or rng.random() < 0.3):
        r.update(pg_n=_num(rng, 0), pg_tg=_num(rng, 0.1), pg_tg3=_num(rng, 0.4))
    if shape in ("gr", "mix") and (shape == "gr" or rng.random() < 0.3):
        r["graphs_reused"] = _num(rng, 0)
    return r


def generated_captures(seed: int, n: int | None = None) -> pd.DataFrame:
    """Per-line captures as the parser gives them (line int64, text as objects with None, the rest float64), rows
    of every shape: one kind of line (the common ones), prefix lines, lines of nothing, mixes of several kinds."""
    rng = random.Random(seed)
    n = rng.randint(1, 120) if n is None else n
    keyed = rng.random()  # how many lines name their slot
    headers = rng.random() < 0.5  # bare prefix lines (their key is then read line after line)
    line, rows = rng.randint(0, 5), []
    shapes = ["t"] * 8 + ["io"] * 4 + ["da", "ml", "pp", "mlpp", "pg", "gr"] * 2 + ["nd"] * 4 + ["none", "mix"]
    shapes += ["hdr"] * 2 * headers
    for _ in range(n):
        line += rng.choice([1, 1, 1, 2, 3, 4, 5, 6])
        shape = rng.choice(shapes)
        r = _fields(rng, shape)
        r["line"] = line
        if rng.random() < keyed:
            r["slot"] = float(rng.randint(0, 2))
            if rng.random() < 0.8:
                r["task"] = float(rng.randint(0, 3))
        r["timestamp"] = None if rng.random() < 0.4 else f"0.00.{line % 1000:03d}.000"
        if rng.random() < 0.5:
            r["origin"] = rng.choice(ORIGINS)
        if shape == "hdr" or (headers and rng.random() < 0.2) or (shape != "none" and rng.random() < 0.2):
            r["hdr"] = "print_timing"  # on a line with a value, the prefix is no header
        rows.append(r)
    return frame(rows)


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    cols: dict[str, Any] = {"line": np.array([r["line"] for r in rows], dtype=np.int64)}
    for c in _FIELDS[1:26]:
        vals = [r.get(c) for r in rows]
        cols[c] = (np.array([math.nan if v is None else v for v in vals], dtype=np.float64) if c in FLOATS else
                   pd.Series(vals, dtype=object))
    return pd.DataFrame(cols)


@pytest.mark.parametrize("block", range(4))
def test_generated_captures_merge_as_before(block: int) -> None:
    for seed in range(block * 100, (block + 1) * 100):
        df = generated_captures(seed)
        rng = random.Random(seed)
        assert_same([df])
        assert_same(cuts(df, rng))


def test_odd_captures_merge_as_before() -> None:
    rng = random.Random(7)
    for seed in range(60):
        df = generated_captures(1000 + seed)
        # lines out of order (and twice), sorted by the merge (stably)
        shuffled = df.sample(frac=1, random_state=seed)
        assert_same([shuffled])
        assert_same([pd.concat([df, df.iloc[: len(df) // 2]], ignore_index=True)])
        # columns a part does not hold, read as None
        assert_same([df.drop(columns=rng.sample(["timestamp", "origin", "t_tps", "io_tps", "pg_tg3", "da_len",
                                                 "hdr", "slot", "task"], 3))])
        # t_name NaN rather than None (an io line then reads the t_* values); an nd_key the merge does not know
        odd = df.copy()
        odd["t_name"] = [math.nan if v is None and rng.random() < 0.5 else v for v in odd["t_name"]]
        assert_same([odd])
        if seed % 10 == 0:
            odd = df.copy()
            odd.loc[odd["nd_key"].notna(), "nd_key"] = "n_other"
            assert_same([odd])
        # other column types: pandas' str dtype, integer slots, float lines
        typed = df.copy()
        typed["t_name"] = typed["t_name"].astype("str")
        assert_same([typed])
        typed = df.copy()
        typed["slot"] = typed["slot"].fillna(-1).astype(np.int64)
        assert_same([typed])
        typed = df.copy()
        typed["line"] = typed["line"].astype(np.float64)
        assert_same([typed])


def test_edge_frames_merge_as_before() -> None:
    empty = generated_captures(0).iloc[:0]
    assert_same([empty])
    assert_same([empty, generated_captures(1), empty])
    # a request's values all absent: prompt_tokens holds None only (an object column), throughput NaN
    only = frame([{"line": i, "t_name": "prompt eval", "t_ms": 5.0} for i in range(3)])
    out = assert_same([only])
    assert out["prompt_tokens"].dtype == object
    # the prefix line's key carried from one part into the next
    head = frame([{"line": 1, "hdr": "print_timing", "slot": 1.0, "task": 4.0, "timestamp": "0.00.001.000"}])
    body = frame([{"line": 2, "t_name": "prompt eval", "t_ms": 5.0}, {"line": 3, "t_name": "eval", "t_ms": 9.0},
                  {"line": 8, "t_name": "total", "t_ms": 15.0}])
    out = assert_same([head, body])
    assert out["slot"].tolist() == [1.0] and out["origin"].tolist() == ["print_timing"]


def test_a_large_capture_merges_as_before() -> None:
    df = pd.concat([generated_captures(5000 + s, 400) for s in range(10)], ignore_index=True)
    df["line"] = np.arange(len(df)) * 2
    assert_same([df])
    assert_same(cuts(df, random.Random(1)))


def test_settled_parts_merge_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows no later line can change, made a frame after each part (`_Merger.settle`, the threshold at one row
    here): the merge's frame is still the old one's, value for value and type for type, for parts cut anywhere;
    for parts fed out of line order (the settled rows put back); and where a column's type differs between the
    settled frames (inferred from all rows at once)."""
    monkeypatch.setattr(llamacpp, "_SETTLE_ROWS", 1)
    seen = {"settled": 0, "mixed": 0}
    finish = llamacpp._Merger.finish

    def counting(self: Any) -> pd.DataFrame:
        if self.settled:
            seen["settled"] += 1
            frames = [f for _, f in self.settled]
            seen["mixed"] += any(list(f.dtypes) != list(frames[0].dtypes) for f in frames)
        return finish(self)

    monkeypatch.setattr(llamacpp._Merger, "finish", counting)
    rng = random.Random(11)
    for seed in range(60):
        df = generated_captures(2000 + seed)
        at = sorted(rng.sample(range(1, len(df)), min(len(df) - 1, rng.randint(2, 40))))
        parts = [df.iloc[a:b] for a, b in zip([0, *at], [*at, len(df)], strict=True)]
        assert_same(parts)
        assert_same(parts[::-1])
    # prompt_tokens None only in the first part's requests (an object column in its settled frame), numbers in
    # the second's (float)
    first = frame([{"line": i, "slot": 0.0, "task": 0.0, "t_name": "prompt eval", "t_ms": 5.0}
                   for i in range(0, 40, 2)])
    second = frame([{"line": i, "slot": 0.0, "task": 0.0, "t_name": "prompt eval", "t_ms": 5.0, "t_n": 7.0}
                    for i in range(100, 140, 2)])
    out = assert_same([first, second])
    assert out["prompt_tokens"].dtype == np.float64  # None and numbers: float, as all the rows infer it
    assert np.isnan(out["prompt_tokens"].iloc[0]) and out["prompt_tokens"].iloc[-1] == 7.0
    # `graphs reused` 2 lines after a request's last line, in the next part: that request is not settled yet
    def request(first: int, slot: float) -> list[dict[str, Any]]:
        return [{"line": first + k, "slot": slot, "task": 0.0, "t_name": name, "t_ms": 5.0, "t_n": 3.0}
                for k, name in enumerate(("prompt eval", "eval", "total"))]

    reused = frame([{"line": 5, "slot": 0.0, "task": 0.0, "graphs_reused": 3.0}])
    out = assert_same([frame(request(1, 0.0)), reused])
    assert out["graphs_reused"].tolist() == [3.0]
    # a part before the settled ones: `graphs reused` of a settled request (a later line's, read first)
    out = assert_same([frame(request(10, 0.0) + request(20, 1.0)), reused])
    assert out["graphs_reused"].tolist()[0] == 3.0
    assert seen["settled"] > 60 and seen["mixed"] >= 1, seen
