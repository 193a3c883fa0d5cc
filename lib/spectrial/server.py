"""Server lifecycle on a host: launch detached with an explicit environment, wait ready, verify, stop.

The launch puts the requested variables on the command itself (`env K=V ... engine ...`), in a new
session (`setsid`), with a tag variable `SPECTRIAL_TAG` so spectrial can later recognise what it started.
A state file on the host (`<state_dir>/server-<port>.json`) records pid, pgid, tag, argv and log path;
the next trial's "kill old server" step reads it. Stopping signals the recorded process group only.
"""

from __future__ import annotations

import json
import shlex
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from tqdm.auto import tqdm

from spectrial.errors import ResourceBusyError, ServerNotReadyError, ServerStartError
from spectrial.gpu import query as gpu_query
from spectrial.host import Host, ProcInfo
from spectrial.records import utc_now
from spectrial.secrets import is_secret_name, mask_argv, mask_env

TAG_VAR = "SPECTRIAL_TAG"
LOG_TAIL_LINES = 40


@dataclass
class Probe:
    """Result of one readiness probe."""

    ready: bool
    detail: str


ProbeFn = Callable[[httpx.Client, str], Probe]


@dataclass
class LaunchSpec:
    """What to start: argv, the variables to put on the command, the port and the readiness probe."""

    argv: list[str]
    env: dict[str, str]
    port: int
    probe: ProbeFn
    name: str = "server"
    bind: str = "127.0.0.1"


@dataclass
class EnvCheck:
    """Per process of the server tree: which requested variables it carries with the requested value."""

    ok: bool
    requested: dict[str, str]
    processes: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.ok:
            return (f"all {len(self.requested)} requested variables present in "
                    f"{len(self.processes)} process(es)")
        return "; ".join(self.missing)


def check_env(procs: list[ProcInfo], requested: Mapping[str, str]) -> EnvCheck:
    """Compare each process's exec-time environment with the requested variables."""
    rows, problems = [], []
    for p in procs:
        row: dict[str, Any] = {"pid": p.pid, "cmdline": mask_argv(p.cmdline), "present": [], "missing": [],
                               "wrong": {}, "readable": p.environ is not None}
        if p.environ is None:
            problems.append(f"pid {p.pid}: environment not readable")
        else:
            for k, v in requested.items():
                if k not in p.environ:
                    row["missing"].append(k)
                elif p.environ[k] != v:
                    row["wrong"][k] = p.environ[k]
                else:
                    row["present"].append(k)
            for k in row["missing"]:
                problems.append(f"{k} missing from pid {p.pid} ({shlex.join(p.cmdline)[:120]})")
            for k, got in row["wrong"].items():
                if is_secret_name(k):
                    problems.append(f"{k} has another value than requested (masked) in pid {p.pid}")
                else:
                    problems.append(f"{k}={got!r} instead of {requested[k]!r} in pid {p.pid}")
        row["wrong"] = mask_env(row["wrong"])
        rows.append(row)
    return EnvCheck(ok=not problems and bool(procs), requested=mask_env(dict(requested)), processes=rows,
                    missing=problems or ([] if procs else ["no server process found"]))


def state_path(state_dir: str, port: int) -> str:
    return f"{state_dir.rstrip('/')}/server-{int(port)}.json"


def read_state(host: Host, state_dir: str, port: int) -> dict[str, Any] | None:
    """The state file of the server spectrial last started on `port`, or None."""
    path = state_path(state_dir, port)
    if not host.exists(path):
        return None
    try:
        return json.loads(host.read_text(path))
    except (json.JSONDecodeError, ValueError):
        return {"corrupt": True, "path": path}


def _group_alive(host: Host, pgid: int) -> list[ProcInfo]:
    return host.processes(pgid)


def stop_group(host: Host, pgid: int, grace_s: float) -> str:
    """SIGTERM the group, SIGKILL after `grace_s`; returns 'gone', 'TERM' or 'KILL'."""
    if not _group_alive(host, pgid):
        return "gone"
    host.signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _group_alive(host, pgid):
            return "TERM"
        time.sleep(0.1)
    host.signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _group_alive(host, pgid):
        time.sleep(0.1)
    if _group_alive(host, pgid):
        raise ResourceBusyError(f"process group {pgid} on {host.name} survived SIGKILL")
    return "KILL"


