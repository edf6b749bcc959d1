"""What the tests on the cluster of network namespaces (``netns_cluster.py``) share: its shape, 3 hosts
of 2 ranks each, tnt-launch started on host 0, the Keras training job, and the checks that a job left
nothing behind on any host. The cluster itself is ``conftest.py``'s fixture."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import psutil
import pytest
from netns_cluster import Cluster

HOSTS = 3
PER_HOST = 2
# auto: shared memory within a host, TCP between hosts; gpi2: GPI-2 for every pair.
TRANSPORTS = ["auto", "gpi2"]


def transport_args(transport: str) -> tuple[str, ...]:
    """tnt-launch's arguments for ``transport``; skips, saying why, where tnt_comm lacks it."""
    if transport == "gpi2":
        import tnt_comm

        if "gpi2" not in tnt_comm.build_info()["transports"]:
            pytest.skip("this tnt_comm has no GPI-2 transport: build it with GPI2_ROOT set (docs/comm.md)")
    return ("--transport", transport)


def launch_argv(c: Cluster, hosts: int, tmp_path: Path, *args: str, spares: int = 0) -> list[str]:
    """tnt-launch on host 0 over the first ``hosts`` hosts, then ``spares`` spare hosts (for an
    elastic job's replacements), each with PER_HOST slots, and ``args``."""
    hostfile = tmp_path / "hostfile"
    lines = [f"{c.address(i)} slots={PER_HOST}" + (" spare" if i >= hosts else "") for i in range(hosts + spares)]
    hostfile.write_text("".join(line + "\n" for line in lines))
    launch = [sys.executable, "-m", "tnt_launch", "--hostfile", str(hostfile), "--ssh-port", "22", "--no-gpu"]
    return c.command(0, [*launch, *args])


def env(c: Cluster) -> dict[str, str]:
    return dict(os.environ, TNT_SSH_OPTS=c.ssh_options)


def job_processes(marker: str) -> list[psutil.Process]:
    """Live processes whose command line names ``marker`` (a script path unique to one test)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in p.info["cmdline"] or ()) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            pass
    return found


def tnt_shm(cluster: Cluster) -> set[str]:
    """tnt's segments in the /dev/shm of every host (each host has its own), as 'HOST:NAME'."""
    return {
        f"{i}:{f}"
        for i in range(HOSTS)
        for f in os.listdir(cluster.path(i, "/dev/shm"))
        if re.fullmatch(r"tnt-\w+-\d+", f)
    }


def assert_gone(cluster: Cluster, marker: str, shm_before: set[str], within: float) -> None:
    """No process of the job and no new tnt segment in any host's /dev/shm remain."""
    deadline = time.monotonic() + within
    while (job_processes(marker) or tnt_shm(cluster) - shm_before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not job_processes(marker), [p.info["cmdline"] for p in job_processes(marker)]
    assert not tnt_shm(cluster) - shm_before


TRAIN = r"""
# Python's garbage collector waits out the imports (TensorFlow's 270,000 objects, some 600
# collections over them, 0.4 of the import's 3.6 CPU-s), whose objects are then frozen out of
# later collections: 4-6 ranks of this share 2 cores.
import gc
gc.disable()
import numpy as np, keras, tnt_comm, tnt_keras as tnt
gc.freeze()
gc.enable()

x = np.random.RandomState(0).rand(96, 8).astype("float32")
y = (x.sum(axis=1) > 4).astype("float32")


def build():
    # The middle kernel (128 KiB) is summed by the host-aware allreduce, the small ones by one-shot.
    keras.utils.set_random_seed(7)
    layers = [keras.layers.Dense(512, activation="relu"), keras.layers.Dense(64, activation="relu")]
    return keras.Sequential([keras.Input((8,)), *layers, keras.layers.Dense(1)])


model = tnt.Model(build())
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
model.fit(x, y, batch_size=24, epochs=2, shuffle=False, verbose=0)
# The serial reference, trained once (rank 0) and sent to every rank: 4-6 ranks share 2 cores here.
serial = build()
if tnt_comm.rank() == 0:
    serial.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    serial.fit(x, y, batch_size=24, epochs=2, shuffle=False, verbose=0)
reference = [tnt_comm.broadcast(w) for w in serial.get_weights()]
diff = max(float(np.abs(a - b).max()) for a, b in zip(reference, model.get_weights(), strict=True))
print(f"RESULT rank {tnt_comm.rank()} diff {diff:.3g}", flush=True)
# Across hosts the sums are taken in another order (hosts first): 3e-8 was measured.
assert diff < 1e-6, diff
"""
