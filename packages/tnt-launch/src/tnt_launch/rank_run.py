"""One rank of a running job as the supervisor sees it: its agent process, its two output streams
(the agent's pipes, or its lines of an srun step), the agent's own lines among the rank's stderr,
and how the rank ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections import deque
from dataclasses import dataclass
from typing import Any, BinaryIO

import psutil

from tnt_launch import quiet
from tnt_launch._agent import MARKER
from tnt_launch.plan import RankSpec
from tnt_launch.srun_step import MAX_LINE, Step

TAIL_LINES = 20
_MARKER = MARKER.encode()


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
    its lines of the step's stream, which `StepStream` hands over."""

    def __init__(self, run: RankRun, name: str, fd: int | None) -> None:
        self.run = run
        self.name = name
        self.fd = fd
        self.partial = b""
        self.open = True
        self.agent_lines = AgentLines() if name == "err" else None
        self.startup_filter: quiet.StartupFilter | None = None  # set where the plan hides TF's start-up lines


class RankRun:
    """One rank's agent process and what has been seen of it."""

    def __init__(self, spec: RankSpec, proc: subprocess.Popen[bytes] | None, step: Step | None = None) -> None:
        self.spec = spec
        self.proc = proc
        self.step = step
        """Under srun: the step whose task runs this rank's agent (`proc` is the step's srun)."""
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
        if self.step is not None:
            self.step.send(command)
            return
        if self.proc is None or self.proc.stdin is None or self.proc.stdin.closed:
            return
        try:
            self.proc.stdin.write(command)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass

    def close_stdin(self) -> None:
        if self.step is not None:
            self.step.finished(self.spec.rank)
            return
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def kill(self) -> None:
        """Last resort: kill the agent, and with a local agent everything under it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        targets = []
        if self.spec.local:
            try:
                targets = psutil.Process(self.proc.pid).children(recursive=True)
            except psutil.Error:
                targets = []
        self.proc.kill()
        for child in targets:
            try:
                child.kill()
            except psutil.Error:
                pass
