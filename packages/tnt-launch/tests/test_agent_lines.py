"""How tnt-launch tells its agents' messages apart from a rank's own stderr, and the agent's
answer to a question about stopped processes."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time

import pytest

from tnt_launch import jobs
from tnt_launch._agent import MARKER, rank_state
from tnt_launch.rank_run import AgentLines

M = MARKER.encode()


def test_messages_are_taken_out_and_output_is_passed_on() -> None:
    lines = AgentLines()
    passed, messages = lines.feed(M + b'{"event": "ready"}\nhello\n')
    assert (passed, messages) == (b"hello\n", [b'{"event": "ready"}'])
    passed, messages = lines.feed(b"no newline yet" + M + b'{"event": "exit"}\n')
    assert (passed, messages) == (b"no newline yet", [b'{"event": "exit"}'])


def test_a_message_cut_by_a_read_is_held_until_whole() -> None:
    lines = AgentLines()
    data = b"progress 10%\r" + M + b'{"event": "exit", "code": 0}\n'
    for cut in range(len(data) + 1):
        passed_a, messages_a = lines.feed(data[:cut])
        passed_b, messages_b = lines.feed(data[cut:])
        assert passed_a + passed_b == b"progress 10%\r"
        assert messages_a + messages_b == [b'{"event": "exit", "code": 0}']
        assert lines.flush() == b""


def test_record_separators_of_the_rank_itself_pass() -> None:
    lines = AgentLines()
    passed, messages = lines.feed(b"a\x1eb\x1e")
    assert messages == []
    assert passed + lines.flush() == b"a\x1eb\x1e"
    passed, _ = lines.feed(b"x\x1eTNT-AGENTS are not ours\n")
    assert passed == b"x\x1eTNT-AGENTS are not ours\n"


def test_a_state_answer_inside_a_line_of_the_rank_is_taken_out() -> None:
    lines = AgentLines()
    passed, messages = lines.feed(b"epoch 1: 50%" + M + b'{"event": "state"}\n' + b" 60%\n")
    assert (passed, messages) == (b"epoch 1: 50% 60%\n", [b'{"event": "state"}'])


@pytest.mark.timeout(30)
def test_the_agent_sees_stopped_processes() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert rank_state(0, child.pid)["stopped"] == []
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while jobs.state_of(child.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        state = rank_state(0, child.pid)
        assert state["event"] == "state" and state["running"] and state["rank_state"] == "T"
        assert state["stopped"] == [[child.pid, "T"]]
        assert len(MARKER + json.dumps(state) + "\n") < select.PIPE_BUF  # one atomic write
        assert rank_state(3, None) == {"event": "state", "rank": 3, "running": False}
    finally:
        child.kill()
        child.wait()
    assert jobs.state_of(child.pid) is None
