"""Provision SSH hosts from this machine: what is built or written here is uploaded into the host's cache.

The host's cache (`ssh.cache_dir`, default `~/.cache/spectrial` on the host) mirrors the local one
(`spectrial.engines.llamacpp_build.cache_root()`): `llama.cpp/bin/<key>/llama-server` here is
`<host cache>/llama.cpp/bin/<key>/llama-server` there, tiny models likewise. An upload is skipped when the
file there already has the same size and hash (`fingerprint.file_identity`, hashing the whole file up to
128 MiB and head + tail beyond; the local and the remote hash are computed at the same time). Uploads are
atomic and user-only (`Host.put`); free space is checked first, so a full disk is a clear error and never
leaves a half-written file under the final name.

`prune_run_dirs(host, work_dir)` keeps the host's run folders (server logs per run, `work_dir/<run id>`) within
a bound: the newest `keep` and at most `max_bytes` in all; it removes only folders named like a run id that
spectrial made, never the current run's, never one written to in the last `busy_s` (a run still going).
"""

from __future__ import annotations

import hashlib
import math
import platform
import re
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from spectrial.errors import ConfigError
from spectrial.hosts.fingerprint import file_identity
from spectrial.hosts.local import Host, LocalHost
from spectrial.schema import FileIdentity, Upload

MAX_IDENTITY_CHUNK = 64 * 2**20
UPLOAD_MARGIN_BYTES = 4 * 2**20
RUN_DIR_RE = re.compile(r"^\d{8}-\d{6}-[A-Za-z0-9._-]+-[0-9a-f]{4}$")  # records.new_run_id
KEEP_RUN_DIRS = 20
MAX_RUN_DIR_BYTES = 2 * 2**30
BUSY_S = 600.0
# one round trip: for each folder directly under the work dir whose name looks like a run id (checked again
# in Python), its size in KiB, the newest mtime inside it (whole seconds) and its name; no symlinks followed
_LIST_RUN_DIRS = (
    "cd -- {work} 2>/dev/null || exit 0; now=$(date +%s); echo \"now $now\"; "
    "find . -mindepth 1 -maxdepth 1 -type d "
    "-name '[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]-[0-9][0-9][0-9][0-9][0-9][0-9]-*' "
    "| while IFS= read -r d; do d=${{d#./}}; "
    "s=$(du -sk -- \"$d\" 2>/dev/null | cut -f1); "
    "m=$(find \"$d\" -printf '%T@\\n' 2>/dev/null | sort -n | tail -n 1); "
    "printf '%s %s %s\\n' \"${{s:-0}}\" \"${{m%.*}}\" \"$d\"; done"
)


def check_same_arch(host: Host, what: str = "engine_bin") -> str:
    """The host's `uname -m`; ConfigError when it differs from this machine's (binaries built here won't run)."""
    remote = host.run(["uname", "-m"], rerun_if_lost=True).stdout.strip()
    local = platform.machine()
    if remote != local:
        raise ConfigError(f"{what}: 'auto' uploads the llama.cpp build of this machine ({local}) but "
                          f"{host.name} is {remote}; build it there (`spectrial provision llama-server` on the "
                          "host) and give engine_bin: PATH of its llama-server")
    return remote


def host_cache_root(host: Host, cache_dir: str) -> str:
    """The host's cache folder, `~` expanded on the host."""
    return host.expand(cache_dir).rstrip("/") or "/"


def mirror_path(local: Path, host_cache: str) -> str:
    """Where `local` (a file of the local cache, or any file) goes in the host's cache."""
    from spectrial.cache import cache_root

    resolved = local.resolve()
    try:
        rel = resolved.relative_to(cache_root().resolve())
    except ValueError:  # not from the cache: keep files of the same name apart by their folder
        digest = hashlib.sha256(str(resolved.parent).encode()).hexdigest()[:12]
        rel = Path("files") / digest / resolved.name
    return f"{host_cache}/{rel.as_posix()}"


def identity_chunk(size: int) -> int:
    """Bytes hashed at each end: the whole file up to 2 x 64 MiB, head and tail beyond."""
    return min(MAX_IDENTITY_CHUNK, max(1 << 20, math.ceil(size / 2)))


def _same(a: FileIdentity, b: FileIdentity) -> bool:
    return a.error is None and b.error is None and a.size == b.size and a.head_tail_sha256 == b.head_tail_sha256


