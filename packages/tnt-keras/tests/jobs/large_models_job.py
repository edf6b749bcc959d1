"""A few steps of Keras' ResNet-50 and of a Transformer encoder under tnt, each against a serial
reference; see test_large_models.py for what is compared.

The references are computed first, each model's by one rank for every rank (on 2 ranks the two
models' at the same time), then every rank trains the same initial weights under tnt and reports
the largest differences from its reference.
"""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import hashlib
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf
import tnt_keras as tnt
from _job import max_diff, report, shared_references

# The benchmark's own models (benchmarks/_training_worker.py), so that this test trains what it measures.
sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "benchmarks"))
from _training_worker import CLASSES, VOCAB  # noqa: E402
from _training_worker import MODELS as BENCHMARK_MODELS  # noqa: E402

STEPS = 3
BATCH = 8  # global: 4 rows per rank on 2 ranks
LEARNING_RATE = 0.01
# ResNet-50 trains in float32 against a reference that repeats each rank's arithmetic; the
# Transformer in float64 against plain Keras in float64 (see test_large_models.py for why).
DTYPE = {"resnet50": "float32", "transformer": "float64"}


def data(kind: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    rows, spec = STEPS * BATCH, BENCHMARK_MODELS[kind]
    if spec.input_dtype == "int32":
        x = rng.integers(0, VOCAB, size=(rows, *spec.input_shape), dtype=np.int32)
    else:
        x = rng.random((rows, *spec.input_shape), dtype=np.float32)
    return x, rng.integers(0, CLASSES, size=rows, dtype=np.int64)


def optimizer(kind: str) -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(LEARNING_RATE, momentum=0.9)


def loss() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy()


def running_means(step_losses: list[float]) -> list[float]:
    """What Keras logs after each batch: the mean loss over the epoch's batches so far (all of one size)."""
    return [float(np.mean(step_losses[: i + 1])) for i in range(len(step_losses))]


def serial_fit(kind: str, model: keras.Model, x: np.ndarray, y: np.ndarray) -> list[float]:
    """Plain Keras on the global batches, run eagerly (3 steps cost less than tracing); returns the
    logged loss after every step."""
    model.compile(optimizer=optimizer(kind), loss=loss(), run_eagerly=True)
    logged: list[float] = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: logged.append(float(logs["loss"])))
    model.fit(x, y, batch_size=BATCH, shuffle=False, epochs=1, verbose=0, callbacks=[record])
    return logged


