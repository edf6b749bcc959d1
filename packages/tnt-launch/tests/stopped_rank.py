"""A rank for the tests of ranks that make no progress: one rank stops itself with SIGSTOP, the
others wait a second and fail as tnt-comm's collectives would: a timeout message, and the report of
the error as data that tnt_comm writes to TNT_REPORT_FD (see tnt_comm/_errors.py).

Usage: stopped_rank.py PID_DIR STOPPED_RANK. Every rank first writes PID_DIR/rank-<TNT_RANK>.pid.
Imports nothing of tnt.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def _wait_until_stopped(pid_file: str, timeout: float = 60) -> None:
    """Until the process whose PID ``pid_file`` holds is stopped (the tests' hosts share /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(pid_file) as f, open(f"/proc/{f.read()}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "T":
                    return
        except (OSError, IndexError):
            pass
        time.sleep(0.02)


def main() -> int:
    pid_dir, stopped = sys.argv[1], int(sys.argv[2])
    rank = int(os.environ["TNT_RANK"])
    path = os.path.join(pid_dir, f"rank-{rank}.pid")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    if rank == stopped:
        os.kill(os.getpid(), signal.SIGSTOP)  # no progress from here on
        time.sleep(60)
        return 0
    # Time out a second after the stopped rank stopped, not after this rank started: on a loaded
    # machine the stopped rank (on another host: through ssh) may take longer to get that far.
    _wait_until_stopped(os.path.join(pid_dir, f"rank-{stopped}.pid"))
    time.sleep(1)
    message = f"rank {rank} timed out: no progress for 1 s in allreduce, waiting for rank {stopped}"
    error = {"kind": "Timeout", "message": message, "ranks": [stopped], "operation": "allreduce", "call": 1}
    os.write(int(os.environ["TNT_REPORT_FD"]), (json.dumps({"event": "error", "error": error}) + "\n").encode())
    print(message, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
