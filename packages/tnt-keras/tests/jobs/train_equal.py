"""Trains every kind of model against plain Keras on the same globally batched data."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import keras
import numpy as np
import tnt_comm
import tnt_keras as tnt
from _job import (
    BACKEND, CLASSES, FEATURES, arrays, batches, build, compile_args, dataset, flat, report, shared_references,
)


def worst(a: dict | list, b: dict | list) -> float:
    """The largest difference between two dicts (logs, histories) or lists (weights) of numbers or
    arrays; NaN if either holds a NaN (Python's max would pass over it)."""
    if isinstance(a, dict):
        assert set(a) == set(b), (sorted(a), sorted(b))
        a, b = [a[k] for k in sorted(a)], [b[k] for k in sorted(a)]
    return float(np.max([np.max(np.abs(np.subtract(x, y, dtype=np.float64))) for x, y in zip(a, b, strict=True)]))


# (model, optimizer, rows, global batch): covers B divisible and not by 2 and 3, with and without a
# partial last batch (60/12: even; 64/12: partial 4; 70/7: not divisible; 75/7: both), and a last
# batch of 1 sample (61/12, 71/7), which leaves every rank but rank 0 an empty slice.
SCENARIOS = [
    ("functional", "sgd", 60, 12),
    ("sequential", "adam", 75, 7),
    ("subclassed", "rmsprop", 64, 12),
    ("custom_step", "adagrad", 70, 7),
    ("functional", "adamw", 75, 7),
    ("subclassed", "adam", 70, 7),
    ("sequential", "sgd", 64, 12),
    # Embedding tables get sparse gradients, which Keras' optimizers apply to the named rows only.
    ("embedding", "adam", 75, 7),
    ("embedding", "rmsprop", 64, 12),
    ("subclassed", "rmsprop", 61, 12),
    ("custom_step", "adam", 71, 7),
    ("embedding", "adam", 71, 7),
]


def train(kind: str, opt: str, rows: int, batch: int, distributed: bool) -> dict:
    """Plain Keras (the reference) or tnt on the same data."""
    model = tnt.Model(build(kind)) if distributed else build(kind)
    model.compile(**compile_args(opt))
    # A seeded reshuffling dataset advances its order with every pass, so each run gets its own.
    # shuffle=False: the dataset shuffles itself (Keras would shuffle the batches of a PyDataset too).
    history = model.fit(dataset(rows, batch, seed=rows), epochs=3, verbose=0, shuffle=False).history
    assert isinstance(model, tnt.Model) == distributed
    plain = dataset(rows, batch, seed=rows, shuffle=False)
    return {
        "weights": model.get_weights(),
        "history": history,
        "eval": model.evaluate(plain, verbose=0, return_dict=True),
        "predict": model.predict(plain, verbose=0),
    }


def name_of(kind: str, opt: str, rows: int, batch: int) -> str:
    return f"{kind}-{opt}-{rows}-{batch}"


# BatchNormalization normalises over each rank's own slice, so it trains exactly like serial Keras
# only where every slice has the moments of its whole batch: here every full global batch is `size`
# copies of the same samples. The last batch holds 1 sample, which rank 0 alone takes, so rank 0
# normalises over what serial Keras does; the other ranks' empty slices must leave their moving
# statistics as they were. The loss is a plain mean, NaN over no samples, to show that an empty
# slice adds nothing to the loss and metrics either.
COPIES_OF, FULL_BATCHES = 4, 3


def batchnorm_data() -> object:
    x, y = arrays(COPIES_OF * FULL_BATCHES + 1, seed=5)
    parts = [
        (np.tile(x[i : i + COPIES_OF], (tnt.get_size(), 1)), np.tile(y[i : i + COPIES_OF], tnt.get_size()))
        for i in range(0, COPIES_OF * FULL_BATCHES, COPIES_OF)
    ]
    parts.append((x[-1:], y[-1:]))
    xs, ys = (np.concatenate(p) for p in zip(*parts, strict=True))
    return batches((xs, ys), COPIES_OF * tnt.get_size())


def batchnorm_model() -> keras.Model:
    keras.utils.set_random_seed(7)
    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(8, use_bias=False),  # a bias before BatchNormalization has no effect
            keras.layers.BatchNormalization(),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.05),
        loss=lambda y, p: keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, p, from_logits=True)),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
    )
    return model


