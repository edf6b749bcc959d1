"""Loads .keras files with plain Keras in a process where tnt cannot be imported (not a tnt job).

Usage: plain_keras_load.py OUT_JSON FILE... ; prints nothing, writes what it loaded to OUT_JSON."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import sys

# No tnt here: any import of tnt_keras or tnt_comm fails, as in a process without them installed.
sys.modules["tnt_keras"] = None  # type: ignore[assignment]
sys.modules["tnt_comm"] = None  # type: ignore[assignment]

import json  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _job import flat  # noqa: E402  (registers the test's subclassed models, as a user's code would)

x = np.linspace(-2, 2, 5 * 6, dtype="float32").reshape(5, 6)
loaded = {}
for path in sys.argv[2:]:
    model = keras.models.load_model(path)
    loaded[path] = {
        "class": type(model).__name__,
        "compiled": bool(model.compiled),
        "weights": flat(model.get_weights()),
        "iterations": int(model.optimizer.iterations.numpy()),
        "predictions": flat(model.predict(x, verbose=0)),
        "tnt_modules": sorted(m for m in sys.modules if m.startswith("tnt") and sys.modules[m] is not None),
    }
with open(sys.argv[1], "w") as f:
    json.dump(loaded, f)
