"""Every Keras callback under tnt against the same callbacks in serial Keras."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import contextlib
import http.server
import io
import json
import os
import sys
import threading
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
import tnt_keras as tnt
from _job import arrays, build, compile_args, dataset, flat, max_diff, report

rank, size = tnt.get_rank(), tnt.get_size()
out = Path(os.environ["TNT_TEST_OUT"])
shared = out / "files"  # the same directory for every rank, as on a shared file system
shared.mkdir(exist_ok=True)
results: dict = {}


def pair(kind: str = "functional", opt: str = "adam"):
    serial = build(kind)
    serial.compile(**compile_args(opt))
    model = tnt.Model(build(kind))
    model.compile(**compile_args(opt))
    return serial, model


# History, CSVLogger, LearningRateScheduler, ReduceLROnPlateau, EarlyStopping, ModelCheckpoint.
def schedule(epoch: int, lr: float) -> float:
    return lr * 0.5 if epoch >= 1 else lr


serial, model = pair()
serial_cbs = [
    keras.callbacks.LearningRateScheduler(schedule),
    keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=10.0),
    keras.callbacks.EarlyStopping(monitor="loss", patience=1, min_delta=0.05),
    keras.callbacks.CSVLogger(str(out / "serial.csv")),
]
tnt_cbs = [
    keras.callbacks.LearningRateScheduler(schedule, verbose=1),
    keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=10.0),
    keras.callbacks.EarlyStopping(monitor="loss", patience=1, min_delta=0.05, verbose=1),
    keras.callbacks.CSVLogger(str(shared / "tnt.csv")),
    keras.callbacks.ModelCheckpoint(str(shared / "ckpt-{epoch}.keras")),
    keras.callbacks.ModelCheckpoint(
        str(shared / "best.weights.h5"), save_weights_only=True, save_best_only=True, monitor="loss"
    ),
]
sh = serial.fit(dataset(75, 7, seed=3), epochs=8, shuffle=False, verbose=0, callbacks=serial_cbs).history
captured = io.StringIO()
with contextlib.redirect_stdout(captured):
    th = model.fit(dataset(75, 7, seed=3), epochs=8, shuffle=False, verbose=1, callbacks=tnt_cbs).history
printed = captured.getvalue()
results["history"] = {
    "epochs_serial": len(sh["loss"]),
    "epochs_tnt": len(th["loss"]),
    "history_err": max(abs(a - b) for k in sh for a, b in zip(sh[k], th[k], strict=True)),
    "weights_err": max_diff(serial.get_weights(), model.get_weights()),
    "lr": float(np.asarray(model.optimizer.learning_rate)),
    "lr_serial": float(np.asarray(serial.optimizer.learning_rate)),
    "printed_progress": "loss" in printed,
    "printed_early_stopping": "early stopping" in printed.lower(),
}
tnt.callbacks  # noqa: B018  (the package exposes the module)
# Only rank 0 wrote files; rank 0 compares them once every rank is done with fit.
if rank == 0:
    results["csv_equal"] = (out / "serial.csv").read_text().splitlines()[0] == (
        shared / "tnt.csv"
    ).read_text().splitlines()[0]
    serial_rows = [r.split(",") for r in (out / "serial.csv").read_text().splitlines()[1:]]
    tnt_rows = [r.split(",") for r in (shared / "tnt.csv").read_text().splitlines()[1:]]
    results["csv_err"] = max(
        0.0 if a == b else abs(float(a) - float(b))
        for ra, rb in zip(serial_rows, tnt_rows, strict=True)
        for a, b in zip(ra, rb, strict=True)
    )
# load_model is collective (every rank loads, then takes rank 0's values).
last = tnt.models.load_model(shared / f"ckpt-{len(th['loss'])}.keras")
results["checkpoint_is_tnt"] = isinstance(last, tnt.Model)
results["checkpoint_err"] = max_diff(last.get_weights(), model.get_weights())
results["files"] = sorted(p.name for p in shared.iterdir())


# TerminateOnNaN: a NaN in one sample of the second batch (on one rank only) stops every rank there.
def nan_data():
    x, y = arrays(60)
    x[15, 0] = np.nan
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(12)


serial, model = pair("sequential", "sgd")
sh = serial.fit(nan_data(), epochs=3, shuffle=False, verbose=0, callbacks=[keras.callbacks.TerminateOnNaN()]).history
th = model.fit(nan_data(), epochs=3, shuffle=False, verbose=0, callbacks=[keras.callbacks.TerminateOnNaN()]).history
results["nan"] = {"serial_epochs": len(sh["loss"]), "tnt_epochs": len(th["loss"]), "stopped": model.stop_training}


# BackupAndRestore: a crash in epoch 3 and a second fit resume to the uninterrupted result.
class Crash(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 2:
            raise RuntimeError("simulated crash")


serial, model = pair("functional", "sgd")
serial.fit(dataset(60, 12, shuffle=False), epochs=4, shuffle=False, verbose=0)
backup = keras.callbacks.BackupAndRestore(str(shared / "backup"))
try:
    model.fit(dataset(60, 12, shuffle=False), epochs=4, shuffle=False, verbose=0, callbacks=[backup, Crash()])
except RuntimeError:
    pass
resumed = model.fit(dataset(60, 12, shuffle=False), epochs=4, shuffle=False, verbose=0, callbacks=[backup])
results["backup"] = {
    "resumed_epochs": len(resumed.history["loss"]),
    "weights_err": max_diff(serial.get_weights(), model.get_weights()),
    "backup_left": (shared / "backup").exists(),
}


# LambdaCallback, a custom callback, and tnt.callbacks.Callback's two switches.
class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch_logs, self.batches, self.model_type = [], 0, None

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))
        self.model_type = type(self.model).__name__


class AddLocal(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        logs["local"] = float(rank)


calls = {"lambda": 0}
plain, averaged, local, master_only = Record(), Record(), Record(), Record()
serial, model = pair("functional", "rmsprop")
serial_record = Record()
serial.fit(dataset(64, 12), epochs=2, shuffle=False, verbose=0, callbacks=[serial_record])
model.fit(
    dataset(64, 12),
    epochs=2,
    shuffle=False,
    verbose=0,
    callbacks=[
        keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: calls.__setitem__("lambda", calls["lambda"] + 1)
        ),
        plain,
        tnt.callbacks.Callback(AddLocal(), aggregate_logs=False),
        tnt.callbacks.Callback(averaged, aggregate_logs=True),
        tnt.callbacks.Callback(local, aggregate_logs=False),
        tnt.callbacks.Callback(master_only, aggregate_logs=False, run_on_all_ranks=False),
    ],
)
results["custom"] = {
    "lambda_calls": calls["lambda"],
    "plain_logs_err": max(
        abs(a[k] - b[k]) for a, b in zip(plain.epoch_logs, serial_record.epoch_logs, strict=True) for k in a
    ),
    "plain_model": plain.model_type,
    "averaged_local": [logs["local"] for logs in averaged.epoch_logs],
    "local_local": [logs["local"] for logs in local.epoch_logs],
    "master_only_epochs": len(master_only.epoch_logs),
    "master_only_batches": master_only.batches,
    "plain_batches": plain.batches,
}


# RemoteMonitor talks to a server only from rank 0; TensorBoard writes only on rank 0.
class Handler(http.server.BaseHTTPRequestHandler):
    posts = 0

    def do_POST(self):
        Handler.posts += 1
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
serial, model = pair()
model.fit(
    dataset(60, 12),
    epochs=2,
    shuffle=False,
    verbose=0,
    callbacks=[
        keras.callbacks.RemoteMonitor(root=f"http://127.0.0.1:{server.server_port}"),
        keras.callbacks.TensorBoard(log_dir=str(shared / "tb")),
    ],
)
server.shutdown()
results["remote_posts"] = Handler.posts
results["tensorboard_dirs"] = sorted(
    str(p.relative_to(shared / "tb")) for p in (shared / "tb").rglob("*") if p.is_dir()
)
results["weights"] = flat(model.get_weights())


# Keras' own check (CallbackList, with keras.utils.is_default on every batch-end hook) of whether
# batch-end hooks may run asynchronously: tnt's wrappers keep that for callbacks without batch hooks
# and turn it off for those with one. Keras skips the check on TensorFlow (its backend is not marked
# thread safe), so the check runs here as on a backend that is.
def keras_async(callbacks, wrap=True):
    from keras.src import backend

    thread_safe, backend.IS_THREAD_SAFE = backend.IS_THREAD_SAFE, True
    try:
        listed = keras.callbacks.CallbackList(tnt.callbacks.wrap_all(callbacks, model) if wrap else callbacks)
    finally:
        backend.IS_THREAD_SAFE = thread_safe
    return [listed._async_train, listed._async_test, listed._async_predict]


no_batch_hooks = [
    keras.callbacks.EarlyStopping(),
    keras.callbacks.CSVLogger(str(out / "unused.csv")),
    keras.callbacks.History(),
    keras.callbacks.ModelCheckpoint(str(out / "unused.keras")),
    keras.callbacks.BackupAndRestore(str(out / "unused-backup")),
    keras.callbacks.LearningRateScheduler(schedule),
    keras.callbacks.ReduceLROnPlateau(),
    keras.callbacks.RemoteMonitor(),
    tnt.callbacks.Callback(AddLocal()),
]
results["async"] = {
    "plain_early_stopping": keras_async([keras.callbacks.EarlyStopping()], wrap=False),
    "early_stopping": keras_async([keras.callbacks.EarlyStopping()]),
    "no_batch_hooks": keras_async(no_batch_hooks),
    "record": keras_async([Record()]),
    "terminate_on_nan": keras_async([keras.callbacks.TerminateOnNaN()]),
    "checkpoint_every_5": keras_async([keras.callbacks.ModelCheckpoint(str(out / "unused.keras"), save_freq=5)]),
}
print(json.dumps({"rank": rank}), file=sys.stderr)
report(results)
