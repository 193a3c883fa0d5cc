"""Hostile values through every way a Host builds a command line (issue 7, part 4: security).

Each value goes in as an argv item, an env value, a cwd, a file path and file content, through `run`,
`start_detached` and `write_text`, on LocalHost and over real SSH. It must arrive literally (echoed back
with `printf %s`, read from `/proc/<pid>/environ`, read back from disk) and the canary file that a shell
interpretation would create must never exist. Invalid env names are refused before anything runs.
"""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sshd_plugin import Reaper

from spectrial.errors import ConfigError
from spectrial.hosts.local import Host
from spectrial.hosts.ssh import SSHHost

pytest_plugins = ["sshd_plugin"]  # fixtures; harmless once tests/conftest.py registers the plugin too

C = "{canary}"  # replaced by the canary's absolute path in each test
HOSTILE = {
    "semicolon": f"; touch {C}",
    "command-substitution": f"$(touch {C})",
    "backticks": f"`touch {C}`",
    "newlines": f"x\ntouch {C}\n",
    "single-quotes": f"it's '; touch {C}; echo '",
    "double-quotes": f'say "hi"; touch "{C}" "',
    "and-or": f"a && touch {C} || touch {C}",
    "pipe": f"a | touch {C}",
    "redirect": f"> {C}",
    "expansions": "$HOME ${IFS} * ~ !! %s %n \\ \\n $'\\x41'",
    "dash-first": "-n --help",
    "unicode": f"日本語 ✓ é \u202e\u00a0 ; touch {C}",
    "big-100kB": "A" * 100_000 + f"$(touch {C})'\";touch {C}`touch {C}`",
}
PATH_SAFE = [k for k, v in HOSTILE.items() if len(v.encode()) < 200]  # a path component holds < 256 bytes
BAD_ENV_NAMES = ["A B", "1A", "A=B", f"A;touch {C}", f"$(touch {C})", "", "A-B", "é", "A\nB"]


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    d = tmp_path / "canary-dir"
    d.mkdir()
    return d / "CANARY"


def arm(name: str, canary: Path) -> str:
    return HOSTILE[name].replace(C, str(canary))


def nested_dir(base: Path, value: str) -> Path:
    """A directory whose path ends with `value` (its '/' make sub-directories); created."""
    d = base / "d" / value.lstrip("/")
    d.mkdir(parents=True)
    return d


