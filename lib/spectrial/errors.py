"""The few error classes spectrial raises; each carries fields (not only text) and says how to fix it.

    SpectrialError        base; `hint` says what to do
    ConfigError           a parameter is missing, mistyped or contradictory: `parameter` names it
      HostKeyError        an SSH server's host key is unknown or changed: host, port, key type, SHA256
                          fingerprint (the message says how to accept it)
    HostError             a command on a host failed or its transport dropped (`lost`): command, exit code,
                          output tails
      ConnectionLost      the connection to a remote host dropped and could not be re-established: host, since
    ResourceBusyError     a port, GPU or disk is not available: `resource`, `holders` (pid + command line)
    RecordWriteError      the run record cannot be written (its disk is full): the run stops
    ServerError           a server did not start, never became ready, or died mid-run (`phase`): exit code,
                          command, log path and tail
    MeasurementRejected   a server start ran, but a check the params make binding failed (env_check: fail,
                          engine_config.nccl_evidence_check: fail, the default of a multi-GPU launch with NCCL_*
                          variables): `check`, `arm`, `result` (the typed check result); the
                          start's record says failed and why, and the run stops
    RunFailed             a trial or sweep ran but did not measure what it should: `result` is the partial
                          result (run folder, manifest, requests), the record says `failed` and why
    ParseError            input could not be parsed at all (line number and line)
      RecordDamaged       a run record (manifest.json, requests.csv, ...) is truncated, binary, of the wrong type,
                          from a future schema or missing parts: `path` and `problem`; nothing rewrites it
    ServerMisbehaved      a server broke the protocol or a bound: a body over its size limit, a stream past its
                          tokens or its deadline, bytes that are not what was asked: `what` (the endpoint),
                          `problem`, `limit`; the request or probe fails with that reason
    SetFailed             an NCCL check's environment set: workers failed or timed out: set name, world
                          size, one `RankFailure` (rank, pid, exit code, error, log tail) per bad rank
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel


class SpectrialError(Exception):
    """Base class of every error spectrial raises on purpose; `hint` says what to do about it."""

    def __init__(self, message: str = "", *, hint: str = "") -> None:
        self.hint = hint
        super().__init__(message + (f"\nhint: {hint}" if hint and f"hint: {hint}" not in message else ""))


class ConfigError(SpectrialError, ValueError):
    """A parameter is missing, mistyped or contradictory; `parameter` names it, the message says the fix."""

    def __init__(self, message: str = "", *, parameter: str | None = None, hint: str = "") -> None:
        self.parameter = parameter or (message.split(":", 1)[0].strip() if ":" in message[:80] else None)
        super().__init__(message, hint=hint)



class HostKeyError(ConfigError):
    """An SSH server's host key is unknown or changed: names host, port, key type, SHA256 fingerprint and the fix."""

    def __init__(self, message: str, *, host: str, port: int, key_type: str, fingerprint: str) -> None:
        self.host, self.port, self.key_type, self.fingerprint = host, port, key_type, fingerprint
        super().__init__(message, parameter="known_hosts")


class HostError(SpectrialError):
    """A command on a host failed (`exit_code`), or the transport to the host dropped while it ran (`lost`:
    the command may or may not have run)."""

    def __init__(self, host: str, command: str, exit_code: int | None, stdout: str = "", stderr: str = "",
                 hint: str = "", *, lost: bool = False) -> None:
        self.host, self.command, self.exit_code, self.lost = host, command, exit_code, lost
        self.stdout, self.stderr = stdout, stderr
        tail = "\n".join((stderr or stdout).strip().splitlines()[-15:])
        what = "connection lost" if lost else (
            "failed" if exit_code is None else f"command failed (exit {exit_code})")  # None: no command ran
        msg = f"on {host}: {what}: {command}"
        if tail:
            msg += f"\n--- output tail ---\n{tail}"
        super().__init__(msg, hint=hint)


class ConnectionLost(HostError):
    """The connection to a remote host dropped and could not be re-established within the retries: `host`,
    `since` (UTC time the drop was noticed), `down_s` (seconds from then to giving up), `attempts`, `last_error`.

    What was started there (a server, a sampler) may still run: the message says so; stop it once the host is
    reachable again (the next trial's kill step does)."""

    def __init__(self, host: str, *, since: str, down_s: float, attempts: int, last_error: str,
                 command: str = "", hint: str = "") -> None:
        self.host, self.command, self.exit_code, self.lost = host, command, None, True
        self.stdout, self.stderr = "", last_error
        self.since, self.down_s, self.attempts, self.last_error = since, down_s, attempts, last_error
        msg = (f"lost the connection to {host} at {since} and could not reconnect ({attempts} attempt(s) over "
               f"{down_s:.1f} s; last: {last_error}); the remote server may still be running there")
        SpectrialError.__init__(self, msg, hint=hint or (
            "check that the host and its sshd are up (network, VPN); the next trial on that host stops what "
            "this run left there"))


