"""Custom train_steps with several optimizers, and the warning for ranks that drift apart."""

import pytest
from launch import run


@pytest.mark.timeout(240)
def test_two_optimizers_and_divergence_warning(backend: str) -> None:
    if backend == "jax":
        # Keras-JAX's train step is a pure function of a state that holds model.optimizer's variables
        # only; a step with two optimizers of its own must carry theirs too (not written yet).
        pytest.skip("two optimizers in one Keras-JAX train step: the job's step is not written for JAX yet")
    result = run("optimizers_job", 2, timeout=220, backend=backend)
    r0, r1 = result.ranks
    for r in (r0, r1):
        assert r["two_err"] < 1e-6, r["two_err"]  # both optimizers saw the summed gradients
        assert r["two_hidden_iterations"] == 3 * 11  # 75 rows in batches of 7: 11 steps per epoch
    assert r0["two_weights"] == r1["two_weights"]
    before, _, after = result.output.partition("ROGUE FIT STARTS")
    assert "differ between ranks" not in before, before[-2000:]
    assert "trainable variable(s) differ between ranks" in after and "bias" in after, after[-2000:]
