"""The host-aware allreduce: ranks on fake hosts (TNT_NODE_RANK), shm within a host, TCP across.

Which algorithm ran is visible in the result's bits: in float32, 1e8 + 1 == 1e8, so the values
1e8, 1 on the first two ranks of host 0 and -1e8, 1 on those of host 1 (zeros elsewhere) sum to 1
in rank order (the flat algorithms) and to 0 when each host sums first ({1e8, 1} -> 1e8,
{-1e8, 1} -> -1e8) and the hosts then add up. Small buffers go through one leader per host, also
when hosts differ in size; large ones take the host-aware ring only when they are all the same size.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ranks import BETWEEN_HOSTS, ONE_HOST, run

CHECK = """
import functools, hashlib, os, numpy as np, tnt_comm as tc
r, n = tc.rank(), tc.size()
asked_flat = os.environ.get("TNT_ALLREDUCE") == "flat"
flat = asked_flat or os.environ.get("EXPECT_FLAT") == "1"

place = (int(os.environ["TNT_NODE_RANK"]), int(os.environ["TNT_LOCAL_RANK"]))
VALUES = {(0, 0): 1e8, (0, 1): 1.0, (1, 0): -1e8, (1, 1): 1.0}
places = [tuple(p) for p in tc.allgather(np.array(place, np.int64)).tolist()]
values = [VALUES.get(p, 0.0) for p in places]

def f32_sum(xs):  # left to right, in float32
    total = np.float32(0)
    for x in xs:
        total = np.float32(total + np.float32(x))
    return total

in_rank_order = f32_sum(values)
hosts_first = f32_sum(f32_sum(v for v, p in zip(values, places) if p[0] == h) for h in sorted({p[0] for p in places}))
assert in_rank_order != hosts_first or n == 3, "the values no longer tell the algorithms apart"
for count in (1, 7, 16_384):  # up to the one-shot size (64 KiB): through the leaders
    y = tc.allreduce(np.full(count, VALUES.get(place, 0.0), np.float32))
    assert (y == (in_rank_order if asked_flat else hosts_first)).all(), (count, y[:4])
for count in (100_000, 1_000_003):  # above the one-shot size; the second one spans many chunks
    y = tc.allreduce(np.full(count, VALUES.get(place, 0.0), np.float32))
    assert (y == (in_rank_order if flat else hosts_first)).all(), (count, y[:4])

# Exact integers (and float64 holding integers): uneven counts, every op that is order-free. The
# references are taken once per count in int64: every value and sum is exact in each dtype.
for count in (1, 1_001, 8_192, 16_385, 300_001, 2_000_003):
    xs = [(np.arange(count) * (q + 3)) % 1000 for q in range(n)]
    total, high, low = sum(xs), functools.reduce(np.maximum, xs), functools.reduce(np.minimum, xs)
    for dtype in (np.int64, np.int32, np.float64):
        mine = xs[r].astype(dtype)
        assert np.array_equal(tc.allreduce(mine), total.astype(dtype)), (dtype, count)
        x = mine.copy()
        tc.allreduce(x, out=x)
        assert np.array_equal(x, total.astype(dtype)), ("in place", dtype, count)
        assert np.array_equal(tc.allreduce(mine, op="max"), high.astype(dtype)), (dtype, count)
        assert np.array_equal(tc.allreduce(mine, op="min"), low.astype(dtype)), (dtype, count)
        # avg: the exact sum, divided once by the number of ranks (integers truncate)
        mean = total // n if np.dtype(dtype).kind == "i" else total / n
        assert np.array_equal(tc.allreduce(mine, op="avg"), mean.astype(dtype)), ("avg", dtype, count)

# Every rank gets the same bits, through fusion buckets too.
z = np.random.default_rng(r).standard_normal(500_001).astype(np.float32)
digest = hashlib.sha256(tc.allreduce(z).tobytes())
digest.update(tc.allreduce(z[:3_000]).tobytes())
fused = tc.FusedAllreduce([((70_000,), np.float32), ((300_001,), np.float32)], threshold_bytes=1 << 20)
rng = np.random.default_rng(r)
parts = [rng.standard_normal(c).astype(np.float32) for c in (70_000, 300_001)]
for i, p in enumerate(parts):
    fused.start(i, p)
for i in range(2):
    digest.update(fused.wait(i).tobytes())
h = np.frombuffer(digest.digest(), dtype=np.uint8)
assert (tc.allgather(h) == h).all(), "ranks disagree bitwise"
# A group with one rank per host is flat; the world again afterwards.
solo = tc.new_group(list(range(0, n, 2)))
if r % 2 == 0:
    got = tc.allreduce(np.full(100_000, r, np.int64), group=solo)
    assert (got == sum(range(0, n, 2))).all(), got[:4]
assert tc.allreduce(np.full(100_000, 1, np.int64))[0] == n
print("ok", tc.transports())
"""


RANDOM_CALLS = """
# Every rank draws the same calls: a random group (random order), kind, op, dtype and size.
import os, numpy as np, tnt_comm as tc
r, n = tc.rank(), tc.size()
rng = np.random.default_rng(int(os.environ['SEED']))
DTYPES = ["float16", "float32", "float64", "int32", "int64", "uint8"]
COUNTS = [0, 1, 3, 1000, 16384, 16385, 70001, 300001]
groups = {}
def expect(op, xs, dtype):
    f = [x.astype(np.float64) for x in xs]
    if op in ("sum", "avg"):
        e = sum(f)
        if op == "avg":
            e = e / len(xs)
            if np.dtype(dtype).kind in "iu": e = np.floor(e)
    elif op == "prod": e = np.prod(f, axis=0)
    else: e = (np.minimum if op == "min" else np.maximum).reduce(f)
    if np.dtype(dtype).kind == "u" and op in ("sum", "prod"): e = np.mod(e, 256)
    return e
