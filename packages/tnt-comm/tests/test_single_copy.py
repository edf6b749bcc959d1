"""The single-copy allreduce: buffers from tnt_comm.shared_empty, reduced in place across the
ranks of one host, on 2-4 real ranks. Its results are compared bit for bit with the slot path's
(plain numpy buffers), which reduces every element in the same member order."""

from __future__ import annotations

from pathlib import Path

import pytest
from ranks import GPI2, Job, run

pytestmark = pytest.mark.skipif(GPI2, reason="a shared-memory path; over GPI-2 no pair uses shared memory")

SAME_BITS = """
import numpy as np, tnt_comm as tc
r, n = tc.rank(), tc.size()
DTYPES = ["float16", "float32", "float64", "int32", "int64", "uint8"]
try:
    import ml_dtypes
    DTYPES.append(ml_dtypes.bfloat16)
except ImportError:
    pass
# From just under the single-copy threshold (256 KiB) to several of its 1 MiB steps, with counts
# that split unevenly into 64-byte lines and regions.
COUNTS = [65_535, 65_536 + 17, 262_144 + 5, 1_000_003]
for dtype in DTYPES:
    dt = np.dtype(dtype)
    for count in COUNTS:
        rng = np.random.default_rng(7 * r + count)
        if dt.kind in "fV":  # V: bfloat16
            x = rng.standard_normal(count).astype(dtype)
        else:
            x = rng.integers(0, 100, count).astype(dtype)
        for op in ["sum", "min", "max", "avg"]:
            plain = tc.allreduce(x, op=op)
            a = tc.shared_empty(count, dtype); a[:] = x
            out = tc.shared_empty(count, dtype)
            shared = tc.allreduce(a, op=op, out=out)
            assert shared is out
            assert shared.tobytes() == plain.tobytes(), (str(dtype), count, op)
            # in place
            tc.allreduce(a, op=op, out=a)
            assert a.tobytes() == plain.tobytes(), (str(dtype), count, op, "in place")
    if dtype == "float64":  # the reference: every rank's data, summed in rank order
        xs = [np.random.default_rng(7 * q + COUNTS[-1]).standard_normal(COUNTS[-1]) for q in range(n)]
        expect = xs[0]
        for q in range(1, n):
            expect = expect + xs[q]
        got = tc.shared_empty(COUNTS[-1], np.float64); got[:] = xs[r]
        tc.allreduce(got, out=got)
        assert np.array_equal(got, expect)
print("ok")
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_shared_buffers_give_the_slot_paths_bits(n: int, tmp_path: Path) -> None:
    results = run(n, SAME_BITS, tmp_path, timeout=280)
    assert all(res.stdout.strip().endswith("ok") for res in results)


IN_ARENA = """
import numpy as np, tnt_comm as tc
a = tc.shared_empty((3, 4), np.float64)
assert a.shape == (3, 4) and a.dtype == np.float64 and a.flags.writeable
owner = a
while isinstance(owner, np.ndarray) and owner.base is not None:
    owner = owner.base
owner = owner.obj if isinstance(owner, memoryview) else owner
print("shared" if isinstance(owner, tc._core.SharedBlock) else "plain")
"""


def test_arrays_are_shared_only_where_ranks_share_a_host(tmp_path: Path) -> None:
    out = run(2, IN_ARENA, tmp_path)
    assert all(res.stdout.strip() == "shared" for res in out), [res.stdout for res in out]
    # Alone, over TCP, or switched off: ordinary numpy arrays, and allreduce works on them.
    for n, env in [(1, {}), (2, {"TNT_TRANSPORT": "tcp"}), (2, {"TNT_SINGLE_COPY": "off"})]:
        code = IN_ARENA + "x = tc.shared_empty(100_000)\nx[:] = 1\nassert (tc.allreduce(x) == tc.size()).all()\n"
        out = run(n, code, tmp_path, env=env)
        assert all(res.stdout.strip() == "plain" for res in out), (n, env, [res.stdout for res in out])


MIXED = """
import numpy as np, tnt_comm as tc
count = 1 << 20
x = tc.shared_empty(count) if tc.rank() == 0 else np.zeros(count, np.float32)
x[:] = 1
try:
    tc.allreduce(x, out=x)
except tc.CollectiveMismatch as e:
    print("mismatch", e.ranks, str(e))
"""


@pytest.mark.timeout(90)
def test_shared_on_one_rank_only_is_a_named_mismatch(tmp_path: Path) -> None:
    job = Job(2, MIXED, tmp_path, env={"TNT_TIMEOUT_S": "60"})
    results = job.wait(80)
    for res in results:
        assert "mismatch" in res.stdout, res.stderr[-2000:]
        assert "shared_empty" in res.stdout and "alike on every rank" in res.stdout
    # The rank that notices blames the other and tells it, and a rank told raises that error. Both ranks
    # may notice at once (each reads the other's call as it makes its own): each then raises its own.
    # Either way every error blames the other side of the rank that noticed it, which its text names.
    for res in results:
        words = res.stdout.split()
        noticed, other = int(words[5]), int(words[words.index("while") + 2])
        assert {noticed, other} == {0, 1} and words[1] == f"[{other}]", res.stdout


AFTER_FINALIZE = """
import numpy as np, tnt_comm as tc
a = tc.shared_empty(1 << 20)
a[:] = tc.rank()
tc.allreduce(a, out=a)
tc.finalize()
a += 1  # the block outlives the runtime: still mapped
assert (a == 2).all()
del a
print("ok")
"""


def test_shared_arrays_outlive_finalize(tmp_path: Path) -> None:
    results = run(2, AFTER_FINALIZE, tmp_path)
    assert all(res.stdout.strip().endswith("ok") for res in results)


@pytest.mark.timeout(60)
def test_unknown_setting_is_refused(tmp_path: Path) -> None:
    code = """
import tnt_comm as tc
try:
    tc.init()
except ValueError as e:
    assert "TNT_SINGLE_COPY=yes" in str(e) and "off" in str(e), e
    print("refused")
"""
    for res in run(2, code, tmp_path, env={"TNT_SINGLE_COPY": "yes"}):
        assert "refused" in res.stdout


C_ABI = f"""
import ctypes, sys, numpy as np, tnt_comm as tc
sys.path.insert(0, {str(Path(__file__).parent)!r})
import c_abi
api = c_abi.table()
results, done = c_abi.recorder()
count = 300_001
block = ctypes.c_void_p()
assert api.alloc_shared(count * 8, ctypes.byref(block)) == 0 and block.value, "no block on a shared host"
x = np.ctypeslib.as_array((ctypes.c_double * count).from_address(block.value))
x[:] = np.arange(count) + tc.rank()
assert api.allreduce_async(0, block.value, block.value, count, 3, 0, done, None) == 0  # float64, sum, in place
tc.barrier()  # a blocking call drives the queued allreduce too
assert results.pop() is None
assert np.array_equal(x, 2 * np.arange(count) + 1.0)
first = block.value
api.free_shared(block)
again = ctypes.c_void_p()
assert api.alloc_shared(count * 8, ctypes.byref(again)) == 0 and again.value == first  # reused
api.free_shared(again)
print("ok")
"""


def test_c_abi_blocks_take_the_single_copy_path(tmp_path: Path) -> None:
    results = run(2, C_ABI, tmp_path)
    assert all(res.stdout.strip().endswith("ok") for res in results)
