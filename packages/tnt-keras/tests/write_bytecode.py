"""Writes bytecode (.pyc) for the framework, Keras and tnt modules the tests' ranks import.

TensorFlow, torch and JAX are installed with pip's --no-compile, which leaves their thousands of
never-imported modules without bytecode. Where PYTHONDONTWRITEBYTECODE is set (as on our CI
machines), Python then compiles their modules from source in every process: `import tensorflow`
took 9.3 s of CPU instead of 4.1 s, and `import torch, keras` on the torch backend 16 s instead of
5.4 s (torch imports SymPy), in each of the ~150 ranks the suite starts. Run once per backend with
bytecode writing on (KERAS_BACKEND chooses: TensorFlow by default), this script imports and
exercises what the jobs use, so that exactly those modules get their .pyc files.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

if sys.dont_write_bytecode:
    raise SystemExit("write_bytecode.py: run it with PYTHONDONTWRITEBYTECODE unset and without -B")

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
BACKEND = os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# Autograph writes a module per traced function into the temporary folder and deletes it at exit,
# but not the bytecode written beside it (/tmp/__pycache__, a few files per run): a folder of our
# own goes with everything in it.
workdir = tempfile.TemporaryDirectory(prefix="tnt-write-bytecode-")
tempfile.tempdir = workdir.name

import h5py  # noqa: E402, F401
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tnt_keras as tnt  # noqa: E402

x, y = np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3), np.arange(8, dtype=np.int32) % 2
if BACKEND == "tensorflow":
    import tensorflow as tf
    from tnt_keras.backends.tensorflow.ops import _build

    # Run on the source tree (as the jobs import it, without a prebuilt op), this also fills the op
    # cache up front, so that the first test does not pay for the compile.
    print("TensorFlow op:", _build.build())
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(8, seed=1).batch(4)
elif BACKEND == "jax":  # a PyDataset, as the jobs give fit on backends without tf.data
    from tnt_keras.backends.jax import native

    # The handler's cache too: the first test does not pay for its compile (and says so if it fails).
    print("JAX handler:", native.library_path(native.compiler()) if native.chosen() else "unavailable")

    class Batches(keras.utils.PyDataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
            return x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4]

    data = Batches()
else:  # torch: a DataLoader, as test_host_inputs.py's job gives fit
    import torch
    import torch.utils.data

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), 4)

# The lazily imported parts: tracing of fit/evaluate/predict, the inputs, callbacks, saving formats.
inputs = keras.Input((3,))
model = tnt.Model(keras.Model(inputs, keras.layers.Dense(2)(keras.layers.BatchNormalization()(inputs))))
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
with tempfile.TemporaryDirectory() as tmp:
    callbacks = [
        keras.callbacks.TensorBoard(str(Path(tmp, "tb"))),
        keras.callbacks.CSVLogger(str(Path(tmp, "log.csv"))),
        keras.callbacks.ModelCheckpoint(str(Path(tmp, "ckpt.keras"))),
        keras.callbacks.EarlyStopping(monitor="loss"),
    ]
    model.fit(data, epochs=1, verbose=2, callbacks=callbacks, validation_data=data)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    model.evaluate(data, verbose=0)
    model.predict(data, verbose=0)
    model.save(Path(tmp, "m.keras"))
    model.save_weights(Path(tmp, "m.weights.h5"))
    tnt.models.load_model(Path(tmp, "m.keras"))
    keras.models.load_model(Path(tmp, "m.keras"))
    if BACKEND == "tensorflow":  # Keras' export fails on torch for these models (docs/keras.md)
        model.export(str(Path(tmp, "exported")), verbose=False)
print(f"bytecode written for the modules tnt's tests import on {BACKEND}")
workdir.cleanup()
