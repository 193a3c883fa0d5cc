"""Server lifecycle on a host: launch detached with an explicit environment, wait ready, verify, stop.

The launch puts the requested variables on the command itself (`env K=V ... engine ...`), in a new
session (`setsid`), with a tag variable `SPECTRIAL_TAG` (and `SPECTRIAL_OWNER`, the controlling spectrial process:
`spectrial.ownership`) so spectrial can later recognise what it started. A state file on the host
(`<state_dir>/server-<port>.json`) names the start (tag, owner, run record) BEFORE the process exists, then its
pid, pgid, session and the helpers started with it (the GPU sampler); the next trial's "kill old server" step
reads it: it stops what carries the tag when the owning run is gone, and refuses when that run is alive.
Stopping signals the recorded process groups only.

A multi-node server is the head `Server` plus `companions`: servers on the other nodes (llama.cpp
`rpc-server` workers, SGLang ranks > 0), each with its own state file on its node, started before or
after the head, checked while the head loads, and stopped on every node with the head.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from spectrial import interrupts
from spectrial.errors import ConfigError, ResourceBusyError, ServerError
from spectrial.hosts.gpu import query as gpu_query
from spectrial.hosts.local import Host, ProcInfo
from spectrial.measure.httpread import PROBE, Limits, bounded_client
from spectrial.ownership import OWNER_VAR, controller, describe, owner_env, owner_state, parse_owner
from spectrial.progress import Progress
from spectrial.schema import CompanionInfo, CompanionStop, EnvCheckRecord, ServerInfo, StopReport, utc_now
from spectrial.secrets import MaskedLaunch, mask_launch
from spectrial.servers.envcheck import (
    PROBE_DIR_VAR,
    PROBE_NAMES_VAR,
    check_env,
    parse_probe_records,
    probe_script,
    summarize_check,
)

TAG_VAR = "SPECTRIAL_TAG"
LOG_TAIL_LINES = 40
MIN_FREE_WORK_BYTES = 16 * 2**20  # server logs grow during a run; refuse to start below this
MIN_FREE_STATE_BYTES = 256 * 2**10
_SAFE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,119}$")


def fold_repeats(lines: list[str], n: int) -> list[str]:
    """The last `n` entries of a log, a run of lines that differ only in their numbers (a probe's access line once
    a second, a heartbeat) folded into its first line and a count: a server that answered 503 for a minute must not
    push the line that says why out of an error's tail."""
    runs: list[list[Any]] = []  # [first line, key, count, last line]
    for line in lines:
        key = re.sub(r"\d+", "#", line)
        if runs and runs[-1][1] == key:
            runs[-1][2] += 1
            runs[-1][3] = line
        else:
            runs.append([line, key, 1, line])
    out: list[str] = []
    for first, _, count, last in runs[-n:]:
        out.append(first)
        if count == 2:
            out.append(last)
        elif count > 2:
            out.append(f"    ... {count - 2} more line(s) like it, then: {last}")
    return out


@dataclass
class Probe:
    """Result of one readiness probe."""

    ready: bool
    detail: str


ProbeFn = Callable[[httpx.Client, str], Probe]
ExitFn = Callable[[str, "int | None", str], "tuple[bool | None, list[str]]"]


def classify_exit(how: str, code: int | None, log_tail: str) -> tuple[bool | None, list[str]]:
    """Was a stop clean? (clean, evidence): exit 0 or death by the SIGTERM spectrial sent is clean; SIGKILL
    after the grace period, or any other status, is not. Engines that exit otherwise bring their own rule."""
    if how == "gone":
        return None, [f"the server had already exited (exit code {code})"]
    if how == "KILL":
        return False, [f"still running after stop_grace_s: SIGKILLed (exit code {code})"]
    if code in (0, 143, -15, 130):
        return True, [f"exit code {code} after SIGTERM"]
    return False, [f"exit code {code} after SIGTERM"]


