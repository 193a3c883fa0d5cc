"""Every run record under a folder, and any folder of plain server logs, as one tidy table.

``load_history(runs_dir, logs_dir=None) -> History``: ``History.table`` has one row per arm of every
run record (``source`` "record") and one row per parseable log file (``source`` "log"), columns
``HISTORY_COLUMNS``; ``History.issues`` lists what could not be used or looks wrong (source, item, problem),
never raising on bad input (a damaged record, RecordDamaged, is skipped: its issue names the file and the damage); ``History.log_summary`` is ``spectrial.logs.summary`` per log file.

Row fields beyond the manifest's (see ``spectrial.protocol.trial`` for the per-arm fields):
- ``config``: "baseline" or "<method> k=<steps>" (+ " synthetic a=<x>"), the column of the matrix views;
- ``session``: the arm's ``session`` where a record has several (the seed case), else the run id;
- ``run_status``: the run's status; a sweep its budget stopped is ``partial`` (and an issue names what it did not
  measure), also when an older record said ``ok``;
- ``nccl_env``: "set, verified" (NCCL_* variables requested and found in every server process),
  "set, check failed", "set, unverified", "none" (no NCCL_* variable) or "unrecorded";
- ``n_values``: request rates behind ``tok_s`` (1 for a hand-measured figure);
- derived where a hand-made record lacks them (``spectrial.analysis.figures.fill_derived``, each noted in ``derived``):
  cycle_ms = verify_ms / verify_share or accept_len / tok_s * 1000; accept_len = tok_s * cycle_ms / 1000;
  ms_per_token = 1000 / tok_s;
- ``cycle_ms``: the cycle on the verdict's clock (``spectrial.analysis.figures.verdict_cycle_ms``: break-even x the baseline's
  ms per token), so that it implies the row's break-even: the arm's ``cycle_ms``, but for a decide run's arm (whose
  speed-up is its paired rounds' estimate);
- ``speedup`` (with its interval), ``break_even_accept_len``, ``verdict``, ``pays``, ``baseline_arm``: the record's
  own comparison (``spectrial.analysis.figures``: the baseline of the same run, session and NCCL state where arms record
  one), never recomputed here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import JsonValue

from spectrial.analysis.figures import fill_derived, verdict_cycle_ms
from spectrial.analysis.stats import finite
from spectrial.errors import RecordDamaged, SpectrialError
from spectrial.params import repo_root
from spectrial.record import comparable as cmp
from spectrial.record.acceptance import accept_shifts
from spectrial.record.comparable import Category
from spectrial.record.store import Skipped, as_manifest, load_record, read_requests
from spectrial.schema import ArmRecord, EngineInfo, HostInfo, Manifest, RequestRecord

__all__ = ["HISTORY_COLUMNS", "History", "HistoryRow", "baseline_over_time", "fill_derived", "incomparability",
           "load_history", "matrix", "record_rows", "resolve_dir", "rows_frame", "with_derived"]


@dataclass
class HistoryRow:
    """One row of the history table: an arm of a run record, or a log file (its medians)."""

    source: str | None = None
    run: str | None = None
    kind: str | None = None
    run_status: str | None = None
    host: str | None = None
    gpu: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    started_at: str | None = None
    session: str | None = None
    order: int | None = None
    arm: str | None = None
    method: str | None = None
    status: str | None = None
    reason: str | None = None
    config: str | None = None
    k: int | None = None
    synthetic_accept: float | list[float] | None = None
    launch: str | None = None
    nccl_env: str | None = None
    tok_s: float | None = None
    tok_s_min: float | None = None
    tok_s_max: float | None = None
    n_values: int | None = None
    ms_per_token: float | None = None
    accept_len: float | None = None
    draft_accept_rate: float | None = None
    cycle_ms: float | None = None
    verify_ms: float | None = None
    verify_share: float | None = None
    draft_ms_per_cycle: float | None = None
    verify_steps: float | None = None
    break_even_accept_len: float | None = None
    speedup: float | None = None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    verdict: str | None = None
    pays: str | None = None
    derived: str | None = None
    baseline_arm: str | None = None  # the table's last column, after HISTORY_COLUMNS


HISTORY_COLUMNS = [f.name for f in fields(HistoryRow)][:-1]
LOG_METRICS = {"tok_s": ("gen_throughput", "output_throughput"), "accept_len": ("accept_len",),
               "draft_accept_rate": ("accept_rate",), "verify_ms": ("verify_ms",)}
_VERSION = re.compile(r"version:?\s*([^|]+?)\s*(?:\||$)")
_NCCL = re.compile(r"^NCCL_")


@dataclass
class History:
    """The tidy table of runs (and logs), the problems met while reading, and the per-log summaries."""

    table: pd.DataFrame
    issues: pd.DataFrame
    log_summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    skipped: list[Skipped] = field(default_factory=list)  # damaged records left out (also among the issues)

    @property
    def records(self) -> pd.DataFrame:
        """Rows that come from run records."""
        return self.table[self.table["source"] == "record"]


def resolve_dir(path: str | Path) -> Path:
    """A folder given relative to the cwd, else relative to the spectrial checkout (notebooks run in notebooks/)."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    alt = repo_root() / p
    return alt if alt.exists() else p


