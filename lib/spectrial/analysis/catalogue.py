"""The figure catalogue: every figure spectrial shows, declared once with its unit, its rate, which way is better
and its definition. The gate, the diff, the headline and docs/FIGURES.md read it; a figure added to the record's
types (`ArmFigures`, `Comparison`, `ServingFigures`) without an entry here fails tests/analysis/test_catalogue.py.

    >>> from spectrial.analysis.catalogue import figure
    >>> figure("ttft_ms").better, figure("ttft_ms").unit
    ('lower', 'ms')

`rate` says which of the three rates a speed is (docs/FIGURES.md, "Three rates, kept apart"): `per request` (each
request's decode rate, the verdict's), `aggregate` (all streams together), `engine` (the engine's own clock, a
cross-check only); figures that are no rate say what they count instead (`ratio`, `latency`, `count`, `share`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Rate = Literal["per request", "aggregate", "engine", "ratio", "latency", "count", "share", "requests"]
Better = Literal["higher", "lower", "neither"]


class FigureDef(BaseModel):
    """One figure: its record field, short label, unit, rate, better direction and definition."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    label: str
    unit: str
    rate: Rate
    better: Better
    definition: str
    where: Literal["arm", "comparison", "serving"]


def _f(name: str, label: str, unit: str, rate: Rate, better: Better, where: str, definition: str) -> FigureDef:
    return FigureDef(name=name, label=label, unit=unit, rate=rate, better=better, where=where,  # type: ignore[arg-type]
                     definition=definition)


