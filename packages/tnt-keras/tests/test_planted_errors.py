"""An ordinary exception on one rank, planted at random, is what tnt-launch's summary names, on both
backends, over shared memory and TCP, whichever rank happens to exit first: its type, message and
traceback, every time, and nothing of the job is left behind. The other ranks read what it raised
and where they were, not a complaint about the order of calls.

Each trial is one 3-rank job (jobs/planted_error_job.py): the failing rank, the batch and the rest are
drawn from a seed that the assertion messages print (TNT_TEST_SEED sets it). Half the trials hold the
failing rank's exit back for 4 s, so that the innocent ranks, which fail at once, exit first; half
show every rank's output (--output-on-all-devices), where the others' errors are read too.
"""

from __future__ import annotations

import os
import random
import re

import pytest
from conftest import BACKENDS, skip_unless_installed
from job_leftovers import assert_job_gone
from launch import run

SEED = int(os.environ.get("TNT_TEST_SEED") or random.SystemRandom().randrange(10**6))
PHASES = ("import", "before-fit", "callback", "evaluate", "save", "killed")
BATCHES = 8  # of the job's training and evaluation data: 96 rows in global batches of 12
# (backend, phase, transport, delayed, output on all devices): every phase on both backends, each
# backend over both transports, delays and output options alternating across the phases.
TRIALS = [
    (backend, phase, ("shm", "tcp")[(i + b) % 2], (i + b) % 2 == 0 and phase != "killed", (i // 2 + b) % 2 == 0)
    for b, backend in enumerate(BACKENDS)
    for i, phase in enumerate(PHASES)
]


@pytest.mark.timeout(150)
@pytest.mark.by_backend
@pytest.mark.parametrize(("backend", "phase", "transport", "delayed", "all_output"), TRIALS)
def test_the_summary_names_the_rank_that_raised(
    backend: str, phase: str, transport: str, delayed: bool, all_output: bool
) -> None:
    skip_unless_installed(backend)
    rng = random.Random(f"{SEED}-{backend}-{phase}")
    culprit, batch = rng.randrange(3), rng.randrange(BATCHES)
    trial = f"seed {SEED}: rank {culprit}, batch {batch}, {transport}, delayed={delayed}, all output={all_output}"
    options = ("--transport", transport, *(("--output-on-all-devices",) if all_output else ()))
    result = run(
        "planted_error_job", 3, phase, str(culprit), str(batch), "1" if delayed else "0",
        timeout=140, check=False, env={"TNT_TIMEOUT_S": "60"}, backend=backend, launcher_args=options,
    )
    output = result.output
    where = rf"rank {culprit} \(host [^,]+, local rank {culprit}\)"
    if phase == "killed":
        assert result.returncode == 128 + 9, (trial, output[-4000:])
        how = r"was killed by signal 9 \(SIGKILL\)"
    else:
        assert result.returncode == 1, (trial, output[-4000:])
        ended = r"\((exit code 1|stopped by tnt-launch while exiting)\)"
        how = rf"raised ValueError: planted in .+ on rank {culprit} {ended}"
    summary = re.search(rf"^tnt-launch: job (\w+) failed: {where} {how}$", output, re.MULTILINE)
    assert summary, (trial, output[-4000:])
    lines = output.splitlines()
    if phase != "killed":
        # The last lines of its traceback (20 lines), ending in its own words.
        tail = lines.index(f"tnt-launch: last lines rank {culprit} wrote to stderr:")
        shown = lines[tail + 1 : lines.index(f"tnt-launch: exit code {result.returncode}")]
        assert any(line.startswith("      File ") for line in shown), (trial, shown)
        assert any(line.startswith("    ValueError: planted in ") for line in shown), (trial, shown)
    if all_output and phase not in ("save", "killed"):
        # What the others said of it, where they said anything before tnt-launch stopped them (it
        # stops the job as soon as it knows the culprit): what it raised, and where they were.
        for other in set(range(3)) - {culprit}:
            said = [ln for ln in lines if ln.startswith(f"[rank {other}] ")]
            for line in [ln for ln in said if f"rank {culprit} failed" in ln]:
                assert f"rank {culprit} failed (ValueError: planted in " in line, (trial, line)
                assert f"while rank {other} was in " in line, (trial, line)
    assert "finalized and left" not in output and "made fewer" not in output, (trial, output[-4000:])
    # Nothing of the job is left: no process, no shared memory.
    assert_job_gone(summary[1])