@dataclass
class LaunchSpec:
    """What to start: argv, the variables to put on the command, the port and the readiness probe."""

    argv: list[str]
    env: dict[str, str]
    port: int
    probe: ProbeFn
    name: str = "server"
    bind: str = "127.0.0.1"
    http: bool = True  # reached over HTTP (through `Host.client_url`); False for e.g. rpc-server workers
    notes: list[str] = field(default_factory=list)  # what the adapter adjusted or could not check
    probe_timeout_s: float = 2.0  # one readiness probe (SGLang's /health runs a generation: ~1 s)
    poll_s: float = 0.1  # between probes
    python: bool = False  # a Python server: its processes get spectrial's environment probe (spectrial.servers.envcheck)
    exit_rule: ExitFn = classify_exit  # (how it was stopped, exit code, log tail) -> (clean?, evidence)
    scratch_var: str | None = None  # a variable naming a folder where the engine leaves runtime files it never
    # removes (vLLM's ZMQ sockets, /tmp/<uuid> by default: VLLM_RPC_BASE_PATH): each start gets a fresh short folder
    # (a socket path has at most 107 bytes), removed when the start ends. A value in `env` is the user's: kept.
    term_again_s: float | None = None  # a second SIGTERM this long after the first (an engine busy with a request
    # finishes it before it exits: llama-server exits at once on the second signal)

    def __post_init__(self) -> None:
        if not _SAFE_NAME_RE.match(self.name):
            raise ConfigError(f"arms[].name: the server name {self.name!r} (made from the arm name) becomes a file "
                              "name on the host and in the run record; use letters, digits, '.', '_', '+' and '-' "
                              "only (at most 100 characters), starting with a letter or digit")


@dataclass
class Companion:
    """A server on another node that belongs to a head server (rpc-server worker, SGLang rank > 0)."""

    server: Server
    node: str
    before_head: bool = True  # started (and waited for) before the head; else started right after it
    ready_timeout_s: float = 120


class ProcessRef(BaseModel):
    """A process as a state file names it: pid and start time (clock ticks since boot; together, one process)."""

    pid: int
    start_ticks: int = 0


class HelperRef(BaseModel):
    """A helper process group of a start (the GPU sampler)."""

    kind: str
    pgid: int


Owner = dict[str, str | int | float]  # the controller (`spectrial.schema.Controller`: host, boot_id, pid, ...)


class ServerState(BaseModel):
    """The state file spectrial keeps per port (`<state_dir>/server-<port>.json`): the last start on it, written
    before its process exists and updated as it runs (pid, group, members, helpers); the next kill step reads it.
    An unreadable file reads as `corrupt` (with its `path`)."""

    model_config = ConfigDict(extra="allow")

    status: str = "launching"
    tag: str | None = None
    owner: Owner | None = None
    run_id: str | None = None
    arm: str | None = None
    name: str | None = None
    record: str | None = None  # the run record's folder
    port: int | None = None
    argv: list[str] = Field(default_factory=list)  # masked
    env: dict[str, str] = Field(default_factory=dict)  # masked
    log: str | None = None
    started_at: str | None = None
    members: list[ProcessRef] = Field(default_factory=list)
    helpers: list[HelperRef] = Field(default_factory=list)
    pid: int | None = None
    pgid: int | None = None
    sid: int | None = None
    start_ticks: int | None = None
    boot_id: str | None = None
    scratch: str | None = None  # the start's scratch folder (LaunchSpec.scratch_var), removed by its stop
    corrupt: bool = Field(False, exclude=True)
    path: str | None = Field(None, exclude=True)


class PreviousServer(BaseModel):
    """What the kill step found in the state file."""

    pid: int | None = None
    pgid: int | None = None
    tag: str | None = None
    started_at: str | None = None
    run_id: str | None = None
    arm: str | None = None
    status: str | None = None
    record: str | None = None
    log: str | None = None
    name: str | None = None


class Abandoned(BaseModel):
    """The run that left a server on the port and is gone: its record and log (the session settles it)."""

    run_id: str | None = None
    record: str | None = None
    log: str | None = None
    name: str | None = None
    owner: Owner | None = None
    owner_state: str = "unknown"
    settled: str | None = None  # what was done to its record


class StoppedProcess(BaseModel):
    pid: int
    command: str


class KillReport(BaseModel):
    """The kill step on one host: what the state file named, what was stopped, the run it belonged to."""

    port: int
    node: str | None = None  # another node of `hosts:` (None: the head)
    previous: PreviousServer | None = None
    action: str = "none"
    abandoned: Abandoned | None = None
    stopped: list[StoppedProcess] = Field(default_factory=list)


def remove_scratch(host: Host, folder: str | None) -> None:
    """Remove a start's scratch folder (only one spectrial made: /tmp/spectrial-*)."""
    if folder and re.fullmatch(r"/tmp/spectrial-[A-Za-z0-9]{8}", folder):
        host.run(["rm", "-rf", "--", folder], check=False)


def state_path(state_dir: str, port: int) -> str:
    return f"{state_dir.rstrip('/')}/server-{int(port)}.json"


def read_state(host: Host, state_dir: str, port: int) -> ServerState | None:
    """The state file of the server spectrial last started on `port`, or None."""
    path = state_path(state_dir, port)
    if not host.exists(path):
        return None
    try:
        return ServerState.model_validate_json(host.read_text(path))
    except ValueError:  # not JSON, or not a state file
        return ServerState(corrupt=True, path=path)


