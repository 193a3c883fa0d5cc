"""Secrets never reach a record: names that look secret are masked, and their values are redacted.

A launch (argv + env) is masked in one place, `mask_launch`: its `MaskedLaunch` is what the run record, the
server's state file, the dry-run plan and every error that prints the command show, and its `secrets` are the
values the record redacts from every text it writes (server logs copied back, error messages).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

MASK = "***"
_SECRET_PARTS = frozenset({"TOKEN", "KEY", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL",
                           "CREDENTIALS", "APIKEY"})
_PATH_PARTS = frozenset({"FILE", "FILENAME", "FILES", "PATH", "DIR", "FINGERPRINT", "FINGERPRINTS"})
_SECRET_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY")
_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])")
_SECRET_FLAG_SHAPE = re.compile(r"^--?[A-Za-z][\w-]*$")


def is_secret_name(name: str) -> bool:
    """True for names such as HF_TOKEN, OPENAI_API_KEY, --api-key, DB_PASSWORD, ghToken.

    A name is secret when one of its words (split at non-alphanumerics and camelCase) is TOKEN, KEY,
    SECRET, PASSWORD, ... or ends in TOKEN/SECRET/PASSWORD (GHTOKEN). Counters like `max_tokens`,
    `num_token` or `draft_tokens` are not secrets, nor are names of where a secret lives or what identifies it
    (last word FILE, FILENAME, PATH, DIR, FINGERPRINT: ssh `key_filename`, HF_TOKEN_PATH).
    """
    parts = [p.upper() for p in _SPLIT.split(name) if p]
    if parts and parts[-1] in _PATH_PARTS:  # where a secret lives (ssh `key_filename`, KEY_PATH), not the secret
        return False
    if any(p in _SECRET_PARTS for p in parts) or any(p.endswith(_SECRET_SUFFIXES) for p in parts):
        counting = {"NUM", "MAX", "MIN", "N", "PER", "MS", "COUNT", "TOTAL"}
        return not (len(parts) >= 2 and parts[-1] == "TOKEN" and (parts[-2] in counting or parts[0] in counting))
    return False


def _secret_flag(flag: str) -> bool:
    return bool(_SECRET_FLAG_SHAPE.match(flag)) and is_secret_name(flag)


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
        if _secret_flag(flag):
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
        if _secret_flag(flag):
            if eq:
                vals.append(val)
            elif i + 1 < len(argv):
                vals.append(argv[i + 1])
    return sorted({v for v in vals if len(v) >= 4}, key=len, reverse=True)


@dataclass(frozen=True)
class MaskedLaunch:
    """A launch as records, logs and printed commands show it: secret-looking variables and flag values
    masked; `secrets` holds the literal values (longest first) to redact from any other text."""

    argv: list[str]
    env: dict[str, str]
    secrets: list[str]

    @property
    def argv_line(self) -> str:
        """The masked argv as one shell-quoted line."""
        return shlex.join(self.argv)

    @property
    def command(self) -> str:
        """The masked launch as one shell-quoted line, variables first (`K=V ... argv`)."""
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()), self.argv_line])

    def redact(self, text: str) -> str:
        """`text` with this launch's secret values replaced by ***."""
        return redact(text, self.secrets)


def mask_launch(argv: Sequence[str], env: Mapping[str, str] | None = None) -> MaskedLaunch:
    """The one masking of a launch: every record and output path shows what this returns."""
    return MaskedLaunch(mask_argv(argv), mask_env(env), secret_values(env, argv))


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
