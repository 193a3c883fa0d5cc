"""Run records: one folder per run under `outputs/<run-id>/` with `manifest.json` and the artifacts.

The manifest is a `spectrial.schema.Manifest` (typed; `spectrial schema` prints its JSON Schema), rewritten
atomically after every step, so an interrupted run still leaves a readable record. Secrets are masked by
name on entry and redacted by value from the whole text on every write.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import io
import json
import os
import re
import secrets as _rnd
import shutil
import stat
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from pydantic import ValidationError

from spectrial import __version__, interrupts
from spectrial.analysis.figures import decide_stale, rederive
from spectrial.analysis.serving import from_frames
from spectrial.errors import ConfigError, RecordDamaged, RecordWriteError
from spectrial.ownership import controller, describe, owner_state
from spectrial.schema import SCHEMA_VERSION, ArmRecord, Manifest, RequestRecord, StepRecord, migrate, utc_now
from spectrial.secrets import mask_mapping, redact

if TYPE_CHECKING:
    from spectrial.params import TrialParams

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
        data = read_manifest_mapping(path)
        as_manifest(data, path)  # a record it cannot parse in full is never written
    except RecordDamaged:
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
    data = _writable_mapping(run)  # a damaged record: RecordDamaged before anything is written into its folder
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)
    if rel not in (data.get("files") or []):
        data["files"] = [*(data.get("files") or []), rel]
        dump_json(run / "manifest.json", data)
    return True


def manifest_json(run_dir: str | Path) -> dict[str, Any]:
    """A run folder's manifest.json as written (a plain mapping, for tools outside spectrial; spectrial's own
    readers take the typed record, `load_record`); a damaged one is RecordDamaged."""
    return read_manifest_mapping(manifest_path(run_dir))


def _writable_mapping(run_dir: str | Path) -> dict[str, Any]:
    """The manifest mapping of a record about to be updated: read and parsed in full first (RecordDamaged when it
    cannot be), so that a damaged record is never rewritten."""
    path = manifest_path(run_dir)
    data = read_manifest_mapping(path)
    as_manifest(data, path)
    return data


def update_manifest(run_dir: str | Path, **fields: Any) -> None:
    """Set top-level fields of a finished run's manifest.json (e.g. the notebook or report it gained), leaving
    every other byte of meaning as it was written; a damaged record is RecordDamaged, and left as it is."""
    data = _writable_mapping(run_dir)
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


# --- reading a record (any schema version; a damaged one is RecordDamaged, never a traceback) -------------------
MAX_RECORD_BYTES = 256 << 20
"""The one cap on a file of a run record (manifest.json, requests.csv, stream.csv, a gpu/ sample, a log the doctor
reads): larger is no record spectrial wrote (the largest committed manifest is 0.25 MB, a stream.csv holds ~50 bytes
per token event), so it is refused before it is read. `SPECTRIAL_MAX_RECORD_BYTES` raises it for a giant run."""
MAX_RECORD_BYTES_ENV = "SPECTRIAL_MAX_RECORD_BYTES"
MAX_CSV_COLUMNS = 4096  # a header row wider than this is not one of spectrial's tables (it writes < 100 columns)
REQUIRED_FIELDS = ("run_id", "status")  # every manifest on disk has them (RunRecord writes them first)
_HINT_REPLACE = "the file is left as it is; restore it from a copy, or move the run folder out of the way"


def record_cap() -> int:
    """The byte cap on one file of a run record: MAX_RECORD_BYTES, or `SPECTRIAL_MAX_RECORD_BYTES` when set."""
    raw = os.environ.get(MAX_RECORD_BYTES_ENV, "").strip()
    if not raw:
        return MAX_RECORD_BYTES
    try:
        cap = int(raw)
    except ValueError:
        cap = 0
    if cap < 1:
        raise ConfigError(f"{MAX_RECORD_BYTES_ENV}: {raw!r} is not a positive number of bytes; unset it (default "
                          f"{MAX_RECORD_BYTES}) or give e.g. {MAX_RECORD_BYTES * 4}", parameter=MAX_RECORD_BYTES_ENV)
    return cap


def compacted(path: str | Path) -> Path:
    """Where a record file's compacted copy lies (`compact_record`): the same name plus `.gz`."""
    p = Path(path)
    return p.with_name(p.name + ".gz")


