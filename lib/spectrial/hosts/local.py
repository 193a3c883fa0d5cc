"""Hosts: one verb set over two transports (local through invoke, SSH through fabric).

Everything spectrial does on a machine goes through a `Host`: run a command (argv list or a shell string
built with `shlex`), start a detached process group, signal it, list the processes of a group with their
`/proc/<pid>/environ`, find who holds a port, and move files. Code written against `Host` runs the same on
the laptop and on a GPU box.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shlex
import shutil
import signal
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import psutil
from invoke import Context
from invoke.exceptions import CommandTimedOut
from invoke.runners import Local

from spectrial.errors import ConfigError, HostError, ResourceBusyError
from spectrial.schema import utc_now
from spectrial.secrets import MaskedLaunch, mask_launch

_PID_RE = re.compile(r"pid=(\d+)")
_DF_RE = re.compile(r"^(\S+)\s+\d+\s+\d+\s+(\d+)\s+\S+\s+(.+)$")
MAX_INLINE_COMMAND_BYTES = 100_000  # Linux caps one argv string (bash -c LINE) at 128 kB
ENV_NAME_OK = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


@dataclass
class CommandResult:
    """What a finished command left: the command line, exit code, output and wall time."""

    command: str
    exit_code: int
    stdout: str
    stderr: str
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass
class ProcInfo:
    """One process as seen on its host: ids, command line and exec-time environment (None: unreadable).

    `sid` is its session, `start_ticks` its start time in clock ticks after boot (/proc/<pid>/stat field 22):
    with the pid it names one process for the life of the machine (a recycled pid starts later).
    """

    pid: int
    ppid: int
    pgid: int
    cmdline: list[str] = field(default_factory=list)
    environ: dict[str, str] | None = None
    sid: int = 0
    start_ticks: int = 0

    @property
    def command(self) -> str:
        return shlex.join(self.cmdline) if self.cmdline else f"[pid {self.pid}]"


def check_env_names(env: Mapping[str, str]) -> None:
    """Reject environment variable names that a shell could misread (names the variable)."""
    for name in env:
        if not name or name[0].isdigit() or not set(name) <= ENV_NAME_OK:
            raise ConfigError(f"env: {name!r} is not a valid environment variable name "
                              "(use letters, digits and '_', not starting with a digit)")


def env_prefix(env: Mapping[str, str] | None) -> list[str]:
    """argv prefix `env K=V ...` putting variables on the command itself (empty when no variables)."""
    if not env:
        return []
    check_env_names(env)
    return ["env", *(f"{k}={v}" for k, v in env.items())]


def to_shell(cmd: Sequence[str] | str, env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """One quoted shell command line: an argv list is `shlex.join`ed; a string is taken as shell code."""
    line = cmd if isinstance(cmd, str) else shlex.join([str(c) for c in cmd])
    if env:
        line = shlex.join(env_prefix(env)) + " " + (line if not isinstance(cmd, str) else f"sh -c {shlex.quote(cmd)}")
    if cwd:
        line = f"cd {shlex.quote(str(cwd))} && {line}"
    return line


def detached_line(argv: Sequence[str], env: Mapping[str, str] | None, log_path: str, cwd: str | None) -> str:
    """The shell line that starts argv in its own session with output to `log_path` and prints its pid."""
    inner = shlex.join(["nohup", "setsid", *env_prefix(env), *[str(a) for a in argv]])
    line = f"umask 077; {inner} > {shlex.quote(log_path)} 2>&1 < /dev/null & echo $!"
    return f"cd {shlex.quote(cwd)} && {line}" if cwd else line


def _with_command(exc: HostError, shown_line: str, shown: MaskedLaunch) -> HostError:
    """`exc` as it may be printed: the masked command line, secret values redacted from its output tails."""
    if not shown.secrets or type(exc) is not HostError:  # ConnectionLost and others carry no command output
        return exc
    return HostError(exc.host, shown_line, exc.exit_code, shown.redact(exc.stdout), shown.redact(exc.stderr),
                     exc.hint, lost=exc.lost)


def masked_error(exc: HostError, cmd: Sequence[str] | str, env: Mapping[str, str] | None, cwd: str | None
                 ) -> HostError:
    """A failed `Host.run` as it may be printed: the command line through `mask_launch` (an argv list: its
    secret-looking flags and variables masked; shell code: the variables masked, their values redacted)."""
    if isinstance(cmd, str):
        shown = mask_launch([], env)
        return _with_command(exc, to_shell(shown.redact(cmd), shown.env, cwd), shown)
    shown = mask_launch(cmd, env)
    return _with_command(exc, to_shell(shown.argv, shown.env, cwd), shown)


def stat_start_ticks(stat: str) -> int:
    """Start time (clock ticks after boot) from the text of /proc/<pid>/stat (0 when unreadable)."""
    fields = stat.rpartition(")")[2].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else 0


def _exec_snapshot(p: psutil.Process) -> tuple[list[str], dict[str, str] | None]:
    """Command line and environment of one and the same exec: a launcher chain (`nohup setsid env K=V argv`)
    execs in place, so an environment read before the last exec and a command line read after it would pair
    the launcher's environment with the program's name. Read the command line on both sides of the environment
    and retry until they agree."""
    cmdline = p.cmdline()
    empty = 0
    for _ in range(20):
        try:
            env = p.environ()
        except psutil.AccessDenied:
            return cmdline, None
        after = p.cmdline()
        if after == cmdline:
            # an exec in progress also shows as an empty environment for a moment: read again (a process
            # started with no environment at all comes back, after three reads, as it is)
            empty = empty + 1 if not env else 0
            if env or empty >= 3:
                return cmdline, env
        cmdline = after
        time.sleep(0.005)
    return cmdline, env


def parse_environ(raw: bytes) -> dict[str, str]:
    """Split a `/proc/<pid>/environ` blob (NUL separated `K=V`) into a dict."""
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, _, v = item.partition(b"=")
            out[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return out


class Host(ABC):
    """A machine spectrial drives. Subclasses provide `_exec` and file transfer; the rest is shared."""

    name: str = "host"

    # --- transport -----------------------------------------------------------------------------------
    @abstractmethod
    def _exec(self, line: str, timeout: float | None) -> CommandResult:
        """Run one shell command line; never raises on a non-zero exit."""

    @abstractmethod
    def put(self, local: str | Path, remote: str, mode: int = 0o600) -> None:
        """Copy a local file to the host."""

    @abstractmethod
    def get(self, remote: str, local: str | Path) -> None:
        """Copy a file from the host to a local path."""

    @property
    def is_local(self) -> bool:
        return False

    def close(self) -> None:
        """Release the transport (no-op locally)."""
        return None

    @property
    def counters(self) -> dict[str, float]:
        """What this host cost so far: `commands` run, their `command_s`, `sftp` operations, `channels` opened."""
        c = self.__dict__.get("_counters")
        if c is None:
            c = self.__dict__["_counters"] = {"commands": 0, "command_s": 0.0, "sftp": 0, "channels": 0}
        return c

    def note_event(self, event: str, detail: str) -> None:
        """Remember something that happened to the transport (reconnect, cut stream) for the run record."""
        self.__dict__.setdefault("_events", []).append({"at": utc_now(), "event": event, "detail": detail})

    def take_events(self) -> list[dict[str, str]]:
        """Transport events since the last call (and forget them): reconnects, streams cut by a drop."""
        events = self.__dict__.get("_events") or []
        self.__dict__["_events"] = []
        return events

    def client_url(self, port: int, bind: str = "127.0.0.1") -> str:
        """Base URL at which this machine reaches a server listening on the host's `port`.

        Local hosts answer directly; remote hosts forward a local port through their transport.
        """
        return f"http://127.0.0.1:{int(port)}"

    # --- commands ------------------------------------------------------------------------------------
    def run(self, cmd: Sequence[str] | str, *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float | None = None, check: bool = True, hint: str = "", rerun_if_lost: bool = False
            ) -> CommandResult:
        """Run `cmd` (argv list, quoted for you; or shell code you quoted) with `env` on the command line.

        `rerun_if_lost`: the command only reads, so when the connection drops under it, run it once more
        (on the new connection) instead of raising HostError(lost=True).
        """
        line = to_shell(cmd, env, cwd)
        try:
            try:
                res = self._exec(line, timeout)
            except HostError as exc:
                if not (exc.lost and rerun_if_lost):
                    raise
                res = self._exec(line, timeout)
        except HostError as exc:
            shown = masked_error(exc, cmd, env, cwd)
            if shown is exc:
                raise
            raise shown from None  # the original names the secrets
        counters = self.counters
        counters["commands"] += 1
        counters["command_s"] += res.elapsed_s
        if check and res.exit_code != 0:
            raise masked_error(HostError(self.name, line, res.exit_code, res.stdout, res.stderr, hint), cmd, env, cwd)
        return res

    def which(self, program: str) -> str | None:
        """Absolute path of `program` on the host's PATH, or None."""
        res = self.run(f"command -v {shlex.quote(program)}", check=False, rerun_if_lost=True)
        return res.stdout.strip() or None if res.ok else None

    # --- files ---------------------------------------------------------------------------------------
    def home(self) -> str:
        """The host user's home directory."""
        return self.run("printf %s \"$HOME\"", rerun_if_lost=True).stdout

    def expand(self, path: str) -> str:
        """Expand a leading `~` against the host's home."""
        return self.home() + path[1:] if path.startswith("~") else path

    def exists(self, path: str) -> bool:
        return self.run(["test", "-e", path], check=False, rerun_if_lost=True).ok

    def mkdir(self, path: str) -> None:
        """Create a directory and any missing parents, all readable by the user only."""
        self.run(f"umask 077 && mkdir -p -m 700 -- {shlex.quote(path)}")

    def free_space(self, paths: Sequence[str]) -> dict[str, tuple[int, str]]:
        """Per path: (bytes available to this user, mount point) of the filesystem that holds (or would hold) it.

        One command for all paths; a path that does not exist yet is measured at its nearest existing parent.
        """
        script = "; ".join(
            f"p={shlex.quote(p)}; while [ ! -e \"$p\" ] && [ \"$p\" != / ]; do p=$(dirname -- \"$p\"); done; "
            "df -Pk -- \"$p\" | tail -n 1" for p in paths)
        res = self.run(script, check=False, rerun_if_lost=True)
        out: dict[str, tuple[int, str]] = {}
        for path, line in zip(paths, res.stdout.splitlines(), strict=False):
            m = _DF_RE.match(line.strip())
            if m:
                out[path] = (int(m[2]) * 1024, m[3])
        return out

    def require_free_space(self, needs: Mapping[str, int], what: str) -> None:
        """Raise ResourceBusyError (resource "disk") when a path's filesystem has less than the bytes `needs` gives for it.

        `needs` maps a path to the bytes needed there; `what` names the parameter(s) to point elsewhere.
        """
        have = self.free_space(list(needs))
        for path, need in needs.items():
            if path in have and have[path][0] < need:
                free, mount = have[path]
                raise ResourceBusyError(
                    f"no space left on {self.name}: {path} (filesystem {mount}) has {free / 2**20:.1f} MiB free, "
                    f"{need / 2**20:.1f} MiB needed; free space there or point {what} at a bigger disk",
                    resource="disk")

    def read_text(self, path: str, *, max_bytes: int | None = None) -> str:
        res = self.run(["tail", "-c", str(max_bytes), path] if max_bytes else ["cat", path], rerun_if_lost=True)
        return res.stdout

    def line_count(self, path: str) -> int:
        """Complete lines in a file so far (0 when it does not exist yet)."""
        res = self.run(f"wc -l < {shlex.quote(path)}", check=False, rerun_if_lost=True)
        return int(res.stdout.strip()) if res.ok and res.stdout.strip().isdigit() else 0

    def write_text(self, path: str, text: str, mode: int = 0o600) -> None:
        """Write a file atomically (temp file then rename) with user-only permissions by default."""
        tmp = f"{path}.tmp{os.getpid()}"
        b64 = base64.b64encode(text.encode()).decode()
        self.run(f"umask 077 && printf %s {shlex.quote(b64)} | base64 -d > {shlex.quote(tmp)} && "
                 f"chmod {mode:o} {shlex.quote(tmp)} && mv -f {shlex.quote(tmp)} {shlex.quote(path)}")

    def remove(self, path: str) -> None:
        self.run(["rm", "-f", path], check=False)

    # --- processes -----------------------------------------------------------------------------------
    def start_detached(self, argv: Sequence[str], *, env: Mapping[str, str] | None, log_path: str,
                       cwd: str | None = None) -> int:
        """Start argv in a new session (`setsid`, its own process group) with stdout+stderr to `log_path`.

        Returns the pid, which is also the process group id: stop it with `signal_group`.
        """
        line = detached_line(argv, env, log_path, cwd)
        shown = mask_launch(argv, env)
        try:
            res = self.run(line)
            pid = int(res.stdout.strip().splitlines()[-1])
        except HostError as exc:
            masked = _with_command(exc, detached_line(shown.argv, shown.env, log_path, cwd), shown)
            if masked is exc:
                raise
            raise masked from None  # the original names the secrets
        except (ValueError, IndexError):
            raise HostError(self.name, detached_line(shown.argv, shown.env, log_path, cwd), res.exit_code,
                            shown.redact(res.stdout), shown.redact(res.stderr), "could not read the started pid"
                            ) from None
        return pid

    def signal_group(self, pgid: int, sig: int = signal.SIGTERM) -> bool:
        """Send `sig` to every process of group `pgid`; False when the group no longer exists."""
        name = signal.Signals(sig).name.removeprefix("SIG")  # `kill -s NAME -- -PGID`: dash refuses `-15 --`
        return self.run(["kill", "-s", name, "--", f"-{int(pgid)}"], check=False).ok

    def signal_pid(self, pid: int, sig: int = signal.SIGTERM) -> bool:
        """Send `sig` to one process; False when it no longer exists."""
        name = signal.Signals(sig).name.removeprefix("SIG")
        return self.run(["kill", "-s", name, "--", str(int(pid))], check=False).ok

    def stop_group(self, pgid: int, grace_s: float, first: int | None = None) -> str:
        """Stop process group `pgid`: SIGTERM to `first` (the engine, so it shuts down in its own way: drains,
        stops its workers) and, once it is gone, to the rest of the group (or to the whole group at once
        without `first`); SIGKILL to the group after `grace_s`. Returns 'gone', 'TERM' or 'KILL'.

        Zombies do not count as alive (an engine that SIGKILLs its own tree leaves them to its reaper)."""
        if not self.processes(pgid):
            return "gone"
        deadline = time.monotonic() + grace_s
        if first is not None and self.alive(first):
            self.signal_pid(first, signal.SIGTERM)
            while time.monotonic() < deadline and self.alive(first):
                time.sleep(0.1)
        self.signal_group(pgid, signal.SIGTERM)
        while time.monotonic() < deadline:
            if not self.processes(pgid):
                return "TERM"
            time.sleep(0.1)
        if not self.processes(pgid):
            return "TERM"
        self.signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.processes(pgid):
            time.sleep(0.1)
        if self.processes(pgid):
            survivors = [(p.pid, p.command) for p in self.processes(pgid)]
            raise ResourceBusyError(f"process group {pgid} on {self.name} survived SIGKILL:\n"
                                    + "\n".join(f"  pid {pid}: {cmd}" for pid, cmd in survivors),
                                    resource="process", holders=survivors,
                                    hint="a process stuck in the kernel (D state) or owned by another user")
        return "KILL"

    def alive(self, pid: int) -> bool:
        """True while `pid` exists and is not a zombie."""
        res = self.run(["ps", "-o", "stat=", "-p", str(int(pid))], check=False, rerun_if_lost=True)
        return res.ok and bool(res.stdout.strip()) and not res.stdout.strip().startswith("Z")

    @abstractmethod
    def processes(self, pgid: int | None = None) -> list[ProcInfo]:
        """Processes (of group `pgid`, or all) with their command line and exec-time environment."""

    @abstractmethod
    def port_holders(self, port: int) -> list[ProcInfo]:
        """Processes listening on TCP `port` (empty when the port is free)."""

    def process_tree(self, pid: int) -> list[ProcInfo]:
        """`pid` and its descendants, plus everything in its process group."""
        procs = self.processes()
        members = tree_members([(p.pid, p.ppid, p.pgid) for p in procs], pid)
        return sorted((p for p in procs if p.pid in members), key=lambda p: p.pid)


