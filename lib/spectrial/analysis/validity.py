"""Is a measurement valid? The checks a speed-up must pass before spectrial calls an arm faster or slower.

Modelled on the load checks of Red Hat's `speculators` (scripts/evaluate/throughput_interactivity.py validate),
computed from what the record already holds (every request's timing, the engine's window counters), per arm:

    concurrency      achieved concurrency (mean requests in flight: sum of e2e latency / window time) at least
                     `min_concurrency_ratio` x the requested one; a concurrency above the engine's slots queues
    arrivals         (instead of concurrency at a request-rate level: an open loop) at most `max_held` of the
                     requests arrived with the in-flight cap full and waited in the client: beyond it the server
                     did not keep up with the offered rate, and the level measured the cap, not the rate. The
                     evidence gives the offered rate, the rate of the window's own schedule, the completed rate
                     and the client's send delays
    queueing         TTFT p90 under `queue_ttft_factor` x the fastest TTFT or under `queue_ttft_ms` (a queue in
                     front of the engine inflates TTFT, not decode). The engines' waiting gauges (vLLM
                     num_requests_waiting, SGLang num_queue_reqs, llama.cpp requests_deferred) are read only at
                     the window's edges, where the queue is empty: TTFT is the evidence
    prefix_cache     prompt tokens served from a prefix cache at most `max_prefix_cache_hit` of those looked up
                     (llama.cpp timings cache_n, vLLM prefix_cache_hits / queries, SGLang meta_info
                     cached_tokens): a cached prompt skips the prefill the baseline paid
    early_stop       at most `max_early_stop` of the requests ended before the length they asked (EOS, a stop
                     string); acceptance on outputs cut short is biased. Invalid for fixed-length workloads,
                     a warning where lengths are the workload's own (output_len dataset, MT-Bench)
    steady_state     (warning) enough measured requests per start (`min_requests`) and a warm-up request; known
                     before the run from its params (`planned`, the same rule on the planned requests per start:
                     every committed params file is held to no such warning by tests/analysis/test_validity.py)
    stream           tokens per streamed chunk against the accept length: a coarse stream makes the client's
                     decode rate a delivery rate (invalid when the verdict's rate is the client's, else a warning)
    start_spread     (warning) starts that disagree beyond their own noise (between-start CV over what the
                     within-start spread predicts > `max_start_spread`): the verdict's interval then rests on the
                     between-start spread (resampled starts), which it says; one start cannot show it

    speculation_live a speculative arm drafts, and its drafts are accepted: no draft token in the window
                     ("speculation not live": a drafter skipped, a method the engine ignored) or an accept length
                     within `min_accept_gain` of 1.0 while drafting ("dead drafter": a CI baseline once recorded
                     1.0097) is invalid, the counters as evidence. Counters the engine does not export are
                     unknown (n/a), never 0
    resolved_config  (warning) the engine resolved the settings the arm asked (slots, context, method, depth, draft,
                     parallel sizes, graph limits: spectrial.servers.configcheck); a mismatch fails the start
                     under `config_check: fail`, so one seen here was measured under `warn`. Added by the trial
                     from the starts' checks
    bandwidth_bound  the decode rate at most the memory-bandwidth bound (the weights and KV cache streamed once a
                     step: spectrial.analysis.roofline.bandwidth_bound), a speculative arm at most accept length x
                     that; above it is physically impossible (cache, miscounted tokens, another batch). n/a where
                     no bound (model size unknown, weights in the CPU cache). Added by the trial
    lossless         with greedy sampling, a speculative arm's outputs equal the baseline's for the same prompt
                     (the most common baseline output of that prompt): at most `max_output_mismatch` (numeric
                     noise) plus the baseline's own disagreement with itself may differ; the evidence says where
                     the first difference falls. Invalid where acceptance is the draft's own; n/a for a
                     synthetic arm (forced acceptance commits wrong drafts by design: the evidence is still
                     given). Sampled outputs: n/a.
                     Compared across arms, so added by `spectrial.analysis.figures.add_comparisons`

An arm whose check of severity "invalid" failed (or whose baseline's did) gets the verdict "invalid
measurement (...)" and pays "undecided" (spectrial.analysis.figures.judged): never "faster" or "slower".
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spectrial.schema import (
    ArmFigures,
    BandwidthBound,
    Check,
    ConfigCheckRecord,
    RequestRecord,
    Validity,
    WindowStats,
    bucket_tokens,
)


@dataclass(frozen=True)
class Limits:
    """Thresholds of the checks (params `validity`)."""

    min_concurrency_ratio: float = 0.75
    queue_ttft_factor: float = 10.0
    queue_ttft_ms: float = 1000.0
    max_prefix_cache_hit: float = 0.05
    max_early_stop: float = 0.10
    min_requests: int = 5
    max_start_spread: float = 2.0
    min_tokens_per_chunk_ratio: float = 0.5
    max_stalled: float = 0.25  # share of requests that stalled, beyond which client-clock rates are invalid
    max_held: float = 0.10  # request-rate levels: share of requests the in-flight cap held in the client
    min_accept_gain: float = 0.02
    max_output_mismatch: float = 0.10


@dataclass(frozen=True)
class Setting:
    """What the run asked for, beside what it measured."""

    concurrency: int = 1
    rate: float | None = None  # an open loop's offered requests per second (concurrency: its cap in flight)
    slots: int | None = None
    slots_setting: str = ""
    fixed_length: bool = True  # every request asked a fixed length (output_len fixed)
    warmup: int = 1
    limits: Limits = field(default_factory=Limits)


def _r(x: float | None, n: int = 3) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), n)


def over_slots(s: Setting, got: float | None = None) -> Check | None:
    """The concurrency check's verdict that needs no measurement: a concurrency above the engine's slots (None when
    it is not)."""
    if s.slots is None or s.concurrency <= s.slots:
        return None
    ev: dict[str, Any] = {"requested": s.concurrency, "achieved": _r(got), "slots": s.slots,
                          "slots_setting": s.slots_setting or None}
    return Check(name="concurrency", ok=False, value=_r(got), limit=float(s.slots), evidence=ev,
                 summary=f"concurrency {s.concurrency} is above the engine's {s.slots} slots "
                         f"({s.slots_setting}): requests queue in the server",
                 fix=f"raise {s.slots_setting} to at least {s.concurrency}, or lower concurrency")


def concurrency(f: ArmFigures, s: Setting) -> Check:
    sv = f.serving
    got = sv.achieved_concurrency if sv else None
    ev: dict[str, Any] = {"requested": s.concurrency, "achieved": _r(got), "slots": s.slots,
                          "slots_setting": s.slots_setting or None}
    queued = over_slots(s, got)
    if queued is not None:
        return queued
    if s.concurrency <= 1 or got is None:
        return Check(name="concurrency", ok=True if s.concurrency <= 1 else None, value=_r(got), evidence=ev,
                     summary="one request at a time" if s.concurrency <= 1 else "achieved concurrency unknown")
    lim = s.limits.min_concurrency_ratio * s.concurrency
    ok = got >= lim
    return Check(name="concurrency", ok=ok, value=_r(got), limit=_r(lim), evidence=ev,
                 summary=f"achieved concurrency {got:.2f} of {s.concurrency} requested"
                         + ("" if ok else f" (below {lim:.2f}: the load was not what was asked)"),
                 fix=None if ok else "send more requests per start (repeats) so the window is not ramp-up and "
                                     "tail; check that the client is not the bottleneck")


def arrivals(requests: Sequence[RequestRecord], f: ArmFigures, s: Setting) -> Check:
    """A request-rate level: were the requests sent when they arrived? (`held`: the cap of `s.concurrency` in flight
    was full at its arrival; the server did not keep up.) A cap above the engine's slots queues in the server."""
    queued = over_slots(s, None)
    if queued is not None:
        return queued
    sent = [r for r in requests if r.held is not None]
    if not sent:
        return Check(name="arrivals", ok=None, summary="no request of an open loop recorded its arrival")
    held = [r for r in sent if r.held]
    share = len(held) / len(sent)
    spans = {}  # each start's window: its own schedule's rate, (n - 1) / last arrival
    for r in sent:
        if r.arrival_ms is not None:
            n, last = spans.get(r.start, (0, 0.0))
            spans[r.start] = (n + 1, max(last, r.arrival_ms))
    sched = [(n - 1) / (last / 1000) for n, last in spans.values() if n > 1 and last > 0]
    delays = np.array([r.send_delay_ms for r in sent if r.send_delay_ms is not None], dtype=float)
    sv = f.serving
    ev: dict[str, Any] = {"offered_rate": s.rate, "scheduled_rate": _r(float(np.mean(sched))) if sched else None,
                          "completed_rate": _r(sv.request_rate) if sv else None, "cap": s.concurrency,
                          "held": len(held), "requests": len(sent),
                          "send_delay_ms_p50": _r(float(np.median(delays)), 1) if len(delays) else None,
                          "send_delay_ms_max": _r(float(delays.max()), 1) if len(delays) else None}
    ok = share <= s.limits.max_held
    rate = f"{s.rate:g} req/s" if s.rate is not None else "the offered rate"
    return Check(name="arrivals", ok=ok, value=_r(share), limit=s.limits.max_held, evidence=ev,
                 summary=(f"sent on arrival at {rate}: {len(held)} of {len(sent)} requests waited for the cap of "
                          f"{s.concurrency} in flight") if ok else
                 (f"the server did not keep up with {rate}: {len(held)} of {len(sent)} requests arrived with all "
                  f"{s.concurrency} in flight and waited in the client (up to {ev['send_delay_ms_max'] or 0:g} ms): "
                  "the level measured the cap, not the rate"),
                 fix=None if ok else "lower the request rate (grid.request_rate), or raise grid.max_inflight and "
                                     "the engine's slots; a saturated level says where the server's capacity ends")


