"""Rank 1 dies by SIGKILL in the middle of fit; the others must not hang."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import os
import signal

import keras
import tnt_keras as tnt
from _job import build, compile_args, dataset


class Die(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 2 and tnt.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)


model = tnt.Model(build("functional"))
model.compile(**compile_args("adam"))
model.fit(dataset(600, 12), epochs=50, verbose=0, callbacks=[Die()])