# ------------------------------------------------------------------ run records
def _engine_version(engine: EngineInfo) -> str | None:
    v = engine.version
    if not v:
        return None
    m = _VERSION.search(str(v))
    return (m.group(1) if m else str(v)).strip()[:60] or None


def _gpu(host: HostInfo) -> str | None:
    if host.gpu_key:
        n = host.gpu_count
        return f"{n}x {host.gpu_key}" if n else host.gpu_key
    names = [g.name for g in host.gpus.gpus if g.name] if host.gpus is not None else []
    if not names:
        return "none" if host.gpus is not None else None
    return f"{len(names)}x {names[0]}" if len(names) > 1 else str(names[0])


def _nccl_env(arm: ArmRecord) -> str:
    if arm.nccl_env:
        return arm.nccl_env
    if arm.env is None:
        return "unrecorded"
    if not any(_NCCL.match(k) for k in arm.env):
        return "none"
    ok = arm.env_check.ok if arm.env_check is not None else None
    return {True: "set, verified", False: "set, check failed"}.get(ok, "set, unverified")


def _config(arm: ArmRecord) -> str:
    if not arm.speculative:
        return "baseline"
    label = f"{arm.method} k={arm.steps if arm.steps is not None else '?'}"
    syn = finite(arm.synthetic_accept)
    return label + (f" (synthetic a={syn:g})" if syn is not None else "")


def _arm_issues(run: str, arm: ArmRecord) -> list[tuple[str, str, str]]:
    name = arm.name or "?"
    out = []
    if arm.status != "ok":
        out.append((run, name, f"arm did not complete (status {arm.status!r}): "
                               f"{arm.reason or 'no reason recorded'}"))
        return out
    steps = arm.verify_steps
    if arm.speculative and steps is not None and not (finite(steps) or 0) > 0:
        out.append((run, name, f"{float(steps):g} verify steps: no speculative cycle measured (cycle and accept length undefined)"))
    al = finite(arm.accept_len)
    if arm.speculative and al is not None and al < 1:
        out.append((run, name, f"accept length {al:g} < 1: impossible (each cycle commits >= 1 token); counters wrong"))
    if finite(arm.tok_s) is None and finite(arm.verify_ms) is None:
        out.append((run, name, "no throughput and no verify time recorded"))
    return out


def with_derived(arm: ArmRecord) -> ArmRecord:
    """A copy of an arm with what its recorded figures imply filled in (``fill_derived``, each derived field named
    in its ``derived``)."""
    return type(arm).model_validate(fill_derived(arm.model_dump()))


