"""tnt.Model.predict on 2 and 3 real ranks: one set of weights (rank 0's), the model's whole output
structure on every rank, equal to serial Keras."""

import numpy as np
import pytest
from conftest import skip_unless_installed
from launch import run

TOL = 1e-6
ROWS = 13


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and float(np.max(np.abs(np.subtract(a, b)))) < TOL


@pytest.mark.timeout(420)
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.bundled
def test_predict(ranks: int) -> None:
    check_predict(run("predict_job", ranks, timeout=400), ranks, "tensorflow")


@pytest.mark.timeout(420)
@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.bundled
def test_predict_on_other_backends(backend: str) -> None:
    skip_unless_installed(backend)
    check_predict(run("predict_job", 2, timeout=400, backend=backend), 2, backend)


def check_predict(result: object, ranks: int, backend: str) -> None:
    r0 = result.ranks[0]
    # Unseeded ranks start from different weights, so the checks below see whose weights predict used.
    assert all(r["fresh"]["weights_before"] != r0["fresh"]["weights_before"] for r in result.ranks[1:])
    for r in result.ranks:
        assert r["size"] == ranks
        fresh = r["fresh"]
        # A never-fit model predicts with rank 0's weights, identically on every rank.
        assert close(fresh["pred"], r0["fresh"]["serial_before"])
        assert fresh["pred"] == r0["fresh"]["pred"] and fresh["again"] == fresh["pred"]
        assert fresh["weights_after"] == r0["fresh"]["weights_before"]
        # Only the first predict broadcasts; the weights are equal for the second.
        assert fresh["broadcasts_first"] == 1 and fresh["broadcasts_again"] == 0
        unbuilt = r["unbuilt"]
        assert close(unbuilt["pred"], r0["unbuilt"]["serial"]) and unbuilt["pred"] == r0["unbuilt"]["pred"]
        assert unbuilt["weights"] == r0["unbuilt"]["weights"]
        compiled = r["compiled"]
        assert close(compiled["pred"], r0["compiled"]["serial_before"]) and not compiled["optimizer_built"]
        # fit leaves each rank its own BatchNormalization statistics; predict uses rank 0's.
        after_fit = r["after_fit"]
        assert close(after_fit["pred"], r0["after_fit"]["serial_before"]) and after_fit["broadcasts"] == 1
        assert len(r["structures"]) == (21 if backend == "tensorflow" else 20)
        for name, s in r["structures"].items():
            assert s["type"] == s["serial_type"], name
            assert s["rows"] and all(n == ROWS for n in s["rows"]), (name, s["rows"])
            assert s["err"] < TOL, (name, s["err"])
            assert s["values"] == r0["structures"][name]["values"], name
        assert r["structures"]["dict x"]["keys"] == ["probs", "score"]
        assert r["structures"]["tuple numpy"]["type"] == "tuple"
        if backend == "tensorflow":
            assert r["structures"]["dict steps_per_execution=3"]["steps_per_execution"] == 3
    assert any(r["after_fit"]["moving_before"] != r0["after_fit"]["moving_before"] for r in result.ranks[1:])
