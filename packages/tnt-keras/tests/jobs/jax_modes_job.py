"""Keras-JAX's ways of running a step, each against serial Keras-JAX: compiled (the default),
run_eagerly=True, jit_compile=False, and steps_per_execution=3 (several steps in one program, each
with its ordered collectives)."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import keras
import numpy as np
import tnt_keras as tnt
from _job import arrays, compile_args, report

MODES = {
    "compiled": {},
    "eager": {"run_eagerly": True},
    "no_jit": {"jit_compile": False},
    "spe3": {"steps_per_execution": 3},
}


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
    (mine, mine_history), (serial, serial_history) = train(True, mode), train(False, mode)
    results[name] = {
        "weights_err": max(float(np.max(np.abs(a - b))) for a, b in zip(mine, serial, strict=True)),
        "history_err": max(
            abs(a - b) for k in serial_history for a, b in zip(serial_history[k], mine_history[k], strict=True)
        ),
    }
report({"rank": tnt.get_rank(), "results": results})
