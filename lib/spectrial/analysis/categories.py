"""Acceptance per workload category from per-request rows (a run's requests.csv, or any frame like it).

    input columns   category (or the `by` keys), accept_len (each request's accept length: tokens committed per
                    verify cycle, 1 for a baseline), tokens (its completion tokens); optional: phase (only
                    "measure" rows count), error (rows with one are left out), prompt_id (a missing `turn` key is
                    read from MT-Bench ids `mtbench:<question>:<turn>`). A run's requests.csv carries accept_len;
                    for a record without it, `with_request_accept` adds it from the engine's own per-request counts
                    (spectrial.analysis.serving.request_cycles), the same figure.
    output          one row per group: the `by` keys, then
        requests                 requests with an accept length (and at least 2 tokens: one verify cycle)
        missing                  measured requests without one (no per-request counts, or 1 token)
        tokens                   their completion tokens
        accept_len               token-weighted: decoded tokens / verify cycles over the group's requests, with
                                 decoded_i = tokens_i - 1 (the first token comes from the prefill) and cycles_i =
                                 decoded_i / accept_len_i. This is the harmonic mean of the requests' accept lengths
                                 weighted by their decoded tokens; it equals 1 + accepted / verify steps summed over
                                 the group (a category record's accept_len, spectrial.analysis.figures.category_figures) and
                                 the EAGLE papers' tau (new tokens / drafting-verification cycles over a category).
        accept_len_request_mean  the mean of the requests' accept lengths: every request counts once, whatever
                                 its length (a short answer weighs as much as a long one).
    With `total`, one more row per group of the other keys (the last key "all"): the same figures over every
    category at once.

The two means differ when long and short requests accept differently; the token-weighted one is what the
speed-up follows (time goes per cycle), the per-request one says how typical requests fare.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from spectrial.errors import ConfigError

__all__ = ["ACCEPT_COLUMNS", "TOTAL", "accept_by_category", "mtbench_turn", "with_request_accept"]

TOTAL = "all"
ACCEPT_COLUMNS = ["requests", "missing", "tokens", "accept_len", "accept_len_request_mean"]
_MTBENCH_ID = re.compile(r"^mtbench:\d+:(\d+)$")


def mtbench_turn(prompt_id: object) -> int | None:
    """The turn of an MT-Bench item id (`mtbench:81:2` -> 2); None for any other id."""
    m = _MTBENCH_ID.match(str(prompt_id)) if isinstance(prompt_id, str) else None
    return int(m.group(1)) if m else None


def with_request_accept(requests: pd.DataFrame) -> pd.DataFrame:
    """A copy of a requests frame with `accept_len` per request from the engine's own per-request counts
    (`spectrial.analysis.serving.request_cycles`: SGLang's spec_verify_ct, vLLM's and llama.cpp's counters read around each
    request, llama.cpp's timings): 1 + accepted / verify cycles; NaN where a row has none (a baseline's rows)."""
    from spectrial.analysis.serving import from_frames, request_cycles

    out = requests.copy()
    vals = []
    for r in from_frames(requests):
        c = request_cycles(r)
        vals.append(1.0 + c[0] / c[1] if c is not None and c[1] > 0 else np.nan)
    out["accept_len"] = vals
    return out


def accept_by_category(requests: pd.DataFrame, by: Sequence[str] = ("category",), total: bool = True
                       ) -> pd.DataFrame:
    """Per group of `by` (default: category), the token-weighted and the per-request mean accept length with
    their counts (columns: the `by` keys, then ACCEPT_COLUMNS; see the module docstring for the formulas)."""
    keys = list(by)
    if not keys:
        raise ConfigError("by: give at least one column to group by (e.g. ['category'])", parameter="by")
    df = requests.copy()
    if "turn" in keys and "turn" not in df.columns and "prompt_id" in df.columns:
        df["turn"] = [mtbench_turn(x) for x in df["prompt_id"]]
    need = [*keys, "accept_len", "tokens"]
    lacking = [c for c in need if c not in df.columns]
    if lacking:
        hint = "add accept_len with spectrial.analysis.categories.with_request_accept(frame)" if "accept_len" in lacking \
            else f"the frame has: {', '.join(map(str, df.columns))}"
        raise ConfigError(f"requests: the frame lacks column(s) {', '.join(lacking)}", parameter="requests", hint=hint)
    if "phase" in df.columns:
        df = df[df["phase"].fillna("measure") == "measure"]
    if "error" in df.columns:
        df = df[df["error"].isna() | (df["error"].astype(str) == "")]
    df = df.dropna(subset=keys)
    rows = [_figures(grp, dict(zip(keys, k if isinstance(k, tuple) else (k,), strict=True)))
            for k, grp in df.groupby(keys, sort=False)]
    if total and len(rows):
        rest = keys[:-1]
        groups = df.groupby(rest, sort=False) if rest else [((), df)]
        for k, grp in groups:
            vals = k if isinstance(k, tuple) else (k,)
            rows.append(_figures(grp, {**dict(zip(rest, vals, strict=True)), keys[-1]: TOTAL}))
    return pd.DataFrame(rows, columns=[*keys, *ACCEPT_COLUMNS])


def _figures(grp: pd.DataFrame, keys: dict[str, object]) -> dict[str, object]:
    a = pd.to_numeric(grp["accept_len"], errors="coerce").to_numpy(dtype=float)
    t = pd.to_numeric(grp["tokens"], errors="coerce").to_numpy(dtype=float)
    ok = np.isfinite(a) & (a >= 1) & np.isfinite(t) & (t >= 2)
    a, t = a[ok], t[ok]
    decoded = t - 1
    cycles = decoded / a
    return {**keys, "requests": int(ok.sum()), "missing": int((~ok).sum()), "tokens": int(t.sum()),
            "accept_len": float(decoded.sum() / cycles.sum()) if len(a) else None,
            "accept_len_request_mean": float(a.mean()) if len(a) else None}
