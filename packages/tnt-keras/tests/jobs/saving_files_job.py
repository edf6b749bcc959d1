"""File names, sharded weights and overwrite=False: every rank gets the same outcome."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tnt_comm
import tnt_keras as tnt
from _job import build, compile_args, dataset, max_diff, report

rank = tnt.get_rank()
files = Path(os.environ["TNT_TEST_OUT"], "files")
files.mkdir(exist_ok=True)
results: dict[str, Any] = {}


def error(call: Callable[[], Any]) -> str | None:
    """What ``call`` raised on this rank, as ``Type: message``; None if it returned."""
    try:
        call()
    except Exception as e:  # the test compares whatever was raised
        return f"{type(e).__name__}: {e}"
    return None


def trained(seed: int) -> tnt.Model:
    """A compiled model whose optimizer is built, so that loading has optimizer state to overwrite."""
    model = tnt.Model(build("functional", seed=seed))
    model.compile(**compile_args("adam"))
    model.fit(dataset(12, 12), epochs=1, verbose=0)
    return model


def optimizer_state(model: tnt.Model) -> list[np.ndarray]:
    return [np.asarray(v) for v in model.optimizer.variables]


def listing(prefix: str) -> list[str]:
    tnt_comm.barrier()  # rank 0 has finished writing
    return sorted(p.name for p in files.iterdir() if p.name.startswith(prefix))


model = tnt.Model(build("functional"))
model.compile(**compile_args("adam"))
model.fit(dataset(64, 12), epochs=2, verbose=0)
weights, state = model.get_weights(), optimizer_state(model)

# Names Keras 3 refuses (or silently changes) for weights fail up front, on every rank alike.
results["weights_keras"] = error(lambda: model.save_weights(files / "w.keras"))
results["weights_json_unsharded"] = error(lambda: model.save_weights(files / "w.weights.json"))
results["weights_h5_sharded"] = error(lambda: model.save_weights(files / "w.weights.h5", max_shard_size=1))
results["whole_h5"] = error(lambda: model.save(files / "m.h5"))
results["w_files"] = listing("w")

# load_weights still takes a whole-model .keras file, as Keras 3's does.
model.save(files / "whole.keras")
from_whole = trained(99)
from_whole.load_weights(files / "whole.keras")
results["keras_load_weights_err"] = max_diff(from_whole.get_weights(), weights)

# A sharded save: Keras' own shard names beside the index, and it loads back on every rank.
model.save_weights(files / "sharded.weights.json", max_shard_size=2.5e-7)  # about 270 bytes a shard
sharded = trained(98)
sharded.load_weights(files / "sharded.weights.json")
results["sharded_files"] = listing("sharded")
results["sharded_err"] = max_diff(sharded.get_weights(), weights)
results["sharded_state_err"] = max_diff(optimizer_state(sharded), state)
# Saved again in fewer shards, the shards that only the old index named are gone.
model.save_weights(files / "sharded.weights.json", max_shard_size=1)
resaved = trained(97)
resaved.load_weights(files / "sharded.weights.json")
results["resharded_files"] = listing("sharded")
results["resharded_err"] = max_diff(resaved.get_weights(), weights)

# overwrite=False on an existing file: every rank raises, and the ranks stay in step afterwards.
model.save_weights(files / "plain.weights.h5")
results["save_exists"] = error(lambda: model.save(files / "whole.keras", overwrite=False))
results["weights_exists"] = error(lambda: model.save_weights(files / "plain.weights.h5", overwrite=False))
results["sharded_exists"] = error(
    lambda: model.save_weights(files / "sharded.weights.json", overwrite=False, max_shard_size=1)
)
results["save_new"] = error(lambda: model.save(files / "new.keras", overwrite=False))
results["new_loads"] = max_diff(tnt.models.load_model(files / "new.keras").get_weights(), weights)
# Every rank writing its own file checks its own file: only rank 0's exists. Rank 1 writes its file and
# raises too, naming rank 0, so that no rank goes on alone.
if rank == 0:
    (files / "own-rank0.keras").write_bytes((files / "whole.keras").read_bytes())
results["own_exists"] = error(
    lambda: model.save(files / f"own-rank{rank}.keras", overwrite=False, tnt_save_all_devices=True)
)
results["in_step"] = float(tnt_comm.allreduce(np.ones(1, np.float32))[0])
results["files"] = listing("")
report(results)
