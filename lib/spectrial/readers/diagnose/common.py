"""Small helpers the detectors share: which arms speculate, their logs, a baseline to compare with, formatting."""

from __future__ import annotations

from collections.abc import Iterator

from spectrial.analysis import figures
from spectrial.readers.diagnose.context import Context, LogFile, number
from spectrial.readers.diagnose.model import Evidence
from spectrial.schema import ArmRecord

PINNED = 1.01  # an accept length at or below this is "exactly 1": no draft token survives

# methods whose draft is a head trained on the target's own (chat-formatted) outputs
HEAD_METHODS = frozenset({"eagle", "eagle3", "mtp", "nextn", "deepseek_mtp", "medusa", "eagle-3", "dflash"})
NO_DRAFT_MODEL = frozenset({"none", "ngram", "ngram-simple", "ngram-cache", "suffix"})


def spec_arms(ctx: Context) -> Iterator[tuple[str, ArmRecord]]:
    """(path, arm) of every completed speculative arm."""
    for path, a in ctx.arms:
        if a.status == "ok" and not figures.is_baseline(a):
            yield path, a


def arm_logs(ctx: Context, arm: ArmRecord) -> list[LogFile]:
    """The server logs of `arm`'s starts."""
    return [lf for lf in ctx.logs if lf.arm is not None and lf.arm == ctx.setting(arm)]


def baseline_of(ctx: Context, arm: ArmRecord) -> ArmRecord | None:
    """The baseline `arm` is compared with: the one its record names, else the first completed baseline of its
    session and concurrency."""
    arms = [a for _, a in ctx.arms]
    named = arm.baseline_arm or arm.get("baseline")
    if named:
        hit = next((a for a in arms if a.name == named or a.get("id") == named), None)
        if hit is not None:
            return hit
    same = [a for a in arms if a.status == "ok" and figures.is_baseline(a) and figures.positive(a.tok_s)
            and a.session == arm.session and a.get("concurrency") == arm.get("concurrency")
            and a.get("offered_rate") == arm.get("offered_rate")]
    return same[0] if same else None


def rec(path: str, value: object) -> Evidence:
    """Evidence from a record field."""
    return Evidence(where=path, text=_short(value), kind="record")


def log(lf: LogFile, line: int) -> Evidence:
    """Evidence from a log line."""
    return Evidence(where=lf.where(line), text=lf.line(line), kind="log")


def _short(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    s = repr(value) if not isinstance(value, str) else value
    return s if len(s) <= 240 else s[:237] + "..."


def f2(x: object, nd: int = 2) -> str:
    v = number(x)
    return "n/a" if v is None else f"{v:.{nd}f}"


def truthy(value: str | None) -> bool:
    return str(value or "").strip().lower() not in ("", "0", "false", "no", "off", "none")


def names(arms: list[str], most: int = 4) -> str:
    """'a, b and c' (at most `most` names, then how many more)."""
    if len(arms) <= most:
        return ", ".join(arms[:-1]) + (" and " if len(arms) > 1 else "") + arms[-1] if arms else ""
    return ", ".join(arms[:most]) + f" and {len(arms) - most} more"


def one(arms: list[str]) -> str | None:
    """The arm a finding is about when it is about one arm only."""
    return arms[0] if len(arms) == 1 else None