def record_rows(source: Manifest | Mapping[str, Any], run: str
                ) -> tuple[list[HistoryRow], list[tuple[str, str, str]]]:
    """Rows (one per arm) and issues of one run record; ``run`` labels it (its folder, relative)."""
    manifest = as_manifest(source)
    issues: list[tuple[str, str, str]] = []
    status = manifest.status
    if manifest.points:  # a sweep: `partial` when its budget stopped it (older records said `ok`)
        from spectrial.sweep.result import partial_reason, sweep_status

        status = sweep_status(manifest)
    if status == "failed":
        issues.append((run, "", f"run failed: {manifest.reason or 'no reason recorded'}"))
    elif status == "partial":
        issues.append((run, "", f"run partial: {partial_reason(manifest) or manifest.reason or 'no reason recorded'}"))
    elif status != "ok":
        issues.append((run, "", f"run status {status!r}: never finished (interrupted?)"))
    if not manifest.arms:
        issues.append((run, "", "no arms recorded"))
    host, engine = manifest.host, manifest.engine
    rows = []
    for i, recorded in enumerate(manifest.arms):
        issues += _arm_issues(run, recorded)
        arm = with_derived(recorded) if recorded.status == "ok" else recorded
        extra = arm.model_extra or {}  # hand-made records (the seed case) note their launch and order
        values = [v for v in arm.tok_s_values if finite(v)]
        rows.append(HistoryRow(
            source="record", run=run, kind=manifest.kind, run_status=status,
            host=host.name, gpu=_gpu(host), engine=engine.name,
            engine_version=_engine_version(engine), started_at=manifest.started_at,
            session=arm.session or (manifest.run_id if manifest.run_id != "?" else None) or run,
            order=extra.get("order") or i + 1,
            arm=arm.name, method=arm.method or "none", status=arm.status,
            reason=arm.reason, config=_config(arm), k=arm.steps, synthetic_accept=arm.synthetic_accept,
            launch=extra.get("launch") or ("spectrial" if arm.argv else None), nccl_env=_nccl_env(arm),
            tok_s=finite(arm.tok_s), tok_s_min=finite(arm.tok_s_min), tok_s_max=finite(arm.tok_s_max),
            n_values=len(values) if values else (1 if finite(arm.tok_s) else 0),
            ms_per_token=finite(arm.ms_per_token), accept_len=finite(arm.accept_len),
            draft_accept_rate=finite(arm.draft_accept_rate), cycle_ms=finite(verdict_cycle_ms(arm)),
            verify_ms=finite(arm.verify_ms), verify_share=finite(arm.verify_share),
            draft_ms_per_cycle=finite(arm.draft_ms_per_cycle), verify_steps=finite(arm.verify_steps),
            break_even_accept_len=finite(arm.break_even_accept_len), speedup=finite(arm.speedup),
            speedup_ci_low=finite(arm.speedup_ci_low), speedup_ci_high=finite(arm.speedup_ci_high),
            verdict=arm.verdict, pays=arm.pays, baseline_arm=arm.baseline_arm if arm.speculative else None,
            derived="; ".join(f"{k} = {v}" for k, v in arm.derived.items()) or None,
        ))
    return rows, issues


# ------------------------------------------------------------------ plain logs
_DATE = re.compile(r"^\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")


