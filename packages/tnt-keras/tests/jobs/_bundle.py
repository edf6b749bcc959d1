"""Runs several job scripts one after another in the same ranks (tests/launch.py: BUNDLES).

A rank's start costs more CPU than most jobs' own work: Python, TensorFlow or torch, Keras and tnt
import, and Keras' first fit loads and sets up what it uses (a 2-rank job that fits one small model
takes 10 CPU-s on TensorFlow and 16 on torch, and a second model in it adds under one). Jobs on the
same number of ranks and backend, with no launcher options and nothing read at the ranks' start
that differs between them, therefore run here in one launch, each as if started alone: its own
TNT_TEST_OUT folder and arguments, its environment additions, a fresh Keras session and unseeded
random generators. Every rank runs the same scripts in the same order and meets the others at a
barrier after each, so every job starts with all ranks at the same point of the program, as in a
job of its own.

An exception ends the rank as it ends a job: the launcher stops the others, and the tests read which
jobs finished from the ``done`` file each leaves in its folder.
"""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import json
import os
import random
import runpy
import sys
from pathlib import Path

import keras
import numpy as np
import tnt_comm


def unseeded() -> None:
    """Random state as a new process starts with it, different on every rank: an earlier job's
    keras.utils.set_random_seed left the same on all (Keras' own seed goes with its session)."""
    random.seed()
    np.random.seed()
    if "tensorflow" in sys.modules:
        sys.modules["tensorflow"].random.set_seed(None)
    if "torch" in sys.modules:
        sys.modules["torch"].seed()


entries = json.loads(Path(sys.argv[1]).read_text())
rank = tnt_comm.rank()
for entry in entries:
    if rank == 0:
        print(f"tnt-bundle: {entry['name']} starts", flush=True)
    saved = {name: os.environ.get(name) for name in entry["env"]}
    os.environ.update(entry["env"])
    os.environ["TNT_TEST_OUT"] = entry["out"]
    sys.argv = [entry["script"], *entry["args"]]
    keras.backend.clear_session()  # layer names, uids, graphs and Keras' seed as in a new process
    unseeded()
    runpy.run_path(entry["script"], run_name="__main__")
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    tnt_comm.barrier()  # every rank finished this job (and wrote its report) before the next starts
    if rank == 0:
        Path(entry["out"], "done").touch()
