"""Run records: one folder per run under `outputs/<run-id>/` with `manifest.json` and the artifacts.

The manifest is a `spectrial.schema.Manifest` (typed; `spectrial schema` prints its JSON Schema), rewritten
atomically after every step, so an interrupted run still leaves a readable record. Secrets are masked by
name on entry and redacted by value from the whole text on every write.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import secrets as _rnd
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from spectrial import __version__, interrupts
from spectrial.errors import RecordWriteError
from spectrial.figures import decide_stale, rederive
from spectrial.ownership import controller, describe, owner_state
from spectrial.schema import ArmRecord, Manifest, StepRecord, migrate, utc_now
from spectrial.secrets import mask_mapping, redact

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def new_run_id(name: str) -> str:
    """`YYYYmmdd-HHMMSS-<name>-<4 hex>`: sortable, readable, unique."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{_SAFE.sub('-', name).strip('-')[:40] or 'run'}-{_rnd.token_hex(2)}"


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and obj != obj:  # NaN -> null
        return None
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    return str(obj)


def _clean(obj: Any) -> Any:
    if isinstance(obj, float):
        return None if obj != obj or obj in (float("inf"), float("-inf")) else obj
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def write_error(path: Path, exc: OSError) -> RecordWriteError:
    """A record file that could not be written (a full disk, a read-only or vanished folder): what, where, how
    much room is left, what to do."""
    folder = path.parent
    try:
        free = f"{shutil.disk_usage(folder).free / 2**20:.1f} MiB free there"
    except OSError:
        free = "the folder cannot be inspected"
    return RecordWriteError(f"cannot write the run record file {path}: {exc.strerror or exc} ({free})",
                             resource="disk", hint=f"free space in {folder} or set output_dir to another folder; "
                                                   "the servers were stopped")


