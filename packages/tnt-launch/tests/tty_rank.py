"""A rank for the terminal tests: reports TNT_STDOUT_TTY, then writes an unfinished line.

Every rank writes REPORT_DIR/rank-<TNT_RANK>.json with the TNT_STDOUT_TTY it received. Rank 0
then writes "a" without a newline, waits (up to 30 s) for the file GO to appear, and ends the line
with "b". Imports nothing of tnt.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    report_dir, go = sys.argv[1], sys.argv[2]
    rank = int(os.environ["TNT_RANK"])
    path = os.path.join(report_dir, f"rank-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"TNT_STDOUT_TTY": os.environ.get("TNT_STDOUT_TTY")}, f)
    os.replace(path + ".tmp", path)
    if rank == 0:
        sys.stdout.write("a")
        sys.stdout.flush()
        deadline = time.monotonic() + 30
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.05)
        sys.stdout.write("b\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
