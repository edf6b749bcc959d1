"""Pinning ranks to NUMA nodes with numactl, verified from inside the ranks."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import RANK, Launcher, read_reports

NODES = sorted(Path("/sys/devices/system/node").glob("node[0-9]*"))


def _node_cpus(node: int) -> str:
    return Path(f"/sys/devices/system/node/node{node}/cpulist").read_text().strip()


def _count(cpulist: str) -> int:
    total = 0
    for part in cpulist.split(","):
        low, _, high = part.partition("-")
        total += int(high or low) - int(low) + 1
    return total


@pytest.fixture(autouse=True)
def _needs_numactl() -> None:
    if shutil.which("numactl") is None or not NODES:
        reason = "numactl is not installed (Debian: apt-get install numactl)"
        print(f"SKIP pinning tests: {reason}")
        pytest.skip(reason)


def _only_cpu_0() -> None:
    os.sched_setaffinity(0, {0})


@pytest.mark.timeout(60)
def test_pin_to_socket_binds_cpus_and_prefers_memory(launcher: Launcher, tmp_path: Path) -> None:
    # tnt-launch itself runs on CPU 0 alone; a pinned rank gets all CPUs of its NUMA node.
    plain, pinned = tmp_path / "plain", tmp_path / "pinned"
    plain.mkdir()
    pinned.mkdir()
    done = launcher.run(["-n", "1", "--no-gpu", "--", RANK, str(plain)], preexec_fn=_only_cpu_0)
    assert done.returncode == 0, done.stderr
    assert read_reports(plain, 1)[0]["cpus_allowed"] == "0"

    done = launcher.run(["-n", "1", "--no-gpu", "--pin-to-socket", "--", RANK, str(pinned)],
                        preexec_fn=_only_cpu_0)
    assert done.returncode == 0, done.stderr
    report = read_reports(pinned, 1)[0]
    assert report["cpus_allowed"] == _node_cpus(0)
    assert "preferred node: 0" in report["numactl_show"]
    assert report["env"]["OMP_NUM_THREADS"] == str(_count(_node_cpus(0)))


@pytest.mark.timeout(60)
def test_pin_memory_to_socket_binds_memory(launcher: Launcher, reports: Path) -> None:
    done = launcher.run(["-n", "1", "--no-gpu", "--pin-to-socket", "--pin-memory-to-socket",
                         "--", RANK, str(reports)])
    assert done.returncode == 0, done.stderr
    report = read_reports(reports, 1)[0]
    assert report["cpus_allowed"] == _node_cpus(0)
    assert "policy: bind" in report["numactl_show"]
    assert re.search(r"^membind: 0\s*$", report["numactl_show"], re.MULTILINE)


@pytest.mark.timeout(60)
def test_more_ranks_than_numa_nodes_is_a_clear_error(launcher: Launcher, reports: Path) -> None:
    count = len(NODES) + 1
    done = launcher.run(["-n", str(count), "--no-gpu", "--pin-to-socket", "--", RANK,
                         str(reports)])
    assert done.returncode == 2
    assert done.stderr == (
        f"tnt-launch: error: --pin-to-socket: {count} ranks on host localhost, which has only "
        f"{len(NODES)} NUMA node(s); start at most {len(NODES)} rank(s) per host or leave out "
        "--pin-to-socket\n"
    )
    assert not list(reports.iterdir())
