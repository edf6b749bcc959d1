"""Careless use of the API: handles kept past finalize(), foreign byte order, infinite timeouts,
and calls that disagree between ranks. Each ends in a clear exception in that very call, on every
rank, or in a correct result; never a segfault, a wrong number or a silent wait."""

from __future__ import annotations

from pathlib import Path

import pytest
from ranks import Job, run

EXPECT = """
import math, numpy as np, tnt_comm as tc
def expect(exc, fn, *texts):
    try:
        fn()
    except exc as e:
        for text in texts:
            assert text in str(e), (text, str(e))
        return e
    raise AssertionError(f"no {exc.__name__} from {fn}")
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [1, 2])
def test_handles_kept_past_finalize_raise(n: int, tmp_path: Path) -> None:
    code = EXPECT + """
r = tc.rank()
g = tc.new_group(list(range(tc.size())))
world = tc.world()
fused = tc.FusedAllreduce([((4,), np.float32)])
done = tc.iallreduce(np.ones(4, np.float32))
assert (done.wait() == tc.size()).all()
tc.finalize()
x = np.ones(4, np.float32)
expect(tc.TntError, lambda: g.allreduce(x), "finalized")
expect(tc.TntError, lambda: world.allreduce(x), "finalized")
expect(tc.TntError, lambda: tc.allreduce(x), "finalized")
expect(tc.TntError, lambda: tc.broadcast(x), "finalized")
expect(tc.TntError, lambda: fused.start(0, x), "finalized")
expect(tc.TntError, lambda: tc.init(), "finalized")
assert world.ranks == list(range(tc.size())) and g.size == tc.size()
assert (done.wait() == tc.size()).all()  # a completed Work keeps its result
assert tc.rank() == r                      # and the rank stays known
tc.finalize()                              # twice is harmless
print("ok")
"""
    for res in run(n, code, tmp_path):
        assert res.stdout.strip() == "ok", res.stderr[-2000:]


@pytest.mark.timeout(60)
def test_foreign_byte_order_is_refused(tmp_path: Path) -> None:
    code = EXPECT + """
big = np.ones(4, dtype=">f4")
expect(TypeError, lambda: tc.allreduce(big), ">f4", "byte order", "astype('float32')")
expect(TypeError, lambda: tc.broadcast(np.ones(4, dtype=">i8")), "byte order")
expect(TypeError, lambda: tc.FusedAllreduce([((4,), ">f8")]), "byte order")
# Refused before anything was sent: the ranks are still in step, and native data sums exactly.
print(tc.allreduce(big.astype("float32")).tolist(), tc.allreduce(np.ones(2, "<f4")).tolist())
"""
    for res in run(2, code, tmp_path):
        assert res.stdout.strip() == "[2.0, 2.0, 2.0, 2.0] [2.0, 2.0]", res.stderr[-2000:]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timeout", ["inf", "1e10", "1e300"])
def test_unbounded_timeouts_mean_no_limit(timeout: str, tmp_path: Path) -> None:
    code = EXPECT + """
import time
x = np.ones(8, np.float32)
print(tc.allreduce(x)[0])
w = tc.iallreduce(x)
for t in (float("inf"), 1e10, 1e300):
    assert (w.wait(timeout=t) == 2).all()
expect(ValueError, lambda: tc.ibarrier().wait(timeout=float("nan")), "NaN")
if tc.rank() == 1:
    time.sleep(1.0)  # a late peer is waited for, not timed out on at once
w = tc.ibarrier()
assert w.wait(timeout=float("inf")) is None
print("ok")
"""
    for res in run(2, code, tmp_path, env={"TNT_TIMEOUT_S": timeout}):
        assert res.stdout.split() == ["2.0", "ok"], res.stderr[-2000:]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("variable", ["TNT_TIMEOUT_S", "TNT_START_TIMEOUT_S"])
@pytest.mark.parametrize("value", ["nan", "0", "-1", "soon"])
def test_bad_timeouts_are_refused(variable: str, value: str, tmp_path: Path) -> None:
    code = EXPECT + f"""
expect(ValueError, tc.init, "{variable}={value} is not a positive number of seconds")
print("refused")
"""
    for res in Job(2, code, tmp_path, env={variable: value}).wait(40):
        assert res.stdout.strip() == "refused", res.stderr[-2000:]


# Each pair: what rank 0 runs, what rank 1 runs. Each rank must raise CollectiveMismatch in that
# very call (a late error would show as "returned").
DISAGREEING_CALLS = {
    "broadcast root=self": (
        "tc.broadcast(np.ones(5, np.float32), root=0)",
        "tc.broadcast(np.ones(5, np.float32), root=1)",
    ),
    "broadcast count": ("tc.broadcast(np.ones(5, np.float32))", "tc.broadcast(np.ones(6, np.float32))"),
    "broadcast big root=self": (
        "tc.broadcast(np.ones(1_000_000, np.float32), root=0)",
        "tc.broadcast(np.ones(1_000_000, np.float32), root=1)",
    ),
    "send/send": ("tc.send(np.ones(5, np.float32), 1)", "tc.send(np.ones(5, np.float32), 0)"),
    "send/send big": ("tc.send(np.ones(1_000_000, np.float32), 1)", "tc.send(np.ones(1_000_000, np.float32), 0)"),
    "send/recv count": ("tc.send(np.ones(5, np.float32), 1)", "tc.recv(np.empty(6, np.float32), 0)"),
    "send/recv dtype": ("tc.send(np.ones(5, np.float32), 1)", "tc.recv(np.empty(5, np.float64), 0)"),
    "big send/small recv": ("tc.send(np.ones(900_000, np.float32), 1)", "tc.recv(np.empty(5, np.float32), 0)"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", sorted(DISAGREEING_CALLS))
def test_disagreeing_call_raises_in_that_call_on_every_rank(what: str, tmp_path: Path) -> None:
    zero, one = DISAGREEING_CALLS[what]
    code = f"""
import numpy as np, tnt_comm as tc
tc.barrier()
try:
    if tc.rank() == 0:
        {zero}
    else:
        {one}
except tc.CollectiveMismatch as e:
    print("MISMATCH", e)
except tc.TntError as e:
    print("OTHER", type(e).__name__, e)
else:
    print("returned")
"""
    job = Job(2, code, tmp_path, env={"TNT_TIMEOUT_S": "20"})
    results = job.wait(50)
    for res in results:
        assert res.stdout.startswith("MISMATCH"), (res.rank, res.stdout, res.stderr[-2000:])
        assert "rank 0" in res.stdout and "rank 1" in res.stdout
    assert not job.shm_leftovers()


@pytest.mark.timeout(60)
def test_matching_point_to_point_patterns_still_work(tmp_path: Path) -> None:
    code = """
import numpy as np, tnt_comm as tc
r, peer = tc.rank(), 1 - tc.rank()
# Blocking send against isend+recv: legal, the recv takes the blocked send's data.
if r == 0:
    tc.send(np.full(5, 7.0, np.float32), peer)
    got = tc.recv(np.empty(5, np.float32), peer)
else:
    w = tc.isend(np.full(5, 9.0, np.float32), peer)
    got = tc.recv(np.empty(5, np.float32), peer)
    w.wait()
print(got[0])
# Receive posted first, send second, on both ranks.
w = tc.irecv(np.empty(3, np.int64), peer)
tc.send(np.full(3, r, np.int64), peer)
print(w.wait()[0])
"""
    results = run(2, code, tmp_path)
    assert results[0].stdout.split() == ["9.0", "1"]
    assert results[1].stdout.split() == ["7.0", "0"]
