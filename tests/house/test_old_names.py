"""Names from before issue 38's folders keep importing, as the same module objects (a patch through either name is
one patch), in a fresh interpreter as well as here."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import spectrial


@pytest.mark.parametrize("old", sorted(spectrial.MOVED), ids=lambda o: f"spectrial.{o}")
def test_an_old_name_is_the_new_module(old: str) -> None:
    new = importlib.import_module(f"spectrial.{spectrial.MOVED[old]}")
    assert importlib.import_module(f"spectrial.{old}") is new
    assert new.__spec__ is not None and new.__spec__.name == new.__name__ == f"spectrial.{spectrial.MOVED[old]}"


def test_a_patch_through_the_old_name_is_seen_by_the_new(monkeypatch: pytest.MonkeyPatch) -> None:
    from spectrial.protocol import plan

    monkeypatch.setattr("spectrial.plan.make_plan", "patched")
    assert plan.make_plan == "patched"


def test_old_forms_in_a_fresh_interpreter() -> None:
    code = ("import spectrial.trial, spectrial.diagnose.common\n"
            "from spectrial import records, figures\n"
            "from spectrial.sweep.cli import sweep_command\n"
            "from spectrial.cluster.params import ClusterParams\n"
            "import spectrial.protocol.trial as t, spectrial.readers.diagnose.common as c, sys\n"
            "assert spectrial.trial is t and sys.modules['spectrial.diagnose.common'] is c\n"
            "assert records.__name__ == 'spectrial.record.store' and figures.__name__ == 'spectrial.analysis.figures'\n"
            "assert sweep_command.__module__ == 'spectrial.cli.sweep'\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_an_unknown_name_still_fails() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("spectrial.no_such_module")
    with pytest.raises(AttributeError):
        spectrial.no_such_attribute  # noqa: B018
