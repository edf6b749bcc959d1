"""tnt.SyncBatchNormalization (and, on TensorFlow, Keras' BatchNormalization(synchronized=True)) on
2 and 3 real ranks trains as BatchNormalization does serially, on every backend."""

import pytest
from launch import run

# Each job rides in its backend's bundle of 2 or 3 ranks (launch.py: BUNDLES), where it starts no
# ranks of its own.
pytestmark = pytest.mark.bundled

# As test_training.py's: 8 float32 ulps of 1. The statistics are sums over ranks instead of over
# one batch, which changes their rounding by a few ulps, no more than the gradient sum does.
TOL = 1e-6


@pytest.mark.timeout(420)
@pytest.mark.parametrize("ranks", [2, 3])
def test_sync_batch_norm_trains_as_serial_batch_norm(ranks: int, backend: str) -> None:
    # On 3 ranks every gradient is a bucket of its own: with the statistics' sums of the forward and
    # backward passes, the row count and the metrics, a step issues a dozen collectives, which must
    # run in the same order on every rank (on JAX: ordered callbacks in one compiled program).
    env = {"TNT_FUSION_THRESHOLD_KB": "0"} if ranks == 3 else None
    result = run("sync_bn_job", ranks, timeout=400, backend=backend, env=env)
    assert env is None or result.ranks[0]["fusion_threshold_kb"] == 0
    first = result.ranks[0]["results"]
    expected = 4 if backend == "tensorflow" else 2
    assert len(first) == expected
    for rank, data in enumerate(result.ranks):
        assert data["size"] == ranks and data["rank"] == rank
        for name, r in data["results"].items():
            assert r["weights_err"] < TOL, (rank, name, r["weights_err"])
            assert r["history_err"] < TOL, (rank, name, r["history_err"])
            assert r["eval_err"] < TOL, (rank, name, r["eval_err"])
            # The moving statistics are the global batch's, on every rank (an empty slice's included).
            assert r["moving_err"] < TOL, (rank, name, r["moving_err"])
            assert r["moving"] == first[name]["moving"] and r["weights"] == first[name]["weights"], (rank, name)
        trip = data["round_trip"]
        assert trip["layers"].count("SyncBatchNormalization") == 2, trip
        assert trip["moving_equal"]
