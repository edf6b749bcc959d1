"""How far float32 training of test_large_models.py's Transformer ends from float64 training.

The figures behind that test's bound (see its docstring): one process, no tnt. The Transformer is
trained for the test's 3 steps of global batch 8 from the same initial weights as

- plain Keras ``fit`` in float64 (the reference) and in float32;
- float32, each batch's gradient taken as 2, 4 or 8 slices and added (as tnt's ranks do);
- the same with 2 slices whose gradients are rounded to bfloat16 before the sum (a wrong sum).

and the script prints each run's Euclidean and largest distance from the float64 run and from plain
Keras in float32. Usage (about a minute on 2 cores)::

    python packages/tnt-keras/tests/rounding_study.py [--learning-rate 0.001]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from _training_worker import CLASSES, MODELS, VOCAB  # noqa: E402

STEPS, BATCH = 3, 8  # as in jobs/large_models_job.py
SPEC = MODELS["transformer"]


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    rows = STEPS * BATCH
    x = rng.integers(0, VOCAB, size=(rows, *SPEC.input_shape), dtype=np.int32)
    return x, rng.integers(0, CLASSES, size=rows, dtype=np.int64)


def built(initial: list[np.ndarray], dtype: str) -> keras.Model:
    keras.config.set_dtype_policy(dtype)
    try:
        model = SPEC.build(keras)
    finally:
        keras.config.set_dtype_policy("float32")
    model.set_weights([w.astype(dtype) for w in initial])
    return model


def plain(initial: list[np.ndarray], dtype: str, rate: float) -> list[np.ndarray]:
    model = built(initial, dtype)
    model.compile(
        optimizer=keras.optimizers.SGD(rate, momentum=0.9), loss="sparse_categorical_crossentropy", run_eagerly=True
    )
    x, y = data()
    model.fit(x, y, batch_size=BATCH, shuffle=False, epochs=1, verbose=0)
    return [v.numpy() for v in model.trainable_variables]


def sliced(initial: list[np.ndarray], slices: int, rate: float, rounding: str | None = None) -> list[np.ndarray]:
    model = built(initial, "float32")
    optimizer, loss = keras.optimizers.SGD(rate, momentum=0.9), keras.losses.SparseCategoricalCrossentropy()
    trainable = model.trainable_variables

    @tf.function
    def gradients(xs: tf.Tensor, ys: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            value = loss(ys, model(xs, training=True))
        return tape.gradient(value, trainable)

    x, y = data()
    rows = BATCH // slices
    for step in range(STEPS):
        total = None
        for s in range(slices):
            part = slice(step * BATCH + s * rows, step * BATCH + (s + 1) * rows)
            scaled = [tf.convert_to_tensor(g) * (1.0 / slices) for g in gradients(x[part], y[part])]
            if rounding is not None:
                scaled = [tf.cast(tf.cast(g, rounding), tf.float32) for g in scaled]
            total = scaled if total is None else [a + b for a, b in zip(total, scaled, strict=True)]
        optimizer.apply(total, trainable)
    return [v.numpy() for v in trainable]


def distances(a: list[np.ndarray], b: list[np.ndarray]) -> str:
    d = np.concatenate(
        [np.ravel(np.asarray(p, np.float64) - np.asarray(q, np.float64)) for p, q in zip(a, b, strict=True)]
    )
    return f"{np.linalg.norm(d):.3e} (max {np.abs(d).max():.3e})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learning-rate", type=float, default=0.001, help="the test's: 0.001")
    rate = parser.parse_args().learning_rate
    keras.utils.set_random_seed(11)
    initial = SPEC.build(keras).get_weights()
    exact = plain(initial, "float64", rate)
    serial = plain(initial, "float32", rate)
    runs = {"plain Keras, float32": serial}
    runs.update({f"{n} slices added": sliced(initial, n, rate) for n in (2, 4, 8)})
    runs["2 slices, bfloat16 sum"] = sliced(initial, 2, rate, "bfloat16")
    print(
        f"learning rate {rate}; float64 run's distance from its float32 rounding: "
        f"{distances([w.astype(np.float32) for w in exact], exact)}"
    )
    print(f"{'run':24} {'from the float64 run':32} from plain Keras, float32")
    for name, weights in runs.items():
        print(f"{name:24} {distances(weights, exact):32} {distances(weights, serial)}")


if __name__ == "__main__":
    main()