def record_file_exists(path: str | Path) -> bool:
    """Whether a record holds the file, as written or compacted."""
    return Path(path).exists() or compacted(path).exists()


def read_record_bytes(path: str | Path) -> bytes:
    """The bytes of one file of a run record, read at most up to the cap (`record_cap`). A missing file, a folder,
    a device or a pipe (opened without blocking, never read), an unreadable one or one over the cap is RecordDamaged.
    A file that `compact_record` gzipped is read from `<name>.gz`, its text held to the same cap as it is inflated
    (a gzip bomb stops at the cap; a damaged stream is RecordDamaged)."""
    p = Path(path)
    if not p.exists() and compacted(p).exists():
        return _inflate(compacted(p))
    return _read_capped(p)


def _inflate(gz: Path) -> bytes:
    """The text of a compacted record file, inflated up to the cap."""
    import zlib

    data, cap = _read_capped(gz), record_cap()
    inflater = zlib.decompressobj(wbits=31)  # gzip framing
    try:
        out = inflater.decompress(data, cap + 1)
    except zlib.error as exc:
        raise RecordDamaged(str(gz), f"not a readable gzip file: {exc}", hint=_HINT_REPLACE) from None
    if len(out) > cap:
        raise RecordDamaged(str(gz), f"inflates to more than the cap of {cap} bytes",
                            hint=f"if it is a genuine record of a giant run, raise the cap: {MAX_RECORD_BYTES_ENV}; "
                                 f"else {_HINT_REPLACE}")
    if not inflater.eof:
        raise RecordDamaged(str(gz), f"a gzip stream cut short ({len(data)} bytes read)", hint=_HINT_REPLACE)
    return out


COMPACT_PATTERNS = ("logs/*.log", "logs/**/*.log", "stream.csv")
"""What `compact_record` gzips: the server logs and the token events, three quarters of a committed record's bytes
(the doctor and `read_requests` read them compacted as written)."""

PLOTLYJS_CLASS = "spectrial-plotlyjs"
"""The class of the one ``<script>`` holding plotly.js in an executed notebook's outputs (the figures embed it with
a kernel's first figure; nbval's sanitiser and `compact_record` find it by this class)."""
_PLOTLYJS_RE = re.compile(r'<script type="text/javascript" class="' + PLOTLYJS_CLASS
                          + r'">(?!/\* plotly\.js left out).*?</script>',
                          re.DOTALL)
_PLOTLYJS_LEFT_OUT = (f'<script type="text/javascript" class="{PLOTLYJS_CLASS}">/* plotly.js left out by spectrial '
                      'compact: JupyterLab draws the figures from their JSON, `spectrial report` with its own '
                      'plotly.js */</script>')


def _strip_plotlyjs(nb_path: Path) -> tuple[int, int] | None:
    """The embedded plotly.js (~4.8 MB) of an executed notebook replaced by a placeholder script, in place; the
    bytes before and after, or None when it holds none or is not a notebook's JSON (left as it is). Read through
    the record's capped reader: a notebook over the cap is RecordDamaged, naming the cap's switch."""
    raw = _read_capped(nb_path)
    if PLOTLYJS_CLASS.encode() not in raw:
        return None
    try:
        nb = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        return None
    hits = 0
    for cell in nb["cells"]:
        for out in (cell.get("outputs") or []) if isinstance(cell, dict) else []:
            html = (out.get("data") or {}).get("text/html") if isinstance(out, dict) else None
            if not isinstance(html, (str, list)):
                continue
            text = "".join(html) if isinstance(html, list) else html
            new, n = _PLOTLYJS_RE.subn(_PLOTLYJS_LEFT_OUT, text)
            if n:
                hits += n
                out["data"]["text/html"] = new.splitlines(keepends=True) if isinstance(html, list) else new
    if not hits:
        return None
    packed = (json.dumps(nb, indent=1, ensure_ascii=False) + "\n").encode()
    tmp = nb_path.with_name(nb_path.name + ".tmp")
    tmp.write_bytes(packed)
    os.replace(tmp, nb_path)
    return len(raw), len(packed)


