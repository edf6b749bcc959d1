"""Elastic jobs in tnt-comm: ranks are really killed (SIGKILL) or stopped (SIGSTOP) at random points
of a random program of collectives, and the survivors re-form the job with ``tnt_comm.shrink()``,
agree where to go on, and finish it with results that are checked exactly on every call. The store
they meet at is ``python -m tnt_comm.store``, a process of its own (as tnt-launch --elastic holds
one), so that rank 0 may be lost too. Under TNT_TEST_TRANSPORT=gpi2 the jobs start over GPI-2, which
starts once per process: the generations after the first go on over shared memory and TCP."""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ranks import GPI2, Job

# The ranks' program: STEPS calls drawn from every collective kind, each checked exactly against
# what its inputs give on the current number of ranks. Members in VICTIMS die at call KILL_AT:
# before it ("between") or a random moment into it, from a thread ("during"). A survivor whose call
# fails re-forms the job, and the survivors go on from the earliest call any of them had not
# finished (their minimum), as a training loop redoes the step it lost.
PROGRAM = """
import json, os, random, signal, sys, threading, time
import numpy as np
import tnt_comm as tc

STEPS, SEED, VICTIMS, KILL_AT, HOW, SIGNAL = {steps}, {seed}, {victims}, {kill_at}, {how!r}, {signal}
ADMIT_EVERY, WAIT_AT, STARTED = {admit_every}, {wait_at}, {started!r}  # replacements (tnt_comm.admit)
KINDS = ["allreduce", "iallreduce", "broadcast", "allgather", "allgatherv", "reduce_scatter", "barrier",
         "sendrecv", "group"]
rng = random.Random(SEED)
program = [rng.choice(KINDS) for _ in range(STEPS)]
count = 1 << 18  # 1 MiB of float32: a call lasts long enough to be killed in

def check(got, want, what):
    if not np.array_equal(got, want):
        raise AssertionError(f"{{what}}: got {{got[:4]}}, want {{want[:4]}}")

def call(kind, i):
    n, r = tc.size(), tc.rank()
    if kind in ("allreduce", "iallreduce"):
        x = np.full(count, r + 1 + i, np.float32)
        got = tc.allreduce(x) if kind == "allreduce" else tc.iallreduce(x).wait()
        check(got, np.full(count, n * (n + 1) / 2 + n * i, np.float32), kind)
    elif kind == "broadcast":
        root = i % n
        x = np.full(count, r * 1000 + i, np.float32)
        check(tc.broadcast(x, root=root), np.full(count, root * 1000 + i, np.float32), kind)
    elif kind == "allgather":
        got = tc.allgather(np.full(count // n, r + i, np.float32))
        check(got, np.repeat(np.arange(n, dtype=np.float32) + i, count // n).reshape(n, -1), kind)
    elif kind == "allgatherv":
        got = tc.allgatherv(np.full(r + 1, r + i, np.int64))
        check(got, np.concatenate([np.full(q + 1, q + i, np.int64) for q in range(n)]), kind)
    elif kind == "reduce_scatter":
        got = tc.reduce_scatter(np.full(count // n * n, r + i, np.float64))
        check(got, np.full(len(got), n * (n - 1) / 2 + n * i), kind)
    elif kind == "barrier":
        tc.barrier()
    elif kind == "sendrecv":
        right, left = (r + 1) % n, (r - 1) % n
        out = np.empty(count // 4, np.int32)
        w = tc.irecv(out, left)
        tc.send(np.full(count // 4, r * 7 + i, np.int32), right)
        w.wait()
        check(out, np.full(count // 4, left * 7 + i, np.int32), kind)
    else:  # a sub-group of the even ranks, made anew in every generation
        evens = list(range(0, n, 2))
        g = tc.new_group(evens)
        if r in evens:
            got = g.allreduce(np.full(count // 4, r, np.float32))
            check(got, np.full(count // 4, sum(evens), np.float32), kind)

failures = []
i = skip = 0
if "TNT_JOIN" in os.environ:  # a replacement: says it started, waits to be admitted, learns where
    open(STARTED, "w").close()
    i = skip = int(tc.broadcast(np.array([0], np.int64), root=0)[0])
member = tc.membership()[1][tc.rank()]
first = [tc.membership()[0], sorted(set(tc.transports()) - {{"self"}})]  # the generation it began in
while i < STEPS:
    if i == WAIT_AT and tc.membership()[0] >= 1 and "TNT_JOIN" not in os.environ:
        if tc.rank() == 0:  # the survivors hold on until the replacement runs
            while not os.path.exists(STARTED):
                time.sleep(0.02)
            time.sleep(0.5)
        tc.barrier()
    if ADMIT_EVERY and i % ADMIT_EVERY == 0 and i != skip and tc.admit():
        i = skip = int(tc.broadcast(np.array([i], np.int64), root=0)[0])
    if member in VICTIMS and i == KILL_AT:
        kill = lambda: os.kill(os.getpid(), SIGNAL)
        if HOW == "between":
            kill()
        else:
            threading.Timer(random.Random(SEED + member).uniform(0, 0.004), kill).start()
    try:
        call(program[i], i)
        i += 1
    except (tc.PeerFailure, tc.Timeout) as e:
        failures.append([type(e).__name__, list(e.ranks), program[i], i])
        old = tc.new_group(list(range(tc.size())))  # a group of the old job (made without communicating)
        tc.shrink()
        try:  # the old job's groups refuse, saying why (tc.world() is always the current world)
            old.barrier()
            raise AssertionError("a group of the old job still ran a collective")
        except tc.TntError as stale:
            assert "re-formed" in str(stale), stale
        i = int(tc.allreduce(np.array([i], np.int64), op="min")[0])
generation, members = tc.membership()
print("RESULT", json.dumps(dict(member=member, rank=tc.rank(), size=tc.size(), generation=generation,
                                members=members, failures=failures, steps=i, first=first,
                                last=sorted(set(tc.transports()) - {{"self"}}))), flush=True)
"""


