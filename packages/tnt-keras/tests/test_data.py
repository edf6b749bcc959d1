"""Dataset options, the rank API and the errors users get, on 1, 2 and 3 real ranks."""

import pytest
from launch import run

# Its jobs run in their backend's bundles (launch.BUNDLES).
pytestmark = pytest.mark.bundled

TOL = 1e-6


@pytest.mark.timeout(400)
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_datasets_and_errors(ranks: int) -> None:
    result = run("data_job", ranks, timeout=380)
    first = result.ranks[0]
    for rank, r in enumerate(result.ranks):
        assert (r["rank"], r["size"], r["local_rank"], r["master"]) == (rank, ranks, rank, 0)
        assert r["is_master"] == (rank == 0)
        assert r["numpy_err"] < TOL and r["numpy_eval_err"] < TOL and r["numpy_predict_err"] < TOL
        assert r["micro_err"] < TOL
        assert r["steps_per_execution_err"] < TOL
        assert r["dict_inputs_err"] < TOL and r["sparse_inputs_err"] < TOL
        assert r["val_err"] < TOL and r["val_undistributed_err"] < TOL
        assert "val_loss" in r["validation_keys"]
        for key in ("shuffled_numpy_weights", "undistributed_weights", "unseeded_weights", "order_11", "order_12"):
            assert r[key] == first[key], key
        assert r["order_11"] == r["order_11_again"] != r["order_12"], (r["order_11"], r["order_12"])
        e = r["errors"]
        assert "batch_size=10" in e["batch_size_with_dataset"] and "GLOBAL" in e["batch_size_with_dataset"]
        assert e["ftrl"].startswith("ValueError") and "Ftrl" in e["ftrl"]
        assert e["jit"].startswith("ValueError") and "jit_compile" in e["jit"]
        assert e["h5"].startswith("ValueError") and ".keras" in e["h5"]
        assert e["generator"].startswith("TypeError") and "from_generator" in e["generator"]
        assert e["micro_zip"].startswith("ValueError") and "already batched" in e["micro_zip"], e["micro_zip"]
        if ranks > 1:
            assert "without a seed" in e["early_shuffle"] and "seed=" in e["early_shuffle"]
            assert e["static_small_batch"].startswith("ValueError") and "at least" in e["static_small_batch"]
            assert r["bn_warning"]  # (printed by the master rank only)
            assert r["sum_loss_warning"]
        else:
            assert e["static_small_batch"] == ""
        # Only the dataset's own batch size must reach the number of ranks; a last batch of 1 trains.
        assert e["dynamic_small_batch"] == ""
    assert first["seed_info"]