def moving(model: keras.Model) -> list[float]:
    bn = next(layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization))
    return flat([bn.moving_mean.numpy(), bn.moving_variance.numpy()])


class Moving(keras.callbacks.Callback):
    """The moving statistics after every batch, on every rank."""

    def __init__(self, model: keras.Model) -> None:
        super().__init__()
        self.watched, self.seen = model, []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if BACKEND == "jax":  # Keras-JAX's fit holds the variables' values apart until asked for them
            self.watched.jax_state_sync()
        self.seen.append(moving(self.watched))


def batchnorm_train(distributed: bool) -> dict:
    inner = batchnorm_model()
    model = tnt.Model(inner) if distributed else inner
    recorder = Moving(inner)
    history = model.fit(batchnorm_data(), epochs=3, verbose=0, callbacks=[recorder], shuffle=False).history
    return {
        "history": history,
        "trainable": [v.numpy() for v in inner.trainable_variables],
        "moving": moving(inner),
        "seen": recorder.seen,
        "eval": model.evaluate(batchnorm_data(), verbose=0, return_dict=True),  # tnt: rank 0's moving statistics
        "predict": model.predict(batchnorm_data(), verbose=0),
    }


# Every rank trains every model under tnt first; then the serial references are shared out.
distributed = {name_of(*s): train(*s, distributed=True) for s in SCENARIOS}
bn_mine = batchnorm_train(distributed=True)
serial = shared_references(
    {
        **{name_of(*s): (lambda s=s: train(*s, distributed=False)) for s in SCENARIOS},
        "batchnorm": lambda: batchnorm_train(distributed=False),
    },
    # Plain Keras on fixed data: the same for every number of ranks and transport. (The batchnorm
    # reference is not: its batches hold a copy of the samples per rank.)
    reusable=[name_of(*s) for s in SCENARIOS],
)

results = {}
for scenario in SCENARIOS:
    name = name_of(*scenario)
    ref, mine = serial[name], distributed[name]
    results[name] = {
        "weights_err": worst(ref["weights"], mine["weights"]),
        "history_err": worst(ref["history"], mine["history"]),
        "epochs": len(mine["history"]["loss"]),
        "weights": flat(mine["weights"]),
        "eval_err": worst(ref["eval"], mine["eval"]),
        "predict_err": float(np.max(np.abs(ref["predict"] - mine["predict"]))),
        "predict_scale": float(np.max(np.abs(ref["predict"]))),
        "predict_rows": int(mine["predict"].shape[0]),
    }

steps = FULL_BATCHES + 1
seen = bn_mine["seen"]
last = [seen[e * steps + steps - 1] for e in range(3)]
before_last = [seen[e * steps + steps - 2] for e in range(3)]
bn_serial = serial["batchnorm"]
batchnorm = {
    "history_err": worst(bn_serial["history"], bn_mine["history"]),
    "trainable_err": worst(bn_serial["trainable"], bn_mine["trainable"]),
    "moving_err": worst([bn_serial["moving"]], [bn_mine["moving"]]),
    "moving_finite": bool(np.all(np.isfinite(seen))),
    "steps": len(seen),
    # Whether the last batch of each epoch (1 sample: rank 0's) changed this rank's moving statistics.
    "last_batch_changed": [a != b for a, b in zip(last, before_last, strict=True)],
    "eval_err": worst(bn_serial["eval"], bn_mine["eval"]),
    "predict_err": float(np.max(np.abs(bn_serial["predict"] - bn_mine["predict"]))),
    "predict_scale": float(np.max(np.abs(bn_serial["predict"]))),
    "predict_rows": int(bn_mine["predict"].shape[0]),
}

report(
    {
        "rank": tnt.get_rank(),
        "size": tnt.get_size(),
        "scenarios": results,
        "batchnorm": batchnorm,
        "transports": tnt_comm.transports(),
    }
)