def queueing(requests: Sequence[RequestRecord], s: Setting) -> Check:
    """TTFT p90 against the fastest; with context-length buckets (prompts of very different lengths: their
    prefill differs), within each bucket, the worst bucket's check standing for all."""
    buckets = sorted({t for r in requests if r.ok and (t := bucket_tokens(r.category)) is not None})
    if len(buckets) > 1:
        checks = [(t, _queueing([r for r in requests if bucket_tokens(r.category) == t], s)) for t in buckets]
        judged = [(t, c) for t, c in checks if c.ok is not None]
        if not judged:
            return checks[0][1]
        t, worst = max(judged, key=lambda x: (x[1].ok is False, (x[1].evidence or {}).get("factor") or 0))
        return worst.model_copy(update={
            "summary": f"per context bucket, worst at {t} prompt tokens: {worst.summary}",
            "evidence": {**(worst.evidence or {}), "bucket": t,
                         "buckets": {str(b): c.ok for b, c in checks}}})
    return _queueing(requests, s)


def _queueing(requests: Sequence[RequestRecord], s: Setting) -> Check:
    ttft = np.array([r.ttft_ms for r in requests if r.ok and r.ttft_ms is not None], dtype=float)
    lim = s.limits
    ev: dict[str, Any] = {}
    if len(ttft) < 2:
        return Check(name="queueing", ok=None, summary="too few TTFTs to judge queueing", evidence=ev)
    p90, lo = float(np.percentile(ttft, 90)), float(ttft.min())
    ev.update(ttft_p90_ms=_r(p90, 1), ttft_min_ms=_r(lo, 1), factor=_r(p90 / lo if lo > 0 else None, 1))
    slow = p90 > lim.queue_ttft_factor * lo and p90 > lim.queue_ttft_ms
    ok = not slow
    why = [f"TTFT p90 {p90:.0f} ms is {p90 / lo:.0f}x the fastest ({lo:.0f} ms)"] if slow else []
    return Check(name="queueing", ok=ok, value=_r(p90, 1), limit=_r(max(lim.queue_ttft_factor * lo,
                                                                      lim.queue_ttft_ms), 1), evidence=ev,
                 summary=("no queue: TTFT p90 " f"{p90:.0f} ms, fastest {lo:.0f} ms") if ok else
                 "requests queued: " + "; ".join(why),
                 fix=None if ok else "lower concurrency to the engine's slots, or give the engine more slots / "
                                     "memory; a queue measures waiting, not decoding")


