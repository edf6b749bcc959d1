"""Distributed training equals serial Keras training, on 1, 2 and 3 real ranks, over shared memory, TCP and GPI-2."""

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


@pytest.mark.timeout(300)
def test_training_over_gpi2_equals_serial() -> None:
    """GPI-2 between the two ranks, as between the hosts of a cluster (needs a tnt_comm built with it)."""
    import tnt_comm

    if "gpi2" not in tnt_comm.build_info()["transports"]:
        pytest.skip("this tnt_comm has no GPI-2 transport: build it with GPI2_ROOT set (docs/comm.md)")
    result = run("train_equal", 2, timeout=280, launcher_args=("--transport", "gpi2"))
    assert [r["transports"] for r in result.ranks] == [["self", "gpi2"], ["gpi2", "self"]]
    check_equal_training(result, 2)


def check_equal_training(result: Result, ranks: int) -> None:
    first = result.ranks[0]["scenarios"]
    assert len(first) == 12
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
        check_batchnorm(data["batchnorm"], rank, ranks)


def check_batchnorm(bn: dict, rank: int, ranks: int) -> None:
    """A BatchNormalization model whose last batch of 1 sample leaves ranks 1.. an empty slice."""
    assert bn["steps"] == 3 * 4 and bn["moving_finite"]
    assert bn["history_err"] < TOL and bn["trainable_err"] < TOL
    assert bn["eval_err"] < TOL and bn["predict_err"] < TOL and bn["predict_rows"] == 4 * 3 * ranks + 1
    if rank == 0:  # its slices have the moments serial Keras normalises over, the last batch's included
        assert bn["moving_err"] < TOL
        assert bn["last_batch_changed"] == [True] * 3
    else:  # an empty slice leaves the moving statistics bitwise as they were
        assert bn["last_batch_changed"] == [False] * 3