def boot_id(host: Host) -> str:
    """The host's boot id: process ids and start times only name the same processes within one boot."""
    res = host.run(["cat", "/proc/sys/kernel/random/boot_id"], check=False, rerun_if_lost=True)
    return res.stdout.strip()


def server_processes(host: Host, state: ServerState) -> tuple[list[ProcInfo], list[ProcInfo]]:
    """(ours, others): the live processes of a recorded server, told apart from strangers in its group.

    A process is the recorded server's when its (pid, start time) is one the state file recorded (the
    launched process, and every member seen once it was ready), or when its environment carries the
    recorded tag, or when it is in the recorded process group and session and started after the launched
    process did while that process, if alive, is the recorded one (children of a launched process that was
    killed alone keep its group and session, and renamed children have no readable tag). Nothing matches
    after a reboot (another boot id).
    """
    pgid = state.pgid or 0
    procs = host.processes(pgid) if pgid else []
    if not procs:
        return [], []
    if state.boot_id and state.boot_id != boot_id(host):
        return [], procs
    members = {(m.pid, m.start_ticks) for m in state.members}
    members.add((state.pid or 0, state.start_ticks or 0))
    start = state.start_ticks or 0
    leader = next((p for p in procs if p.pid == pgid), None)
    leader_ok = leader is None or not start or leader.start_ticks == start
    ours, others = [], []
    for p in procs:
        tagged = p.environ is not None and p.environ.get(TAG_VAR) == state.tag
        known = (p.pid, p.start_ticks) in members
        grouped = leader_ok and bool(start) and p.sid == (state.sid or pgid) and p.start_ticks >= start
        (ours if tagged or known or grouped else others).append(p)
    return ours, others


def tagged(host: Host, tag: str, procs: list[ProcInfo] | None = None) -> list[ProcInfo]:
    """Live processes carrying start `tag` (the server's own, or a helper's: `<tag>:<kind>`) in their
    exec-time environment."""
    procs = host.processes() if procs is None else procs
    return [p for p in procs if p.environ is not None and
            (p.environ.get(TAG_VAR) == tag or str(p.environ.get(TAG_VAR, "")).startswith(tag + ":"))]


def stop_groups(host: Host, procs: list[ProcInfo], grace_s: float) -> str:
    """Stop the process groups (sessions, from setsid) of `procs`; returns how each went, in a few words."""
    out = []
    for g in sorted({p.pgid for p in procs if p.pgid > 1}):
        out.append(f"pgid {g}: {host.stop_group(g, grace_s)}")
    return "; ".join(out) or "nothing to stop"


def _busy(port: int, host: Host, st: ServerState, who: str, procs: list[ProcInfo]) -> ResourceBusyError:
    why = ("its run is still going" if who == "alive" else
           "its run is controlled from another machine, so spectrial cannot tell whether it is still going")
    return ResourceBusyError(
        f"port {port} on {host.name} is used by spectrial run {st.run_id or '?'} (arm {st.arm or '?'}, "
        f"started {st.started_at or '?'}, controlled by {describe(st.owner or {})}): {why}. Its processes:\n"
        + "\n".join(f"  pid {p.pid}: {mask_launch(p.cmdline).argv_line[:200]}" for p in procs[:8]),
        resource="port", holders=[(p.pid, p.command) for p in procs],
        hint="wait for that run, choose another port (-p port=...), or, if that run is over, take its server "
             "over with -p takeover=true")


