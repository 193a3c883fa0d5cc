"""Detectors about the conditions of a measurement: the environment that reached (or did not reach) the
server's processes, profiling or debug switches left on, and GPU clocks held back."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from typing import Any

from spectrial.readers.diagnose.common import log, names, one, rec, truthy
from spectrial.readers.diagnose.context import Context, number
from spectrial.readers.diagnose.model import Evidence, Finding
from spectrial.readers.diagnose.registry import detector

NCCL_DEBUG_VARS = frozenset({"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"})
ALGO_VARS = frozenset({"NCCL_ALGO", "NCCL_PROTO"})  # read only when a communicator of >= 2 ranks picks an algorithm


# ------------------------------------------------------------------ the requested environment
def _nccl(env: Mapping[str, Any] | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (env or {}).items() if str(k).startswith("NCCL_") and k not in NCCL_DEBUG_VARS}


@detector("env_not_in_effect", 5, "engines-nccl", "rtx6kpro-startup", "seed-case")
def env_not_in_effect(ctx: Context) -> Iterator[Finding]:
    """Requested environment not in effect (or never verified) in some server process or NCCL rank."""
    m = ctx.manifest
    if m is None:
        return
    if m.kind == "nccl_check":
        yield from _nccl_check(ctx)
        return
    yield from _env_checks(ctx)
    yield from _nccl_evidence(ctx)
    yield from _hand_recorded(ctx)


def _env_checks(ctx: Context) -> Iterator[Finding]:
    """spectrial's own check: per start, variables missing or different (failed), or unverified."""
    m = ctx.manifest
    assert m is not None
    failed: dict[str, list[Evidence]] = {}
    unverified: dict[str, list[Evidence]] = {}
    for i, s in enumerate(m.starts):
        chk = s.env_check
        if chk is None or s.superseded:
            continue
        for j, p in enumerate(chk.problems):
            if "not readable" not in p:
                failed.setdefault(s.arm, []).append(rec(f"starts[{i}].env_check.problems[{j}]", p))
        for j, u in enumerate(chk.unverified):
            unverified.setdefault(s.arm, []).append(rec(f"starts[{i}].env_check.unverified[{j}]", u))
    if failed:
        arms = list(failed)
        yield Finding(kind="env_not_in_effect", severity="critical", arm=one(arms),
                      title=f"{names(arms)}: requested variables missing or different in server processes",
                      detail="The environment each arm was meant to run with did not reach every process (seen in "
                             "the process's own environment): the arm measured another configuration.",
                      evidence=[e for a in arms for e in failed[a][:2]],
                      fix="Put the variables on the launch command itself (workers inherit them at spawn); do not "
                          "set them inside running workers; re-run and check the record's env_check.")
    if unverified:
        arms = list(unverified)
        yield Finding(kind="env_not_in_effect", severity="warning", arm=one(arms),
                      title=f"{names(arms)}: requested variables unverified in some server processes",
                      detail="Those processes renamed themselves (setproctitle blanks /proc/<pid>/environ) and left "
                             "no probe record, so nothing shows what they held.",
                      evidence=[e for a in arms for e in unverified[a][:2]],
                      fix="Keep spectrial's environment probe on PYTHONPATH (Python servers), and for NCCL_* read "
                          "NCCL's own 'set by environment' lines (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV).")


