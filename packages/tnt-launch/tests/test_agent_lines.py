"""How tnt-launch tells its agents' messages apart from a rank's own stderr (pure)."""

from __future__ import annotations

from tnt_launch._agent import MARKER
from tnt_launch.supervise import _AgentLines

M = MARKER.encode()


def test_messages_are_taken_out_and_output_is_passed_on() -> None:
    lines = _AgentLines()
    passed, messages = lines.feed(M + b'{"event": "ready"}\nhello\n')
    assert (passed, messages) == (b"hello\n", [b'{"event": "ready"}'])
    passed, messages = lines.feed(b"no newline yet" + M + b'{"event": "exit"}\n')
    assert (passed, messages) == (b"no newline yet", [b'{"event": "exit"}'])


def test_a_message_cut_by_a_read_is_held_until_whole() -> None:
    lines = _AgentLines()
    data = b"progress 10%\r" + M + b'{"event": "exit", "code": 0}\n'
    for cut in range(len(data) + 1):
        passed_a, messages_a = lines.feed(data[:cut])
        passed_b, messages_b = lines.feed(data[cut:])
        assert passed_a + passed_b == b"progress 10%\r"
        assert messages_a + messages_b == [b'{"event": "exit", "code": 0}']
        assert lines.flush() == b""


def test_record_separators_of_the_rank_itself_pass() -> None:
    lines = _AgentLines()
    passed, messages = lines.feed(b"a\x1eb\x1e")
    assert messages == []
    assert passed + lines.flush() == b"a\x1eb\x1e"
    passed, _ = lines.feed(b"x\x1eTNT-AGENTS are not ours\n")
    assert passed == b"x\x1eTNT-AGENTS are not ours\n"
