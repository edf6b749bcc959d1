"""Rank 0's stdout in a terminal: passed on as it comes, unfinished lines included, and the rank is
told (TNT_STDOUT_TTY=true) so that it may draw live progress bars; into a pipe, it is told false."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import TESTS, Launcher, read_reports
from pty_reader import read_terminal

TTY_RANK = str(TESTS / "tty_rank.py")


def _in_terminal(
    launcher: Launcher, args: list[str], go: Path, timeout: float = 60
) -> tuple[bytes | None, bytes, str, int]:
    """Runs tnt-launch with its stdout on a pseudo-terminal and creates `go` as soon as "a" shows
    there. Returns what the terminal had shown by then (None: "a" never came alone), all it
    showed, tnt-launch's stderr and its exit code."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        launcher.argv(args),
        cwd=launcher.cwd,
        env=launcher.env,
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
    )
    os.close(slave)
    before: list[bytes] = []

    def seen(shown: bytes) -> None:
        if not before and b"a" in shown:
            before.append(shown)
            go.touch()

    try:
        shown = read_terminal(master, proc, timeout, chunk=4096, seen=seen)
        _, err = proc.communicate(timeout=30)
    finally:
        os.close(master)
    before_go = before[0] if before else None
    return before_go, shown, err.decode(errors="replace"), proc.returncode


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["local", "ssh"])
def test_in_a_terminal_an_unfinished_line_shows_at_once(
    launcher: Launcher, reports: Path, tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    args = ["-n", "2", "--no-gpu"]
    if where == "ssh":  # both ranks on 127.0.0.2, through ssh and the agent there
        sshd = request.getfixturevalue("sshd")
        launcher.env["TNT_SSH_OPTS"] = sshd.options
        hostfile = sshd.hostfile(launcher.cwd, "127.0.0.2")
        args = [
            "--hostfile",
            str(hostfile),
            "--ssh-port",
            str(sshd.port),
            "--n-per-node",
            "2",
            "--no-gpu",
        ]
    go = tmp_path / "go"
    before_go, shown, err, code = _in_terminal(
        launcher, [*args, "--", TTY_RANK, str(reports), str(go)], go
    )
    assert code == 0, err
    # "a" came while rank 0 still waited to end its line; the terminal turns "\n" into "\r\n".
    assert before_go == b"a", shown
    assert shown == b"ab\r\n"
    got = read_reports(reports, 2)
    assert [r["TNT_STDOUT_TTY"] for r in got] == ["true", "false"]


@pytest.mark.timeout(90)
def test_into_a_pipe_ranks_are_told_no_terminal(
    launcher: Launcher, reports: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    go.touch()
    done = launcher.run(["-n", "2", "--no-gpu", "--", TTY_RANK, str(reports), str(go)])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ab\n"
    got = read_reports(reports, 2)
    assert [r["TNT_STDOUT_TTY"] for r in got] == ["false", "false"]


@pytest.mark.timeout(120)
def test_in_a_terminal_prefixed_output_is_not_a_terminal(
    launcher: Launcher, reports: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    go.touch()
    args = ["-n", "2", "--no-gpu", "--output-on-all-devices", "--", TTY_RANK, str(reports), str(go)]
    _, shown, err, code = _in_terminal(launcher, args, tmp_path / "unused")
    assert code == 0, err
    assert shown == b"[rank 0] ab\r\n"
    got = read_reports(reports, 2)
    assert [r["TNT_STDOUT_TTY"] for r in got] == ["false", "false"]