def _nccl_evidence(ctx: Context) -> Iterator[Finding]:
    """NCCL's own lines, per start: requested NCCL_* variables NCCL did not report on some rank."""
    m = ctx.manifest
    assert m is not None
    for i, s in enumerate(m.starts):
        ev_rec = s.nccl_evidence or {}
        procs = ev_rec.get("processes") or []
        for var, e in (ev_rec.get("variables") or {}).items():
            missing, different = e.get("missing") or [], e.get("different") or {}
            if not (missing or different):
                continue
            single = all((p.get("nranks") or [0]) == [1] for p in procs)
            quiet = var in ALGO_VARS and single
            yield Finding(
                kind="env_not_in_effect", severity="info" if quiet else "critical", arm=s.arm,
                title=f"{s.arm}: NCCL did not use {var}={e.get('requested')} on {len(missing) + len(different)} of "
                      f"{len(procs)} rank(s)",
                detail=("A single-rank communicator never chooses an algorithm, so NCCL never reads it: nothing to "
                        "confirm." if quiet else
                        "NCCL reads NCCL_* when a communicator is created and reports each one it used as 'NCCL_X "
                        "set by environment to V'; a rank without that line ran with NCCL's default."),
                evidence=[rec(f"starts[{i}].nccl_evidence.variables.{var}", e)],
                fix="Set the variable on the launch command so that every rank inherits it before its first "
                    "communicator; confirm in the log ('set by environment' on every rank).")
        if not procs and _nccl(ctx.launch(next((a for _, a in ctx.arms if a.name == s.arm), None)).env) \
                and ev_rec.get("problems"):
            yield Finding(kind="env_not_in_effect", severity="warning", arm=s.arm,
                          title=f"{s.arm}: NCCL_* requested but NCCL printed nothing to confirm them",
                          detail="Without NCCL's INFO lines nothing shows which values NCCL used.",
                          evidence=[rec(f"starts[{i}].nccl_evidence.problems[0]", ev_rec.get("problems")[0])],
                          fix="Add NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV to the launch of one run.")


def _hand_recorded(ctx: Context) -> Iterator[Finding]:
    """Hand-made records (the seed case): NCCL variables set but never verified, or the launch never recorded."""
    unverified, unrecorded = [], []
    for path, a in ctx.arms:
        state = a.nccl_env
        if state == "set, unverified":
            unverified.append((path, a))
        elif state == "unrecorded":
            unrecorded.append((path, a))
    if not (unverified or unrecorded):
        return
    env = _nccl(ctx.params.env)
    ev: list[Evidence] = []
    if env:
        ev.append(rec("params.env", " ".join(f"{k}={v}" for k, v in env.items())))
    for path, a in unverified + unrecorded:
        chk = a.env_check
        if chk is not None and chk.summary and chk.summary != "not checked":
            ev.append(rec(f"{path}.env_check.summary", chk.summary))
    ev += [rec(f"{p}.nccl_env", a.nccl_env) for p, a in unrecorded]
    ev += [rec(f"{p}.nccl_env", a.nccl_env) for p, a in unverified[:2]]
    arms = [a.name for _, a in unverified + unrecorded]
    title = (f"NCCL environment never verified in the server processes: {len(unverified)} arm(s) set it unverified"
             + (f", {len(unrecorded)} launched with an environment nobody recorded ({names([a.name for _, a in unrecorded])})"
                if unrecorded else ""))
    yield Finding(
        kind="env_not_in_effect", severity="warning", arm=one(arms), title=title,
        detail="Nothing shows which NCCL settings each measurement ran with. /proc/<pid>/environ of SGLang's and "
               "vLLM's workers comes back blank after setproctitle even when the variables were inherited, and "
               "os.environ set inside a running worker never shows there yet still reaches NCCL if set before the "
               "communicator is created (measured on 2 H200s): the only proof is NCCL's own 'NCCL_X set by "
               "environment to V' lines, which nobody captured.",
        evidence=ev[:6],
        fix="Launch with the variables on the command line, add NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV, and check "
            "'set by environment' on every rank (spectrial records it per start as nccl_evidence, and probes every "
            "Python worker's environment).")


