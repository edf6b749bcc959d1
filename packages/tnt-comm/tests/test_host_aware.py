"""The host-aware allreduce: ranks on fake hosts (TNT_NODE_RANK), shm within a host, TCP across.

Which algorithm ran is visible in the result's bits: in float32, 1e8 + 1 == 1e8, so the ranks'
values 1e8, 1, -1e8, 1 (and zeros) sum to 1 in rank order (the flat algorithm) and to 0 when each
host sums first ({1e8, 1} -> 1e8, {-1e8, 1} -> -1e8) and the hosts then add up.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ranks import BETWEEN_HOSTS, ONE_HOST, run

CHECK = """
import hashlib, os, numpy as np, tnt_comm as tc
r, n = tc.rank(), tc.size()
flat = os.environ.get("TNT_ALLREDUCE") == "flat" or os.environ.get("EXPECT_FLAT") == "1"

values = [1e8, 1.0, -1e8, 1.0] + [0.0] * (n - 4)
for count in (100_000, 1_000_003):  # above the one-shot size; the second one spans many chunks
    y = tc.allreduce(np.full(count, values[r], np.float32))
    assert (y == (1.0 if flat else 0.0)).all(), (count, y[:4])

# Exact integers (and float64 holding integers): uneven counts, every op that is order-free.
for dtype in (np.int64, np.int32, np.float64):
    for count in (16_385, 300_001, 2_000_003):
        xs = [((np.arange(count) * (q + 3)) % 1000).astype(dtype) for q in range(n)]
        assert np.array_equal(tc.allreduce(xs[r]), sum(xs).astype(dtype)), (dtype, count)
        x = xs[r].copy()
        tc.allreduce(x, out=x)
        assert np.array_equal(x, sum(xs).astype(dtype)), ("in place", dtype, count)
        assert np.array_equal(tc.allreduce(xs[r], op="max"), np.maximum.reduce(xs)), (dtype, count)
        assert np.array_equal(tc.allreduce(xs[r], op="min"), np.minimum.reduce(xs)), (dtype, count)

# Every rank gets the same bits, through fusion buckets too.
z = np.random.default_rng(r).standard_normal(500_001).astype(np.float32)
digest = hashlib.sha256(tc.allreduce(z).tobytes())
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
def test_flat_when_hosts_differ_in_size(tmp_path: Path) -> None:
    # 5 ranks on 2 hosts: 3 and 2 ranks, so the regions of the hosts would not match.
    run(5, CHECK, tmp_path, timeout=220, nodes=2, env={"EXPECT_FLAT": "1"})


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
