"""The cluster the cluster tests run on, and the order in which pytest-xdist hands out the files."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# tnt-launch's helpers of its tests (job_leftovers.py) serve these tests too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "tnt-launch" / "tests"))

from cluster_jobs import HOSTS  # noqa: E402
from netns_cluster import Cluster, ClusterUnavailable, up  # noqa: E402


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A cluster per test file (and per xdist worker): the two files that use one run side by side."""
    try:
        c = up(HOSTS)
    except ClusterUnavailable as e:
        print(f"SKIP cluster tests: {e}")
        pytest.skip(str(e))
    try:
        yield c
    finally:
        c.down()


# By file on two workers (--dist loadfile --no-loadscope-reorder, as nox runs them), in this order:
# test_cluster.py's busy jobs on one worker from the start, this machine's own jobs on the other,
# then there the failure tests, which mostly wait (on cut links, stall timeouts, ssh), beside the
# cluster's Keras jobs. 113 s on 2 cores (2026-11-24), against 136 s with the failure tests in
# test_cluster.py, the last 50 s of them alone. The Slurm tests (about 80 s, half of it the
# preemption test's three Keras jobs) come third, so that the failure tests, which mostly wait, end
# the session on the other worker.
ORDER = ["test_cluster.py", "test_comm_under_launch.py", "test_slurm.py", "test_cluster_failures.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A stable sort: each file's tests keep their order; a file not named above goes last.
    items.sort(key=lambda item: ORDER.index(item.path.name) if item.path.name in ORDER else len(ORDER))
