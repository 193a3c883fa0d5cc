"""The plan before the purchase, and dry runs: what a run will cost (server starts, time, on what basis) and the
exact command and environment each arm would launch, touching nothing.

`make_plan(params)` (a trial, a decide run, a cluster run) and `sweep_plan(sweep)` state the price: the server
starts (fixed: exact; decide: to the first possible decision, expected for stated speed-ups by simulating the design
the run will use, and the most the budget allows), the estimated wall time and its basis (start and request times
measured by earlier runs of the same host, engine, model and workload under output_dir, spectrial.protocol.earlier; else a
stated estimate from the model's size), and a cluster run's units with their sbatch scripts. A decide budget that
cannot reach a decision is refused (ConfigError naming the budget and the smallest that can decide). The dry run
(`spectrial trial --dry-run`) prints the plan and each launch, the environment spectrial adds included.

The command is meant to be pasted: spectrial's own names are shown as the paths a real run uses. A `tiny:` model
becomes the file (llama.cpp) or folder (vLLM, SGLang) of spectrial's model cache that a run writes it to, and
`engine_bin: auto` the cached build; on an SSH host both are uploaded into the host's cache (`ssh.cache_dir`),
and the plan shows that path, with a note saying where each came from.
"""

from __future__ import annotations

import math
import re
import shlex
import warnings
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from spectrial.engines import Engine, get_engine
from spectrial.engines.base import engine_class
from spectrial.errors import ConfigError
from spectrial.hosts.local import LocalHost
from spectrial.ownership import OWNER_VAR
from spectrial.params import Arm, TrialParams
from spectrial.schema import ExpectedStarts, PlanRecord
from spectrial.secrets import mask_launch
from spectrial.servers.envcheck import PROBE_DIR_VAR, PROBE_NAMES_VAR
from spectrial.servers.lifecycle import TAG_VAR


class PlannedLaunch(BaseModel):
    """What one arm would launch (secrets masked), and the same as a shell snippet to read (`display`)."""

    arm: str
    host: str
    env: dict[str, str]
    argv: list[str]
    notes: list[str]  # the engine's notes on this launch
    resolved: dict[str, str] = {}  # spectrial's names in the params (tiny:target, engine_bin auto) -> path used
    where: list[str] = []  # where each resolved name comes from (written here, built here, uploaded there)
    added_env: dict[str, str] = {}  # what spectrial puts on the command besides `env` (tag, owner, env probe)
    display: str


def _remote_path(local: Path, params: TrialParams) -> str:
    """`local` (a file of this machine's cache) as the host's cache holds it after the upload."""
    from spectrial.cache import cache_root

    try:
        rel = local.relative_to(cache_root())
    except ValueError:
        return str(local)
    return f"{params.ssh.cache_dir.rstrip('/')}/{rel.as_posix()}"


def resolved_names(params: TrialParams, engine: Engine, arm: Arm) -> tuple[dict[str, str], list[str]]:
    """{name as the params give it: path the launch uses} for the arm's `tiny:` models and an `auto` engine
    binary, and a note for each (written here / built here / uploaded to the host)."""
    remote = params.host != "local"
    refs = [params.model, params.arm_draft(arm) or ""] if arm.speculative else [params.model]
    names: dict[str, str] = {}
    notes: list[str] = []
    for ref in dict.fromkeys(r for r in refs if r.startswith("tiny:")):
        if remote and not engine.tiny_remote:  # as the real run says
            raise ConfigError(f"{ref!r} (spectrial's tiny HF models) is written on the local host only; give a "
                              f"model path on {params.host}", parameter="model")
        local = engine.tiny_model_path(ref)
        names[ref] = _remote_path(local, params) if remote else str(local)
        notes.append(f"{ref} is spectrial's tiny model, written by a real run to {local} (seconds)"
                     + (f" and uploaded to {names[ref]} on {params.host}" if remote else ""))
    unresolved = [r for r in refs if r and not r.startswith("tiny:")]
    if unresolved:
        notes.append("model paths are read on the host that runs the server"
                     + (f" ({params.host}); nothing is uploaded for them" if remote else ""))
    if params.engine_bin == "auto" and engine.auto_binary and remote:
        binary = str(getattr(engine, "binary", "") or "")
        if binary:
            names[binary] = _remote_path(Path(binary), params)
            notes.append(f"engine_bin: auto is {engine.auto_binary} ({binary}), built here if missing and "
                         f"uploaded to {names[binary]} on {params.host}")
    return names, notes


