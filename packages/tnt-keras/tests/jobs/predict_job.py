"""tnt.Model.predict on real ranks: rank 0's weights, every output structure, every dataset form."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
from typing import Any

import keras
import numpy as np
import tensorflow as tf
import tnt_keras as tnt
from _job import CLASSES, FEATURES, flat, report
from tnt_keras import variables as tnt_variables

rank, size = tnt.get_rank(), tnt.get_size()
ROWS, BATCH = 13, 5  # B divisible by neither 2 nor 3, and a partial last batch of 3
rng = np.random.default_rng(0)  # the same data on every rank
x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
y = rng.integers(0, CLASSES, size=ROWS).astype("int32")
results: dict[str, Any] = {}

# Counts tnt's broadcasts, to see that an unchanged model is not broadcast again.
broadcasts: list[int] = []
original_broadcast = tnt_variables.broadcast_variables


def counting_broadcast(variables: Any, root: int = 0, **kwargs: Any) -> None:
    broadcasts.append(len(variables))
    original_broadcast(variables, root, **kwargs)


tnt_variables.broadcast_variables = counting_broadcast


def leaves(result: Any) -> list[np.ndarray]:
    return [np.asarray(a, np.float64) for a in tf.nest.flatten(result)]


def err(a: Any, b: Any) -> float:
    tf.nest.assert_same_structure(a, b)
    pairs = list(zip(leaves(a), leaves(b), strict=True))
    if any(p.shape != q.shape for p, q in pairs):
        return float("inf")
    return max(float(np.max(np.abs(p - q))) if p.size else 0.0 for p, q in pairs)


def values(result: Any) -> list[float]:
    return [float(v) for a in leaves(result) for v in a.ravel()]


def unseeded() -> keras.Model:
    """No seed: every rank initialises its own random weights."""
    inputs = keras.Input((FEATURES,))
    h = keras.layers.BatchNormalization()(keras.layers.Dense(8, activation="tanh")(inputs))
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(h))


# 1. A built, never fit, uncompiled model: predictions come from rank 0's weights.
fresh = unseeded()
weights_before = flat(fresh.get_weights())
serial_before = fresh.predict(x, batch_size=BATCH, verbose=0)  # this rank's own weights
model = tnt.Model(fresh)
start = len(broadcasts)
pred = model.predict(x, batch_size=BATCH, verbose=0)
first = len(broadcasts) - start
again = model.predict(x, batch_size=BATCH, verbose=0)
results["fresh"] = {
    "weights_before": weights_before,
    "serial_before": values(serial_before),
    "pred": values(pred),
    "again": values(again),
    "broadcasts_first": first,
    "broadcasts_again": len(broadcasts) - start - first,
    "weights_after": flat(model.get_weights()),
}


# 2. A subclassed model that is not even built: predict builds it, then takes rank 0's weights.
class Net(keras.Model):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(CLASSES)

    def call(self, inputs: Any) -> Any:
        return self.out(self.hidden(inputs))


net = tnt.Model(Net())
pred = net.predict(tf.data.Dataset.from_tensor_slices(x).batch(BATCH), verbose=0)
results["unbuilt"] = {
    "pred": values(pred),
    "serial": values(net.model.predict(x, batch_size=BATCH, verbose=0)),  # rank 0's weights on every rank now
    "weights": flat(net.get_weights()),
}

# 3. Compiled but never fit: predict needs no optimizer and leaves it unbuilt.
compiled = tnt.Model(unseeded())
compiled.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
serial_before = compiled.model.predict(x, batch_size=BATCH, verbose=0)
pred = compiled.predict(x, batch_size=BATCH, verbose=0)
results["compiled"] = {
    "serial_before": values(serial_before),
    "pred": values(pred),
    "optimizer_built": bool(compiled.optimizer.built),
}

# 4. After fit, BatchNormalization's moving statistics come from each rank's own slices.
compiled.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
bn = next(layer for layer in compiled.layers if isinstance(layer, keras.layers.BatchNormalization))
moving_before = flat([bn.moving_mean.numpy(), bn.moving_variance.numpy()])
serial_before = compiled.model.predict(x, batch_size=BATCH, verbose=0)
start = len(broadcasts)
pred = compiled.predict(x, batch_size=BATCH, verbose=0)
results["after_fit"] = {
    "moving_before": moving_before,
    "serial_before": values(serial_before),
    "pred": values(pred),
    "broadcasts": len(broadcasts) - start,
}


# 5. Output structures and dataset forms against serial Keras on the same (now equal) weights.
class Pair(keras.Model):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.a = keras.layers.Dense(2)
        self.b = keras.layers.Dense(1)

    def call(self, inputs: Any) -> Any:
        return self.a(inputs), self.b(inputs)


def structured(kind: str) -> keras.Model:
    keras.utils.set_random_seed(3)
    if kind == "tuple":
        return Pair()
    inputs = keras.Input((FEATURES,))
    h = keras.layers.Dense(8, activation="relu")(inputs)
    score = keras.layers.Dense(1, name="score")(h)  # one value per row: Keras' logs turn it into a float
    probs = keras.layers.Dense(CLASSES, activation="softmax", name="probs")(h)
    outputs = {"single": score, "list": [probs, score], "dict": {"score": score, "probs": probs}}[kind]
    return keras.Model(inputs, outputs)


forms = {
    "numpy": lambda: ((x,), {"batch_size": BATCH}),
    "x": lambda: ((tf.data.Dataset.from_tensor_slices(x).batch(BATCH),), {}),
    "(x,)": lambda: ((tf.data.Dataset.from_tensor_slices((x,)).batch(BATCH),), {}),
    "(x, y)": lambda: ((tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH),), {}),
    # A last batch of 1 sample: every rank but rank 0 predicts an empty slice of it.
    "numpy, last batch of 1": lambda: ((x,), {"batch_size": ROWS // 2}),
}
structures: dict[str, Any] = {}
for kind in ("single", "list", "tuple", "dict"):
    model = tnt.Model(structured(kind))
    for form, make in forms.items():
        args, kwargs = make()
        got = model.predict(*args, verbose=0, **kwargs)
        args, kwargs = make()
        want = model.model.predict(*args, verbose=0, **kwargs)
        structures[f"{kind} {form}"] = {
            "type": type(got).__name__,
            "serial_type": type(want).__name__,
            "keys": sorted(got) if isinstance(got, dict) else None,
            "rows": [int(a.shape[0]) for a in leaves(got)],
            "err": err(got, want),
            "values": values(got),
        }

# steps_per_execution > 1: predict runs one step per call and gives the setting back. (Keras' torch
# backend refuses steps_per_execution > 1 itself, so the serial reference cannot run there.)
if keras.backend.backend() == "tensorflow":
    model = tnt.Model(structured("dict"))
    model.compile(loss="mse", steps_per_execution=3)
    got = model.predict(forms["x"]()[0][0], verbose=0)
    structures["dict steps_per_execution=3"] = {
        "type": type(got).__name__,
        "serial_type": "dict",
        "keys": sorted(got),
        "rows": [int(a.shape[0]) for a in leaves(got)],
        "err": err(got, model.model.predict(x, batch_size=BATCH, verbose=0)),
        "values": values(got),
        "steps_per_execution": int(model.model.steps_per_execution),
    }
results["structures"] = structures
report({"rank": rank, "size": size, **results})