def stop_previous(host: Host, port: int, state_dir: str, grace_s: float = 15) -> dict[str, Any]:
    """The protocol's "kill old server" step.

    Stops the server that spectrial's state file records for `port` (only if its processes still carry
    the recorded tag), then refuses, naming pid and command line, if anything else holds the port.
    """
    report: dict[str, Any] = {"port": port, "previous": None, "action": "none"}
    st = read_state(host, state_dir, port)
    if st and not st.get("corrupt"):
        report["previous"] = {k: st.get(k) for k in ("pid", "pgid", "tag", "started_at", "run_id", "arm")}
        procs = _group_alive(host, int(st["pgid"]))
        ours = [p for p in procs if p.environ is not None and p.environ.get(TAG_VAR) == st.get("tag")]
        if ours:
            report["action"] = f"stopped previous spectrial server (pgid {st['pgid']}): " + \
                               stop_group(host, int(st["pgid"]), grace_s)
        elif procs:
            report["action"] = f"state file pgid {st['pgid']} now belongs to other processes: left alone"
        else:
            report["action"] = "previous server already gone"
        host.remove(state_path(state_dir, port))
    elif st:
        host.remove(st["path"])
        report["action"] = "removed corrupt state file"
    holders = host.port_holders(port)
    if holders:
        raise ResourceBusyError(
            f"port {port} on {host.name} is held by a process spectrial did not start:\n"
            + "\n".join(f"  pid {p.pid}: {p.command}" for p in holders)
            + "\nStop it yourself, or choose another port (-p port=...)."
        )
    return report


