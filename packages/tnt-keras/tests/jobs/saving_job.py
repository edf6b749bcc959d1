"""Save/load round trips continue training exactly like the model that was saved."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import os
from pathlib import Path

import keras
import numpy as np
import tnt_keras as tnt
from _job import build, compile_args, dataset, max_diff, report

rank = tnt.get_rank()
files = Path(os.environ["TNT_TEST_OUT"], "files")
files.mkdir(exist_ok=True)
results: dict = {}


def continue_training(model: keras.Model) -> list[np.ndarray]:
    model.fit(dataset(64, 12, seed=5, shuffle=False), epochs=1, verbose=0)
    return model.get_weights()


def rebuild_subclassed(original: keras.Model, config: dict) -> keras.Model:
    """As Keras rebuilds a subclassed model: its class from the config, then built from the build config."""
    rebuilt = type(original).from_config(config)
    rebuilt.build_from_config(original.get_build_config())
    return rebuilt


for kind in ("functional", "sequential", "subclassed", "custom_step"):
    model = tnt.Model(build(kind))
    model.compile(**compile_args("adam"))
    model.fit(dataset(64, 12), epochs=2, verbose=0)
    model.save(files / f"{kind}.keras")
    model.save_weights(files / f"{kind}.weights.h5")
    config, json_config, weights = model.get_config(), model.to_json(), model.get_weights()

    whole = tnt.models.load_model(files / f"{kind}.keras")  # compiled, with the optimizer state
    bare = tnt.models.load_model(files / f"{kind}.keras", compile=False)  # as Keras: uncompiled
    from_weights = tnt.Model(build(kind, seed=99))
    from_weights.compile(**compile_args("adam"))
    from_weights.fit(dataset(12, 12), epochs=1, verbose=0)  # builds the optimizer, then overwritten
    from_weights.load_weights(files / f"{kind}.weights.h5")
    plain = build(kind, seed=98)  # the weights file is the wrapped model's: plain Keras reads it
    plain.compile(**compile_args("adam"))
    plain.fit(dataset(12, 12), epochs=1, verbose=0)
    plain.load_weights(files / f"{kind}.weights.h5")

    if kind in ("functional", "sequential"):
        from_bare_config = {
            "config": tnt.models.model_from_config(config),
            "from_config": tnt.Model.from_config(config),
        }
    else:  # get_config() is the wrapped model's, and a subclassed model's does not name its class
        from_bare_config = {
            name: tnt.Model(rebuild_subclassed(model.model, config)) for name in ("config", "from_config")
        }
    architecture = {
        **from_bare_config,
        "json": tnt.models.model_from_json(json_config),
        # Keras-style configs with class_name: the wrapper's and the plain wrapped model's.
        "serialized": tnt.models.model_from_config(keras.saving.serialize_keras_object(model)),
        "plain_config": tnt.models.model_from_config(keras.saving.serialize_keras_object(model.model)),
        "plain_json": tnt.models.model_from_json(model.model.to_json()),
        "clone": tnt.models.clone_model(model),
    }
    # A model built from a config comes back uncompiled, as Keras documents.
    compiled = {name: bool(m.compiled) for name, m in architecture.items()}
    expected = continue_training(model)
    r = {
        "whole_is_tnt": isinstance(whole, tnt.Model),
        "whole_compiled": bool(whole.compiled),
        "whole_err": max_diff(continue_training(whole), expected),
        "bare_is_tnt": isinstance(bare, tnt.Model),
        "bare_compiled": bool(bare.compiled),
        "bare_err": max_diff(bare.get_weights(), weights),
        "weights_err": max_diff(plain.get_weights(), weights),
    }
    # load_weights restores the optimizer too (Keras 3 weight files carry it): training continues alike.
    r["load_weights_err"] = max_diff(continue_training(from_weights), expected)
    for name, m in architecture.items():
        assert isinstance(m, tnt.Model), name
        m.set_weights(weights)
        m.compile(**compile_args("adam"))
        # A fresh optimizer: compare with the saved model restarted from the same weights.
        r[f"{name}_is_tnt"] = True
        r[f"{name}_compiled"] = compiled[name]
        r[f"{name}_err"] = max_diff(m.get_weights(), weights)
    results[kind] = r

# Rank 0 wrote every file: no temporaries are left beside them.
results["files"] = sorted(p.name for p in files.iterdir())

# export() writes a SavedModel on the master rank. (On torch, Keras 3.15's SavedModel export goes
# through torch.export, which refuses Keras' own input signature: plain Keras fails there alike.)
if keras.backend.backend() == "tensorflow":
    model = tnt.Model(build("functional"))
    model.compile(**compile_args("sgd"))
    model.export(str(files / "exported"))
    tnt.callbacks.average_logs({"sync": 1.0})
    results["exported"] = (files / "exported" / "saved_model.pb").exists()

# A mixed_float16 model trains on every rank alike and close to serial.
keras.mixed_precision.set_global_policy("mixed_float16")
serial = build("functional")
serial.compile(**compile_args("adam"))
# shuffle=False: the dataset shuffles itself (Keras would shuffle a PyDataset's batches again, its own way).
serial.fit(dataset(64, 12), epochs=2, verbose=0, shuffle=False)
mixed = tnt.Model(build("functional"))
mixed.compile(**compile_args("adam"))
mixed.fit(dataset(64, 12), epochs=2, verbose=0, shuffle=False)
keras.mixed_precision.set_global_policy("float32")
results["mixed_err"] = max_diff(serial.get_weights(), mixed.get_weights())
results["mixed_optimizer"] = type(mixed.optimizer).__name__
results["mixed_weights"] = [float(v) for w in mixed.get_weights() for v in np.ravel(w)]
report(results)
