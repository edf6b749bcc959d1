"""SyncBatchNormalization on N ranks against BatchNormalization in serial Keras, on the same global
batches: B not divisible by N, a partial last batch, and a last batch of 1 row (empty slices on
every rank but rank 0). On TensorFlow, Keras' BatchNormalization(synchronized=True) too. The test
(test_sync_batch_norm.py) compares weights, moving statistics and logs, and the layer's round trip
through a .keras file."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import os
from pathlib import Path

import keras
import numpy as np
import tnt_keras as tnt
from tnt_keras.runtime import fusion_threshold_bytes
from _job import BACKEND, CLASSES, FEATURES, arrays, batches, flat, report, shared_references

# (rows, global batch): 61 rows in batches of 12 (last batch 1 row: empty slices), 70 in 7 (not
# divisible by 2 or 3).
CASES = [(61, 12), (70, 7)]
KINDS = ["sync"] + (["synchronized"] if BACKEND == "tensorflow" else [])


def build(norm: str) -> keras.Model:
    """Dense, normalisation, Dense, normalisation, Dense: gradients flow through two layers'
    statistics. ``norm``: "plain" (BatchNormalization, the serial reference), "sync"
    (tnt.SyncBatchNormalization) or "synchronized" (Keras' own flag, TensorFlow only)."""
    keras.utils.set_random_seed(11)

    def normalization() -> keras.layers.Layer:
        if norm == "sync":
            return tnt.SyncBatchNormalization(momentum=0.8)
        return keras.layers.BatchNormalization(momentum=0.8, synchronized=norm == "synchronized")

    # No bias before a normalisation: it has no effect there, its gradient is rounding noise, and
    # Adam would turn that noise into steps of the learning rate's size.
    inputs = keras.Input((FEATURES,))
    h = keras.layers.Activation("relu")(normalization()(keras.layers.Dense(8, use_bias=False)(inputs)))
    h = normalization()(keras.layers.Dense(8, use_bias=False)(h))
    model = keras.Model(inputs, keras.layers.Dense(CLASSES)(h))
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
    )
    return model


def moving(model: keras.Model) -> list[float]:
    return flat([v.numpy() for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)
                 for v in (layer.moving_mean, layer.moving_variance)])


def train(norm: str, rows: int, batch: int) -> dict:
    inner = build(norm)
    model = inner if norm == "plain" else tnt.Model(inner)
    history = model.fit(batches(arrays(rows, seed=rows), batch, seed=rows), epochs=3, verbose=0, shuffle=False)
    return {
        "weights": flat([v.numpy() for v in inner.trainable_variables]),
        "moving": moving(inner),
        "history": {k: [float(x) for x in v] for k, v in history.history.items()},
        "eval": model.evaluate(batches(arrays(rows, seed=rows), batch), verbose=0, return_dict=True),
    }


def worst(a: list[float], b: list[float]) -> float:
    return float(np.max(np.abs(np.subtract(a, b, dtype=np.float64))))


mine = {f"{kind}-{rows}-{batch}": train(kind, rows, batch) for kind in KINDS for rows, batch in CASES}
serial = shared_references(
    {f"{rows}-{batch}": (lambda r=rows, b=batch: train("plain", r, b)) for rows, batch in CASES},
    reusable=[f"{rows}-{batch}" for rows, batch in CASES],
)
results = {}
for name, got in mine.items():
    ref = serial[name.split("-", 1)[1]]
    results[name] = {
        "weights_err": worst(ref["weights"], got["weights"]),
        "moving_err": worst(ref["moving"], got["moving"]),
        "history_err": max(worst(ref["history"][k], got["history"][k]) for k in ref["history"]),
        "eval_err": max(abs(ref["eval"][k] - got["eval"][k]) for k in ref["eval"]),
        "weights": got["weights"],
        "moving": got["moving"],
    }

# The layer's round trip through a file: a SyncBatchNormalization stays one, with its statistics.
saved = Path(os.environ["TNT_TEST_OUT"], "sync.keras")
model = tnt.Model(build("sync"))
model.fit(batches(arrays(24, seed=3), 12), epochs=1, verbose=0)
model.save(saved)
loaded = tnt.models.load_model(saved)
layers = [type(layer).__name__ for layer in loaded.layers]
round_trip = {"layers": layers, "moving_equal": moving(loaded) == moving(model.model)}
report(
    {
        "rank": tnt.get_rank(),
        "size": tnt.get_size(),
        "results": results,
        "round_trip": round_trip,
        "fusion_threshold_kb": fusion_threshold_bytes() // 1024,  # as tnt read it
    }
)
