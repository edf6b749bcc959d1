"""Whom tnt-launch's summary blames for a job of tnt-comm alone that one rank ends: the rank that
raised (or was killed), named with its error and traceback, whichever rank's exit reached the
launcher first; the others read what it raised and where they were. Nothing of the job is left.

Each trial is a 3-rank job whose failing rank and step are drawn from a seed the assertion messages
print (TNT_TEST_SEED sets it), in every phase of a script, over shared memory and TCP, with and
without the failing rank's exit held back (so that the innocent ranks exit first), with and
without every rank's output shown. tnt-keras' tests plant the same in Keras jobs on both backends.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from job_leftovers import assert_job_gone

ROOT = Path(__file__).resolve().parents[1]
SEED = int(os.environ.get("TNT_TEST_SEED") or random.SystemRandom().randrange(10**6))
STEPS = 20
SCRIPT = textwrap.dedent(
    """\
    import atexit, os, signal, sys, time
    import numpy as np
    import tnt_comm as tc

    phase, culprit, step, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
    mine = int(os.environ["TNT_RANK"]) == culprit


    def fail(where):
        if delay:
            atexit.register(time.sleep, 4.0)  # before tnt-comm's own exit handlers
        raise ValueError(f"planted in {where} on rank {culprit}")


    if mine and phase == "before-start":
        fail("the script, before tnt-comm started")
    tc.init()
    if mine and phase == "before-collective":
        fail("the script, before its first collective")
    x = np.ones(4096, np.float32)
    for i in range(STEPS):
        if mine and i == step and phase == "loop":
            fail(f"step {step}")
        if mine and i == step and phase == "in-flight":
            work = tc.iallreduce(x)
            fail(f"step {step}, its allreduce in flight")
        if mine and i == step and phase == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        tc.allreduce(x)
    print(f"rank {tc.rank()} done")
    """
).replace("STEPS", str(STEPS))
PHASES = ("before-start", "before-collective", "loop", "in-flight", "killed")
TRIALS = [
    (phase, transport, delayed, all_output)
    for phase in PHASES
    for transport, all_output in (("shm", False), ("tcp", True))
    for delayed in ((False, True) if phase != "killed" else (False,))
]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("phase", "transport", "delayed", "all_output"), TRIALS)
def test_the_summary_names_the_rank_that_failed(
    phase: str, transport: str, delayed: bool, all_output: bool, tmp_path: Path
) -> None:
    rng = random.Random(f"{SEED}-{phase}-{transport}-{delayed}")
    # An allreduce left in flight at the last step may still complete everywhere: the others would
    # then have nothing left to fail in.
    culprit, step = rng.randrange(3), rng.randrange(STEPS - (phase == "in-flight"))
    trial = f"seed {SEED}: rank {culprit}, step {step}, {transport}, delayed={delayed}, all output={all_output}"
    script = tmp_path / "planted.py"
    script.write_text(SCRIPT)
    options = ["--transport", transport, "--timeout", "60", *(["--output-on-all-devices"] if all_output else [])]
    args = [phase, str(culprit), str(step), "1" if delayed else "0"]
    done = subprocess.run(
        [sys.executable, "-m", "tnt_launch", "-n", "3", *options, "--", str(script), *args],
        capture_output=True, text=True, timeout=80, cwd=tmp_path, check=False,
    )
    output = done.stdout + done.stderr
    where = rf"rank {culprit} \(host [^,]+, local rank {culprit}\)"
    if phase == "killed":
        assert done.returncode == 137, (trial, output[-4000:])
        how = r"was killed by signal 9 \(SIGKILL\)"
    else:
        assert done.returncode == 1, (trial, output[-4000:])
        ended = r"\((exit code 1|stopped by tnt-launch while exiting)\)"
        how = rf"raised ValueError: planted in .+ on rank {culprit} {ended}"
    summary = re.search(rf"^tnt-launch: job (\w+) failed: {where} {how}$", output, re.MULTILINE)
    assert summary, (trial, output[-4000:])
    if phase != "killed":
        # Its traceback, ending in its own words.
        lines = done.stderr.splitlines()
        shown = lines[lines.index(f"tnt-launch: last lines rank {culprit} wrote to stderr:") + 1 :]
        assert "    Traceback (most recent call last):" in shown, (trial, shown)
        assert any(line.startswith("    ValueError: planted in ") for line in shown), (trial, shown)
    if all_output and phase not in ("before-start", "killed"):
        # The others were told what the culprit raised, and say where they were.
        for other in set(range(3)) - {culprit}:
            said = [ln for ln in output.splitlines() if ln.startswith(f"[rank {other}] ")]
            told = [ln for ln in said if f"rank {culprit} failed (ValueError: planted in " in ln]
            assert told and f"while rank {other} was in allreduce(" in told[-1], (trial, other, output[-4000:])
    assert "finalized and left" not in output and "made fewer" not in output, (trial, output[-4000:])
    assert_job_gone(summary[1])  # no process of the job, no shared memory
