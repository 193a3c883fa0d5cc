"""Why is speculation slower here? Detectors that name the cause, with evidence.

    >>> from spectrial.readers.diagnose import diagnose
    >>> d = diagnose("outputs/<run-id>", logs=["server.log"])   # a run folder, a Manifest, or None (logs only)
    >>> print(d.text())                                           # what `spectrial doctor RUN_DIR [LOG ...]` prints
    >>> d.findings[0].kind, d.findings[0].evidence[0].where       # typed: Finding, Evidence, Source

Each detector reads the run record (manifest: arms, starts, argv and environment, env checks, NCCL evidence,
fingerprint changes, drift), the server logs (``RUN_DIR/logs/`` and any LOG given, parsed by
``spectrial.logs`` through ``spectrial.logs.api.ServerLog``), the GPU samples (``RUN_DIR/gpu/*.csv``) and,
for drift, earlier records of the same folder. A finding says what was found and how bad it is (critical:
makes speculation lose by itself; warning: distorts or invalidates the measurement; info: worth knowing, not
the cause here), the evidence (a record field path with its value, or ``file:line`` with the line), the fix,
and the public threads where the pattern was seen. Findings are ranked by severity, then by how often the
cause is the answer in public threads (the detector's ``order``).

Detectors (``DETECTORS``, in rank order): accept_pinned, cuda_graph, running_cap, tree_at_batch,
env_not_in_effect, debug_switches, throttling, draft_tp, stale_baseline, not_comparable, raw_prompts,
global_counter, below_break_even; uncontrolled (a record of a server spectrial did not start: what it
cannot conclude).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spectrial.errors import ConfigError, RecordDamaged
from spectrial.readers.diagnose import (  # noqa: F401 (register)
    acceptance,
    breakeven,
    capacity,
    comparability,
    conditions,
    uncontrolled,
    validity,
)
from spectrial.readers.diagnose.common import names
from spectrial.readers.diagnose.context import LOG_SUFFIXES, Context, GpuSamples, LogFile, arm_of, read_text
from spectrial.readers.diagnose.model import SEVERITY_RANK, Diagnosis, Evidence, Finding, Severity, Source
from spectrial.readers.diagnose.registry import DETECTORS, Detector, detector, get
from spectrial.readers.diagnose.sources import SOURCES
from spectrial.record.store import as_manifest, load_record, read_table
from spectrial.schema import Manifest

__all__ = ["DETECTORS", "SEVERITY_RANK", "SOURCES", "Context", "Detector", "Diagnosis", "Evidence", "Finding",
           "Severity", "Source", "detector", "diagnose", "get", "load_context", "merge_repeats", "to_json"]


def _arm_names(m: Manifest | None) -> list[str]:
    if m is None:
        return []
    names = {str(a.get("arm") or a.name) for a in m.arms} | {str(p.arm or p.name) for p in m.points}
    return sorted(names | {a.name for a in m.arms})


def _log_file(path: Path, label: str, arms: list[str], problems: list[str]) -> LogFile | None:
    try:
        return LogFile(label=label, text=read_text(path), arm=arm_of(_stem(path), arms))
    except RecordDamaged as exc:  # too large, unreadable, a broken .gz: named among the problems, left as it is
        problems.append(f"{label}: {exc.problem}")
        return None


def _stem(path: Path) -> str:
    name = path.name
    for suffix in LOG_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def load_context(source: str | Path | Manifest | Mapping[str, Any] | None = None,
                 logs: Sequence[str | Path] = ()) -> Context:
    """What a diagnosis reads: a run folder (its manifest.json, logs/ and gpu/ files), a Manifest (or manifest
    mapping) alone, or nothing but `logs`. Raises ConfigError naming the argument when an input is unusable."""
    problems: list[str] = []
    manifest: Manifest | None = None
    run_dir: Path | None = None
    if isinstance(source, Manifest | Mapping):
        manifest = as_manifest(source)
    elif source is not None:
        run_dir = Path(source).expanduser()
        if not (run_dir / "manifest.json").is_file():
            raise ConfigError(f"RUN_DIR: {run_dir} holds no manifest.json; pass a run folder, e.g. outputs/<run-id> "
                              "(or a server log as LOG)", parameter="RUN_DIR")
        manifest = load_record(run_dir)  # a damaged record: RecordDamaged, naming the file and what is wrong
    arms = _arm_names(manifest)
    ctx = Context(manifest=manifest, run_dir=run_dir, problems=problems)
    if run_dir is not None:
        for p in sorted(run_dir.glob("logs/**/*")):
            if p.is_file() and p.name.endswith(LOG_SUFFIXES):
                lf = _log_file(p, p.relative_to(run_dir).as_posix(), arms, problems)
                if lf is not None:
                    ctx.logs.append(lf)
        for p in sorted(run_dir.glob("gpu/*.csv")):
            try:
                ctx.gpu.append(GpuSamples(p.relative_to(run_dir).as_posix(), read_table(p, skipinitialspace=True),
                                          arm_of(p.stem, arms)))
            except RecordDamaged as exc:
                problems.append(f"{p.relative_to(run_dir)}: {exc.problem}")
    for given in logs:
        p = Path(given).expanduser()
        if not p.is_file():
            raise ConfigError(f"LOG: {p} is not a file; pass server logs (plain or .gz)", parameter="LOG")
        lf = _log_file(p, str(given), [], problems)
        if lf is not None:
            ctx.logs.append(lf)
    return ctx


def diagnose(source: str | Path | Manifest | Mapping[str, Any] | None = None, logs: Sequence[str | Path] = (),
             *, kinds: Sequence[str] | None = None) -> Diagnosis:
    """Run every detector (or those of `kinds`) on a run folder / manifest and any server logs; the findings
    ranked. A detector that fails on odd input is reported in `problems`, never raised."""
    ctx = load_context(source, logs)
    selected = [get(k) for k in kinds] if kinds is not None else sorted(DETECTORS.values(), key=lambda d: d.order)
    findings: list[Finding] = []
    for det in selected:
        try:
            findings += det.run(ctx)
        except Exception as exc:  # noqa: BLE001 - one detector's bug must not hide the others' findings
            ctx.problems.append(f"detector {det.kind} failed: {type(exc).__name__}: {exc}")
    findings = merge_repeats(findings)
    findings.sort(key=Finding.sort_key)
    breakeven.name_causes(findings)
    m = ctx.manifest
    run = (m.run_id if m is not None and m.run_id != "?" else None) or (str(source) if source is not None else None) \
        or ", ".join(lf.label for lf in ctx.logs) or "nothing"
    read = (["manifest.json"] if m is not None else []) + [lf.label for lf in ctx.logs] + [g.label for g in ctx.gpu]
    return Diagnosis(run=str(run), engine=ctx.build.text(), findings=findings, checked=[d.kind for d in selected], read=read,
                     problems=ctx.problems)


def merge_repeats(findings: list[Finding]) -> list[Finding]:
    """Findings that say the same of several arms or starts ("<arm>: <the same words>", the same detail and fix)
    as one, with the count and the arms named once ("3 arms (a, b and c): ..."); the evidence of each kept."""
    groups: dict[tuple[str, str, str, str, str], list[Finding]] = {}
    for f in findings:
        rest = f.title[len(f.arm) + 2:] if f.arm and f.title.startswith(f"{f.arm}: ") else None
        key = (f.kind, f.severity, rest if rest is not None else f"\0{id(f)}", f.detail, f.fix)
        groups.setdefault(key, []).append(f)
    out = []
    for (_, _, rest, _, _), same in groups.items():
        if len(same) == 1:
            out.append(same[0])
            continue
        arms = [a for f in same for a in (f.arms or [f.arm or ""])]
        first = same[0]
        out.append(first.model_copy(update={
            "title": f"{len(arms)} arms ({names(arms)}): {rest}", "arm": None, "arms": arms,
            "evidence": [e for f in same for e in f.evidence]}))
    return out


def to_json(d: Diagnosis) -> str:
    """The diagnosis as JSON (``spectrial doctor --json``)."""
    return json.dumps(d.model_dump(mode="json"), indent=2)
