"""Dataset options and every clear error, on real ranks."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import functools
import io
import logging
import os
from collections.abc import Callable
from typing import Any

import tensorflow as tf

# Shuffled without a seed BEFORE tnt_keras patched shuffle: fit must refuse it on several ranks.
early = tf.data.Dataset.range(8).map(lambda i: (tf.fill([6], tf.cast(i, tf.float32)), i % 3)).shuffle(8).batch(4)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tnt_keras as tnt  # noqa: E402
from _job import arrays, build, compile_args, dataset, flat, max_diff, report, shared_references  # noqa: E402

rank, size = tnt.get_rank(), tnt.get_size()
results: dict = {"rank": rank, "size": size, "local_rank": tnt.get_local_rank(), "master": tnt.get_master_rank()}
results["is_master"] = tnt.is_master_rank()
log = io.StringIO()
logging.getLogger("tnt_keras").addHandler(logging.StreamHandler(log))
logging.getLogger("tnt_keras").setLevel(logging.INFO)


def error_of(fn) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return ""


def fresh(kind: str = "functional", opt: str = "sgd") -> tnt.Model:
    model = tnt.Model(build(kind))
    model.compile(**compile_args(opt))
    return model


x, y = arrays(70)
xa, ya = arrays(75, seed=4)
sparse_x = xa * (np.abs(xa) > 0.7)  # mostly zeros


def two_inputs() -> keras.Model:
    keras.utils.set_random_seed(3)
    a, b = keras.Input((4,), name="a"), keras.Input((2,), name="b")
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
    return keras.Model({"a": a, "b": b}, keras.layers.Dense(3)(hidden))


def sparse_input() -> keras.Model:
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6,), sparse=True)
    return keras.Model(inputs, keras.layers.Dense(3)(inputs))


INPUTS = {
    "dict": (two_inputs, lambda: tf.data.Dataset.from_tensor_slices(({"a": xa[:, :4], "b": xa[:, 4:]}, ya))),
    "sparse": (sparse_input, lambda: tf.data.Dataset.from_tensor_slices((tf.sparse.from_dense(sparse_x), ya))),
}


def compiled(make: Callable[[], keras.Model], distributed: bool, **options: Any) -> keras.Model:
    model = tnt.Model(make()) if distributed else make()
    model.compile(**compile_args("adam"), **options)
    return model


def functional() -> keras.Model:
    return build("functional")


# Each case runs twice: under tnt, and with plain Keras (the reference, computed further down).
def numpy_inputs(distributed: bool) -> dict:
    """numpy inputs with batch_size, unshuffled."""
    model = compiled(functional, distributed)
    model.fit(x, y, batch_size=7, epochs=2, shuffle=False, verbose=0)
    return {
        "weights": model.get_weights(),
        "eval": model.evaluate(x, y, batch_size=7, verbose=0)[0],
        "predict": model.predict(x, batch_size=7, verbose=0),
    }


def steps_per_execution(distributed: bool) -> dict:
    """steps_per_execution > 1: several steps per call of the traced function."""
    model = compiled(lambda: build("custom_step"), distributed, steps_per_execution=3)
    model.fit(dataset(75, 7, seed=3), epochs=2, verbose=0)
    return {"weights": model.get_weights()}


def inputs_of(name: str, distributed: bool) -> dict:
    """Dict inputs (a two-input Functional model) and sparse inputs, sliced per rank."""
    make, data = INPUTS[name]
    model = compiled(make, distributed)
    model.fit(data().batch(7), epochs=2, verbose=0)
    return {"weights": model.get_weights()}


def micro_batches(distributed: bool) -> dict:
    """tnt_micro_batch_size on an unbatched dataset: serial Keras with global batch micro * size."""
    model = compiled(functional, distributed)
    if distributed:
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)), tnt_micro_batch_size=4, epochs=2, verbose=0)
    else:
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4 * size), epochs=2, verbose=0)
    return {"weights": model.get_weights()}


def validation(distributed: bool, **options: bool) -> dict:
    """Validation data, distributed and not: the same global val_loss."""
    h = compiled(functional, distributed).fit(
        dataset(60, 12, shuffle=False), validation_data=dataset(33, 11, seed=4, shuffle=False), verbose=0, **options
    )
    return {"val_loss": h.history["val_loss"][0]}


CASES: dict[str, Callable[[bool], dict]] = {
    "numpy": numpy_inputs,
    "steps_per_execution": steps_per_execution,
    **{name: functools.partial(inputs_of, name) for name in INPUTS},
    "micro": micro_batches,
    "val": validation,
}
mine = {name: case(True) for name, case in CASES.items()}
mine["val_undistributed"] = validation(True, tnt_distribute_validation_dataset=False)

# Shuffled numpy inputs and validation_split: every rank agrees.
model = fresh()
history = model.fit(x, y, batch_size=7, epochs=2, validation_split=0.2, verbose=0).history
results["shuffled_numpy_weights"] = flat(model.get_weights())
results["validation_keys"] = sorted(history)

# tnt_distribute_dataset=False: each rank reads its own shard as local batches; ranks stay identical.
model = fresh()
shard = tf.data.Dataset.from_tensor_slices((x, y)).shard(size, rank).batch(5)
model.fit(shard, tnt_distribute_dataset=False, epochs=1, verbose=0)
results["undistributed_weights"] = flat(model.get_weights())

# An unseeded shuffle made after the import gets the default seed: ranks agree, INFO says so.
model = fresh()
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).shuffle(70).batch(10), epochs=1, verbose=0)
results["unseeded_weights"] = flat(model.get_weights())
results["seed_info"] = "without a seed" in log.getvalue()


def unseeded_order() -> list[int]:
    return [int(v) for v in tf.data.Dataset.range(20).shuffle(20).as_numpy_iterator()]


# With a global seed, an unseeded shuffle follows it (as in plain TensorFlow): another global seed
# shuffles differently, the same one alike, and every rank agrees. Restores the job's seed after.
tf.random.set_seed(11)
results["order_11"] = unseeded_order()
tf.random.set_seed(12)
results["order_12"] = unseeded_order()
keras.utils.set_random_seed(11)
results["order_11_again"] = unseeded_order()

# Errors that name the problem and the fix.
results["errors"] = {
    "early_shuffle": error_of(lambda: fresh().fit(early, verbose=0)) if size > 1 else "",
    "batch_size_with_dataset": error_of(lambda: fresh().fit(dataset(20, 10), batch_size=10, verbose=0)),
    "ftrl": error_of(lambda: tnt.Model(build("functional")).compile(optimizer=keras.optimizers.Ftrl(), loss="mse")),
    "jit": error_of(lambda: tnt.Model(build("functional")).compile(optimizer="sgd", loss="mse", jit_compile=True)),
    "h5": error_of(lambda: fresh().save(os.path.join(os.environ["TNT_TEST_OUT"], "m.h5"))),
    "static_small_batch": error_of(
        lambda: fresh().fit(dataset(20, 1).unbatch().batch(1, drop_remainder=True), verbose=0)
    ),
    # Not an error: a partial last batch of 1 sample leaves ranks 1.. an empty slice, which is fine.
    "dynamic_small_batch": error_of(lambda: fresh().fit(dataset(21, 10), epochs=1, verbose=0)),
    "generator": error_of(lambda: fresh().fit(iter([1, 2]), verbose=0)),
    # Batches behind a zip are still batches: batching them again is refused.
    "micro_zip": error_of(
        lambda: fresh().fit(
            tf.data.Dataset.zip(
                (tf.data.Dataset.from_tensor_slices(x).batch(6), tf.data.Dataset.from_tensor_slices(y).batch(6))
            ),
            tnt_micro_batch_size=3,
            verbose=0,
        )
    ),
}

# BatchNormalization on micro-batches under 16 samples warns once.
bn = tnt.Model(keras.Sequential([keras.Input((6,)), keras.layers.BatchNormalization(), keras.layers.Dense(3)]))
bn.compile(**compile_args("sgd"))
bn.fit(dataset(24, 12, shuffle=False).unbatch().batch(12, drop_remainder=True), verbose=0)
results["bn_warning"] = "BatchNormalization" in log.getvalue()

# A summed loss cannot be weighted by each rank's share of the batch: compile warns.
summed = tnt.Model(build("functional"))
summed.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum"))
results["sum_loss_warning"] = "reduction='sum'" in log.getvalue()

# Plain Keras on fixed data, the same for 2 and 3 ranks, except micro-batches (global batch 4 * size).
serial = shared_references(
    {name: functools.partial(case, False) for name, case in CASES.items()},
    reusable=[name for name in CASES if name != "micro"],
)
for name in ("numpy", "steps_per_execution", "dict", "sparse", "micro"):
    key = {"numpy": "numpy_err", "dict": "dict_inputs_err", "sparse": "sparse_inputs_err"}.get(name, f"{name}_err")
    results[key] = max_diff(serial[name]["weights"], mine[name]["weights"])
results["numpy_eval_err"] = abs(serial["numpy"]["eval"] - mine["numpy"]["eval"])
results["numpy_predict_err"] = float(np.max(np.abs(serial["numpy"]["predict"] - mine["numpy"]["predict"])))
results["val_err"] = abs(serial["val"]["val_loss"] - mine["val"]["val_loss"])
results["val_undistributed_err"] = abs(serial["val"]["val_loss"] - mine["val_undistributed"]["val_loss"])
report(results)
