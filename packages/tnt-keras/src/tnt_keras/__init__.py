"""tnt-keras: data-parallel training of Keras 3 models on many ranks.

    import tnt_keras as tnt

    model = tnt.Model(keras_model)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(train_ds.batch(256), epochs=3)       # batched with the GLOBAL batch size

Start the script with ``tnt-launch -n 4 -- train.py``. Importing this package connects the ranks (a
plain ``python train.py`` is one rank); each rank then trains on its slice of every global batch and
the result equals serial training with that global batch.
"""

from __future__ import annotations

import tnt_comm

from .runtime import setup_logging

setup_logging()  # first, so that building the TF op logs in tnt's format and only on the master rank

from . import backends, callbacks, models, preemption, timeline  # noqa: E402
from .model import Model  # noqa: E402
from .preemption import preempted  # noqa: E402
from .runtime import get_local_rank, get_master_rank, get_rank, get_size, is_master_rank, membership  # noqa: E402
from .sync_batch_norm import SyncBatchNormalization  # noqa: E402

__all__ = [
    "Model",
    "SyncBatchNormalization",
    "callbacks",
    "get_local_rank",
    "get_master_rank",
    "get_rank",
    "get_size",
    "is_master_rank",
    "membership",
    "models",
    "preempted",
    "timeline",
]

__version__ = "0.1.0"

tnt_comm.init()
# SIGUSR1 (a preemption warning) becomes a checkpoint from now on, never the end of the rank.
preemption.install()
backends.current().prepare()
