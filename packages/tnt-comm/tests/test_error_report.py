"""The report of the error a rank ends with (tnt_comm/_errors.py), as a launcher receives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import os, sys, tnt_comm
assert "TNT_REPORT_FD" not in os.environ  # taken: the rank's children never see it
child = os.fork()
if child == 0:
    raise tnt_comm.Timeout("a forked child's error")  # not the rank's: never reported
os.waitpid(child, 0)
error = tnt_comm.PeerFailure("rank 3 failed: its connection closed")
error.ranks, error.rank, error.operation, error.call = [3], 3, "allreduce", 7
raise error
"""


@pytest.mark.timeout(60)
def test_the_error_a_rank_ends_with_is_reported_as_data_once() -> None:
    # The report pipe is also the rank's stderr, as the agent's pipe to tnt-launch is: what comes
    # through it shows the order the launcher sees.
    read, write = os.pipe()
    env = {**os.environ, "TNT_REPORT_FD": str(write)}
    env.pop("TNT_RANK", None)
    env.pop("TNT_SIZE", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], env=env, pass_fds=(write,), stdout=subprocess.PIPE, stderr=write
    )
    os.close(write)
    with os.fdopen(read, "rb") as reports:
        lines = reports.read().splitlines()  # until every holder of the write end has exited
    proc.communicate(timeout=30)
    text = b"\n".join(lines).decode(errors="replace")[-2000:]
    assert proc.returncode == 1, text
    events = [i for i, line in enumerate(lines) if line.startswith(b'{"event"')]
    assert len(events) == 2, text
    report, printed = (json.loads(lines[i]) for i in events)
    # The report first, then Python's traceback as before, then the word that it is printed.
    traceback = lines[events[0] + 1:events[1]]
    assert b"tnt_comm._core.PeerFailure: rank 3 failed: its connection closed" in traceback, text
    assert b"forked child" in b"\n".join(lines[:events[0]]), text  # the child's traceback, never reported
    assert printed == {"event": "printed"}
    assert report["event"] == "error"
    error = report["error"]
    assert (error["kind"], error["ranks"], error["operation"], error["call"]) == ("PeerFailure", [3], "allreduce", 7)
    assert error["message"] == "rank 3 failed: its connection closed"


@pytest.mark.timeout(60)
def test_a_descriptor_that_is_not_a_pipe_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "not-a-pipe"
    with open(target, "wb") as f:
        env = {**os.environ, "TNT_REPORT_FD": str(f.fileno())}
        out = subprocess.run(
            [sys.executable, "-c", "import tnt_comm; raise tnt_comm.TntError('x')"],
            env=env,
            pass_fds=(f.fileno(),),
            capture_output=True,
            timeout=30,
            check=False,
        )
    assert out.returncode == 1 and b"TntError: x" in out.stderr
    assert target.read_bytes() == b""