@dataclass
class Compacted:
    """What `compact_record` did to one record: the files gzipped and the bytes before and after."""

    run_dir: Path
    files: list[str]
    before: int
    after: int


def compact_record(run_dir: str | Path) -> Compacted:
    """Gzip a finished record's bulky text (`COMPACT_PATTERNS`) in place, for committing or shipping: each file
    becomes `<name>.gz` (deterministic bytes: no name or time in the header), the manifest's file list follows, and
    every reader of spectrial reads the record as before; its executed notebooks lose their embedded plotly.js
    (a placeholder script says so; their figures' JSON stays). A record still being written (its owner alive) is
    refused; a compacted record is left as it is."""
    import gzip

    run = Path(run_dir)
    data = read_manifest_mapping(run / "manifest.json")  # RecordDamaged when it is not a record
    if data.get("status") == "running":
        raise ConfigError(f"{run}: the record is {data.get('status')}; compact it once its run has finished")
    names = sorted({q.relative_to(run).as_posix() for pat in COMPACT_PATTERNS for q in run.glob(pat) if q.is_file()})
    before = after = 0
    for name in names:
        src = run / name
        raw = src.read_bytes()
        packed = gzip.compress(raw, compresslevel=9, mtime=0)
        tmp = compacted(src).with_name(compacted(src).name + ".tmp")
        tmp.write_bytes(packed)
        os.replace(tmp, compacted(src))
        src.unlink()
        before, after = before + len(raw), after + len(packed)
    for nb_path in sorted(run.glob("*.ipynb")):
        if (sizes := _strip_plotlyjs(nb_path)) is not None:
            names.append(nb_path.name + " (plotly.js left out)")
            before, after = before + sizes[0], after + sizes[1]
    if names and isinstance(data.get("files"), list):
        data["files"] = [f + ".gz" if f in names else f for f in data["files"]]
        dump_json(run / "manifest.json", data)
    return Compacted(run, names, before, after)


def _read_capped(p: Path) -> bytes:
    unreadable = "check the file's permissions and its disk"
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)  # a pipe named like a record file would block a plain open
    except FileNotFoundError:
        where = "no such folder" if not p.parent.is_dir() else f"the folder holds no {p.name}"
        raise RecordDamaged(str(p), f"missing: {where}", hint=f"pass a run folder (e.g. outputs/<run-id>) that holds "
                                                              f"{p.name}, or restore the file from a copy") from None
    except OSError as exc:
        raise RecordDamaged(str(p), f"cannot be read: {exc.strerror or exc}", hint=unreadable) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RecordDamaged(str(p), "not a regular file (a folder, a device or a pipe)", hint=_HINT_REPLACE)
        cap = record_cap()
        too_big = RecordDamaged(str(p), f"too large to be a record file: {st.st_size} bytes, over the cap of {cap} "
                                        "bytes", hint=f"if it is a genuine record of a giant run, raise the cap: "
                                                      f"{MAX_RECORD_BYTES_ENV}={max(cap, st.st_size) * 2}; else "
                                                      f"{_HINT_REPLACE}")
        if st.st_size > cap:
            raise too_big
        chunks, size = [], 0
        while size <= cap and (chunk := os.read(fd, min(cap + 1 - size, 16 << 20))):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise RecordDamaged(str(p), f"cannot be read: {exc.strerror or exc}", hint=unreadable) from None
    finally:
        os.close(fd)
    if size > cap:  # it grew while being read
        raise too_big
    return b"".join(chunks)


