"""A rank that dies mid-training takes the whole job down quickly, named, leaving nothing behind."""

import os
import re
import time

import pytest
from launch import run


@pytest.mark.timeout(150)
def test_killed_rank_stops_training_job() -> None:
    before = set(os.listdir("/dev/shm"))
    start = time.monotonic()
    result = run("crash_job", 3, timeout=140, check=False, env={"TNT_TIMEOUT_S": "30"})
    assert result.returncode != 0
    assert "rank 1" in result.output and "signal" in result.output.lower(), result.output[-3000:]
    assert time.monotonic() - start < 120
    leftovers = [f for f in set(os.listdir("/dev/shm")) - before if re.fullmatch(r"tnt-\w+-\d+", f)]
    assert not leftovers, leftovers
