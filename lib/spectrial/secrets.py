"""Secrets never reach a record: names that look secret are masked, and their values are redacted."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

MASK = "***"
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_SECRET_FLAG = re.compile(r"^--?[\w-]*(token|key|secret|password|passwd|credential)[\w-]*$", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """True for variable or flag names such as HF_TOKEN, OPENAI_API_KEY, --api-key, DB_PASSWORD."""
    return bool(_SECRET_NAME.search(name))


def mask_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """A copy of `env` with secret-looking variables' values replaced by ***."""
    return {k: (MASK if is_secret_name(k) else v) for k, v in (env or {}).items()}


def mask_argv(argv: Sequence[str]) -> list[str]:
    """A copy of argv with the values of secret-looking flags (`--api-key X`, `--api-key=X`) masked."""
    out: list[str] = []
    hide_next = False
    for item in argv:
        item = str(item)
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        flag, eq, _ = item.partition("=")
        if _SECRET_FLAG.match(flag):
            if eq:
                out.append(f"{flag}={MASK}")
            else:
                out.append(item)
                hide_next = True
            continue
        name, eq, _ = item.partition("=")
        out.append(f"{name}={MASK}" if eq and not item.startswith("-") and is_secret_name(name) else item)
    return out


def secret_values(env: Mapping[str, str] | None = None, argv: Sequence[str] | None = None) -> list[str]:
    """The literal secret values present in env/argv (to redact them from logs and outputs)."""
    vals = [v for k, v in (env or {}).items() if is_secret_name(k)]
    argv = [str(a) for a in (argv or [])]
    for i, item in enumerate(argv):
        flag, eq, val = item.partition("=")
        if _SECRET_FLAG.match(flag):
            if eq:
                vals.append(val)
            elif i + 1 < len(argv):
                vals.append(argv[i + 1])
    return sorted({v for v in vals if len(v) >= 4}, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of each secret value in `text` by ***."""
    for s in secrets:
        if s:
            text = text.replace(s, MASK)
    return text


def mask_mapping(obj: object) -> object:
    """Recursively mask secret-looking keys in nested dicts/lists (for params and manifests)."""
    if isinstance(obj, Mapping):
        return {k: (MASK if isinstance(k, str) and is_secret_name(k) and isinstance(v, str | int | float)
                    else mask_mapping(v)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [mask_mapping(v) for v in obj]
    return obj