def _text(path: str | Path, data: bytes) -> str:
    """UTF-8 text of a record file; NUL bytes (the zero-filled tail a crash leaves) or invalid UTF-8 are damage."""
    nul = data.find(b"\x00")
    if nul >= 0:
        raise RecordDamaged(str(path), f"binary: a NUL byte at offset {nul} of {len(data)} (a file cut short by a "
                                       "crash is often zero-filled)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordDamaged(str(path), f"binary: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                                       f"{exc.start} of {len(data)})") from None


def _json_kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


_PARTIAL_NUMBER = re.compile(r"-?\d*(?:\.\d*)?(?:[eE][-+]?)?")  # a number's start, or the tail after its digits
_PARTIAL_ESCAPE = re.compile(r"u[0-9a-fA-F]{0,4}(?:\\u?[0-9a-fA-F]{0,3})?")  # a \uXXXX escape (or a pair) cut short
_LITERALS = ("null", "true", "false", "NaN", "Infinity", "-Infinity")


def _cut_token(rest: str) -> bool:
    """Whether the JSON's tail from its error on is a literal or number cut short (`"budget": nu`, `1.`)."""
    rest = rest.rstrip()
    return bool(rest) and (any(w.startswith(rest) for w in _LITERALS) or bool(_PARTIAL_NUMBER.fullmatch(rest))
                           or bool(_PARTIAL_ESCAPE.fullmatch(rest)))


def read_json_file(path: str | Path) -> Any:
    """One JSON file of a run record, parsed; truncated, binary, empty, invalid or over-deep JSON is RecordDamaged."""
    data = read_record_bytes(path)
    text = _text(path, data)
    if not text.strip():
        raise RecordDamaged(str(path), f"empty: {len(data)} bytes and no JSON (a file cut short before its first "
                                       "write)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Unterminated string") or exc.pos >= len(text.rstrip()) or _cut_token(text[exc.pos:]):
            problem = (f"truncated: the JSON stops after {len(data)} bytes, before it is complete ({exc.msg}: line "
                       f"{exc.lineno} column {exc.colno})")
        else:
            problem = f"not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})"
        raise RecordDamaged(str(path), problem) from None
    except RecursionError:
        raise RecordDamaged(str(path), "JSON nested too deeply to be a record") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise RecordDamaged(str(path), f"not readable JSON: {exc}") from None


def schema_version_of(source: Mapping[str, Any], where: str = "manifest") -> int:
    """A manifest mapping's schema version (1 when absent); a version that is no whole number, or one newer than
    this spectrial reads, is RecordDamaged naming both numbers."""
    v = source.get("schema_version")
    if v is None:
        return 1
    if isinstance(v, str) and re.fullmatch(r"[0-9]{1,9}", v.strip()):  # not str.isdigit: '²' is a digit int() refuses
        v = int(v.strip())  # stripped: str.strip drops characters int() does not ('\x1f')
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise RecordDamaged(where, f"schema_version {str(v)[:40]!r} is not a version number (1 to {SCHEMA_VERSION})")
    if v > SCHEMA_VERSION:
        by = source.get("spectrial_version")
        writer = f"spectrial {str(by)[:40]}" if by else "a spectrial of unknown version"
        raise RecordDamaged(where, f"written in schema version {v} (by {writer}); this spectrial {__version__} reads "
                                   f"schema versions 1 to {SCHEMA_VERSION}",
                            hint="read it with a newer spectrial (pip install -U spectrial); the file is left as it is")
    return v


def _validation_problem(exc: ValidationError) -> str:
    errs = exc.errors()
    shown = []
    for e in errs[:3]:
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        got = e.get("input")
        shown.append(f"{loc}: {e['msg']}" + ("" if isinstance(got, dict | list) else f" (got {str(got)[:40]!r})"))
    more = f"; and {len(errs) - 3} more" if len(errs) > 3 else ""
    return "fields missing or of the wrong type: " + "; ".join(shown) + more