def prefix_cache(stats: WindowStats, s: Setting) -> Check:
    q, hit = stats.prompt_tokens, stats.cached_prompt_tokens
    ev = {"prompt_tokens": q, "cached_prompt_tokens": hit}
    if q is None or hit is None:
        return Check(name="prefix_cache", ok=None, evidence=ev,
                     summary="prefix-cache hits not reported by the engine")
    if q == 0:
        return Check(name="prefix_cache", ok=True, value=0.0, limit=s.limits.max_prefix_cache_hit, evidence=ev,
                     summary="no prompt token looked up in a prefix cache (the cache is off)")
    ratio = hit / q
    ok = ratio <= s.limits.max_prefix_cache_hit
    return Check(name="prefix_cache", ok=ok, value=_r(ratio, 4), limit=s.limits.max_prefix_cache_hit, evidence=ev,
                 summary=f"{ratio:.1%} of prompt tokens served from the prefix cache"
                         + ("" if ok else f" (above {s.limits.max_prefix_cache_hit:.0%}: prefill skipped)"),
                 fix=None if ok else "turn the engine's prefix cache off (vLLM enable_prefix_caching: false, "
                                     "SGLang disable_radix_cache: true; llama.cpp requests already say "
                                     "cache_prompt false) or use a workload of unique prompts")