def tree_members(rows: Sequence[tuple[int, int, int]], pid: int) -> set[int]:
    """Pids of `pid`, its descendants and its process group, from (pid, ppid, pgid) rows."""
    by_parent: dict[int, list[int]] = {}
    for p, ppid, _ in rows:
        by_parent.setdefault(ppid, []).append(p)
    seen = {p for p, _, pgid in rows if pgid == pid or p == pid}
    stack = list(seen)
    while stack:
        for child in by_parent.get(stack.pop(), []):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return seen


class _StoppingLocal(Local):
    """invoke's local runner, except that an interrupt stops the command and reaches the caller: invoke forwards
    Ctrl-C to the command's stdin and goes on waiting, which would swallow it (a trial that runs on)."""

    interrupt: BaseException | None = None

    def send_interrupt(self, interrupt: KeyboardInterrupt) -> None:
        self.interrupt = interrupt
        self.kill()

    def stop(self) -> None:
        # an interrupt that lands before invoke has set the command up (no `using_pty` yet: nothing was started)
        # must reach the caller as itself, not as invoke's AttributeError from cleaning up what does not exist
        if hasattr(self, "using_pty"):
            super().stop()


class LocalHost(Host):
    """This machine, through invoke (commands) and psutil (processes)."""

    name = "local"

    def __init__(self) -> None:
        self._ctx = Context()

    @property
    def is_local(self) -> bool:
        return True

    def _exec(self, line: str, timeout: float | None) -> CommandResult:
        if len(line.encode()) > MAX_INLINE_COMMAND_BYTES:  # too long for `bash -c LINE`: run it from a file
            fd, script = tempfile.mkstemp(prefix="spectrial-cmd-", suffix=".sh")  # mode 0600
            try:
                with os.fdopen(fd, "w") as fh:
                    fh.write(line)
                res = self._exec(f"sh {shlex.quote(script)} < /dev/null", timeout)
            finally:
                os.unlink(script)
            return CommandResult(line, res.exit_code, res.stdout, res.stderr, res.elapsed_s)
        t0 = time.monotonic()
        runner = _StoppingLocal(self._ctx)
        try:
            r = runner.run(line, hide=True, warn=True, timeout=timeout, in_stream=False)
        except OSError as exc:
            raise HostError(self.name, line[:2000], None, stderr=str(exc),
                                   hint="the shell could not be started") from exc
        except CommandTimedOut as exc:
            r = exc.result
            raise HostError(self.name, line, None, r.stdout, r.stderr,
                                   f"timed out after {timeout} s") from exc
        if runner.interrupt is not None:  # the command was stopped; the interrupt goes on to the caller
            raise runner.interrupt
        return CommandResult(line, r.exited, r.stdout, r.stderr, time.monotonic() - t0)

    def home(self) -> str:
        return str(Path.home())

    @staticmethod
    def _write_private(path: str | Path, write: Callable[[BinaryIO], object], mode: int) -> None:
        """Write through `write` into a 0600 temp file beside `path`, chmod `mode`, rename into place."""
        p = Path(path)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".spectrial-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
            os.chmod(tmp, mode)
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def put(self, local: str | Path, remote: str, mode: int = 0o600) -> None:
        with open(local, "rb") as src:
            self._write_private(remote, lambda dst: shutil.copyfileobj(src, dst), mode)

    def get(self, remote: str, local: str | Path) -> None:
        with open(remote, "rb") as src:
            self._write_private(local, lambda dst: shutil.copyfileobj(src, dst), 0o600)

    def write_text(self, path: str, text: str, mode: int = 0o600) -> None:
        self._write_private(path, lambda dst: dst.write(text.encode()), mode)

    def read_text(self, path: str, *, max_bytes: int | None = None) -> str:
        p = Path(path)
        with p.open("rb") as fh:
            if max_bytes:
                fh.seek(max(0, p.stat().st_size - max_bytes))
            return fh.read().decode("utf-8", "replace")

    def alive(self, pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def processes(self, pgid: int | None = None) -> list[ProcInfo]:
        out = []
        for p in psutil.process_iter(["pid", "ppid", "status"]):
            try:
                if p.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                g = os.getpgid(p.pid)
                if pgid is not None and g != pgid:
                    continue
                cmdline, env = _exec_snapshot(p)
                try:
                    ticks = stat_start_ticks(Path(f"/proc/{p.pid}/stat").read_text())
                except OSError:
                    ticks = 0
                out.append(ProcInfo(p.pid, p.info["ppid"] or 0, g, cmdline, env, os.getsid(p.pid), ticks))
            except (psutil.Error, ProcessLookupError, OSError):
                continue
        return out

    def port_holders(self, port: int) -> list[ProcInfo]:
        pids = {c.pid for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
        out = []
        for pid in sorted(pids):
            try:
                p = psutil.Process(pid)
                out.append(ProcInfo(pid, p.ppid(), os.getpgid(pid), p.cmdline(), None, os.getsid(pid)))
            except (psutil.Error, OSError):
                continue
        if not out and any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                           for c in psutil.net_connections(kind="tcp")):
            out.append(ProcInfo(0, 0, 0, ["<a process spectrial may not inspect>"]))
        return out


_PROC_LIST = (
    "ps {select} -o pid=,ppid=,pgid=,sid=,stat= | while read -r pid ppid pgid sid stat; do "
    "case \"$stat\" in Z*) continue;; esac; {filt}"
    "st=$(cat /proc/$pid/stat 2>/dev/null); st=${{st##*) }}; set -- $st; "
    "printf '%s %s %s %s %s %s %s\\n' \"$pid\" \"$ppid\" \"$pgid\" \"$sid\" \"${{20:-0}}\" "
    "\"$(base64 -w0 /proc/$pid/cmdline 2>/dev/null)\" \"$(base64 -w0 /proc/$pid/environ 2>/dev/null)\"; done"
)


# The same listing in one python3 process (~30 ms) instead of three forks per process (~5 ms each: half a second
# on a quiet machine, seconds on a busy GPU box); used when the host has python3. argv: all | pgid N | pids
# A,B | tree PID (PID, its descendants and its group, as `tree_members`).
_PROC_LIST_PY = """
import base64, os, sys
mode, arg = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ''
def rd(p):
    try:
        with open(p, 'rb') as f:
            return f.read()
    except OSError:
        return None
rows = []
for d in os.listdir('/proc'):
    st = rd('/proc/%s/stat' % d) if d.isdigit() else None
    f = st[st.rfind(b')') + 2:].split() if st else []
    if len(f) > 19 and f[0] != b'Z':
        rows.append((int(d), int(f[1]), int(f[2]), int(f[3]), int(f[19])))
if mode == 'pgid':
    rows = [r for r in rows if r[2] == int(arg)]
elif mode == 'pids':
    want = {int(x) for x in arg.split(',')}
    rows = [r for r in rows if r[0] in want]
elif mode == 'tree':
    pid, kids = int(arg), {}
    for r in rows:
        kids.setdefault(r[1], []).append(r[0])
    seen = {r[0] for r in rows if r[2] == pid or r[0] == pid}
    todo = list(seen)
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    rows = [r for r in rows if r[0] in seen]
b64 = lambda x: base64.b64encode(x).decode() if x else ''
for pid, ppid, pgid, sid, start in sorted(rows):
    c = rd('/proc/%d/cmdline' % pid)
    for n in range(20):  # one exec's pair: a launcher chain (nohup setsid env) execs in place; an exec in
        e = rd('/proc/%d/environ' % pid)  # progress shows an empty environment for a moment
        again = rd('/proc/%d/cmdline' % pid)
        if again == c and (e or e is None or n >= 2):
            break
        c = again
    sys.stdout.write('%d %d %d %d %d %s %s\\n' % (pid, ppid, pgid, sid, start, b64(c), b64(e)))
"""
NO_PYTHON = "spectrial: no python3"


def proc_list_command(mode: str, arg: str = "", python: bool = True) -> str:
    """One shell command listing processes in the `parse_proc_list` format: python3 when the host has it, else
    the portable shell loop (`tree` then prints NO_PYTHON: the caller lists ids first)."""
    if mode == "tree":
        fallback = f"echo {shlex.quote(NO_PYTHON)}"
    elif mode == "pids":
        fallback = _PROC_LIST.format(select=f"-p {arg}", filt="")
    else:
        filt = f'[ "$pgid" = "{int(arg)}" ] || continue; ' if mode == "pgid" else ""
        fallback = _PROC_LIST.format(select="-e", filt=filt)
    if not python:
        return fallback
    run_py = shlex.join(["python3", "-I", "-S", "-c", _PROC_LIST_PY, mode, arg])
    return f"if command -v python3 >/dev/null 2>&1; then {run_py}; else {fallback}; fi"


def parse_proc_list(text: str) -> list[ProcInfo]:
    """Parse the output of the portable `/proc` listing used on remote hosts."""
    out = []
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) < 5 or not all(x.isdigit() for x in parts[:5]):
            continue
        cmd = base64.b64decode(parts[5]) if len(parts) > 5 and parts[5] else b""
        env_b = base64.b64decode(parts[6]) if len(parts) > 6 and parts[6] else None
        argv = [a.decode("utf-8", "replace") for a in cmd.split(b"\0") if a]
        out.append(ProcInfo(int(parts[0]), int(parts[1]), int(parts[2]), argv,
                            parse_environ(env_b) if env_b is not None else None, int(parts[3]), int(parts[4])))
    return out