def as_manifest(source: Manifest | Mapping[str, Any], path: str | Path | None = None) -> Manifest:
    """A Manifest from a Manifest or a manifest mapping of any version (`path` names it in errors). What cannot be
    one (not a mapping, a future schema, fields of the wrong type) is RecordDamaged."""
    if isinstance(source, Manifest):
        return source
    where = str(path) if path is not None else "manifest"
    if not isinstance(source, Mapping):
        raise RecordDamaged(where, f"not a JSON object but {_json_kind(source)}: a manifest is an object of named "
                                   "fields")
    version = schema_version_of(source, where)
    try:
        data = migrate({**source, "schema_version": version})
        data.setdefault("run_id", "?")
        m = Manifest.model_validate(data)
        if version < 3 or decide_stale(m):
            m = rederive(m)  # figures derive from this schema (a decide run's speed-up: its sequence's estimate)
    except ValidationError as exc:
        raise RecordDamaged(where, _validation_problem(exc)) from None
    except RecursionError:
        raise RecordDamaged(where, "nested too deeply to be a record") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ArithmeticError) as exc:
        raise RecordDamaged(where, f"fields of the wrong type: {type(exc).__name__}: {str(exc)[:200]}") from None
    return m


def read_manifest_mapping(path: str | Path) -> dict[str, Any]:
    """A manifest.json file as written (a plain mapping), checked: JSON, an object, with the fields every record
    has, of a schema this spectrial reads. Anything else is RecordDamaged."""
    data = read_json_file(path)
    if not isinstance(data, dict):
        raise RecordDamaged(str(path), f"not a JSON object but {_json_kind(data)}: a manifest is an object of named "
                                       "fields")
    missing = [k for k in REQUIRED_FIELDS if k not in data]
    if missing:
        raise RecordDamaged(str(path), f"missing required field(s): {', '.join(missing)} (every run record has "
                                       f"{', '.join(REQUIRED_FIELDS)})")
    bad = [k for k in REQUIRED_FIELDS if not isinstance(data[k], str) or not data[k]]
    if bad:
        raise RecordDamaged(str(path), "; ".join(f"{k} is {_json_kind(data[k])} ({str(data[k])[:40]!r}), not a "
                                                 "non-empty text" for k in bad))
    schema_version_of(data, str(path))
    return data


def read_manifest(path: str | Path) -> Manifest:
    """A manifest.json file (anywhere: a committed golden record too), typed; damage is RecordDamaged."""
    return as_manifest(read_manifest_mapping(path), path)


def manifest_path(run: str | Path) -> Path:
    """The manifest.json of a run folder (or the file itself when `run` names one)."""
    p = Path(run)
    return p if p.name == "manifest.json" and not p.is_dir() else p / "manifest.json"


def as_arms(source: Manifest | Mapping[str, Any] | Sequence[Any]) -> list[ArmRecord]:
    """The arms of a manifest, or a list of arm records/mappings, as ArmRecords (non-mappings dropped)."""
    if isinstance(source, Manifest):
        return list(source.arms)
    if isinstance(source, Mapping):
        return as_manifest(source).arms
    return [a if isinstance(a, ArmRecord) else ArmRecord.model_validate(a) for a in source
            if isinstance(a, ArmRecord | Mapping)]


def load_record(run_dir: str | Path, settle: bool = True) -> Manifest:
    """A run folder's manifest.json, typed (any schema version); damage of any kind is RecordDamaged naming the file
    and what is wrong. A record still `running` whose controlling process is gone is marked failed first
    ("abandoned", `settle_record`) unless `settle` is False; a record that cannot be parsed is never written."""
    path = manifest_path(run_dir)
    m = read_manifest(path)
    if settle and m.status in ("running", "pending") and m.controller and settle_record(path.parent):
        m = read_manifest(path)
    return m


