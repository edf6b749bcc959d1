"""Hostfiles, Slurm allocations and the launcher they call for (pure functions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tnt_launch import slurm
from tnt_launch.config import LaunchConfig, LaunchError, UsageError
from tnt_launch.hosts import (
    Host,
    Placement,
    is_local_host,
    parse_hostfile,
    parse_hostfile_text,
    resolve_hosts,
)


def test_hostfile_names_slots_comments_and_blank_lines() -> None:
    text = "# cluster\n\nnode1\n  node2 slots=4   # big one\nnode3\tslots=2\n\n"
    assert parse_hostfile_text(text, "hf") == [
        Host("node1"),
        Host("node2", slots=4),
        Host("node3", slots=2),
    ]


def test_a_spare_host_is_marked_and_needs_a_host_to_start_on() -> None:
    assert parse_hostfile_text("a slots=2\nb slots=2 spare\nc spare\n", "hf") == [
        Host("a", slots=2),
        Host("b", slots=2, spare=True),
        Host("c", spare=True),
    ]


def test_a_spare_host_takes_replacements_of_elastic_min_max_only(tmp_path: Path) -> None:
    hostfile = tmp_path / "hf"
    hostfile.write_text("a\nb spare\n")
    with pytest.raises(UsageError, match="a spare host takes the replacements of an elastic job; give --elastic MIN:MAX"):
        resolve_hosts(LaunchConfig(script="x.py", hostfile=str(hostfile), elastic_min=1), {})
    placement = resolve_hosts(LaunchConfig(script="x.py", hostfile=str(hostfile), elastic_min=1, elastic_max=2), {})
    assert [h.spare for h in placement.hosts] == [False, True]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a\nb\na\n", "hf:3: host 'a' is listed again (first on line 1)"),
        ("a spare\n", "hf: every host is a spare; the job needs at least one host to start on"),
        ("a\nb cores=2\n", "hf:2: unknown field 'cores=2'"),
        ("a slots=0\n", "hf:1: slots must be a positive whole number, not '0'"),
        ("a slots=x\n", "hf:1: slots must be a positive whole number, not 'x'"),
        ("a slots=1 slots=2\n", "hf:1: slots is given twice"),
        ("# nothing\n\n", "hf: the hostfile lists no hosts"),
        ("-oProxyCommand=x\n", "hf:1: '-oProxyCommand=x' is not a host name"),
        ("a\nuser@b\n", "hf:2: 'user@b' is not a host name"),
    ],
)
def test_hostfile_errors_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(UsageError) as error:
        parse_hostfile_text(text, "hf")
    assert str(error.value).startswith(message)


def test_hostfile_that_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"cannot read hostfile .*missing: No such file"):
        parse_hostfile(str(tmp_path / "missing"))


@pytest.mark.parametrize(
    ("nodelist", "names"),
    [
        ("node1", ["node1"]),
        ("a,b,c", ["a", "b", "c"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("cpu-a[1-2]b[1-2]", ["cpu-a1b1", "cpu-a1b2", "cpu-a2b1", "cpu-a2b2"]),
        ("x[1],login,y[009-010]", ["x1", "login", "y009", "y010"]),
    ],
)
def test_slurm_nodelists_expand(nodelist: str, names: list[str]) -> None:
    assert slurm.expand_nodelist(nodelist) == names


@pytest.mark.parametrize("nodelist", ["n[1-", "n[3-1]", "n[a-b]", "n]1["])
def test_bad_slurm_nodelists_are_errors(nodelist: str) -> None:
    with pytest.raises(LaunchError, match="cannot read Slurm node list"):
        slurm.expand_nodelist(nodelist)


def test_slurm_allocation_gives_nodes_tasks_and_cpus() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "c[1-4]", "SLURM_TASKS_PER_NODE": "2(x3),1",
           "SLURM_CPUS_PER_TASK": "3"}
    assert slurm.allocation(env) == slurm.Allocation("7", ("c1", "c2", "c3", "c4"), (2, 2, 2, 1), 3)
    # Without a per-node count, SLURM_NTASKS_PER_NODE (--ntasks-per-node) gives every node its slots.
    env = {"SLURM_JOB_ID": "7", "SLURM_NODELIST": "c[1-2]", "SLURM_NTASKS_PER_NODE": "4"}
    assert slurm.allocation(env) == slurm.Allocation("7", ("c1", "c2"), (4, 4))
    assert slurm.allocation({"SLURM_JOB_ID": "7", "SLURM_NODELIST": "c1"}) == slurm.Allocation("7", ("c1",))
    assert slurm.allocation({"SLURM_JOB_NODELIST": "c1"}) is None
    assert slurm.allocation({}) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2(x3", "cannot read SLURM_TASKS_PER_NODE='2(x3': '2(x3' is not N or N(xK)"),
        ("2,2,2", "SLURM_TASKS_PER_NODE='2,2,2' gives 3 node(s) a task count, but SLURM_JOB_NODELIST names 2"),
    ],
)
def test_unreadable_task_counts_are_errors(text: str, message: str) -> None:
    with pytest.raises(LaunchError) as error:
        slurm.allocation({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "c[1-2]", "SLURM_TASKS_PER_NODE": text})
    assert str(error.value) == message


SLURM = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "c[1-3]", "SLURM_TASKS_PER_NODE": "2(x2),1", "PATH": ""}


def with_srun(tmp_path: Path) -> dict[str, str]:
    srun = tmp_path / "bin" / "srun"
    srun.parent.mkdir()
    srun.write_text("#!/bin/sh\n")
    srun.chmod(0o755)
    return {**SLURM, "PATH": str(srun.parent)}


def test_hostfile_then_slurm_then_this_host(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.1\n127.0.0.2 slots=2\n")
    assert resolve_hosts(LaunchConfig(hostfile=str(hostfile)), SLURM) == Placement(
        [Host("127.0.0.1", None, local=True), Host("127.0.0.2", 2, local=False)], "ssh"
    )
    allocation = slurm.allocation(SLURM)
    # Inside an allocation without srun on PATH: its nodes over ssh, with their task counts as slots.
    assert resolve_hosts(LaunchConfig(), SLURM) == Placement(
        [Host("c1", 2), Host("c2", 2), Host("c3", 1)], "ssh", allocation
    )
    # There -n means this host, as outside one.
    assert resolve_hosts(LaunchConfig(nprocs=2), SLURM) == Placement([Host("localhost", local=True)], "local")
    assert resolve_hosts(LaunchConfig(), {}) == Placement([Host("localhost", local=True)], "local")


def test_inside_an_allocation_srun_starts_the_ranks(tmp_path: Path) -> None:
    env = with_srun(tmp_path)
    allocation = slurm.allocation(env)
    assert resolve_hosts(LaunchConfig(), env) == Placement(
        [Host("c1", 2), Host("c2", 2), Host("c3", 1)], "srun", allocation
    )
    # -n N places N ranks on the allocation's nodes in order, each up to its tasks.
    assert resolve_hosts(LaunchConfig(nprocs=3), env) == Placement([Host("c1", 2), Host("c2", 1)], "srun", allocation)
    # An elastic job with replacements keeps the nodes -n leaves empty as spares, each with its tasks.
    assert resolve_hosts(LaunchConfig(nprocs=2, elastic_min=1, elastic_max=3), env) == Placement(
        [Host("c1", 2), Host("c2", 2, spare=True), Host("c3", 1, spare=True)], "srun", allocation
    )
    assert resolve_hosts(LaunchConfig(nprocs=2, elastic_min=1), env) == Placement([Host("c1", 2)], "srun", allocation)
    # --launcher says otherwise.
    assert resolve_hosts(LaunchConfig(nprocs=3, launcher="local"), env) == Placement(
        [Host("localhost", local=True)], "local"
    )
    assert resolve_hosts(LaunchConfig(launcher="ssh"), env).launcher == "ssh"


@pytest.mark.parametrize(
    ("config", "env", "message"),
    [
        (LaunchConfig(nprocs=6), SLURM | {"PATH": "x"}, None),
        (LaunchConfig(nprocs=6, launcher="srun"), SLURM, "-n 6: the Slurm allocation has 5 task(s); ask Slurm for 6"),
        (LaunchConfig(launcher="srun"), {}, "--launcher srun: not inside a Slurm allocation"),
        (LaunchConfig(launcher="srun", hostfile="h"), SLURM, "--launcher srun starts ranks on the Slurm allocation's"),
        (LaunchConfig(launcher="local", hostfile="h"), SLURM, "--launcher local starts ranks on this host only"),
        (
            LaunchConfig(),
            SLURM | {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"},
            "tnt-launch runs as one of 2 tasks of a Slurm step (srun -n 2): each task would start a job",
        ),
    ],
)
def test_launcher_mistakes_are_refused(config: LaunchConfig, env: dict[str, str], message: str | None) -> None:
    if message is None:
        # Outside srun's reach (no srun on PATH) -n is this host's, however many tasks Slurm gave.
        assert resolve_hosts(config, env).launcher == "local"
        return
    with pytest.raises(UsageError) as error:
        resolve_hosts(config, env)
    assert str(error.value).startswith(message)


def test_local_host_names() -> None:
    import socket

    assert is_local_host("localhost")
    assert is_local_host("127.0.0.1")
    assert is_local_host(socket.gethostname())
    # Another loopback address is a host of its own, reached over ssh (how the tests fake two).
    assert not is_local_host("127.0.0.2")
    assert not is_local_host("node-that-is-not-here")
