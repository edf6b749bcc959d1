"""The failures a cluster has that one machine has not, on a cluster of network namespaces
(``netns_cluster.py``): a killed rank on another host, a cut link (while tnt-comm sums, and while
Keras trains), and leftovers on every host."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from cluster_jobs import HOSTS, TRAIN, TRANSPORTS, assert_gone, env, job_processes, launch_argv, tnt_shm, transport_args
from netns_cluster import Cluster

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
    if calls == 60 and tc.rank() == int(os.environ.get("RAISE_RANK", "-1")):
        import atexit
        atexit.register(time.sleep, 4)  # its exit comes after the others'
        raise ValueError(f"planted on rank {tc.rank()}")
    time.sleep(0.01)
"""


@contextlib.contextmanager
def loop_job(
    cluster: Cluster, tmp_path: Path, *args: str, code: str = LOOP, hosts: int = HOSTS, spares: int = 0
) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A job of ``hosts`` hosts x 2 ranks (and ``spares`` spare hosts) running ``code`` (allreduce in a
    loop), once it runs: ``code`` creates the file named by its first argument. Whatever of it is left
    when the test ends (a failed test) is killed: the launcher and the ranks on every host."""
    script = tmp_path / "loop.py"
    script.write_text(code)
    started = tmp_path / "started"
    argv = launch_argv(cluster, hosts, tmp_path, *args, "--", str(script), str(started), spares=spares)
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
@pytest.mark.parametrize(("transport", "how"), [(t, "killed") for t in TRANSPORTS] + [(TRANSPORTS[0], "raised")])
def test_rank_killed_on_another_host_ends_the_job(
    cluster: Cluster, transport: str, how: str, tmp_path: Path
) -> None:
    """A rank on another host killed, or raising an exception (its exit held back, so that the
    others' come first): the summary names it, with its error, through ssh."""
    shm_before = tnt_shm(cluster)
    planted = {"killed": "KILL_RANK=3", "raised": "RAISE_RANK=3"}[how]
    args = (*transport_args(transport), "--timeout", "30", "-x", planted)
    with loop_job(cluster, tmp_path, *args) as (proc, script):
        _, err = proc.communicate(timeout=60)
        where = "rank 3 (host 198.18.0.2, local rank 1)"
        if how == "killed":
            assert proc.returncode == 137, err
            assert f"{where} was killed by signal 9 (SIGKILL)" in err, err
        else:
            assert proc.returncode == 1, err
            assert re.search(
                rf"^tnt-launch: job \w+ failed: {re.escape(where)} raised ValueError: planted on rank 3 \(", err, re.M
            ), err
            assert "    ValueError: planted on rank 3" in err.splitlines(), err
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


ELASTIC_LOOP = r"""
import json, sys, time, numpy as np, tnt_comm as tc

i = 0
while i < 300:
    try:
        n = tc.size()
        got = tc.allreduce(np.full(1 << 14, tc.rank() + 1 + i, np.float32))
        assert np.all(got == n * (n + 1) / 2 + n * i), (got[:2], n, i)
        i += 1
    except (tc.PeerFailure, tc.Timeout):
        tc.shrink()
        i = int(tc.allreduce(np.array([i], np.int64), op="min")[0])
    if i == 30 and tc.membership() == (0, list(range(6))) and tc.rank() == 0:
        open(sys.argv[1], "w").close()
    time.sleep(0.01)
print("RESULT", json.dumps(tc.membership()), flush=True)
"""


@pytest.mark.timeout(180)
def test_elastic_job_goes_on_without_a_cut_host(cluster: Cluster, tmp_path: Path) -> None:
    """--elastic 2: host 1 loses its link mid-job. The ranks on hosts 0 and 2 time out (2 s), agree
    at the store tnt-launch holds on host 0 to go on without ranks 2 and 3, and finish their 300
    allreduces, each checked exactly; tnt-launch exits 0 naming the host it went on without, and the
    ranks behind the cut end at their own timeout, leaving nothing."""
    shm_before = tnt_shm(cluster)
    args = ("--elastic", "2", "--timeout", "2", "--output-on-all-devices")
    with loop_job(cluster, tmp_path, *args, code=ELASTIC_LOOP) as (proc, script):
        try:
            cut = time.monotonic()
            cluster.cut(1)
            out, err = proc.communicate(timeout=120)
            took = time.monotonic() - cut
        finally:
            cluster.reconnect(1)
        assert proc.returncode == 0, err[-3000:]
        for rank in (0, 1, 4, 5):
            assert f"[rank {rank}] RESULT [1, [0, 1, 4, 5]]" in out, (out[-2000:], err[-3000:])
        for rank in (2, 3):
            assert re.search(rf"rank {rank} \(host 198\.18\.0\.2, local rank {rank - 2}\) is (left out|lost)", err), err
        print(f"the job finished {took:.1f} s after the cut")
        assert_gone(cluster, str(script), shm_before, within=30)


SPARE_LOOP = r"""
import json, os, sys, time, numpy as np, tnt_comm as tc

STEPS, WAIT_AT = 300, 150
i = 0
if "TNT_JOIN" in os.environ:  # a replacement on the spare host: admitted at WAIT_AT, told it by rank 0
    i = int(tc.broadcast(np.array([0], np.int64), root=0)[0])
while i < STEPS:
    try:
        if i == WAIT_AT and tc.size() < 4:  # the survivors admit the replacements together
            for _ in range(2400):
                if tc.admit():
                    tc.broadcast(np.array([i], np.int64), root=0)
                    if tc.size() == 4:
                        break
                time.sleep(0.05)
        n = tc.size()
        got = tc.allreduce(np.full(1 << 14, tc.rank() + 1 + i, np.float32))
        assert np.all(got == n * (n + 1) / 2 + n * i), (got[:2], n, i)
        i += 1
    except (tc.PeerFailure, tc.Timeout):
        tc.shrink()
        i = int(tc.allreduce(np.array([i], np.int64), op="min")[0])
    if i == 30 and tc.membership() == (0, list(range(4))) and tc.rank() == 0:
        open(sys.argv[1], "w").close()
    time.sleep(0.01)
print("RESULT", json.dumps([*tc.membership(), os.environ["TNT_RANK"]]), flush=True)
"""


@pytest.mark.timeout(240)
def test_replacements_for_a_cut_host_start_on_a_spare_host(cluster: Cluster, tmp_path: Path) -> None:
    """--elastic 2:4 over hosts 0 and 1 (2 ranks each), host 2 a spare of the hostfile: host 1 loses
    its link; the ranks on host 0 go on without ranks 2 and 3, tnt-launch drops them once their agents
    do not answer, starts their replacements on the spare host, and all four finish, checked exactly."""
    shm_before = tnt_shm(cluster)
    args = ("--elastic", "2:4", "--timeout", "2", "--output-on-all-devices")
    with loop_job(cluster, tmp_path, *args, code=SPARE_LOOP, hosts=2, spares=1) as (proc, script):
        try:
            cluster.cut(1)
            out, err = proc.communicate(timeout=180)
        finally:
            cluster.reconnect(1)
        assert proc.returncode == 0, err[-3000:]
        spare = re.escape(cluster.address(2))
        for member, stands_for in ((4, 2), (5, 3)):
            assert re.search(rf"starting rank {member} on host {spare} \(a spare host: host \S+ is gone\) "
                             rf"in place of rank {stands_for}", err), err[-3000:]
        results = sorted(line.split("RESULT ", 1)[1] for line in out.splitlines() if "RESULT " in line)
        assert len(results) == 4, (out[-2000:], err[-3000:])
        for line in results:
            generation, members, _ = json.loads(line)
            assert members[:2] == [0, 1] and sorted(members) == [0, 1, 4, 5] and generation >= 2, line
        assert sorted(json.loads(line)[2] for line in results) == ["0", "1", "2", "3"]
        assert re.search(r"finished on 4 rank\(s\); .*joined: rank [45], rank [45]", err), err[-3000:]
        assert_gone(cluster, str(script), shm_before, within=30)


ELASTIC_FIT = r"""
import os, sys, time
import numpy as np, keras, tnt_comm, tnt_keras as tnt

x = np.random.RandomState(0).rand(96, 8).astype("float32")
y = (x.sum(axis=1) > 4).astype("float32")


def build():
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return model


class Paced(keras.callbacks.Callback):
    # Steps a tenth of a second apart, so that the cut falls inside the fit; rank 0 says when epoch 1 begins.
    def on_train_batch_begin(self, batch, logs=None):
        if tnt_comm.membership()[0] == 0 and tnt_comm.rank() == 0 and batch == 0 and self.epoch == 1:
            open(sys.argv[1], "w").close()
        time.sleep(0.1)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch


model = tnt.Model(build())
history = model.fit(x, y, batch_size=24, epochs=6, shuffle=False, verbose=0, callbacks=[Paced()])
serial = build()
serial_history = serial.fit(x, y, batch_size=24, epochs=6, shuffle=False, verbose=0)
values = lambda m: [keras.ops.convert_to_numpy(v) for v in m.optimizer.variables] + m.get_weights()
diff = max(float(np.abs(a - b).max()) for a, b in zip(values(model.model), values(serial), strict=True))
scale = max(float(np.abs(v).max()) for v in values(serial))
logs = max(abs(a - b) / max(1.0, abs(b)) for k in serial_history.history
           for a, b in zip(history.history[k], serial_history.history[k], strict=True))
print(f"RESULT member {tnt_comm.membership()[1][tnt_comm.rank()]} diff {diff / max(1.0, scale):.3g} logs {logs:.3g}",
      flush=True)
"""


@pytest.mark.timeout(240)
def test_an_elastic_fit_goes_on_without_a_cut_host_and_equals_serial_training(cluster: Cluster, tmp_path: Path) -> None:
    """--elastic 2 while 6 ranks train a Keras model on torch: host 1 loses its link in epoch 1. The
    four ranks left time out (2 s), re-form the job, redo the step they were in, and end with serial
    Keras' weights, optimizer state and logs (within 8 float32 ulps, relative)."""
    shm_before = tnt_shm(cluster)
    args = ("--elastic", "2", "--timeout", "2", "--output-on-all-devices", "-x", "KERAS_BACKEND=torch")
    with loop_job(cluster, tmp_path, *args, code=ELASTIC_FIT) as (proc, script):
        try:
            cluster.cut(1)
            out, err = proc.communicate(timeout=180)
        finally:
            cluster.reconnect(1)
        assert proc.returncode == 0, err[-3000:]
        results = [line.split("RESULT ", 1)[1].split() for line in out.splitlines() if "RESULT " in line]
        assert sorted(int(r[1]) for r in results) == [0, 1, 4, 5], (out[-2000:], err[-3000:])
        bound = 8 * float(np.finfo(np.float32).eps)
        for r in results:
            assert float(r[3]) <= bound and float(r[5]) <= bound, (r, err[-3000:])
        assert "runs again on 4 rank(s)" in err or "trains epoch" in err, err[-3000:]
        assert_gone(cluster, str(script), shm_before, within=30)


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