class ResourceBusyError(SpectrialError):
    """A port, GPU or disk spectrial needs is not available; `holders` names the processes (pid, command)."""

    def __init__(self, message: str, *, resource: Literal["port", "gpu", "disk", "process"] = "process",
                 holders: list[tuple[int, str]] | None = None, hint: str = "") -> None:
        self.resource, self.holders = resource, list(holders or [])
        super().__init__(message, hint=hint)


class RecordWriteError(ResourceBusyError):
    """The run record itself could not be written (a full disk, a vanished or read-only output_dir): the run
    stops as on an interrupt (servers stopped), and the message names the file, the folder's free space, the fix."""


class ServerError(SpectrialError):
    """A server exited before it was ready (`phase` "start"), was not ready in time ("ready"), or died or
    stopped answering during the run ("lost"); with its exit code, command and log tail."""

    def __init__(self, message: str, *, phase: Literal["start", "ready", "lost"], name: str = "",
                 exit_code: int | None = None, command: str = "", log_path: str = "", log_tail: str = "",
                 hint: str = "") -> None:
        self.phase, self.name, self.exit_code, self.command = phase, name, exit_code, command
        self.log_path, self.log_tail = log_path, log_tail
        super().__init__(message, hint=hint)


class MeasurementRejected(SpectrialError):
    """A server start ran, but what it ran under is not what was asked, and the params say such a start must not
    count: `check` "env_check" (the requested variables did not reach every server process; `env_check: fail`) or
    "nccl_evidence" (NCCL's own log says it used other values; `engine_config.nccl_evidence_check: fail`) or
    "config_check" (the engine resolved another configuration than the arm asked; `config_check: fail`). `arm`
    names the arm, `result` is the check's typed result as recorded (`EnvCheckRecord`, `NcclEvidence`). Not bad
    input (that is `ConfigError`): a measurement outcome; the start's record says failed and why, the run stops."""

    def __init__(self, message: str, *, check: Literal["env_check", "nccl_evidence", "config_check"], arm: str,
                 result: BaseModel | None = None, hint: str = "") -> None:
        self.check, self.arm, self.result = check, arm, result
        super().__init__(message, hint=hint)


class RunFailed(SpectrialError):
    """A trial or sweep ran but at least one part failed; `result` is what it produced (its record says
    `failed` and why)."""

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result


class ParseError(SpectrialError):
    """Input could not be parsed at all (names the line number and the line)."""


class RecordDamaged(ParseError):
    """A run record on disk cannot be read as one: `path` (the file) and `problem` (truncated, binary, not a JSON
    object, a future schema, a missing part, a broken CSV). Readers of many records skip it and say so; nothing
    rewrites or deletes it."""

    def __init__(self, path: str, problem: str, hint: str = "") -> None:
        self.path, self.problem = path, problem
        super().__init__(f"{path}: damaged run record: {problem}",
                         hint=hint or "the file is left as it is; restore it from a copy, or move the run folder "
                                      "out of the way")


class ServerMisbehaved(SpectrialError):
    """A server broke the protocol or one of spectrial's bounds while it was read: `what` (the endpoint or
    request), `problem` (what it did), `limit` (the bound it crossed, in words). The read stopped there."""

    def __init__(self, what: str, problem: str, limit: str = "", hint: str = "") -> None:
        self.what, self.problem, self.limit = what, problem, limit
        super().__init__(f"{what}: {problem}" + (f" (limit: {limit})" if limit else ""), hint=hint)


@dataclass(frozen=True)
class RankFailure:
    """One worker of an NCCL check set that failed: its rank, pid, exit code, error and the tail of its log."""

    rank: int
    pid: int | None
    exit_code: int | None
    error: str | None
    log_tail: str


class SetFailed(SpectrialError):
    """One environment set of an NCCL check had workers that failed or timed out: `set_name`, `world` (ranks
    started) and `failures` (one `RankFailure` per bad rank); the check records the set as failed and goes on."""

    def __init__(self, set_name: str, world: int, failures: list[RankFailure]) -> None:
        self.set_name, self.world, self.failures = set_name, world, list(failures)
        why = "\n".join(f"rank {f.rank} (pid {f.pid}, exit {f.exit_code}): {f.error}\n--- log tail ---\n{f.log_tail}"
                        for f in self.failures)
        super().__init__(f"set {set_name!r}: {len(self.failures)} of {world} workers failed\n{why}",
                         hint="the log tails say why each rank failed; a rank stopped by the timeout: raise timeout_s")
