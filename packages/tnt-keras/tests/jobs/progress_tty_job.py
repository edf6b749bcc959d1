"""fit and evaluate with verbose left at "auto", for the tests of progress in a terminal and in a pipe."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import os

import tnt_keras as tnt
from _job import build, compile_args, dataset, report

model = tnt.Model(build("functional"))
model.compile(**compile_args("sgd"))
model.fit(dataset(48, 12), epochs=1)
model.evaluate(dataset(48, 12))
report({"stdout_tty": os.environ.get("TNT_STDOUT_TTY")})
