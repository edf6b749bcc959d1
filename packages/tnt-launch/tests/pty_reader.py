"""Reading what a command shows on a pseudo-terminal (tnt-launch's stdout as a user's terminal),
shared with tnt-keras' tests (see job_leftovers.py)."""

from __future__ import annotations

import os
import select
import subprocess
import time
from collections.abc import Callable


def read_terminal(
    master: int, proc: subprocess.Popen, timeout: float, chunk: int = 65536,
    seen: Callable[[bytes], None] | None = None,
) -> bytes:
    """All `proc` showed on the terminal whose `master` end this is, until it closed it or
    `timeout` passed (then `proc` is killed); `seen` gets all shown so far after each read."""
    shown = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not select.select([master], [], [], 0.2)[0]:
            continue
        try:
            data = os.read(master, chunk)
        except OSError:  # EIO: the command has closed the terminal
            data = b""
        if not data:
            return shown
        shown += data
        if seen is not None:
            seen(shown)
    proc.kill()
    return shown
