"""Provision SSH hosts from this machine: what is built or written here is uploaded into the host's cache.

The host's cache (`ssh.cache_dir`, default `~/.cache/spectrial` on the host) mirrors the local one
(`spectrial.provision.cache_root()`): `llama.cpp/bin/<key>/llama-server` here is
`<host cache>/llama.cpp/bin/<key>/llama-server` there, tiny models likewise. An upload is skipped when the
file there already has the same size and hash (`fingerprint.file_identity`, hashing the whole file up to
128 MiB and head + tail beyond). Uploads are atomic and user-only (`Host.put`); free space is checked
first, so a full disk is a clear error and never leaves a half-written file under the final name.
"""

from __future__ import annotations

import hashlib
import math
import platform
import time
from pathlib import Path
from typing import Any

from spectrial.errors import ConfigError
from spectrial.fingerprint import file_identity
from spectrial.host import Host, LocalHost

MAX_IDENTITY_CHUNK = 64 * 2**20
UPLOAD_MARGIN_BYTES = 4 * 2**20


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
    from spectrial.provision import cache_root

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


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return "error" not in a and "error" not in b and a["size"] == b["size"] and \
        a["head_tail_sha256"] == b["head_tail_sha256"]


def sync_file(host: Host, local: Path, remote: str, mode: int = 0o600, what: str = "ssh.cache_dir"
              ) -> dict[str, Any]:
    """Upload `local` to `remote` on `host` unless an identical file is there; returns what happened.

    `what` names the parameter to change when the host's disk is too small.
    """
    if not local.is_file():
        raise ConfigError(f"{what}: {local} is missing on this machine, nothing to upload")
    size = local.stat().st_size
    chunk = identity_chunk(size)
    mine = file_identity(LocalHost(), str(local), chunk)
    theirs = file_identity(host, remote, chunk)
    out: dict[str, Any] = {"local": str(local), "path": remote, "bytes": size, "uploaded": False, "seconds": 0.0}
    if _same(mine, theirs):
        return out
    parent = remote.rsplit("/", 1)[0] or "/"
    host.require_free_space({parent: size + UPLOAD_MARGIN_BYTES}, what)
    host.mkdir(parent)
    t0 = time.monotonic()
    host.put(local, remote, mode)
    out.update(uploaded=True, seconds=round(time.monotonic() - t0, 3))
    return out


def check_runs(host: Host, binary: str, flag: str = "--version") -> None:
    """Run `binary FLAG` on the host; ConfigError naming the loader's complaint when it cannot start."""
    res = host.run([binary, flag], check=False, timeout=60)
    text = (res.stderr + res.stdout).strip()
    if res.exit_code in (126, 127) or "error while loading shared libraries" in text or "GLIBC" in text:
        raise ConfigError(f"engine_bin: the uploaded {binary} does not start on {host.name} (exit "
                          f"{res.exit_code}): {text[-300:]}; build llama.cpp on that host and give engine_bin: PATH")