def early_stop(requests: Sequence[RequestRecord], s: Setting) -> Check:
    asked = [(r.tokens, r.max_tokens) for r in requests if r.ok and r.max_tokens]
    if not asked:
        return Check(name="early_stop", ok=None, summary="requested lengths not recorded")
    short = sum(1 for t, m in asked if t < m)
    share = short / len(asked)
    ok = share <= s.limits.max_early_stop
    sev = "invalid" if s.fixed_length else "warning"
    delivered = sum(t for t, _ in asked) / sum(m for _, m in asked)
    return Check(name="early_stop", ok=ok, severity=sev, value=_r(share, 4), limit=s.limits.max_early_stop,
                 evidence={"short": short, "requests": len(asked), "delivered_share": _r(delivered, 4)},
                 summary=f"{short} of {len(asked)} requests ended before their requested length "
                         f"({delivered:.0%} of the requested tokens delivered)",
                 fix=None if ok else "set ignore_eos: true (and no stop strings) for fixed-length requests, or "
                                     "output_len: dataset where natural lengths are the point")


def steady_state(requests: Sequence[RequestRecord], s: Setting) -> Check:
    """Enough measured requests in every start, after a warm-up: the rule of `steady_state_of`, on the requests
    each start measured."""
    per_start: dict[int, int] = {}
    for r in requests:
        if r.ok:
            per_start[r.restart] = per_start.get(r.restart, 0) + 1
    return steady_state_of(per_start, s)


def steady_state_of(per_start: Mapping[int, int], s: Setting) -> Check:
    """The steady-state rule on requests per start (measured: `steady_state`; planned: `planned`): the smallest
    start has at least `min_requests`, and each start warmed up with at least one request."""
    fewest = min(per_start.values()) if per_start else 0
    ok = fewest >= s.limits.min_requests and s.warmup >= 1
    why = []
    if fewest < s.limits.min_requests:
        why.append(f"{fewest} measured request(s) in the smallest start (under {s.limits.min_requests})")
    if s.warmup < 1:
        why.append("no warm-up request: the first measured request pays compilation and cache fills")
    fix = []
    if fewest < s.limits.min_requests:
        fix.append(f"raise repeats to at least {s.limits.min_requests} (or lower validity.min_requests)")
    if s.warmup < 1:
        fix.append("set warmup to at least 1")
    return Check(name="steady_state", ok=ok, severity="warning", value=float(fewest),
                 limit=float(s.limits.min_requests), evidence={"requests_per_start": dict(per_start),
                                                               "warmup": s.warmup},
                 summary=f"{fewest} measured requests per start after {s.warmup} warm-up" if ok else "; ".join(why),
                 fix=None if ok else "; ".join(fix))


