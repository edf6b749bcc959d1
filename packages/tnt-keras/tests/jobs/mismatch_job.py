"""Ranks that disagree, on purpose: a different model on rank 1, or different numbers of steps;
or rank 1 leaving in the middle of fit (exit code 0, without finalizing).

Every rank reports the error it got; none may hang.
"""

import os
import sys

import keras
import tnt_keras as tnt
from _job import CLASSES, FEATURES, build, compile_args, dataset, report

case = sys.argv[1]
error = None
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
report({"rank": tnt.get_rank(), "error": error})
sys.exit(1 if error else 0)
