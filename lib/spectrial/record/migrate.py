"""`spectrial migrate RUN_DIR...`: rewrite run records written by an older spectrial in the current schema.

Loading any record already migrates it in memory (`spectrial.schema.as_manifest`: old field names, and from
schema 3 every comparison re-derived by `spectrial.analysis.figures.rederive`; a decide run's record whose speed-up was
the ratio of pooled medians beside its sequence's interval gets the sequence's estimate); this writes the result
back, so that tools reading manifest.json without spectrial see the same numbers, and adds what the run folder
still allows: the serving figures of each arm (or sweep point) from its requests.csv (and stream.csv where there
is one).
The file as it was is kept beside it as `manifest.v<N>.json` (`manifest.v<N>.<k>.json` when that name already holds
other bytes): every rewrite keeps a copy of what it replaces. A damaged record (RecordDamaged: truncated, binary, a
future schema, a broken requests.csv) is never written: `migrate_all` skips it, says which and why, and goes on.
"""

from __future__ import annotations

import filecmp
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from spectrial.analysis.figures import decide_stale
from spectrial.errors import ConfigError, RecordDamaged
from spectrial.record.store import as_manifest, dump_json, list_runs, read_manifest_mapping, read_requests
from spectrial.schema import SCHEMA_VERSION, ArmRecord, Manifest


def _with_serving(m: Manifest, run: Path) -> Manifest:
    """Arms (and points) without serving figures get them from the folder's requests."""
    from spectrial.analysis import serving

    key = "point" if m.points else "arm"
    by = read_requests(run, key=key)
    if not by:
        return m
    conc = m.params.concurrency if "concurrency" in m.params else (m.params.trial or {}).get("concurrency")
    level = float(m.params.confidence or 0.95)

    def fill(a: ArmRecord) -> ArmRecord:
        ident = getattr(a, "id", None) or a.get("id") or a.name
        reqs = [r for r in by.get(str(ident), []) if r.ok]
        if a.serving is not None or a.status != "ok" or not reqs:
            return a
        sv = serving.serving_figures(reqs, expected_tokens_per_chunk=a.accept_len if a.speculative else 1.0,
                                     concurrency=conc if isinstance(conc, int) else None, level=level)
        return a.model_copy(update={"serving": sv, "ttft_ms": sv.ttft_ms.p50 if sv.ttft_ms else None,
                                    "itl_ms": sv.itl_ms.p50 if sv.itl_ms else None})

    return m.model_copy(update={"arms": [fill(a) for a in m.arms], "points": [fill(p) for p in m.points]})


def migrate_run(run_dir: str | Path) -> str:
    """Rewrite one run folder's manifest.json in the current schema (a no-op when it already is); returns what
    was done, in a few words."""
    run = Path(run_dir)
    path = run / "manifest.json"
    if not path.is_file():
        raise ConfigError(f"RUN_DIR: {run} holds no manifest.json; pass a run folder, e.g. outputs/<run-id>",
                          parameter="RUN_DIR")
    raw = read_manifest_mapping(path)  # damaged: RecordDamaged, and nothing is written
    version = int(raw.get("schema_version") or 1)
    current = as_manifest(raw, path)
    stale = version >= SCHEMA_VERSION and decide_stale(Manifest.model_validate({"run_id": "?", **raw}))
    if version >= SCHEMA_VERSION and not stale:
        return f"{run}: already schema {version}"
    m = _with_serving(current, run)
    backup = keep_copy(path, f"manifest.v{version}")
    dump_json(path, m.model_dump(mode="python", serialize_as_any=True))
    if stale:
        return (f"{run}: schema {version}, a decide run's speed-up -> its sequence's estimate, the same pair as its "
                f"interval (the old file: {backup.name})")
    return f"{run}: schema {version} -> {SCHEMA_VERSION} (the old file: {backup.name})"


def keep_copy(path: Path, stem: str) -> Path:
    """Copy `path` to `<stem>.json` beside it before it is replaced; when that name already holds other bytes (an
    earlier migration's copy), to `<stem>.1.json`, `<stem>.2.json`, ...: no copy is ever overwritten. Returns the
    copy (an existing identical one is reused)."""
    for k in range(10_000):
        backup = path.with_name(f"{stem}.json" if k == 0 else f"{stem}.{k}.json")
        if not backup.exists():
            shutil.copy2(path, backup)
            return backup
        if filecmp.cmp(path, backup, shallow=False):
            return backup
    raise ConfigError(f"{path.parent}: 10000 copies named {stem}.*.json already; move old copies away",
                      parameter="RUN_DIR")


@dataclass
class Migrated:
    """What `migrate_all` did: one line per record migrated (or already current), and the damaged ones it skipped."""

    lines: list[str] = field(default_factory=list)
    damaged: list[RecordDamaged] = field(default_factory=list)


def migrate_all(paths: list[Path]) -> Migrated:
    """Every run folder under each path (a run folder itself, or a folder of them); a damaged record is skipped
    (in `damaged`, untouched) and the others are migrated."""
    runs: list[Path] = []
    for p in paths:
        runs += [p] if (p / "manifest.json").is_file() else list_runs(p)
    if not runs:
        raise ConfigError(f"no run record (manifest.json) under {', '.join(map(str, paths))}", parameter="RUN_DIR")
    out = Migrated()
    for r in runs:
        try:
            out.lines.append(migrate_run(r))
        except RecordDamaged as exc:
            out.damaged.append(exc)
    return out