def trial_params(m: Manifest, where: str | None = None) -> TrialParams:
    """A record's params as the trial model validates them (`spectrial.params.TrialParams`: every field checked,
    every default filled): the one place a recorded run's params become the full trial model, for the readers that
    need it (diff, the sweep replayer). Params that model does not accept (a hand-made or much older record, a
    sweep's or an NCCL check's params) are ConfigError naming `where` (default: the run)."""
    from spectrial.params import validate

    return validate(m.params.as_dict(), where or f"the params of run {m.run_id}")


@dataclass
class Skipped:
    """A record a reader of many records left out: its folder and why (RecordDamaged)."""

    run: Path
    error: RecordDamaged

    def line(self) -> str:
        return f"skipped damaged record {self.run}: {self.error.problem}"


def load_records(runs: Iterable[str | Path], settle: bool = True
                 ) -> Iterator[tuple[Path, Manifest | None, Skipped | None]]:
    """Each run folder's record, in order, as (folder, manifest, None), or (folder, None, Skipped) for a damaged one:
    readers of many records go on past it and say which and why."""
    for run in runs:
        try:
            yield Path(run), load_record(run, settle=settle), None
        except RecordDamaged as exc:
            yield Path(run), None, Skipped(Path(run), exc)


# --- the tables of a run folder (requests.csv, stream.csv, gpu/*.csv, ...) ------------------------------------------
def read_table(path: str | Path, columns: Sequence[str] = (), **read_csv: Any) -> pd.DataFrame:
    """A CSV file of a run record (up to the cap); binary, empty, unparseable, absurdly wide or missing one of
    `columns` is RecordDamaged. `read_csv` goes to pandas.read_csv."""
    data = read_record_bytes(path)
    _text(path, data)
    header = data[:data.find(b"\n")] if b"\n" in data else data
    if header.count(b",") >= MAX_CSV_COLUMNS:
        raise RecordDamaged(str(path), f"not one of spectrial's tables: a header row of {header.count(b',') + 1} "
                                       f"columns (at most {MAX_CSV_COLUMNS})")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pd.errors.ParserWarning)
            warnings.simplefilter("ignore", pd.errors.DtypeWarning)
            frame = pd.read_csv(io.BytesIO(data), **read_csv)
    except pd.errors.EmptyDataError:
        raise RecordDamaged(str(path), f"empty: {len(data)} bytes and no header row") from None
    except (pd.errors.ParserError, ValueError, UnicodeError, csv.Error, OverflowError, IndexError) as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise RecordDamaged(str(path), f"not a readable CSV table: {first}") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise RecordDamaged(str(path), f"no column {', '.join(missing)} (its header: "
                                       f"{', '.join(map(str, frame.columns[:8]))}{', ...' if len(frame.columns) > 8 else ''})")
    return frame


def read_requests(run_dir: str | Path, key: str = "arm") -> dict[str, list[RequestRecord]]:
    """The measured requests of a run folder by arm (or `key`), with their stream events where stream.csv exists;
    {} without requests.csv. A damaged requests.csv or stream.csv is RecordDamaged."""
    run = Path(run_dir)
    path = run / "requests.csv"
    if not path.exists():
        return {}
    reqs = read_table(path, columns=("arm",))
    events_path = run / "stream.csv"
    events = (read_table(events_path, columns=("event", "t_ms", "tokens")) if record_file_exists(events_path)
              else None)
    try:
        records = from_frames(reqs, events)
    except ValidationError as exc:
        raise RecordDamaged(str(path), "rows that are not requests: " + _validation_problem(exc).split(": ", 1)[1]
                            ) from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ArithmeticError) as exc:
        where = events_path if events is not None else path
        raise RecordDamaged(str(where), f"rows that are not requests: {type(exc).__name__}: {str(exc)[:200]}"
                            ) from None
    out: dict[str, list[RequestRecord]] = {}
    for r in records:
        if r.phase == "measure":
            out.setdefault(str(r.get(key) or r.arm), []).append(r)
    return out
