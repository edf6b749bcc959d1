"""Every collective, op and dtype against numpy, on 1-4 real ranks over shm and TCP."""

from __future__ import annotations

from pathlib import Path

import pytest
from ranks import BETWEEN_HOSTS, ONE_HOST, run

CHECK_ALL = """
import functools, hashlib, numpy as np, tnt_comm as tc
r, n = tc.rank(), tc.size()
DTYPES = ["float16", "float32", "float64", "int32", "int64", "uint8"]
try:
    import ml_dtypes
    DTYPES.append(ml_dtypes.bfloat16)
except ImportError:
    pass
SIZES = [0, 1, 7, 1000, 70_001, 300_001]  # 300_001 float64 spans several 256 KiB chunks

# Every dtype holds the same small integers (exact in each): the data are drawn (as bytes, twice as
# fast as 64-bit draws), and the references computed in float64, once per count of elements, and
# only cast per dtype.
@functools.cache
def ints(rank, count):
    return np.random.default_rng(1000 * rank + count).integers(1, 4, size=count, dtype=np.uint8).astype(np.float64)

def data(rank, count, dtype):
    return ints(rank, count).astype(dtype)

@functools.cache
def expect(op, count):  # of data(q, count, ...) on ranks q = 0..n-1
    xs = [ints(q, count) for q in range(n)]
    if op in ("sum", "avg"):
        return sum(xs) / n if op == "avg" else sum(xs)
    if op == "prod":
        return np.prod(xs, axis=0)
    return functools.reduce(np.minimum if op == "min" else np.maximum, xs)

digest = hashlib.sha256()
for dtype in DTYPES:
    for count in SIZES:
        xs = [data(q, count, dtype) for q in range(n)]
        for op in ["sum", "prod", "min", "max", "avg"]:
            if op == "prod" and count > 1000:
                continue
            y = tc.allreduce(xs[r], op=op)
            e = expect(op, count)
            if np.dtype(dtype).kind in "iu" and op == "avg":
                e = np.floor(e)
            if np.dtype(dtype).kind == "u":
                e = np.mod(e, 256) if op in ("sum", "prod") else e
            # avg divides: exact to the dtype's precision only
            tol = {1: 0, 2: 1e-2, 4: 1e-6, 8: 1e-12}[np.dtype(dtype).itemsize] if op == "avg" else 0
            if op == "prod" and n > 4 and np.dtype(dtype).itemsize == 2 and np.dtype(dtype).kind != "i":
                tol = 2e-2  # 3**5 and up: beyond the integers float16/bfloat16 hold exactly, products round
            assert np.allclose(y.astype(np.float64), e, rtol=tol, atol=tol), (dtype, count, op)
            digest.update(y.tobytes())
        # in place
        x = xs[r].copy()
        tc.allreduce(x, out=x)
        want = expect("sum", count).astype(np.dtype(dtype)).astype(np.float64)
        assert np.array_equal(x.astype(np.float64), want), (dtype, count)
        # broadcast from every root
        for root in range(n):
            b = xs[r].copy()
            tc.broadcast(b, root=root)
            assert np.array_equal(b, xs[root]), (dtype, count, root)
        # allgather, reduce_scatter
        g = tc.allgather(xs[r])
        assert g.shape == (n, count) and all(np.array_equal(g[q], xs[q]) for q in range(n))
        blk = data(r, n * max(count // 7, 1), dtype)
        rs = tc.reduce_scatter(blk)
        k = len(blk) // n
        full = expect("sum", len(blk)).astype(np.dtype(dtype))
        assert np.array_equal(rs, full[r * k:(r + 1) * k]), (dtype, count)
    tc.barrier()

# allgatherv with a different first dimension per rank
v = tc.allgatherv(np.full((r + 1, 3), r, dtype=np.int32))
assert v.shape == (n * (n + 1) // 2, 3)
assert v[:, 0].tolist() == [q for q in range(n) for _ in range(q + 1)]
# non-blocking forms overlap and complete in order
works = [tc.iallreduce(np.full(5000, r + i, np.float32)) for i in range(6)]
for i, w in enumerate(works):
    assert np.all(w.wait() == sum(q + i for q in range(n)))
assert tc.ibarrier().wait() is None
# results are bitwise identical on every rank
h = np.frombuffer(digest.digest(), dtype=np.uint8)
assert (tc.allgather(h) == h).all(), "ranks disagree bitwise"
print("transports", tc.transports())
print("ok")
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_collective_shm(n: int, tmp_path: Path) -> None:
    results = run(n, CHECK_ALL, tmp_path, timeout=220)
    assert all(res.stdout.strip().endswith("ok") for res in results)
    if n > 1:
        assert ONE_HOST in results[0].stdout


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("n", "nodes"), [(2, 2), (3, 2), (6, 3)])
def test_every_collective_across_hosts(n: int, nodes: int, tmp_path: Path) -> None:
    # Fake hosts (node ranks): pairs on different nodes use TCP (or GPI-2), same node shm. 3 ranks
    # on 2 hosts take the leaders' allreduce for small buffers; 6 on 3 hosts also the host-aware ring.
    results = run(n, CHECK_ALL, tmp_path, timeout=220, nodes=nodes)
    assert all(res.stdout.strip().endswith("ok") for res in results)
    assert BETWEEN_HOSTS in results[0].stdout


SMALL_ON_MANY = """
import numpy as np, tnt_comm as tc
r, n = tc.rank(), tc.size()
digest = []
# Up to 64 KiB: recursive doubling for float32/64 and integers (8 ranks), the one-shot for half
# precision; above, the direct algorithm. Values whose sums are exact in every dtype.
for dtype in ["float32", "float64", "int32", "int64", "uint8", "float16"]:
    for count in [0, 1, 7, 4096, 16_384, 40_000]:
        xs = [np.random.default_rng(7 * q + count).integers(0, 3, size=count).astype(dtype) for q in range(n)]
        want = {"sum": sum(x.astype(np.float64) for x in xs), "max": np.max(xs, axis=0), "min": np.min(xs, axis=0)}
        for op, e in want.items():
            y = tc.allreduce(xs[r], op=op)
            assert np.array_equal(y.astype(np.float64), np.asarray(e, dtype=np.float64)), (dtype, count, op)
            digest.append(y.tobytes())
        y = tc.allreduce(xs[r], op="avg")
        tol = 1e-2 if dtype == "float16" else 1e-6
        if np.dtype(dtype).kind in "iu":
            assert np.array_equal(y, np.floor(want["sum"] / n).astype(dtype)), (dtype, count)
        else:
            assert np.allclose(y, want["sum"] / n, rtol=tol, atol=tol), (dtype, count)
        x = xs[r].copy()
        tc.allreduce(x, out=x)
        assert np.array_equal(x.astype(np.float64), want["sum"]), (dtype, count, "in place")