def planned(requests_per_start: int, s: Setting) -> list[Check]:
    """The checks whose outcome the params decide before anything runs: the run's own rules (`steady_state_of`,
    `over_slots`) on the planned requests per start, so a params file and its run cannot disagree. A params file
    that fails one of these makes every run of it carry the warning (tests/analysis/test_validity.py holds every committed
    params file to none)."""
    out = [steady_state_of({0: requests_per_start}, s)]
    queued = over_slots(s)
    if queued is not None:
        out.append(queued)
    return [c for c in out if c.ok is False]


def stream(f: ArmFigures, speculative: bool, s: Setting) -> Check:
    sv = f.serving
    client = (f.tok_s_source or "").startswith("client")
    if sv is not None and sv.stalled and client:  # decode rates by the client's clock: a stalled request has none
        share = sv.stalled / max(sv.requests, 1)
        bad = share > s.limits.max_stalled
        return Check(name="stream", ok=False, severity="invalid" if bad else "warning", value=_r(share, 3),
                     limit=s.limits.max_stalled,
                     evidence={"stalled": sv.stalled, "requests": sv.requests, "rate_source": f.tok_s_source},
                     summary=f"{sv.stalled} of {sv.requests} requests stalled (all output at the end): their "
                             "client-clock rates time the delivery, not the decoding, and are left out"
                             + (f" (more than {s.limits.max_stalled:.0%}: the rest cannot stand for them)"
                                if bad else ""),
                     fix="measure with an engine that reports its own per-request timing, or at a load the "
                         "server streams at; a stalled stream is the API server's buffering, not decoding")
    if sv is None or sv.tokens_per_chunk is None:
        return Check(name="stream", ok=None, severity="warning", summary="stream granularity unknown")
    expected = sv.expected_tokens_per_chunk or 1.0
    ratio = expected / sv.tokens_per_chunk
    coarse = sv.granularity == "coarse" or ratio < s.limits.min_tokens_per_chunk_ratio
    sev = "invalid" if client else "warning"
    return Check(name="stream", ok=not coarse, severity=sev, value=_r(sv.tokens_per_chunk),
                 limit=_r(expected), evidence={"tokens_per_chunk": _r(sv.tokens_per_chunk),
                                               "expected": _r(expected), "granularity": sv.granularity,
                                               "rate_source": f.tok_s_source},
                 summary=f"{sv.tokens_per_chunk:.2f} tokens per streamed chunk "
                         f"(decoding gives {expected:.2f}{' per verify step' if speculative else ''})"
                         + (": the stream bunches steps" if coarse else ""),
                 fix=None if not coarse else "the client's decode rate is a delivery rate here: use an engine "
                                             "that reports its own per-request timing, or a lighter API server")


def start_spread(f: ArmFigures, s: Setting) -> Check:
    between, expected = f.cv_between_starts, f.cv_between_expected
    n = len(f.start_medians or [])
    if n < 2 or between is None:
        return Check(name="start_spread", ok=None, severity="warning",
                     summary="one start: the interval covers the noise within a start only; restarts >= 2 show "
                             "what another start would give",
                     fix="set restarts: 2 or more")
    ratio = between / expected if expected else None
    ok = ratio is None or ratio <= s.limits.max_start_spread
    ev = {"cv_between_starts": _r(between, 4), "cv_between_expected": _r(expected, 4), "starts": n,
          "start_medians": [_r(x, 2) for x in f.start_medians or []]}
    return Check(name="start_spread", ok=ok, severity="warning", value=_r(ratio, 2), limit=s.limits.max_start_spread,
                 evidence=ev,
                 summary=(f"starts agree: between-start CV {between:.1%} vs {expected:.1%} expected from the noise "
                          "within them") if ok else
                 (f"starts disagree beyond their own noise: between-start CV {between:.1%} vs {expected:.1%} "
                  "expected; the verdict's interval resamples starts (between-start spread)"),
                 fix=None if ok else "more restarts narrow an interval that rests on the starts; look for what "
                                     "changed between starts (clocks, placement, other load)")


