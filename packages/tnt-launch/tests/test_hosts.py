"""Hostfiles and Slurm node lists (pure functions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tnt_launch.config import LaunchConfig, LaunchError, UsageError
from tnt_launch.hosts import (
    Host,
    expand_slurm_nodelist,
    is_local_host,
    parse_hostfile,
    parse_hostfile_text,
    resolve_hosts,
    slurm_hosts,
)


def test_hostfile_names_slots_comments_and_blank_lines() -> None:
    text = "# cluster\n\nnode1\n  node2 slots=4   # big one\nnode3\tslots=2\n\n"
    assert parse_hostfile_text(text, "hf") == [
        Host("node1"),
        Host("node2", slots=4),
        Host("node3", slots=2),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a\nb\na\n", "hf:3: host 'a' is listed again (first on line 1)"),
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
    assert expand_slurm_nodelist(nodelist) == names


@pytest.mark.parametrize("nodelist", ["n[1-", "n[3-1]", "n[a-b]", "n]1["])
def test_bad_slurm_nodelists_are_errors(nodelist: str) -> None:
    with pytest.raises(LaunchError, match="cannot read Slurm node list"):
        expand_slurm_nodelist(nodelist)


def test_slurm_allocation_gives_hosts_and_slots() -> None:
    env = {"SLURM_JOB_NODELIST": "c[1-2]", "SLURM_NTASKS_PER_NODE": "4"}
    assert slurm_hosts(env) == [Host("c1", 4), Host("c2", 4)]
    assert slurm_hosts({"SLURM_NODELIST": "c1"}) == [Host("c1")]
    assert slurm_hosts({}) is None


def test_resolve_hosts_prefers_hostfile_then_slurm_then_this_host(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.1\n127.0.0.2 slots=2\n")
    slurm = {"SLURM_JOB_NODELIST": "c[1-2]"}
    assert resolve_hosts(LaunchConfig(hostfile=str(hostfile)), slurm) == [
        Host("127.0.0.1", None, local=True),
        Host("127.0.0.2", 2, local=False),
    ]
    assert [h.name for h in resolve_hosts(LaunchConfig(), slurm)] == ["c1", "c2"]
    # -n means this host, even inside an allocation.
    assert resolve_hosts(LaunchConfig(nprocs=2), slurm) == [Host("localhost", local=True)]
    assert resolve_hosts(LaunchConfig(), {}) == [Host("localhost", local=True)]


def test_local_host_names() -> None:
    import socket

    assert is_local_host("localhost")
    assert is_local_host("127.0.0.1")
    assert is_local_host(socket.gethostname())
    # Another loopback address is a host of its own, reached over ssh (how the tests fake two).
    assert not is_local_host("127.0.0.2")
    assert not is_local_host("node-that-is-not-here")
