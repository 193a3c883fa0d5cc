"""Every run record under a folder, and any folder of plain server logs, as one tidy table.

``load_history(runs_dir, logs_dir=None) -> History``: ``History.table`` has one row per arm of every
run record (``source`` "record") and one row per parseable log file (``source`` "log"), columns
``HISTORY_COLUMNS``; ``History.issues`` lists what could not be used or looks wrong (source, item, problem),
never raising on bad input; ``History.log_summary`` is ``spectrial.logs.summary`` per log file.

Row fields beyond the manifest's (see ``spectrial.trial`` for the per-arm fields):
- ``config``: "baseline" or "<method> k=<steps>" (+ " synthetic a=<x>"), the column of the matrix views;
- ``session``: the arm's ``session`` where a record has several (the seed case), else the run id;
- ``run_status``: the run's status; a sweep its budget stopped is ``partial`` (and an issue names what it did not
  measure), also when an older record said ``ok``;
- ``nccl_env``: "set, verified" (NCCL_* variables requested and found in every server process),
  "set, check failed", "set, unverified", "none" (no NCCL_* variable) or "unrecorded";
- ``n_values``: request rates behind ``tok_s`` (1 for a hand-measured figure);
- derived where a hand-made record lacks them (``spectrial.figures.fill_derived``, each noted in ``derived``):
  cycle_ms = verify_ms / verify_share or accept_len / tok_s * 1000; accept_len = tok_s * cycle_ms / 1000;
  ms_per_token = 1000 / tok_s;
- ``speedup`` (with its interval), ``break_even_accept_len``, ``verdict``, ``pays``, ``baseline_arm``: the record's
  own comparison (``spectrial.figures``: the baseline of the same run, session and NCCL state where arms record
  one), never recomputed here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from spectrial.errors import SpectrialError
from spectrial.figures import fill_derived
from spectrial.params import repo_root
from spectrial.records import finite
from spectrial.schema import Manifest, as_manifest, load_record

__all__ = ["HISTORY_COLUMNS", "History", "baseline_figure", "baseline_over_time", "fill_derived",
           "incomparability", "load_history", "matrix", "matrix_figure", "resolve_dir"]

HISTORY_COLUMNS = [
    "source", "run", "kind", "run_status", "host", "gpu", "engine", "engine_version", "started_at", "session",
    "order", "arm", "method", "status", "reason", "config", "k", "synthetic_accept", "launch", "nccl_env",
    "tok_s", "tok_s_min", "tok_s_max", "n_values", "ms_per_token", "accept_len", "draft_accept_rate", "cycle_ms",
    "verify_ms", "verify_share", "draft_ms_per_cycle", "verify_steps", "break_even_accept_len", "speedup",
    "speedup_ci_low", "speedup_ci_high", "verdict", "pays", "derived",
]
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
def _engine_version(engine: Mapping[str, Any]) -> str | None:
    v = engine.get("version")
    if not v:
        return None
    m = _VERSION.search(str(v))
    return (m.group(1) if m else str(v)).strip()[:60] or None


def _gpu(host: Mapping[str, Any]) -> str | None:
    if host.get("gpu_key"):
        n = host.get("gpu_count")
        return f"{n}x {host['gpu_key']}" if n else str(host["gpu_key"])
    gpus = ((host.get("gpus") or {}).get("gpus") or []) if isinstance(host.get("gpus"), Mapping) else []
    names = [g.get("name") for g in gpus if isinstance(g, Mapping) and g.get("name")]
    if not names:
        return "none" if isinstance(host.get("gpus"), Mapping) else None
    return f"{len(names)}x {names[0]}" if len(names) > 1 else str(names[0])


def _nccl_env(arm: Mapping[str, Any]) -> str:
    if arm.get("nccl_env"):
        return str(arm["nccl_env"])
    env = arm.get("env")
    if not isinstance(env, Mapping):
        return "unrecorded"
    if not any(_NCCL.match(str(k)) for k in env):
        return "none"
    ok = (arm.get("env_check") or {}).get("ok")
    return {True: "set, verified", False: "set, check failed"}.get(ok, "set, unverified")


def _config(arm: Mapping[str, Any]) -> str:
    method = str(arm.get("method") or "none")
    if method == "none":
        return "baseline"
    label = f"{method} k={arm.get('steps') if arm.get('steps') is not None else '?'}"
    syn = finite(arm.get("synthetic_accept"))
    return label + (f" (synthetic a={syn:g})" if syn is not None else "")


def _arm_issues(run: str, arm: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    name = str(arm.get("name") or "?")
    out = []
    if arm.get("status") != "ok":
        out.append((run, name, f"arm did not complete (status {arm.get('status')!r}): "
                               f"{arm.get('reason') or 'no reason recorded'}"))
        return out
    speculative = str(arm.get("method") or "none") != "none"
    steps = arm.get("verify_steps")
    if speculative and steps is not None and not (finite(steps) or 0) > 0:
        out.append((run, name, f"{float(steps):g} verify steps: no speculative cycle measured (cycle and accept length undefined)"))
    al = finite(arm.get("accept_len"))
    if speculative and al is not None and al < 1:
        out.append((run, name, f"accept length {al:g} < 1: impossible (each cycle commits >= 1 token); counters wrong"))
    if finite(arm.get("tok_s")) is None and finite(arm.get("verify_ms")) is None:
        out.append((run, name, "no throughput and no verify time recorded"))
    return out


def record_rows(source: Manifest | Mapping[str, Any], run: str
                ) -> tuple[list[dict[str, Any]], list[tuple[str, str, str]]]:
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
    for i, raw in enumerate(a.model_dump() for a in manifest.arms):
        issues += _arm_issues(run, raw)
        arm = fill_derived(raw) if raw.get("status") == "ok" else dict(raw)
        values = [v for v in (arm.get("tok_s_values") or []) if finite(v)]
        rows.append({
            "source": "record", "run": run, "kind": manifest.kind, "run_status": status,
            "host": host.get("name"), "gpu": _gpu(host), "engine": engine.get("name"),
            "engine_version": _engine_version(engine), "started_at": manifest.started_at,
            "session": arm.get("session") or (manifest.run_id if manifest.run_id != "?" else None) or run,
            "order": arm.get("order") or i + 1,
            "arm": arm.get("name"), "method": arm.get("method") or "none", "status": arm.get("status"),
            "reason": arm.get("reason"), "config": _config(arm), "k": arm.get("steps"),
            "synthetic_accept": arm.get("synthetic_accept"),
            "launch": arm.get("launch") or ("spectrial" if arm.get("argv") else None), "nccl_env": _nccl_env(arm),
            "tok_s": finite(arm.get("tok_s")), "tok_s_min": finite(arm.get("tok_s_min")),
            "tok_s_max": finite(arm.get("tok_s_max")),
            "n_values": len(values) if values else (1 if finite(arm.get("tok_s")) else 0),
            **{c: finite(arm.get(c)) for c in ("ms_per_token", "accept_len", "draft_accept_rate", "cycle_ms",
                                              "verify_ms", "verify_share", "draft_ms_per_cycle", "verify_steps",
                                              "break_even_accept_len", "speedup", "speedup_ci_low",
                                              "speedup_ci_high")},
            "verdict": arm.get("verdict"), "pays": arm.get("pays"),
            "baseline_arm": arm.get("baseline_arm") if arm.get("method", "none") != "none" else None,
            "derived": "; ".join(f"{k} = {v}" for k, v in (arm.get("derived") or {}).items()) or None,
        })
    return rows, issues


# ------------------------------------------------------------------ plain logs
_DATE = re.compile(r"^\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")


def log_rows(logs_dir: str | Path) -> tuple[list[dict[str, Any]], pd.DataFrame, list[tuple[str, str, str]]]:
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
        row: dict[str, Any] = {c: None for c in HISTORY_COLUMNS}
        row.update(source="log", run=rel, kind="log", run_status="ok", engine=str(engines.index[0]),
                   started_at=stamps[0].strip("[") if stamps else None, session=rel, order=1, arm=rel,
                   method="unknown", status="ok", config="log", launch="unknown", nccl_env="unrecorded",
                   derived="medians over the file; launch conditions unknown", baseline_arm=None)
        for col, names in LOG_METRICS.items():
            for n in names:
                if n in df.columns and df[n].notna().any():
                    row[col] = float(pd.to_numeric(df[n], errors="coerce").median())
                    break
        row["n_values"] = 0
        rows.append(row)
    summary = pd.concat(summaries, ignore_index=True) if summaries else pd.DataFrame()
    return rows, summary, issues


# ------------------------------------------------------------------ the table
NOT_ARM_RECORDS = frozenset({"nccl_check"})  # run records without speculative arms: not part of this table


def load_history(runs_dir: str | Path | None = "outputs", logs_dir: str | Path | None = None) -> History:
    """Every run record under ``runs_dir`` (recursively) and every log file under ``logs_dir``, tidy."""
    rows: list[dict[str, Any]] = []
    issues: list[tuple[str, str, str]] = []
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
                except (OSError, ValueError, TypeError) as exc:
                    issues.append((run, "", f"manifest.json unreadable: {exc}"))
                    continue
                if manifest.kind in NOT_ARM_RECORDS:  # e.g. an NCCL check: notebook 00 reads those
                    continue
                r, i = record_rows(manifest, run)
                rows += r
                issues += i
    summary = pd.DataFrame()
    if logs_dir is not None:
        r, summary, i = log_rows(logs_dir)
        rows += r
        issues += i
    table = pd.DataFrame(rows, columns=[*HISTORY_COLUMNS, "baseline_arm"])
    stamps = table["started_at"].where(table["started_at"].astype(str).str.match(_DATE.pattern), None)
    table["started_at"] = pd.to_datetime(stamps, utc=True, errors="coerce", format="ISO8601")
    return History(table=table, issues=pd.DataFrame(issues, columns=["source", "item", "problem"]),
                   log_summary=summary)


# ------------------------------------------------------------------ views
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


def baseline_figure(table: pd.DataFrame) -> go.Figure:
    """Baseline tok/s over time, one line per host and NCCL state, min-max as error bars where recorded."""
    b = baseline_over_time(table)
    fig = go.Figure()
    for (host, env), g in b.groupby(["host", "nccl_env"], sort=False):
        lo = (g["tok_s"] - g["tok_s_min"]).fillna(0).round(4).tolist()
        hi = (g["tok_s_max"] - g["tok_s"]).fillna(0).round(4).tolist()
        fig.add_scatter(x=g["when"].tolist(), y=g["tok_s"].round(4).tolist(), mode="lines+markers",
                        name=f"{host} · NCCL {env}", text=g["arm"].tolist(),
                        error_y={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo})
    fig.update_layout(title="Baseline throughput over time, per host", xaxis_title="run (time order)",
                      yaxis_title="tokens / s", template="plotly_white", height=420,
                      xaxis={"type": "category", "categoryorder": "array",
                             "categoryarray": b["when"].drop_duplicates().tolist()})
    return fig


def matrix_figure(m: pd.DataFrame, title: str, fmt: str = ".1f") -> go.Figure:
    """A heatmap of a :func:`matrix` (empty cells blank), values written in the cells."""
    fig = go.Figure()
    if m.empty:
        fig.update_layout(title=title + " (no data)", template="plotly_white")
        return fig
    ylab = [" · ".join(str(x) for x in (i if isinstance(i, tuple) else (i,))) for i in m.index]
    z = [[None if pd.isna(v) else round(float(v), 4) for v in row] for row in m.to_numpy()]
    text = [["" if v is None else format(v, fmt) for v in row] for row in z]
    fig.add_heatmap(z=z, x=[str(c) for c in m.columns], y=ylab, text=text, texttemplate="%{text}",
                    colorscale="Viridis", hoverongaps=False)
    fig.update_layout(title=title, template="plotly_white", height=max(300, 60 * len(ylab) + 160),
                      yaxis={"autorange": "reversed"}, margin={"l": 360})
    return fig


def _k_text(k: Any) -> str:
    v = finite(k)
    return "none" if v is None else f"{v:g}"


def incomparability(a: Mapping[str, Any] | pd.Series, b: Mapping[str, Any] | pd.Series) -> list[str]:
    """Why two history rows (arms) cannot be compared as they stand; empty when nothing recorded says so."""
    a, b = dict(a), dict(b)
    name_a, name_b = a.get("arm"), b.get("arm")
    why = []
    if a.get("run") != b.get("run") or a.get("session") != b.get("session"):
        why.append(f"different sessions ({a.get('session')} vs {b.get('session')}): separate server starts in "
                   "possibly different system states; neither has a baseline measured beside the other")
    if a.get("launch") != b.get("launch"):
        why.append(f"launched differently ({a.get('launch') or 'not recorded'} vs {b.get('launch') or 'not recorded'})")
    for r, name in ((a, name_a), (b, name_b)):
        if r.get("nccl_env") == "unrecorded":
            why.append(f"{name}: launch environment never recorded, so whether the NCCL variables reached its "
                       "server processes is unknown")
    envs = {a.get("nccl_env"), b.get("nccl_env")}
    if "set, unverified" in envs:
        why.append("NCCL variables set but never verified in the server processes (/proc/<pid>/environ) nor in "
                   "NCCL's own debug output")
    if len(envs - {"unrecorded"}) > 1:
        why.append(f"different NCCL states ({a.get('nccl_env')} vs {b.get('nccl_env')})")
    if a.get("k") != b.get("k") and not (pd.isna(a.get("k")) and pd.isna(b.get("k"))):
        why.append(f"different draft depths (k={_k_text(a.get('k'))} vs k={_k_text(b.get('k'))})")
    for key in ("host", "engine_version"):
        missing = [n for r, n in ((a, name_a), (b, name_b)) if r.get(key) is None]
        if missing:
            why.append(f"{key.replace('_', ' ')} not recorded for {' nor '.join(str(n) for n in missing)}")
        elif a.get(key) != b.get(key):
            why.append(f"different {key.replace('_', ' ')} ({a.get(key)} vs {b.get(key)})")
    if (a.get("n_values") or 0) < 2 or (b.get("n_values") or 0) < 2:
        why.append("single measurements: no spread, so a difference of a few % cannot be told from noise")
    return why