def dry_run(params: TrialParams) -> list[PlannedLaunch]:
    """Per arm, the launch it would make; no host is contacted, nothing is built or written. What the engine
    would warn about becomes a note of the launch (never a Python warning)."""
    engine = get_engine(params.engine, params, LocalHost())
    with warnings.catch_warnings(record=True) as resolving:
        warnings.simplefilter("always")
        engine.resolve_dry()
    out = []
    for arm in params.arms:
        names, resolved_notes = resolved_names(params, engine, arm)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            spec = engine.launch_spec(arm)
        spec_notes = list(dict.fromkeys([*spec.notes, *(str(w.message) for w in [*resolving, *caught])]))
        argv = [_swap(a, names) for a in spec.argv]
        shown = mask_launch(argv, spec.env)
        notes = "".join(f"# note: {n}\n" for n in [*resolved_notes, *spec_notes])
        added = added_env(params, spec.env, bool(spec.python))
        display = (f"# arm {arm.name} on {params.host} ({arm.method})\n{notes}"
                   f"{_home_unquoted(shown.command)}\n# spectrial adds to the environment: "
                   + " ".join(f"{k}={v}" for k, v in added.items()) + "\n")
        out.append(PlannedLaunch(arm=arm.name, host=params.host, env=shown.env, argv=shown.argv,
                                 notes=spec_notes, resolved=names, where=resolved_notes, added_env=added,
                                 display=display))
    return out


def added_env(params: TrialParams, env: dict[str, str], python: bool) -> dict[str, str]:
    """What spectrial puts on the launch besides the params' `env` (spectrial.servers.lifecycle.Server.launch_env): the tag
    and controller it finds its processes by, and for a Python server with requested variables the environment
    probe (a sitecustomize.py in the start's work folder, first on PYTHONPATH)."""
    out = {TAG_VAR: "<run-id>:<arm>", OWNER_VAR: "<controller host:pid:start>"}
    if python and env:
        probe = f"{params.work_dir.rstrip('/')}/<run-id>/<server>.envprobe"
        out.update({PROBE_DIR_VAR: probe, PROBE_NAMES_VAR: ",".join(env),
                    "PYTHONPATH": ":".join(x for x in (probe, env.get("PYTHONPATH") or "${PYTHONPATH}") if x)})
    return out


# --- the price -------------------------------------------------------------------------------------------------
ASSUMED_SPREAD = 0.05  # start-to-start SD of a start's log rate without history (benchmarks/bench_noise.py: 2-8 %)
DISK_BYTES_PER_S = 1.0e9  # a cold model read (NVMe, network storage slower)
ASSUMED_TOK_S = 50.0  # decode rate per request without history (a 70B-class model on one GPU)
ASSUMED_TINY_TOK_S = 300.0  # spectrial's tiny models on 2 CPU cores (measured 250-470 tok/s)
ASSUMED_PREFILL_FACTOR = 3.0  # prompt tokens per second over decode tokens per second (the tiny pair on 2 cores: ~3x)
PLAN_EFFECTS = (0.74, 0.90, 1.10, 0.95, 1.05)  # the original case, 10 %, 5 %
PLAN_PATHS = 1000


class StartTime(BaseModel):
    """What one server start and one request cost, and how that is known."""

    load_s: float  # launch to ready, plus stopping
    request_s: float
    basis: str

    def start_s(self, requests: int) -> float:
        return self.load_s + requests * self.request_s


