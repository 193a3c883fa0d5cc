"""Did the requested environment reach every process of a server? Per process and variable, and how it is known.

Every process spectrial launches inherits the tag variable (`SPECTRIAL_TAG`). A process's exec-time
environment (`/proc/<pid>/environ`) is then in one of three states:

    readable    the tag is there: the requested variables can be checked in it
    blanked     readable, but the tag is gone: the process overwrote that memory (setproctitle, as vLLM's
                EngineCore/Worker and SGLang's scheduler do) or cleared its environment; /proc cannot say
                what it inherited
    unreadable  another user's process, or gone

Python servers (vLLM, SGLang) get a probe as well: a `sitecustomize.py` in a folder of the run's work dir, put
first on the server's PYTHONPATH (the engine's own sitecustomize, if any, still runs: the probe chains to it).
Every Python process of the server, the spawned and forked workers included, writes at start-up, once its
interpreter has the environment it will run with, a one-line JSON file there: its pid, start time and, per
requested variable, a salted hash of the value it holds (no value is written in clear). The probe sees what
/proc cannot: a variable that reached a renamed worker, or one that a worker lost.

Per process and variable the check records how it knows: `probe` (the interpreter's own environment), `proc`
(the exec-time environment) or nothing (`unverified`: a blanked process without a probe record). A variable
missing or different where it is known fails the check; an unverified one is listed, not failed. NCCL's own
"set by environment" lines (spectrial.engines.nccl_evidence) confirm NCCL_* variables per rank after the run.

Strict where it matters (`strict_names`, `require_verified`): on a multi-GPU launch (tensor or data parallel
ranks > 1, or several nodes) the requested NCCL_* variables steer the collectives every rank runs, so there an
NCCL_* variable that nothing could verify in a server process fails the check too, and NCCL's own evidence
(with `engine_config.nccl_debug: true`) fails the start by default (`engine_config.nccl_evidence_check`); each
is relaxed only by `env_check: warn` / `engine_config.nccl_evidence_check: warn`.

`verified(starts)` says, for every reader, what a run's checks verified: how many requested variables (NCCL_*
apart), in how many server processes, by what (`EnvVerified.line`, on the headline and in report.html).
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Collection, Mapping, Sequence

from pydantic import BaseModel

from spectrial.hosts.local import ProcInfo
from spectrial.schema import EnvCheckRecord, ProcessEnvCheck, StartRecord
from spectrial.secrets import is_secret_name, mask_argv, mask_env

PROBE_DIR_VAR = "SPECTRIAL_ENV_PROBE"
PROBE_NAMES_VAR = "SPECTRIAL_ENV_PROBE_NAMES"

PROBE_SCRIPT = '''\
# spectrial's environment probe for one server start (spectrial.servers.envcheck): every Python process of the server
# records, at start-up, which requested variables its interpreter holds (salted hashes, no values), then the
# sitecustomize this one shadows runs as it would have.
import hashlib as _h, json as _j, os as _o, sys as _s


def _spectrial_chain():
    import importlib.machinery as _m, importlib.util as _u
    here = _o.path.dirname(_o.path.abspath(__file__))
    path = [p for p in _s.path if _o.path.abspath(p or ".") != here]
    spec = _m.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        mod = _u.module_from_spec(spec)
        spec.loader.exec_module(mod)


def _spectrial_record(when):
    try:
        where = _o.environ.get("{dir_var}")
        names = [n for n in _o.environ.get("{names_var}", "").split(",") if n]
        if not where or not _o.path.isdir(where):
            return
        salt = _o.environ.get("{tag_var}", "")
        try:
            with open("/proc/self/stat") as f:
                ticks = int(f.read().rpartition(")")[2].split()[19])
        except (OSError, ValueError, IndexError):
            ticks = 0
        held = {{n: (_h.sha256((salt + "\\0" + _o.environ[n]).encode()).hexdigest() if n in _o.environ else None)
                for n in names}}
        rec = {{"pid": _o.getpid(), "ppid": _o.getppid(), "start_ticks": ticks, "when": when,
               "argv": [str(a)[:80] for a in _s.argv[:3]], "vars": held}}
        tmp = _o.path.join(where, ".%d-%s.tmp" % (_o.getpid(), when))
        with open(tmp, "w") as f:
            f.write(_j.dumps(rec) + "\\n")
        _o.replace(tmp, _o.path.join(where, "%d-%s.json" % (_o.getpid(), when)))
    except Exception:
        pass


try:
    _spectrial_chain()
finally:
    _spectrial_record("start")
    if hasattr(_o, "register_at_fork"):
        _o.register_at_fork(after_in_child=lambda: _spectrial_record("fork"))
'''


def probe_script(tag_var: str) -> str:
    """The sitecustomize.py of the probe."""
    return PROBE_SCRIPT.format(dir_var=PROBE_DIR_VAR, names_var=PROBE_NAMES_VAR, tag_var=tag_var)


def value_hash(salt: str, value: str) -> str:
    """The probe's hash of one value (salted with the start's tag)."""
    return hashlib.sha256((salt + "\0" + value).encode()).hexdigest()


class ProbeRecord(BaseModel):
    """What the probe wrote for one process (PROBE_SCRIPT): pid, start time, and per requested variable the
    salted hash of its value (None: absent)."""

    pid: int
    ppid: int | None = None
    start_ticks: int = 0
    when: str = ""
    argv: list[str] = []
    vars: dict[str, str | None] = {}


def parse_probe_records(text: str) -> dict[int, ProbeRecord]:
    """Probe records by pid (a process started by exec writes one at start, a forked child one at fork); lines
    that are not a probe record are skipped."""
    out: dict[int, ProbeRecord] = {}
    for line in text.splitlines():
        try:
            rec = ProbeRecord.model_validate_json(line)
        except ValueError:
            continue
        out[rec.pid] = rec
    return out


def environ_state(p: ProcInfo, tag_var: str) -> str:
    """'readable', 'blanked' or 'unreadable' (see the module docstring)."""
    if p.environ is None:
        return "unreadable"
    return "readable" if tag_var in p.environ else "blanked"


def _probe_of(p: ProcInfo, probes: Mapping[int, ProbeRecord]) -> ProbeRecord | None:
    rec = probes.get(p.pid)
    if rec is None:
        return None
    ticks = rec.start_ticks
    return rec if not ticks or not p.start_ticks or ticks == p.start_ticks else None  # a recycled pid: not it


def _as_launched(requested: str, launched: str | None) -> str:
    """The value the process should hold: the launched one where spectrial added to the requested value
    (a path list with the probe's folder in front), else the requested one (a check against a different
    value than launched must report the launched value as wrong)."""
    if launched is not None and launched != requested and requested in launched.split(":"):
        return launched
    return requested


def check_env(procs: list[ProcInfo], requested: Mapping[str, str], tag_var: str, *,
              launched: Mapping[str, str] | None = None,
              probes: Mapping[int, ProbeRecord] | None = None) -> EnvCheckRecord:
    """Check each requested variable in each process: through its probe record, else its exec-time
    environment. `launched` is the environment as put on the command (default: `requested`; it differs where
    spectrial prepended to a variable, as the probe's folder to PYTHONPATH); `probes` the probe records by pid."""
    launched = dict(launched or requested)
    salt = launched.get(tag_var, "")
    probes = probes or {}
    rows: list[ProcessEnvCheck] = []
    problems: list[str] = []
    unverified: list[str] = []
    for p in procs:
        state = environ_state(p, tag_var)
        probe = _probe_of(p, probes)
        row = ProcessEnvCheck(pid=p.pid, cmdline=mask_argv(p.cmdline), environ=state, probe=probe is not None,
                              readable=p.environ is not None)
        where = f"pid {p.pid} ({shlex.join(p.cmdline)[:80]})"
        for k in requested:
            want = _as_launched(requested[k], launched.get(k))
            if probe is not None:
                held = probe.vars.get(k, "absent")
                how, got = "probe", None if held is None else ("?" if held == "absent" else held)
                ok_value = held == value_hash(salt, want)
            elif state == "readable":
                env = p.environ or {}
                how, got = "proc", env.get(k)
                ok_value = got == want
            else:
                row.unverified.append(k)
                continue
            if got is None:
                row.missing.append(k)
                problems.append(f"{k} missing from {where} (seen by {how})")
            elif got == "?":
                row.unverified.append(k)
                continue
            elif not ok_value:
                row.wrong[k] = got if how == "proc" else "(another value)"
                problems.append(f"{k} has another value than requested (masked) in {where}" if is_secret_name(k)
                                or how == "probe" else f"{k}={got!r} instead of {want!r} in {where}")
            else:
                row.present.append(k)
            row.verified_by[k] = how
        if state == "unreadable" and probe is None:
            problems.append(f"pid {p.pid}: environment not readable")
        elif row.unverified:
            unverified.append(f"{where}: {state} environment, no probe record: {', '.join(row.unverified)} "
                              "not verifiable")
        row.wrong = mask_env(row.wrong)
        rows.append(row)
    check = EnvCheckRecord(ok=not problems and bool(procs), requested=mask_env(dict(requested)), processes=rows,
                           problems=problems or ([] if procs else ["no server process found"]))
    check.unverified = unverified
    check.summary = summarize_check(check)
    return check


def summarize_check(check: EnvCheckRecord) -> str:
    """One line: all present (and how), or the problems; unverified processes named either way."""
    n = len(check.processes)
    hows = sorted({h for row in check.processes for h in row.verified_by.values()})
    unverified = list(check.unverified)
    if check.ok:
        text = (f"all {len(check.requested)} requested variables present in {n} process(es)"
                + (f" (verified by {' and '.join(hows)})" if hows else ""))
    else:
        text = "; ".join(check.problems)
    if unverified:
        text += f"; {len(unverified)} process(es) unverified: " + "; ".join(unverified)
    return text


NCCL_PREFIX = "NCCL_"


def strict_names(requested: Mapping[str, str], ranks: int, nodes: int = 1) -> list[str]:
    """The requested variables that must be verified in every server process: the NCCL_* ones on a multi-GPU
    launch (`ranks` > 1: tensor x data parallel, or `nodes` > 1); none otherwise."""
    if ranks <= 1 and nodes <= 1:
        return []
    return [k for k in requested if k.startswith(NCCL_PREFIX)]


def require_verified(check: EnvCheckRecord, names: Collection[str], why: str) -> EnvCheckRecord:
    """`check` with the processes where one of `names` could not be verified counted as one problem (`ok` False):
    where these variables decide what is measured (`why`, e.g. "a multi-GPU launch (2 ranks)"), not knowing is not
    passing. Unchanged when every process verified them."""
    strict = [k for k in names if k in check.requested] or list(names)
    blind = [(row, [k for k in row.unverified if k in strict]) for row in check.processes]
    blind = [(row, ks) for row, ks in blind if ks]
    if not blind:
        return check
    out = check.model_copy(deep=True)
    who = "; ".join(f"pid {row.pid} {_short_cmd(row.cmdline)} ({row.environ or 'unreadable'} environment, no probe "
                    "record)" for row, _ in blind)
    lacking = sorted({k for _, ks in blind for k in ks}, key=strict.index)
    out.problems = [*out.problems, f"{', '.join(lacking)} not verifiable in {len(blind)} of {len(check.processes)} "
                                   f"server processes: {who}; {why} needs them verified in every server process"]
    pids = {row.pid for row, _ in blind}
    out.unverified = [u for u in out.unverified if not any(u.startswith(f"pid {pid} ") for pid in pids)]
    out.ok = False
    out.summary = summarize_check(out)
    return out


def _short_cmd(cmdline: Sequence[str]) -> str:
    """A process's command line for a message: empty arguments (a renamed process's blanked ones) dropped."""
    return shlex.join([a for a in cmdline if a])[:80]


class EnvVerified(BaseModel):
    """What a run's environment checks verified, over every start that has one (`verified`): the requested
    variables (NCCL_* apart), in how many server processes and starts, by what, and what failed."""

    starts: int = 0
    failed: int = 0  # starts whose check failed (a variable missing, or unverifiable where it must be verified)
    processes: int = 0
    nccl: list[str] = []  # requested NCCL_* variables
    nccl_verified: int = 0  # of those, present in every process of every start
    other: list[str] = []
    other_verified: int = 0
    how: list[str] = []  # probe, proc
    missing: dict[str, int] = {}  # variable -> processes that lack it (or hold another value)
    unverified: dict[str, int] = {}  # variable -> processes where nothing could verify it
    nccl_ranks: int = 0  # ranks NCCL's own log confirmed every requested NCCL_* variable in
    nccl_ranks_seen: int = 0  # ranks NCCL's log showed

    @property
    def ok(self) -> bool:
        return not self.missing and not self.unverified and not self.failed

    @property
    def line(self) -> str | None:
        """One line for the headline, e.g. "environment verified: NCCL_* 6 of 6 in 9 server processes (1 start;
        by probe and /proc)"; None when no start requested any variable."""
        if not self.starts or not (self.nccl or self.other):
            return None
        counts = []
        if self.nccl:
            counts.append(f"NCCL_* {self.nccl_verified} of {len(self.nccl)}")
        if self.other:
            counts.append(f"{'other variables ' if self.nccl else 'requested variables '}"
                          f"{self.other_verified} of {len(self.other)}")
        hows = " and ".join({"probe": "probe", "proc": "/proc"}.get(h, h) for h in self.how)
        head = ("environment verified" if self.ok else
                "environment NOT verified" if self.missing or self.failed else "environment partly verified")
        text = (f"{head}: {', '.join(counts)} in {self.processes} server process{'es' if self.processes != 1 else ''} "
                f"({self.starts} start{'s' if self.starts != 1 else ''}" + (f"; by {hows}" if hows else "") + ")")
        if self.missing:
            text += "; " + _by_count(self.missing, "missing or different")
        if self.unverified:
            text += "; " + _by_count(self.unverified, "unverifiable")
        if self.failed:
            text += f"; the check failed in {self.failed} of {self.starts} start{'s' if self.starts != 1 else ''}"
        if self.nccl_ranks_seen:
            text += (f"; NCCL's own log: all requested NCCL_* in {self.nccl_ranks} of {self.nccl_ranks_seen} "
                     "rank(s)")
        return text


def _by_count(per_var: Mapping[str, int], what: str) -> str:
    """"A, B unverifiable in 3 processes; C ... in 1 process": the variables of one count named together."""
    counts: dict[int, list[str]] = {}
    for k, n in per_var.items():
        counts.setdefault(n, []).append(k)
    return "; ".join(f"{', '.join(ks)} {what} in {n} process{'es' if n != 1 else ''}"
                     for n, ks in sorted(counts.items(), reverse=True))


def verified(starts: Sequence[StartRecord]) -> EnvVerified:
    """What the environment checks of `starts` verified (those without a check are left out)."""
    checked = [s for s in starts if s.env_check is not None and s.env_check.requested]
    if not checked:
        return EnvVerified()
    names = list(dict.fromkeys(k for s in checked for k in s.env_check.requested))  # type: ignore[union-attr]
    nccl = [k for k in names if k.startswith(NCCL_PREFIX)]
    other = [k for k in names if not k.startswith(NCCL_PREFIX)]
    rows = [(s.env_check, r) for s in checked for r in s.env_check.processes]  # type: ignore[union-attr]
    missing: dict[str, int] = {}
    blind: dict[str, int] = {}
    everywhere = set(names)
    for chk, r in rows:
        for k in chk.requested:
            if k in r.present:
                continue
            everywhere.discard(k)
            if k in r.missing or k in r.wrong:
                missing[k] = missing.get(k, 0) + 1
            else:
                blind[k] = blind.get(k, 0) + 1
    if not rows:
        everywhere = set()
    ev = [s.nccl_evidence for s in checked if s.nccl_evidence is not None and s.nccl_evidence.processes]
    seen = sum(len(e.processes) for e in ev)
    good = sum(1 for e in ev for p in e.processes
               if all(p.pid in v.confirmed for v in e.variables.values()))
    return EnvVerified(starts=len(checked), failed=sum(s.env_check.ok is False for s in checked),  # type: ignore[union-attr]
                       processes=len(rows), nccl=nccl,
                       nccl_verified=sum(1 for k in nccl if k in everywhere), other=other,
                       other_verified=sum(1 for k in other if k in everywhere),
                       how=sorted({h for _, r in rows for h in r.verified_by.values()}), missing=missing,
                       unverified=blind, nccl_ranks=good, nccl_ranks_seen=seen)