def speculation_live(requests: Sequence[RequestRecord], stats: WindowStats, f: ArmFigures, s: Setting) -> Check:
    """A speculative arm drafts and has drafts accepted (see the module's table). The window's counters, else the
    requests' own draft counts; neither exported: unknown."""
    per_request = [r.server_draft_n for r in requests if r.server_draft_n is not None]
    drafted = stats.drafted if stats.drafted is not None else (sum(per_request) if per_request else None)
    accepted = stats.accepted if stats.accepted is not None else (
        sum(r.server_draft_n_accepted or 0 for r in requests) if per_request else None)
    ev = {"drafted": drafted, "accepted": accepted, "verify_steps": stats.verify_steps, "accept_len": _r(f.accept_len, 4),
          "tokens": f.tokens, "source": stats.source or ("per-request counts" if per_request else None)}
    limit = 1.0 + s.limits.min_accept_gain
    if drafted is None and f.accept_len is None:
        return Check(name="speculation_live", ok=None, evidence=ev,
                     summary="the engine exports no draft counters: whether speculation ran is unknown")
    if drafted is not None and drafted == 0:
        return Check(name="speculation_live", ok=False, value=0.0, evidence=ev,
                     summary=f"speculation not live: no draft token in the window ({f.tokens or 0:.0f} tokens "
                             "generated)",
                     fix="check that the engine took the speculative settings (its startup log, the resolved "
                         "configuration), that the draft model loaded, and that outputs are long enough to draft "
                         "(an engine may skip drafting for short outputs); n-gram lookup drafts only on repeated "
                         "text")
    if f.accept_len is not None and f.accept_len <= limit:
        return Check(name="speculation_live", ok=False, value=_r(f.accept_len, 4), limit=_r(limit, 4), evidence=ev,
                     summary=f"dead drafter: accept length {f.accept_len:.4f} is within "
                             f"{s.limits.min_accept_gain:.0%} of 1.0 while drafting"
                             + (f" ({drafted:.0f} drafted, {accepted or 0:.0f} accepted)" if drafted else ""),
                     fix="the draft does not match the target (wrong draft for this model or tokenizer, a draft "
                         "trained for another version, a corrupted file): load the draft meant for this target")
    return Check(name="speculation_live", ok=True, value=_r(f.accept_len, 4), limit=_r(limit, 4), evidence=ev,
                 summary=(f"speculation live: accept length {f.accept_len:.3f}" if f.accept_len is not None
                          else f"speculation live: {drafted:.0f} draft tokens"))


def _reference(requests: Sequence[RequestRecord]) -> tuple[dict[str, str], float | None]:
    """The baseline's output per prompt (its most common one) and the share of its own requests that differ from
    it (None: no prompt asked twice)."""
    by: dict[str, list[str]] = {}
    for r in requests:
        if r.ok and r.output is not None and r.prompt_id is not None:
            by.setdefault(r.prompt_id, []).append(r.output)
    ref = {pid: Counter(outs).most_common(1)[0][0] for pid, outs in by.items()}
    repeated = [(pid, o) for pid, outs in by.items() if len(outs) > 1 for o in outs]
    own = sum(o != ref[pid] for pid, o in repeated) / len(repeated) if repeated else None
    return ref, own