class Plan(BaseModel):
    """What a run will do and cost (`make_plan`), and its launches."""

    record: PlanRecord
    launches: list[PlannedLaunch] = Field(default_factory=list)
    scripts: dict[str, str] = Field(default_factory=dict, description="A Slurm run: each unit's sbatch script")

    def lines(self) -> list[str]:
        """The plan in a few lines (what a run prints first)."""
        r = self.record
        out = []
        if r.design.startswith("sweep"):
            out.append(f"plan: {r.design}: at most {r.max_starts} server start(s), about "
                       f"{_dur(r.wall_s[-1] if r.wall_s else None)} ({_start_words(r)})")
        elif r.design == "fixed":
            out.append(f"plan: {r.starts} server start(s), about {_dur(r.wall_s[1] if len(r.wall_s) > 1 else None)}"
                       f" ({_start_words(r)})")
        else:
            exp = "; ".join(f"{e.effect:.2f}x ~{e.median:.0f} (p90 {e.p90:.0f}"
                            + (f", decided in {e.decided:.0%} within the budget" if e.decided < 0.9 else "") + ")"
                            for e in r.expected[:3])
            out.append(f"plan: decide, {r.starts_per_round} starts a round; first possible decision at round "
                       f"{r.first_decision_round} ({r.first_decision_starts} starts); at most {r.max_starts} starts "
                       f"({r.max_rounds} rounds) within the budget, about {_dur(r.wall_s[-1] if r.wall_s else None)}")
            if exp:
                out.append(f"plan: expected starts to a decision for a true speed-up of {exp} "
                           f"(start-to-start spread {r.spread:.1%}: {r.spread_basis})")
            out.append(f"plan: {_start_words(r)}; at least {_dur(r.wall_s[0] if r.wall_s else None)}, expected "
                       f"{_dur(r.wall_s[1] if len(r.wall_s) > 1 else None)}")
        if r.units:
            out.append(f"plan: {len(r.units)} unit(s): {'; '.join(r.units)}")
        out += [f"plan: {n}" for n in r.notes]
        return out

    def text(self) -> str:
        body = "\n".join(self.lines())
        for name, script in self.scripts.items():
            body += f"\n# sbatch script of unit {name}\n{script.rstrip()}\n"
        return body + "\n\n" + "\n".join(a.display for a in self.launches)


def _dur(secs: float | None) -> str:
    if secs is None or not math.isfinite(secs):
        return "an unknown time"
    return f"{secs:.0f} s" if secs < 120 else f"{secs / 60:.0f} min" if secs < 7200 else f"{secs / 3600:.1f} h"


def _start_words(r: PlanRecord) -> str:
    return f"a start ~{_dur(r.start_s)}: {r.start_basis}"


def start_time(params: TrialParams, earlier: Any | None = None) -> StartTime:
    """A start's load time and a request's time: `expected_start_s` where given; else measured by earlier runs
    (spectrial.protocol.earlier); else a stated estimate from the model's size on this machine and the engine."""
    req_from = None
    if earlier is not None and earlier.request_s:
        req_from = (earlier.request_s, f"a request {earlier.request_s:.2f} s measured by {len(earlier.runs)} "
                                       "earlier run(s)")
    rate = ASSUMED_TINY_TOK_S if params.model.startswith("tiny:") else ASSUMED_TOK_S
    req, req_basis = req_from or (params.max_tokens / rate, f"a request ~{params.max_tokens / rate:.1f} s assumed "
                                                           f"({params.max_tokens} tokens at {rate:.0f} tok/s)")
    buckets = [t for t, _ in params.context_buckets()]
    if buckets and req_from is None:  # long prompts: their prefill, at an assumed multiple of the decode rate
        prompt = sum(buckets) / len(buckets)
        req += prompt / (ASSUMED_PREFILL_FACTOR * rate)
        req_basis = (f"a request ~{req:.1f} s assumed ({params.max_tokens} tokens at {rate:.0f} tok/s after a prompt "
                     f"of {prompt:.0f} tokens on average, prefilled at {ASSUMED_PREFILL_FACTOR:.0f}x that rate)")
    if params.expected_start_s is not None:
        return StartTime(load_s=params.expected_start_s, request_s=req,
                         basis=f"load {params.expected_start_s:.0f} s as given (expected_start_s); {req_basis}")
    if earlier is not None and earlier.overhead_s:
        return StartTime(load_s=earlier.overhead_s, request_s=req,
                         basis=f"load {_dur(earlier.overhead_s)} measured by {len(earlier.runs)} earlier run(s) of "
                               f"this host ({earlier.starts} starts); {req_basis}")
    size, where = model_bytes(params)
    fixed = engine_class(params.engine).start_s  # process, CUDA context, graphs, warm-up
    load = fixed + (size or 0) / DISK_BYTES_PER_S
    if size:
        amount = f"{size / 1e9:.1f} GB" if size >= 1e8 else f"{size / 1e6:.0f} MB"
        how = (f"load ~{_dur(load)} estimated: {fixed:.0f} s for {params.engine} to start plus {amount} of model "
               f"at {DISK_BYTES_PER_S / 1e9:.0f} GB/s")
    else:
        how = (f"load ~{_dur(load)} estimated: {fixed:.0f} s for {params.engine} to start; the model's size is unknown "
               f"here ({where}): give expected_start_s")
    return StartTime(load_s=load, request_s=req, basis=f"{how}; {req_basis}")


