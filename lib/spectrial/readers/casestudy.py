"""The original case (Kimi-K2.5 + EAGLE-3 on 8 PCIe GPUs) as data, and the analysis notebook 90 shows.

The data is the run record ``outputs/examples/case-kimi-k25-pcie/manifest.json`` (``kind: "case"``; its
README says where each figure comes from). Everything here reads it through the same code that reads a
trial's record (``spectrial.readers.history``, ``spectrial.readers.explain``, ``spectrial.analysis``):

- ``key_numbers()``: the arithmetic that settled the case, at the seed's round figures (82 tok/s baseline,
  30 ms cycle, accept length 2.1, target 150 tok/s): break-even accept length, the throughput 2.1 gives,
  the per-token acceptance 2.1 implies, the acceptance 150 tok/s needs at each depth.
- ``needed_table()``: the acceptance 150 tok/s needs at each measured configuration's own cycle.
- ``pair()`` / ``baseline_drift()``: why 94 and 60 tok/s cannot be compared, from what the record holds.
- ``coverage()``: which of the fields a spectrial trial records each measurement has.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from spectrial import analysis
from spectrial.errors import ConfigError
from spectrial.params import repo_root
from spectrial.readers.history import HistoryRow, incomparability, record_rows, rows_frame, with_derived
from spectrial.record.store import as_manifest, read_json_file
from spectrial.schema import ArmRecord, Manifest

__all__ = ["CASE_NAME", "TRIAL_FIELDS", "KeyNumbers", "baseline_drift", "case_arms", "case_dir", "case_table",
           "coverage", "key_numbers", "load_case", "needed_table", "pair"]

CASE_NAME = "case-kimi-k25-pcie"
DEPTHS = (2, 3, 4, 5, 6, 8)
TRIAL_FIELDS: dict[str, str] = {
    "tok_s_values": "every measured request's rate (repeats, spread, a bootstrap verdict)",
    "accepted": "accepted draft tokens (server counters, scoped to the measured window)",
    "drafted": "drafted tokens",
    "verify_steps": "verify cycles (so accept length = 1 + accepted / cycles)",
    "cycle_ms": "decode time / verify cycles, measured",
    "draft_ms_per_cycle": "drafting time per cycle (where the engine logs it)",
    "argv": "the exact command of the arm",
    "env": "the environment requested for the arm",
    "env_check": "the variables checked in /proc/<pid>/environ of every server process",
    "ready_s": "time from launch to ready",
    "baseline_same_session": "a baseline measured in the same session, beside the arm",
    "engine_version": "the engine's version",
    "started_at": "when it ran",
}
CASE_COLUMNS = ["order", "session", "arm", "config", "launch", "nccl_env", "tok_s", "verify_ms", "verify_share",
                "cycle_ms", "accept_len", "break_even_accept_len", "speedup", "baseline_arm", "derived"]


def case_dir() -> Path:
    """The committed record of the case: ``outputs/examples/case-kimi-k25-pcie`` in the checkout."""
    return repo_root() / "outputs" / "examples" / CASE_NAME


def load_case(path: str | Path | None = None) -> Manifest:
    """The case's manifest (a folder holding manifest.json, or the file); raises ConfigError if it is not a case."""
    p = Path(path) if path is not None else case_dir()
    if p.is_dir():
        p = p / "manifest.json"
    if not p.is_file():
        raise ConfigError(f"case record {p} not found: pass path= the folder outputs/examples/{CASE_NAME}")
    data = read_json_file(p)  # truncated, binary, over the cap: RecordDamaged (the file and what is wrong)
    if not isinstance(data, dict) or data.get("kind") != "case" or not data.get("arms"):
        raise ConfigError(f"{p} is not a case record (kind 'case' with arms)")
    return as_manifest(data, p)


def case_arms(manifest: Manifest, session: str | None = None) -> list[ArmRecord]:
    """The arms (of one ``session`` if given) with cycle time and accept length derived where implied
    (``history.with_derived``; each derived field is named in the arm's ``derived``)."""
    arms = [with_derived(a) for a in manifest.arms if session is None or a.session == session]
    if not arms:
        raise ConfigError(f"session={session!r}: no arm of the case has it; sessions: "
                          f"{sorted({str(a.session) for a in manifest.arms})}")
    return arms


def case_table(manifest: Manifest) -> pd.DataFrame:
    """Every configuration, measured and derived figures side by side (columns CASE_COLUMNS); break-even and
    speed-up are against the baseline of the same session and NCCL state, when there is one."""
    rows, _ = record_rows(manifest, CASE_NAME)
    return rows_frame(rows)[CASE_COLUMNS]


@dataclass(frozen=True)
class KeyNumbers:
    """The case's arithmetic at round figures (see :func:`key_numbers`)."""

    base_tok_s: float
    cycle_ms: float
    accept_len: float
    k: int
    target_tok_s: float
    base_ms_per_token: float
    break_even_accept_len: float
    tok_s_at_accept_len: float
    speedup_at_accept_len: float
    alpha_of_accept_len: float
    accept_len_for_target: float
    alpha_for_target: dict[int, float | None]


def _alpha_or_none(accept_len: float, k: int) -> float | None:
    """Per-token acceptance giving ``accept_len`` with k drafts; None when more than k + 1 is needed."""
    if accept_len > k + 1:
        return None
    return 0.0 if accept_len <= 1 else analysis.required_alpha(accept_len, k)