def lossless(requests: Sequence[RequestRecord], base_requests: Sequence[RequestRecord], greedy: bool | None,
             synthetic: bool, s: Setting) -> Check:
    """A speculative arm's greedy outputs against the baseline's for the same prompts (see the module's table)."""
    if greedy is None:
        return Check(name="lossless", ok=None, summary="sampling not known: outputs not compared")
    if not greedy:
        return Check(name="lossless", ok=None, summary="sampled outputs (temperature > 0) differ by design: "
                                                       "not compared (greedy sampling makes the check possible)")
    ref, own = _reference(base_requests)
    pairs = [(r, ref[r.prompt_id]) for r in requests
             if r.ok and r.output is not None and r.prompt_id is not None and r.prompt_id in ref]
    if not pairs:
        return Check(name="lossless", ok=None, summary="no output to compare with the baseline's (the engine "
                                                       "streamed no text, or no prompt in common)")
    differ = [(r, b, len(os.path.commonprefix([r.output or "", b]))) for r, b in pairs if r.output != b]
    share = 1 - len(differ) / len(pairs)
    allowed = s.limits.max_output_mismatch + (own or 0.0)
    ok = 1 - share <= allowed
    ev: dict[str, Any] = {"compared": len(pairs), "identical": len(pairs) - len(differ),
                          "baseline_self_mismatch": _r(own, 4), "allowed_mismatch": _r(allowed, 4)}
    where = ""
    if differ:
        at = [d for _, _, d in differ]
        rel = [d / max(len(b), 1) for _, b, d in differ]
        r0, b0, d0 = differ[0]
        ev.update(first_difference_chars_median=float(np.median(at)), first_difference_share_median=_r(
            float(np.median(rel)), 3), example={"prompt_id": r0.prompt_id, "at_char": d0,
                                                "baseline": b0[max(d0 - 20, 0):d0 + 40],
                                                "arm": (r0.output or "")[max(d0 - 20, 0):d0 + 40]})
        where = (f", the first difference at character {np.median(at):.0f} (median; "
                 f"{np.median(rel):.0%} into the baseline's output)")
    n_same = len(pairs) - len(differ)
    if synthetic:
        return Check(name="lossless", ok=None, value=_r(share, 4), evidence=ev,
                     summary=f"forced acceptance commits wrong drafts by design: outputs not held to the baseline's "
                             f"({n_same} of {len(pairs)} identical{where})")
    if ok:
        return Check(name="lossless", ok=True, value=_r(share, 4), limit=_r(1 - allowed, 4), evidence=ev,
                     summary=f"greedy outputs identical to the baseline's in {n_same} of {len(pairs)} requests"
                             + where)
    return Check(name="lossless", ok=False, value=_r(share, 4), limit=_r(1 - allowed, 4), evidence=ev,
                 summary=f"speculation changed the outputs: {n_same} of {len(pairs)} greedy outputs identical to the "
                         f"baseline's{where}",
                 fix="greedy speculative decoding must reproduce the target's own output: check the verify path (a "
                 "sampler or kernel that differs under speculation, a draft with another tokenizer), or raise "
                 "validity.max_output_mismatch if this hardware's numerics are known to diverge this much")


def resolved_config(c: ConfigCheckRecord | None) -> Check:
    """(warning) the engine resolved the configuration the arm asked (spectrial.servers.configcheck): under
    `config_check: fail` a mismatch fails the start before it is measured, so a mismatch here is one measured
    under `warn`; unread settings are listed, never a failure."""
    if c is None or c.mode == "off":
        return Check(name="resolved_config", ok=None, severity="warning",
                     summary="not checked" + (" (config_check: off)" if c is not None else ""))
    bad = c.mismatches
    return Check(name="resolved_config", ok=c.ok, severity="warning", value=float(len(bad)), limit=0.0,
                 summary=c.summary, evidence={"mismatches": [s.model_dump() for s in bad], "key": c.key,
                                              "resolved": c.resolved},
                 fix=("set the value through the params (an extra_args entry or an engine default overrode it), "
                      "or accept it knowingly" if bad else None))