# the same bits on every rank
h = np.frombuffer(__import__("hashlib").sha256(b"".join(digest)).digest(), dtype=np.uint8)
assert (tc.allgather(h) == h).all(), "ranks disagree bitwise"
print("ok")
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [8])
def test_small_allreduce_on_many_ranks(n: int, tmp_path: Path) -> None:
    """Small allreduces on 8 ranks of one host: the recursive doubling's log2(n) rounds (and the
    one-shot for half precision), against numpy, in place, and bitwise equal on every rank."""
    results = run(n, SMALL_ON_MANY, tmp_path, timeout=220)
    assert all(res.stdout.strip().endswith("ok") for res in results)


@pytest.mark.timeout(120)
def test_forced_tcp_transport(tmp_path: Path) -> None:
    code = """
import numpy as np, tnt_comm as tc
assert tc.transports()[1 - tc.rank()] == "tcp", tc.transports()
x = np.arange(1_000_000, dtype=np.float32)
assert np.array_equal(tc.allreduce(x), 2 * x)
print("ok")
"""
    run(2, code, tmp_path, env={"TNT_TRANSPORT": "tcp"})


@pytest.mark.timeout(180)
def test_one_gibibyte_allreduce(tmp_path: Path) -> None:
    code = """
import numpy as np, tnt_comm as tc
r = tc.rank()
x = np.full(1 << 28, r + 1, dtype=np.float32)  # 1 GiB
tc.allreduce(x, out=x)
# Every element is 3, checked without a 256 MiB array of booleans (fresh memory costs seconds of
# page faults here); NaN would fail both.
assert x.min() == 3 and x.max() == 3
print("ok")
"""
    run(2, code, tmp_path, timeout=170)


@pytest.mark.timeout(60)
def test_the_timeline_records_operations_and_waits_only_while_on(tmp_path: Path) -> None:
    code = """
import numpy as np, tnt_comm as tc
x = np.ones(1000, np.float32)
tc.allreduce(x)
assert tc.timeline_events() == []  # off by default: nothing recorded
tc.timeline_start()
tc.allreduce(x)
w = tc.iallreduce(np.ones(250_000, np.float64))
w.wait()
tc.barrier()
events = tc.timeline_stop()
tc.allreduce(x)
assert tc.timeline_events() == []
names = [(e["name"], e["bytes"], e["blocking"]) for e in events]
assert ("allreduce", 4000, True) in names, names
assert ("allreduce", 2_000_000, False) in names, names
assert ("barrier", 0, True) in names, names
for e in events:
    assert e["submitted_ns"] <= e["started_ns"] <= e["ended_ns"], e
    assert not e["failed"]
algorithms = [(e["bytes"], e["algorithm"], e["phases"]) for e in events if e["name"] == "allreduce"]
assert algorithms == [(4000, "one-shot", []), (2_000_000, "direct", [])], algorithms
print(len([e for e in events if e["name"] != "wait"]), "ok")
"""
    for res in run(2, code, tmp_path):
        assert res.stdout.split() == ["3", "ok"], res.stderr[-2000:]


@pytest.mark.timeout(90)
def test_the_timeline_names_the_phases_of_the_host_aware_allreduce(tmp_path: Path) -> None:
    # 4 ranks on 2 fake hosts: a large average takes the host-aware algorithm, whose phases run one
    # after the other on every rank; a small one goes through the hosts' leaders (rank 0 and 2).
    code = """
import numpy as np, tnt_comm as tc
tc.timeline_start()
tc.allreduce(np.ones(250_000, np.float64), op="avg")
tc.allreduce(np.ones(10, np.float32))
events = [e for e in tc.timeline_stop() if e["name"] == "allreduce"]
large, small = events
assert large["algorithm"] == "host-aware", large
names = [name for name, _ in large["phases"]]
assert names == ["reduce-scatter within the host", "ring across hosts", "allgather within the host", "divide"], names
begins = [ns for _, ns in large["phases"]]
assert large["started_ns"] <= begins[0] and begins == sorted(begins) and begins[-1] <= large["ended_ns"], large
assert small["algorithm"] == "via leaders", small
leader = tc.rank() in (0, 2)
expected = ["reduce to the leader", *(["allreduce among leaders"] if leader else []), "broadcast within the host"]
assert [name for name, _ in small["phases"]] == expected, small
print("ok")
"""
    for res in run(4, code, tmp_path, nodes=2):
        assert res.stdout.split() == ["ok"], res.stderr[-2000:]