def key_numbers(base_tok_s: float = 82.0, cycle_ms: float = 30.0, accept_len: float = 2.1, k: int = 2,
                target_tok_s: float = 150.0, depths: Iterable[int] = DEPTHS) -> KeyNumbers:
    """Break-even accept length = cycle / (1000 / base tok/s); throughput at ``accept_len`` = tau / cycle;
    the per-token alpha that ``accept_len`` implies at depth ``k``; and the accept length and alpha that
    ``target_tok_s`` needs (tau = target x cycle) at each depth, None where even alpha = 1 falls short."""
    base_ms = analysis.ms_per_token(base_tok_s)
    tau_target = analysis.break_even_accept_len(cycle_ms, analysis.ms_per_token(target_tok_s))
    return KeyNumbers(
        base_tok_s=base_tok_s, cycle_ms=cycle_ms, accept_len=accept_len, k=k, target_tok_s=target_tok_s,
        base_ms_per_token=base_ms, break_even_accept_len=analysis.break_even_accept_len(cycle_ms, base_ms),
        tok_s_at_accept_len=analysis.spec_throughput(accept_len, cycle_ms),
        speedup_at_accept_len=analysis.speedup(accept_len, cycle_ms, base_ms),
        alpha_of_accept_len=analysis.required_alpha(accept_len, k), accept_len_for_target=tau_target,
        alpha_for_target={d: _alpha_or_none(tau_target, d) for d in depths})


def needed_table(manifest: Manifest, target_tok_s: float = 150.0) -> pd.DataFrame:
    """Per speculative configuration with a cycle time: the accept length and per-token acceptance that
    ``target_tok_s`` needs at its own depth and cycle (alpha None: unreachable even at alpha = 1), next to
    the acceptance its measured accept length implies."""
    target_ms = analysis.ms_per_token(target_tok_s)
    rows = []
    for a in case_arms(manifest):
        if a.method == "none" or not a.cycle_ms or not a.steps:
            continue
        k, cyc = int(a.steps), float(a.cycle_ms)
        tau = analysis.break_even_accept_len(cyc, target_ms)
        al = a.accept_len
        rows.append({"arm": a.name, "session": a.session, "k": k, "cycle_ms": round(cyc, 3),
                     "cycle_basis": a.derived.get("cycle_ms", "recorded"),
                     "max_tok_s": round(analysis.spec_throughput(k + 1, cyc), 1),
                     "accept_len_needed": round(tau, 3),
                     "alpha_needed": None if (x := _alpha_or_none(tau, k)) is None else round(x, 4),
                     "accept_len": None if al is None else round(float(al), 3),
                     "alpha_measured": None if al is None else round(analysis.required_alpha(float(al), k), 4)})
    return pd.DataFrame(rows)


def _row(manifest: Manifest, arm: str) -> HistoryRow:
    rows, _ = record_rows(manifest, CASE_NAME)
    for r in rows:
        if r.arm == arm:
            return r
    raise ConfigError(f"arm {arm!r} is not in the case; arms: {[r.arm for r in rows]}")


@dataclass(frozen=True)
class Pair:
    """Two configurations side by side (see :func:`pair`)."""

    a: HistoryRow
    b: HistoryRow
    tok_s_ratio: float | None
    cycle_ratio: float | None
    reasons: list[str]


def pair(manifest: Manifest, a: str, b: str) -> Pair:
    """Two configurations side by side: their figures, the ratio of their throughputs and cycles, and
    ``reasons`` (``history.incomparability``) why the ratio says nothing about the draft."""
    ra, rb = _row(manifest, a), _row(manifest, b)
    ratio = ra.tok_s / rb.tok_s if ra.tok_s and rb.tok_s else None
    cyc = ra.cycle_ms / rb.cycle_ms if ra.cycle_ms and rb.cycle_ms else None
    return Pair(a=ra, b=rb, tok_s_ratio=ratio, cycle_ratio=cyc, reasons=incomparability(ra, rb))


def baseline_drift(manifest: Manifest, earlier: str = "baseline-tuned",
                   later: str = "baseline-restart") -> float:
    """Relative change of the baseline between sessions: later / earlier - 1 (e.g. -0.075)."""
    later_tok_s, earlier_tok_s = _row(manifest, later).tok_s, _row(manifest, earlier).tok_s
    if later_tok_s is None or not earlier_tok_s:
        raise ConfigError(f"baseline arms {earlier!r} and {later!r} need a throughput each to compare")
    return later_tok_s / earlier_tok_s - 1.0


def coverage(manifest: Manifest) -> pd.DataFrame:
    """One row per configuration, one column per field a spectrial trial records (TRIAL_FIELDS):
    True where the case recorded it, False where it did not."""
    rows, _ = record_rows(manifest, CASE_NAME)
    engine_version = manifest.engine.version
    out = []
    for raw, r in zip(manifest.arms, rows, strict=True):
        same_session_base = r.method == "none" or r.baseline_arm is not None
        have = {
            "tok_s_values": len(raw.tok_s_values) >= 2, "accepted": raw.accepted is not None,
            "drafted": raw.drafted is not None, "verify_steps": bool(raw.verify_steps),
            "cycle_ms": raw.cycle_ms is not None and "cycle_ms" not in raw.derived,
            "draft_ms_per_cycle": raw.draft_ms_per_cycle is not None, "argv": bool(raw.argv),
            "env": raw.env is not None, "env_check": raw.env_check is not None and raw.env_check.ok is not None,
            "ready_s": raw.get("ready_s") is not None, "baseline_same_session": same_session_base,
            "engine_version": engine_version is not None, "started_at": manifest.started_at is not None,
        }
        out.append({"arm": r.arm, **have})
    table = pd.DataFrame(out).set_index("arm")
    return table[list(TRIAL_FIELDS)]
