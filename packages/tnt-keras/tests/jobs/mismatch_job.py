"""Ranks that disagree, on purpose: a different model on rank 1, or different numbers of steps;
or rank 1 leaving in the middle of fit (exit code 0, without finalizing).

Every rank reports the error it got; none may hang.
"""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import os
import sys
import time
from pathlib import Path

import keras
import tnt_keras as tnt
from _job import CLASSES, FEATURES, build, compile_args, dataset, report

case = sys.argv[1]
error = None
fields = None  # the error's data (tnt_comm's errors carry it)
try:
    if case == "model":
        width = 8 if tnt.get_rank() == 0 else 9
        inner = keras.Sequential(
            [keras.Input((FEATURES,)), keras.layers.Dense(width, activation="relu"), keras.layers.Dense(CLASSES)]
        )
        model = tnt.Model(inner)
        model.compile(**compile_args("sgd"))
        model.fit(dataset(60, 12), epochs=1, verbose=0)
    elif case == "leave":

        def leave(batch: int, logs: object) -> None:
            if tnt.get_rank() == 1 and batch == 1:
                report({"rank": 1, "error": None})
                os._exit(0)

        model = tnt.Model(build("functional"))
        model.compile(**compile_args("sgd"))
        model.fit(
            dataset(120, 12),
            epochs=2,
            verbose=0,
            callbacks=[tnt.callbacks.Callback(keras.callbacks.LambdaCallback(on_train_batch_end=leave))],
        )
    else:  # steps: undistributed datasets of different lengths
        model = tnt.Model(build("functional"))
        model.compile(**compile_args("sgd"))
        rows = 60 if tnt.get_rank() == 0 else 84
        model.fit(dataset(rows, 12), epochs=2, verbose=0, tnt_distribute_dataset=False)
except Exception as e:  # noqa: BLE001 - the test reads what each rank got
    error = f"{type(e).__module__}.{type(e).__name__}: {e} (cause: {type(e.__cause__).__name__})"
    fields = {name: getattr(e, name, None) for name in ("ranks", "operation", "call", "mine", "theirs")}
    fields["ranks"] = list(fields["ranks"] or [])
report({"rank": tnt.get_rank(), "error": error, "fields": fields})
# A rank that raised waits (a while) for the others' reports before it exits: tnt-launch stops the
# job at the first failed exit, and the test reads every rank's error, not the exit order's winner.
# A rank that hangs instead of raising still fails the test: it reports nothing.
deadline = time.monotonic() + 40
reports = [Path(os.environ["TNT_TEST_OUT"], f"rank{r}.json") for r in range(tnt.get_size())]
while error and not all(p.exists() for p in reports) and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(1 if error else 0)