def stop_previous(host: Host, port: int, state_dir: str, grace_s: float = 15, takeover: bool = False
                  ) -> KillReport:
    """The protocol's "kill old server" step.

    The state file spectrial keeps for `port` names the last start on it (written before its process existed):
    when the run that owns it is gone (or is this process, or `takeover`), every process of that start is stopped
    — the recorded process group once shown to be that server's (`server_processes`), and whatever carries its
    tag (a launch cut before its pid was recorded, the GPU sampler); `report.abandoned` then names that run's
    record and server log. When the owning run is alive (or on another machine and its processes live), the step
    refuses, naming that run and its processes. A process on the port that carries a spectrial tag but has no
    state file is judged by the owner in its environment the same way; anything else on the port is refused,
    with its pid and command line.
    """
    report = KillReport(port=port)
    st = read_state(host, state_dir, port)
    actions = []
    if st and not st.corrupt:
        report.previous = PreviousServer.model_validate(st.model_dump(include=set(PreviousServer.model_fields)))
        who = owner_state(st.owner)  # the controller as the state file keeps it
        procs = host.processes()
        ours, others = server_processes(host, st) if st.pgid else ([], [])
        mine = tagged(host, st.tag, procs) if st.tag else []
        live = list({p.pid: p for p in [*ours, *mine]}.values())
        if live and (who == "alive" or who == "unknown" and st.owner and not takeover):
            raise _busy(port, host, st, who, live)
        if live:
            report.stopped = [StoppedProcess(pid=p.pid, command=mask_launch(p.cmdline).argv_line[:200]) for p in live]
            how = stop_groups(host, live, grace_s)
            actions.append(f"stopped previous spectrial server of run {st.run_id} ({how}), "
                           f"{len(live)} process(es)")
        elif others:
            actions.append(f"state file pgid {st.pgid} now belongs to other processes: left alone")
        else:
            actions.append("previous server already gone")
        if who != "alive":
            report.abandoned = Abandoned(run_id=st.run_id, record=st.record, log=st.log, name=st.name, owner=st.owner,
                                         owner_state=who)
        if not others:  # its processes are gone now: so is what they used
            remove_scratch(host, st.scratch)
        host.remove(state_path(state_dir, port))
    elif st:
        host.remove(str(st.path))
        actions.append("removed corrupt state file")
    holders = host.port_holders(port)
    if holders:  # a spectrial process without a state file (removed, or a launch cut before it was written)
        procs = host.processes()
        for h in holders:
            group = [p for p in procs if h.pgid and p.pgid == h.pgid]
            env = next((p.environ for p in group if p.environ and p.environ.get(TAG_VAR)), None)
            if env is None:
                continue
            owner = parse_owner(env.get(OWNER_VAR))
            who = owner_state(owner)
            tag = env[TAG_VAR]
            if who == "alive" or who == "unknown" and owner and not takeover:
                raise _busy(port, host, ServerState(tag=tag, run_id=tag.split(":")[0],
                                                    owner=owner.model_dump(exclude={"job"}) if owner else {},
                                                    arm=(tag.split(":")[1:2] or [None])[0]), who, group)
            actions.append(f"stopped a spectrial server of run {tag.split(':')[0]} that no state file named "
                           f"({stop_groups(host, group, grace_s)})")
        holders = host.port_holders(port)
    if holders:
        raise ResourceBusyError(
            f"port {port} on {host.name} is held by a process spectrial did not start:\n"
            + "\n".join(f"  pid {p.pid}: {p.command}" for p in holders),
            resource="port", holders=[(p.pid, p.command) for p in holders],
            hint="stop it yourself, or choose another port (-p port=...)")
    report.action = "; ".join(actions) or "none"
    return report


