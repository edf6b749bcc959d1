"""The inputs of the torch and JAX backends on 3 real ranks: arrays, PyDataset, Python generators, a
DataLoader (torch) and (where TensorFlow is installed) tf.data, by the global-batch rule."""

import importlib.util

import pytest
from conftest import skip_unless_installed
from launch import run


@pytest.mark.timeout(200)
@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.bundled
def test_host_inputs_follow_the_global_batch_rule(backend: str) -> None:
    skip_unless_installed(backend)
    result = run("host_inputs_job", 3, timeout=180, backend=backend)
    everyone = result.ranks
    for r in everyone:
        # With KERAS_BACKEND=torch or jax, tnt_keras imports no TensorFlow, also while it trains.
        assert not r["tensorflow_imported_at_start"] and not r["tensorflow_imported"]
        assert r["arrays"] == r["arrays_expected"], r
        assert r["pydataset"] == r["arrays_expected"], r
        assert r["same_everywhere"]
        if backend == "torch":
            # A DataLoader loads this rank's rows only, each once.
            assert r["loader"] == r["arrays_expected"], r
            mine = {i for batch in r["arrays_expected"] for i in batch}
            assert r["loader_loaded"] == [1 if i in mine else 0 for i in range(len(r["loader_loaded"]))]
            assert r["loader_fit_err"] < 1e-6, r["loader_fit_err"]
            # Over an IterableDataset: each rank's rows of every batch, and a fit equal to serial Keras.
            assert r["loader_stream"] == r["arrays_expected"], r
            assert r["stream_fit_err"] < 1e-6, r["stream_fit_err"]
            # Shuffled from the loader's generator: the order of the same loader in serial Keras; without
            # one, from tnt's seeded generator, which goes on from one fit's slicing to the next.
            assert r["loader_generator"] == r["loader_generator_expected"], r
            assert r["loader_seeded"] == r["loader_seeded_expected"], r
            # Dealt again for fewer ranks after a batch: the batches its worker had read ahead too.
            assert r["loader_redealt"] == r["loader_redealt_expected"], r
        for name, w in r["weighted"].items():  # class_weight, sample_weight, validation_data
            assert w["weights_err"] < 1e-6 and w["history_err"] < 1e-6, (name, w)
        assert "val_loss" in r["weighted"]["validation"]["logged"]
        generator = r["generator"]  # a Python generator of global batches
        assert generator["weights_err"] < 1e-6 and generator["history_err"] < 1e-6, generator
        if importlib.util.find_spec("tensorflow") is not None:  # tf.data on the torch backend
            assert r["tf_data"] == r["arrays_expected"], r["tf_data"]
            fit = r["tf_data_fit"]
            assert fit["weights_err"] < 1e-6 and fit["history_err"] < 1e-6, fit
    # The ranks' slices of the last batch (3 rows over 3 ranks) and of the others tile every batch.
    for epoch in range(2):
        rows = sorted(i for r in everyone for i in r["shuffled"][epoch])
        assert rows == list(range(23)), rows
    assert everyone[0]["shuffled"][0] != everyone[0]["shuffled"][1]  # reshuffled each epoch
    if backend == "torch":
        assert sorted(i for r in everyone for i in r["loader_shuffled"]) == list(range(23))
        for sampler in ("subset", "weighted"):  # each rank's rows of one order, every row once
            assert sorted(i for r in everyone for i in r[f"loader_{sampler}"]) == list(range(23)), sampler
