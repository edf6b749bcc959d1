"""Jobs on a cluster of network namespaces (``netns_cluster.py``): separate network stacks joined by
a bridge, one sshd per host, tnt-launch started on host 0. Collectives and Keras training across
hosts over tcp and over gpi2, and the failures a cluster has that one machine has not: a killed rank on another
host, a cut link, leftovers on every host."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from netns_cluster import Cluster, ClusterUnavailable, up

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    try:
        c = up(HOSTS)
    except ClusterUnavailable as e:
        print(f"SKIP cluster tests: {e}")
        pytest.skip(str(e))
    try:
        yield c
    finally:
        c.down()


def launch_argv(c: Cluster, hosts: int, tmp_path: Path, *args: str) -> list[str]:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{c.address(i)} slots={PER_HOST}\n" for i in range(hosts)))
    launch = [sys.executable, "-m", "tnt_launch", "--hostfile", str(hostfile), "--ssh-port", "22", "--no-gpu"]
    return c.command(0, [*launch, *args])


def env(c: Cluster) -> dict[str, str]:
    return dict(os.environ, TNT_SSH_OPTS=c.ssh_options)


def run_job(
    c: Cluster, hosts: int, transport: str, tmp_path: Path, code: str, timeout_s: int, wait_s: float
) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` on ``hosts`` hosts x PER_HOST ranks over ``transport``, every rank's output shown."""
    script = tmp_path / "job.py"
    script.write_text(code)
    args = (*transport_args(transport), "--output-on-all-devices", "--timeout", str(timeout_s), "--", str(script))
    argv = launch_argv(c, hosts, tmp_path, *args)
    return subprocess.run(argv, env=env(c), capture_output=True, text=True, timeout=wait_s, check=False)


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


COLLECTIVES = r"""
import numpy as np, tnt_comm as tc

r, n = tc.rank(), tc.size()
local = int(__import__("os").environ["TNT_LOCAL_SIZE"])
gpi2 = __import__("os").environ["TNT_TRANSPORT"] == "gpi2"
kinds = tc.transports()
for peer, kind in enumerate(kinds):
    same_host = peer // local == r // local
    assert kind == ("self" if peer == r else "gpi2" if gpi2 else "shm" if same_host else "tcp"), (r, kinds)
for dtype in (np.float32, np.float64, np.int64):
    for count in (1, 1000, 3 << 20):  # up to 24 MiB of float64: many frames on every link
        x = (np.arange(count) % 97 + r).astype(dtype)
        want = (np.arange(count) % 97 * n + n * (n - 1) // 2).astype(dtype)
        assert np.array_equal(tc.allreduce(x), want), (r, dtype, count)
# The host-aware allreduce ran: in float32 1e8 + 1 == 1e8, so these values sum to 1 in rank order
# and to 0 when each host sums first (see packages/tnt-comm/tests/test_host_aware.py).
values = [1e8, 1.0, -1e8, 1.0] + [0.0] * (n - 4)
assert (tc.allreduce(np.full(100_000, values[r], np.float32)) == 0.0).all()
for root in range(n):
    b = np.full(5000, r, np.int64)
    tc.broadcast(b, root=root)
    assert (b == root).all(), (r, root)
assert tc.allgather(np.array([r, r * r])).tolist() == [[k, k * k] for k in range(n)]
print(f"OK rank {r} of {n}: {kinds}", flush=True)
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("hosts", [2, 3])
def test_collectives_exact_across_hosts(cluster: Cluster, hosts: int, transport: str, tmp_path: Path) -> None:
    done = run_job(cluster, hosts, transport, tmp_path, COLLECTIVES, timeout_s=60, wait_s=150)
    assert done.returncode == 0, done.stdout + done.stderr
    n = hosts * PER_HOST
    for r in range(n):
        assert f"OK rank {r} of {n}" in done.stdout, done.stdout + done.stderr


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


@pytest.mark.timeout(400)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("hosts", [2, 3])
def test_keras_training_equals_serial_across_hosts(
    cluster: Cluster, hosts: int, transport: str, tmp_path: Path
) -> None:
    """2 and 3 hosts x 2 ranks train a global batch of 24 as one process does."""
    done = run_job(cluster, hosts, transport, tmp_path, TRAIN, timeout_s=120, wait_s=380)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert len(re.findall(r"RESULT rank \d diff", done.stdout)) == hosts * PER_HOST, done.stdout


LOOP = r"""
import os, signal, sys, time, numpy as np, tnt_comm as tc

x = np.ones(1 << 16, np.float32)
calls = 0
while True:
    tc.allreduce(x)
    calls += 1
    if calls == 30:
        print(f"RUNNING rank {tc.rank()}", flush=True)
        if tc.rank() == 0:
            open(sys.argv[1], "w").close()
    if calls == 60 and tc.rank() == int(os.environ.get("KILL_RANK", "-1")):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.01)