def wait_for_file(path: Path, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear in {timeout_s} s")
        time.sleep(0.05)
    time.sleep(0.05)  # let the writer finish
    return path.read_text()


@pytest.mark.parametrize("name", HOSTILE)
def test_argv_items_arrive_literally(any_host: Host, canary: Path, name: str) -> None:
    value = arm(name, canary)
    assert any_host.run(["printf", "%s", value]).stdout == value
    assert any_host.run(["printf", "%s|%s", value, "second"]).stdout == f"{value}|second"
    assert not canary.exists()


@pytest.mark.parametrize("name", HOSTILE)
def test_env_values_arrive_literally(any_host: Host, canary: Path, name: str) -> None:
    value = arm(name, canary)
    env = {"SPECTRIAL_V": value}
    assert any_host.run(["printenv", "SPECTRIAL_V"], env=env).stdout == value + "\n"
    assert any_host.run('printf %s "$SPECTRIAL_V"', env=env).stdout == value  # shell-string form
    assert not canary.exists()


@pytest.mark.parametrize("name", PATH_SAFE)
def test_cwd_and_file_paths_arrive_literally(any_host: Host, canary: Path, tmp_path: Path, name: str) -> None:
    value = arm(name, canary)
    d = nested_dir(tmp_path, value)
    assert any_host.run(["pwd"], cwd=str(d)).stdout == f"{d}\n"
    assert any_host.run('printf %s "$PWD"', cwd=str(d)).stdout == str(d)

    target = d / value.rsplit("/", 1)[-1]  # the value as a file name too
    any_host.write_text(str(target), value)
    assert target.read_text() == value and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert any_host.read_text(str(target)) == value
    assert any_host.exists(str(target))
    copy = tmp_path / "copy"
    any_host.get(str(target), copy)
    assert copy.read_text() == value
    any_host.remove(str(target))
    assert not target.exists()
    assert not canary.exists()


@pytest.mark.parametrize("name", HOSTILE)
def test_file_content_arrives_literally(any_host: Host, canary: Path, tmp_path: Path, name: str,
                                        request: pytest.FixtureRequest) -> None:
    value = arm(name, canary)
    target = tmp_path / "content.txt"
    any_host.write_text(str(target), value)
    assert target.read_text() == value
    assert any_host.read_text(str(target)) == value
    assert not canary.exists()


@pytest.mark.parametrize("name", HOSTILE)
def test_start_detached_passes_everything_literally(any_host: Host, reaper: Reaper, canary: Path,
                                                    tmp_path: Path, name: str) -> None:
    value = arm(name, canary)
    small = len(value) < 1000
    env_value = value if small else "env-small"  # argv + env of 100 kB each would pass the 128 kB cap
    workdir = nested_dir(tmp_path, value) if small else tmp_path / "w"
    workdir.mkdir(exist_ok=True)
    log = workdir / ("log " + value.rsplit("/", 1)[-1] if small else "log")
    script = 'printf %s "$1" > arg.out; printf %s "$SPECTRIAL_V" > env.out; echo logged; exec sleep 30'
    pid = reaper.add(any_host, any_host.start_detached(["sh", "-c", script, "sh", value],
                                                       env={"SPECTRIAL_V": env_value}, log_path=str(log),
                                                       cwd=str(workdir)))
    assert wait_for_file(workdir / "arg.out") == value  # also shows cwd was the hostile directory
    assert wait_for_file(workdir / "env.out") == env_value
    assert wait_for_file(log) == "logged\n"
    (proc,) = [p for p in any_host.processes(pid) if p.pid == pid]
    assert proc.environ is not None and proc.environ["SPECTRIAL_V"] == env_value  # from /proc environ
    assert proc.cmdline == ["sleep", "30"]
    assert not canary.exists()


@pytest.mark.parametrize("bad", BAD_ENV_NAMES)
def test_invalid_env_names_are_refused(any_host: Host, reaper: Reaper, canary: Path, tmp_path: Path,
                                       bad: str) -> None:
    name = bad.replace(C, str(canary))
    with pytest.raises(ConfigError, match="env"):
        any_host.run(["true"], env={name: "v"})
    with pytest.raises(ConfigError, match="env"):
        any_host.run("true", env={"OK": "v", name: "v"})
    with pytest.raises(ConfigError, match="env"):
        reaper.add(any_host, any_host.start_detached(["sleep", "30"], env={name: "v"},
                                                     log_path=str(tmp_path / "never.log")))
    assert not (tmp_path / "never.log").exists()
    assert not canary.exists()


def test_long_quoted_command_lines(any_host: Host, canary: Path, request: pytest.FixtureRequest) -> None:
    # 40 k single quotes: each becomes '"'"' on the command line, ~200 kB, past Linux's 128 kB cap
    value = f"'$(touch {canary})" * 4000 + "'" * 30_000
    res = any_host.run(["printf", "%s", value])
    assert res.stdout == value and not canary.exists()
    assert any_host.run(["echo", "short"]).stdout == "short\n"  # no leftover script interferes


TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=300)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=st.lists(TEXT, min_size=1, max_size=4), env_value=TEXT)
def test_any_text_round_trips(any_host: Host, argv: list[str], env_value: str) -> None:
    out = any_host.run(["printf", "%s\\0", *argv]).stdout
    assert out.split("\0")[:-1] == argv
    assert any_host.run('printf %s "$V"', env={"V": env_value}).stdout == env_value


@pytest.mark.ssh
def test_ssh_does_not_forward_the_callers_environment(ssh_host: SSHHost, monkeypatch: pytest.MonkeyPatch) -> None:
    # over SSH, env comes only from the `env` argument (on the command line), never from this process
    monkeypatch.setenv("LC_SPECTRIAL_LEAK", "leaked")  # LC_* is what ssh clients usually forward
    assert ssh_host.run('printf %s "${LC_SPECTRIAL_LEAK-unset}"').stdout == "unset"
    assert ssh_host.run('printf %s "$LC_SPECTRIAL_LEAK"', env={"LC_SPECTRIAL_LEAK": "given"}).stdout == "given"
