"""The tables of an NCCL check's record: where the requested variables were seen, what NCCL said it used (its
figure: `spectrial.readers.render.plots.nccl_latency_figure`; its verdict: `spectrial.nccl.latency`)."""

from __future__ import annotations

import pandas as pd

from spectrial.schema import Manifest


def visibility_table(manifest: Manifest) -> pd.DataFrame:
    """One row per set and worker: pid, where the requested variables were seen, what was missing."""
    rows = []
    for s in manifest.get("sets", []):
        for w in s.get("workers", []):
            rows.append({"set": s["name"], "how": s["how"], "round": w.get("round"), "rank": w.get("rank"),
                         "pid": w.get("pid"),
                         "exit_code": w.get("exit_code"),
                         "in_os_environ": len(w.get("seen_in_os_environ", [])),
                         "in_proc": len(w.get("seen_in_proc", [])),
                         "missing": ", ".join(w.get("missing", [])),
                         "not_in_proc": ", ".join(w.get("not_in_proc", []))})
    return pd.DataFrame(rows, columns=["set", "how", "round", "rank", "pid", "exit_code", "in_os_environ", "in_proc",
                                       "missing", "not_in_proc"])


def settings_table(manifest: Manifest) -> pd.DataFrame:
    """What NCCL said it used, per set, rank and communicator phase (empty on gloo)."""
    rows = [r for s in manifest.get("sets", []) for n in s.get("nccl", []) for r in n.get("settings", [])]
    return pd.DataFrame(rows)
