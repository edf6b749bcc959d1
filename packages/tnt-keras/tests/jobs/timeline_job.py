"""A short fit and a save under `tnt-launch --timeline FILE` (TNT_TIMELINE from the start), then the
same through the Python API: tnt.timeline.start(...) and stop()."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import os
import sys

import keras
import numpy as np
import tnt_keras as tnt
from _job import CLASSES, FEATURES, report

keras.utils.set_random_seed(3)
rng = np.random.default_rng(0)
x = rng.normal(size=(96, FEATURES)).astype("float32")
y = rng.integers(0, CLASSES, size=96).astype("int32")
inner = keras.Sequential(
    [keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(CLASSES)]
)
model = tnt.Model(inner)
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=32, epochs=2, verbose=0)  # the trace is written at the end of every fit
model.save_weights(os.path.join(os.environ["TNT_TEST_OUT"], "m.weights.h5"))
tnt.timeline.stop()  # and at stop(): now with the save

second = sys.argv[1]
tnt.timeline.start(second)
model.fit(x, y, batch_size=32, epochs=1, verbose=0)
tnt.timeline.stop()
report({"rank": tnt.get_rank()})
