"""Hypothesis-generated shapes and dtypes, run identically on every rank (derandomized)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ranks import run

CODE = """
import numpy as np, tnt_comm as tc
from hypothesis import given, settings, HealthCheck, strategies as st
from hypothesis.extra.numpy import array_shapes

r, n = tc.rank(), tc.size()

# Every rank draws the same examples (derandomize), so they call the same collectives.
@settings(derandomize=True, database=None, max_examples=60, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(shape=array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=70),
       dtype=st.sampled_from(["float16", "float32", "float64", "int32", "int64", "uint8"]),
       op=st.sampled_from(["sum", "min", "max"]), seed=st.integers(0, 2**16))
def check(shape, dtype, op, seed):
    xs = [np.random.default_rng(seed + q).integers(0, 3, size=shape, dtype=np.uint8).astype(dtype) for q in range(n)]
    y = tc.allreduce(xs[r], op=op)
    f = {"sum": np.add, "min": np.minimum, "max": np.maximum}[op]
    want = f.reduce(np.stack([x.astype(np.float64) for x in xs]), axis=0)
    assert y.shape == xs[r].shape and y.dtype == xs[r].dtype
    assert np.array_equal(y.astype(np.float64), want), (shape, dtype, op)
    g = tc.allgather(xs[r])
    assert all(np.array_equal(g[q], xs[q]) for q in range(n))

check()
print("ok")
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [2, 3])
def test_generated_shapes(n: int, tmp_path: Path) -> None:
    results = run(n, CODE, tmp_path, timeout=170)
    assert all(res.stdout.strip().endswith("ok") for res in results)
