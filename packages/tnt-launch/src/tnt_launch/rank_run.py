"""One rank of a running job as the supervisor sees it: its two output streams (the agent's pipes,
or its lines of an srun step), the agent's own lines among the rank's stderr, how the rank is told
things (`Control`: its agent's stdin, or the step's), and how it ended. The starters (`starters/`)
make the runs; the supervisor reads what they report.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections import deque
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol

from tnt_launch import quiet
from tnt_launch._agent import MARKER
from tnt_launch.plan import RankSpec

TAIL_LINES = 20
_MARKER = MARKER.encode()
MAX_LINE = 65536
"""A line longer than this is handed on in pieces."""


def split_lines(partial: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """The complete lines of `partial + data` (without their newlines) and what is left of a line
    not ended yet; a line longer than MAX_LINE is handed on as it is."""
    lines = (partial + data).split(b"\n")
    rest = lines.pop()
    if len(rest) > MAX_LINE:
        lines.append(rest)
        rest = b""
    return lines, rest


@dataclass(frozen=True)
class RankStatus:
    code: int | None
    signal: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.code == 0 and self.error is None

    @property
    def exit_code(self) -> int:
        if self.code is not None:
            return self.code
        return 128 + (self.signal or 0)

    def describe(self) -> str:
        if self.error is not None and self.code is None and self.signal is None:
            return f"failed: {self.error}"  # no exit status ever came (its agent was dropped)
        if self.error is not None:
            return f"failed: {self.error} (exit code {self.exit_code})"
        if self.signal is not None:
            return f"was killed by signal {self.signal} ({signal_name(self.signal)})"
        return f"exited with code {self.code}"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def read_available(fd: int) -> bytes | None:
    """What a non-blocking pipe holds now: None if nothing yet, b"" at its end (or an error)."""
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


class Output:
    """Where a rank's two streams go: tnt-launch's own stdout/stderr and/or files."""

    def __init__(self, out: BinaryIO, err: BinaryIO) -> None:
        self._targets = {"out": out, "err": err}
        self._broken: set[str] = set()

    def write(self, stream: str, data: bytes) -> None:
        if stream in self._broken or not data:
            return
        target = self._targets[stream]
        try:
            target.write(data)
            target.flush()
        except (BrokenPipeError, ValueError, OSError):
            # Whoever reads our output has gone away; the job carries on.
            self._broken.add(stream)


class AgentLines:
    """Separates the agent's own lines (see `_agent.MARKER`) from a rank's stderr.

    The agent writes them only before its rank starts and after it has ended, so they never
    split a line of the rank; a marker cut in two by a read is held back until it is whole.
    """

    def __init__(self) -> None:
        self.held = b""

    def feed(self, data: bytes) -> tuple[bytes, list[bytes]]:
        data = self.held + data
        self.held = b""
        passed = bytearray()
        messages = []
        while (at := data.find(_MARKER)) >= 0:
            end = data.find(b"\n", at)
            if end < 0:
                break
            passed += data[:at]
            messages.append(data[at + len(_MARKER) : end])
            data = data[end + 1 :]
        cut = data.find(_MARKER)
        if cut < 0:
            cut = data.rfind(b"\x1e")
            if cut >= 0 and not _MARKER.startswith(data[cut:]):
                cut = -1
        if cut >= 0 and len(data) - cut <= MAX_LINE:
            self.held = data[cut:]
            data = data[:cut]
        passed += data
        return bytes(passed), messages

    def flush(self) -> bytes:
        held, self.held = self.held, b""
        return held


class Stream:
    """One of a rank's two output streams: its agent's own pipe (`fd`), or, under srun (`fd` None),
    its lines of the step's stream, which the step's `Source` hands over."""

    def __init__(self, run: RankRun, name: str, fd: int | None) -> None:
        self.run = run
        self.name = name
        self.fd = fd
        self.partial = b""
        self.open = True
        self.agent_lines = AgentLines() if name == "err" else None
        self.startup_filter: quiet.StartupFilter | None = None  # set where the plan hides TF's start-up lines
        run.streams.append(self)

    def feed(self, data: bytes, whole_lines: bool) -> Fed:
        """What `data` brings: the agent's messages among it, the rank's own output as it came (less
        TensorFlow's start-up lines, where hidden), and, with `whole_lines` or on stderr, its lines
        now complete (for the summary's tail and prefixed output)."""
        messages: list[bytes] = []
        if self.agent_lines is not None:
            data, messages = self.agent_lines.feed(data)
        if self.startup_filter is not None:
            data = self.startup_filter.feed(data)
        return Fed(messages, data, self._lines(data, whole_lines))

    def end(self, whole_lines: bool) -> Fed:
        """What is left once the stream has ended: held-back bytes, and the last line unended."""
        self.open = False
        data = b""
        if self.agent_lines is not None:
            data = self.agent_lines.flush()
            if self.startup_filter is not None:
                data = self.startup_filter.feed(data) + self.startup_filter.flush()
        lines = self._lines(data, whole_lines)
        if self.partial and (whole_lines or self.name == "err"):
            lines.append(self.partial + b"\n")
        self.partial = b""
        return Fed([], data, lines)

    def _lines(self, data: bytes, whole_lines: bool) -> list[bytes]:
        if not data or not (whole_lines or self.name == "err"):
            return []
        lines, self.partial = split_lines(self.partial, data)
        return [line + b"\n" for line in lines]


@dataclass
class Fed:
    """What a stream made of the data it was fed (`Stream.feed`)."""

    messages: list[bytes]
    data: bytes
    lines: list[bytes]


@dataclass
class Read:
    """What a `Source` had: data for rank streams (None: for tnt-launch's own output, e.g. srun's
    words), and, at its end, the streams that ended with it."""

    data: list[tuple[Stream | None, bytes]] = field(default_factory=list)
    ended: list[Stream] | None = None


class Source(Protocol):
    """A pipe the supervisor's selector watches: an agent's stdout or stderr, or an srun step's."""

    fd: int
    name: str  # "out" or "err": where data for no rank goes

    def read(self) -> Read | None:
        """What the pipe holds now (None: nothing yet)."""
        ...


class Control(Protocol):
    """How the supervisor talks to one rank's agent (stdin) and lets go of it."""

    def send(self, command: bytes) -> None: ...
    def finished(self) -> None: ...
    def kill(self) -> None: ...


class RankRun:
    """One rank and what has been seen of it; `proc` is the process that runs its agent (its own,
    or the srun step of every rank), `control` how to reach that agent."""

    def __init__(self, spec: RankSpec, proc: subprocess.Popen[bytes] | None, control: Control | None = None) -> None:
        self.spec = spec
        self.proc = proc
        self.control = control
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.ready = False
        self.reported: dict[str, Any] | None = None
        self.status: RankStatus | None = None
        self.exited_at: float | None = None
        self.failed_on_its_own = False
        self.state: dict[str, Any] | None = None
        """The agent's answer to 'S': which of the rank's processes are stopped."""
        self.state_asked = False
        self.error: dict[str, Any] | None = None
        """The exception the rank reported it ends with, as data (tnt_comm.error_data)."""
        self.error_at: float | None = None
        """When that report arrived: the rank is about to exit."""
        self.printed = False
        """Whether the rank said its traceback is written (after the report): its last lines are in."""
        self.heard_at: float | None = None
        """When tnt-launch first heard that the rank failed (its report or its exit)."""
        self.stopped_by_us = False
        """Whether the rank ended while tnt-launch was stopping the job."""
        self.ended_before_stop = False
        """Whether its agent said how it ended before tnt-launch began to stop the job."""
        self.files: dict[str, BinaryIO] = {}
        self.streams: list[Stream] = []

    @property
    def running(self) -> bool:
        return self.status is None

    def send(self, command: bytes) -> None:
        if self.control is not None:
            self.control.send(command)

    def close_stdin(self) -> None:
        if self.control is not None:
            self.control.finished()

    def kill(self) -> None:
        """Last resort: kill the agent (with everything under it, where that can be seen)."""
        if self.control is not None:
            self.control.kill()
