"""tnt.Model.save writes the wrapped Keras model: tnt loads it as a tnt.Model, Keras as the plain model.

Also loads the .keras files of an earlier tnt (tests/data), which name the wrapper, tnt>Model."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import os
import sys
from pathlib import Path

import keras
import numpy as np
import tnt_comm
import tnt_keras as tnt
from _job import build, compile_args, dataset, flat, report

files = Path(os.environ["TNT_TEST_OUT"], "files")
files.mkdir(exist_ok=True)
x = np.linspace(-2, 2, 5 * 6, dtype="float32").reshape(5, 6)
results: dict = {}

for kind in ("functional", "sequential", "subclassed"):
    model = tnt.Model(build(kind))
    model.compile(**compile_args("adam"))
    model.fit(dataset(48, 12), epochs=2, verbose=0)
    model.save(files / f"{kind}.keras")
    tnt_loaded = tnt.models.load_model(files / f"{kind}.keras")  # collective: waits for rank 0's save
    plain = keras.saving.load_model(files / f"{kind}.keras")  # Keras alone, in a process that has tnt
    if tnt.is_master_rank():  # keras.saving.save_model writes on every rank that calls it
        keras.saving.save_model(model, files / f"{kind}-direct.keras")
    direct = tnt.models.load_model(files / f"{kind}-direct.keras")
    results[kind] = {
        "weights": flat(model.get_weights()),
        "iterations": int(model.optimizer.iterations.numpy()),
        "predictions": flat(model.predict(x, verbose=0)),
        "tnt": [isinstance(tnt_loaded, tnt.Model), type(tnt_loaded.model).__name__, bool(tnt_loaded.compiled)],
        "tnt_weights": flat(tnt_loaded.get_weights()),
        "tnt_iterations": int(tnt_loaded.optimizer.iterations.numpy()),
        "plain": [type(plain).__name__, bool(plain.compiled)],
        "plain_weights": flat(plain.get_weights()),
        "direct": [isinstance(direct, tnt.Model), type(direct.model).__name__, bool(direct.compiled)],
        "direct_weights": flat(direct.get_weights()),
        "direct_iterations": int(direct.optimizer.iterations.numpy()),
    }
    # Training goes on alike from the file as from the model that wrote it.
    model.fit(dataset(24, 12, seed=3), epochs=1, verbose=0)
    tnt_loaded.fit(dataset(24, 12, seed=3), epochs=1, verbose=0)
    results[kind]["continued_equal"] = flat(model.get_weights()) == flat(tnt_loaded.get_weights())

legacy = Path(sys.argv[1])
expected = np.load(legacy / "legacy_weights.npz")
for kind in ("functional", "subclassed"):
    path = legacy / f"legacy_{kind}.keras"
    loaded = tnt.models.load_model(path)
    into = tnt.Model(build(kind, seed=11))
    into.compile(**compile_args("adam"))
    into.fit(dataset(12, 12), epochs=1, verbose=0)  # builds the optimizer; load_weights then replaces it all
    into.load_weights(path)
    want = [expected[f"{kind}_{i}"] for i in range(len(loaded.get_weights()))]
    results[f"legacy_{kind}"] = {
        "loaded": [isinstance(loaded, tnt.Model), type(loaded.model).__name__, bool(loaded.compiled)],
        "loaded_equal": all(np.array_equal(a, b) for a, b in zip(loaded.get_weights(), want, strict=True)),
        "loaded_iterations": int(loaded.optimizer.iterations.numpy()),
        "into_equal": all(np.array_equal(a, b) for a, b in zip(into.get_weights(), want, strict=True)),
        "into_iterations": int(into.optimizer.iterations.numpy()),
    }
tnt_comm.barrier()
results["files"] = sorted(p.name for p in files.iterdir())
report(results)
