#!/usr/bin/env python3
"""Starts many small jobs over GPI-2 side by side on this host and counts those that fail, by cause.

Each job is 2 ranks that start tnt-comm with TNT_TRANSPORT=gpi2, leaving GPI-2's port base to rank 0,
and allreduce once; WIDTH jobs start at once, ROUNDS times. Jobs that start together are what once
made two of them pick one base (docs/comm.md, "GPI-2"). Run it with the Python whose tnt_comm is to
be tried (PYTHONPATH may name another build):

    python packages/tnt-comm/scripts/stress-gpi2-start.py --rounds 60 --width 8
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
os.environ["TNT_TEST_TRANSPORT"] = "gpi2"  # read by ranks when imported
from ranks import Job  # noqa: E402

CODE = """
import numpy as np, tnt_comm as tc
tc.init()
assert tc.allreduce(np.ones(10, np.float32))[0] == tc.size()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--width", type=int, default=8, help="jobs started at once")
    args = parser.parse_args()
    causes: collections.Counter[str] = collections.Counter()
    failed_jobs = 0
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tnt-gpi2-stress") as tmp:
        for _ in range(args.rounds):
            jobs = [Job(2, CODE, Path(tmp)) for _ in range(args.width)]
            for job in jobs:
                errors = [r.stderr.strip().splitlines()[-1] for r in job.wait(120) if r.returncode != 0]
                failed_jobs += bool(errors)
                causes.update(errors)
    jobs_run = args.rounds * args.width
    print(f"{jobs_run} jobs, {args.width} at a time, in {time.monotonic() - start:.0f} s: {failed_jobs} failed")
    for line, count in causes.most_common():
        print(f"  {count} x {line[:240]}")
    return 1 if failed_jobs else 0


if __name__ == "__main__":
    sys.exit(main())