def _atomic(path: Path, write: Callable[[Path], None]) -> None:
    """write(tmp) then rename over `path`; on any error the temp file is removed (no litter) and an OSError
    becomes `write_error`."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_error(path, exc) from exc
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def dump_json(path: Path, data: Any, redact_values: list[str] | None = None) -> None:
    """Write JSON atomically (temp file + rename), NaN/inf as null, secret values redacted; a failed write leaves
    the previous file and no temp file, and raises RecordWriteError."""
    text = json.dumps(_clean(json.loads(json.dumps(data, default=_jsonable))), indent=2) + "\n"
    if redact_values:
        text = redact(text, [json.dumps(v)[1:-1] for v in redact_values] + list(redact_values))
    _atomic(path, lambda tmp: tmp.write_text(text))


class RunRecord:
    """A run folder and its typed manifest; every change is written through immediately."""

    def __init__(self, output_dir: str | Path, name: str, kind: str = "trial", run_id: str | None = None,
                 params: Any = None) -> None:
        self.run_id = run_id or new_run_id(name)
        self.dir = Path(output_dir).expanduser().resolve() / self.run_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.secrets: list[str] = []
        self.manifest = Manifest(
            run_id=self.run_id, name=name, kind=kind, started_at=utc_now(), spectrial_version=__version__,
            controller=controller(),
            params=mask_mapping(params.model_dump(mode="json") if hasattr(params, "model_dump") else params or {}))
        self.save()

    @property
    def manifest_path(self) -> Path:
        return self.dir / "manifest.json"

    def save(self) -> None:
        """Write the manifest; user-supplied parts were masked by name on entry, and every known secret
        value is redacted from the whole text here (so a secret can leak through no field)."""
        dump_json(self.manifest_path, self.manifest.model_dump(mode="python", serialize_as_any=True),
                  redact_values=self.secrets)

    def set(self, **fields: Any) -> None:
        """Set top-level manifest fields (declared or not) and write."""
        for k, v in fields.items():
            setattr(self.manifest, k, v)
        self.save()

    def add_secrets(self, values: list[str]) -> None:
        self.secrets = sorted(set(self.secrets) | set(values))

    @contextlib.contextmanager
    def step(self, name: str, **info: Any) -> Iterator[StepRecord]:
        """Time a protocol step; the step is recorded (ok or with its error) even when it raises."""
        entry = StepRecord(name=name, started_at=utc_now(), **info)
        self.manifest.steps.append(entry)
        t0 = time.monotonic()
        try:
            self.save()  # a run killed inside the step still shows where it was (inside the try: an interrupt
            yield entry  # that lands in this save still closes the step)
            entry.ok = True
        except BaseException as exc:
            entry.ok = False
            entry.error = f"{type(exc).__name__}: {redact(str(exc), self.secrets)}"[:4000]
            raise
        finally:
            entry.elapsed_s = round(time.monotonic() - t0, 4)
            self.save()

    def add_file(self, rel: str | Path) -> Path:
        rel = str(rel)
        if rel not in self.manifest.files:
            self.manifest.files.append(rel)
        return self.dir / rel

    def write_text(self, rel: str, text: str) -> Path:
        """Write an artifact with secrets redacted (atomically); returns its path."""
        path = self.add_file(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = redact(text, self.secrets)
        _atomic(path, lambda tmp: tmp.write_text(body))
        self.save()
        return path

    def write_table(self, rel: str, rows: list[Any]) -> Path | None:
        """Write records (pydantic models or mappings) as a CSV artifact; nothing when there are none."""
        if not rows:
            return None
        path = self.add_file(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        frame = pd.DataFrame([r.model_dump() if hasattr(r, "model_dump") else dict(r) for r in rows])
        _atomic(path, lambda tmp: frame.to_csv(tmp, index=False))
        self.save()
        return path

    def write_frame(self, rel: str, frame: pd.DataFrame) -> Path:
        """Write a table as a CSV artifact (atomically: a full disk leaves the old file, not half a new one)."""
        path = self.add_file(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic(path, lambda tmp: frame.to_csv(tmp, index=False))
        self.save()
        return path

    def finish(self, status: str, reason: str | None = None, best_effort: bool = False) -> None:
        """Set the run's final status and reason and write the record; with `best_effort` (a run already stopping
        on another error) a record that cannot be written is reported on stderr instead of raised. Interrupts wait
        for the write: a final status set in memory but not yet on disk would leave the record `running` there."""
        with interrupts.deferred():
            self.manifest.status = status
            self.manifest.reason = redact(reason, self.secrets) if reason else None
            self.manifest.finished_at = utc_now()
            try:
                self.save()
            except RecordWriteError as exc:
                if not best_effort:
                    raise
                print(f"spectrial: the record could not be completed: {exc}", file=sys.stderr)


    def abandon(self, exc: BaseException) -> None:
        """The run stopped on `exc` (an interrupt, an error) before its own step marked it: a record still running
        (or pending) says failed and why; a final one is left as it is."""
        if self.manifest.status in ("pending", "running"):
            self.finish("failed", interrupts.describe(exc), best_effort=True)


@contextlib.contextmanager
def opened(make: Callable[[], Any]) -> Iterator[Any]:
    """Create a run's record, or what drives it (`make()` returns a RunRecord, a Trial, a sweep: anything with
    `abandon(exc)`), with SIGINT / SIGTERM / SIGHUP held, so that no interrupt lands between the first write of a
    `running` manifest and the guard; anything that escapes the block, that held interrupt included, leaves the
    record failed and why (`abandon`: a record already final is left as it is)."""
    made: list[Any] = []
    try:
        with interrupts.deferred():
            made.append(make())
        yield made[0]
    except BaseException as exc:
        if made:
            made[0].abandon(exc)
        raise


def settle_record(run_dir: str | Path, reason: str | None = None) -> str | None:
    """Mark a record `failed` when it still says running (or pending) but the process that drove it is gone
    (a SIGKILL, a dead kernel, a killed papermill, a reboot): the run, its starts and arms still running, each
    with the reason "abandoned: process N on H gone". Returns what was done (None: nothing to do — final already,
    or its controller alive or on another machine)."""
    path = Path(run_dir) / "manifest.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("status") not in ("running", "pending"):
        return None
    owner = data.get("controller")
    if owner_state(owner) != "gone":
        return None
    why = f"abandoned: {describe(owner)} that drove it is gone" + (f"; {reason}" if reason else "")
    data.update(status="failed", reason=why, finished_at=data.get("finished_at") or utc_now())
    for key in ("starts", "arms", "points"):
        for item in data.get(key) or []:
            if isinstance(item, dict) and item.get("status") in ("running", "pending"):
                item.update(status="failed", reason=why)
    dump_json(path, data)
    return f"record marked failed ({why})"


def add_log_to_record(run_dir: str | Path, rel: str, text: str) -> bool:
    """Copy a server log into a finished (or abandoned) run folder, unless it holds that file already; listed in
    the manifest's files. Returns whether it was written."""
    run = Path(run_dir)
    dest = run / rel
    if dest.exists():
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)
    data = manifest_json(run)
    if rel not in (data.get("files") or []):
        data["files"] = [*(data.get("files") or []), rel]
        dump_json(run / "manifest.json", data)
    return True