_REQ = "per request"
FIGURES: tuple[FigureDef, ...] = (
    # an arm (ArmFigures)
    _f("tok_s", "tok/s", "tok/s per request (decode)", _REQ, "higher", "arm",
       "decode rate per request: each request's own rate (the engine's where every request reports one, else the "
       "client's: tokens after the first / first to last token event), median over the arm's requests"),
    _f("tok_s_ci_low", "tok/s CI low", "tok/s per request (decode)", _REQ, "higher", "arm",
       "the median rate's interval, low end (bootstrap over starts, then requests)"),
    _f("tok_s_ci_high", "tok/s CI high", "tok/s per request (decode)", _REQ, "higher", "arm",
       "the median rate's interval, high end"),
    _f("tok_s_q1", "tok/s q1", "tok/s per request (decode)", _REQ, "higher", "arm",
       "first quartile of the per-request rates"),
    _f("tok_s_q3", "tok/s q3", "tok/s per request (decode)", _REQ, "higher", "arm",
       "third quartile of the per-request rates"),
    _f("tok_s_iqr", "tok/s IQR", "tok/s per request (decode)", _REQ, "lower", "arm",
       "interquartile range of the per-request rates"),
    _f("tok_s_min", "tok/s min", "tok/s per request (decode)", _REQ, "higher", "arm", "the slowest request's rate"),
    _f("tok_s_max", "tok/s max", "tok/s per request (decode)", _REQ, "higher", "arm", "the fastest request's rate"),
    _f("tok_s_values", "start medians", "tok/s per request (decode)", _REQ, "higher", "arm",
       "per-start medians of the decode rate per request"),
    _f("start_medians", "start medians", "tok/s per request (decode)", _REQ, "higher", "arm",
       "median rate of each start"),
    _f("client_tok_s", "client tok/s", "tok/s per request (decode)", _REQ, "higher", "arm",
       "the decode rate by the client's clock (median over requests), whatever the engine reports"),
    _f("tok_s_cv", "CV", "fraction", "share", "lower", "arm", "coefficient of variation of the per-request rates"),
    _f("cv_within_start", "CV within", "fraction", "share", "lower", "arm",
       "coefficient of variation of request rates within one start (median over starts)"),
    _f("cv_between_starts", "CV between", "fraction", "share", "lower", "arm",
       "coefficient of variation of the per-start medians"),
    _f("cv_between_expected", "CV between expected", "fraction", "share", "neither", "arm",
       "what cv_between_starts would be from the within-start noise alone"),
    _f("ms_per_token", "ms/token", "ms per token", _REQ, "lower", "arm", "1000 / tok_s"),
    _f("ttft_ms", "TTFT ms", "ms, p50", "latency", "lower", "arm", "median time to first token (serving.ttft_ms.p50)"),
    _f("itl_ms", "ITL ms", "ms, p50", "latency", "lower", "arm",
       "median inter-token latency per token, pooled (serving.itl_ms.p50)"),
    _f("accept_len", "accept", "tokens per verify step", "count", "higher", "arm",
       "accept length: 1 + accepted / verify steps (engine counters over the measured windows)"),
    _f("draft_accept_rate", "draft accept", "fraction", "share", "higher", "arm",
       "accepted / drafted: the share of draft tokens accepted"),
    _f("per_position", "per position", "acceptance probability", "share", "higher", "arm",
       "how often the i-th drafted token is accepted, as the engine counts it"),
    _f("alpha", "alpha", "fraction", "share", "higher", "arm",
       "per-token acceptance of the chain model whose accept length at depth k is the arm's"),
    _f("drafted", "drafted", "tokens", "count", "neither", "arm", "draft tokens proposed over the measured windows"),
    _f("accepted", "accepted", "tokens", "count", "neither", "arm", "draft tokens accepted over the measured windows"),
    _f("tokens", "tokens", "tokens", "count", "neither", "arm", "tokens generated over the measured windows"),
    _f("verify_steps", "verify steps", "steps", "count", "neither", "arm", "verify passes over the measured windows"),
    _f("decode_ms", "decode ms", "ms", "engine", "neither", "arm",
       "decode time by the engine's clock over the measured windows"),
    _f("cycle_ms", "cycle ms", "ms per verify cycle", _REQ, "lower", "arm",
       "accept_len / tok_s x 1000: one cycle on the decode rate's clock"),
    _f("engine_ms_per_token", "engine ms/token", "ms per token", "engine", "lower", "arm",
       "decode time / tokens on the engine's clock (a cross-check, never a verdict)"),
    _f("engine_cycle_ms", "engine cycle ms", "ms per verify cycle", "engine", "lower", "arm",
       "decode time / verify steps on the engine's clock (a cross-check)"),
    _f("draft_ms_per_cycle", "draft ms/cycle", "ms per verify cycle", "engine", "lower", "arm",
       "drafting time per verify cycle by the engine's clock"),
    _f("graph_off_share", "steps without graphs", "fraction", "share", "lower", "arm",
       "share of decode (verify) steps that ran without a CUDA graph, from the engine's decode log lines"),
    _f("energy.j_per_token", "J/token", "J per output token", "aggregate", "lower", "arm",
       "energy of the benchmark windows (GPU power.draw x duration, or RAPL) over their output tokens; mean over "
       "starts"),
    _f("energy.j_per_accepted", "J/accepted", "J per accepted draft token", "aggregate", "lower", "arm",
       "the same energy over the accepted draft tokens; mean over starts"),
    _f("accept_len_request_mean", "accept per request", "tokens per verify step", "count", "higher", "arm",
       "mean over requests of each request's 1 + accepted / verify steps (every request weighs the same)"),
    _f("accept_len_request_p10", "accept p10", "tokens per verify step", "count", "higher", "arm",
       "10th percentile of the per-request accept lengths"),
    _f("accept_len_request_p50", "accept p50", "tokens per verify step", "count", "higher", "arm",
       "median of the per-request accept lengths"),
    _f("accept_len_request_p90", "accept p90", "tokens per verify step", "count", "higher", "arm",
       "90th percentile of the per-request accept lengths"),
    _f("requests_ok", "requests", "requests", "requests", "higher", "arm", "measured requests that completed"),
    _f("requests_failed", "failed", "requests", "requests", "lower", "arm", "measured requests that failed"),
    _f("accept_len_request_n", "requests with accept", "requests", "requests", "neither", "arm",
       "requests with an accept length of their own"),
    # an arm against its baseline (Comparison)
    _f("baseline_tok_s", "baseline tok/s", "tok/s per request (decode)", _REQ, "neither", "comparison",
       "the baseline's decode rate per request"),
    _f("speedup", "speed-up", "x baseline decode rate", "ratio", "higher", "comparison",
       "tok_s / baseline tok_s (a decide run: its sequence's geometric mean of paired per-round ratios)"),
    _f("speedup_ci_low", "speed-up CI low", "x baseline decode rate", "ratio", "higher", "comparison",
       "the speed-up's interval, low end"),
    _f("speedup_ci_high", "speed-up CI high", "x baseline decode rate", "ratio", "higher", "comparison",
       "the speed-up's interval, high end"),
    _f("break_even_accept_len", "break-even", "tokens per verify step", "count", "lower", "comparison",
       "the accept length at which the arm's cycle would just match the baseline: accept_len / speedup"),
    _f("break_even_ci_low", "break-even CI low", "tokens per verify step", "count", "lower", "comparison",
       "accept_len / speed-up CI high"),
    _f("break_even_ci_high", "break-even CI high", "tokens per verify step", "count", "lower", "comparison",
       "accept_len / speed-up CI low"),
    _f("min_detectable_ratio", "min detectable", "x baseline decode rate", "ratio", "lower", "comparison",
       "the smallest speed-up this noise could tell from 1"),
    _f("ci_level", "CI level", "fraction", "share", "neither", "comparison", "confidence level of the intervals"),
    # serving (ServingFigures)
    _f("serving.ttft_ms", "TTFT ms", "ms (p50/p90/p99)", "latency", "lower", "serving",
       "time to first token: request sent -> first event carrying a token"),
    _f("serving.tpot_ms", "TPOT ms", "ms (p50/p90/p99)", "latency", "lower", "serving",
       "time per output token after the first, per request: (e2el - ttft) / (tokens - 1)"),
    _f("serving.itl_ms", "ITL ms", "ms (p50/p90/p99)", "latency", "lower", "serving",
       "inter-token latency per token, pooled over every gap of every request"),
    _f("serving.itl_chunk_ms", "chunk gap ms", "ms (p50/p90/p99)", "latency", "lower", "serving",
       "gap per delivered chunk, pooled"),
    _f("serving.e2el_ms", "E2E ms", "ms (p50/p90/p99)", "latency", "lower", "serving",
       "end-to-end latency: request sent -> stream ended"),
    _f("serving.requests", "requests", "requests", "requests", "neither", "serving", "measured requests"),
    _f("serving.duration_s", "window s", "s", "latency", "neither", "serving", "measurement window time"),
    _f("serving.request_rate", "req/s", "req/s", "aggregate", "higher", "serving",
       "completed requests per second of measurement window"),
    _f("serving.output_tok_s", "output tok/s", "tok/s, all streams", "aggregate", "higher", "serving",
       "aggregate output rate: output tokens / measurement time, all streams together"),
    _f("serving.requested_concurrency", "concurrency", "requests in flight", "requests", "neither", "serving",
       "requests asked to be in flight"),
    _f("serving.achieved_concurrency", "achieved concurrency", "requests in flight", "requests", "neither",
       "serving", "mean requests in flight: sum of e2el / window time"),
    _f("serving.good_requests", "good requests", "requests", "requests", "higher", "serving",
       "requests that met every SLO"),
    _f("serving.goodput", "goodput", "req/s", "aggregate", "higher", "serving",
       "requests per second that met every SLO"),
    _f("serving.goodput_fraction", "goodput share", "fraction", "share", "higher", "serving",
       "share of requests that met every SLO"),
    _f("serving.chunks_per_request", "chunks/request", "chunks", "count", "neither", "serving",
       "stream chunks per request, median over requests"),
    _f("serving.tokens_per_chunk", "tokens/chunk", "tokens per chunk", "count", "neither", "serving",
       "output tokens after the first / chunks after the first, pooled"),
    _f("serving.expected_tokens_per_chunk", "expected tokens/chunk", "tokens per chunk", "count", "neither",
       "serving", "what decoding gives: the accept length (1 for a baseline)"),
    _f("serving.stalled", "stalled", "requests", "requests", "lower", "serving",
       "requests whose output arrived all at the end"),
    _f("serving.bunched", "bunched", "requests", "requests", "lower", "serving",
       "requests whose chunks carried several decode steps each"),
)
CATALOGUE: dict[str, FigureDef] = {f.name: f for f in FIGURES}


def figure(name: str) -> FigureDef:
    """A figure's declaration by its record name (`tok_s`, `serving.ttft_ms`; an index such as `per_position[2]` and
    a percentile suffix such as `serving.ttft_ms.p90` name their figure)."""
    base = name.split("[", 1)[0]
    if base not in CATALOGUE and base.rsplit(".", 1)[-1] in ("p50", "p90", "p99", "mean"):
        base = base.rsplit(".", 1)[0]
    try:
        return CATALOGUE[base]
    except KeyError:
        raise KeyError(f"{name!r} is no figure of the catalogue (spectrial.analysis.catalogue)") from None


def markdown_table() -> str:
    """The catalogue as docs/FIGURES.md shows it (tests/analysis/test_catalogue.py holds the two equal)."""
    lines = ["| figure | unit | rate | better | definition |", "|---|---|---|---|---|"]
    for f in FIGURES:
        lines.append(f"| `{f.name}` | {f.unit} | {f.rate} | {f.better} | {f.definition} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m spectrial.analysis.catalogue: the table for docs/FIGURES.md
    print(markdown_table())