"""


@contextlib.contextmanager
def loop_job(
    cluster: Cluster, tmp_path: Path, *args: str, code: str = LOOP
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A job of 3 hosts x 2 ranks running ``code`` (allreduce in a loop), once it runs: ``code``
    creates the file named by its first argument. Whatever of it is left when the test ends (a
    failed test) is killed: the launcher and the ranks on every host."""
    script = tmp_path / "loop.py"
    script.write_text(code)
    started = tmp_path / "started"
    argv = launch_argv(cluster, HOSTS, tmp_path, *args, "--", str(script), str(started))
    proc = subprocess.Popen(argv, env=env(cluster), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.1)
        yield proc, script
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for p in job_processes(str(script)):
            with contextlib.suppress(psutil.Error):
                p.kill()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_rank_killed_on_another_host_ends_the_job(cluster: Cluster, transport: str, tmp_path: Path) -> None:
    shm_before = tnt_shm(cluster)
    args = (*transport_args(transport), "--timeout", "30", "-x", "KILL_RANK=3")
    with loop_job(cluster, tmp_path, *args) as (proc, script):
        _, err = proc.communicate(timeout=60)
        assert proc.returncode != 0
        assert "rank 3 (host 198.18.0.2, local rank 1) was killed by signal 9 (SIGKILL)" in err, err
        assert_gone(cluster, str(script), shm_before, within=10)


def cut_host_1(cluster: Cluster, proc: subprocess.Popen[str], timeout: float) -> tuple[str, float]:
    """Cuts host 1's link, waits for the job to end, reconnects the host; the job's stderr and
    the seconds from the cut to the end."""
    try:
        cut = time.monotonic()
        cluster.cut(1)
        _, err = proc.communicate(timeout=timeout)
        return err, time.monotonic() - cut
    finally:
        cluster.reconnect(1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_cut_link_ends_the_job_naming_the_host(cluster: Cluster, transport: str, tmp_path: Path) -> None:
    """Host 1 loses its link mid-job: no packet and no reset arrive any more. With a stall timeout of
    2 s the job ends within 10 s, and the summary names the ranks and the host."""
    shm_before = tnt_shm(cluster)
    with loop_job(cluster, tmp_path, *transport_args(transport), "--timeout", "2") as (proc, script):
        err, took = cut_host_1(cluster, proc, timeout=60)
        assert proc.returncode != 0
        # The summary leads with the host (which survivors' timeouts name which of its ranks depends
        # on the algorithm and on who times out first).
        summary = next(ln for ln in err.splitlines() if ln.startswith("tnt-launch: job ") and " failed: " in ln)
        assert " failed: host 198.18.0.2 stopped answering (rank 2, rank 3); " in summary, summary
        assert "host 198.18.0.2 stopped answering during the job (rank 2, rank 3 ran there)" in err, err
        print(f"the job ended {took:.1f} s after the cut")
        assert took < 10, f"the job took {took:.1f} s to end after the cut:\n{err}"
        # The ranks behind the cut end at their own timeout, and remove their segments.
        assert_gone(cluster, str(script), shm_before, within=20)


def registry(cluster: Cluster, host: int) -> list[str]:
    """The entries of the tnt-launch job registry of ``host`` (each host has its own)."""
    folder = cluster.path(host, f"/tmp/tnt-launch-{os.getuid()}")
    return sorted(f for f in os.listdir(folder) if f.endswith(".json"))


FIT = (
    TRAIN.split("serial = build()")[0]
    + r"""
import sys


class Started(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 3 and tnt_comm.rank() == 0:
            open(sys.argv[1], "w").close()


model = tnt.Model(build())
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
model.fit(x, y, batch_size=24, epochs=1_000_000, verbose=0, callbacks=[Started()])
"""
)


@pytest.mark.timeout(180)
def test_cut_link_mid_fit_ends_the_job(cluster: Cluster, tmp_path: Path) -> None:
    """The same cut while 6 ranks train a Keras model. After the error TensorFlow's teardown keeps
    a rank alive for seconds (the tf.data iterator waits for its autotuning thread), so tnt-launch
    stops the job once a rank has printed a tnt-comm failure, not when it exits."""
    shm_before = tnt_shm(cluster)
    with loop_job(cluster, tmp_path, "--timeout", "2", code=FIT) as (proc, script):
        err, took = cut_host_1(cluster, proc, timeout=90)
        assert proc.returncode != 0
        summary = next(ln for ln in err.splitlines() if ln.startswith("tnt-launch: job ") and " failed: " in ln)
        assert " failed: host 198.18.0.2 stopped answering (rank 2, rank 3); " in summary, summary
        assert "host 198.18.0.2 stopped answering during the job" in err, err[-3000:]
        print(f"the job ended {took:.1f} s after the cut")
        assert took < 10, f"the job took {took:.1f} s to end after the cut:\n{err[-3000:]}"
        assert_gone(cluster, str(script), shm_before, within=30)


@pytest.mark.timeout(120)
def test_cleanup_reaches_every_host(cluster: Cluster, tmp_path: Path) -> None:
    shm_before = tnt_shm(cluster)
    with loop_job(cluster, tmp_path, "--timeout", "60") as (proc, script):
        held = [registry(cluster, i) for i in range(HOSTS)]
        assert all(held), held  # every host registered its own part of the job
        argv = launch_argv(cluster, HOSTS, tmp_path, "--cleanup", "--", script.name)
        done = subprocess.run(argv, env=env(cluster), capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        # Every host answers. Hosts are visited at once, and once one host's ranks are stopped the
        # rest of the job fails and ends by itself, so the others may find nothing left to stop.
        for i in range(HOSTS):
            line = rf"^{re.escape(cluster.address(i))}: (stopped job \w+ |no running tnt-launch jobs of loop.py$)"
            assert re.search(line, done.stdout, re.M), done.stdout
        assert "stopped job" in done.stdout, done.stdout
        proc.communicate(timeout=30)
        assert_gone(cluster, str(script), shm_before, within=10)
        assert not any(registry(cluster, i) for i in range(HOSTS)), [registry(cluster, i) for i in range(HOSTS)]