def manifest_json(run_dir: str | Path) -> dict[str, Any]:
    """A run folder's manifest.json as written (a plain mapping, for tools outside spectrial; spectrial's own
    readers take the typed record, `spectrial.schema.load_record`)."""
    return json.loads((Path(run_dir) / "manifest.json").read_text())


def update_manifest(run_dir: str | Path, **fields: Any) -> None:
    """Set top-level fields of a finished run's manifest.json (e.g. the notebook or report it gained), leaving
    every other byte of meaning as it was written."""
    data = manifest_json(run_dir)
    data.update(fields)
    dump_json(Path(run_dir) / "manifest.json", data)


def list_runs(output_dir: str | Path) -> list[Path]:
    """Run folders (those with a manifest) under `output_dir`, recursively, oldest first."""
    root = Path(output_dir)
    return sorted((p.parent for p in root.rglob("manifest.json")), key=lambda p: p.name)


@dataclass
class RunResult:
    """What a run produced: its folder, its manifest and the per-request rows (trials and sweeps)."""

    run_dir: Path
    manifest: Manifest
    requests: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def status(self) -> str:
        return self.manifest.status


# --- reading a record (any schema version) -------------------------------------------------------------------
def as_manifest(source: Manifest | Mapping[str, Any]) -> Manifest:
    """A Manifest from a Manifest or a manifest mapping of any version."""
    if isinstance(source, Manifest):
        return source
    version = int(source.get("schema_version") or 1)
    data = migrate(source)
    data.setdefault("run_id", "?")
    m = Manifest.model_validate(data)
    if version < 3 or decide_stale(m):
        m = rederive(m)  # figures derive from this schema (a decide run's speed-up: its sequence's estimate)
    return m


def as_arms(source: Manifest | Mapping[str, Any] | Sequence[Any]) -> list[ArmRecord]:
    """The arms of a manifest, or a list of arm records/mappings, as ArmRecords (non-mappings dropped)."""
    if isinstance(source, Manifest):
        return list(source.arms)
    if isinstance(source, Mapping):
        return as_manifest(source).arms
    return [a if isinstance(a, ArmRecord) else ArmRecord.model_validate(a) for a in source
            if isinstance(a, ArmRecord | Mapping)]


def load_record(run_dir: str | Path, settle: bool = True) -> Manifest:
    """A run folder's manifest.json, typed (any schema version). A record still `running` whose controlling
    process is gone is marked failed first ("abandoned", `settle_record`) unless `settle` is False."""
    path = Path(run_dir) / "manifest.json"
    m = as_manifest(json.loads(path.read_text()))
    if settle and m.status in ("running", "pending") and m.controller and settle_record(Path(run_dir)):
        m = as_manifest(json.loads(path.read_text()))
    return m
