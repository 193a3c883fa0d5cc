"""Did the engine resolve the configuration the arm asked? Per setting: asked, resolved, where it was read.

The environment check proves the variables reached every process; this is the next layer down. Engines resolve
settings silently: SGLang resets max running requests to 48 for speculative decoding, adjusts the draft tokens to
steps + 1 at top-k 1 and picks its CUDA-graph batch limit; vLLM can drop a speculative setting after parsing;
an `extra_args` entry written after spectrial's own flags wins over the params (llama-server takes the last
`-np`). After the warm-up (llama.cpp names the method a slot runs only once it served a request), each engine's
adapter (`Engine.config_readback`) reads what the server says it runs:

    llama.cpp  GET /props (model_path, total_slots), GET /slots (n_ctx and speculative per slot, the types a
               slot ran) and its startup log (the draft model it loaded); the draft depth is not exposed
    vLLM       GET /v1/models (max_model_len) and its engine config line (`Initializing a V1 LLM engine ...
               with config:`: model, speculative method, draft, num_spec_tokens, parallel sizes, eager)
    SGLang     GET /server_info (fallback /get_server_info): the resolved ServerArgs

and compares it with what the params asked. Each setting is `match`, `mismatch`, `unread` (the engine does not
say: listed, never a failure) or `chosen` (the params left it to the engine: recorded). A setting asked as a
minimum (the served batch needs max running requests and CUDA-graph batches of at least the concurrency) is a
mismatch below it. `config_check: fail` (the default) fails the arm on a mismatch, naming the setting, asked vs
resolved and where it was read; `warn` records it (the arm's validity warns: `resolved_config`); `off` skips it.

The resolved settings are part of the record (`StartRecord.config_check`, `ArmRecord.config_check`); their hash
(`ConfigCheckRecord.key`) is compared by `diff` and `gate` as the host fingerprint is.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any, Literal

from spectrial.schema import ConfigCheckRecord, ConfigSetting

LOG_READ_BYTES = 1 << 20  # the startup log's tail read for the check (the config lines come before readiness)

Mode = Literal["fail", "warn", "off"]


def _norm(v: Any) -> Any:
    """A value as compared: paths normalised, numbers as floats, strings without case."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int | float):
        return float(v)
    s = str(v).strip()
    if "/" in s:
        return os.path.normpath(s)
    try:
        return float(s)
    except ValueError:
        return s.lower()


def setting(key: str, label: str, asked: Any, resolved: Any, where: str, *, at_least: bool = False) -> ConfigSetting:
    """One setting compared. `asked` None: not asked (the engine's choice, recorded); `resolved` None: not read
    (`where` says why). `at_least`: `asked` is a minimum (resolved below it is a mismatch)."""
    if resolved is None:
        state = "unread"
    elif asked is None:
        state = "chosen"
    elif at_least:
        try:
            state = "match" if float(resolved) >= float(asked) else "mismatch"
        except (TypeError, ValueError):
            state = "mismatch"
    else:
        state = "match" if _norm(asked) == _norm(resolved) else "mismatch"
    shown = f">= {asked}" if at_least and asked is not None else asked
    return ConfigSetting(setting=label, key=key, asked=shown, resolved=resolved, where=where, state=state)


def _fmt(v: Any) -> str:
    return "unset" if v is None else (os.path.basename(str(v).rstrip("/")) or str(v)) if "/" in str(v) else str(v)


def mismatch_line(s: ConfigSetting) -> str:
    """"slots (-np): asked 2, resolved 1 (GET /props total_slots)"."""
    return f"{s.setting}: asked {_fmt(s.asked)}, resolved {_fmt(s.resolved)} ({s.where})"


def check(settings: Sequence[ConfigSetting], mode: Mode = "fail") -> ConfigCheckRecord:
    """The check of one start from its settings: ok, the one-line summary and the resolved settings' key."""
    settings = list(settings)
    bad = [s for s in settings if s.state == "mismatch"]
    read = [s for s in settings if s.state in ("match", "mismatch")]
    unread = [s for s in settings if s.state == "unread"]
    chosen = [s for s in settings if s.state == "chosen"]
    if bad:
        summary = f"{len(bad)} of {len(read)} setting(s) resolved otherwise than asked: " + "; ".join(
            mismatch_line(s) for s in bad)
    elif read:
        summary = f"{len(read)} setting(s) resolved as asked ({', '.join(s.key for s in read)})"
    else:
        summary = "nothing the arm asked could be read back from the server"
    if chosen:
        summary += "; the engine chose " + ", ".join(f"{s.key} {_fmt(s.resolved)}" for s in chosen)
    if unread:
        summary += "; not exposed: " + ", ".join(s.key for s in unread)
    resolved = {s.key: s.resolved for s in settings if s.state != "unread"}
    key = hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()[:12] \
        if resolved else None
    return ConfigCheckRecord(mode=mode, ok=(not bad) if read else None, summary=summary, settings=settings, key=key)


def over_starts(checks: Sequence[ConfigCheckRecord]) -> ConfigCheckRecord | None:
    """An arm's check over its starts: the first that failed, else the last."""
    if not checks:
        return None
    return next((c for c in checks if c.ok is False), checks[-1])


def fix_hint(record: ConfigCheckRecord) -> str:
    """What to do about a mismatch."""
    keys = {s.key for s in record.mismatches}
    hints = []
    if keys & {"slots", "context", "model", "draft_model", "steps", "method", "speculative", "tp"}:
        hints.append("look for an extra_args entry (or an engine default) that overrides the params, and set the "
                     "value through the params instead")
    if keys & {"max_running", "cuda_graph_max_bs"}:
        hints.append("set engine_config.max_running_requests / cuda_graph_max_bs to at least the concurrency")
    if "draft_tokens" in keys:
        hints.append("at top-k 1 SGLang verifies steps + 1 draft tokens: set draft_tokens to steps + 1")
    hints.append("set config_check: warn to measure it anyway (the arm's validity then warns)")
    return "; ".join(hints)