def _nccl_check(ctx: Context) -> Iterator[Finding]:
    """An NCCL check record: per set, variables that never reached a worker or that NCCL did not report."""
    m = ctx.manifest
    assert m is not None
    world = number(m.get("world_size")) or number(ctx.params.world_size)
    quiet_sets: list[str] = []
    quiet_vars: set[str] = set()
    quiet_ev: list[Evidence] = []
    for i, s in enumerate(m.get("sets") or []):
        name, how, env = s.get("name"), s.get("how"), _nccl(s.get("env"))
        for j, w in enumerate(s.get("workers") or []):
            if w.get("missing"):
                yield Finding(kind="env_not_in_effect", severity="critical", arm=name,
                              title=f"NCCL check set {name}: {', '.join(w['missing'])} missing from worker rank "
                                    f"{w.get('rank')}",
                              detail="The worker's own os.environ lacked the requested variables.",
                              evidence=[rec(f"sets[{i}].workers[{j}].missing", w["missing"])],
                              fix="Set them on the launch command (inherited at spawn).")
        for j, n in enumerate(s.get("nccl") or []):
            reported = n.get("set_by_environment") or {}
            absent = [v for v in env if v not in reported]
            if not env or not absent:
                continue
            quiet = [v for v in absent if v in ALGO_VARS and world == 1]
            loud = [v for v in absent if v not in quiet]
            if quiet:
                quiet_sets.append(str(name))
                quiet_vars.update(quiet)
                quiet_ev.append(rec(f"sets[{i}].nccl[{j}].set_by_environment", reported))
            if how == "after_init" and loud:
                yield Finding(kind="env_not_in_effect", severity="info", arm=name,
                              title=f"NCCL check set {name}: variables set after the first communicator were not "
                                    f"used by it ({', '.join(loud)})",
                              detail="As measured: NCCL reads NCCL_* when a communicator is created; a value set "
                                     "later reaches only communicators created after it.",
                              evidence=[rec(f"sets[{i}].nccl[{j}].set_by_environment", reported)],
                              fix="Set NCCL variables before the first communicator (on the launch command).")
            elif loud:
                yield Finding(kind="env_not_in_effect", severity="warning", arm=name,
                              title=f"NCCL check set {name}: NCCL did not report {', '.join(loud)}",
                              detail="NCCL reports every variable it reads as 'set by environment'.",
                              evidence=[rec(f"sets[{i}].nccl[{j}].set_by_environment", reported)],
                              fix="Check where the variable is set (launch vs inside the worker).")
    if quiet_sets:
        yield Finding(kind="env_not_in_effect", severity="info", arm=one(quiet_sets),
                      title=f"NCCL check sets {names(quiet_sets)}: {', '.join(sorted(quiet_vars))} not confirmable "
                            "on a single rank",
                      detail="NCCL reported them 'set by environment' on every rank of a 2-rank check (ENGINES.md) "
                             "but not here, with 1 rank: a one-rank communicator selects no algorithm or protocol, "
                             "so the check cannot say whether they would take effect.",
                      evidence=[rec("world_size", world), *quiet_ev[:3]],
                      fix="Run the check with world_size >= 2 (and NCCL_DEBUG_SUBSYS=TUNING to see the chosen "
                          "algorithm and protocol).")


# ------------------------------------------------------------------ profiling and debug switches
_PROFILE_VAR = re.compile(r"(?:^|_)PROFIL(?:E|ER|ING)(?:_|$)", re.IGNORECASE)
_PROFILE_LINE = re.compile(r"PROFILER STARTING|Profiling done|Start profiling|Stop profiling|"
                           r"Traces (?:will be|are) saved to|torch\.profiler", re.IGNORECASE)
_DEBUG_FLAGS = ("--profile-by-stage", "--enable-profile-cuda-graph", "--enable-nan-detection")


