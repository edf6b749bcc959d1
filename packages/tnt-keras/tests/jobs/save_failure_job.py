"""A write that fails on some ranks raises on every rank, and no rank goes on past it.

The failure: the target folder lies beneath a regular file, so creating it raises
``NotADirectoryError`` (errno 20) deterministically, also for root, whom file permissions do not stop.
Argument ``two``: every saving path on 2 ranks, rank 0 failing. ``three``: 3 ranks, every rank writing
its own file, ranks 0 and 2 failing.
"""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tnt_comm
import tnt_keras as tnt
from _job import build, compile_args, dataset, report

rank, size = tnt.get_rank(), tnt.get_size()
out = Path(os.environ["TNT_TEST_OUT"])
blocker = out / "blocker"
if rank == 0:
    blocker.write_text("a regular file: nothing can be created beneath it")
    (out / "good").mkdir()
tnt_comm.barrier()
bad, good = blocker / "sub", out / "good"
results: dict[str, Any] = {"returned": [], "in_step": []}


def attempt(name: str, call: Callable[[], Any]) -> None:
    """Runs ``call`` and records what it raised; ``returned`` lists the calls that returned here."""
    try:
        call()
    except Exception as e:  # the test compares whatever was raised
        results[name] = {
            "type": type(e).__name__,
            "message": str(e),
            "errno": getattr(e, "errno", None),
            "notes": list(getattr(e, "__notes__", [])),
        }
    else:
        results[name] = None
        results["returned"].append(name)
    # Every rank is still in step after each case: a rank left in a collective would hang or mismatch here.
    results["in_step"].append(float(tnt_comm.allreduce(np.ones(1, np.float32))[0]))


class Progress(keras.callbacks.Callback):
    """Records the epochs and batches that began, to show that no rank trains on after a failure."""

    def __init__(self) -> None:
        super().__init__()
        self.epochs: list[int] = []
        self.batches = 0

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epochs.append(epoch)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.batches += 1


def fit_with(name: str, checkpoint: keras.callbacks.Callback) -> None:
    progress = Progress()
    attempt(name, lambda: model.fit(dataset(48, 12), epochs=3, verbose=0, callbacks=[progress, checkpoint]))
    results[f"{name}_progress"] = {"epochs": progress.epochs, "batches": progress.batches}


model = tnt.Model(build("functional"))
model.compile(**compile_args("sgd"))
model.fit(dataset(24, 12), epochs=1, verbose=0)

if sys.argv[1] == "two":
    # A save that succeeds returns on no rank before the file is in place.
    attempt("save_ok", lambda: model.save(good / "ok.keras"))
    results["ok_visible"] = (good / "ok.keras").exists()
    attempt("save", lambda: model.save(bad / "m.keras"))
    attempt("weights", lambda: model.save_weights(bad / "w.weights.h5"))
    attempt("sharded", lambda: model.save_weights(bad / "w.weights.json", max_shard_size=1e-4))
    attempt("export", lambda: model.export(bad / "exported"))
    # Every rank writes its own file; rank 0 fails, rank 1 writes its file and still raises.
    own = bad / "own.keras" if rank == 0 else good / f"own-{rank}.keras"
    attempt("all_devices", lambda: model.save(own, tnt_save_all_devices=True))
    results["own_written"] = (good / f"own-{rank}.keras").exists()
    # overwrite=False with every rank on its own file: only rank 0's exists, and every rank raises.
    if rank == 0:
        (good / "exists-0.keras").write_text("kept")
    tnt_comm.barrier()
    attempt(
        "all_devices_exists",
        lambda: model.save(good / f"exists-{rank}.keras", overwrite=False, tnt_save_all_devices=True),
    )
    results["exists_kept"] = (good / "exists-0.keras").read_text() == "kept"
    # Checkpoints during fit: the failure on rank 0 stops fit on every rank at the same point.
    fit_with(
        "checkpoint_best", keras.callbacks.ModelCheckpoint(str(bad / "best.keras"), monitor="loss", save_best_only=True)
    )
    fit_with(
        "checkpoint_weights",
        keras.callbacks.ModelCheckpoint(str(bad / "w-{epoch}-{batch}.weights.h5"), save_weights_only=True, save_freq=2),
    )
    fit_with("backup", keras.callbacks.BackupAndRestore(str(bad / "backup")))
    # The ranks can go on together after all of it.
    attempt("final", lambda: model.save(good / "final.keras"))
    results["final_visible"] = (good / "final.keras").exists()
else:
    own = bad / f"own-{rank}.keras" if rank in (0, 2) else good / f"own-{rank}.keras"
    attempt("all_devices", lambda: model.save(own, tnt_save_all_devices=True))
    attempt("save", lambda: model.save(bad / "m.keras"))
report(results)