class Server:
    """A server process group on a host; use as a context manager so it is always stopped."""

    def __init__(self, host: Host, spec: LaunchSpec, *, work_dir: str, state_dir: str, tag: str,
                 grace_s: float = 15, run_id: str = "", arm: str = "", record_dir: str = "") -> None:
        self.host, self.spec = host, spec
        self.work_dir, self.state_dir = work_dir, state_dir
        self.tag, self.grace_s, self.run_id, self.arm = tag, grace_s, run_id, arm
        self.record_dir = record_dir
        self.owner = controller()
        self.log_path = f"{work_dir.rstrip('/')}/{spec.name}.log"
        self.exit_path = f"{work_dir.rstrip('/')}/{spec.name}.exit"
        self.pid: int | None = None
        self.base_url = ""
        self.started_at = ""
        self.ready_s: float | None = None
        self.stop_report: StopReport | None = None  # set by the stop
        self.companions: list[Companion] = []
        self.state = ServerState()
        self.probe_dir = ""
        self.scratch_dir: str | None = None
        self._inherited_pythonpath = ""
        self._t0 = 0.0

    @property
    def shown(self) -> MaskedLaunch:
        """The launch as the state file and errors show it (masked: `spectrial.secrets.mask_launch`)."""
        return mask_launch(self.spec.argv, self.spec.env)

    # --- lifecycle -----------------------------------------------------------------------------------
    @property
    def launch_env(self) -> dict[str, str]:
        """The environment put on the command: the requested variables, the tag, and for a Python server with
        requested variables the environment probe (its folder first on PYTHONPATH)."""
        env = {**self.spec.env, TAG_VAR: self.tag, OWNER_VAR: owner_env(self.owner)}
        if self.scratch_dir and self.spec.scratch_var:
            env[self.spec.scratch_var] = self.scratch_dir
        if self.probe_dir:
            base = self.spec.env.get("PYTHONPATH", self._inherited_pythonpath)
            env.update({PROBE_DIR_VAR: self.probe_dir, PROBE_NAMES_VAR: ",".join(self.spec.env),
                        "PYTHONPATH": ":".join(x for x in (self.probe_dir, base) if x)})
        return env

    def start(self) -> Server:
        """Start the companions meant to come first, then the server detached, then the other companions.

        The state file is written right after the launch, with interrupts held in between; if that fails the
        server is stopped again, so no process is ever left without the state file that lets the next trial
        find it. Any exception from here on (an interrupt included) stops what was started.
        """
        before = [c for c in self.companions if c.before_head]
        try:
            self._start_companions(before, wait=True)
            self._launch()
            self._start_companions([c for c in self.companions if not c.before_head], wait=False)
        except BaseException:
            self.stop()  # itself, when launched (an interrupt delivered right after the launch), and companions
            raise
        return self

    def _launch(self) -> None:
        self.host.require_free_space({self.work_dir: MIN_FREE_WORK_BYTES, self.state_dir: MIN_FREE_STATE_BYTES},
                                     "work_dir / state_dir")
        self.host.mkdir(self.work_dir)
        self.host.mkdir(self.state_dir)
        self.host.remove(self.exit_path)
        if self.spec.python and self.spec.env:
            self.probe_dir = f"{self.work_dir.rstrip('/')}/{self.spec.name}.envprobe"
            self.host.run(["rm", "-rf", "--", self.probe_dir], check=False)
            self.host.mkdir(self.probe_dir)
            self.host.write_text(f"{self.probe_dir}/sitecustomize.py", probe_script(TAG_VAR))
            self._inherited_pythonpath = self.host.run('printf %s "${PYTHONPATH:-}"', check=False).stdout
        if self.spec.scratch_var and self.spec.scratch_var not in self.spec.env:
            self.scratch_dir = self.host.run(["mktemp", "-d", "/tmp/spectrial-XXXXXXXX"]).stdout.strip()
        # the wrapper records the engine's exit status; its TERM trap keeps it alive until the engine is gone
        # (a trap, unlike an ignored signal, is not inherited by the engine); then it removes the scratch folder
        wrapped = ["sh", "-c", 'trap : TERM INT HUP; d=$1; shift; "$@"; s=$?; [ -z "$d" ] || rm -rf -- "$d"; '
                   'echo $s > "$0"', self.exit_path, self.scratch_dir or "", *self.spec.argv]
        self._t0 = time.monotonic()
        self.started_at = utc_now()
        # the state file names the start before its process exists: whatever happens next (this process
        # killed, the launching shell killed with it), the next kill step finds the server by its tag
        self.state = ServerState(status="launching", tag=self.tag, owner=self.owner.model_dump(exclude={"job"}),
                                 run_id=self.run_id,
                                 arm=self.arm, name=self.spec.name, record=self.record_dir, port=self.spec.port,
                                 argv=self.shown.argv, env=self.shown.env, log=self.log_path,
                                 started_at=self.started_at, scratch=self.scratch_dir)
        # held from the state file's writing on (an interrupt right after it left a `launching` file behind, seen in
        # the chaos test): the pid is recorded, or the file dropped, before an interrupt is let through
        with interrupts.deferred():
            try:
                self._write_state()
                self.pid = self.host.start_detached(wrapped, env=self.launch_env, log_path=self.log_path,
                                                    cwd=self.work_dir)
                self.state.status = "running"
                self.state.pid = self.state.pgid = self.state.sid = self.pid  # setsid: its own group and session
                leader = next((p for p in self.host.processes(self.pid) if p.pid == self.pid), None)
                self.state.start_ticks = leader.start_ticks if leader else 0
                self.state.boot_id = boot_id(self.host)
                self._write_state()
                if self.spec.http:
                    self.base_url = self.host.client_url(self.spec.port, self.spec.bind)
            except BaseException:
                if self.pid is not None:
                    self.host.stop_group(self.pid, self.grace_s)
                self._stop_half_launched()
                self.pid = None
                remove_scratch(self.host, self.scratch_dir)
                self._drop_state()
                raise

    def _write_state(self) -> None:
        self.host.write_text(state_path(self.state_dir, self.spec.port),
                             json.dumps(self.state.model_dump(mode="json"), indent=1))

    def _stop_half_launched(self, wait_s: float = 1.5) -> None:
        """A launch cut half-way (its shell killed with this process's group, say): the server may be starting
        (its tag appears once `env` has run), so look for it a little while, and stop what carries the tag."""
        deadline = time.monotonic() + wait_s
        while True:
            found = tagged(self.host, self.tag)
            if found:
                stop_groups(self.host, found, self.grace_s)
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)

    def _drop_state(self) -> None:
        """Remove the state file when it is this start's."""
        st = read_state(self.host, self.state_dir, self.spec.port)
        if st and st.tag == self.tag:
            self.host.remove(state_path(self.state_dir, self.spec.port))

    def helper_env(self, kind: str) -> dict[str, str]:
        """The environment a helper process of this start carries (`<tag>:<kind>` and the owner): the kill step
        finds it by that, whatever happened to this process."""
        return {TAG_VAR: f"{self.tag}:{kind}", OWNER_VAR: owner_env(self.owner)}

    def add_helper(self, kind: str, pgid: int | None) -> None:
        """Note a helper's process group in the state file."""
        if pgid is not None:
            self.state.helpers.append(HelperRef(kind=kind, pgid=int(pgid)))
            self._write_state()

    def record_members(self) -> list[ProcInfo]:
        """Note every live process of the server (pid and start time) in its state file, so that the next
        kill step finds them even when the launched process died alone; returns them."""
        procs = self.host.process_tree(self.pid) if self.pid is not None else []
        known = {(m.pid, m.start_ticks) for m in self.state.members}
        self.state.members += [ProcessRef(pid=p.pid, start_ticks=p.start_ticks) for p in procs
                               if (p.pid, p.start_ticks) not in known]
        self._write_state()
        return procs

    def _start_companions(self, companions: list[Companion], wait: bool) -> None:
        """Start `companions` on their nodes in parallel (and wait until each is ready when `wait`)."""
        def one(c: Companion) -> None:
            c.server.start()
            if wait:
                c.server.wait_ready(c.ready_timeout_s, progress=False)

        on_each([(f"{c.node}: {c.server.spec.name}", lambda c=c: one(c)) for c in companions])

    def _stop_companions(self) -> list[CompanionStop]:
        """Stop every companion that was started, on every node in parallel; raises after trying them all."""
        started = [c for c in self.companions if c.server.pid is not None]
        reports = on_each([(f"{c.node}: {c.server.spec.name}", c.server.stop) for c in started])
        return [CompanionStop(node=c.node, name=c.server.spec.name, **(r.model_dump() if r else {}))
                for c, r in zip(started, reports, strict=True)]

    def exit_code(self) -> int | None:
        """The engine's exit code once it has exited (None while running or when killed by a signal)."""
        if not self.host.exists(self.exit_path):
            return None
        txt = self.host.read_text(self.exit_path).strip()
        return int(txt) if txt.lstrip("-").isdigit() else None

    def running(self) -> bool:
        """The engine has not exited (no exit file) and its session (= group, from setsid) has a live process.

        One command on the host, so the readiness loop can check every half second even over SSH.
        """
        if self.pid is None:
            return False
        res = self.host.run(f"test ! -e {shlex.quote(self.exit_path)} && ps -o stat= -s {int(self.pid)} | "
                            "grep -qv '^Z'", check=False, rerun_if_lost=True)
        return res.ok

    def _gone(self) -> bool:
        """The engine has exited, as the readiness loop concludes it: its exit file says so, or two looks 0.5 s
        apart find no live process in its session. One look once found a live llama-server gone (`make test`, two
        lanes on 2 cores: the server was stopped by SIGTERM right after, exit 0, 83 ms after it listened); a
        second look costs nothing where the engine really died."""
        if self.running():
            return False
        if self.exit_code() is not None:
            return True
        time.sleep(0.5)
        return not self.running()

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        """The last `n` lines of the server's log, the launch's secret values redacted (errors print it)."""
        try:
            text = self.host.read_text(self.log_path, max_bytes=256 * 1024)
        except Exception as exc:  # the log may not exist yet
            return f"(log unreadable: {exc})"
        return self.shown.redact("\n".join(fold_repeats(text.splitlines(), n)))

    def wait_ready(self, timeout_s: float, progress: bool = True) -> float:
        """Poll the engine's probe until ready; fail fast if the process dies. Returns seconds to ready."""
        deadline = self._t0 + timeout_s
        last = "not probed yet"
        poll_s = self.spec.poll_s
        bar = Progress(f"waiting for {self.spec.name}", unit="probe", enabled=progress, heartbeat=True)
        check_every = max(1, int(0.5 / poll_s))
        n = 0
        try:
            probe = Limits(deadline_s=self.spec.probe_timeout_s, read_s=self.spec.probe_timeout_s,
                           max_bytes=PROBE.max_bytes, connect_s=1.0)
            with bounded_client(probe) as client:
                while True:
                    n += 1
                    try:
                        pr = self.spec.probe(client, self.base_url)
                        last = pr.detail
                        if pr.ready:
                            self.ready_s = time.monotonic() - self._t0
                            bar.close(f"ready after {n} probe(s), {self.ready_s:.1f} s from launch")
                            return self.ready_s
                    except httpx.HTTPError as exc:
                        last = f"{type(exc).__name__}: {exc}"
                    if (n - 1) % check_every == 0:
                        self._check_companions()
                    if (n - 1) % check_every == 0 and self._gone():
                        code = self.exit_code()
                        raise ServerError(
                            f"{self.spec.name} exited before it became ready (exit code "
                            f"{code if code is not None else 'unknown: killed by a signal?'}) on {self.host.name}"
                            f"\ncommand: {self.shown.argv_line}"
                            f"\n--- last {LOG_TAIL_LINES} log lines ({self.log_path}) ---\n{self.log_tail()}",
                            phase="start", name=self.spec.name, exit_code=code,
                            command=self.shown.argv_line, log_path=self.log_path,
                            log_tail=self.log_tail())
                    if time.monotonic() >= deadline:
                        raise ServerError(
                            f"{self.spec.name} not ready after {timeout_s:.0f} s at {self.base_url} "
                            f"(last probe: {last})\n--- last {LOG_TAIL_LINES} log lines ---\n{self.log_tail()}",
                            phase="ready", name=self.spec.name, command=self.shown.argv_line,
                            log_path=self.log_path, log_tail=self.log_tail(),
                            hint="raise ready_timeout_s if the model is large")
                    bar.update(1)
                    bar.set_postfix_str(last[:80])
                    time.sleep(poll_s)
        finally:
            bar.close(f"gave up after {n} probe(s) (last: {last[:80]})")

    def _check_companions(self) -> None:
        """Raise ServerError naming the first companion that is no longer running (with its log tail)."""
        for c in self.companions:
            if c.server.pid is not None and not c.server.running():
                raise ServerError(
                    f"{c.server.spec.name} on {c.node} (needed by {self.spec.name}) exited (exit code "
                    f"{c.server.exit_code()})\n--- last {LOG_TAIL_LINES} log lines ({c.server.log_path}) ---\n"
                    f"{c.server.log_tail()}", phase="start", name=c.server.spec.name,
                    exit_code=c.server.exit_code(), log_path=c.server.log_path, log_tail=c.server.log_tail())

    def lost(self, exc: BaseException) -> ServerError:
        """The error for a ready server that stopped answering: dead (exit code + log tail) or unreachable."""
        dead = [c for c in self.companions if c.server.pid is not None and not c.server.running()]
        if self.pid is not None and not self.running():
            code = self.exit_code()
            return ServerError(
                f"{self.spec.name} died during the run on {self.host.name} (exit code "
                f"{code if code is not None else 'unknown: killed by a signal?'}) after {type(exc).__name__}: {exc}"
                f"\n--- last {LOG_TAIL_LINES} log lines ({self.log_path}) ---\n{self.log_tail()}",
                phase="lost", name=self.spec.name, exit_code=code, log_path=self.log_path, log_tail=self.log_tail())
        if dead:
            c = dead[0]
            return ServerError(
                f"{c.server.spec.name} on {c.node} (needed by {self.spec.name}) died during the run (exit code "
                f"{c.server.exit_code()}); the head failed with {type(exc).__name__}: {exc}"
                f"\n--- last {LOG_TAIL_LINES} log lines ({c.server.log_path}) ---\n{c.server.log_tail()}",
                phase="lost", name=c.server.spec.name, exit_code=c.server.exit_code(), log_path=c.server.log_path,
                log_tail=c.server.log_tail())
        return ServerError(f"{self.spec.name} on {self.host.name} is still running but stopped answering at "
                           f"{self.base_url}: {type(exc).__name__}: {exc}", phase="lost", name=self.spec.name)

    def processes(self) -> list[ProcInfo]:
        """Every process of the server's tree (the group and descendants), excluding the sh wrapper."""
        if self.pid is None:
            return []
        procs = self.host.process_tree(self.pid)
        return [p for p in procs if p.pid != self.pid] or procs

    def verify_env(self, requested: dict[str, str] | None = None) -> EnvCheckRecord:
        """Check the requested variables (default: the launch env) in every server process, on every node."""
        want = dict(self.spec.env if requested is None else requested)
        launched = self.launch_env
        probes = {}
        if self.probe_dir:
            out = self.host.run(f"cat {shlex.quote(self.probe_dir)}/*.json 2>/dev/null", check=False)
            probes = parse_probe_records(out.stdout)
        check = check_env(self.processes(), want, TAG_VAR, launched=launched, probes=probes)
        for c in self.companions:
            other = c.server.verify_env(requested)
            check.ok = bool(check.ok and other.ok)
            check.processes += [row.model_copy(update={"node": c.node}) for row in other.processes]
            check.problems += [f"{c.node}: {m}" for m in other.problems]
        check.summary = summarize_check(check)
        return check

    def stop(self) -> StopReport | None:
        """Stop the group (TERM, then KILL after the grace), confirm port and GPUs free, drop the state.

        Then stop the companions on their nodes (all of them, even when one stop fails).
        """
        with interrupts.deferred():  # a second Ctrl-C waits for the stop (bounded by stop_grace_s)
            try:
                report = self._stop_self()
            finally:
                if self.companions:
                    companions = self._stop_companions()
                    if self.stop_report is not None:
                        self.stop_report.companions = companions
        return report

    def _stop_self(self) -> StopReport | None:
        if self.pid is None:
            if self.state.tag and self.state.tag == self.tag:  # a start cut between its state file and its process
                self._drop_state()
            return None
        t0 = time.monotonic()
        engine = next((p.pid for p in self.host.processes(self.pid) if p.ppid == self.pid), None)
        termed = False
        if engine is not None and self.spec.term_again_s is not None:
            termed = self.host.signal_pid(engine, signal.SIGTERM)
            deadline = time.monotonic() + self.spec.term_again_s
            while time.monotonic() < deadline and self.host.alive(engine):
                time.sleep(0.05)
            if self.host.alive(engine):
                self.host.signal_pid(engine, signal.SIGTERM)
        how = self.host.stop_group(self.pid, self.grace_s, first=engine)
        if how == "gone" and termed:
            how = "TERM"
        port_free = False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not self.host.port_holders(self.spec.port):
                port_free = True
                break
            time.sleep(0.1)
        gpus = gpu_query(self.host)
        code = self.exit_code()
        clean, evidence = self.spec.exit_rule(how, code, self.log_tail(200))
        self.stop_report = StopReport(how=how, elapsed_s=round(time.monotonic() - t0, 3), port_free=port_free,
                                      gpu_available=gpus.available,
                                      gpu_mem_used_mib=[g.memory_used_mib for g in gpus.gpus], exit_code=code,
                                      clean=clean, evidence=evidence)
        remove_scratch(self.host, self.scratch_dir)  # the wrapper did, unless it was killed with the engine
        self._drop_state()
        self.pid = None
        return self.stop_report

    def info(self) -> ServerInfo:
        """The start as the record keeps it (`StartRecord.server`)."""
        return ServerInfo(pid=self.pid, tag=self.tag, log=self.log_path, url=self.base_url, started_at=self.started_at,
                          ready_s=self.ready_s, stop=self.stop_report,
                          companions=[CompanionInfo(node=c.node, name=c.server.spec.name, argv=c.server.shown.argv,
                                                    **dict(c.server.info())) for c in self.companions])

    def extra_logs(self) -> dict[str, str]:
        """Logs of the companions, fetched from their nodes: {file name: text} (an unreadable log says why)."""
        out = {}
        for c in self.companions:
            try:
                out[f"{c.server.spec.name}.log"] = c.server.host.read_text(c.server.log_path)
            except Exception as exc:  # noqa: BLE001 - a missing log is itself worth recording
                out[f"{c.server.spec.name}.log"] = f"(log of {c.node} not fetched: {exc})"
        return out

    def __enter__(self) -> Server:
        if self.pid is not None:  # already started (e.g. inside a timed step): just guard the stop
            return self
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        """Stop the server. When the block is already leaving on an exception (an interrupt, a lost connection),
        a failure of the stop itself is recorded in `stop_report` and the original exception goes on: Ctrl-C
        still exits 130 while the host cannot be reached."""
        if exc is None:
            self.stop()
            return
        try:
            self.stop()
        except Exception as stop_exc:  # noqa: BLE001 - kept in the record; the exception in flight matters more
            self.stop_report = (self.stop_report or StopReport()).model_copy(update={
                "error": f"{type(stop_exc).__name__}: {stop_exc}", "pid_left": self.pid, "host": self.host.name})


def on_each(jobs: list[tuple[str, Callable[[], Any]]]) -> list[Any]:
    """Run the jobs in parallel (one thread each); every job runs to its end, then the first error is raised."""
    if not jobs:
        return []
    if len(jobs) == 1:
        return [jobs[0][1]()]
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(fn) for _, fn in jobs]
        errors = [f.exception() for f in futures]
    for err in errors:
        if err is not None:
            raise err
    return [f.result() for f in futures]
