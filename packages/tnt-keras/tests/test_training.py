"""Distributed training equals serial Keras training, on 1, 2 and 3 real ranks, over shared memory, TCP and GPI-2."""

import pytest
from launch import Result, run

TOL = 1e-6


def predict_tol(scale: float) -> float:
    """Predictions are outputs, not weights: a rank computes its rows in a smaller matrix product than
    serial Keras, which the CPU's kernels may sum in another order (torch's do), so they can differ
    by a few float32 roundings of the outputs' size. TOL is 8 ulps of 1 (1e-6 / 2**-23): the same
    relative to the largest output."""
    return TOL * max(1.0, scale)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_training_equals_serial(ranks: int) -> None:
    check_equal_training(run("train_equal", ranks, timeout=400), ranks)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("ranks", [2, 3])
def test_training_on_torch_equals_serial(ranks: int) -> None:
    """The same scenarios on Keras' torch backend, against serial Keras-torch: gradients summed by
    autograd hooks as backward produces them, the inputs sliced before Keras sees them."""
    pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0; nox installs it)")
    check_equal_training(run("train_equal", ranks, timeout=400, backend="torch"), ranks)


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
            bound = predict_tol(s["predict_scale"])
            assert s["predict_err"] < bound, (rank, name, s["predict_err"], s["predict_scale"])
            assert s["predict_rows"] == int(name.split("-")[2])
            # every rank ends with exactly the same weights
            assert s["weights"] == first[name]["weights"], (rank, name)
        check_batchnorm(data["batchnorm"], rank, ranks)


def check_batchnorm(bn: dict, rank: int, ranks: int) -> None:
    """A BatchNormalization model whose last batch of 1 sample leaves ranks 1.. an empty slice."""
    assert bn["steps"] == 3 * 4 and bn["moving_finite"]
    assert bn["history_err"] < TOL and bn["trainable_err"] < TOL
    assert bn["eval_err"] < TOL and bn["predict_err"] < predict_tol(bn["predict_scale"])
    assert bn["predict_rows"] == 4 * 3 * ranks + 1
    if rank == 0:  # its slices have the moments serial Keras normalises over, the last batch's included
        assert bn["moving_err"] < TOL
        assert bn["last_batch_changed"] == [True] * 3
    else:  # an empty slice leaves the moving statistics bitwise as they were
        assert bn["last_batch_changed"] == [False] * 3
