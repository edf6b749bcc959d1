"""Distributed training equals serial Keras training, on 1, 2 and 3 real ranks, over shared memory and TCP."""

import pytest
from launch import Result, run

TOL = 1e-6


@pytest.mark.timeout(420)
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_training_equals_serial(ranks: int) -> None:
    check_equal_training(run("train_equal", ranks, timeout=400), ranks)


@pytest.mark.timeout(300)
def test_training_over_tcp_equals_serial() -> None:
    """The path between hosts: ranks connected by TCP instead of shared memory."""
    result = run("train_equal", 2, timeout=280, launcher_args=("--transport", "tcp"))
    assert [r["transports"] for r in result.ranks] == [["self", "tcp"], ["tcp", "self"]]
    check_equal_training(result, 2)


def check_equal_training(result: Result, ranks: int) -> None:
    first = result.ranks[0]["scenarios"]
    assert len(first) == 9
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
