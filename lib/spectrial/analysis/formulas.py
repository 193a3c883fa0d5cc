"""Closed-form relations of speculative decoding (Leviathan et al. 2023; SGLang's measured-time form).

Units: times in milliseconds, throughputs in tokens per second, ``alpha`` a per-token acceptance
probability in [0, 1], ``k`` the number of drafted tokens per cycle (a chain, top-k 1).
Every function validates its inputs and raises :class:`spectrial.errors.ConfigError` (a ``ValueError``)
naming the offending argument.
"""

from __future__ import annotations

from spectrial.analysis._checks import check_accept_len, check_alpha, check_k, check_positive, check_real
from spectrial.errors import ConfigError

__all__ = [
    "accept_len_from_counts",
    "break_even_accept_len",
    "cycle_ms_from",
    "expected_accept_len",
    "ms_per_token",
    "required_alpha",
    "spec_throughput",
    "speedup",
]


def expected_accept_len(alpha: float, k: int) -> float:
    """Expected tokens committed per cycle for a chain of ``k`` drafts with per-token acceptance ``alpha``.

    tau = (1 - alpha^(k+1)) / (1 - alpha), counting the target's bonus token; the limit at alpha = 1
    is k + 1, at alpha = 0 it is 1. Example: alpha 0.75, k 3 -> 2.734375.
    """
    a, kk = check_alpha(alpha), check_k(k)
    if a == 1.0:
        return float(kk + 1)
    return (1.0 - a ** (kk + 1)) / (1.0 - a)


def required_alpha(accept_len: float, k: int, tol: float = 1e-12) -> float:
    """Per-token acceptance alpha that yields ``accept_len`` tokens per cycle with ``k`` drafts.

    Inverse of tau(alpha) = (1 - alpha^(k+1)) / (1 - alpha), which rises monotonically from 1 (alpha 0)
    to k + 1 (alpha 1); solved by bisection to ``tol``. ``accept_len`` outside [1, k + 1] raises.
    """
    kk = check_k(k)
    tau = check_accept_len(accept_len)
    if tau > kk + 1:
        raise ConfigError(
            f"accept_len {tau:g} is unreachable with k={kk} drafts: the most a cycle can commit is k + 1 = "
            f"{kk + 1}; draft more tokens per cycle (raise k) or lower accept_len")
    check_positive(tol, "tol")
    lo, hi = 0.0, 1.0
    if tau == 1.0:
        return 0.0
    if tau == kk + 1:
        return 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if expected_accept_len(mid, kk) < tau:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def spec_throughput(accept_len: float, cycle_ms: float) -> float:
    """Speculative decode throughput in tok/s: accept_len / cycle_ms * 1000."""
    return check_accept_len(accept_len) / check_positive(cycle_ms, "cycle_ms") * 1000.0


def break_even_accept_len(cycle_ms: float, base_ms_per_token: float) -> float:
    """Accept length at which speculation only matches the baseline: tau* = cycle_ms / base_ms_per_token.

    Example: a 30 ms cycle against an 82 tok/s baseline (12.195 ms/token) needs 2.46 tokens per cycle.
    """
    return check_positive(cycle_ms, "cycle_ms") / check_positive(base_ms_per_token, "base_ms_per_token")


def speedup(accept_len: float, cycle_ms: float, base_ms_per_token: float) -> float:
    """Speedup over plain decoding: accept_len * base_ms_per_token / cycle_ms (> 1 means faster)."""
    return (check_accept_len(accept_len) * check_positive(base_ms_per_token, "base_ms_per_token")
            / check_positive(cycle_ms, "cycle_ms"))


def ms_per_token(tok_s: float) -> float:
    """Milliseconds per token of a throughput: 1000 / tok_s (also converts ms/token back to tok/s)."""
    return 1000.0 / check_positive(tok_s, "tok_s")


def accept_len_from_counts(accepted: float, verify_steps: float) -> float:
    """Mean tokens committed per verify cycle from counters: 1 + accepted / verify_steps.

    ``accepted`` is the number of accepted draft tokens, ``verify_steps`` the number of target verify
    passes (cycles); each cycle also commits one token of the target (the bonus/correction token).
    """
    acc = check_real(accepted, "accepted")
    if acc < 0:
        raise ConfigError(f"accepted (accepted draft tokens) must be >= 0, got {accepted!r}")
    return 1.0 + acc / check_positive(verify_steps, "verify_steps")


def cycle_ms_from(decode_ms: float, verify_steps: float) -> float:
    """Mean cycle time: total decode time / number of verify cycles (decode_ms / verify_steps).

    With llama.cpp's numbers: eval time / (generated tokens / mean accept length).
    """
    return check_positive(decode_ms, "decode_ms") / check_positive(verify_steps, "verify_steps")