def sync_file(host: Host, local: Path, remote: str, mode: int = 0o600, what: str = "ssh.cache_dir"
              ) -> Upload:
    """Upload `local` to `remote` on `host` unless an identical file is there; returns what happened.

    `what` names the parameter to change when the host's disk is too small.
    """
    if not local.is_file():
        raise ConfigError(f"{what}: {local} is missing on this machine, nothing to upload")
    size = local.stat().st_size
    chunk = identity_chunk(size)
    with ThreadPoolExecutor(1, thread_name_prefix="spectrial-hash") as pool:  # both ends hash at once
        local_hash = pool.submit(file_identity, LocalHost(), str(local), chunk)
        theirs = file_identity(host, remote, chunk)
        mine = local_hash.result()
    out = Upload(host=host.name, local=str(local), path=remote, bytes=size, uploaded=False, seconds=0.0)
    if _same(mine, theirs):
        return out
    parent = remote.rsplit("/", 1)[0] or "/"
    host.require_free_space({parent: size + UPLOAD_MARGIN_BYTES}, what)
    host.mkdir(parent)
    t0 = time.monotonic()
    host.put(local, remote, mode)
    out.uploaded, out.seconds = True, round(time.monotonic() - t0, 3)
    return out


def check_runs(host: Host, binary: str, flag: str = "--version") -> None:
    """Run `binary FLAG` on the host; ConfigError naming the loader's complaint when it cannot start."""
    res = host.run([binary, flag], check=False, timeout=60)
    text = (res.stderr + res.stdout).strip()
    if res.exit_code in (126, 127) or "error while loading shared libraries" in text or "GLIBC" in text:
        raise ConfigError(f"engine_bin: the uploaded {binary} does not start on {host.name} (exit "
                          f"{res.exit_code}): {text[-300:]}; build llama.cpp on that host and give engine_bin: PATH")


@dataclass(frozen=True)
class RunDir:
    """One run folder under a host's work dir: its name (the run id), bytes used, newest mtime (epoch s)."""

    name: str
    bytes: int
    newest_mtime: int


def list_run_dirs(host: Host, work_dir: str) -> tuple[list[RunDir], int]:
    """The run folders directly under `work_dir` (oldest first, by the time in their name) and the host's clock
    (epoch s); one command. Only real directories named like a run id (`YYYYmmdd-HHMMSS-<name>-<4 hex>`)."""
    work = host.expand(work_dir).rstrip("/") or "/"
    res = host.run(_LIST_RUN_DIRS.format(work=shlex.quote(work)), check=False, rerun_if_lost=True)
    now, dirs = int(time.time()), []
    for line in res.stdout.splitlines():
        parts = line.split(" ", 2)
        if parts[0] == "now" and len(parts) == 2 and parts[1].isdigit():
            now = int(parts[1])
        elif len(parts) == 3 and parts[0].isdigit() and parts[1].lstrip("-").isdigit() and RUN_DIR_RE.match(parts[2]):
            dirs.append(RunDir(parts[2], int(parts[0]) * 1024, int(parts[1])))
    return sorted(dirs, key=lambda d: d.name), now


def prune_run_dirs(host: Host, work_dir: str, keep: int = KEEP_RUN_DIRS, max_bytes: int | None = MAX_RUN_DIR_BYTES,
                   *, current: str | None = None, busy_s: float = BUSY_S) -> list[str]:
    """Remove the oldest run folders under `work_dir` on `host` beyond the newest `keep`, then more of the
    oldest while all of them together exceed `max_bytes` (None: no size bound); returns the removed paths.

    Never removed: `current` (a run id or its path), a folder anything was written to in the last `busy_s`
    (a run still going), and anything not a directory named like a run id spectrial made. Two commands at
    most (list, remove).
    """
    if keep < 0:
        raise ConfigError(f"keep: {keep} must be >= 0 (run folders to keep)")
    work = host.expand(work_dir).rstrip("/") or "/"
    dirs, now = list_run_dirs(host, work_dir)
    protected = {current.rstrip("/").rsplit("/", 1)[-1]} if current else set()
    protected |= {d.name for d in dirs if now - d.newest_mtime < busy_s}
    newest_first = list(reversed(dirs))
    doomed = {d.name for d in newest_first[keep:] if d.name not in protected}
    if max_bytes is not None:
        total = sum(d.bytes for d in dirs if d.name not in doomed)
        for d in dirs:  # oldest first
            if total <= max_bytes:
                break
            if d.name not in doomed and d.name not in protected:
                doomed.add(d.name)
                total -= d.bytes
    paths = [f"{work}/{d.name}" for d in dirs if d.name in doomed]
    if paths:
        script = "; ".join(f"if [ -d {q} ] && [ ! -L {q} ]; then rm -rf -- {q}; fi"
                           for q in map(shlex.quote, paths))
        host.run(script, check=False)
    return paths
