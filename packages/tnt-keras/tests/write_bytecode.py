"""Writes bytecode (.pyc) for the TensorFlow, Keras and tnt modules the tests' ranks import.

TensorFlow is installed with pip's --no-compile, which leaves its thousands of never-imported modules
without bytecode. Where PYTHONDONTWRITEBYTECODE is set (as on our CI machines), Python then compiles
TensorFlow's modules from source in every process: `import tensorflow` took 9.3 s of CPU instead of
4.1 s, in each of the ~150 ranks the suite starts. Run once with bytecode writing on, this script
imports and exercises what the jobs use, so that exactly those modules get their .pyc files.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

if sys.dont_write_bytecode:
    raise SystemExit("write_bytecode.py: run it with PYTHONDONTWRITEBYTECODE unset and without -B")

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Autograph writes a module per traced function into the temporary folder and deletes it at exit,
# but not the bytecode written beside it (/tmp/__pycache__, a few files per run): a folder of our
# own goes with everything in it.
workdir = tempfile.TemporaryDirectory(prefix="tnt-write-bytecode-")
tempfile.tempdir = workdir.name

import h5py  # noqa: E402, F401
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tnt_keras as tnt  # noqa: E402
from tnt_keras.ops import _build  # noqa: E402

# Run on the source tree (as the jobs import it, without a prebuilt op), this also fills the op
# cache up front, so that the first test does not pay for the compile.
print("TensorFlow op:", _build.build())

# The lazily imported parts: tracing of fit/evaluate/predict, tf.data, callbacks, saving formats.
x, y = np.zeros((8, 3), np.float32), np.zeros(8, np.int32)
data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(8, seed=1).batch(4)
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
    model.evaluate(data, verbose=0)
    model.predict(data, verbose=0)
    model.save(Path(tmp, "m.keras"))
    model.save_weights(Path(tmp, "m.weights.h5"))
    tnt.models.load_model(Path(tmp, "m.keras"))
    keras.models.load_model(Path(tmp, "m.keras"))
    model.export(str(Path(tmp, "exported")), verbose=False)
print("bytecode written for the modules tnt's tests import")
workdir.cleanup()