def per_slice_fit(
    kind: str, model: keras.Model, x: np.ndarray, y: np.ndarray, size: int, rounding: str | None = None
) -> tuple[list[float], list[list]]:
    """Serial training with data-parallel BatchNormalization: each global batch is cut into the
    ranks' slices (tnt's rule: rank r gets ``B//N + (r < B%N)`` rows, in order), the gradient of
    each slice is taken in training mode (BatchNormalization normalises over that slice), scaled by
    the slice's share of the batch and summed in rank order, and the sum is applied with the same
    optimizer. Rank r's moving statistics keep the updates of slice r only; in training mode they
    do not enter the gradients, so one pass gives every rank's by keeping each rank's apart.
    Returns the logged loss after every step (the running mean of the rows-weighted slice losses)
    and, for every rank, its non-trainable variables at the end.

    The slice gradients are taken in a tf.function, as Keras' train step is: run eagerly, TensorFlow
    computes BatchNormalization with other kernels, whose gradients differ from the graph's by
    percents on 4 rows (variances of 4 values at ResNet-50's last, 1x1 stage), far above 1e-5.

    ``rounding`` (a dtype) makes it a wrong sum, for the test's negative control: every scaled slice
    gradient is rounded to that dtype before the sum, as a reduction in a narrower type would."""
    opt, loss_fn = optimizer(kind), loss()
    trainable, moving = model.trainable_variables, model.non_trainable_variables

    @tf.function
    def slice_gradients(xs: tf.Tensor, ys: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
        with tf.GradientTape() as tape:
            value = loss_fn(ys, model(xs, training=True))
        return value, tape.gradient(value, trainable)

    kept = [[v.numpy() for v in moving] for _ in range(size)]  # each rank's moving statistics
    step_losses = []
    for step in range(STEPS):
        start, total, step_loss = step * BATCH, None, 0.0
        for r in range(size):
            first = r * (BATCH // size) + min(r, BATCH % size)
            rows = BATCH // size + (r < BATCH % size)
            for v, saved in zip(moving, kept[r], strict=True):
                v.assign(saved)
            part = slice(start + first, start + first + rows)
            value, grads = slice_gradients(x[part], y[part])
            kept[r] = [v.numpy() for v in moving]
            share = tf.constant(rows, tf.float32) / tf.constant(BATCH, tf.float32)
            scaled = [tf.convert_to_tensor(g) * tf.cast(share, g.dtype) for g in grads]  # sparse ones made dense
            if rounding is not None:
                scaled = [tf.cast(tf.cast(g, rounding), g.dtype) for g in scaled]
            total = scaled if total is None else [a + b for a, b in zip(total, scaled, strict=True)]
            step_loss += float(value) * rows / BATCH
        opt.apply(total, trainable)
        step_losses.append(step_loss)
    return running_means(step_losses), kept


def digest(variables: list[Any]) -> str:
    h = hashlib.sha256()
    for v in variables:
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()


BUILDERS = {kind: (lambda kind=kind: BENCHMARK_MODELS[kind].build(keras)) for kind in ("resnet50", "transformer")}


def built(kind: str, weights: list[np.ndarray], dtype: str = "float32") -> keras.Model:
    """A fresh ``kind`` model whose variables are of ``dtype``, holding ``weights``."""
    keras.config.set_dtype_policy(dtype)
    try:
        model = BUILDERS[kind]()
    finally:
        keras.config.set_dtype_policy("float32")
    model.set_weights([w.astype(dtype) for w in weights])
    return model


def distance(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """The Euclidean distance between two sets of weights, computed in float64."""
    return float(
        np.sqrt(
            sum(np.sum((np.asarray(p, np.float64) - np.asarray(q, np.float64)) ** 2) for p, q in zip(a, b, strict=True))
        )
    )


def norm(weights: list[np.ndarray]) -> float:
    """The Euclidean norm of a set of weights, computed in float64."""
    return float(np.sqrt(sum(np.sum(np.square(np.asarray(w, np.float64))) for w in weights)))


def reference(kind: str, inner: keras.Model, size: int) -> dict[str, Any]:
    """The serial reference of every rank for ``kind``, from ``inner``'s initial weights.

    ResNet-50's: per-slice training in float32. The Transformer's: plain Keras in float64, with the
    scale of its weights (the bound is made of it) and how far from it a wrong sum ends up: the same
    training with the slices' gradients rounded to float32 before the sum."""
    x, y = data(kind)
    if kind == "resnet50":
        model = built(kind, inner.get_weights())
        losses, non_trainable = per_slice_fit(kind, model, x, y, size)
        return {
            "losses": losses,
            "trainable": [v.numpy() for v in model.trainable_variables],
            "non_trainable": non_trainable,
        }
    exact = built(kind, inner.get_weights(), DTYPE[kind])
    losses = serial_fit(kind, exact, x, y)
    trainable = [v.numpy() for v in exact.trainable_variables]
    wrong = built(kind, inner.get_weights(), DTYPE[kind])
    per_slice_fit(kind, wrong, x, y, size, rounding="float32")
    return {
        "losses": losses,
        "trainable": trainable,
        "non_trainable": [[v.numpy() for v in exact.non_trainable_variables]] * size,
        "weights_norm": norm(trainable),
        "wrong_sum_err": distance([v.numpy() for v in wrong.trainable_variables], trainable),
    }


def compare(kind: str, inner: keras.Model, initial: list[np.ndarray], ref: dict[str, Any], rank: int) -> dict[str, Any]:
    if DTYPE[kind] != "float32":
        inner = built(kind, inner.get_weights(), DTYPE[kind])
    model = tnt.Model(inner)
    model.compile(optimizer=optimizer(kind), loss=loss())
    logged: list[float] = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: logged.append(float(logs["loss"])))
    x, y = data(kind)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    model.fit(ds, epochs=1, verbose=0, callbacks=[record])
    trainable = [v.numpy() for v in inner.trainable_variables]
    return {
        **{key: ref[key] for key in ("weights_norm", "wrong_sum_err") if key in ref},
        "dtype": str(inner.trainable_variables[0].dtype),
        "err": distance(trainable, ref["trainable"]),
        "parameters": int(inner.count_params()),
        "batch_norm_layers": sum(isinstance(layer, keras.layers.BatchNormalization) for layer in inner.layers),
        "steps": len(logged),
        "losses": logged,
        "loss_err": max(abs(a - b) for a, b in zip(logged, ref["losses"], strict=True)),
        "trainable_err": max_diff(trainable, ref["trainable"]),
        "non_trainable_err": max_diff([v.numpy() for v in inner.non_trainable_variables], ref["non_trainable"][rank])
        if inner.non_trainable_variables
        else 0.0,
        "moved": max_diff(trainable, initial),
        "trainable_digest": digest(inner.trainable_variables),
    }


# Every rank builds both models from the same seed; each model's reference (for every rank) is then
# computed by one rank, both at once on 2 ranks, and every rank trains each model under tnt.
rank, size = tnt.get_rank(), tnt.get_size()
kinds = sys.argv[1:] or ["resnet50", "transformer"]
inners, initials = {}, {}
for kind in kinds:
    keras.utils.set_random_seed(11)
    inners[kind] = BUILDERS[kind]()
    initials[kind] = [v.numpy() for v in inners[kind].trainable_variables]
refs = shared_references({kind: (lambda kind=kind: reference(kind, inners[kind], size)) for kind in kinds})
results = {kind: compare(kind, inners[kind], initials[kind], refs[kind], rank) for kind in kinds}
report({"rank": rank, "size": size, **results})