def bandwidth_bound(f: ArmFigures, speculative: bool, bound: BandwidthBound | None) -> Check:
    """An arm's decode rate (tok/s per request) as a share of the memory-bandwidth bound of the run
    (`spectrial.analysis.roofline.bandwidth_bound`): a baseline step streams the weights once per token, a
    speculative verify step once per accept length, so a speculative arm is held to accept length x the bound.
    Above 100 %: physically impossible, an invalid measurement (a cache, miscounted tokens, another batch, or a
    bandwidth figure too low). No bound, or a speculative arm without an accept length: n/a."""
    if bound is None or bound.bound_tok_s is None:
        return Check(name="bandwidth_bound", ok=None, summary="n/a: " + (bound.note if bound is not None and bound.note
                                                                          else "no bandwidth bound for this run"))
    per_step = f.accept_len if speculative else 1.0
    if f.tok_s is None or not per_step:
        return Check(name="bandwidth_bound", ok=None, summary="n/a: " + (
            "no accept length to scale the bound by" if f.tok_s is not None else "no decode rate"))
    limit = bound.bound_tok_s * per_step
    share = f.tok_s / limit
    what = "the memory-bandwidth bound" if not speculative else f"accept length {per_step:.2f} x the memory-bandwidth bound"
    summary = (f"{share:.0%} of {what} ({f.tok_s:.1f} of {limit:.1f} tok/s per request at "
               f"{bound.bandwidth_gb_s:,.1f} GB/s, {bound.bytes_per_step / 1e6:.1f} MB a step)")
    ok = share <= 1.0
    return Check(name="bandwidth_bound", ok=ok, value=_r(share), limit=1.0,
                 summary=summary if ok else f"physically impossible: {summary}",
                 evidence={"tok_s": f.tok_s, "bound_tok_s": bound.bound_tok_s, "per_step": per_step,
                           "bandwidth_gb_s": bound.bandwidth_gb_s, "bandwidth_source": bound.bandwidth_source,
                           "bytes_per_step": bound.bytes_per_step},
                 fix=None if ok else ("a rate above what the memory can deliver: look for cached prompts or outputs, "
                                      "tokens counted twice, a batch larger than the concurrency, or a bandwidth "
                                      "figure too low (bandwidth_gb_s, params/hardware.yaml)"))


def with_check(v: Validity | None, check: Check) -> Validity:
    """`v` with `check` added (or replacing the check of its name), failed and warnings recomputed."""
    checks = [c for c in (v.checks if v is not None else []) if c.name != check.name] + [check]
    return Validity(checks=checks, failed=[c.name for c in checks if c.ok is False and c.severity == "invalid"],
                    warnings=[c.name for c in checks if c.ok is False and c.severity == "warning"])


def assess(requests: Sequence[RequestRecord], stats: WindowStats, f: ArmFigures, speculative: bool,
           setting: Setting) -> Validity:
    """Every check of one arm's (or sweep point's) measurement (`speculation_live` for speculative arms)."""
    ok = [r for r in requests if r.ok]
    load = concurrency(f, setting) if setting.rate is None else arrivals(requests, f, setting)
    checks = [load, queueing(ok, setting), prefix_cache(stats, setting),
              early_stop(ok, setting), steady_state(ok, setting), stream(f, speculative, setting),
              start_spread(f, setting)]
    if speculative:
        checks.append(speculation_live(ok, stats, f, setting))
    return Validity(checks=checks, failed=[c.name for c in checks if c.ok is False and c.severity == "invalid"],
                    warnings=[c.name for c in checks if c.ok is False and c.severity == "warning"])


INVALID = "invalid measurement"


def invalid_names(arm: Any, base: Any = None) -> list[str]:
    """The failed checks that make `arm`'s comparison with `base` invalid (the baseline's prefixed)."""
    out = list(getattr(getattr(arm, "validity", None), "failed", None) or [])
    if base is not None and base is not arm:
        out += [f"baseline {n}" for n in getattr(getattr(base, "validity", None), "failed", None) or []]
    return out


def invalid_verdict(names: Sequence[str]) -> str:
    return f"{INVALID} ({', '.join(names)})"


def is_invalid(verdict: str | None) -> bool:
    return bool(verdict) and str(verdict).startswith(INVALID)


def problems(v: Validity | None) -> list[Check]:
    """The failed checks, invalidating ones first."""
    if v is None:
        return []
    bad = [c for c in v.checks if c.ok is False]
    return sorted(bad, key=lambda c: c.severity != "invalid")


def checks_table(arms: Sequence[Any]) -> Any:
    """One row per arm and check: ok / failed / n/a, severity, figure, limit, what it says (a DataFrame)."""
    import pandas as pd

    rows = []
    for a in arms:
        for c in getattr(getattr(a, "validity", None), "checks", None) or []:
            rows.append({"arm": a.name, "check": c.name,
                         "result": "ok" if c.ok else "n/a" if c.ok is None else
                         ("INVALID" if c.severity == "invalid" else "warning"),
                         "value": c.value, "limit": c.limit, "says": c.summary})
    return pd.DataFrame(rows)
