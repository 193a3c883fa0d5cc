"""The few error classes spectrial raises; each message says what is wrong and how to fix it."""

from __future__ import annotations


class SpectrialError(Exception):
    """Base class of every error spectrial raises on purpose."""


class ConfigError(SpectrialError, ValueError):
    """A parameter is missing, mistyped or contradictory (names the parameter and the fix)."""


class HostCommandError(SpectrialError):
    """A command on a host failed; keeps the command, exit code and output tails."""

    def __init__(self, host: str, command: str, exit_code: int | None, stdout: str = "", stderr: str = "",
                 hint: str = "") -> None:
        self.host, self.command, self.exit_code = host, command, exit_code
        self.stdout, self.stderr = stdout, stderr
        tail = "\n".join((stderr or stdout).strip().splitlines()[-15:])
        msg = f"on {host}: command failed (exit {exit_code}): {command}"
        if tail:
            msg += f"\n--- output tail ---\n{tail}"
        if hint:
            msg += f"\nhint: {hint}"
        super().__init__(msg)


class ResourceBusyError(SpectrialError):
    """A port or GPU is held by a process spectrial did not start (names its pid and command line)."""


class ServerStartError(SpectrialError):
    """The server process exited before it became ready (exit code and log tail)."""


class ServerNotReadyError(SpectrialError):
    """The server did not become ready in time (URL, elapsed, last probe error, log tail)."""


class ParseError(SpectrialError):
    """Input could not be parsed at all (names the line number and the line)."""