def model_bytes(params: TrialParams) -> tuple[int | None, str]:
    """The target (and default draft) model's bytes where this machine can see them, and why not otherwise."""
    if params.host != "local":
        return None, f"the model is on {params.host}"
    total, missing = 0, []
    for ref in dict.fromkeys(x for x in (params.model, params.draft) if x):
        if ref.startswith("tiny:"):
            total += 5_000_000
            continue
        p = Path(ref).expanduser()
        if p.is_file():
            total += p.stat().st_size
        elif p.is_dir():
            total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        else:
            missing.append(ref)
    if missing:
        return None, f"{', '.join(missing)} not found on this machine"
    return total, "local files"


def make_plan(params: TrialParams, launches: bool = True) -> Plan:
    """The plan of a trial (fixed or decide, on one host or as cluster units); raises ConfigError for a decide
    budget that cannot reach a decision."""
    from spectrial.protocol.earlier import earlier as find_earlier

    found = find_earlier(params.output_dir, params.model_dump(mode="json"))
    st = start_time(params, found)
    spec = [a for a in params.arms if a.speculative]
    rec = PlanRecord(design="decide" if params.decide is not None else "fixed", history=found.describe())
    units = _units(params)
    if units:
        rec.units = [f"u{i}: baseline + {', '.join(u)}" for i, u in enumerate(units)]
    per_unit = [1 + len(u) for u in units] if units else [len(params.arms)]
    parallel = min(params.cluster.max_parallel, len(units)) if params.cluster is not None and units else 1
    if params.decide is None:
        starts = sum(per_unit) * params.restarts
        one = st.start_s(params.warmup + params.repeats * max(1, len(params.context_buckets())))
        rec.starts, rec.start_s, rec.start_basis = starts, one, st.basis
        wall = one * starts / parallel
        rec.wall_s = [wall, wall, wall]
        if spec and params.restarts == 1:
            rec.notes.append("one start per arm: the verdict cannot see start-to-start spread; `decide: true` samples "
                             "until decided")
    else:
        _decide_plan(params, rec, st, found, max(per_unit), parallel)
    rec.notes += _planned_findings(params)
    out = Plan(record=rec, launches=dry_run(params) if launches else [])
    if params.cluster is not None and params.cluster.executor == "slurm" and units:
        out.scripts = _sbatch_scripts(params, units)
    return out


