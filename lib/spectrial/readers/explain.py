"""The analysis section of a run: why speculation pays or not, computed from a run record's arms.

``explain(manifest_or_arms, target_tok_s=None, roofline=None) -> Explanation`` returns five sections,
each a title, a markdown paragraph, optionally a table and a figure (drawn by `spectrial.readers.render.figures`):

1. **Input check**: run status, failed arms, arms without a baseline, zero verify steps, accept length < 1,
   speculative arms without a cycle time. Bad input becomes sentences here; ``explain`` never raises on it.
2. **Break-even**: per speculative arm, the record's break-even accept length (``spectrial.analysis.figures``: accept
   length / speed-up = its cycle / the baseline's ms per token), the achieved accept length, the margin, the
   speed-up with its interval and verdict, pays. Figure: tok/s a cycle of each arm's cost gives at every accept
   length (tau / cycle_ms * 1000), against the baseline.
3. **Cycle-cost model**: where one method was measured at >= 2 depths k under the same conditions (same
   ``nccl_env`` where arms record one; cycle times that are only lower bounds left out),
   ``analysis.fit_cycle_model`` (cycle_ms = fixed + per_draft * k) and the throughput it predicts for the
   measured arms (``analysis.prediction_errors``; alpha = the synthetic acceptance, else solved from the
   accept length). A negative fixed or per-draft cost is flagged as an implausible fit.
4. **Acceptance needed**: per depth, the per-token acceptance alpha that reaches the baseline (break-even)
   and a target tok/s (default 1.5x the baseline): ``CycleModel.alpha_for`` on the fitted model, or on a
   constant-cycle model at each measured arm when only one depth exists (its break-even column is then the
   arm's break-even).
5. **Roofline**: the baseline against the memory-bandwidth limit of batch-1 decode, when the record (or
   ``roofline=``) names the GPU model and count and the model's size (``analysis.decode_roofline_tok_s``).

One clock throughout: every cycle here is the verdict's (``figures.verdict_cycle_ms`` = break-even x the
baseline's ms per token; ``cycle_ms`` = accept length / tok/s x 1000 for every arm but a decide run's), so the
break-even of sections 2 and 4 is one number per arm. The engine's own clock (``engine_cycle_ms`` = decode time /
verify steps) appears only in the ``engine_cycle_ms (cross-check)`` columns: it never makes a second break-even.

With a workload of two categories or more (chat, code, ...), a **Per workload** section follows the
break-even: a cycle costs the same whatever the prompt, the acceptance does not; per arm, which categories'
accept length crosses the arm's break-even line, their speed-up and verdict against the baseline's requests of
the same category, and a sentence when one category wins while another loses.

k, the drafted tokens per cycle, is the arm's ``steps`` (llama.cpp ``--spec-draft-n-max``; SGLang
``--speculative-num-steps`` with top-k 1).

This module is the analysis alone (numbers and prose; no plotly, IPython or nbformat): the key figures are a
typed :class:`ExplainNumbers`, and each section names the figure that :mod:`spectrial.readers.render.figures` draws
for it from the analysis. Notebooks call ``show_explanation(explain(...))``, ``spectrial report`` renders the
same sections (``explanation_cells``), both from :mod:`spectrial.readers.render.figures`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, Field

from spectrial import analysis
from spectrial.analysis import figures
from spectrial.analysis.figures import is_baseline, positive
from spectrial.errors import ConfigError
from spectrial.record.store import as_arms, as_manifest
from spectrial.schema import ArmRecord, BandwidthBound, Manifest

__all__ = ["ArmView", "CategoryNumbers", "CycleFit", "ExplainNumbers", "Explanation", "FitError", "FitNumbers",
           "RooflineInputs", "Section", "explain"]

DEFAULT_TARGET_FACTOR = 1.5
MAX_MODEL_K = 10
_ROUND = 4


# ------------------------------------------------------------------ result types
FigureName = Literal["break_even", "workload", "model", "needed"]


@dataclass
class Section:
    """One titled part of the analysis: markdown text, optionally a table and the name of its figure (drawn by
    :mod:`spectrial.readers.render.figures` from the :class:`Explanation`)."""

    title: str
    text: str
    table: pd.DataFrame | None = None
    figure: FigureName | None = None


class FitError(BaseModel):
    """How far a fitted cycle model's throughput is off on the arms it was fitted on (relative, absolute)."""

    median: float | None = Field(None, description="median |relative error| of the predicted tok/s")
    max: float | None = Field(None, description="largest |relative error| of the predicted tok/s")
    n: int = Field(0, description="arms with an acceptance and a throughput to compare")


class FitNumbers(BaseModel):
    """One fitted cycle-cost model: cycle_ms = fixed_ms + per_draft_ms x k (and its split, where recorded)."""

    fixed_ms: float
    per_draft_ms: float
    r2: float = Field(description="R^2 of the fit (NaN with two points)")
    draft_fixed_ms: float | None = None
    draft_per_token_ms: float | None = None
    verify_fixed_ms: float | None = None
    verify_per_token_ms: float | None = None
    fitted_on: list[str] = Field(default_factory=list, description="the arms it was fitted on")
    error: FitError = Field(default_factory=FitError)

    def cycle_ms(self, k: float) -> float:
        """Predicted cycle time in ms at depth k."""
        return self.fixed_ms + self.per_draft_ms * k