def log_rows(logs_dir: str | Path) -> tuple[list[HistoryRow], pd.DataFrame, list[tuple[str, str, str]]]:
    """One row per parseable file under ``logs_dir`` (medians over the file), the per-file
    ``spectrial.logs.summary`` (long), and issues (unreadable files, files with nothing parseable)."""
    root = resolve_dir(logs_dir)
    label = str(logs_dir)
    if not root.is_dir():
        return [], pd.DataFrame(), [(label, "", "is not a folder: pass logs_dir= a folder of server logs")]
    try:
        from spectrial import logs
    except ImportError as exc:  # pragma: no cover - the parsers ship with spectrial
        return [], pd.DataFrame(), [(label, "", f"log parsers unavailable: {exc}")]
    files = sorted(p for p in root.rglob("*")
                   if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))
    if not files:
        return [], pd.DataFrame(), [(label, "", "the folder holds no files")]
    rows, summaries, issues = [], [], []
    for p in files:
        rel = p.relative_to(root).as_posix()
        try:
            df = logs.parse(p)
        except (SpectrialError, OSError, UnicodeError, ValueError) as exc:
            issues.append((rel, "", f"could not be read: {exc}"))
            continue
        if df.empty:
            issues.append((rel, "", f"nothing parseable ({df.attrs.get('lines', 0)} lines read)"))
            continue
        s = logs.summary(df)
        s.insert(0, "file", rel)
        summaries.append(s)
        stamps = [t for t in df["timestamp"].dropna().astype(str) if _DATE.match(t)]
        engines = df["engine"].value_counts()
        row = HistoryRow(source="log", run=rel, kind="log", run_status="ok", engine=str(engines.index[0]),
                         started_at=stamps[0].strip("[") if stamps else None, session=rel, order=1, arm=rel,
                         method="unknown", status="ok", config="log", launch="unknown", nccl_env="unrecorded",
                         derived="medians over the file; launch conditions unknown", baseline_arm=None)
        for col, names in LOG_METRICS.items():
            for n in names:
                if n in df.columns and df[n].notna().any():
                    setattr(row, col, float(pd.to_numeric(df[n], errors="coerce").median()))
                    break
        row.n_values = 0
        rows.append(row)
    summary = pd.concat(summaries, ignore_index=True) if summaries else pd.DataFrame()
    return rows, summary, issues


# ------------------------------------------------------------------ the table
NOT_ARM_RECORDS = frozenset({"nccl_check"})  # run records without speculative arms: not part of this table


def load_history(runs_dir: str | Path | None = "outputs", logs_dir: str | Path | None = None) -> History:
    """Every run record under ``runs_dir`` (recursively) and every log file under ``logs_dir``, tidy."""
    rows: list[HistoryRow] = []
    issues: list[tuple[str, str, str]] = []
    skipped: list[Skipped] = []
    loaded: list[tuple[Path, str, Manifest]] = []
    if runs_dir is not None:
        root = resolve_dir(runs_dir)
        if not root.is_dir():
            issues.append((str(runs_dir), "", "is not a folder of run records"))
        else:
            paths = sorted(root.rglob("manifest.json"), key=lambda p: p.parent.relative_to(root).as_posix())
            if not paths:
                issues.append((str(runs_dir), "", "holds no run record (no manifest.json)"))
            for path in paths:
                run = path.parent.relative_to(root).as_posix()
                try:
                    manifest = load_record(path.parent)
                except RecordDamaged as exc:  # skipped, named with what is wrong; the file is left as it is
                    skipped.append(Skipped(path.parent, exc))
                    issues.append((run, "", f"{Path(exc.path).name} unreadable, damaged record skipped: "
                                            f"{exc.problem}"))
                    continue
                if manifest.kind in NOT_ARM_RECORDS:  # e.g. an NCCL check: notebook 00 reads those
                    continue
                r, i = record_rows(manifest, run)
                rows += r
                issues += i
                loaded.append((path.parent, run, manifest))
            issues += accept_issues(loaded)
    summary = pd.DataFrame()
    if logs_dir is not None:
        r, summary, i = log_rows(logs_dir)
        rows += r
        issues += i
    table = rows_frame(rows)
    stamps = table["started_at"].where(table["started_at"].astype(str).str.match(_DATE.pattern), None)
    table["started_at"] = pd.to_datetime(stamps, utc=True, errors="coerce", format="ISO8601")
    return History(table=table, issues=pd.DataFrame(issues, columns=["source", "item", "problem"]),
                   log_summary=summary, skipped=skipped)