def sweep_plan(sweep: Any, launches: bool = True, taken_over: int = 0, resumed_from: str | None = None) -> Plan:
    """The plan of a sweep (`spectrial.sweep.params.SweepParams`): the grid's starts (the baseline and every
    setting, `restarts` each; one start serves every concurrency level), what a guided search may stop at, the
    budget's limit, and the time each costs. `taken_over`: starts a resumed record (`resumed_from`) measured, which
    are not started again: the estimate counts only the rest, as the sweep's budget does."""
    from spectrial.protocol.earlier import earlier as find_earlier

    t = sweep.trial_params()
    found = find_earlier(t.output_dir, t.model_dump(mode="json"))
    st = start_time(t, found)
    from spectrial.protocol.session import level_windows

    levels = sweep.concurrency_levels()
    rates = sweep.rate_levels()
    settings = sweep.settings()
    policies = getattr(sweep, "policies", [])
    grid = (1 + len(settings) + len(policies)) * t.restarts
    taken_over = max(0, min(taken_over, grid))
    live = grid - taken_over
    windows = level_windows(t, sweep.loads())
    # an open loop's window lasts at least its arrivals' span (mean (n - 1) / rate): added to the start's estimate
    arrivals_s = sum((w.requests - 1) / w.rate for w in windows if w.rate)
    one = st.start_s(t.warmup + sum(w.requests for w in windows)) + arrivals_s
    most = live
    if sweep.budget_restarts:
        most = min(most, sweep.budget_restarts)
    if sweep.budget_s:
        most = min(most, max(1, int(sweep.budget_s // one) + 1))
    rec = PlanRecord(design=f"sweep ({sweep.strategy})" + (f", resuming {resumed_from}" if resumed_from else ""),
                     starts=live if sweep.strategy == "grid" else None,
                     max_starts=most, start_s=one, start_basis=st.basis, history=found.describe(),
                     wall_s=[min(3, most) * one, most * one, most * one])
    rec.notes.append(f"{len(settings)} setting(s)" + (f" and {len(policies)} engine policies" if policies else "")
                     + f" x {len(levels)} concurrency level(s) ({', '.join(map(str, levels))})"
                     + (f" and {len(rates)} request rate(s) ({', '.join(f'{r:g}' for r in rates)} req/s, at most "
                        f"{sweep.inflight_cap()} in flight; their arrivals take ~{arrivals_s:.0f} s of each start)"
                        if rates else "") + "; "
                     f"the grid is {grid} start(s)"
                     + (f", {taken_over} of them taken over from {resumed_from or 'the resumed record'} (not "
                        f"started again): {live} to start" if taken_over else "")
                     + (f"; the budget allows {most}" if most < live else "")
                     + ("; a guided search measures the baseline and a few settings, then only what could beat the "
                        "best, so it usually stops sooner" if sweep.strategy == "guided" else ""))
    return Plan(record=rec, launches=dry_run(t) if launches else [])


def _planned_findings(params: TrialParams) -> list[str]:
    """The validity checks every start of this plan would fail, known before anything runs (the run's own rules:
    `session.planned_checks`), each said once with its fix."""
    from spectrial.protocol.session import WindowPlan, planned_checks

    d = params.decide
    requests = d.repeats if d is not None and isinstance(d.repeats, int) else params.repeats
    return [f"every start will fail the {c.name} check: {c.summary}" + (f"; {c.fix}" if c.fix else "")
            for c in planned_checks(params, [WindowPlan(params.concurrency, requests, params.seed)])]


def _decide_plan(params: TrialParams, rec: PlanRecord, st: StartTime, found: Any, per_round: int,
                 parallel: int) -> None:
    from spectrial.analysis.sequential import (
        NO_HISTORY_FIRST_LOOK,
        first_finite_round,
        forecast,
    )

    d = params.decide
    assert d is not None
    prior = found.prior if d.history == "auto" else None
    if d.method == "confidence-sequence":
        first = max(d.min_rounds, first_finite_round(params.confidence))
    else:
        first = max(d.min_rounds, 2 if prior is not None else NO_HISTORY_FIRST_LOOK)
    requests = params.repeats if not isinstance(d.repeats, int) else d.repeats
    one = st.start_s(params.warmup + requests)
    round_s = one * per_round / parallel
    by_time = int(d.max_minutes * 60 // round_s) if d.max_minutes else d.max_rounds
    rounds = min(d.max_rounds, by_time)
    rec.starts_per_round, rec.first_decision_round = per_round, first
    rec.first_decision_starts, rec.max_rounds, rec.max_starts = first * per_round, rounds, rounds * per_round
    rec.start_s, rec.start_basis = one, st.basis
    if d.max_rounds < first:
        raise ConfigError(f"decide.max_rounds: {d.max_rounds} round(s), but the first decision is possible at "
                          f"round {first} ({_why_first(d, prior)}); give -p decide.max_rounds={first} or more",
                          parameter="decide.max_rounds")
    if rounds < first:
        need = math.ceil(first * round_s / 60)
        raise ConfigError(f"decide.max_minutes: {d.max_minutes:g} min allow {rounds} round(s) of {per_round} starts at "
                          f"~{_dur(one)} a start ({st.basis}), but the first decision is possible at round {first} "
                          f"({_why_first(d, prior)}); give -p decide.max_minutes={need} or more (or "
                          "-p expected_start_s=SECONDS if a start is faster than estimated)",
                          parameter="decide.max_minutes")
    if prior is not None:
        spread, rec.spread_basis = prior.sd_log / math.sqrt(2.0), f"this host's history ({prior.source})"
    else:
        spread, rec.spread_basis = ASSUMED_SPREAD, (f"assumed {ASSUMED_SPREAD:.0%}: no earlier run with several starts "
                                                    "per arm here")
    rec.spread = spread
    for eff in PLAN_EFFECTS:
        f = forecast(eff, spread * math.sqrt(2.0), level=params.confidence, max_rounds=max(rounds, 2),
                     min_rounds=d.min_rounds, margin=d.margin, prior_sd=prior.sd_log if prior else None,
                     prior_df=prior.df if prior else 0, paths=PLAN_PATHS, seed=params.seed)
        rec.expected.append(ExpectedStarts(effect=eff, median=f.median_rounds * per_round,
                                           p90=f.p90_rounds * per_round, decided=f.decided))
    rec.wall_s = [first * round_s, rec.expected[0].median / per_round * round_s, rounds * round_s]
    if d.margin is None:
        rec.notes.append("no decide.margin: an arm as fast as the baseline never settles and runs to the budget")


def _why_first(d: Any, prior: Any) -> str:
    if d.method == "confidence-sequence":
        return "savvi's confidence sequence is unbounded before"
    return "with this host's history" if prior is not None else "without a history of this host's spread"


def _units(params: TrialParams) -> list[list[str]]:
    if params.cluster is None:
        return []
    from spectrial.params.cluster import blocks

    return blocks([a.name for a in params.arms if a.speculative], params.cluster.n_units())


def _sbatch_scripts(params: TrialParams, units: list[list[str]]) -> dict[str, str]:
    """Each unit's sbatch script as the run would write it (paths with <run-id>), without writing it."""
    from spectrial.cluster.executor import UnitJob
    from spectrial.cluster.slurm import SlurmExecutor

    assert params.cluster is not None
    ex = SlurmExecutor(params.cluster)
    out = {}
    folder = Path(params.output_dir) / "<run-id>" / "units"
    for i, arms in enumerate(units):
        run_id = f"<run-id>-u{i}"
        job = UnitJob(name=f"u{i}", run_id=run_id, kind="trial", params_path=folder / f"{run_id}.yaml",
                      output_dir=folder, log_path=folder / f"{run_id}.log", arms=arms,
                      env={"SPECTRIAL_UNIT": f"u{i}"})
        out[f"u{i}"] = "sbatch " + " ".join(shlex.quote(x) for x in ex.sbatch_options()) + "\n" + ex.script_text(job)
    return out


def _swap(item: str, names: dict[str, str]) -> str:
    """An argv item with a spectrial name replaced by its path (`tiny:target`, `--model=tiny:target`, a JSON
    argument naming it)."""
    for ref, path in names.items():
        if ref in item:
            item = item.replace(ref, path)
    return item


def _home_unquoted(line: str) -> str:
    """A shell line whose quoted `'~/...'` words keep the `~` outside the quotes, so the remote shell expands it
    when the line is pasted there."""
    return re.sub(r"'~/([^']*)'", lambda m: "~/" + shlex.quote(m[1]), line)