def start_store(token: str) -> tuple[subprocess.Popen[str], int]:
    store = subprocess.Popen(
        [sys.executable, "-m", "tnt_comm.store", "--host", "127.0.0.1"],
        env={**os.environ, "TNT_JOB_TOKEN": token},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert store.stdout is not None
    return store, int(store.stdout.readline())


def stop_store(store: subprocess.Popen[str]) -> None:
    store.terminate()
    store.wait(10)


def elastic_job(
    n: int, tmp: Path, env: dict[str, str] | None = None, nodes: int = 1, **program: object
) -> tuple[Job, subprocess.Popen[str]]:
    token = secrets.token_hex(16)
    store, port = start_store(token)
    code = PROGRAM.format(**{"steps": 24, "seed": 0, "victims": [], "kill_at": 0, "how": "between",
                             "signal": int(signal.SIGKILL), "admit_every": 0, "wait_at": -1,
                             "started": str(tmp / "replacement-started"), **program})
    base = {"TNT_ELASTIC": "2", "TNT_MASTER_PORT": str(port), "TNT_JOB_TOKEN": token, "TNT_TIMEOUT_S": "30"}
    job = Job(n, code, tmp, env={**base, **(env or {})}, nodes=nodes)
    job.store_port, job.store_token = port, token  # type: ignore[attr-defined]  # for a replacement
    return job, store


def results_of(out: str) -> dict[str, object]:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, out
    return json.loads(lines[-1][len("RESULT "):])


def finished(
    job: Job, store: subprocess.Popen[str], survivors: list[int], timeout: float = 60
) -> list[dict[str, object]]:
    """Waits for the job; asserts the survivors finished the program together and left nothing."""
    try:
        results = job.wait(timeout)
    finally:
        stop_store(store)
    out = []
    for member in survivors:
        res = results[member]
        assert res.returncode == 0, f"member {member} exited {res.returncode}:\n{res.stderr[-3000:]}"
        out.append(results_of(res.stdout))
    assert [o["rank"] for o in out] == list(range(len(survivors)))
    for o in out:
        assert o["members"] == survivors and o["size"] == len(survivors) and o["steps"] == 24, o
        check_transports(o)
    assert not job.shm_leftovers(), job.shm_leftovers()
    return out


def check_transports(o: dict[str, object]) -> None:
    """The first generation ran over GPI-2 where the tests run over it; every later one over shared
    memory and TCP, since GPI-2 starts once per process."""
    if GPI2 and o["first"][0] == 0:
        assert o["first"][1] == ["gpi2"], o
    if o["generation"] != 0:
        assert set(o["last"]) <= {"shm", "tcp"} and o["last"], o


# Ten trials with a random victim, call and moment, half of them inside the call, over shared
# memory (one host) and TCP (every rank a host of its own).
TRIALS = [(seed, transport) for seed in range(6) for transport in ["shm"]] + [(seed, "tcp") for seed in range(6, 10)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("seed", "transport"), TRIALS, ids=[f"{t}-{s}" for s, t in TRIALS])
def test_survivors_of_a_killed_rank_reform_and_finish_exactly(seed: int, transport: str, tmp_path: Path) -> None:
    rng = random.Random(seed)
    victim, kill_at, how = rng.randrange(4), rng.randrange(1, 20), rng.choice(["between", "during"])
    job, store = elastic_job(4, tmp_path, nodes=4 if transport == "tcp" else 1, seed=seed, victims=[victim],
                             kill_at=kill_at, how=how)
    out = finished(job, store, [m for m in range(4) if m != victim])
    assert job.procs[victim].returncode == -signal.SIGKILL
    for o in out:
        assert o["generation"] == 1 and len(o["failures"]) == 1, o
        kind, blamed = o["failures"][0][0], o["failures"][0][1]
        assert kind == "PeerFailure" and blamed == [victim], o  # named by its generation-0 rank


@pytest.mark.timeout(120)
def test_rank_0_lost_and_two_ranks_lost_at_once(tmp_path: Path) -> None:
    # Rank 0 goes first; then two more at once, leaving 2 of 5 (TNT_ELASTIC=2 allows it): the
    # store outlives them all.
    job, store = elastic_job(5, tmp_path, seed=11, victims=[0], kill_at=5, how="during")
    out = finished(job, store, [1, 2, 3, 4])
    assert all(o["generation"] == 1 for o in out)
    job, store = elastic_job(5, tmp_path, seed=12, victims=[1, 3, 4], kill_at=9, how="during")
    out = finished(job, store, [0, 2])
    assert all(1 <= o["generation"] <= 3 for o in out), out  # one re-forming, or one per death noticed


@pytest.mark.timeout(120)
def test_fewer_than_min_left_ends_the_job(tmp_path: Path) -> None:
    job, store = elastic_job(4, tmp_path, env={"TNT_ELASTIC": "3"}, seed=3, victims=[1, 2], kill_at=4)
    try:
        results = job.wait(60)
    finally:
        stop_store(store)
    for member in (0, 3):
        res = results[member]
        assert res.returncode != 0 and "fewer than the 3 it needs" in res.stderr, res.stderr[-3000:]
        assert "PeerFailure" in res.stderr
    assert not job.shm_leftovers()


@pytest.mark.timeout(120)
def test_a_stopped_rank_is_lost_after_the_timeout_and_refused_when_it_wakes(tmp_path: Path) -> None:
    # Member 1 stops itself (SIGSTOP) at call 6: the others time out (3 s), re-form without it and
    # finish. Woken then, it finds its job gone: its call fails, and shrink tells it that it was
    # left out. The survivors' results are checked exactly, so it corrupted nothing.
    job, store = elastic_job(4, tmp_path, env={"TNT_TIMEOUT_S": "3"}, seed=4, victims=[1], kill_at=6,
                             signal=int(signal.SIGSTOP))
    try:
        survivors = []
        deadline = time.monotonic() + 60
        for member in (0, 2, 3):
            survivors.append(job.procs[member].communicate(timeout=max(1, deadline - time.monotonic())))
        for member, (out, err) in zip((0, 2, 3), survivors, strict=True):
            assert job.procs[member].returncode == 0, err[-3000:]
            o = results_of(out)
            assert o["members"] == [0, 2, 3] and o["steps"] == 24 and o["failures"][0][0] == "Timeout", o
        job.procs[1].send_signal(signal.SIGCONT)
        out, err = job.procs[1].communicate(timeout=60)
        assert job.procs[1].returncode != 0 and "RESULT" not in out
        assert "was left out when the job re-formed" in err, err[-3000:]
    finally:
        job.kill()
        stop_store(store)
    assert not job.shm_leftovers()


# Member 2 stops (SIGSTOP). Member 1 waits on member 0, which waits on member 2: member 1 times out
# first, and its probe finds member 0 alive in its call. Member 0 learns of the failure from member 1
# and spends longer than the timeout (SLOW_S) before it calls shrink, as a handler that saves a
# checkpoint would.
SLOW_HANDLER = """
import json, os, signal, time, numpy as np, tnt_comm as tc

SLOW_S = 3.5
tc.allreduce(np.ones(4, np.float32))  # every link up before the stop
failure = None
try:
    if tc.rank() == 2:
        os.kill(os.getpid(), signal.SIGSTOP)
    elif tc.rank() == 0:
        time.sleep(1.0)  # member 1 starts waiting first, so its timeout comes first
        tc.recv(np.zeros(4, np.float32), src=2)
    else:
        tc.recv(np.zeros(4, np.float32), src=0)
except (tc.PeerFailure, tc.Timeout) as e:
    failure = type(e).__name__
    if tc.rank() == 0:
        time.sleep(SLOW_S)
    tc.shrink()
got = tc.allreduce(np.full(4, tc.rank() + 1, np.float32))
assert np.all(got == tc.size() * (tc.size() + 1) / 2), got
print("RESULT", json.dumps({"members": tc.membership()[1], "failure": failure}), flush=True)
"""


@pytest.mark.timeout(120)
def test_a_survivor_vouched_for_is_waited_for_beyond_the_timeout(tmp_path: Path) -> None:
    # With a 2 s timeout, member 0 reaches the agreement more than 2 s after member 1: it is kept
    # because member 1 vouched for it (without that, member 1 would go on alone, below MIN 2).
    token = secrets.token_hex(16)
    store, port = start_store(token)
    env = {"TNT_ELASTIC": "2", "TNT_MASTER_PORT": str(port), "TNT_JOB_TOKEN": token, "TNT_TIMEOUT_S": "2"}
    job = Job(3, SLOW_HANDLER, tmp_path, env=env)
    try:
        deadline = time.monotonic() + 60
        for member in (0, 1):
            out, err = job.procs[member].communicate(timeout=max(1, deadline - time.monotonic()))
            assert job.procs[member].returncode == 0, err[-3000:]
            o = results_of(out)
            assert o["members"] == [0, 1] and o["failure"] in ("Timeout", "PeerFailure"), o
    finally:
        job.kill()
        stop_store(store)
    assert not job.shm_leftovers()


@pytest.mark.timeout(120)
def test_a_replacement_joins_the_survivors(tmp_path: Path) -> None:
    # Member 2 is killed at call 5; the survivors re-form, and a new process (TNT_JOIN=4, as tnt-launch
    # --elastic MIN:MAX starts one) is admitted at the next admission point after it started (every
    # 4th call, from call 12 on), in the place after the survivors; all four finish, checked exactly.
    job, store = elastic_job(4, tmp_path, seed=21, victims=[2], kill_at=5, how="between", admit_every=4,
                             wait_at=10)
    try:
        job.procs[2].wait(60)
        env = {**os.environ, "TNT_RANK": "2", "TNT_SIZE": "4", "TNT_LOCAL_RANK": "2", "TNT_LOCAL_SIZE": "4",
               "TNT_NODE_RANK": "0", "TNT_MASTER_ADDR": "127.0.0.1", "TNT_MASTER_PORT": str(job.store_port),
               "TNT_JOB_ID": job.job_id, "TNT_JOB_TOKEN": job.store_token, "TNT_ELASTIC": "2", "TNT_JOIN": "4",
               "TNT_TIMEOUT_S": "30", "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path)}
        job.procs[2] = subprocess.Popen([sys.executable, str(tmp_path / f"rank_{job.job_id}.py")], env=env,
                                        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        results = job.wait(90)
    finally:
        job.kill()
        stop_store(store)
    for res in results:
        assert res.returncode == 0, f"process {res.rank} exited {res.returncode}:\n{res.stderr[-3000:]}"
    out = [results_of(res.stdout) for res in results]
    # The survivors keep their order; the replacement comes after them.
    assert [o["rank"] for o in out] == [0, 1, 3, 2] and [o["member"] for o in out] == [0, 1, 4, 3]
    for o in out:
        assert o["members"] == [0, 1, 3, 4] and o["size"] == 4 and o["steps"] == 24, o
        assert o["generation"] == 2, o  # the survivors' generation, then the one that admitted it
        check_transports(o)
    assert not job.shm_leftovers()


def test_shrink_refuses_what_it_cannot_cure(tmp_path: Path) -> None:
    # Not elastic; elastic with nothing failed; and a mismatch, which re-forming would not cure.
    code = """
import numpy as np, tnt_comm as tc
try:
    tc.shrink()
except (tc.TntError, ValueError) as e:
    print("REFUSED", type(e).__name__, e)
"""
    job = Job(2, code, tmp_path)
    for res in job.wait(60):
        assert res.returncode == 0 and "REFUSED InvalidArgument" in res.stdout and "this one is not" in res.stdout, res
    token = secrets.token_hex(16)
    store, port = start_store(token)
    env = {"TNT_ELASTIC": "1", "TNT_MASTER_PORT": str(port), "TNT_JOB_TOKEN": token}
    job = Job(2, code, tmp_path, env=env)
    for res in job.wait(60):
        assert "REFUSED InvalidArgument" in res.stdout and "no rank of it failed" in res.stdout, res
    mismatch = """
import numpy as np, tnt_comm as tc
try:
    tc.allreduce(np.ones(4 + tc.rank(), np.float32))
except tc.CollectiveMismatch:
    try:
        tc.shrink()
    except tc.TntError as e:
        print("REFUSED", type(e).__name__, e)
"""
    job = Job(2, mismatch, tmp_path, env=env)
    for res in job.wait(60):
        assert "REFUSED TntError" in res.stdout and "cannot cure" in res.stdout, res
    stop_store(store)