class CategoryNumbers(BaseModel):
    """One workload category of a speculative arm against its break-even line."""

    accept_len: float | None = None
    break_even: float | None = None
    pays: str | None = None
    speedup: float | None = None
    verdict: str | None = None


class ExplainNumbers(BaseModel):
    """The key figures of an analysis (unrounded), section by section; None where not computed."""

    baseline_tok_s: float | None = None
    baseline_ms_per_token: float | None = None
    target_tok_s: float | None = None
    break_even: dict[str, float | None] = Field(default_factory=dict,
                                                description="break-even accept length per speculative arm")
    categories: dict[str, dict[str, CategoryNumbers]] = Field(default_factory=dict,
                                                              description="per arm, per workload category")
    models: dict[str, FitNumbers] = Field(default_factory=dict, description="per condition (method ...)")
    min_alpha_for_target: float | None = None
    roofline_tok_s: float | None = None
    weight_bytes_per_token: float | None = None
    kv_bytes_per_token: float | None = None
    bandwidth_gb_s: float | None = None
    baseline_roofline_fraction: float | None = None


@dataclass
class Explanation:
    """The analysis of one run: its sections, the input problems found, the key figures, and what the figures
    are drawn from (the arms as analysed, the baseline, the fitted models, the throughputs aimed at)."""

    sections: list[Section]
    problems: list[str] = field(default_factory=list)
    numbers: ExplainNumbers = field(default_factory=ExplainNumbers)
    spec: list[ArmView] = field(default_factory=list)
    base: ArmView | None = None
    fits: list[CycleFit] = field(default_factory=list)
    targets: list[tuple[str, float]] = field(default_factory=list)

    def section(self, title: str) -> Section:
        """The section whose title starts with ``title``."""
        for s in self.sections:
            if s.title.startswith(title):
                return s
        raise KeyError(f"no section {title!r}; sections: {[s.title for s in self.sections]}")

    def markdown(self) -> str:
        """All section texts as one markdown document (tables and figures left out)."""
        return "\n\n".join(f"### {s.title}\n\n{s.text}" for s in self.sections)



@dataclass(frozen=True)
class RooflineInputs:
    """What the roofline needs: a GPU of params/hardware.yaml, how many, and the model's weights."""

    gpu: str
    params_b: float
    bits_per_weight: float
    n_gpus: int = 1
    active_params_b: float | None = None
    kv_bytes_per_token: float = 0.0  # KV cache read per decoded token at the mean context (0: weights only)

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> RooflineInputs | None:
        """From the record's GPU (``host.gpu_key``, else the GPU names of ``host.gpus`` / the fingerprint matched
        to params/hardware.yaml) and ``model_info``; None if either is missing (`roofline_missing` says which)."""
        info = manifest.model_info
        gpu, n, _ = recorded_gpu(manifest)
        if not gpu or info is None or not info.params_b or not info.bits_per_weight:
            return None
        return cls(gpu=gpu, n_gpus=n or 1, params_b=info.params_b,
                   bits_per_weight=info.bits_per_weight, active_params_b=info.active_params_b)


def recorded_gpu(manifest: Manifest) -> tuple[str | None, int | None, str | None]:
    """(hardware key, GPU count, the name as recorded) of a record's GPUs: ``host.gpu_key``, else the name that
    ``host.gpus`` or the fingerprint recorded ("NVIDIA H200") matched to a params/hardware.yaml entry whose name
    starts with it ("NVIDIA H200 SXM"); the key is None when no entry matches (or no GPU is recorded)."""
    host = manifest.host
    if host.gpu_key:
        return host.gpu_key, host.gpu_count, host.gpu_key
    names = [g.name for g in host.gpus.gpus if g.name] if host.gpus is not None else []
    if not names and host.fingerprint is not None and host.fingerprint.gpus:
        names = [str(g.get("name")) for g in host.fingerprint.gpus if g.get("name")]
    if not names:
        return None, None, None
    name = names[0]
    try:
        table = analysis.load_hardware()
    except ConfigError:
        return None, len(names), name
    return analysis.match_gpu(name, table), len(names), name


def roofline_missing(manifest: Manifest | None) -> str:
    """Why a record has no roofline, precisely: what it records (its GPU) and what it lacks (the model's size),
    with the record fields to set."""
    if manifest is None:
        return ("Not computed: no run record (arms alone): pass `roofline=RooflineInputs(gpu=..., n_gpus=..., "
                "params_b=..., bits_per_weight=...)` to `explain`.")
    key, n, name = recorded_gpu(manifest)
    info = manifest.model_info
    size = info is not None and bool(info.params_b) and bool(info.bits_per_weight)
    if name is None:
        gpu = "names no GPU (host.gpus, the fingerprint and host.gpu_key are empty: a run without GPUs)"
    elif key is None:
        gpu = (f"names its GPU ({n or 1} x {name}), which params/hardware.yaml does not list: add it there (its "
               "memory bandwidth) or set the record's `host.gpu_key` to one of its keys")
    else:
        gpu = f"names its GPU ({n or 1} x {name} = `{key}` in params/hardware.yaml)"
    lacks = [] if size else [f for f, v in (("model_info.params_b", info and info.params_b),
                                            ("model_info.bits_per_weight", info and info.bits_per_weight)) if not v]
    text = f"Not computed: the record {gpu}"
    if lacks:
        text += (("; what is missing is the model's size: " if key else "; it also lacks the model's size: ")
                 + "set " + " and ".join(f"`{f}`" for f in lacks) + " in the run's manifest.json (billions of "
                 "parameters; bits per weight: 16 for bf16/fp16, 8 for fp8, about 4.5 for GGUF Q4_K_M), and "
                 "`model_info.active_params_b` for a mixture of experts, then re-run `spectrial report RUN_DIR`")
    return text + ". In Python: `explain(record, roofline=RooflineInputs(gpu=..., n_gpus=..., params_b=..., " \
        "bits_per_weight=...))`."


