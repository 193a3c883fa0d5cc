"""TEST DOUBLE of the host layer, for unit tests of code that drives a `Host` (as invoke's `MockContext`).

`MemoryHost` satisfies the `Host` interface with no shell, no process and no file system: commands answer from
a script (`on(command or pattern, stdout=..., exit_code=...)`), files live in a dict, started processes are
entries in a table that signals remove, and every command run is recorded (`commands`). An unscripted
command raises, naming it, so a test never passes on an answer nobody wrote.

It stands in for the machine only in tests of the host layer's callers (parsers of command output, file
logic, the order of commands); what must drive a real process (launch, stop, /proc, ports, SSH) is tested
against `LocalHost` and a real sshd. `tests/hosts/test_host_memory.py` runs one contract against both `LocalHost`
and `MemoryHost`, so the double cannot drift from the real host.

    host = MemoryHost(files={"/m/tokenizer_config.json": "{}"})
    host.on(["nvidia-smi", "-L"], stdout="GPU 0: NVIDIA H200 (UUID: GPU-1)\\n")
    host.on(re.compile(r"^uname "), stdout="6.8.0\\n")
    assert host.run(["nvidia-smi", "-L"]).stdout.startswith("GPU 0") and host.commands == ["nvidia-smi -L"]
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from spectrial.errors import HostError
from spectrial.hosts.local import CommandResult, Host, ProcInfo, to_shell

_FATAL = frozenset({signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})


@dataclass(frozen=True)
class Scripted:
    """The answer to a command: exit code and output (`lost`: the transport drops under it, HostError lost)."""

    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    lost: bool = False


class MemoryHost(Host):
    """TEST DOUBLE: a `Host` held in memory (scripted commands, files in a dict, a process table).

    `files`: path -> text; `commands`: every command line run, in order; `processes_started`: what
    `start_detached` started (pid, argv, env), gone or not; `listening`: port -> pid of the holder.
    """

    name = "memory"

    def __init__(self, files: Mapping[str, str] | None = None, *, home: str = "/home/test",
                 free_bytes: int = 1 << 40) -> None:
        self.files: dict[str, str] = dict(files or {})
        self.dirs: set[str] = {"/", home}
        self.commands: list[str] = []
        self.processes_started: list[ProcInfo] = []
        self.listening: dict[int, int] = {}
        self._home, self._free = home, free_bytes
        self._exact: dict[str, Scripted] = {}
        self._patterns: list[tuple[re.Pattern[str], Scripted]] = []
        self._live: dict[int, ProcInfo] = {}
        self._next_pid = 1000
        for path in self.files:  # a file's folders exist
            self.mkdir(path.rsplit("/", 1)[0] or "/")

    # --- scripting ------------------------------------------------------------------------------------
    def on(self, command: Sequence[str] | str | re.Pattern[str], *, stdout: str = "", stderr: str = "",
           exit_code: int = 0, lost: bool = False) -> MemoryHost:
        """Script the answer to `command`: an argv list (matched as `Host.run` quotes it), an exact shell line,
        or a compiled pattern searched in the line (exact matches win, then patterns in the order given)."""
        answer = Scripted(exit_code, stdout, stderr, lost)
        if isinstance(command, re.Pattern):
            self._patterns.append((command, answer))
        else:
            self._exact[to_shell(command)] = answer
        return self

    def _exec(self, line: str, timeout: float | None) -> CommandResult:
        self.commands.append(line)
        answer = self._exact.get(line) or next((a for p, a in self._patterns if p.search(line)), None)
        if answer is None:
            raise NotImplementedError(f"MemoryHost: no scripted answer for the command {line!r}; "
                                      "add one with host.on(...)")
        if answer.lost:
            raise HostError(self.name, line, None, stderr="connection lost (scripted)", lost=True)
        return CommandResult(line, answer.exit_code, answer.stdout, answer.stderr, 0.0)

    # --- files ----------------------------------------------------------------------------------------
    def home(self) -> str:
        return self._home

    def exists(self, path: str) -> bool:
        return path in self.files or path.rstrip("/") in self.dirs

    def mkdir(self, path: str) -> None:
        parts = path.rstrip("/").split("/")
        self.dirs |= {"/".join(parts[:i]) or "/" for i in range(1, len(parts) + 1)}

    def _need_parent(self, path: str) -> None:
        parent = path.rsplit("/", 1)[0] or "/"
        if parent not in self.dirs:
            raise HostError(self.name, f"write {path}", 1, stderr=f"{parent}: No such file or directory")

    def write_text(self, path: str, text: str, mode: int = 0o600) -> None:
        self._need_parent(path)
        self.files[path] = text

    def read_text(self, path: str, *, max_bytes: int | None = None) -> str:
        if path not in self.files:
            raise HostError(self.name, f"cat {path}", 1, stderr=f"cat: {path}: No such file or directory")
        data = self.files[path].encode()
        return (data[-max_bytes:] if max_bytes else data).decode("utf-8", "replace")

    def line_count(self, path: str) -> int:
        return self.files.get(path, "").count("\n")

    def remove(self, path: str) -> None:
        self.files.pop(path, None)

    def free_space(self, paths: Sequence[str]) -> dict[str, tuple[int, str]]:
        return {p: (self._free, "/") for p in paths}

    def put(self, local: str | Path, remote: str, mode: int = 0o600) -> None:
        self.write_text(remote, Path(local).read_text(), mode)

    def get(self, remote: str, local: str | Path) -> None:
        Path(local).write_text(self.read_text(remote))

    # --- processes ------------------------------------------------------------------------------------
    def start_detached(self, argv: Sequence[str], *, env: Mapping[str, str] | None, log_path: str,
                       cwd: str | None = None) -> int:
        """A new session and process group led by the new pid; the log file is created empty."""
        self._next_pid += 1
        pid = self._next_pid
        proc = ProcInfo(pid, 1, pid, [str(a) for a in argv], dict(env or {}), pid, pid)
        self.processes_started.append(proc)
        self._live[pid] = proc
        self.write_text(log_path, "")
        return pid

    def exit(self, pid: int) -> None:
        """Let process `pid` end on its own (as a server that crashes); its port is freed."""
        self._live.pop(pid, None)
        self.listening = {port: p for port, p in self.listening.items() if p != pid}

    def signal_group(self, pgid: int, sig: int = signal.SIGTERM) -> bool:
        members = [p.pid for p in self._live.values() if p.pgid == pgid]
        if sig in _FATAL:
            for pid in members:
                self.exit(pid)
        return bool(members)

    def signal_pid(self, pid: int, sig: int = signal.SIGTERM) -> bool:
        if pid not in self._live:
            return False
        if sig in _FATAL:
            self.exit(pid)
        return True

    def alive(self, pid: int) -> bool:
        return pid in self._live

    def processes(self, pgid: int | None = None) -> list[ProcInfo]:
        return [p for p in self._live.values() if pgid is None or p.pgid == pgid]

    def port_holders(self, port: int) -> list[ProcInfo]:
        pid = self.listening.get(port)
        return [self._live[pid]] if pid is not None and pid in self._live else []
