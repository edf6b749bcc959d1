"""TensorBoard with TNT_TENSORBOARD_ON_ALL_DEVICES: every rank writes under rank_<r>."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import os
from pathlib import Path

import keras
import tnt_keras as tnt
from _job import build, compile_args, dataset, report

logs = Path(os.environ["TNT_TEST_OUT"], "tb")
model = tnt.Model(build("functional"))
model.compile(**compile_args("sgd"))
board = keras.callbacks.TensorBoard(log_dir=str(logs))
model.fit(dataset(24, 12), epochs=1, verbose=0, callbacks=[board])
model.fit(dataset(24, 12), epochs=1, verbose=0, callbacks=[board])  # the same callback again
model.evaluate(dataset(24, 12), verbose=0, callbacks=[board])
tnt.callbacks.average_logs({"x": 1.0})  # a collective: both ranks are done writing after it
report({"dirs": sorted(str(p.relative_to(logs)) for p in logs.rglob("*") if p.is_dir()), "log_dir": board.log_dir})
