"""A job formed from a Slurm step's variables (plain `srun -n N python script.py`), without Slurm:
real rank processes get the variables srun would set. integration/test_slurm.py runs the same
under a real slurmd."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from ranks import free_port

SHOW = """
import numpy as np, tnt_comm as tc
from tnt_comm import _core
i = _core.identity()
total = tc.allreduce(np.array([tc.rank() + 1.0], np.float32))[0]
print(i["rank"], i["size"], i["local_rank"], i["local_size"], i["node_rank"], i["job_id"], total)
"""


def step_env(rank: int, tasks: int, job: int, **extra: str) -> dict[str, str]:
    """What srun sets for task `rank` of step 7 of job `job`, all tasks on one node; no TNT_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TNT_", "SLURM_"))}
    env.update(
        SLURM_JOB_ID=str(job),
        SLURM_STEP_ID="7",
        SLURM_STEP_NUM_TASKS=str(tasks),
        SLURM_PROCID=str(rank),
        SLURM_LOCALID=str(rank),
        SLURM_NODEID="0",
        # Bracketed, to read it as Slurm writes it: the first node is 127.0.0.1.
        SLURM_STEP_NODELIST="127.0.0.[1-4],other",
        SLURM_STEP_TASKS_PER_NODE=f"{tasks}(x1),1",
    )
    env.update(extra)
    return env


def start(code: str, envs: list[dict[str, str]], tmp: Path) -> list[subprocess.CompletedProcess[str]]:
    script = tmp / "rank.py"
    script.write_text(code)
    procs = [
        subprocess.Popen([sys.executable, str(script)], env=e, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for e in envs
    ]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=60)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def derived_port(job: int, step: int = 7) -> int:
    """The rendezvous port tnt-comm derives from a Slurm job and step (docs/launch.md)."""
    port = 2048 + (job * 131 + step) % 8192
    return port + 3 if 6817 <= port <= 6819 else port


def job_with_free_port() -> int:
    """A job id whose derived port nobody holds now."""
    rng = random.SystemRandom()
    for _ in range(64):
        job = rng.randrange(10_000, 10_000_000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", derived_port(job)))
            except OSError:
                continue
            return job
    raise RuntimeError("no Slurm job id with a free derived port in 64 tries")


@pytest.mark.timeout(90)
def test_a_step_of_three_tasks_is_one_job_at_the_derived_port(tmp_path: Path) -> None:
    job = job_with_free_port()
    results = start(SHOW, [step_env(r, 3, job) for r in range(3)], tmp_path)
    for r, res in enumerate(results):
        assert res.returncode == 0, res.stderr[-3000:]
        assert res.stdout.split() == [str(r), "3", str(r), "3", "0", f"slurm-{job}-7", "6.0"], res.stdout


@pytest.mark.timeout(90)
def test_tnt_launchs_variables_win_over_slurms(tmp_path: Path) -> None:
    """Ranks that tnt-launch started inside a Slurm step of 5 tasks are the job tnt-launch says."""
    port = free_port()
    envs = [
        step_env(
            r, 5, 1234,
            TNT_RANK=str(r), TNT_SIZE="2", TNT_LOCAL_RANK=str(r), TNT_LOCAL_SIZE="2", TNT_NODE_RANK="0",
            TNT_MASTER_ADDR="127.0.0.1", TNT_MASTER_PORT=str(port), TNT_JOB_ID=f"launch{port}", TNT_JOB_TOKEN="t",
        )
        for r in range(2)
    ]
    for r, res in enumerate(start(SHOW, envs, tmp_path)):
        assert res.returncode == 0, res.stderr[-3000:]
        assert res.stdout.split() == [str(r), "2", str(r), "2", "0", f"launch{port}", "3.0"], res.stdout


REFUSED = """
import tnt_comm as tc
try:
    tc.init()
except ValueError as e:
    print(e)
else:
    print("started")
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"SLURM_PROCID": ""}, "SLURM_STEP_NUM_TASKS=2 but SLURM_PROCID is not set"),
        ({"SLURM_PROCID": "2"}, "SLURM_PROCID=2 is not an integer in [0, 1]"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(y1)"}, "SLURM_STEP_TASKS_PER_NODE=2(y1) does not give node 0 a task 0"),
        ({"SLURM_STEP_NUM_TASKS": "two"}, "SLURM_STEP_NUM_TASKS=two is not an integer"),
    ],
)
def test_unreadable_slurm_variables_are_refused_naming_them(
    change: dict[str, str], message: str, tmp_path: Path
) -> None:
    env = step_env(0, 2, 99, TNT_START_TIMEOUT_S="5", **change)
    (res,) = start(REFUSED, [env], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert message in res.stdout, res.stdout
    if "SLURM_STEP_NUM_TASKS=2" in message:
        assert "set TNT_SIZE=1 to run every task as a job of its own" in res.stdout