def accept_issues(records: Sequence[tuple[Path, str, Manifest]]) -> list[tuple[str, str, str]]:
    """Accept length across parallelism (spectrial.record.acceptance, issue 39 item 7): each record against the one
    before it in time that shares its model, workload and sampling; an arm whose accept length moved beyond both
    intervals while only TP, DP, the engine or the host changed is an issue (a bug signal)."""
    ordered = sorted(records, key=lambda x: x[2].started_at or "")
    cache: dict[Path, dict[str, list[RequestRecord]]] = {}

    def requests(folder: Path) -> dict[str, list[RequestRecord]]:
        if folder not in cache:
            try:
                cache[folder] = read_requests(folder)
            except RecordDamaged:
                cache[folder] = {}
        return cache[folder]

    out: list[tuple[str, str, str]] = []
    for (fa, _, a), (fb, run_b, b) in zip(ordered, ordered[1:], strict=False):
        if a.params.model != b.params.model:  # another target: nothing to compare (accept_shifts checks the rest)
            continue
        for x in accept_shifts(a, b, requests(fa), requests(fb), b.params.confidence or 0.95):
            if x.flagged:
                out.append((run_b, x.arm, x.text()))
    return out


# ------------------------------------------------------------------ views
def rows_frame(rows: Sequence[HistoryRow]) -> pd.DataFrame:
    """History rows as a table: columns HISTORY_COLUMNS, then baseline_arm."""
    return pd.DataFrame([asdict(r) for r in rows], columns=[*HISTORY_COLUMNS, "baseline_arm"])


def _config_order(cols: Sequence[str]) -> list[str]:
    def key(c: str) -> tuple[int, str, int, str]:
        if c == "baseline":
            return (0, "", 0, "")
        m = re.match(r"(\S+) k=(\d+)", c)
        return (1, m.group(1), int(m.group(2)), c) if m else (2, c, 0, c)

    return sorted(cols, key=key)


def matrix(table: pd.DataFrame, values: str = "tok_s",
           rows: Sequence[str] = ("host", "engine_version", "session", "nccl_env"),
           columns: str = "config") -> pd.DataFrame:
    """The matrix the original engineer built by hand: ``values`` (median where a cell has several) of the
    completed record arms, rows (host, engine version, session, NCCL state), columns the arm configuration."""
    t = table[(table["source"] == "record") & (table["status"] == "ok") & table[values].notna()].copy()
    if t.empty:
        return pd.DataFrame()
    for c in (*rows, columns):
        t[c] = t[c].astype(object).where(t[c].notna(), "n/a").astype(str)
    m = t.pivot_table(index=list(rows), columns=columns, values=values, aggfunc="median", sort=True)
    m = m[_config_order(list(m.columns))]
    m.columns.name = f"{values} by {columns}"
    return m


def baseline_over_time(table: pd.DataFrame) -> pd.DataFrame:
    """Completed baseline arms per host in time order (undated records last, in their recorded order),
    with the change from the previous baseline of the same host and NCCL state (like with like)."""
    t = table[(table["source"] == "record") & (table["method"] == "none") & (table["status"] == "ok")
              & table["tok_s"].notna()].copy()
    cols = ["host", "when", "run", "session", "arm", "nccl_env", "tok_s", "tok_s_min", "tok_s_max", "n_values",
            "change_pct"]
    if t.empty:
        return pd.DataFrame(columns=cols)
    t["_undated"] = t["started_at"].isna()
    t = t.sort_values(["host", "_undated", "started_at", "run", "order"], kind="stable")
    t["when"] = [f"{s:%Y-%m-%d %H:%M}" if not pd.isna(s) else f"{r} · {ss}"
                 for s, r, ss in zip(t["started_at"], t["run"], t["session"], strict=True)]
    t["change_pct"] = t.groupby(["host", "nccl_env"], sort=False)["tok_s"].pct_change() * 100
    return t[cols].reset_index(drop=True)


def _k_text(k: Any) -> str:
    v = finite(k)
    return "none" if v is None else f"{v:g}"


# what two rows (arms) must share to be compared (spectrial.record.comparable): the session, the launch and its
# NCCL state, the draft depth, the host and the engine version; the host and version must be recorded
REQUIRES: tuple[Category, ...] = ("session", "configuration", "arm settings", "host", "engine version")
STRICT: tuple[Category, ...] = ("host", "engine version")


