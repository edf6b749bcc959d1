"""Distributed training equals serial Keras training, on 1, 2 and 3 real ranks, over GPI-2, TCP and shared memory."""

import warnings

import pytest
from conftest import skip_unless_installed
from launch import Result, run

TOL = 1e-6


def predict_tol(scale: float) -> float:
    """Predictions are outputs, not weights: a rank computes its rows in a smaller matrix product than
    serial Keras, which the CPU's kernels may sum in another order (torch's do), so they can differ
    by a few float32 roundings of the outputs' size. TOL is 8 ulps of 1 (1e-6 / 2**-23): the same
    relative to the largest output."""
    return TOL * max(1.0, scale)


def gpi2_built() -> bool:
    import tnt_comm

    return "gpi2" in tnt_comm.build_info()["transports"]


# Each rank count runs over another transport (the 12 scenarios do not depend on it, the sum does):
# 1 rank has no peer; 2 ranks talk over GPI-2, as a cluster's hosts do, where tnt_comm is built with
# it (docs/comm.md), else over shared memory; 3 ranks over TCP, the path between hosts without it.
# Shared memory between 2 and 3 ranks is what every other test of this suite and the torch cases
# below go over. One job per rank count instead of one per rank count and one per transport: each
# job's ranks import TensorFlow and trace the scenarios' steps, most of a test's minute on 2 cores.
TRANSPORTS = {1: None, 2: "gpi2", 3: "tcp"}


@pytest.mark.timeout(420)
# 1 rank needs no launcher option: its job runs in a bundle (launch.BUNDLES).
@pytest.mark.parametrize("ranks", [pytest.param(1, marks=pytest.mark.bundled), 2, 3])
def test_training_equals_serial(ranks: int) -> None:
    transport = TRANSPORTS[ranks]
    if transport == "gpi2" and not gpi2_built():
        transport = None  # shared memory; the run says so below
    launcher_args = ("--transport", transport) if transport else ()
    result = run("train_equal", ranks, timeout=400, launcher_args=launcher_args)
    if transport is not None:
        # Every peer over the transport asked for (and the rank itself over "self").
        expected = [[("self" if peer == rank else transport) for peer in range(ranks)] for rank in range(ranks)]
        assert [r["transports"] for r in result.ranks] == expected
    elif ranks == 2:
        warnings.warn(
            "no GPI-2 in this tnt_comm: 2 ranks trained over shared memory (docs/comm.md builds it)", stacklevel=1
        )
    check_equal_training(result, ranks)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.bundled
def test_training_on_other_backends_equals_serial(ranks: int, backend: str) -> None:
    """The same scenarios on Keras' torch and JAX backends, against serial Keras on the same
    backend: on torch, gradients summed by autograd hooks as backward produces them; on JAX, by
    ordered callbacks inside the compiled step; the inputs sliced before Keras sees them."""
    skip_unless_installed(backend)
    check_equal_training(run("train_equal", ranks, timeout=400, backend=backend), ranks)


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


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks", [2])
def test_every_way_keras_jax_runs_a_step_equals_serial(ranks: int) -> None:
    """Compiled, eager, jit_compile=False, steps_per_execution=3, one bucket per gradient, and the
    ordered callbacks in place of XLA's handler, on Keras-JAX."""
    skip_unless_installed("jax")
    result = run("jax_modes_job", ranks, timeout=280, backend="jax")
    for r in result.ranks:
        found = r["results"]
        assert set(found) == {"compiled", "eager", "no_jit", "spe3", "buckets", "callbacks"}
        for name, got in found.items():
            assert got["weights_err"] < TOL and got["history_err"] < TOL, (name, got)
        # Compiled steps sum through the handler (gradients and metrics of train and test steps),
        # unless told to use the callbacks; a step run eagerly sums on the host, tracing neither.
        for name in ("compiled", "spe3", "buckets"):
            assert found[name]["traced"]["handler"] >= 2 and found[name]["traced"]["callback"] == 0, (name, found)
        assert found["callbacks"]["traced"]["handler"] == 0 and found["callbacks"]["traced"]["callback"] >= 2, found
        for name in ("eager", "no_jit"):
            assert found[name]["traced"] == {"handler": 0, "callback": 0}, (name, found)
