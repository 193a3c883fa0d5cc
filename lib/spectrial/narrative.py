"""Sentences computed from numbers: the verdict paragraphs notebooks and reports print."""

from __future__ import annotations

from typing import Any


def _fmt(x: float | None, nd: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def arm_sentence(arm: dict[str, Any], base: dict[str, Any]) -> str:
    """One arm against the baseline: speed, cycle cost in baseline tokens, accept length vs break-even."""
    label = f"**{arm['name']}** ({arm.get('method')}, steps {arm.get('steps')}"
    if arm.get("synthetic"):
        label += f", synthetic acceptance {arm.get('synthetic_accept')}"
    label += ")"
    if arm.get("status") != "ok":
        return f"{label} failed: {arm.get('reason')}."
    s = (f"{label} ran at {_fmt(arm.get('tok_s'))} tok/s against the baseline's {_fmt(base.get('tok_s'))} "
         f"({_fmt(arm.get('speedup'), 2)}x).")
    be, al = arm.get("break_even_accept_len"), arm.get("accept_len")
    if be and al:
        pays = "pays" if al > be else "does not pay"
        s += (f" One speculative cycle costs {_fmt(arm.get('cycle_ms'), 2)} ms, the time of {_fmt(be, 2)} baseline "
              f"tokens, and commits {_fmt(al, 2)} tokens on average (accepted {int(arm.get('accepted') or 0)} of "
              f"{int(arm.get('drafted') or 0)} drafted): speculation {pays} here, since it would need an accept "
              f"length above {_fmt(be, 2)}.")
    if arm.get("draft_ms_per_cycle"):
        s += f" Drafting takes {_fmt(arm['draft_ms_per_cycle'], 2)} ms of each cycle; verifying the rest."
    return s


def verdict(arms: list[dict[str, Any]]) -> str:
    """A paragraph: the baseline, then each speculative arm, then the best arm."""
    base = next((a for a in arms if a.get("method") == "none" and a.get("status") == "ok"), None)
    if base is None:
        return "No baseline arm completed, so no speculative arm can be judged."
    parts = [f"The baseline decoded at {_fmt(base.get('tok_s'))} tok/s ({_fmt(base.get('ms_per_token'), 2)} ms "
             "per token)."]
    spec = [a for a in arms if a.get("method") != "none"]
    parts += [arm_sentence(a, base) for a in spec]
    ok = [a for a in spec if a.get("status") == "ok" and a.get("speedup")]
    if ok:
        best = max(ok, key=lambda a: a["speedup"])
        word = "faster" if best["speedup"] > 1 else "no faster"
        parts.append(f"Best speculative arm: **{best['name']}**, {_fmt(best['speedup'], 2)}x the baseline "
                     f"({word}; single-start medians: see the spread before trusting small differences).")
    return " ".join(parts)
