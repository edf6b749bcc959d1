"""Distributed training equals serial Keras training, on 1, 2 and 3 real ranks."""

import pytest
from launch import run

TOL = 1e-6


@pytest.mark.timeout(420)
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_training_equals_serial(ranks: int) -> None:
    result = run("train_equal", ranks, timeout=400)
    first = result.ranks[0]["scenarios"]
    assert len(first) == 7
    for rank, data in enumerate(result.ranks):
        assert data["size"] == ranks and data["rank"] == rank
        for name, s in data["scenarios"].items():
            assert s["epochs"] == 3, name
            assert s["weights_err"] < TOL, (rank, name, s["weights_err"])
            assert s["history_err"] < TOL, (rank, name, s["history_err"])
            assert s["eval_err"] < TOL, (rank, name, s["eval_err"])
            assert s["predict_err"] < TOL, (rank, name, s["predict_err"])
            assert s["predict_rows"] == int(name.split("-")[2])
            # every rank ends with exactly the same weights
            assert s["weights"] == first[name]["weights"], (rank, name)
