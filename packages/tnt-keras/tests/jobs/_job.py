"""Shared pieces of the job scripts: reporting, data and the four kinds of model under test."""

from __future__ import annotations

import gc
import json
import os
import pickle
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import keras
import numpy as np

# The imports are done: keep their objects out of every later collection and collect again
# (see _quick_start.py, which every job script imports first).
gc.freeze()
gc.enable()

FEATURES, CLASSES = 6, 3


def report(data: dict[str, Any]) -> None:
    """Writes this rank's results for the test to read."""
    rank = int(os.environ.get("TNT_RANK", "0"))
    path = Path(os.environ["TNT_TEST_OUT"], f"rank{rank}.json")
    # Whole or not at all: another rank may wait for the file and end the job once it exists.
    path.with_suffix(".tmp").write_text(json.dumps(data))
    path.with_suffix(".tmp").replace(path)


def shared_references(compute: dict[str, Callable[[], Any]], reusable: Iterable[str] = ()) -> dict[str, Any]:
    """Every result of ``compute`` on every rank, each computed on one rank only: the i-th function
    runs on rank ``i % size``, all ranks at once, and the results pass through files in TNT_TEST_OUT.
    The serial references cost N times less CPU than every rank computing all of them.

    Results named in ``reusable`` must not depend on the job (its number of ranks, its transport):
    they are kept in TNT_TEST_CACHE, one folder per test session, under the job script's name, and
    later runs of that script load them instead of training the same plain Keras models again."""
    import tnt_comm  # here, not above: plain_keras_load.py imports this module without tnt

    rank, size = tnt_comm.rank(), tnt_comm.size()
    folder = Path(os.environ["TNT_TEST_OUT"])
    cache = Path(os.environ["TNT_TEST_CACHE"]) if "TNT_TEST_CACHE" in os.environ else None
    keep = {name for name in reusable if cache is not None}
    # Decided by every rank before the first barrier; the cache only grows after the second one.
    kept = {name: cache / f"{Path(sys.argv[0]).stem}-{name}.pickle" for name in keep}
    cached = {name for name in keep if kept[name].exists()}
    todo = [name for name in compute if name not in cached]
    mine = [name for i, name in enumerate(todo) if i % size == rank]
    for name in mine:
        with open(folder / f"reference-{name}.pickle", "wb") as f:
            pickle.dump(compute[name](), f)
    tnt_comm.barrier()  # every reference is written
    results = {}
    for name in compute:
        with open(kept[name] if name in cached else folder / f"reference-{name}.pickle", "rb") as f:
            results[name] = pickle.load(f)
    tnt_comm.barrier()  # every reference is read: the files can go
    for name in mine:
        if name in keep:
            os.replace(folder / f"reference-{name}.pickle", kept[name])
        else:
            (folder / f"reference-{name}.pickle").unlink()
    return results


