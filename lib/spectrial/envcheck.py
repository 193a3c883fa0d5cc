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
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping

from pydantic import BaseModel

from spectrial.host import ProcInfo
from spectrial.schema import EnvCheckRecord, ProcessEnvCheck
from spectrial.secrets import is_secret_name, mask_argv, mask_env

PROBE_DIR_VAR = "SPECTRIAL_ENV_PROBE"
PROBE_NAMES_VAR = "SPECTRIAL_ENV_PROBE_NAMES"

PROBE_SCRIPT = '''\
# spectrial's environment probe for one server start (spectrial.envcheck): every Python process of the server
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
