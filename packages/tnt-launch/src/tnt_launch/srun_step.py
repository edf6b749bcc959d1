"""The srun step that runs every rank's agent as one of its tasks (launcher "srun"): its stdin, which
every task reads, and its two output streams, whose lines srun labels with the task (= rank).
The supervisor (supervise.py) starts the step and hands each rank's lines to that rank's stream.
"""

from __future__ import annotations

import contextlib
import subprocess
from typing import Any

from tnt_launch import slurm

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


class Step:
    """The srun step that runs every rank's agent as one of its tasks (launcher "srun").

    srun hands every task the same stdin, so a control byte ('S', 'T', 'K') reaches all agents: each
    is sent once, as the job-wide requests they are. stdin closes once every rank has finished (its
    agent stops its rank when it closes), or when tnt-launch ends."""

    def __init__(self, proc: subprocess.Popen[bytes], hostfile: str, size: int) -> None:
        self.proc = proc
        self.hostfile = hostfile
        self.size = size
        self.sent: set[bytes] = set()
        self.done: set[int] = set()

    def send(self, command: bytes) -> None:
        if self.proc.stdin is None or self.proc.stdin.closed:
            return
        if command != b"U":  # a forwarded signal goes out each time; a request once
            if command in self.sent:
                return
            self.sent.add(command)
        try:
            self.proc.stdin.write(command)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass

    def finished(self, rank: int) -> None:
        self.done.add(rank)
        if len(self.done) == self.size:
            self.close()

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


class StepStream:
    """srun's stdout or stderr: lines labelled with the task (= rank), for that rank's stream
    (`streams`: the supervisor's per-rank streams, by rank)."""

    def __init__(self, name: str, fd: int, streams: dict[int, Any]) -> None:
        self.name = name
        self.fd = fd
        self.streams = streams
        self.partial = b""
        self.open = True

    def lines(self, data: bytes) -> list[tuple[Any | None, bytes]]:
        """The complete lines in `data` (with what came before), each with the rank stream it is for
        (None for srun's own)."""
        lines, self.partial = split_lines(self.partial, data)
        return [self._route(line + b"\n") for line in lines]

    def rest(self) -> list[tuple[Any | None, bytes]]:
        partial, self.partial = self.partial, b""
        return [self._route(partial + b"\n")] if partial else []

    def _route(self, line: bytes) -> tuple[Any | None, bytes]:
        labelled = slurm.split_label(line)
        if labelled is None or labelled[0] not in self.streams:
            return None, line
        return self.streams[labelled[0]], labelled[1]
