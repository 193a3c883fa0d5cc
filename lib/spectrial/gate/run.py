"""`spectrial gate`: load the candidate and its reference (a run record, a committed golden record, or the last N
runs of the candidate's fingerprint), check that they can be compared, judge every figure (spectrial.gate.judge).
"""

from __future__ import annotations

from pathlib import Path

from spectrial.analysis.validity import problems
from spectrial.errors import ConfigError, RecordDamaged
from spectrial.gate.judge import comparison, differences, gate_arms, worst
from spectrial.gate.params import GateTolerances
from spectrial.record.acceptance import accept_shifts
from spectrial.record.store import Skipped, list_runs, load_record, load_records, read_manifest, read_requests
from spectrial.schema import GateRecord, Manifest, utc_now

USABLE = ("ok", "partial")


def read_run(path: str | Path, what: str) -> Manifest:
    """A run record from its folder or its manifest file (a committed golden record is a manifest.json anywhere);
    a damaged one is RecordDamaged (the file and what is wrong)."""
    p = Path(path)
    if p.is_dir():
        if not (p / "manifest.json").is_file():
            raise ConfigError(f"{what}: {p} holds no manifest.json", parameter=what,
                              hint="give a run folder (outputs/<run-id>) or a manifest.json file")
        m = load_record(p)
    elif p.is_file():
        m = read_manifest(p)
    else:
        raise ConfigError(f"{what}: {p} does not exist", parameter=what,
                          hint="give a run folder (outputs/<run-id>) or a manifest.json file")
    if m.status in ("running", "pending"):
        raise ConfigError(f"{what}: the run {m.run_id} is still {m.status}", parameter=what,
                          hint="gate a finished run (wait for it, or `spectrial report` it to settle an abandoned one)")
    if m.kind not in ("trial", "observe", "cluster-trial"):
        raise ConfigError(f"{what}: {p} is a {m.kind!r} record; the gate judges trials and observe-only runs",
                          parameter=what, hint="gate a trial's record (a sweep's best setting: run it as a trial)")
    return m


def _folder(path: str | Path) -> Path:
    p = Path(path)
    return p if p.is_dir() else p.parent


def accept_notes(cand: Manifest, cand_dir: str | Path, ref: Manifest, ref_dir: str | Path) -> list[str]:
    """Accept length across the runs (spectrial.record.acceptance, issue 39 item 7): an arm that shares its draft,
    depth, sampling and workload with the reference's but accepts beyond both intervals is a bug signal (TP, DP or
    the engine changed what is accepted), said whatever the gated figures say; [] where requests are missing."""
    try:
        shifts = accept_shifts(ref, cand, read_requests(_folder(ref_dir)), read_requests(_folder(cand_dir)),
                               cand.params.confidence or 0.95)
    except RecordDamaged:
        return []
    return [x.text() for x in shifts if x.flagged]


def validity_notes(cand: Manifest, arms: list[str], notes: list[str]) -> list[str]:
    """The candidate's failed validity checks of the gated arms (spectrial.analysis.validity: the one place every
    reader shows them from) appended to `notes`; returns the arms whose measurement is invalid."""
    invalid: list[str] = []
    for name in arms:
        arm = cand.arm(name)
        for c in problems(arm.validity if arm is not None else None):
            notes.append(f"candidate arm {name}: {c.name} check failed ({c.severity}): {c.summary}")
            if c.severity == "invalid" and name not in invalid:
                invalid.append(name)
    return invalid


def history(cand: Manifest, runs_dir: str | Path, last: int, tol: GateTolerances,
            skipped: list[Skipped] | None = None, paths: dict[str, Path] | None = None) -> list[Manifest]:
    """The last `last` finished runs under `runs_dir` before the candidate with its fingerprint (host state and
    engine build) and nothing that blocks a comparison (workload, sampling, model, ...), oldest first. A damaged
    record is passed over, and added to `skipped` (which and why) when given."""
    out: list[Manifest] = []
    for where, m, skip in load_records(list_runs(runs_dir)):
        if m is not None and paths is not None:
            paths[m.run_id] = Path(where)
        if m is None:
            if skip is not None and skipped is not None:
                skipped.append(skip)
            continue
        if m.run_id == cand.run_id or m.status not in USABLE or m.kind != cand.kind:
            continue
        if (m.started_at or "") >= (cand.started_at or "~"):
            continue
        if not comparison(cand, m, tol.allow, history=True).comparable:
            continue
        out.append(m)
    out.sort(key=lambda m: m.started_at or "")
    return out[-last:]


