"""Whether anything of a job outlived it: its processes (by TNT_JOB_ID in their environment) and its
shared-memory files. Shared with tnt-keras' and the integration tests, whose conftest.py put this
folder on sys.path."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import psutil


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def processes_of_job(job_id: str) -> list[int]:
    """PIDs of live processes whose environment says they belong to job `job_id`."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("TNT_JOB_ID") == job_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def assert_job_gone(job_id: str, pids: Sequence[int] = (), timeout: float = 10) -> None:
    """Nothing of the job is left: no process with its TNT_JOB_ID, none of `pids`, no shm file."""
    deadline = time.monotonic() + timeout
    while True:
        left = processes_of_job(job_id) + [p for p in pids if running(p)]
        shm = list(Path("/dev/shm").glob(f"tnt-{job_id}-*"))
        if not left and not shm:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} left processes {sorted(set(left))} and files {shm}")
        time.sleep(0.05)
