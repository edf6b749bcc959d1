"""Starts real rank processes with the environment contract, for the multi-process tests."""

from __future__ import annotations

import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

# The ports free_port handed out last, each claimed (as tnt-comm claims GPI-2's) by an abstract
# Unix socket named after it that the kernel keeps host-wide: the test processes beside skip them
# until well after their jobs' rank 0 bound them.
_CLAIMED: deque[socket.socket] = deque()
_KEEP = 64


def free_port() -> int:
    """A port that is free now and that no other test process picked lately, for a job's rank 0 to
    listen on once it has started. Picked from below 10240: the kernel hands out ports from its
    ephemeral range (Linux: 32768-60999) to every outgoing connection, and the tests running beside
    make hundreds, one of which once took a port picked there before rank 0 bound it; tnt-comm
    picks GPI-2's ports from 10240 to 32767."""
    rng = random.SystemRandom()
    for _ in range(64):
        port = rng.randrange(2048, 10240)
        claim = socket.socket(socket.AF_UNIX)
        try:
            claim.bind(f"\0tnt-test-port:{port}")
        except OSError:
            claim.close()
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                claim.close()
                continue
        _CLAIMED.append(claim)
        if len(_CLAIMED) > _KEEP:
            _CLAIMED.popleft().close()
        return port
    raise RuntimeError("no free port between 2048 and 10239 in 64 tries")


# TNT_TEST_TRANSPORT=gpi2 runs every job of the suite over GPI-2: TNT_TRANSPORT=gpi2 joins every
# pair of ranks through GPI-2, on one host and between the fake hosts a test makes (TNT_NODE_RANK).
GPI2 = os.environ.get("TNT_TEST_TRANSPORT") == "gpi2"
# The transport expected between (fake) hosts, and between the ranks of a job left on one host.
BETWEEN_HOSTS = "gpi2" if GPI2 else "tcp"
ONE_HOST = "gpi2" if GPI2 else "shm"


@dataclass
class Result:
    rank: int
    returncode: int
    stdout: str
    stderr: str


class Job:
    """n processes running `code`, each with TNT_RANK etc. set; `nodes` splits them over fake hosts."""

    def __init__(self, n: int, code: str, tmp: Path, env: dict[str, str] | None = None, nodes: int = 1) -> None:
        self.n = n
        self.job_id = secrets.token_hex(6)
        script = tmp / f"rank_{self.job_id}.py"
        script.write_text(textwrap.dedent(code))
        port = free_port()
        token = secrets.token_hex(16)
        per_node = -(-n // nodes)
        self.procs: list[subprocess.Popen[str]] = []
        for r in range(n):
            e = dict(os.environ)
            e.update(
                TNT_RANK=str(r),
                TNT_SIZE=str(n),
                TNT_LOCAL_RANK=str(r % per_node),
                TNT_LOCAL_SIZE=str(min(per_node, n - (r // per_node) * per_node)),
                TNT_NODE_RANK=str(r // per_node),
                TNT_MASTER_ADDR="127.0.0.1",
                TNT_MASTER_PORT=str(port),
                TNT_JOB_ID=self.job_id,
                TNT_JOB_TOKEN=token,
                PYTHONUNBUFFERED="1",
                # A rank that hangs prints where (SIGABRT from wait below) before it is killed.
                PYTHONFAULTHANDLER="1",
                # The ranks' temporary files go with the job's folder, also those of a rank that a
                # test kills (TensorFlow's autograph deletes its files only at exit).
                TMPDIR=str(tmp),
            )
            if GPI2:
                # GASPI_* and GPI-2's ports follow from the rendezvous (tnt-comm derives them).
                e["TNT_TRANSPORT"] = "gpi2"
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
        except subprocess.TimeoutExpired:
            raise AssertionError(self._hung(timeout, results)) from None
        finally:
            self.kill()
        return results

    def _hung(self, timeout: float, done: list[Result]) -> str:
        """Which ranks still ran after `timeout`, with where they were (their faulthandler stacks,
        asked for with SIGABRT) and the end of every rank's output."""
        running = [r for r, p in enumerate(self.procs) if p.poll() is None]
        for r in running:
            self.procs[r].send_signal(signal.SIGABRT)
        report = [f"ranks {running} still ran after {timeout:.0f} s"]
        for res in done:
            report.append(f"--- rank {res.rank} (exit {res.returncode}) stderr:\n{res.stderr[-1500:]}")
        for r, p in list(enumerate(self.procs))[len(done):]:
            try:
                out, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            report.append(f"--- rank {r} (exit {p.returncode}) stdout:\n{(out or '')[-1500:]}\n"
                          f"--- rank {r} stderr:\n{(err or '')[-4000:]}")
        return "\n".join(report)

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()

    def shm_leftovers(self) -> list[str]:
        return [f for f in os.listdir("/dev/shm") if self.job_id in f]


def run(n: int, code: str, tmp: Path, timeout: float = 60, **kw: object) -> list[Result]:
    """Runs the job and asserts every rank exited 0; returns the results."""
    job = Job(n, code, tmp, **kw)  # type: ignore[arg-type]
    results = job.wait(timeout)
    for res in results:
        assert res.returncode == 0, f"rank {res.rank} exited {res.returncode}:\n{res.stderr[-3000:]}"
    assert not job.shm_leftovers(), f"files left in /dev/shm: {job.shm_leftovers()}"
    return results
