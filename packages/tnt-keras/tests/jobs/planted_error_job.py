"""One rank fails on purpose, in the phase the test names; tnt-launch must name it, whoever exits first.

Arguments: PHASE RANK BATCH DELAY. PHASE is where rank RANK fails: ``import`` (right after ``import
tnt_keras``), ``before-fit`` (the model built and compiled, before the first collective),
``callback`` (a training callback at batch BATCH of ``fit``), ``evaluate`` (a callback of
``evaluate`` at batch BATCH), ``save`` (its write of ``model.save``, which every rank makes: the
others raise the shared outcome) or ``killed`` (SIGKILL at batch BATCH of ``fit``). Every failure
but the kill raises ValueError. With DELAY=1 the failing rank's exit is held back (an exit handler
that sleeps), so that the innocent ranks, which fail at once, exit first. Each phase runs only what
it needs (a rank's start costs more than the rest): one epoch of ``fit``, where the others wait
for the culprit, or ``evaluate`` or ``save`` of the compiled model.
"""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import atexit
import os
import signal
import sys
import time

phase, culprit, batch, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"


def fail(where: str) -> None:
    if delay:
        atexit.register(time.sleep, 4.0)  # runs before tnt-comm's exit handlers: they were registered first
    raise ValueError(f"planted in {where} on rank {culprit}")


import keras  # noqa: E402
import tnt_keras as tnt  # noqa: E402
from _job import build, compile_args, dataset  # noqa: E402

mine = tnt.get_rank() == culprit
if phase == "import" and mine:
    fail("import")


class Planted(keras.callbacks.Callback):
    """Runs on every rank (a plain callback); fails on the culprit only."""

    def on_train_batch_end(self, index: int, logs: object = None) -> None:
        if mine and index == batch:
            if phase == "killed":
                os.kill(os.getpid(), signal.SIGKILL)
            if phase == "callback":
                fail(f"a training callback at batch {batch}")

    def on_test_batch_end(self, index: int, logs: object = None) -> None:
        if mine and phase == "evaluate" and index == batch:
            fail(f"evaluate at batch {batch}")


model = tnt.Model(build("functional"))
model.compile(**compile_args("sgd"))
if phase == "before-fit" and mine:
    fail("the model's set-up, before the first collective")
if phase in ("import", "before-fit", "callback", "killed"):  # the others need the culprit in fit
    model.fit(dataset(96, 12), epochs=1, verbose=0, callbacks=[Planted()])
if phase == "evaluate":
    model.evaluate(dataset(96, 12), verbose=0, callbacks=[Planted()])
if phase == "save":
    if mine:
        # The culprit's own write fails: keras' save_model, which tnt's save calls on every rank here.
        def broken_save(*args: object, **kwargs: object) -> None:
            fail("save")

        keras.saving.save_model = broken_save
    folder = os.environ["TNT_TEST_OUT"]
    model.save(os.path.join(folder, f"model-{tnt.get_rank()}.keras"), tnt_save_all_devices=True)
print(f"rank {tnt.get_rank()} done")
