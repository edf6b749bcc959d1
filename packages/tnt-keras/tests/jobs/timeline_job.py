"""A short fit and a save under `tnt-launch --timeline FILE` (TNT_TIMELINE from the start), then the
same through the Python API: tnt.timeline.start(...) and stop(), then a trace that cannot be written."""

import os
import sys

# Rank 1 on a clock of its own, as on another host: with TNT_TEST_CLOCK_SHIFT_S set, it runs again in
# a time namespace whose monotonic clock is that far ahead (unshare execs it: the PID stays).
if os.environ.get("TNT_TEST_CLOCK_SHIFT_S") and os.environ["TNT_RANK"] == "1" and "TNT_TEST_SHIFTED" not in os.environ:
    os.environ["TNT_TEST_SHIFTED"] = "1"
    shift = os.environ["TNT_TEST_CLOCK_SHIFT_S"]
    os.execvp("unshare", ["unshare", "--time", f"--monotonic={shift}", sys.executable, *sys.argv])

import _quick_start  # noqa: F401, I001, E402  (first of the rest: the collector waits out the imports)
import time  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tnt_keras as tnt  # noqa: E402
from _job import CLASSES, FEATURES, report  # noqa: E402

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
model.save_weights(os.path.join(os.environ["TNT_TEST_OUT"], "m.weights.h5"))  # written again: with the save

second = sys.argv[1]
tnt.timeline.start(second)
model.fit(x, y, batch_size=32, epochs=1, verbose=0)
tnt.timeline.stop()

# A trace that cannot be written (its folder gone once the timeline started): rank 0 warns at the
# end of fit and after the save, and the job goes on; the save itself is written.
gone = os.path.join(os.environ["TNT_TEST_OUT"], "gone")
tnt.timeline.start(os.path.join(gone, "third.json"))
model.fit(x, y, batch_size=32, epochs=1, verbose=0)
model.save_weights(os.path.join(os.environ["TNT_TEST_OUT"], "after.weights.h5"))
tnt.timeline.stop()
report({"rank": tnt.get_rank(), "monotonic_s": time.monotonic()})
