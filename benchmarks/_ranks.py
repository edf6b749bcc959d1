"""Start, watch and always tear down the worker processes of one benchmark run.

Every library runs in its own set of worker processes, children of the driver: either one process
per rank (tnt-comm, Gloo) or one ``mpirun`` that starts the ranks (Open MPI). Workers write one JSON
line per finished message size into a per-rank file and their PID into a pid file; the driver
watches those files for progress and kills every process it started (and every worker PID it was
told about) when the job ends, fails, stalls or is interrupted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, Self

# After one rank has failed, the others get this long to notice and exit by themselves.
_FAILURE_GRACE_S = 10.0
# Between SIGTERM and SIGKILL.
_TERM_GRACE_S = 2.0
_POLL_S = 0.1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Command:
    """One process to start: its argv and its environment."""

    argv: list[str]
    env: Mapping[str, str]


@dataclass
class Outcome:
    """How a job ended: ``ok``, ``failed`` or ``timeout``, with a one-line reason for the latter two."""

    status: str
    detail: str = ""
    logs: dict[str, str] = field(default_factory=dict)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_our_worker(pid: int, marker: str) -> bool:
    """Guards against PID reuse: only a process whose command line carries our marker is killed."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return marker.encode() in cmdline


class Job:
    """A set of started processes sharing one results folder; use as a context manager."""

    def __init__(self, commands: Sequence[Command], workdir: Path, marker: str) -> None:
        self.workdir = workdir
        self.marker = marker
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[Path] = []
        try:
            self._start(commands)
        except BaseException:
            self.kill()
            raise

    def _start(self, commands: Sequence[Command]) -> None:
        for i, cmd in enumerate(commands):
            log = self.workdir / f"proc{i}.log"
            self._logs.append(log)
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    cmd.argv,
                    env=dict(cmd.env),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: killed as one, apart from us
                )
            self.procs.append(proc)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def progress(self) -> int:
        """Grows whenever any rank reports a finished size."""
        return sum(p.stat().st_size for p in self.workdir.glob("*.jsonl"))

    def worker_pids(self) -> list[int]:
        pids = []
        for path in self.workdir.glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                pids.append(int(path.read_text().strip()))
        return pids

    def wait(self, stall_timeout: float) -> Outcome:
        """Waits until every process has exited; a job that reports no progress for
        ``stall_timeout`` seconds, or whose other ranks outlive a failed one by
        ``_FAILURE_GRACE_S``, is killed."""
        last_progress = self.progress()
        last_change = time.monotonic()
        failed_at: float | None = None
        while True:
            codes = [p.poll() for p in self.procs]
            if all(c is not None for c in codes):
                break
            now = time.monotonic()
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = now
            if failed_at is not None and now - failed_at > _FAILURE_GRACE_S:
                failure = _describe_exits([p.poll() for p in self.procs])
                self.kill()
                return Outcome(
                    "failed", failure + "; the others were killed", self.read_logs()
                )
            current = self.progress()
            if current != last_progress:
                last_progress, last_change = current, now
            elif now - last_change > stall_timeout:
                self.kill()
                return Outcome(
                    "timeout",
                    f"no progress for {stall_timeout:.0f} s",
                    self.read_logs(),
                )
            time.sleep(_POLL_S)
        codes = [p.returncode for p in self.procs]
        self.kill()  # stray workers of an mpirun that exited, if any
        if any(c != 0 for c in codes):
            return Outcome("failed", _describe_exits(codes), self.read_logs())
        return Outcome("ok", "", self.read_logs())

    def read_logs(self) -> dict[str, str]:
        logs = {}
        for log in self._logs:
            with contextlib.suppress(OSError):
                logs[log.name] = log.read_text(errors="replace")
        return logs

    def kill(self) -> None:
        """SIGTERM, then SIGKILL, to each started process group and each reported worker PID."""
        targets = self._targets()
        if not targets:
            return
        for kind, ident in targets:
            _signal(kind, ident, signal.SIGTERM)
        deadline = time.monotonic() + _TERM_GRACE_S
        while time.monotonic() < deadline and self._targets():
            time.sleep(0.05)
        for kind, ident in self._targets():
            _signal(kind, ident, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def _targets(self) -> list[tuple[str, int]]:
        targets: list[tuple[str, int]] = []
        for proc in self.procs:
            if proc.poll() is None:
                targets.append(("group", proc.pid))
            else:
                # The leader is gone; members of its group may live on (mpirun's ranks).
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, 0)
                    targets.append(("group", proc.pid))
        for pid in self.worker_pids():
            if _alive(pid) and _is_our_worker(pid, self.marker):
                targets.append(("pid", pid))
        return targets


def _signal(kind: str, ident: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if kind == "group":
            os.killpg(ident, sig)
        else:
            os.kill(ident, sig)


def _describe_exits(codes: Sequence[int | None]) -> str:
    """Which started processes (proc<i>.log) failed and how."""
    bad = [
        f"process {i} exited with {_describe_code(c)}"
        for i, c in enumerate(codes)
        if c not in (None, 0)
    ]
    return ", ".join(bad)


def _describe_code(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"code {code}"


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Turns SIGTERM into KeyboardInterrupt so that the driver's cleanup runs on either."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_main(main: Callable[[], int]) -> NoReturn:
    """A benchmark's entry point: exits with `main()`'s code, or with 130 after Ctrl+C, once
    `terminate_as_interrupt` has stopped every worker."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; all workers were stopped", file=sys.stderr)
        sys.exit(130)


def log_tail(logs: dict[str, str], lines: int = 15) -> str:
    """The last `lines` non-blank lines of each worker's log (by name), for a failure's report."""
    parts = []
    for name, text in sorted(logs.items()):
        tail = [line for line in text.splitlines() if line.strip()][-lines:]
        if tail:
            parts.append(f"--- {name} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "\n".join(parts)