def arrays(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype("float32")
    y = (np.argmax(x[:, :CLASSES] + 0.3 * rng.normal(size=(rows, CLASSES)), axis=1)).astype("int32")
    return x, y


BACKEND = keras.backend.backend()


class GlobalBatches(keras.utils.PyDataset):
    """Arrays in global batches, reshuffled every epoch from a seed: the input of the jobs on
    backends without tf.data (every rank and the serial reference draw the same orders)."""

    def __init__(self, arrays: tuple[np.ndarray, ...], batch: int, seed: int | None) -> None:
        super().__init__()
        self.arrays, self.batch, self.seed, self.epoch = arrays, batch, seed, 0
        self.rows = len(arrays[0])
        self.order = self._order()

    def _order(self) -> np.ndarray:
        if self.seed is None:
            return np.arange(self.rows)
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.rows)

    def __len__(self) -> int:
        return -(-self.rows // self.batch)

    def __getitem__(self, i: int) -> tuple[np.ndarray, ...]:
        index = self.order[i * self.batch : (i + 1) * self.batch]
        return tuple(a[index] for a in self.arrays)

    def on_epoch_end(self) -> None:
        self.epoch += 1
        self.order = self._order()


def batches(arrays: tuple[np.ndarray, ...], batch: int, seed: int | None = None) -> Any:
    """``arrays`` in global batches of ``batch`` rows, shuffled from ``seed`` if given: a tf.data
    pipeline on TensorFlow, a ``PyDataset`` on other backends."""
    if BACKEND != "tensorflow":
        return GlobalBatches(arrays, batch, seed)
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(arrays)
    if seed is not None:
        ds = ds.shuffle(len(arrays[0]), seed=seed)
    return ds.batch(batch)


def dataset(rows: int, batch: int, seed: int = 0, shuffle: bool = True) -> Any:
    return batches(arrays(rows, seed), batch, seed + 1 if shuffle else None)


@keras.saving.register_keras_serializable(package="tnt_tests")
class Subclassed(keras.Model):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(CLASSES)

    def call(self, x: Any) -> Any:
        return self.out(self.hidden(x))


@keras.saving.register_keras_serializable(package="tnt_tests")
class CustomStep(keras.Model):
    """Overrides train_step the way the Keras guide shows."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(CLASSES)

    def call(self, x: Any) -> Any:
        return self.out(self.hidden(x))

    def train_step(self, data: Any) -> Any:
        x, y = data
        if BACKEND == "torch":
            self.zero_grad()
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
            loss.backward()
            grads = [v.value.grad for v in self.trainable_variables]
            import torch

            with torch.no_grad():
                self.optimizer.apply(grads, self.trainable_variables)
        else:
            import tensorflow as tf

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(grads, self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss, sample_weight=keras.ops.shape(x)[0])
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    def _jax_train_step(self, state: Any, data: Any) -> Any:
        """The same step as Keras-JAX's guide writes it: a pure function of the state."""
        import jax

        trainable, non_trainable, optimizer_variables, metrics_variables = state
        x, y = data

        def loss_of(trainable: Any, non_trainable: Any) -> Any:
            y_pred, non_trainable = self.stateless_call(trainable, non_trainable, x)
            return self.compute_loss(x=x, y=y, y_pred=y_pred), (y_pred, non_trainable)

        (loss, (y_pred, non_trainable)), grads = jax.value_and_grad(loss_of, has_aux=True)(trainable, non_trainable)
        trainable, optimizer_variables = self.optimizer.stateless_apply(optimizer_variables, grads, trainable)
        updated, logs = [], {}
        for metric in self.metrics:
            mine = metrics_variables[len(updated) : len(updated) + len(metric.variables)]
            if metric.name == "loss":
                mine = metric.stateless_update_state(mine, loss, sample_weight=keras.ops.shape(x)[0])
            else:
                mine = metric.stateless_update_state(mine, y, y_pred)
            logs[metric.name] = metric.stateless_result(mine)
            updated += mine
        return logs, (trainable, non_trainable, optimizer_variables, updated)

    if BACKEND == "jax":
        train_step = _jax_train_step  # type: ignore[assignment]


TOKENS = 20


@keras.saving.register_keras_serializable(package="tnt_tests")
class ToTokens(keras.layers.Layer):
    """Turns each feature into a token id, so that the embedding model can share the float data."""

    def call(self, x: Any) -> Any:
        return keras.ops.cast(keras.ops.abs(x) * 7, "int32") % TOKENS


def build(kind: str, seed: int = 7) -> keras.Model:
    keras.utils.set_random_seed(seed)
    if kind == "functional":
        inputs = keras.Input((FEATURES,))
        h = keras.layers.Dense(8, activation="relu")(inputs)
        return keras.Model(inputs, keras.layers.Dense(CLASSES)(h))
    if kind == "sequential":
        return keras.Sequential(
            [keras.Input((FEATURES,)), keras.layers.Dense(8, activation="sigmoid"), keras.layers.Dense(CLASSES)]
        )
    if kind == "subclassed":
        return Subclassed()
    if kind == "custom_step":
        return CustomStep()
    if kind == "embedding":  # sparse gradients (tf.IndexedSlices) for the embedding table
        inputs = keras.Input((FEATURES,))
        tokens = ToTokens()(inputs)
        h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(TOKENS, 4)(tokens))
        return keras.Model(inputs, keras.layers.Dense(CLASSES)(h))
    raise ValueError(kind)


def optimizer(name: str) -> keras.optimizers.Optimizer:
    return {
        "sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        "adam": lambda: keras.optimizers.Adam(0.01),
        "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
        "adagrad": lambda: keras.optimizers.Adagrad(0.1),
        "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01),
    }[name]()


def compile_args(opt: str) -> dict[str, Any]:
    return {
        "optimizer": optimizer(opt),
        "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        "metrics": [keras.metrics.SparseCategoricalAccuracy(name="acc")],
    }


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(
        float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in zip(a, b, strict=True)
    )


def history_diff(a: dict[str, list[float]], b: dict[str, list[float]]) -> float:
    assert set(a) == set(b), (sorted(a), sorted(b))
    return max(abs(x - y) for k in a for x, y in zip(a[k], b[k], strict=True))


def flat(weights: list[np.ndarray]) -> list[float]:
    return [float(v) for w in weights for v in np.ravel(w)]
