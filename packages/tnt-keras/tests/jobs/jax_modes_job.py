"""Keras-JAX's ways of running a step, each against serial Keras-JAX: compiled (the default, whose
sums XLA hands to tnt's handler), run_eagerly=True, jit_compile=False, steps_per_execution=3, one
bucket per gradient (several in one call of the handler), and compiled with the ordered callbacks
instead of the handler (TNT_KERAS_JAX_SUM=callback). Each reports how many sums it traced each way."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import os

import keras
import numpy as np
import tnt_keras as tnt
from _job import arrays, compile_args, report
from tnt_keras.backends.jax import collectives

MODES = {
    "compiled": {},
    "eager": {"run_eagerly": True},
    "no_jit": {"jit_compile": False},
    "spe3": {"steps_per_execution": 3},
    "buckets": {},
    "callbacks": {},
}
# The environment of a mode, set while it trains.
ENV = {"buckets": {"TNT_FUSION_THRESHOLD_KB": "0"}, "callbacks": {"TNT_KERAS_JAX_SUM": "callback"}}


def train(distributed: bool, mode: dict) -> tuple[list[np.ndarray], dict]:
    keras.utils.set_random_seed(3)
    x, y = arrays(71, seed=4)  # 71 rows in batches of 7: uneven slices, a partial last batch
    layers = [keras.Input((x.shape[1],)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    model = keras.Sequential(layers)
    if distributed:
        model = tnt.Model(model)
    model.compile(**compile_args("adam"), **mode)
    history = model.fit(x, y, batch_size=7, epochs=2, verbose=0, shuffle=False).history
    return model.get_weights(), history


results = {}
for name, mode in MODES.items():
    os.environ.update(ENV.get(name, {}))
    before = dict(collectives.traced_calls)
    mine, mine_history = train(True, mode)
    traced = {way: collectives.traced_calls[way] - before[way] for way in before}
    for variable in ENV.get(name, {}):
        del os.environ[variable]
    serial, serial_history = train(False, mode)
    results[name] = {
        "traced": traced,
        "weights_err": max(float(np.max(np.abs(a - b))) for a, b in zip(mine, serial, strict=True)),
        "history_err": max(
            abs(a - b) for k in serial_history for a, b in zip(serial_history[k], mine_history[k], strict=True)
        ),
    }
report({"rank": tnt.get_rank(), "results": results})
