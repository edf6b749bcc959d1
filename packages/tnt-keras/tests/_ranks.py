"""Starts real rank processes with the TNT_* environment contract, for the multi-process tests.

A short copy of tnt-comm's tests/ranks.py: that file is not importable from here without path tricks.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Result:
    rank: int
    returncode: int
    stdout: str
    stderr: str


class Job:
    """n processes running `code`, each with TNT_RANK etc. set (all on this host)."""

    def __init__(self, n: int, code: str, tmp: Path, env: dict[str, str] | None = None) -> None:
        self.job_id = secrets.token_hex(6)
        script = tmp / f"rank_{self.job_id}.py"
        script.write_text(textwrap.dedent(code))
        port, token = free_port(), secrets.token_hex(16)
        self.procs: list[subprocess.Popen[str]] = []
        for r in range(n):
            e = dict(os.environ)
            e.update(
                TNT_RANK=str(r),
                TNT_SIZE=str(n),
                TNT_LOCAL_RANK=str(r),
                TNT_LOCAL_SIZE=str(n),
                TNT_NODE_RANK="0",
                TNT_MASTER_ADDR="127.0.0.1",
                TNT_MASTER_PORT=str(port),
                TNT_JOB_ID=self.job_id,
                TNT_JOB_TOKEN=token,
                PYTHONUNBUFFERED="1",
            )
            e.update(env or {})
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, str(script)], env=e, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
                )
            )

    def wait(self, timeout: float = 60) -> list[Result]:
        deadline = time.monotonic() + timeout
        results = []
        try:
            for r, p in enumerate(self.procs):
                out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
                results.append(Result(r, p.returncode, out, err))
        finally:
            for p in self.procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                    p.wait()
        return results

    def shm_leftovers(self) -> list[str]:
        return [f for f in os.listdir("/dev/shm") if self.job_id in f]


def run(n: int, code: str, tmp: Path, env: dict[str, str] | None = None, timeout: float = 60) -> list[Result]:
    """Runs the job and asserts every rank exited 0 and left nothing in /dev/shm; returns the results."""
    job = Job(n, code, tmp, env)
    results = job.wait(timeout)
    for res in results:
        assert res.returncode == 0, f"rank {res.rank} exited {res.returncode}:\n{res.stderr[-4000:]}"
    assert not job.shm_leftovers(), f"files left in /dev/shm: {job.shm_leftovers()}"
    return results