# ------------------------------------------------------------------ small helpers
_pos = positive
ENGINE_CLOCK = "engine_cycle_ms (cross-check)"  # the engine's own clock: a column beside the verdict's, never a verdict


def _cross_check(table: pd.DataFrame) -> pd.DataFrame:
    """A table without the engine's clock column where no arm recorded one (hand-made records)."""
    return table.drop(columns=[ENGINE_CLOCK]) if ENGINE_CLOCK in table and table[ENGINE_CLOCK].isna().all() else table


def rounded(x: float | None, nd: int = _ROUND) -> float | None:
    """Rounded for display (and + 0.0 so that a tiny negative residual never prints as -0.0)."""
    return None if x is None else round(float(x), nd) + 0.0


def _f(x: float | None, nd: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def _k(arm: ArmRecord) -> int | None:
    v = arm.steps
    if isinstance(v, bool) or v is None:
        return None
    try:
        k = int(v)
    except (TypeError, ValueError):
        return None
    return k if k >= 1 and k == float(v) else None


_is_base = is_baseline


@dataclass
class ArmView:
    """The figures of one arm that the analysis uses, validated (unrounded)."""

    name: str
    method: str
    ok: bool
    k: int | None
    tok_s: float | None
    ms_per_token: float | None
    engine_cycle_ms: float | None  # the engine's own clock (decode time / verify steps): a cross-check only
    accept_len: float | None
    alpha: float | None
    synthetic: bool
    draft_ms: float | None
    values: list[float]
    raw: ArmRecord

    @property
    def cycle_ms(self) -> float | None:
        """A cycle on the verdict's clock (`figures.verdict_cycle_ms`: break-even x the baseline's ms per token,
        = accept length / tok/s x 1000 but for a decide run's arm): the one cycle of every section."""
        return figures.verdict_cycle_ms(self.raw)

    @property
    def cycle_is_bound(self) -> bool:
        """The cycle time is only a lower bound (e.g. verify time alone): not used to fit the model."""
        return "lower bound" in str(self.raw.derived.get("cycle_ms", ""))

    @property
    def condition(self) -> str:
        """What must match for arms to share one cycle model: the method, whether its acceptance is synthetic
        (a real draft's cycle is not fitted with forced acceptance), and, where recorded, the NCCL state."""
        return self.method + (" synthetic" if self.synthetic else "") + \
            (f" ({self.raw.nccl_env})" if self.raw.nccl_env else "")


def _view(arm: ArmRecord, problems: list[str]) -> ArmView:
    name = arm.name or "?"
    ok = arm.status == "ok"
    k = _k(arm)
    al = arm.accept_len
    accept = None
    if al is not None and not _is_base(arm):
        try:
            accept = float(al)
        except (TypeError, ValueError):
            accept = None
        if accept is not None and not math.isfinite(accept):
            accept = None
        if accept is not None and accept < 1.0:
            problems.append(f"Arm **{name}** reports an accept length of {accept:.3g} < 1: impossible, since every "
                            "cycle commits at least the target's own token; its counters are inconsistent and it "
                            "is left out of the break-even and model sections.")
            accept = None
        elif accept is not None and k is not None and accept > k + 1 + 1e-9:
            problems.append(f"Arm **{name}** reports an accept length of {accept:.3g} with k={k} drafts: more than "
                            f"the k + 1 = {k + 1} a cycle can commit; left out of the model.")
    syn = arm.synthetic_accept
    alpha = figures.alpha_of(accept, k, syn)[0] if arm.alpha is None or accept is None else arm.alpha
    values = [float(v) for v in arm.tok_s_values if _pos(v)]
    return ArmView(name=name, method=arm.method or "none", ok=ok, k=k, tok_s=_pos(arm.tok_s),
                ms_per_token=_pos(arm.ms_per_token), engine_cycle_ms=_pos(arm.engine_cycle_ms),
                accept_len=accept, alpha=alpha,
                synthetic=bool(arm.synthetic) or syn is not None,
                draft_ms=_pos(arm.draft_ms_per_cycle), values=values, raw=arm)


# ------------------------------------------------------------------ the analysis
def explain(source: Manifest | Mapping[str, Any] | Sequence[ArmRecord | Mapping[str, Any]], *,
            target_tok_s: float | None = None, roofline: RooflineInputs | None = None,
            baseline: str | None = None) -> Explanation:
    """Analyse a run record's manifest (or its list of arms); see the module docstring for the sections.

    ``target_tok_s``: the throughput to reach (default 1.5x the baseline). ``roofline``: GPU and model
    figures (default: read from the manifest's ``host.gpu_key``, ``host.gpu_count`` and ``model_info``).
    ``baseline``: the name of the baseline arm (default: the first completed arm with method "none").
    """
    problems: list[str] = []
    manifest: Manifest | None = None
    if isinstance(source, Manifest | Mapping):
        if isinstance(source, Mapping) and not isinstance(source.get("arms"), list):
            problems.append("The record has no list of arms: nothing to analyse.")
            source = {**source, "arms": []}
        manifest = as_manifest(source)
        raw_arms = manifest.arms
    elif isinstance(source, Sequence) and not isinstance(source, str | bytes):
        raw_arms = as_arms(source)
    else:
        problems.append("The record has no list of arms: nothing to analyse.")
        raw_arms = []
    if manifest is not None and manifest.status == "failed":
        problems.append(f"The run **failed**: {manifest.reason or 'no reason recorded'}.")
    elif manifest is not None and manifest.status == "running":
        problems.append("The run is still marked **running** (interrupted?): its arms may be incomplete.")
    if not raw_arms:
        problems.append("No arm was recorded.")
    arms = [_view(a, problems) for a in raw_arms]
    sessions = list(dict.fromkeys(str(a.session) for a in raw_arms if a.session is not None))
    if len(sessions) > 1:
        problems.append(f"The arms come from {len(sessions)} sessions ({', '.join(sessions)}): judging them against "
                        "one baseline mixes server starts and system states; analyse each session on its own.")
    for a in arms:
        if not a.ok:
            problems.append(f"Arm **{a.name}** did not complete (status {a.raw.status!r}): "
                            f"{a.raw.reason or 'no reason recorded'}.")
        elif not _is_base(a.raw):
            steps = a.raw.verify_steps
            if steps is not None and _pos(steps) is None:
                problems.append(f"Arm **{a.name}** recorded {float(steps):g} verify steps: no speculative cycle was measured, "
                                "so its cycle time and accept length are undefined.")
            elif a.cycle_ms is None:
                problems.append(f"Arm **{a.name}** has no cycle time: break-even cannot be computed for it.")
            if a.tok_s is None:
                problems.append(f"Arm **{a.name}** has no throughput (tok/s).")
    recorded = manifest.bandwidth if roofline is None and manifest is not None and manifest.bandwidth is not None \
        and manifest.bandwidth.bound_tok_s else None  # the run's own bound: one figure, said once
    if roofline is None and manifest is not None:
        roofline = RooflineInputs.from_manifest(manifest)
    picked = figures.pick_baseline([a.raw for a in arms], baseline, problems)
    if picked is not None and any(a.ok and (a.raw.baseline_arm is None and a.raw.verdict is None
                                            or baseline is not None and a.raw.baseline_arm != picked.name)
                                  for a in arms):
        judged = [a.raw for a in arms]  # never compared (or against another baseline than the one asked for)
        picked = figures.add_comparisons(judged, None, base=picked)
        for a, j in zip(arms, judged, strict=True):
            a.raw = j
    base = next((a for a in arms if picked is not None and a.raw.name == picked.name and a.raw.status == "ok"
                 and figures.is_baseline(a.raw)), None)
    base_ms = figures.base_ms_per_token(base.raw) if base is not None else None
    spec = [a for a in arms if a.ok and not _is_base(a.raw)]
    numbers = ExplainNumbers(baseline_tok_s=base.tok_s if base else None, baseline_ms_per_token=base_ms)
    target = _pos(target_tok_s)
    if target_tok_s is not None and target is None:
        problems.append(f"target_tok_s={target_tok_s!r} is not a positive number: the default target is used.")
    if target is None and base is not None:
        target = round(DEFAULT_TARGET_FACTOR * base.tok_s, 1)  # type: ignore[operator]
    numbers.target_tok_s = target
    models = _fit_models(spec, problems)
    sections = [_break_even_section(base, base_ms, spec, target, numbers),
                *_workload_sections(base, spec, manifest, numbers),
                _model_section(models, spec, base, numbers),
                _needed_section(models, spec, base, target, numbers),
                _recorded_bound_section(recorded, base, numbers) if recorded is not None else
                _roofline_section(roofline, base, numbers, manifest)]
    sections.insert(0, _input_section(arms, problems, base))  # after the others: their problems included
    return Explanation(sections=sections, problems=problems, numbers=numbers, spec=spec, base=base, fits=models,
                       targets=_targets(base, target))


def _input_section(arms: list[ArmView], problems: list[str], base: ArmView | None) -> Section:
    n_ok = sum(a.ok for a in arms)
    head = f"{len(arms)} arm(s) recorded, {n_ok} completed"
    head += f"; baseline: **{base.name}** at {_f(base.tok_s, 1)} tok/s." if base else "; no usable baseline."
    if not problems:
        return Section("Input check", head + " No problem found in the record.")
    return Section("Input check", head + "\n\n" + "\n".join(f"- {p}" for p in dict.fromkeys(problems)))


PAYS_WORDS = {"yes": "pays", "no": "does not pay", "undecided": "may or may not pay (not distinguishable at this "
                                                                  "noise)"}


def _break_even_section(base: ArmView | None, base_ms: float | None, spec: list[ArmView], target: float | None,
                        numbers: ExplainNumbers) -> Section:
    title = "Break-even"
    if not spec:
        return Section(title, "No speculative arm completed: there is nothing to weigh against the baseline.")
    if base is None or base_ms is None:
        return Section(title, "Without a baseline the cost of a cycle cannot be expressed in baseline tokens.")
    rows, lines = [], []
    for a in spec:
        r = a.raw
        be, sp = r.break_even_accept_len, r.speedup
        ci = f" [{r.speedup_ci_low:.2f}, {r.speedup_ci_high:.2f}]" if r.speedup_ci_low and r.speedup_ci_high else ""
        be_ci = f" [{r.break_even_ci_low:.2f}, {r.break_even_ci_high:.2f}]" \
            if r.break_even_ci_low and r.break_even_ci_high else ""
        rows.append({"arm": a.name, "method": a.method, "k": a.k, "tok_s": rounded(a.tok_s, 2), "speedup": rounded(sp, 3),
                     "speedup_ci_low": rounded(r.speedup_ci_low, 3), "speedup_ci_high": rounded(r.speedup_ci_high, 3),
                     "cycle_ms": rounded(a.cycle_ms, 3), "accept_len": rounded(a.accept_len, 3),
                     "break_even_accept_len": rounded(be, 3),
                     ENGINE_CLOCK: rounded(a.engine_cycle_ms, 3),
                     "margin": rounded(a.accept_len - be, 3) if be is not None and a.accept_len is not None else None,
                     "break_even_ci_low": rounded(r.break_even_ci_low, 3),
                     "break_even_ci_high": rounded(r.break_even_ci_high, 3), "pays": r.pays or "not judged",
                     "verdict": r.verdict or "n/a"})
        if be is None:
            lines.append(f"- **{a.name}**: no accept length or no speed-up, so its break-even is unknown"
                         + (f" ({_f(sp)}x{ci} the baseline, {r.verdict})" if sp is not None else "") + ".")
            continue
        costs = "costs at least" if a.cycle_is_bound else "costs"
        txt = (f"- **{a.name}** ({a.method}, k={a.k}): a cycle {costs} {_f(a.cycle_ms)} ms, the time of "
               f"**{_f(be)}**{be_ci} baseline tokens; it commits {_f(a.accept_len)} tokens per cycle")
        if r.pays is not None:
            txt += f", so speculation **{PAYS_WORDS[r.pays]}**"
        txt += f" ({_f(a.tok_s, 1)} tok/s, {_f(sp)}x{ci} the baseline: {r.verdict or 'not judged'})"
        lines.append(txt + ".")
    numbers.break_even = {r["arm"]: r["break_even_accept_len"] for r in rows}
    text = (f"The baseline takes {_f(base_ms, 3)} ms per token ({_f(base.tok_s, 1)} tok/s, its decode rate per "
            "request). A speculative cycle pays only when it commits more tokens than the baseline decodes in the "
            "same time: break-even accept length = cycle time / baseline time per token = accept length / speed-up "
            "(both times on the decode rate's clock), its interval from the speed-up's.")
    if any(figures.paired_rounds(a.raw.ci_basis) for a in spec):
        text += (" In this decide run the speed-up is the geometric mean of the paired per-round ratios (its "
                 "confidence sequence's estimate, the same pair as its interval), and a cycle is the time that "
                 "speed-up implies: break-even x the baseline's time per token.")
    if any(a.engine_cycle_ms for a in spec):
        text += (" The engine's own clock (decode time / verify steps) is in the `engine_cycle_ms (cross-check)` "
                 "column: a check of the clock, never a second break-even.")
    text += "\n\n" + "\n".join(lines)
    return Section(title, text, _cross_check(pd.DataFrame(rows)), "break_even")


def _workload_sections(base: ArmView | None, spec: list[ArmView], manifest: Manifest | None,
                       numbers: ExplainNumbers) -> list[Section]:
    """The per-workload break-even (none unless a speculative arm has two categories or more)."""
    arms = [a for a in spec if a.raw.categories]
    if not arms:
        return []
    title = "Per workload: which categories cross the break-even line"
    wl = manifest.workload if manifest is not None else None
    head = ("What a speculative cycle costs hardly depends on what is asked, only on how long the context is; what "
            "the prompt changes is how many tokens a cycle commits. Each category's accept length against its own "
            "break-even line: its accept length / its speed-up over the baseline's requests of the same category "
            "(longer prompts slow both)")
    if wl is not None:
        srcs = ", ".join(str(x.source) for x in wl.sources)
        samp = wl.sampling
        head += (f" ({wl.request_format or 'completion'} requests to {wl.endpoint or '?'}; sources: "
                 f"{srcs}; {'greedy' if samp.get('greedy', True) else 'temperature ' + str(samp.get('temperature'))})")
    lines, rows, split = [], [], []
    for a in arms:
        be = a.raw.break_even_accept_len
        parts = []
        per: dict[str, CategoryNumbers] = {}
        for c in a.raw.categories:
            line = c.break_even_accept_len
            rows.append({"arm": a.name, "category": c.category, "requests": c.requests_ok,
                         "accept_len": rounded(c.accept_len, 3), "break_even": rounded(line, 3),
                         "break_even_ci_low": rounded(c.break_even_ci_low, 3),
                         "break_even_ci_high": rounded(c.break_even_ci_high, 3), "arm_break_even": rounded(be, 3),
                         "cycle_ms": rounded(c.cycle_ms, 3), "pays": c.pays or "not judged", "tok_s": rounded(c.tok_s, 2),
                         "speedup": rounded(c.speedup, 3), "verdict": c.verdict or "n/a"})
            per[c.category] = CategoryNumbers(accept_len=c.accept_len, break_even=line, pays=c.pays,
                                              speedup=c.speedup, verdict=c.verdict)
            side = {"yes": "above: pays", "no": "below: does not pay", "undecided": "within its interval: undecided",
                    None: "not judged"}[c.pays]
            txt = f"**{c.category}** commits {_f(c.accept_len)} per cycle, its line {_f(line)} ({side}"
            if c.speedup is not None:
                txt += f"; {_f(c.speedup)}x the baseline on {c.category}, {c.verdict or 'no verdict'}"
            parts.append(txt + ")")
        numbers.categories[a.name] = per
        be_txt = f"the arm's break-even {_f(be)} tokens per cycle" if be is not None else "break-even unknown"
        lines.append(f"- **{a.name}** ({be_txt}): " + "; ".join(parts) + ".")
        wins = [c.category for c in a.raw.categories if c.verdict == "faster"]
        loses = [c.category for c in a.raw.categories if c.verdict == "slower"]
        if wins and loses:
            split.append(f"**The verdict depends on the workload**: {a.name} is faster on {', '.join(wins)} and "
                         f"slower on {', '.join(loses)}; judge it on traffic like yours, not on one number.")
    text = head + ":\n\n" + "\n".join(lines)
    if split:
        text += "\n\n" + "\n\n".join(split)
    return [Section(title, text, pd.DataFrame(rows), "workload")]


@dataclass
class CycleFit:
    """A cycle-cost model fitted on the arms of one condition (``ArmView.condition``)."""

    method: str
    model: analysis.CycleModel
    arms: list[ArmView]


def _fit_models(spec: list[ArmView], problems: list[str]) -> list[CycleFit]:
    fits: list[CycleFit] = []
    for method in dict.fromkeys(a.condition for a in spec):
        pts = [a for a in spec if a.condition == method and a.k is not None and a.cycle_ms and not a.cycle_is_bound]
        if len({a.k for a in pts}) < 2:
            continue
        split = all(a.draft_ms is not None and a.draft_ms <= a.cycle_ms for a in pts)  # type: ignore[operator]
        data = [(a.k, a.cycle_ms, a.draft_ms) if split else (a.k, a.cycle_ms) for a in pts]
        try:
            fits.append(CycleFit(method, analysis.fit_cycle_model(data), pts))  # type: ignore[arg-type]
        except ConfigError as exc:
            problems.append(f"The cycle model of method {method} could not be fitted: {exc}")
    return fits


def _model_section(fits: list[CycleFit], spec: list[ArmView], base: ArmView | None, numbers: ExplainNumbers) -> Section:
    title = "Cycle-cost model"
    if not fits:
        ks = sorted({a.k for a in spec if a.k is not None and a.cycle_ms})
        why = (f"only depth k={ks[0]} was measured" if len(ks) == 1 else
               "no method was measured at two depths under the same conditions" if ks else
               "no arm has a cycle time and a depth")
        return Section(title, f"Not fitted: {why}. The model cycle_ms = fixed + per_draft x k needs one method "
                              "measured at two or more depths (e.g. steps 1, 2, 4) under the same conditions (and cycle "
                              "times that are not just lower bounds); the next section therefore uses "
                              "each arm's measured cycle (the one its break-even is).")
    rows, lines = [], []
    for f in fits:
        m = f.model
        exact = len(f.arms) == 2
        lines.append(f"- **{f.method}**: cycle = {m.fixed_ms:.2f} ms + {m.per_draft_ms:.3f} ms x k (fitted on "
                     f"k = {', '.join(str(k) for k in sorted({a.k for a in f.arms}))}"  # type: ignore[type-var]
                     + (f", {len(f.arms)} arms" if len(f.arms) > len({a.k for a in f.arms}) else "")
                     + ("; two points: the line passes through both, so they cannot test it" if exact else
                        f"; R^2 {m.r2:.3f}" if not math.isnan(m.r2) else "") + ")")
        if m.fixed_ms <= 0 or m.per_draft_ms < 0:
            lines.append(f"  - **implausible fit** (a {'negative fixed cost' if m.fixed_ms <= 0 else 'cycle that shrinks with k'}"
                         "): the arms are too noisy or were measured under different conditions; repeat them "
                         "(more requests, several starts) before trusting its predictions")
        if m.has_split:
            lines.append(f"  - drafting: {m.draft_fixed_ms:.2f} + {m.draft_per_token_ms:.3f} x k ms; verify and "
                         f"overhead: {m.verify_fixed_ms:.2f} + {m.verify_per_token_ms:.3f} x k ms")
        if base is not None:
            base_ms = base.ms_per_token or 1000.0 / base.tok_s  # type: ignore[operator]
            lines.append(f"  - the fixed part alone is {m.fixed_ms / base_ms:.2f} baseline tokens: the cost of "
                         "verifying before anything is drafted")
        have = [a for a in f.arms if a.alpha is not None and a.tok_s is not None]
        pred = analysis.prediction_errors(m, pd.DataFrame({"k": [a.k for a in have], "alpha": [a.alpha for a in have],
                                                           "tok_s": [a.tok_s for a in have]})) if have else None
        for i, a in enumerate(f.arms):
            j = have.index(a) if a in have else None
            rows.append({"method": f.method, "arm": a.name, "k": a.k, "cycle_ms": rounded(a.cycle_ms, 3),
                         "fitted_cycle_ms": rounded(m.cycle_ms(a.k), 3), "residual_ms": rounded(m.residuals_ms[i], 3),
                         ENGINE_CLOCK: rounded(a.engine_cycle_ms, 3),
                         "alpha": rounded(a.alpha, 3), "tok_s": rounded(a.tok_s, 2),
                         "predicted_tok_s": rounded(pred["predicted_tok_s"].iloc[j], 2) if j is not None else None,
                         "rel_error": rounded(pred["rel_error"].iloc[j], 4) if j is not None else None})
        mine = [r["rel_error"] for r in rows if r["method"] == f.method and r["rel_error"] is not None]
        errs_m = [abs(e) for e in mine]
        numbers.models[f.method] = FitNumbers(
            fixed_ms=m.fixed_ms, per_draft_ms=m.per_draft_ms, r2=m.r2, draft_fixed_ms=m.draft_fixed_ms,
            draft_per_token_ms=m.draft_per_token_ms, verify_fixed_ms=m.verify_fixed_ms,
            verify_per_token_ms=m.verify_per_token_ms, fitted_on=[a.name for a in f.arms],
            error=FitError(median=float(pd.Series(errs_m).median()) if errs_m else None,
                           max=max(errs_m) if errs_m else None, n=len(errs_m)))
    table = _cross_check(pd.DataFrame(rows))
    errs = [(name, fit.error) for name, fit in numbers.models.items() if fit.error.n]
    if errs:
        lines.append("\nOn the arms it was fitted on, the model's throughput (tau(alpha, k) / cycle) is off by "
                     + "; ".join(f"{e.median * 100:.1f} % (median), {e.max * 100:.1f} % at worst for **{name}** "
                                 f"({e.n} arms)" for name, e in errs) + ".")
    return Section(title, "\n".join(lines), table, "model")


def _constant_model(cycle_ms: float, k: int) -> analysis.CycleModel:
    """A cycle model that only knows one measured arm: the same cycle at every k (used at that k only)."""
    return analysis.CycleModel(fixed_ms=cycle_ms, per_draft_ms=0.0, ks=(float(k),), cycle_ms_measured=(cycle_ms,),
                               residuals_ms=(0.0,), r2=math.nan)


TableRow = dict[str, str | float | None]


def _needed_rows(fits: list[CycleFit], spec: list[ArmView], targets: list[tuple[str, float]]) -> list[TableRow]:
    rows: list[TableRow] = []
    plan: list[tuple[str, str, int, analysis.CycleModel]] = []
    for f in fits:
        kmax = max(MAX_MODEL_K, max(a.k for a in f.arms))  # type: ignore[type-var]
        plan += [(f.method, "fitted model", k, f.model) for k in range(1, kmax + 1)
                 if f.model.fixed_ms + f.model.per_draft_ms * k > 0]
    fitted = {f.method for f in fits}
    plan += [(a.name, "cycle lower bound" if a.cycle_is_bound else "measured cycle", a.k,
              _constant_model(a.cycle_ms, a.k)) for a in spec  # type: ignore[arg-type]
             if a.condition not in fitted and a.k is not None and a.cycle_ms]
    for who, basis, k, model in plan:
        cyc = model.cycle_ms(k)
        row: TableRow = {"source": who, "basis": basis, "k": k, "cycle_ms": rounded(cyc, 3),
                               "max_tok_s": rounded((k + 1) / cyc * 1000, 1)}
        for label, tok_s in targets:
            row[f"accept_len_{label}"] = rounded(tok_s * cyc / 1000, 3)
            row[f"alpha_{label}"] = rounded(model.alpha_for(tok_s, k), 4)
        rows.append(row)
    return rows


def _targets(base: ArmView | None, target: float | None) -> list[tuple[str, float]]:
    """The throughputs aimed at, labelled: the baseline's (break-even), then the target where it differs."""
    targets: list[tuple[str, float]] = []
    base_ms = figures.base_ms_per_token(base.raw) if base is not None else None
    if base_ms is not None:
        targets.append(("break_even", 1000.0 / base_ms))
    if target is not None and (base_ms is None or abs(target - 1000.0 / base_ms) > 1e-9):
        targets.append((f"{target:g}_tok_s", target))
    return targets


def _needed_section(fits: list[CycleFit], spec: list[ArmView], base: ArmView | None, target: float | None,
                    numbers: ExplainNumbers) -> Section:
    title = "Acceptance needed"
    targets = _targets(base, target)
    if not targets:
        return Section(title, "No baseline and no target throughput: nothing to aim at.")
    rows = _needed_rows(fits, spec, targets)
    if not rows:
        return Section(title, "No speculative arm has a cycle time and a depth: the acceptance needed is unknown.")
    table = pd.DataFrame(rows)
    names = " and ".join(f"{t:g} tok/s ({'the baseline' if lbl == 'break_even' else 'target'})" for lbl, t in targets)
    lines = [f"Per-token acceptance alpha needed to reach {names} at each depth k, from tau = (1 - alpha^(k+1)) / "
             "(1 - alpha) = target x cycle time (empty: unreachable even at alpha = 1; max_tok_s is the ceiling "
             "at alpha = 1)."]
    lbl, tok_s = targets[-1]
    col = f"alpha_{lbl}"
    reach = table.dropna(subset=[col])
    if len(reach):
        best = reach.loc[reach[col].idxmin()]
        lines.append(f"\nThe least acceptance reaching **{tok_s:g} tok/s** among the depths considered "
                     f"(fitted models: k = 1 to {MAX_MODEL_K}) is alpha = **{best[col]:.3f}** at k={best['k']} "
                     f"({best['source']}, {best['basis']}, cycle {best['cycle_ms']:.3f} ms).")
        numbers.min_alpha_for_target = float(best[col])
    else:
        lines.append(f"\n**{tok_s:g} tok/s is out of reach at every depth considered**: even a draft that is always "
                     "accepted cannot commit enough tokens per cycle at these cycle costs.")
        numbers.min_alpha_for_target = None
    measured = [a for a in spec if a.alpha is not None and a.k is not None]
    if measured:
        lines.append("Measured: " + "; ".join(f"{a.name} alpha = {a.alpha:.3f}"
                                              + (" (synthetic)" if a.synthetic else " (from its accept length)")
                                              for a in measured) + ".")
    return Section(title, "\n".join(lines), table, "needed")


def _recorded_bound_section(bb: BandwidthBound, base: ArmView | None, numbers: ExplainNumbers) -> Section:
    """The run's own memory-bandwidth bound (the record's `bandwidth`, spectrial.analysis.roofline.bandwidth_bound)
    and the baseline's share of it, the figure its `bandwidth_bound` check judged."""
    roof = bb.bound_tok_s
    assert roof is not None and bb.bandwidth_gb_s is not None and bb.bytes_per_step is not None
    numbers.roofline_tok_s, numbers.weight_bytes_per_token, numbers.bandwidth_gb_s = roof, bb.weights_bytes, \
        bb.bandwidth_gb_s
    numbers.kv_bytes_per_token = (bb.kv_bytes_per_token or 0.0) * (bb.context_tokens or 0.0)
    text = (f"{bb.bandwidth_gb_s:,.1f} GB/s ({bb.bandwidth_source}); {bb.weights_bytes / 1e6:,.1f} MB of weights "
            f"({bb.weights_source}) and {bb.concurrency} request(s)' KV cache at a mean context of "
            f"{bb.context_tokens or 0:.0f} tokens = {bb.bytes_per_step / 1e6:,.1f} MB read per decode step. Decode "
            f"cannot beat {roof:,.1f} tok/s per request ({1000 / roof:.2f} ms per token).")
    rows = [{"quantity": "bound tok/s per request", "value": rounded(roof, 1)},
            {"quantity": "bound ms/token", "value": rounded(1000 / roof, 3)}]
    if base is not None and base.tok_s and bb.baseline_share is not None:
        numbers.baseline_roofline_fraction = util = bb.baseline_share
        text += (f" The baseline's {base.tok_s:.1f} tok/s is **{util * 100:.1f} %** of that"
                 + (": above the bound, an impossible figure (its bandwidth_bound check says invalid)." if util > 1
                    else f": each decode step takes {1 / util:.1f}x its memory-traffic floor."))
        rows.append({"quantity": "baseline fraction of the bound", "value": rounded(util, 4)})
    return Section("Roofline", text, pd.DataFrame(rows))


def _roofline_section(inp: RooflineInputs | None, base: ArmView | None, numbers: ExplainNumbers,
                      manifest: Manifest | None = None) -> Section:
    title = "Roofline"
    if inp is None:
        return Section(title, roofline_missing(manifest))
    try:
        spec = analysis.load_hardware()[inp.gpu]
    except KeyError:
        return Section(title, f"Not computed: GPU {inp.gpu!r} is not in params/hardware.yaml "
                              f"(known: {', '.join(sorted(analysis.load_hardware()))}).")
    except ConfigError as exc:
        return Section(title, f"Not computed: {exc}")
    try:
        wb = analysis.weight_bytes(inp.params_b, inp.bits_per_weight, inp.active_params_b)
        bw = spec.bandwidth_gb_s * inp.n_gpus
        kv = inp.kv_bytes_per_token
        roof = analysis.decode_roofline_tok_s(wb, bw, kv)
    except ConfigError as exc:
        return Section(title, f"Not computed: {exc}")
    numbers.roofline_tok_s, numbers.weight_bytes_per_token = roof, wb
    numbers.kv_bytes_per_token, numbers.bandwidth_gb_s = kv, bw
    active = f"{inp.active_params_b:g}B active of {inp.params_b:g}B" if inp.active_params_b else f"{inp.params_b:g}B"
    text = (f"{inp.n_gpus} x {spec.name} ({spec.bandwidth_gb_s:g} GB/s each, {bw:g} GB/s together); {active} "
            f"parameters at {inp.bits_per_weight:g} bits = {wb / 1e9:.1f} GB read per token"
            + (f" (plus {kv / 1e9:.3f} GB of KV cache)" if kv else "") + ". Batch-1 decode "
            f"cannot beat {roof:.0f} tok/s ({1000 / roof:.2f} ms per token).")
    rows = [{"quantity": "roofline tok/s", "value": rounded(roof, 1)},
            {"quantity": "roofline ms/token", "value": rounded(1000 / roof, 3)}]
    if base is not None:
        util = analysis.bandwidth_utilisation(base.tok_s, wb, bw, kv)  # type: ignore[arg-type]
        numbers.baseline_roofline_fraction = util
        text += (f" The baseline's {base.tok_s:.1f} tok/s is **{util * 100:.1f} %** of that: each decode step "
                 f"takes {1 / util:.1f}x its memory-traffic floor")
        text += (", so something other than weight reads (communication, launch latency) sets its pace, and a "
                 "verify pass pays the same fixed costs again." if util < 0.5 else ".")
        rows.append({"quantity": "baseline fraction of roofline", "value": rounded(util, 4)})
    return Section(title, text, pd.DataFrame(rows))