def run_gate(candidate: str | Path, tol: GateTolerances, reference: str | Path | None = None,
             last: int | None = None, runs_dir: str | Path | None = None,
             tolerances_file: str | None = None) -> GateRecord:
    """Judge `candidate` against `reference` (a record) or the last `last` runs of its fingerprint in `runs_dir`
    (default: the candidate's folder's parent)."""
    if (reference is None) == (last is None):
        raise ConfigError("gate: give either --reference RUN (a run folder or manifest.json) or --history N",
                          parameter="reference")
    cand = read_run(candidate, "CANDIDATE")
    rec = GateRecord(candidate=str(candidate), candidate_run_id=cand.run_id, reference="",
                     confidence=tol.confidence, tolerances_file=tolerances_file, created_at=utc_now())
    where: dict[str, Path] = {}
    if reference is not None:
        refs = [read_run(reference, "--reference")]
        rec.reference = str(reference)
        where[refs[0].run_id] = Path(reference)
    else:
        if last is None or last < 1:
            raise ConfigError(f"--history: {last} runs; give 1 or more", parameter="history")
        folder = Path(runs_dir) if runs_dir is not None else Path(candidate).resolve().parent
        skipped: list[Skipped] = []
        refs = history(cand, folder, last, tol, skipped, where)
        rec.reference = f"history: the last {last} runs of fingerprint {cand.fingerprint_key} under {folder}"
        rec.notes += [s.line() for s in skipped]  # damaged records: named, passed over, left as they are
        if not refs:
            rec.comparable, rec.outcome = False, "not comparable"
            rec.not_comparable = [f"no earlier finished run under {folder} with the candidate's fingerprint "
                                  f"({cand.fingerprint_key}), workload, sampling, model and engine"]
            rec.exit_code = tol.exit_code(rec.outcome)
            return rec
        if len(refs) < last:
            rec.notes.append(f"{len(refs)} of the {last} runs asked for were found")
    rec.reference_runs = [r.run_id for r in refs]
    for r in refs:
        if r.run_id in where:
            rec.notes += accept_notes(cand, candidate, r, where[r.run_id])
    for r in refs:
        c = comparison(cand, r, tol.allow)
        hardware = cand.controlled and r.controlled
        for blocking, lines in ((True, rec.not_comparable), (False, rec.allowed_differences)):
            lines += [f"{name} differs from {r.run_id}: {what}"
                      for name, what in differences(c, blocking, hardware).items()]
    if cand.status not in USABLE:
        rec.notes.append(f"the candidate's run ended {cand.status}: {cand.reason or 'no reason recorded'}")
    loose = [who for m, who in ((cand, "the candidate"), *((r, f"reference {r.run_id}") for r in refs))
             if not m.controlled]
    if loose:
        rec.notes.append(f"uncontrolled ({', '.join(loose)}: spectrial did not start the server): no baseline beside "
                         "it, no environment check, its host not fingerprinted; throughput figures are reported" +
                         (", judged as allowed" if "controlled" in tol.allow else ", not judged"))
    if rec.not_comparable:
        rec.comparable, rec.outcome = False, "not comparable"
        rec.exit_code = tol.exit_code(rec.outcome)
        return rec
    rec.checks, rec.changed = gate_arms(cand, refs, tol)
    judged = [c.outcome for c in rec.checks if c.outcome != "not gated"]
    rec.outcome = worst(judged)
    if not judged:
        rec.notes.append("no figure was gated (every one is missing or `gate: false`)")
    invalid = validity_notes(cand, tol.arms or [a.name for a in refs[-1].arms], rec.notes)
    if invalid and rec.outcome in ("pass", "improvement"):  # an invalid measurement passes nothing
        rec.outcome = "inconclusive"
        rec.notes.append(f"outcome inconclusive: the candidate's measurement of {', '.join(invalid)} is invalid")
    rec.exit_code = tol.exit_code(rec.outcome)
    return rec
