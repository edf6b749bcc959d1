"""A rank of an elastic job (tnt-launch --elastic) for test_elastic.py: STEPS allreduces, each checked
exactly for the current number of ranks. The members named by --kill die by SIGKILL before call
--at (in generation 0); the survivors re-form the job (tnt_comm.shrink) and go on from the earliest
call any of them had not finished. Each survivor writes REPORTS/member-<id>.json at the end."""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import numpy as np
import tnt_comm as tc

parser = argparse.ArgumentParser()
parser.add_argument("reports", type=Path)
parser.add_argument("--kill", type=int, nargs="*", default=[])
parser.add_argument("--at", type=int, default=5)
parser.add_argument("--steps", type=int, default=30)
args = parser.parse_args()

member = tc.rank()
first = sorted(set(tc.transports()) - {"self"})  # generation 0's transports
failures = []
i = 0
while i < args.steps:
    if member in args.kill and i == args.at:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        n = tc.size()
        got = tc.allreduce(np.full(1 << 16, tc.rank() + 1 + i, np.float32))
        assert np.all(got == n * (n + 1) / 2 + n * i), (got[:3], n, i)
        i += 1
    except (tc.PeerFailure, tc.Timeout) as e:
        failures.append(list(e.ranks))
        tc.shrink()
        i = int(tc.allreduce(np.array([i], np.int64), op="min")[0])
generation, members = tc.membership()
report = {"member": member, "rank": tc.rank(), "size": tc.size(), "generation": generation,
          "members": members, "failures": failures, "steps": i, "first": first,
          "last": sorted(set(tc.transports()) - {"self"})}
(args.reports / f"member-{member}.json").write_text(json.dumps(report))
if tc.rank() == 0:  # what tnt-launch shows: the output of rank 0, whichever process that is now
    print(f"rank 0 of generation {generation} is member {member}", flush=True)
