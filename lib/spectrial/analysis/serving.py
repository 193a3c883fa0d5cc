"""Serving figures: the latencies and rates a serving benchmark reports (`vllm bench serve`, AIPerf, guidellm),
computed in one place from the streamed requests of one arm (spectrial.measure.bench records). Nothing here changes its
input.

Per request (ms; a request's events are the stream's token events, spectrial.measure.bench):
    ttft_ms       first token event - request sent
    e2el_ms       stream ended - request sent (t_end - t_start)
    tpot_ms       (e2el_ms - ttft_ms) / (tokens - 1)                               (tokens > 1)
    chunks        delivered chunks: consecutive events less than BURST_FRACTION x the request's TPOT apart are
                  one chunk (its time: the group's last event; its tokens: the group's sum; a stalled request's
                  TPOT says nothing, e2el / tokens stands in for it). llama.cpp writes a
                  verify cycle's tokens as one event each, ~0.05 ms apart in a cycle of several ms; a plain
                  stream whose events arrive back to back was coalesced on the way (network, client)
    tokens of an event: the server's per-chunk count where it gives one (`event_tokens_exact`), else the
                  request's tokens after its first event spread evenly (in whole tokens) over its later events
    delivery      "stalled": tokens >= 2 and ttft >= STALL_FRACTION x e2el (everything arrived at the end);
                  "bunched": tokens per chunk after the first > BUNCH_FACTOR x the expected tokens per chunk
                  (the arm's accept length, 1 for a baseline): several decode steps per chunk; else "stream"
Distributions (`Percentiles`, ms): n, mean, p50/p90/p99 (numpy's default linear interpolation), each with a
percentile-bootstrap CI at `level` that resamples requests with replacement (seeded; a resampled request brings
all of its gaps to a pooled distribution):
    ttft_ms, tpot_ms, e2el_ms   one value per request
    itl_chunk_ms  every gap between consecutive chunks of every request, pooled (n = gaps)
    itl_ms        per token, pooled: a chunk that arrives g ms after the previous one carrying k tokens gives k
                  values g / k (n = tokens after the first chunks)
Rates over the measurement windows (a window: the requests of one start at one concurrency; its time
max(t_end) - min(t_start) over its measured requests, failed ones included; duration_s = the sum, s):
    request_rate          = successful requests / duration_s                                        (req/s)
    output_tok_s          = output tokens of the successful requests / duration_s       (tok/s, all streams)
    achieved_concurrency  = sum of e2el over the measured requests / duration         (Little's law, requests)
    goodput               = requests meeting every SLO of `slo` (ttft_ms, tpot_ms, e2el_ms: value <= limit;
                            a 1-token request has no TPOT and meets a TPOT limit) / duration_s       (req/s)
    goodput_fraction      = good requests / successful requests
Granularity: a request's expected chunks after its first = (tokens - 1) / expected tokens per chunk (decoding
gives the first token alone, from prefill; a request whose output came in one chunk has none after it); when the median over requests of (chunks after the first / expected) < COARSE_RATIO the stream is
"coarse": ITL measures how the server delivers, not how it decodes, and itl_ms / itl_chunk_ms are withheld;
ttft_ms and tpot_ms too when the first chunk carried more than max(2, 2 x expected) tokens (median over requests
with exact counts) or more than half the requests stalled. "unknown": no request has events (a record without
stream.csv: only requests.csv's columns, and the chunk count against the tokens), or no expected tokens per
chunk was given.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from spectrial.analysis.stats import finite as _num
from spectrial.errors import ConfigError
from spectrial.schema import Percentiles, RequestRecord, ServerRequestStats, ServingFigures

BURST_FRACTION = 0.1  # events closer than this x TPOT are one delivered chunk
STALL_FRACTION = 0.9  # ttft >= this x e2el: the output arrived at the end
BUNCH_FACTOR = 1.5  # tokens per chunk above this x expected: several decode steps per chunk
MAX_TOKENS = 2**40  # tokens of one request beyond which a count is damaged (no output is near it)
COARSE_RATIO = 0.5  # median chunks / expected chunks below this: the stream is too coarse for ITL
QUANTILES = (50.0, 90.0, 99.0)
_SINGLE_STAGE = 2048  # pooled values up to this many: one stage (a resample's weights over all of them)
_BIN = 512  # values per rank bin beyond it
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")
EVENT_KEY = ("arm", "point", "restart", "start", "concurrency", "phase", "index")  # a request's key in stream.csv
EVENT_COLUMNS = (*EVENT_KEY, "event", "t_ms", "tokens")
EVENT_LISTS = ("events_ms", "event_tokens")
OUTPUT_KEY = ("arm", "point", "restart", "start", "phase", "index", "prompt_id")  # a request's key in outputs.jsonl
DECIMALS = 4  # figure values rounded so that the JSON is stable
COLOURS = ("#7f7f7f", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
           "#17becf")


# --- one request ------------------------------------------------------------------------------------------
def e2el_ms(r: RequestRecord) -> float | None:
    """End-to-end latency (ms): recorded, else t_end - t_start."""
    v, a, b = _num(r.e2el_ms), _num(r.t_start), _num(r.t_end)
    return v if v is not None or a is None or b is None else (b - a) * 1000


def tpot_ms(r: RequestRecord) -> float | None:
    """Time per output token after the first (ms): recorded, else (e2el - ttft) / (tokens - 1)."""
    v = _num(r.tpot_ms)
    if v is None:
        e, t = e2el_ms(r), _num(r.ttft_ms)
        v = (e - t) / (r.tokens - 1) if e is not None and t is not None and (r.tokens or 0) > 1 else None
    return v


def event_counts(r: RequestRecord) -> np.ndarray:
    """Tokens of each token event (int): the server's counts where exact, else the request's tokens after its
    first event spread evenly, in whole tokens, over its later events."""
    counts = r.event_tokens or [1] * len(r.events_ms or [])  # a damaged count (past MAX_TOKENS) is capped there
    n = np.asarray([min(max(int(x), 0), MAX_TOKENS) for x in counts], dtype=np.int64)
    if r.event_tokens_exact or len(n) < 2 or not r.tokens:
        return n
    rest = int(r.tokens) - int(n[0])
    if rest < 0 or rest == int(n[1:].sum()) or rest > MAX_TOKENS:  # past any output: a damaged count, not spread
        return n
    return np.concatenate([n[:1], np.diff(np.round(np.linspace(0, rest, len(n))).astype(np.int64))])


def _chunk_arrays(r: RequestRecord) -> tuple[np.ndarray, np.ndarray]:
    """(times ms, tokens) of the delivered chunks (see `chunks`)."""
    t = np.asarray(r.events_ms or [], dtype=float)
    n = event_counts(r)
    if len(n) != len(t):  # a hand-made record: one token per event
        n = np.ones(len(t), dtype=np.int64)
    if len(t) < 2:
        return t, n
    tp, e2el, tokens = tpot_ms(r), e2el_ms(r), int(r.tokens or n.sum())
    if e2el is not None and _stalled(tokens, _num(r.ttft_ms), e2el):
        tp = e2el / tokens  # its TPOT is the time the output took to arrive, not to decode
    if not tp or tp <= 0:
        return t, n
    new = np.concatenate([[True], np.diff(t) >= BURST_FRACTION * tp])
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:] - 1, len(t) - 1)
    return t[ends], np.add.reduceat(n, starts)


def chunks(r: RequestRecord) -> list[tuple[float, int]]:
    """The request's delivered chunks as (arrival ms after t_start, tokens): consecutive token events less than
    BURST_FRACTION x the request's TPOT (stalled: e2el / tokens) apart merged (the group's last arrival, its
    tokens summed)."""
    t, n = _chunk_arrays(r)
    return [(float(a), int(b)) for a, b in zip(t, n, strict=True)]


def _stalled(tokens: int, ttft: float | None, e2el: float | None) -> bool:
    return tokens >= 2 and ttft is not None and e2el is not None and e2el > 0 and ttft >= STALL_FRACTION * e2el


def stalled(r: RequestRecord) -> bool:
    """The request's output arrived all at the end (TTFT >= STALL_FRACTION x e2el): its client-clock decode rate
    (tokens after the first / first-to-last event) measures the delivery burst, not the decoding."""
    return _stalled(int(r.tokens or 0), _num(r.ttft_ms), e2el_ms(r))


def _delivery(tokens: int, ttft: float | None, e2el: float | None, n_chunks: int, first: int,
              expected: float | None) -> str | None:
    """Delivery from a request's tokens, ttft, e2el and chunks (count and the first one's tokens)."""
    if _stalled(tokens, ttft, e2el):
        return "stalled"
    if n_chunks == 0:
        return None
    if tokens < 2:
        return "stream"
    if not expected:
        return None
    per_chunk = (tokens - first) / (n_chunks - 1) if n_chunks > 1 else float(tokens)  # one chunk: all at once
    return "bunched" if per_chunk > BUNCH_FACTOR * expected else "stream"


def delivery(r: RequestRecord, expected_tokens_per_chunk: float | None) -> str | None:
    """How the request's output arrived: "stalled" (all at the end), "bunched" (several decode steps per chunk
    against `expected_tokens_per_chunk`: the arm's accept length, 1 for a baseline) or "stream"; None when it
    cannot tell (no events and no chunk count, or no expected tokens per chunk for a request not stalled).
    A record without events is judged on its chunk count (first chunk taken as one token)."""
    if r.events_ms:
        _, n = _chunk_arrays(r)
        return _delivery(int(r.tokens or n.sum()), _num(r.ttft_ms), e2el_ms(r), len(n), int(n[0]),
                         expected_tokens_per_chunk)
    return _delivery(int(r.tokens or 0), _num(r.ttft_ms), e2el_ms(r), int(r.chunks or 0), 1,
                     expected_tokens_per_chunk)


# --- distributions ----------------------------------------------------------------------------------------
def _boot_counts(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) how often each of n requests is drawn in each bootstrap resample."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n)) + (np.arange(n_boot) * n)[:, None]
    return np.bincount(idx.ravel(), minlength=n_boot * n).reshape(n_boot, n).astype(np.float64)


def _row_search(cum: np.ndarray, rows: np.ndarray, k: np.ndarray) -> np.ndarray:
    """For each (row, k): the first column of `cum` (rows non-decreasing, >= 0) whose value exceeds k."""
    n, cols = cum.shape
    big = float(cum[:, -1].max()) + float(k.max(initial=0)) + 2.0
    off = np.arange(n) * big
    flat = (cum + off[:, None]).ravel()
    return np.searchsorted(flat, k + off[rows], side="right") - rows * cols


def boot_percentiles(values: np.ndarray, weights: np.ndarray, groups: np.ndarray, counts: np.ndarray,
                     qs: Sequence[float] = QUANTILES) -> np.ndarray:
    """(n_boot, len(qs)) percentiles of the pooled values in each bootstrap resample, exactly as numpy's default
    (linear) percentile of the values repeated `weights` x (their group's count in the resample) times.

    values, weights (int >= 0) and groups (the request each value belongs to) are aligned; counts is
    (n_boot, n_groups). NaN where a resample holds no value. Vectorised in two stages: per-group histograms
    over rank bins of _BIN values locate the bin of each target rank (one matrix product), then the target is
    found inside its bin."""
    n_boot, n_groups = counts.shape
    order = np.argsort(values, kind="stable")
    m = len(order)
    out = np.full((n_boot, len(qs)), np.nan)
    if m == 0:
        return out
    size = m if m <= _SINGLE_STAGE else _BIN
    nbins = -(-m // size)
    pad = nbins * size - m  # padded to whole bins with weight 0
    v = np.concatenate([values[order].astype(np.float64), np.full(pad, values[order][-1], dtype=np.float64)])
    w = np.concatenate([weights[order].astype(np.float64), np.zeros(pad)])
    g = np.concatenate([groups[order], np.zeros(pad, dtype=np.int64)]).astype(np.int64)
    if nbins == 1:  # one stage: each resample's cumulative weights over every value
        cum_bins = np.cumsum(counts[:, g] * w, axis=1)  # (n_boot, m)
    else:
        hist = np.bincount(g * nbins + np.arange(len(g)) // size, weights=w,
                           minlength=n_groups * nbins).reshape(n_groups, nbins)
        cum_bins = np.cumsum(counts @ hist, axis=1)  # (n_boot, nbins)
    total = cum_bins[:, -1]
    last = np.maximum(total - 1, 0)
    h = np.outer(last, np.asarray(qs, dtype=np.float64) / 100.0)  # (n_boot, q): position in the repeated data
    lo = np.floor(h)
    targets = np.concatenate([lo, np.minimum(lo + 1, last[:, None])], axis=1)  # (n_boot, 2q) ranks
    rows = np.repeat(np.arange(n_boot), targets.shape[1])
    k = targets.ravel()
    found = np.minimum(_row_search(cum_bins, rows, k), cum_bins.shape[1] - 1)
    if nbins == 1:
        idx = found
    else:
        before = np.where(found > 0, cum_bins[rows, np.maximum(found - 1, 0)], 0.0)
        pos = found[:, None] * size + np.arange(size)[None, :]
        inside = np.cumsum(counts.ravel()[rows[:, None] * n_groups + g[pos]] * w[pos], axis=1)
        idx = found * size + np.minimum(_row_search(inside, np.arange(len(k)), k - before), size - 1)
    vals = v[idx].reshape(n_boot, -1)
    nq = len(qs)
    res = vals[:, :nq] + (h - lo) * (vals[:, nq:] - vals[:, :nq])
    ok = total > 0
    out[ok] = res[ok]
    return out


def _percentiles(values: np.ndarray, weights: np.ndarray, groups: np.ndarray, counts: np.ndarray | None,
                 level: float) -> Percentiles | None:
    """A Percentiles of the pooled values (weights: integer repetitions), CIs from the request resamples."""
    keep = weights > 0
    values, weights, groups = values[keep], weights[keep], groups[keep]
    if len(values) == 0:
        return None
    full = np.repeat(values, weights)
    p = np.percentile(full, QUANTILES)
    out = Percentiles(n=int(weights.sum()), mean=float(np.average(values, weights=weights)),
                      p50=float(p[0]), p90=float(p[1]), p99=float(p[2]))
    if counts is not None and len(np.unique(groups)) >= 2:
        reps = boot_percentiles(values, weights, groups, counts)
        a = (1 - level) / 2 * 100
        ci = np.nanpercentile(reps, [a, 100 - a], axis=0)  # (2, q)
        out.p50_ci, out.p90_ci, out.p99_ci = ([float(ci[0, i]), float(ci[1, i])] for i in range(len(QUANTILES)))
        out.ci_level = level
    return out


def percentiles(values: Sequence[float], *, level: float = 0.95, seed: int = 0, n_boot: int = 1000) -> Percentiles:
    """A Percentiles of independent values (each its own unit of resampling)."""
    v = np.asarray([x for x in values if _num(x) is not None], dtype=float)
    counts = _boot_counts(len(v), n_boot, seed) if len(v) >= 2 else None
    return _percentiles(v, np.ones(len(v), dtype=np.int64), np.arange(len(v)), counts, level) or Percentiles()


# --- one arm ----------------------------------------------------------------------------------------------
@dataclass
class _Arm:
    """What the figures of one arm are computed from (see `_collect`)."""

    ok: list[RequestRecord]
    ttft: np.ndarray  # per ok request, NaN where unknown
    tpot: np.ndarray
    e2el: np.ndarray
    itl_chunk: tuple[np.ndarray, np.ndarray, np.ndarray] = field(default_factory=lambda: _empty3())
    itl: tuple[np.ndarray, np.ndarray, np.ndarray] = field(default_factory=lambda: _empty3())
    deliveries: list[str | None] = field(default_factory=list)
    granularity: str = "unknown"
    withhold_itl: bool = False
    withhold_ttft: bool = False
    chunks_per_request: float | None = None
    tokens_per_chunk: float | None = None
    notes: list[str] = field(default_factory=list)


def _empty3() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)


def _measured(requests: Sequence[RequestRecord]) -> list[RequestRecord]:
    return [r for r in requests if (r.phase or "measure") == "measure"]


def _collect(requests: Sequence[RequestRecord], expected: float | None) -> _Arm:
    """Per-request values, pooled gaps, deliveries and the granularity verdict of one arm's requests."""
    ok = [r for r in _measured(requests) if r.ok]
    nan = float("nan")
    arm = _Arm(ok=ok, ttft=np.array([_num(r.ttft_ms) if _num(r.ttft_ms) is not None else nan for r in ok]),
               tpot=np.array([v if (v := tpot_ms(r)) is not None else nan for r in ok]),
               e2el=np.array([v if (v := e2el_ms(r)) is not None else nan for r in ok]))
    evented = [i for i, r in enumerate(ok) if r.events_ms]
    gaps, gtok, ggrp, n_chunks, ratios, exact_firsts = [], [], [], [], [], []
    tok_after = chunks_after = 0
    for i, r in enumerate(ok):
        tokens = int(r.tokens or 0)
        if r.events_ms:
            t, n = _chunk_arrays(r)
            tokens = tokens or int(n.sum())
            first = int(n[0])
            if r.event_tokens_exact:
                exact_firsts.append(first)
            gaps.append(np.diff(t))
            gtok.append(n[1:])
            ggrp.append(np.full(len(t) - 1, i))
            k = len(t)
        elif not evented:  # an old record: only the chunk count
            k, first = int(r.chunks or 0), 1
        else:
            arm.deliveries.append(None)
            continue
        arm.deliveries.append(_delivery(tokens, _num(r.ttft_ms), e2el_ms(r), k, first, expected))
        if k == 0:
            continue
        n_chunks.append(k)
        if tokens > first:
            tok_after += tokens - first
            chunks_after += k - 1
        if expected and tokens >= 2:
            ratios.append((k - 1) / ((tokens - 1) / expected))
    if gaps:
        g, n, grp = np.concatenate(gaps), np.concatenate(gtok).astype(np.int64), np.concatenate(ggrp)
        arm.itl_chunk = (g, np.ones(len(g), dtype=np.int64), grp)
        per = np.divide(g, n, out=np.zeros(len(g)), where=n > 0)
        arm.itl = (per, n, grp)
    arm.chunks_per_request = float(np.median(n_chunks)) if n_chunks else None
    arm.tokens_per_chunk = tok_after / chunks_after if chunks_after else None
    stalled = sum(d == "stalled" for d in arm.deliveries)
    if not evented:
        arm.withhold_itl = True
        arm.notes.append("no per-event timings (a record without stream.csv): ITL not computed")
    if not expected:
        arm.notes.append("expected tokens per chunk unknown (no accept length): the stream's granularity is not "
                         "checked")
    elif ratios and float(np.median(ratios)) < COARSE_RATIO:
        arm.granularity = "coarse"
        arm.withhold_itl = True
        toks = float(np.median([r.tokens for r in ok if r.tokens])) if any(r.tokens for r in ok) else 0.0
        gives = "one token per decode step" if expected == 1 else f"accept length {expected:.2f}"
        arm.notes.append(f"streaming too coarse: {arm.chunks_per_request:.0f} chunks per request for {toks:.0f} "
                         f"tokens ({gives} gives ~{toks / expected:.0f}): ITL measures delivery, not decoding")
        limit = max(2.0, 2 * expected)
        if exact_firsts and float(np.median(exact_firsts)) > limit:
            arm.withhold_ttft = True
            arm.notes.append(f"TTFT and TPOT withheld: the first chunk carried {np.median(exact_firsts):.0f} "
                             f"tokens (more than {limit:.0f}): the first token's time is not seen")
        elif stalled * 2 > len(ok):
            arm.withhold_ttft = True
            arm.notes.append(f"TTFT and TPOT withheld: {stalled} of {len(ok)} requests stalled (their output "
                             "arrived at the end)")
    elif evented and ratios:
        arm.granularity = "fine"
    return arm


def _windows(requests: Sequence[RequestRecord]) -> tuple[float | None, float]:
    """(duration_s: the sum over windows of max(t_end) - min(t_start), sum of e2el s) of the measured requests
    with both timestamps; a window is one start (its order, else its restart) at one concurrency."""
    spans: dict[tuple[Any, ...], list[float]] = {}
    busy = 0.0
    for r in _measured(requests):
        a, b = _num(r.t_start), _num(r.t_end)
        if a is None or b is None:
            continue
        key = (r.arm, r.point, r.start if r.start is not None else r.restart, r.concurrency)
        s = spans.setdefault(key, [a, b])
        s[0], s[1] = min(s[0], a), max(s[1], b)
        busy += b - a
    total = sum(b - a for a, b in spans.values())
    return (total if total > 0 else None), busy


def serving_figures(requests: Sequence[RequestRecord], *, expected_tokens_per_chunk: float | None,
                    concurrency: int | None = None, slo: Mapping[str, float] | None = None, level: float = 0.95,
                    seed: int = 0, n_boot: int = 1000) -> ServingFigures:
    """The serving figures of one arm over its measured requests (every start; see the module docstring).
    `expected_tokens_per_chunk`: what decoding gives per step (the accept length; 1 for a baseline);
    `concurrency`: the requested one (else the requests' own when they share one); `slo`: limits in ms of
    ttft_ms / tpot_ms / e2el_ms for goodput."""
    limits = {k: float(v) for k, v in (slo or {}).items() if v is not None}
    bad = sorted(set(limits) - set(SLO_KEYS))
    if bad:
        raise ConfigError(f"slo: unknown key(s) {', '.join(bad)}; the SLOs are {', '.join(SLO_KEYS)} (ms)",
                          parameter="slo")
    expected = _num(expected_tokens_per_chunk)
    arm = _collect(requests, expected)
    ok = arm.ok
    duration, busy = _windows(requests)
    concs = {r.concurrency for r in _measured(requests)}
    out = ServingFigures(requests=len(ok), duration_s=duration,
                         requested_concurrency=concurrency if concurrency is not None
                         else (concs.pop() if len(concs) == 1 else None),
                         expected_tokens_per_chunk=expected, granularity=arm.granularity,
                         chunks_per_request=arm.chunks_per_request, tokens_per_chunk=arm.tokens_per_chunk,
                         stalled=sum(d == "stalled" for d in arm.deliveries),
                         bunched=sum(d == "bunched" for d in arm.deliveries), notes=list(arm.notes))
    if duration:
        out.request_rate = len(ok) / duration
        out.output_tok_s = sum(int(r.tokens or 0) for r in ok) / duration
        out.achieved_concurrency = busy / duration
    counts = _boot_counts(len(ok), n_boot, seed) if len(ok) >= 2 and n_boot > 0 else None
    idx = np.arange(len(ok))

    def per_request(x: np.ndarray) -> Percentiles | None:
        keep = ~np.isnan(x)
        return _percentiles(x[keep], np.ones(int(keep.sum()), dtype=np.int64), idx[keep], counts, level)

    out.e2el_ms = per_request(arm.e2el)
    if not arm.withhold_ttft:
        out.ttft_ms, out.tpot_ms = per_request(arm.ttft), per_request(arm.tpot)
    if not arm.withhold_itl:
        out.itl_chunk_ms = _percentiles(*arm.itl_chunk, counts, level)
        out.itl_ms = _percentiles(*arm.itl, counts, level)
    req = out.requested_concurrency
    if req and req > 1 and out.achieved_concurrency is not None and out.achieved_concurrency < 0.75 * req:
        out.notes.append(f"achieved concurrency {out.achieved_concurrency:.2f} of {req} requested: the server ran "
                         "fewer requests at once (its slots: the launch notes) or the windows had too few requests")
    if out.stalled:
        out.notes.append(f"{out.stalled} of {len(ok)} requests stalled: no output until the end")
    if out.bunched:
        out.notes.append(f"{out.bunched} of {len(ok)} requests bunched: chunks carried several decode steps each")
    if not limits:
        out.notes.append("set slo: {ttft_ms, tpot_ms} to compute goodput")
        return out
    out.slo = limits
    withheld = [k for k in limits if getattr(out, k) is None and k != "e2el_ms"]
    if withheld:
        out.notes.append(f"goodput not computed: {', '.join(withheld)} withheld")
        return out
    values = {"ttft_ms": arm.ttft, "tpot_ms": arm.tpot, "e2el_ms": arm.e2el}
    good = np.ones(len(ok), dtype=bool)
    for k, lim in limits.items():
        x = values[k]
        met = np.where(np.isnan(x), False, x <= lim)
        if k == "tpot_ms":  # a 1-token request has no time per output token
            met |= np.array([int(r.tokens or 0) <= 1 for r in ok], dtype=bool)
        good &= met
    out.good_requests = int(good.sum())
    out.goodput = out.good_requests / duration if duration else None
    out.goodput_fraction = out.good_requests / len(ok) if ok else None
    return out


# --- tables -----------------------------------------------------------------------------------------------
def requests_frame(requests: Sequence[RequestRecord]) -> pd.DataFrame:
    """One row per request (every field but the event lists): requests.csv. The engine's `server_*` figures come
    last, only those it reported."""
    frame = pd.DataFrame([r.model_dump(exclude={*EVENT_LISTS, "output"}) for r in requests])
    server = [c for c in ServerRequestStats.model_fields if c in frame and not frame[c].isna().all()]
    return frame[[c for c in frame.columns if c not in ServerRequestStats.model_fields] + server]


def events_frame(requests: Sequence[RequestRecord]) -> pd.DataFrame:
    """Every token event of every request, long format (EVENT_COLUMNS: the request's key, the event's number,
    its arrival in ms after the request was sent, its tokens): stream.csv."""
    cols: dict[str, list[Any]] = {c: [] for c in EVENT_COLUMNS}
    for r in requests:
        t = list(r.events_ms or [])
        n = list(r.event_tokens or [1] * len(t))
        for c in EVENT_KEY:
            cols[c] += [getattr(r, c)] * len(t)
        cols["event"] += list(range(len(t)))
        cols["t_ms"] += t
        cols["tokens"] += n[:len(t)]
    return pd.DataFrame(cols)


def _plain(v: Any) -> Any:
    """A CSV cell as a Python value: NaN -> None, numpy scalars -> Python, whole floats of key columns -> int."""
    if v is None:
        return None
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _key(values: Sequence[Any]) -> tuple[Any, ...]:
    out = []
    for v in values:
        v = _plain(v)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        out.append(v)
    return tuple(out)


def from_frames(requests_df: pd.DataFrame, events_df: pd.DataFrame | None = None) -> list[RequestRecord]:
    """Request records read back from a run folder's requests.csv and, when there is one, stream.csv."""
    recs = [RequestRecord(**{str(k): _plain(v) for k, v in row.items() if _plain(v) is not None})
            for row in requests_df.to_dict("records")]
    if events_df is None or events_df.empty:
        return recs
    key = [c for c in EVENT_KEY if c in events_df.columns]
    ev = events_df.sort_values([*key, "event"], kind="stable")
    by: dict[tuple[Any, ...], tuple[list[float], list[int]]] = {}
    for k, grp in ev.groupby(key, sort=False, dropna=False):
        by[_key(k if isinstance(k, tuple) else (k,))] = ([float(x) for x in grp["t_ms"]],
                                                        [int(x) for x in grp["tokens"]])
    for r in recs:
        hit = by.get(_key([getattr(r, c) for c in key]))
        if hit:
            r.events_ms, r.event_tokens = hit
    return recs


# --- latency curves (drawn in spectrial.readers.render.plots) -----------------------------------------------------------------------------------------------
def _curve(values: np.ndarray, weights: np.ndarray) -> tuple[list[float], list[float]]:
    """(latency at each percentile, percentile) of the weighted values, rounded."""
    keep = (weights > 0) & ~np.isnan(values)
    if not keep.any():
        return [], []
    qs = np.concatenate([np.arange(0, 100, 1.0), [99.5, 99.9, 100.0]])
    x = np.percentile(np.repeat(values[keep], weights[keep]), qs)
    return [round(float(a), DECIMALS) for a in x], [round(float(q), DECIMALS) for q in qs]


@dataclass(frozen=True)
class LatencyCurve:
    """One arm's percentile curve of one latency figure: x the latency (ms), y the percentile."""

    arm: str
    panel: str  # one of LATENCY_PANELS
    x: list[float]
    y: list[float]


LATENCY_PANELS = ("TTFT (ms)", "TPOT (ms)", "ITL per token (ms)", "E2E latency (ms)")


def latency_curves(by_arm: Mapping[str, Sequence[RequestRecord]], *,
                   expected_tokens_per_chunk: Mapping[str, float | None] | None = None) -> list[LatencyCurve]:
    """Percentile curves of TTFT, TPOT, ITL per token and E2E latency per arm (drawn by
    `spectrial.readers.render.plots.latency_figure`); a figure that an arm's stream granularity makes meaningless
    is left out (`expected_tokens_per_chunk` per arm: its accept length, 1 for a baseline; without it every curve
    is kept)."""
    out: list[LatencyCurve] = []
    for name, reqs in by_arm.items():
        exp = (expected_tokens_per_chunk or {}).get(name)
        arm = _collect(reqs, _num(exp))
        ones = np.ones(len(arm.ok), dtype=np.int64)
        series = [(arm.ttft, ones, arm.withhold_ttft), (arm.tpot, ones, arm.withhold_ttft),
                  (arm.itl[0], arm.itl[1], arm.withhold_itl), (arm.e2el, ones, False)]
        for panel, (vals, w, withheld) in zip(LATENCY_PANELS, series, strict=True):
            if withheld:
                continue
            x, y = _curve(vals, w)
            if x:
                out.append(LatencyCurve(str(name), panel, x, y))
    return out


# --- the record's tables -----------------------------------------------------------------------------------
def serving_table(arms: Sequence[Any]) -> pd.DataFrame:
    """One row per completed arm with serving figures: p50/p90/p99 of TTFT, TPOT, ITL (per token) and E2E latency
    (ms, rounded), ITL per chunk p50, request rate (req/s), aggregate output tok/s, achieved concurrency, goodput
    (req/s) and its fraction, the stream's granularity and flagged requests. Empty when no arm has any."""
    rows = []
    for a in arms:
        sv: ServingFigures | None = getattr(a, "serving", None)
        if sv is None or getattr(a, "status", "ok") != "ok":
            continue
        row: dict[str, Any] = {"arm": a.name}
        for name in ("ttft", "tpot", "itl", "e2el"):
            dist = getattr(sv, f"{name}_ms")
            for q in ("p50", "p90", "p99"):
                v = getattr(dist, q) if dist is not None else None
                row[f"{name} {q} ms"] = None if v is None else round(v, 3 if name in ("itl", "tpot") else 1)
        chunk = sv.itl_chunk_ms.p50 if sv.itl_chunk_ms else None
        row["itl/chunk p50 ms"] = None if chunk is None else round(chunk, 3)
        row["req/s"] = None if sv.request_rate is None else round(sv.request_rate, 3)
        row["out tok/s"] = None if sv.output_tok_s is None else round(sv.output_tok_s, 1)
        row["concurrency"] = None if sv.achieved_concurrency is None else \
            f"{sv.achieved_concurrency:.2f} of {sv.requested_concurrency or '?'}"
        row["goodput req/s"] = None if sv.goodput is None else round(sv.goodput, 3)
        row["good %"] = None if sv.goodput_fraction is None else round(sv.goodput_fraction * 100, 1)
        row["stream"] = sv.granularity + (f", {sv.stalled} stalled" if sv.stalled else "") + \
            (f", {sv.bunched} bunched" if sv.bunched else "")
        rows.append(row)
    df = pd.DataFrame(rows)
    return df.dropna(axis=1, how="all") if len(df) else df


def request_cycles(r: RequestRecord) -> tuple[float, float, str] | None:
    """(accepted draft tokens, verify cycles, how) of one request, from the engine's per-request figures:
    SGLang's meta_info spec_verify_ct (accepted = decoded - cycles), vLLM's counters read around the request
    (server_verify_steps, server_draft_n_accepted), llama.cpp's timings draft_n_accepted (cycles = decoded -
    accepted: each cycle commits its accepted tokens plus one). None when the engine reports none."""
    decoded = float(r.server_predicted_n or r.tokens or 0) - 1
    verify = r.server_spec_verify_ct
    if verify is not None and verify > 0:
        return max(decoded - verify, 0.0), verify, "meta_info spec_verify_ct"
    acc = r.server_draft_n_accepted
    if acc is None:
        return None
    steps = r.server_verify_steps
    if steps is not None and steps > 0:
        return acc, steps, "counters around each request"
    if decoded > acc:
        return acc, decoded - acc, "timings draft_n_accepted (cycles = decoded - accepted)"
    return None


def write_requests(record: Any, requests: Sequence[RequestRecord], accept_len: Mapping[str, float | None],
                   key: str = "arm") -> None:
    """A run folder's requests.csv (one row per request, with how its stream was delivered: `delivery` against the
    accept length of its arm or point, `accept_len[r.<key>]`) and stream.csv (every token event of every request),
    through `record.write_frame` (spectrial.record.store.RunRecord)."""
    if not requests:
        return
    rows = requests_frame(requests)
    rows["delivery"] = [delivery(r, accept_len.get(str(getattr(r, key, None) or r.get(key)))) for r in requests]
    cycles = [request_cycles(r) for r in requests]  # the request's own accept length, where the engine counts it
    rows["accept_len"] = [1.0 + c[0] / c[1] if c and c[1] > 0 else None for c in cycles]
    record.write_frame("requests.csv", rows)
    events = events_frame(requests)
    if len(events):
        record.write_frame("stream.csv", events)
    kept = [r for r in requests if r.output is not None]
    if kept:  # the generated texts (the lossless check's evidence), one JSON line per request
        record.write_text("outputs.jsonl", "".join(
            json.dumps({**{k: getattr(r, k) for k in OUTPUT_KEY}, "output": r.output}) + "\n" for r in kept))
