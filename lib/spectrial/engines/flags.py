"""Declarative flag tables: how engine_config fields become command-line flags, per engine version.

    FLAGS = (Flag("threads", "-t"), Flag("flash_attn", "-fa"), Flag("trust_remote_code", "--trust-remote-code",
             switch=True), Flag("cuda_graph_max_bs", {(0, 0, 0): "--cuda-graph-max-bs",
                                                      (0, 5, 14): "--cuda-graph-max-bs-decode"}))
    argv += render(FLAGS, config, version=(0, 5, 17))

A value of None (or False for a switch) writes nothing; a flag given as {version: flag} takes the entry of the
newest version not above the engine's (the newest entry when the version is unknown).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Version = tuple[int, int, int]


@dataclass(frozen=True)
class Flag:
    """One engine_config field as a flag: `--flag VALUE` (formatted with `fmt`), or a bare switch."""

    field: str
    flag: str | Mapping[Version, str]
    switch: bool = False
    fmt: Callable[[Any], str] = str
    when: str = "always"  # "always", or a condition the adapter passes in `active` (e.g. "draft_model")

    def name(self, version: Version | None) -> str:
        if isinstance(self.flag, str):
            return self.flag
        known = sorted(self.flag)
        fit = [v for v in known if version is None or v <= version]
        return self.flag[fit[-1] if fit and version is not None else known[-1]]


def render(table: Sequence[Flag], config: Any, version: Version | None = None,
           active: frozenset[str] = frozenset()) -> list[str]:
    """The argv of `table` for `config` (an object with the fields), in table order."""
    argv: list[str] = []
    for f in table:
        if f.when != "always" and f.when not in active:
            continue
        value = getattr(config, f.field)
        if value is None or value is False:
            continue
        if f.switch:
            argv.append(f.name(version))
        else:
            argv += [f.name(version), f.fmt(value)]
    return argv


def general(value: float) -> str:
    """Numbers as `%g` writes them (0.90 -> 0.9)."""
    return f"{value:g}"
