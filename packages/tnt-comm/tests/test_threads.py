"""Collectives from several threads: one group per thread runs concurrently and exactly; one group
used by two threads at once is refused on every rank with the rule, never summed wrongly."""

from __future__ import annotations

from pathlib import Path

import pytest
from ranks import Job, run


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_one_group_per_thread_is_exact(n: int, tmp_path: Path) -> None:
    code = """
import threading, numpy as np, tnt_comm as tc
size = tc.size()
# Two groups of the same ranks, created in the same order on every rank, are separate streams.
groups = {v: tc.new_group(list(range(size))) for v in (1, 100)}
wrong = {1: 0, 100: 0}

def work(v):
    g = groups[v]
    for i in range(300):
        count = 1000 if i % 3 else 70_000  # also chunked messages
        out = g.allreduce(np.full(count, v, np.float32))
        if not (out == v * size).all():
            wrong[v] += 1
    g.barrier()
    token = np.full(10, tc.rank() * v, np.int64)
    for _ in range(20):
        s = g.isend(token, (tc.rank() + 1) % size)
        got = g.recv(np.empty(10, np.int64), (tc.rank() - 1) % size)
        s.wait()
        assert got[0] == ((tc.rank() - 1) % size) * v

threads = [threading.Thread(target=work, args=(v,)) for v in (1, 100)]
for t in threads:
    t.start()
for t in threads:
    t.join()
# The world, unaffected, from the main thread.
print("wrong", wrong[1], wrong[100], tc.allreduce(np.ones(3, np.float32))[0])
"""
    for res in run(n, code, tmp_path, timeout=100):
        assert res.stdout.split() == ["wrong", "0", "0", f"{float(n)}"], (res.stdout, res.stderr[-2000:])


@pytest.mark.timeout(120)
def test_one_group_from_two_threads_at_once_is_refused_everywhere(tmp_path: Path) -> None:
    code = """
import threading, numpy as np, tnt_comm as tc
size = tc.size()
outcome = {}
calls = {1: 0, 100: 0}
together = threading.Barrier(2)

def work(v):
    wrong = 0
    together.wait()
    try:
        # Both threads keep calling until each has made 300 calls, so that one cannot finish alone.
        # Each call sums 4 MB, a millisecond or more: the other thread, woken when this one lets go
        # of the GIL, enters its call while this one still waits. (Calls of microseconds could
        # alternate in lockstep on both ranks without ever overlapping, which is no misuse to see.)
        while min(calls.values()) < 300:
            if not (tc.allreduce(np.full(1 << 20, v, np.float32)) == v * size).all():
                wrong += 1
            calls[v] += 1
        outcome[v] = f"finished wrong={wrong}"
    except tc.CollectiveMismatch as e:
        outcome[v] = f"refused wrong={wrong}: {e}"

threads = [threading.Thread(target=work, args=(v,)) for v in (1, 100)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for v in (1, 100):
    print(v, outcome[v])
"""
    results = Job(2, code, tmp_path, env={"TNT_TIMEOUT_S": "30"}).wait(100)
    for res in results:
        lines = res.stdout.splitlines()
        assert len(lines) == 2, (res.rank, res.stdout, res.stderr[-2000:])
        # Never a wrong sum, and the rule is named on every rank.
        assert all("wrong=0" in line for line in lines), res.stdout
        assert any("refused" in line and "one thread at a time" in line for line in lines), res.stdout


@pytest.mark.timeout(60)
def test_call_while_another_thread_waits_in_the_group_is_refused(tmp_path: Path) -> None:
    # Rank 0's first thread waits in an allreduce that rank 1 joins only much later; meanwhile its
    # second thread calls into the same group. Rank 1, single-threaded, must learn it too.
    code = """
import os, pathlib, sys, threading, time, numpy as np, tnt_comm as tc
g = tc.world()
refused = pathlib.Path(os.environ["SECOND_CALLED"])
def call(name):
    try:
        g.allreduce(np.ones(10, np.float32))
        sys.stdout.write(f"{name} returned\\n")
    except tc.CollectiveMismatch as e:
        sys.stdout.write(f"{name} refused: {e}\\n")
if tc.rank() == 0:
    waiting = threading.Thread(target=call, args=("waiting",))
    waiting.start()
    time.sleep(1.0)
    call("second")
    refused.touch()
    waiting.join()
else:
    # Joins only once rank 0's second thread has called (at most 20 s later, should it never).
    deadline = time.monotonic() + 20
    while not refused.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    call("late")
"""
    env = {"TNT_TIMEOUT_S": "30", "SECOND_CALLED": str(tmp_path / "second-called")}
    results = Job(2, code, tmp_path, env=env).wait(50)
    zero = sorted(results[0].stdout.splitlines())
    assert len(zero) == 2 and zero[0].startswith("second refused:") and zero[1].startswith("waiting refused:"), (
        results[0].stdout,
        results[0].stderr[-2000:],
    )
    assert "one thread at a time" in zero[0] and "new_group" in zero[0]
    assert results[1].stdout.startswith("late refused:"), (results[1].stdout, results[1].stderr[-2000:])
