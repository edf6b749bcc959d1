"""tnt under a real Slurm (slurm_cluster.py: Debian's slurmctld, slurmd and munge, started here).

Plain `srun -n N python script.py` forms one job of N ranks from Slurm's variables; tnt-launch in an
allocation starts its ranks as the tasks of one srun step. Either way a rank killed under srun ends
the job, named, and leaves nothing behind. On one node (this host), and on two: the hosts of a
cluster of network namespaces, shared memory within a node and TCP between.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from netns_cluster import Cluster, ClusterUnavailable
from netns_cluster import up as netns_up
from slurm_cluster import Slurm, SlurmUnavailable, _wait_idle, up, up_on

SUM = textwrap.dedent(
    """\
    import numpy as np, tnt_comm as tc
    total = tc.allreduce(np.array([tc.rank() + 1.0], np.float32))[0]
    print(f"rank {tc.rank()} of {tc.size()} local {tc.local_rank()} sum {total:g}", flush=True)
    """
)


@pytest.fixture(scope="module")
def slurm() -> Iterator[Slurm]:
    try:
        cluster = up(cpus=4)
    except SlurmUnavailable as e:
        print(f"SKIP Slurm tests: {e}")
        pytest.skip(str(e))
    try:
        yield cluster
    finally:
        cluster.down()


LAUNCH = [sys.executable, "-m", "tnt_launch"]


def _script(tmp_path: Path, name: str, code: str) -> Path:
    path = tmp_path / name
    path.write_text(code)
    return path


def crash_script(killed: int, say_started: bool = False, how: str = "killed") -> str:
    """A job whose rank `killed` kills itself (`how` "killed") or raises ValueError, its exit held
    back 4 s ("raised"), after one allreduce, while the others sum on; with `say_started`, every
    rank first prints "rank R started"."""
    started = 'print(f"rank {tc.rank()} started", flush=True)' if say_started else ""
    end = "os.kill(os.getpid(), signal.SIGKILL)"
    if how == "raised":
        end = 'atexit.register(time.sleep, 4); raise ValueError(f"planted on rank {tc.rank()}")'
    return textwrap.dedent(
        f"""\
        import atexit, os, signal, time, numpy as np, tnt_comm as tc
        x = np.ones(1000, np.float32)
        tc.allreduce(x)
        {started}
        if tc.rank() == {killed}:
            {end}
        while True:
            tc.allreduce(x)
        """
    )


def _tnt_segments() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("tnt-slurm-")}


def _processes_of(script: Path) -> list[dict]:
    """Live processes whose command line names `script`."""
    return [p.info for p in psutil.process_iter(["pid", "cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]


def _fail_a_rank_under_tnt_launch(
    slurm: Slurm, tmp_path: Path, salloc: list[str], killed: int, where: str, timeout: float, how: str = "killed"
) -> None:
    """Runs crash_script(killed, how=how) under tnt-launch in `salloc`: the job ends with the rank's
    SIGKILL or its exception, naming it (`where`: a pattern of its host and local rank), and leaves
    no registry entry and no process of the job behind."""
    script = _script(tmp_path, "crash.py", crash_script(killed, how=how))
    registry = tmp_path / "registry"
    done = slurm.run(
        [*salloc, *LAUNCH, "--", str(script)],
        timeout=timeout,
        env={"TNT_LAUNCH_REGISTRY": str(registry), "TNT_TIMEOUT_S": "20"},
    )
    ended = "was killed by signal 9" if how == "killed" else rf"raised ValueError: planted on rank {killed} \("
    assert done.returncode == (137 if how == "killed" else 1), done.stderr[-3000:]
    assert re.search(rf"job \w+ failed: rank {killed} \({where}\) {ended}", done.stderr), done.stderr[-3000:]
    if how == "raised":
        assert f"    ValueError: planted on rank {killed}" in done.stderr.splitlines(), done.stderr[-3000:]
    assert not [f for f in os.listdir(registry) if f.endswith(".json")], os.listdir(registry)
    assert not _processes_of(script), _processes_of(script)


@pytest.mark.timeout(120)
def test_plain_srun_forms_one_job_from_slurms_variables(slurm: Slurm, tmp_path: Path) -> None:
    script = _script(tmp_path, "sum.py", SUM)
    done = slurm.run(["srun", "-n", "3", "--chdir", str(tmp_path), sys.executable, str(script)], timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = sorted(done.stdout.splitlines())
    # One job of three ranks: 1 + 2 + 3 on every rank, not three jobs of one rank each.
    assert lines == [f"rank {r} of 3 local {r} sum 6" for r in range(3)], done.stdout + done.stderr[-2000:]

    # TNT_SIZE=1 is the way to run every task as a job of its own.
    done = slurm.run(
        ["srun", "-n", "2", sys.executable, str(script)], timeout=90, env={"TNT_SIZE": "1"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(done.stdout.splitlines()) == ["rank 0 of 1 local 0 sum 1"] * 2


@pytest.mark.timeout(120)
def test_a_rank_killed_under_srun_ends_the_job_named(slurm: Slurm, tmp_path: Path) -> None:
    script = _script(tmp_path, "crash.py", crash_script(1, say_started=True))
    before = _tnt_segments()
    done = slurm.run(
        ["srun", "-n", "3", sys.executable, str(script)], timeout=90, env={"TNT_TIMEOUT_S": "20"}
    )
    assert done.returncode != 0
    assert sorted(done.stdout.splitlines()) == [f"rank {r} started" for r in range(3)], done.stderr[-3000:]
    # The survivors say which rank failed, as they do under tnt-launch.
    assert "rank 1 failed" in done.stderr, done.stderr[-3000:]
    assert not _tnt_segments() - before
    assert not _processes_of(script), _processes_of(script)



STEP = SUM + textwrap.dedent(
    """\
    import os
    print(f"rank {tc.rank()} in Slurm step {os.environ.get('SLURM_STEP_ID', 'none')}", flush=True)
    """
)


@pytest.mark.timeout(120)
def test_tnt_launch_in_an_allocation_starts_the_ranks_with_srun(slurm: Slurm, tmp_path: Path) -> None:
    script = _script(tmp_path, "step.py", STEP)
    done = slurm.run(["salloc", "-n", "3", *LAUNCH, "--output-on-all-devices", "--", str(script)], timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    # The allocation's 3 tasks are the job's 3 ranks, each a task of one srun step (not of salloc's shell).
    for r in range(3):
        assert f"[rank {r}] rank {r} of 3 local {r} sum 6" in lines, done.stdout
    steps = {line.rsplit(" ", 1)[1] for line in lines if "in Slurm step" in line}
    assert len(steps) == 1 and steps != {"none"}, done.stdout

    # -n 2 inside an allocation of 3 tasks: 2 ranks on its nodes; --dry-run shows the srun line.
    done = slurm.run(["salloc", "-n", "3", *LAUNCH, "-n", "2", "--dry-run", "--", str(script)], timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"rank 1 host {slurm.node} (srun)" in done.stdout
    assert "srun --ntasks=2 --distribution=arbitrary" in done.stdout

    # Started by srun itself, tnt-launch would start one job per task: it refuses, saying what to do.
    done = slurm.run(["srun", "-n", "2", *LAUNCH, "--", str(script)], timeout=60)
    assert done.returncode == 2
    assert "tnt-launch runs as one of 2 tasks of a Slurm step (srun -n 2)" in done.stderr


@pytest.mark.timeout(120)
def test_a_rank_that_raises_under_tnt_launch_over_srun_ends_the_job_named(slurm: Slurm, tmp_path: Path) -> None:
    # Its error and traceback reach the summary through the srun step, though the others exit first
    # (a killed rank on the second node: below).
    before = _tnt_segments()
    where = r"host \S+, local rank 1"
    _fail_a_rank_under_tnt_launch(slurm, tmp_path, ["salloc", "-n", "3"], 1, where, timeout=90, how="raised")
    # Nothing left of tnt-comm's shared memory either.
    assert not {f for f in os.listdir("/dev/shm") if f.startswith("tnt-")} - before - _tnt_segments()


ELASTIC = textwrap.dedent(
    """\
    import os, signal, time, numpy as np, tnt_comm as tc
    STEPS, WAIT_AT = 40, 20
    i = 0
    if "TNT_JOIN" in os.environ:  # the replacement: admitted at call WAIT_AT, told it by rank 0
        i = int(tc.broadcast(np.array([0], np.int64), root=0)[0])
    member = tc.membership()[1][tc.rank()]
    while i < STEPS:
        try:
            if i == WAIT_AT and tc.size() < 3:  # the survivors admit the replacement together
                for _ in range(600):
                    if tc.admit():
                        tc.broadcast(np.array([i], np.int64), root=0)
                        break
                    time.sleep(0.1)
            if member == 1 and i == 5 and tc.membership()[0] == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            n = tc.size()
            got = tc.allreduce(np.full(1024, tc.rank() + 1.0 + i, np.float32))
            assert got[0] == n * (n + 1) / 2 + n * i, (got[0], n, i)
            i += 1
        except (tc.PeerFailure, tc.Timeout):
            tc.shrink()
            i = int(tc.allreduce(np.array([i], np.int64), op="min")[0])
    print(f"member {member} of {tc.size()} ranks did {i} calls in generation {tc.membership()[0]}", flush=True)
    """
)


@pytest.mark.timeout(180)
def test_an_elastic_job_under_srun_goes_on_and_a_replacement_joins_as_a_step_of_its_own(
    slurm: Slurm, tmp_path: Path
) -> None:
    # Rank 1 of 3 is killed; the two others re-form the job and wait at call 20 for the replacement
    # tnt-launch starts on its node, as a second srun step beside the first (--overlap), which joins.
    script = _script(tmp_path, "elastic.py", ELASTIC)
    registry = tmp_path / "registry"
    before = _tnt_segments()
    done = slurm.run(
        ["salloc", "-n", "3", *LAUNCH, "--elastic", "2:3", "--output-on-all-devices", "--", str(script)],
        timeout=150, env={"TNT_LAUNCH_REGISTRY": str(registry), "TNT_TIMEOUT_S": "20"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 1 (host " in done.stderr and "is lost: it was killed by signal 9" in done.stderr, done.stderr[-3000:]
    assert re.search(r"starting rank 3 on host \S+ in place of rank 1", done.stderr), done.stderr[-3000:]
    assert re.search(r"finished on 3 rank\(s\); lost on the way: rank 1 .*; joined: rank 3", done.stderr), done.stderr
    finished = sorted(line.split("] ", 1)[-1] for line in done.stdout.splitlines() if "calls in generation" in line)
    assert finished == [f"member {m} of 3 ranks did 40 calls in generation 2" for m in (0, 2, 3)], done.stdout
    assert not [f for f in os.listdir(registry) if f.endswith(".json")], os.listdir(registry)
    assert not _processes_of(script), _processes_of(script)
    assert not _tnt_segments() - before


# -- Nodes on hosts of a cluster of network namespaces: jobs take two, a third is spare ----------

PLACED = textwrap.dedent(
    """\
    import socket, numpy as np, tnt_comm as tc
    total = tc.allreduce(np.array([tc.rank() + 1.0], np.float32))[0]
    kinds = sorted(set(tc.transports()) - {"self"})
    print(f"rank {tc.rank()} of {tc.size()} local {tc.local_rank()}/{tc.local_size()} on {socket.gethostname()} "
          f"sum {total:g} over {'+'.join(kinds)}", flush=True)
    """
)


@pytest.fixture(scope="module")
def nodes() -> Iterator[tuple[Slurm, Cluster]]:
    """Three nodes: the jobs ask for two (-N 2) but the elastic one, whose third node is its spare."""
    try:
        hosts = netns_up(3)
    except ClusterUnavailable as e:
        print(f"SKIP multi-node Slurm tests: {e}")
        pytest.skip(str(e))
    try:
        try:
            # A node cut off is set DOWN after 15 s, not Slurm's 300 (the elastic job that loses one).
            cluster = up_on(hosts, cpus=2, slurmd_timeout=15)
        except SlurmUnavailable as e:
            print(f"SKIP multi-node Slurm tests: {e}")
            pytest.skip(str(e))
        try:
            yield cluster, hosts
        finally:
            cluster.down()
    finally:
        hosts.down()


# The two-node jobs name their nodes: Slurm would otherwise take the third one while the first still
# completes the job before (state COMPLETING), and the placement each test expects would shift.
TWO_NODES = ["-N", "2", "-w", "tntnode0,tntnode1"]


def _placed(out: str) -> list[str]:
    return sorted(line.split("] ", 1)[-1] for line in out.splitlines() if " of " in line)


@pytest.mark.timeout(180)
def test_two_nodes_under_plain_srun_and_tnt_launch(nodes: tuple[Slurm, Cluster], tmp_path: Path) -> None:
    slurm, hosts = nodes
    script = _script(tmp_path, "placed.py", PLACED)
    both = [
        f"rank {r} of 4 local {r % 2}/2 on tntnode{r // 2} sum 10 over shm+tcp" for r in range(4)
    ]
    done = slurm.run(["srun", *TWO_NODES, "-n", "4", sys.executable, str(script)], timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _placed(done.stdout) == both, done.stdout + done.stderr[-2000:]

    done = slurm.run(["salloc", *TWO_NODES, "-n", "4", *LAUNCH, "--output-on-all-devices", "--", str(script)],
                     timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _placed(done.stdout) == both, done.stdout + done.stderr[-2000:]

    # Three tasks on two nodes: Slurm gives the first node two (SLURM_TASKS_PER_NODE=2,1), and so does the plan.
    done = slurm.run(["salloc", *TWO_NODES, "-n", "3", *LAUNCH, "--output-on-all-devices", "--", str(script)],
                     timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _placed(done.stdout) == [
        "rank 0 of 3 local 0/2 on tntnode0 sum 6 over shm+tcp",
        "rank 1 of 3 local 1/2 on tntnode0 sum 6 over shm+tcp",
        "rank 2 of 3 local 0/1 on tntnode1 sum 6 over tcp",
    ], done.stdout + done.stderr[-2000:]


@pytest.mark.timeout(180)
def test_a_rank_killed_on_the_second_node_ends_the_job(nodes: tuple[Slurm, Cluster], tmp_path: Path) -> None:
    slurm, hosts = nodes
    _fail_a_rank_under_tnt_launch(
        slurm, tmp_path, ["salloc", *TWO_NODES, "-n", "4"], 3, "host tntnode1, local rank 1", timeout=120
    )
    # Nothing left of tnt-comm's shared memory on either node.
    for host in range(2):
        assert not [f for f in os.listdir(hosts.path(host, "/dev/shm")) if f.startswith("tnt-")]



NODE_LOSS = textwrap.dedent(
    """\
    import os, sys, time, numpy as np, tnt_comm as tc
    STEPS, GO_ON = 60, 30
    i = 0
    if "TNT_JOIN" in os.environ:  # a replacement on the spare node: admitted at call GO_ON, told it by rank 0
        i = int(tc.broadcast(np.array([0], np.int64), root=0)[0])
    member = tc.membership()[1][tc.rank()]
    while i < STEPS:
        try:
            if i == GO_ON and tc.size() < 4:
                # The survivors go on once Slurm has set the lost node DOWN, with both replacements.
                while not os.path.exists(sys.argv[2]):
                    time.sleep(0.1)
                for _ in range(1200):
                    if tc.admit():
                        tc.broadcast(np.array([i], np.int64), root=0)
                        if tc.size() == 4:
                            break
                    time.sleep(0.1)
            n = tc.size()
            got = tc.allreduce(np.full(1024, tc.rank() + 1.0 + i, np.float32))
            assert got[0] == n * (n + 1) / 2 + n * i, (got[0], n, i)
            if member == 0 and i == 10:
                open(sys.argv[1], "w").close()  # the test cuts the second node off now
            time.sleep(0.05)
            i += 1
        except (tc.PeerFailure, tc.Timeout):
            tc.shrink()
            i = int(tc.allreduce(np.array([i], np.int64), op="min")[0])
    print(f"member {member} of {tc.size()} ranks did {i} calls on {os.uname().nodename}", flush=True)
    """
)


@pytest.mark.timeout(240)
def test_an_elastic_job_that_loses_a_node_goes_on_and_its_spare_node_takes_the_replacements(
    nodes: tuple[Slurm, Cluster], tmp_path: Path
) -> None:
    # Four ranks on the first two nodes of three (-n 4 fills two; the third is a spare). The second
    # node's link is cut: its slurmd, agents and ranks go silent. The two ranks of the first re-form
    # the job; tnt-launch stops the two it left out without touching the others (one srun step holds
    # all four) and, as their agents do not answer, starts their replacements on the spare node. The
    # survivors go on after slurmctld has set the lost node DOWN, which kills a step on it unless the
    # step asked for --no-kill (as the allocation must: salloc --no-kill), and admit the two.
    slurm, hosts = nodes
    script = _script(tmp_path, "node_loss.py", NODE_LOSS)
    marker, down, registry = tmp_path / "cut-now", tmp_path / "node-down", tmp_path / "registry"
    argv = ["salloc", "-N", "3", "-n", "6", "--no-kill", *LAUNCH, "-n", "4", "--elastic", "2:4", "--timeout", "5",
            "--output-on-all-devices", "--", str(script), str(marker), str(down)]
    proc = subprocess.Popen(slurm.on_node(0, argv), env={**slurm.env, "TNT_LAUNCH_REGISTRY": str(registry)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), proc.communicate(timeout=30)
        hosts.cut(1)
        deadline = time.monotonic() + 90
        while "down" not in slurm.run(["sinfo", "-h", "-n", "tntnode1", "-o", "%T"], timeout=30).stdout:
            assert time.monotonic() < deadline and proc.poll() is None, "the node was not set DOWN"
            time.sleep(0.5)
        down.touch()
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        hosts.reconnect(1)
    assert proc.returncode == 0, err[-3000:]
    for rank in (2, 3):
        assert f"rank {rank} (host tntnode1, local rank {rank - 2}) is left out of the job" in err, err[-3000:]
        assert re.search(rf"starting rank \d on host tntnode2 \(a spare host: host tntnode1 is gone\) in place of "
                         rf"rank {rank}", err), err[-3000:]
    assert re.search(r"finished on 4 rank\(s\); lost on the way: rank 2 .*rank 3 .*; joined: rank 4, rank 5", err), err
    finished = sorted(line.split("] ", 1)[-1] for line in out.splitlines() if "calls on" in line)
    want = [f"member {m} of 4 ranks did 60 calls on tntnode{n}" for m, n in ((0, 0), (1, 0), (4, 2), (5, 2))]
    assert finished == want, out + err[-2000:]
    assert not [f for f in os.listdir(registry) if f.endswith(".json")], os.listdir(registry)
    for host in (0, 2):
        assert not [f for f in os.listdir(hosts.path(host, "/dev/shm")) if f.startswith("tnt-")]
    # Back on the network, the second node's left-out ranks end too, and the node takes jobs again.
    deadline = time.monotonic() + 60
    while _processes_of(script) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _processes_of(script), _processes_of(script)
    _wait_idle(slurm, 90)

# -- Preemption: a signal before the end, a checkpoint, and a second job that resumes from it -------

TRAIN = textwrap.dedent(
    """\
    import json, os, sys, time
    import numpy as np
    import keras
    import tnt_keras as tnt

    out, backup = sys.argv[1], sys.argv[2]
    keras.utils.set_random_seed(7)
    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    y = x @ np.arange(8, dtype="float32")[:, None]
    inner = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    model = tnt.Model(inner)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")


    class WaitForSignal(keras.callbacks.Callback):
        # The first job says when it is in epoch 2, and waits there for the test's signal; every rank
        # then says whether the signal reached it, and on which node it runs.
        def on_epoch_begin(self, epoch, logs=None):
            if os.environ.get("WAIT_FOR_SIGNAL") == "1" and epoch == 2:
                if tnt.is_master_rank():
                    open(out + ".ready", "w").close()
                deadline = time.monotonic() + 60
                while not tnt.preemption.requested() and time.monotonic() < deadline:
                    time.sleep(0.05)
                with open(f"{out}.rank{tnt.get_rank()}", "w") as f:
                    json.dump({"signalled": tnt.preemption.requested(), "node": os.uname().nodename}, f)


    history = model.fit(x, y, batch_size=16, epochs=6, shuffle=False, verbose=0,
                        callbacks=[keras.callbacks.BackupAndRestore(backup), WaitForSignal()])
    if tnt.is_master_rank():
        with open(out, "w") as f:
            json.dump({"epochs": history.epoch, "preempted": tnt.preempted(),
                       "weights": [w.tolist() for w in inner.get_weights()]}, f)
    """
)


@pytest.mark.timeout(300)
def test_a_preemption_signal_ends_in_a_checkpoint_the_next_job_resumes_from_exactly(
    nodes: tuple[Slurm, Cluster], tmp_path: Path
) -> None:
    # On two nodes, one rank each: the signal must reach the rank on the node without the batch shell.
    slurm, _ = nodes
    script = _script(tmp_path, "train.py", TRAIN)
    backup = tmp_path / "backup"
    first, second, whole = (tmp_path / name for name in ("first.json", "second.json", "whole.json"))
    # As `#SBATCH --signal=USR1@T` would, T seconds before the time limit: scancel --signal=USR1 signals
    # every task of the job's steps (tnt-launch's agents and ranks), not the batch shell.
    job = subprocess.Popen(
        slurm.on_node(0, ["sbatch", "--wait", "--parsable", *TWO_NODES, "-n", "2", "-o", str(tmp_path / "first.out"),
                          "--wrap", shlex.join([*LAUNCH, "--", str(script), str(first), str(backup)])]),
        env={**slurm.env, "WAIT_FOR_SIGNAL": "1"}, stdout=subprocess.PIPE, text=True, cwd=tmp_path,
    )
    try:
        assert job.stdout is not None
        job_id = job.stdout.readline().strip().split(";")[0]
        deadline = time.monotonic() + 180
        while not Path(f"{first}.ready").exists():
            assert job.poll() is None, (tmp_path / "first.out").read_text()[-3000:]
            assert time.monotonic() < deadline, "the first job did not reach epoch 2"
            time.sleep(0.2)
        signalled = slurm.run(["scancel", "--signal=USR1", job_id], timeout=30)
        assert signalled.returncode == 0, signalled.stderr
        assert job.wait(timeout=120) == 0, (tmp_path / "first.out").read_text()[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    ranks = [json.loads(Path(f"{first}.rank{r}").read_text()) for r in range(2)]
    assert [r["signalled"] for r in ranks] == [True, True], ranks  # it reached both ranks...
    assert sorted(r["node"] for r in ranks) == ["tntnode0", "tntnode1"], ranks  # ... on both nodes
    got = json.loads(first.read_text())
    # Stopped on every rank after the epoch it was in, with the checkpoint kept...
    assert got["preempted"] and got["epochs"] == [0, 1, 2], got
    assert "training stops after epoch 3 (BackupAndRestore saved it)" in (tmp_path / "first.out").read_text()
    assert backup.exists()

    # ... which the next job resumes from; it ends where one job without a signal ends, exactly.
    done = slurm.run(["salloc", *TWO_NODES, "-n", "2", *LAUNCH, "--", str(script), str(second), str(backup)],
                     timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    done = slurm.run(
        ["salloc", *TWO_NODES, "-n", "2", *LAUNCH, "--", str(script), str(whole), str(tmp_path / "other")], timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    resumed, uninterrupted = json.loads(second.read_text()), json.loads(whole.read_text())
    assert resumed["epochs"] == [3, 4, 5] and not resumed["preempted"], resumed
    assert uninterrupted["epochs"] == [0, 1, 2, 3, 4, 5], uninterrupted
    # The same computations in the same order on the same machine: equal to the last bit.
    for a, b in zip(resumed["weights"], uninterrupted["weights"], strict=True):
        assert np.array_equal(np.array(a), np.array(b)), (a, b)