def _value(v: Any) -> JsonValue:
    """A table cell as a plain value: numpy scalars unwrapped, NaN as None (not recorded)."""
    if hasattr(v, "item"):
        v = v.item()
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def row_facts(row: Mapping[str, Any]) -> cmp.Facts:
    """What a history row records of the one comparison's categories (an NCCL state never recorded: None)."""
    nccl = row.get("nccl_env")
    k = _value(row.get("k"))
    return cmp.Facts(label=str(row.get("arm")), values={
        "session": {"run": _value(row.get("run")), "session": _value(row.get("session"))},
        "configuration": {"launch": _value(row.get("launch")),
                          "NCCL state": None if nccl == "unrecorded" else _value(nccl)},
        "arm settings": {"steps": int(k) if isinstance(k, float) and k.is_integer() else k},
        "host": {"host": _value(row.get("host"))},
        "engine version": {"engine_version": _value(row.get("engine_version"))}})


def incomparability(a: HistoryRow | Mapping[str, Any] | pd.Series,
                    b: HistoryRow | Mapping[str, Any] | pd.Series, ignore: Iterable[Category] = ()) -> list[str]:
    """Why two history rows (arms) cannot be compared as they stand; empty when nothing recorded says so.
    The rows are :class:`HistoryRow` objects or rows of the history table (mappings, Series). The differences
    come from the one comparison (`REQUIRES`, less the categories in `ignore`); what one row alone leaves unknown
    (its NCCL state unrecorded or unverified, a single measurement) is said beside them."""
    a, b = (asdict(r) if isinstance(r, HistoryRow) else dict(r) for r in (a, b))
    name_a, name_b = a.get("arm"), b.get("arm")
    c = cmp.compare(row_facts(a), row_facts(b), require=REQUIRES, ignore=ignore, strict=STRICT)
    found = {(d.category, d.field): d for d in c.blocking}
    why = []
    if any(cat == "session" for cat, _ in found):
        why.append(f"different sessions ({a.get('session')} vs {b.get('session')}): separate server starts in "
                   "possibly different system states; neither has a baseline measured beside the other")
    if ("configuration", "launch") in found:
        why.append(f"launched differently ({a.get('launch') or 'not recorded'} vs {b.get('launch') or 'not recorded'})")
    if "configuration" not in set(ignore):  # what each row alone leaves unknown of its launch
        for r, name in ((a, name_a), (b, name_b)):
            if r.get("nccl_env") == "unrecorded":
                why.append(f"{name}: launch environment never recorded, so whether the NCCL variables reached its "
                           "server processes is unknown")
        if "set, unverified" in {a.get("nccl_env"), b.get("nccl_env")}:
            why.append("NCCL variables set but never verified in the server processes (/proc/<pid>/environ) nor in "
                       "NCCL's own debug output")
    d = found.get(("configuration", "NCCL state"))
    if d is not None and d.recorded == "both":
        why.append(f"different NCCL states ({d.a} vs {d.b})")
    d = found.get(("arm settings", "steps"))
    if d is not None:
        why.append(f"different draft depths (k={_k_text(d.a)} vs k={_k_text(d.b)})")
    for cat, key in (("host", "host"), ("engine version", "engine_version")):
        d = found.get((cat, key))  # type: ignore[arg-type]
        if d is None:
            continue
        if d.recorded != "both":
            missing = [n for v, n in ((d.a, name_a), (d.b, name_b)) if v is None]
            why.append(f"{key.replace('_', ' ')} not recorded for {' nor '.join(str(n) for n in missing)}")
        else:
            why.append(f"different {key.replace('_', ' ')} ({d.a} vs {d.b})")
    if (a.get("n_values") or 0) < 2 or (b.get("n_values") or 0) < 2:
        why.append("single measurements: no spread, so a difference of a few % cannot be told from noise")
    return why