def _switches(env: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(variable, value, why) of every profiling/debug switch in an environment."""
    out = []
    for k, v in env.items():
        if _PROFILE_VAR.search(k) and (truthy(v) or k.endswith("_DIR")):
            out.append((k, v, "a profiler or profiling patch is on"))
        elif k == "CUDA_LAUNCH_BLOCKING" and truthy(v):
            out.append((k, v, "every kernel launch waits for the GPU"))
        elif k == "NCCL_DEBUG" and v.upper() == "TRACE":
            out.append((k, v, "NCCL traces every call"))
        elif k == "NCCL_DEBUG" and v.upper() == "INFO" and re.search(r"\b(COLL|ALL)\b",
                                                                    env.get("NCCL_DEBUG_SUBSYS", ""), re.I):
            out.append((k, f"{v} with NCCL_DEBUG_SUBSYS={env['NCCL_DEBUG_SUBSYS']}",
                        "NCCL logs every collective call"))
        elif k == "PYTORCH_NO_CUDA_MEMORY_CACHING" and truthy(v):
            out.append((k, v, "every tensor allocation goes to cudaMalloc"))
    return out


@detector("debug_switches", 6, "sglang#34942", "sglang#11110", "seed-case")
def debug_switches(ctx: Context) -> Iterator[Finding]:
    """Profiling or debug switches on during timing (profile env vars, profiler runs, NCCL per-call logging)."""
    seen: dict[tuple[str, str], tuple[list[str], list[Evidence], str]] = {}
    launches = [(a.name, ctx.launch(a, p)) for p, a in ctx.arms] or [(None, ctx.launch())]
    for name, la in launches:
        if la.env_path.startswith("params") or la.argv_path.startswith("params"):
            name = None  # the run's one recorded launch, not this arm's own
        for k, v, why in _switches(la.env):
            arms, ev, _ = seen.setdefault((k, v), ([], [], why))
            if name:
                arms.append(name)
            ev.append(rec(f"{la.env_path}.{k}" if la.env_path.endswith("env") else la.env_path, f"{k}={v}"))
        for flag in _DEBUG_FLAGS:
            if la.option(flag) is not None:
                arms, ev, _ = seen.setdefault((flag, ""), ([], [], "the engine profiles or checks while serving"))
                if name:
                    arms.append(name)
                ev.append(rec(la.where(flag), "set"))
    for (k, v), (arms, ev, why) in seen.items():
        yield Finding(
            kind="debug_switches", severity="warning", arm=one(arms),
            title=f"{k}{'=' + v if v else ''} on during timed runs" + (f" ({names(arms)})" if arms else "")
                  + f": {why}",
            detail="A profiled or debugged cycle is not the production cycle: per-phase timing needs CUDA events or "
                   "synchronisations between phases, and trace export stalls the server (SGLang #34942: a profiled "
                   "run froze the server ~25 s and inflated the next clean run's TTFT by 65 %). In the original "
                   "case the per-cycle 'Target verify: X ms/cyc' lines came from a worker patched to profile "
                   "(EAGLE3_PROFILE=1), on in every timed launch.",
            evidence=list(dict.fromkeys(ev))[:4],
            fix=f"Time with {k} off; profile in a separate run and keep its numbers apart.")
    for lf in ctx.logs:
        hits = [log(lf, n) for n, _ in lf.grep(_PROFILE_LINE)]
        prof = lf.rows("verify", "profile")
        hits += [log(lf, int(n)) for n in (prof["line"].head(2) if not prof.empty else [])]
        calls = lf.rows("tuning", "nccl")
        per_call = calls[calls["bytes"].notna()] if not calls.empty and "bytes" in calls else calls.iloc[0:0]
        if len(per_call) >= 3:
            hits += [log(lf, int(n)) for n in per_call["line"].head(2)]
        if hits:
            yield Finding(kind="debug_switches", severity="warning", arm=lf.arm,
                          title=f"{lf.label}: profiling or per-call tracing was active during the run",
                          detail="Profiler start/stop and trace export, per-cycle profile prints or NCCL per-call "
                                 "lines each cost time inside the measured window (SGLang #34942).",
                          evidence=hits[:4],
                          fix="Separate profiled runs from timed runs.")


# ------------------------------------------------------------------ clocks held back
_CLOCK_CHECK = re.compile(r"clocks?\D*?(\d{3,5})\s*(?:MHz)?\s*of\s*(\d{3,5})\s*MHz", re.IGNORECASE)


def _reasons(cell: Any) -> list[str]:
    if isinstance(cell, list):
        return [str(x) for x in cell]
    s = str(cell or "").strip()
    if not s or s in ("[]", "nan"):
        return []
    try:
        v = ast.literal_eval(s)
        return [str(x) for x in v] if isinstance(v, list | tuple) else [str(v)]
    except (ValueError, SyntaxError):
        return [x.strip(" '\"") for x in s.strip("[]").split(",") if x.strip(" '\"")]


@detector("throttling", 7, "ninfer#72", "club3090#585")
def throttling(ctx: Context) -> Iterator[Finding]:
    """Clock throttling, power capping or thermal limits during a measurement window."""
    m = ctx.manifest
    for i, s in enumerate(m.starts if m is not None else []):
        changes = [c for c in s.fingerprint_changes if "throttl" in c]
        if s.throttled_samples or changes:
            yield Finding(kind="throttling", severity="warning", arm=s.arm,
                          title=f"{s.arm}: GPU throttled during start {s.restart}"
                                + (f" ({s.throttled_samples} throttled samples)" if s.throttled_samples else ""),
                          detail="A throttled GPU runs below its clocks: the arm's time includes the slowdown and is "
                                 "not comparable with unthrottled arms.",
                          evidence=[*([rec(f"starts[{i}].throttled_samples", s.throttled_samples)]
                                      if s.throttled_samples else []),
                                    *[rec(f"starts[{i}].fingerprint_changes", c) for c in changes[:2]]],
                          fix="Cool down between arms, check power limits (nvidia-smi -q -d PERFORMANCE), and "
                              "re-run the throttled arm.")
    for g in ctx.gpu:
        if "throttle" not in g.frame:
            continue
        reasons = [_reasons(x) for x in g.frame["throttle"]]
        bad = [i for i, r in enumerate(reasons) if r]
        if not bad:
            continue
        kinds = sorted({x for i in bad for x in reasons[i]})
        share = len(bad) / len(reasons)
        row = g.frame.iloc[bad[0]]
        clock = next((row[c] for c in ("clocks.sm", "clocks.current.sm [MHz]") if c in g.frame), None)
        yield Finding(kind="throttling", severity="warning", arm=g.arm,
                      title=f"{g.label}: {', '.join(kinds)} in {len(bad)} of {len(reasons)} GPU samples "
                            f"({share:.0%})",
                      detail="The GPU ran held back by its power or thermal limit during the window (ninfer-3090 "
                             "PR #72: sw_power_cap in every busy sample, SM clock 11 % below boost; club-3090 #585: "
                             "a 250 W cap made every decode figure 0.90x).",
                      evidence=[Evidence(where=f"{g.label}:{bad[0] + 2}", kind="file",
                                         text=f"throttle={reasons[bad[0]]}" + (f", clocks.sm={clock}" if clock is not
                                                                               None else ""))],
                      fix="Restore the power limit (nvidia-smi -pl), improve cooling, or lock clocks for benchmarking; "
                          "re-run the affected arms.")
    for j, c in enumerate(m.host.checks if m is not None else []):
        mm = _CLOCK_CHECK.search(str(c))
        if mm and int(mm.group(1)) < 0.9 * int(mm.group(2)):
            yield Finding(kind="throttling", severity="warning",
                          title=f"GPU clocks {mm.group(1)} of {mm.group(2)} MHz: "
                                f"{1 - int(mm.group(1)) / int(mm.group(2)):.0%} below their maximum",
                          detail="Clocks this far below maximum under load point to a power or thermal limit.",
                          evidence=[rec(f"host.checks[{j}]", c)],
                          fix="Check clocks_event_reasons (nvidia-smi -q -d PERFORMANCE) during the run.")