class Server:
    """A server process group on a host; use as a context manager so it is always stopped."""

    def __init__(self, host: Host, spec: LaunchSpec, *, work_dir: str, state_dir: str, tag: str,
                 grace_s: float = 15, run_id: str = "", arm: str = "") -> None:
        self.host, self.spec = host, spec
        self.work_dir, self.state_dir = work_dir, state_dir
        self.tag, self.grace_s, self.run_id, self.arm = tag, grace_s, run_id, arm
        self.log_path = f"{work_dir.rstrip('/')}/{spec.name}.log"
        self.exit_path = f"{work_dir.rstrip('/')}/{spec.name}.exit"
        self.pid: int | None = None
        self.base_url = ""
        self.started_at = ""
        self.ready_s: float | None = None
        self.stop_report: dict[str, Any] = {}
        self._t0 = 0.0

    # --- lifecycle -----------------------------------------------------------------------------------
    @property
    def launch_env(self) -> dict[str, str]:
        return {**self.spec.env, TAG_VAR: self.tag}

    def start(self) -> Server:
        """Start the server detached; writes the state file before anything can fail later."""
        self.host.mkdir(self.work_dir)
        self.host.mkdir(self.state_dir)
        self.host.remove(self.exit_path)
        wrapped = ["sh", "-c", '"$@"; echo $? > "$0"', self.exit_path, *self.spec.argv]
        self._t0 = time.monotonic()
        self.started_at = utc_now()
        self.pid = self.host.start_detached(wrapped, env=self.launch_env, log_path=self.log_path,
                                            cwd=self.work_dir)
        state = {"pid": self.pid, "pgid": self.pid, "tag": self.tag, "port": self.spec.port,
                 "argv": mask_argv(self.spec.argv), "env": mask_env(self.spec.env), "log": self.log_path,
                 "started_at": self.started_at, "run_id": self.run_id, "arm": self.arm}
        self.host.write_text(state_path(self.state_dir, self.spec.port), json.dumps(state, indent=1))
        self.base_url = self.host.client_url(self.spec.port, self.spec.bind)
        return self

    def exit_code(self) -> int | None:
        """The engine's exit code once it has exited (None while running or when killed by a signal)."""
        if not self.host.exists(self.exit_path):
            return None
        txt = self.host.read_text(self.exit_path).strip()
        return int(txt) if txt.lstrip("-").isdigit() else None

    def running(self) -> bool:
        return self.pid is not None and bool(_group_alive(self.host, self.pid)) and self.exit_code() is None

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.host.read_text(self.log_path, max_bytes=64 * 1024)
        except Exception as exc:  # the log may not exist yet
            return f"(log unreadable: {exc})"
        return "\n".join(text.splitlines()[-n:])

    def wait_ready(self, timeout_s: float, poll_s: float = 0.1, progress: bool = True) -> float:
        """Poll the engine's probe until ready; fail fast if the process dies. Returns seconds to ready."""
        deadline = self._t0 + timeout_s
        last = "not probed yet"
        bar = tqdm(total=None, desc=f"waiting for {self.spec.name}", unit="probe", disable=not progress,
                   leave=False)
        check_every = max(1, int(0.5 / poll_s))
        n = 0
        try:
            with httpx.Client(timeout=httpx.Timeout(2.0, connect=1.0)) as client:
                while True:
                    n += 1
                    try:
                        pr = self.spec.probe(client, self.base_url)
                        last = pr.detail
                        if pr.ready:
                            self.ready_s = time.monotonic() - self._t0
                            return self.ready_s
                    except httpx.HTTPError as exc:
                        last = f"{type(exc).__name__}: {exc}"
                    if n % check_every == 1 and not self.running():
                        code = self.exit_code()
                        raise ServerStartError(
                            f"{self.spec.name} exited before it became ready (exit code "
                            f"{code if code is not None else 'unknown: killed by a signal?'}) on {self.host.name}"
                            f"\ncommand: {shlex.join(mask_argv(self.spec.argv))}"
                            f"\n--- last {LOG_TAIL_LINES} log lines ({self.log_path}) ---\n{self.log_tail()}")
                    if time.monotonic() >= deadline:
                        raise ServerNotReadyError(
                            f"{self.spec.name} not ready after {timeout_s:.0f} s at {self.base_url} "
                            f"(last probe: {last})\n--- last {LOG_TAIL_LINES} log lines ---\n{self.log_tail()}"
                            "\nhint: raise ready_timeout_s if the model is large")
                    bar.update(1)
                    bar.set_postfix_str(last[:40])
                    time.sleep(poll_s)
        finally:
            bar.close()

    def processes(self) -> list[ProcInfo]:
        """Every process of the server's tree (the group and descendants), excluding the sh wrapper."""
        if self.pid is None:
            return []
        procs = self.host.process_tree(self.pid)
        return [p for p in procs if p.pid != self.pid] or procs

    def verify_env(self, requested: Mapping[str, str] | None = None) -> EnvCheck:
        """Check the requested variables (default: the launch env) in every server process."""
        return check_env(self.processes(), dict(self.spec.env if requested is None else requested))

    def stop(self) -> dict[str, Any]:
        """Stop the group (TERM, then KILL after the grace), confirm port and GPUs free, drop the state."""
        if self.pid is None:
            return {}
        t0 = time.monotonic()
        how = stop_group(self.host, self.pid, self.grace_s)
        port_free = False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not self.host.port_holders(self.spec.port):
                port_free = True
                break
            time.sleep(0.1)
        gpus = gpu_query(self.host)
        self.stop_report = {"how": how, "elapsed_s": round(time.monotonic() - t0, 3), "port_free": port_free,
                            "gpu_available": gpus.available, "gpu_mem_used_mib":
                                [g.memory_used_mib for g in gpus.gpus], "exit_code": self.exit_code()}
        st = read_state(self.host, self.state_dir, self.spec.port)
        if st and st.get("tag") == self.tag:
            self.host.remove(state_path(self.state_dir, self.spec.port))
        self.pid = None
        return self.stop_report

    def info(self) -> dict[str, Any]:
        return {"pid": self.pid, "tag": self.tag, "log": self.log_path, "url": self.base_url,
                "started_at": self.started_at, "ready_s": self.ready_s, "stop": self.stop_report}

    def __enter__(self) -> Server:
        if self.pid is not None:  # already started (e.g. inside a timed step): just guard the stop
            return self
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def as_dict(obj: Any) -> dict[str, Any]:
    return asdict(obj)
