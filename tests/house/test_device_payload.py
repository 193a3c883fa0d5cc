"""Issue 41: every documented device call stays under 48 MiB (the device tool refuses over 64 MiB; the rest is room
for the working tree to grow). A call's payload is the working tree (tracked and untracked-not-ignored files) plus
what its `carry` names; the calls are the JSON objects with a "carry" in docs/DEVICE.md, so a call documented there
is a call checked here, and the carried builds' sizes come from scripts/device_carried.json where they are not built
(a clean clone), from the disk where they are (then the table must agree)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIMIT = 48 * 1024 * 1024
MIB = 1024 * 1024
CARRIED = {k: v for k, v in json.loads((REPO / "scripts" / "device_carried.json").read_text()).items()
           if not k.startswith("_")}


def documented_calls() -> list[dict]:
    """The device calls of docs/DEVICE.md: each JSON object inside a ```json fence that names a `carry`."""
    text = (REPO / "docs" / "DEVICE.md").read_text()
    calls = []
    for fence in re.findall(r"```json\n(.*?)```", text, flags=re.S):
        for line in fence.strip().splitlines():
            if '"carry"' in line or '"command"' in line:
                calls.append(line)
    out = []
    buf = ""
    for line in calls:  # an object may span two lines
        buf += line
        try:
            obj = json.loads(buf)
        except json.JSONDecodeError:
            continue
        buf = ""
        if "carry" in obj:
            out.append(obj)
    assert not buf, f"a call in docs/DEVICE.md is not valid JSON: {buf[:200]}"
    return out


def tree_bytes() -> int:
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           check=True).stdout.split(b"\0")
    return sum((REPO / f.decode()).stat().st_size for f in files if f and (REPO / f.decode()).is_file())


def on_disk(path: str) -> int | None:
    p = REPO / path
    if p.is_file():
        return p.stat().st_size
    if p.is_dir():
        return sum(q.stat().st_size for q in p.rglob("*") if q.is_file())
    return None


def test_the_documented_calls_are_found() -> None:
    calls = documented_calls()
    commands = " ".join(c["command"] for c in calls)
    assert len(calls) >= 5, calls
    for script in ("device_run.sh call1", "device_sglang.sh stage", "device_sglang.sh call1", "device_sglang.sh call2"):
        assert script in commands, commands


@pytest.mark.parametrize("call", documented_calls(), ids=lambda c: f"{c['command'][:60]} {'+'.join(c['carry'])}")
def test_each_documented_call_fits(call: dict) -> None:
    tree = tree_bytes()
    parts = {}
    for path in call["carry"]:
        assert path in CARRIED, (f"{path} (carried by {call['command']!r}) has no size in scripts/device_carried.json: "
                                 "add what its prepare script makes")
        parts[path] = on_disk(path) or CARRIED[path]
    total = tree + sum(parts.values())
    said = ", ".join(f"{p} {b / MIB:.1f} MiB" for p, b in parts.items())
    assert total < LIMIT, (f"{call['command']!r} would carry {total / MIB:.1f} MiB (working tree {tree / MIB:.1f} MiB, "
                           f"{said}), over 48 MiB: compact new records (`spectrial compact outputs/examples`), or "
                           "split what the call carries over more calls (docs/DEVICE.md)")


def test_the_carried_sizes_are_current() -> None:
    """Where a carried path is built here, scripts/device_carried.json says its size within 5 %."""
    stale = {p: (CARRIED[p], b) for p in CARRIED if (b := on_disk(p)) is not None and abs(b - CARRIED[p]) > 0.05 * b}
    assert not stale, f"update scripts/device_carried.json (recorded, on disk): {stale}"