class RemoteShellHost(Host):
    """Shared process/port inspection for hosts reached through a shell (SSH): one command each, in python3
    where the host has it (`use_python = False` forces the portable shell loop)."""

    use_python = True

    def processes(self, pgid: int | None = None) -> list[ProcInfo]:
        cmd = proc_list_command("pgid", str(int(pgid)), self.use_python) if pgid is not None else \
            proc_list_command("all", python=self.use_python)
        return parse_proc_list(self.run(cmd, rerun_if_lost=True).stdout)

    def process_tree(self, pid: int) -> list[ProcInfo]:
        """As `Host.process_tree`, in one command with python3 on the host; else two light commands: a `ps` of
        ids to find the tree, then the command lines and environments of those processes only."""
        if self.use_python:
            res = self.run(proc_list_command("tree", str(int(pid))), rerun_if_lost=True)
            if NO_PYTHON not in res.stdout:
                return parse_proc_list(res.stdout)
        ids = self.run(["ps", "-e", "-o", "pid=,ppid=,pgid=,stat="], rerun_if_lost=True).stdout
        rows = [(int(a), int(b), int(c)) for a, b, c, st in (ln.split() for ln in ids.splitlines() if ln.strip())
                if not st.startswith("Z")]
        members = tree_members(rows, pid)
        if not members:
            return []
        listing = self.run(proc_list_command("pids", ",".join(map(str, sorted(members))), python=False),
                           check=False, rerun_if_lost=True)
        return sorted(parse_proc_list(listing.stdout), key=lambda p: p.pid)

    def port_holders(self, port: int) -> list[ProcInfo]:
        res = self.run(f"ss -Htlnp 'sport = :{int(port)}'", check=False, rerun_if_lost=True)
        if not res.ok:
            raise HostError(self.name, res.command, res.exit_code, res.stdout, res.stderr,
                                   "spectrial needs `ss` (iproute2) on the host to check ports")
        if not res.stdout.strip():
            return []
        pids = sorted({int(m) for m in _PID_RE.findall(res.stdout)})
        if not pids:
            return [ProcInfo(0, 0, 0, [f"<not visible to this user: {res.stdout.strip()[:200]}>"])]
        listing = self.run(proc_list_command("pids", ",".join(map(str, pids)), self.use_python), check=False,
                           rerun_if_lost=True)
        procs = {p.pid: p for p in parse_proc_list(listing.stdout)}  # only the holders, not every process
        return [procs.get(pid, ProcInfo(pid, 0, 0, [])) for pid in pids]
