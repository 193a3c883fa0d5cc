"""Did the requested environment reach every process of a server? Per process and variable, and how it is known.

Every process spectrial launches inherits the tag variable (`SPECTRIAL_TAG`). A process's exec-time
environment (`/proc/<pid>/environ`) is then in one of three states:

    readable    the tag is there: the requested variables can be checked in it
    blanked     readable, but the tag is gone: the process overwrote that memory (setproctitle, as vLLM's
                EngineCore/Worker and SGLang's scheduler do) or cleared its environment; /proc cannot say
                what it inherited
    unreadable  another user's process, or gone
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from spectrial.host import ProcInfo
from spectrial.schema import EnvCheckRecord
from spectrial.secrets import is_secret_name, mask_argv, mask_env


def environ_state(p: ProcInfo, tag_var: str) -> str:
    """'readable', 'blanked' or 'unreadable' (see the module docstring)."""
    if p.environ is None:
        return "unreadable"
    return "readable" if tag_var in p.environ else "blanked"


def check_env(procs: list[ProcInfo], requested: Mapping[str, str], tag_var: str) -> EnvCheckRecord:
    """Compare each process's exec-time environment with the requested variables."""
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    for p in procs:
        state = environ_state(p, tag_var)
        row: dict[str, Any] = {"pid": p.pid, "cmdline": mask_argv(p.cmdline), "environ": state,
                               "present": [], "missing": [], "wrong": {}, "readable": p.environ is not None,
                               "verified_by": {}}
        if state == "unreadable":
            problems.append(f"pid {p.pid}: environment not readable")
        elif state == "blanked":
            problems.append(f"pid {p.pid} ({shlex.join(p.cmdline)[:80]}): environment blanked (setproctitle?), "
                            "not verifiable from /proc")
        else:
            env = p.environ or {}
            for k, v in requested.items():
                if k not in env:
                    row["missing"].append(k)
                elif env[k] != v:
                    row["wrong"][k] = env[k]
                else:
                    row["present"].append(k)
                    row["verified_by"][k] = "proc"
            for k in row["missing"]:
                problems.append(f"{k} missing from pid {p.pid} ({shlex.join(p.cmdline)[:120]})")
            for k, got in row["wrong"].items():
                problems.append(f"{k} has another value than requested (masked) in pid {p.pid}" if is_secret_name(k)
                                else f"{k}={got!r} instead of {requested[k]!r} in pid {p.pid}")
        row["wrong"] = mask_env(row["wrong"])
        rows.append(row)
    check = EnvCheckRecord(ok=not problems and bool(procs), requested=mask_env(dict(requested)), processes=rows,
                           problems=problems or ([] if procs else ["no server process found"]))
    check.summary = summarize_check(check)
    return check


def summarize_check(check: EnvCheckRecord) -> str:
    if check.ok:
        return f"all {len(check.requested)} requested variables present in {len(check.processes)} process(es)"
    return "; ".join(check.problems)