for trial in range(300):
    k = int(rng.integers(2, n + 1))
    members = [int(q) for q in rng.permutation(n)[:k]]
    dtype = DTYPES[int(rng.integers(len(DTYPES)))]
    count = COUNTS[int(rng.integers(len(COUNTS)))]
    op = ["sum", "prod", "min", "max", "avg"][int(rng.integers(5))]
    kind = ["allreduce", "allreduce", "inplace", "fused", "reduce_scatter", "broadcast"][int(rng.integers(6))]
    if op == "prod": count = min(count, 1000)
    seed = int(rng.integers(1 << 30))
    if r not in members: continue
    key = tuple(members)
    if key not in groups: groups[key] = tc.new_group(members)
    g = groups[key]
    me = members.index(r)
    xs = [np.random.default_rng(seed + q).integers(1, 4, size=count, dtype=np.uint8).astype(dtype) for q in range(k)]
    tol = {1: 0, 2: 1e-2, 4: 1e-6, 8: 1e-12}[np.dtype(dtype).itemsize] if op == "avg" else 0
    if op == "prod" and dtype == "float16": tol = 2e-3  # 3**7 > 2048: products round in float16
    ctx = (trial, members, dtype, count, op, kind)
    if kind in ("allreduce", "inplace"):
        if kind == "inplace":
            y = xs[me].copy(); g.allreduce(y, op=op, out=y)
        else:
            y = g.allreduce(xs[me], op=op)
        assert np.allclose(y.astype(np.float64), expect(op, xs, dtype), rtol=tol, atol=tol), ctx
    elif kind == "fused":
        parts = [max(count // 3, 1), count + 5]
        ys = [[np.random.default_rng(seed + 7 * q + i).integers(1, 4, size=c, dtype=np.uint8).astype(dtype)
               for i, c in enumerate(parts)] for q in range(k)]
        f = tc.FusedAllreduce([((c,), dtype) for c in parts], threshold_bytes=1 << 16, op=op, group=g)
        for i in range(2): f.start(i, ys[me][i])
        for i in range(2):
            got = f.wait(i)
            want = expect(op, [ys[q][i] for q in range(k)], dtype)
            assert np.allclose(got.astype(np.float64), want, rtol=tol, atol=tol), ctx + (i,)
    elif kind == "reduce_scatter":
        if op == "avg": op = "sum"
        blk = [np.random.default_rng(seed + q).integers(1, 4, size=k * max(count, 1), dtype=np.uint8).astype(dtype)
               for q in range(k)]
        rs = g.reduce_scatter(blk[me], op=op)
        m = max(count, 1)
        e = expect(op, blk, dtype)[me * m:(me + 1) * m]
        assert np.allclose(rs.astype(np.float64), e, rtol=tol, atol=0), ctx
    else:
        root = int(np.random.default_rng(seed).integers(k))
        b = xs[me].copy(); g.broadcast(b, root=root)
        assert np.array_equal(b, xs[root]), ctx
tc.barrier()
print("ok", len(groups))
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("n", "nodes"), [(4, 2), (6, 3)])
def test_host_aware_allreduce(n: int, nodes: int, tmp_path: Path) -> None:
    results = run(n, CHECK, tmp_path, timeout=220, nodes=nodes)
    assert all("ok" in res.stdout for res in results)
    assert f"'{ONE_HOST}'" in results[0].stdout and f"'{BETWEEN_HOSTS}'" in results[0].stdout


@pytest.mark.timeout(240)
def test_flat_when_asked(tmp_path: Path) -> None:
    run(4, CHECK, tmp_path, timeout=220, nodes=2, env={"TNT_ALLREDUCE": "flat"})


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [5, 3])
def test_hosts_of_different_sizes(n: int, tmp_path: Path) -> None:
    # On 2 hosts, 3 and 2 ranks or 2 and 1: small buffers still go through the leaders; large ones
    # take the flat algorithm, since the regions of the hosts would not match.
    run(n, CHECK, tmp_path, timeout=220, nodes=2, env={"EXPECT_FLAT": "1"})


@pytest.mark.timeout(60)
def test_unknown_algorithm_is_refused(tmp_path: Path) -> None:
    code = """
import tnt_comm as tc
try:
    tc.init()
except ValueError as e:
    assert "TNT_ALLREDUCE=ring" in str(e) and "flat" in str(e), e
    print("refused")
"""
    for res in run(2, code, tmp_path, env={"TNT_ALLREDUCE": "ring"}):
        assert "refused" in res.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("n", "nodes", "seed"), [(6, 3, 1), (5, 2, 2), (7, 3, 3)])
def test_random_calls_across_hosts(n: int, nodes: int, seed: int, tmp_path: Path) -> None:
    # Groups that take every allreduce path (leaders, host-aware ring, flat) in every op, against
    # numpy. All three fail when avg averages per phase (as the host-aware ring did before 9db67a1).
    results = run(n, RANDOM_CALLS, tmp_path, timeout=110, nodes=nodes, env={"SEED": str(seed)})
    assert all(res.stdout.startswith("ok") for res in results)
