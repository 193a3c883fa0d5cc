"""Argument checks shared by the analysis modules; each raises ConfigError naming the argument."""

from __future__ import annotations

import math
from numbers import Integral, Real

from spectrial.errors import ConfigError


def check_real(value: object, name: str) -> float:
    """A real, non-NaN number (bools refused) as float."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ConfigError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    out = float(value)
    if math.isnan(out):
        raise ConfigError(f"{name} is NaN: pass a measured number")
    return out


def check_positive(value: object, name: str) -> float:
    """A finite number > 0 as float."""
    out = check_real(value, name)
    if not out > 0 or math.isinf(out):
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
    return out


def check_alpha(value: object, name: str = "alpha") -> float:
    """A per-token acceptance probability in [0, 1]."""
    out = check_real(value, name)
    if not 0.0 <= out <= 1.0:
        raise ConfigError(f"{name} is a per-token acceptance probability and must lie in [0, 1], got {value!r}")
    return out


def check_k(value: object, name: str = "k") -> int:
    """An integer number of drafted tokens per cycle, >= 1."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ConfigError(f"{name} (drafted tokens per cycle) must be an integer >= 1, got {value!r}")
    if int(value) < 1:
        raise ConfigError(f"{name} (drafted tokens per cycle) must be >= 1, got {value!r}")
    return int(value)


def check_accept_len(value: object, name: str = "accept_len") -> float:
    """A finite accept length (tokens committed per cycle), >= 1."""
    out = check_real(value, name)
    if out < 1.0 or math.isinf(out):
        raise ConfigError(f"{name} (tokens committed per cycle, bonus token included) must be >= 1, got {value!r}")
    return out


def check_nonneg(value: object, name: str) -> float:
    """A finite number >= 0 as float."""
    out = check_real(value, name)
    if out < 0 or math.isinf(out):
        raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
    return out
