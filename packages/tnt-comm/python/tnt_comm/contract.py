"""The environment contract: every variable through which a launcher tells a process that it is a
rank of a job, and how to behave, in one place.

It lives in tnt-comm, on which everything that reads it depends: tnt-comm's runtime reads the
identity and its limits (identity.cpp, which names them in C++), tnt-keras the output policy
(runtime.py). tnt-launch sets them (plan.py, and the agent beside every rank: TNT_REPORT_FD) and
loads this file by its path (tnt_launch/contract.py), so the launcher never loads tnt-comm's compiled
library; tools that start processes of their own (benchmarks/training.py) clear the identity so that
a leftover cannot turn a process into a rank. docs/launch.md lists them for users; docs/design.md
says who reads what.

Standard library only, Python 3.8+, no import of tnt_comm: it travels to other hosts with tnt-launch's
agent (tnt_launch/agents.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# -- Who the rank is: set for every rank; a process without them is a single rank of its own.
RANK = "TNT_RANK"
SIZE = "TNT_SIZE"
LOCAL_RANK = "TNT_LOCAL_RANK"
LOCAL_SIZE = "TNT_LOCAL_SIZE"
NODE_RANK = "TNT_NODE_RANK"
MASTER_ADDR = "TNT_MASTER_ADDR"  # where rank 0's rendezvous store listens
MASTER_PORT = "TNT_MASTER_PORT"
JOB_ID = "TNT_JOB_ID"  # new for every job; also names its shared-memory files
JOB_TOKEN = "TNT_JOB_TOKEN"  # the secret ranks present to each other
IDENTITY = (RANK, SIZE, LOCAL_RANK, LOCAL_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT, JOB_ID, JOB_TOKEN)

# -- Started by plain srun, without tnt-launch: a Slurm step of several tasks is the job, and these
# of Slurm's variables say who the rank is (tnt-comm's identity.cpp reads all it needs; docs/launch.md).
SLURM_STEP_ID = "SLURM_STEP_ID"
SLURM_STEP_NUM_TASKS = "SLURM_STEP_NUM_TASKS"
SLURM_PROCID = "SLURM_PROCID"


def rank_from_environment(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank as its environment says, without starting tnt-comm: TNT_RANK, else the
    task id of a Slurm step of several tasks (plain srun), else 0."""
    environ = os.environ if environ is None else environ
    raw = environ.get(RANK)
    if raw is None and SIZE not in environ and environ.get(SLURM_STEP_ID) is not None:
        tasks = environ.get(SLURM_STEP_NUM_TASKS, "1")
        if tasks.isdigit() and int(tasks) > 1:
            raw = environ.get(SLURM_PROCID)
    try:
        return int(raw or 0)
    except ValueError:
        return 0


# -- How tnt-comm connects and waits (unset: the library's defaults).
TRANSPORT = "TNT_TRANSPORT"  # auto, shm, tcp or gpi2
TIMEOUT_S = "TNT_TIMEOUT_S"  # how long a collective may make no progress; "inf": no limit
START_TIMEOUT_S = "TNT_START_TIMEOUT_S"  # how long the ranks may take to meet
# The fewest ranks an elastic job may go on with (tnt-launch --elastic MIN); set, the store at
# MASTER_ADDR/PORT is the launcher's (it outlives every rank) and survivors may re-form the job.
ELASTIC = "TNT_ELASTIC"
# A replacement rank of an elastic job (tnt-launch --elastic MIN:MAX): the member id it joins as; it
# waits at the store until the job admits it (tnt_comm.admit, at a tnt-keras fit's epoch start).
JOIN = "TNT_JOIN"
GPI2_PORT_BASE = "TNT_GPI2_PORT_BASE"  # GPI-2's first port on every host (--transport gpi2)
FUSION_THRESHOLD_KB = "TNT_FUSION_THRESHOLD_KB"  # the smallest gradient bucket of tnt-keras

# -- How the rank reports: output, logs, and the error it ends with.
LOG_LEVEL = "TNT_LOG_LEVEL"
LOG_ON_ALL_DEVICES = "TNT_LOG_ON_ALL_DEVICES"  # "true": every rank logs, not only rank 0
OUTPUT_ON_ALL_DEVICES = "TNT_OUTPUT_ON_ALL_DEVICES"  # "true": every rank's output is shown
STDOUT_TTY = "TNT_STDOUT_TTY"  # "true": this rank's stdout reaches a terminal as it is written
TENSORBOARD_ON_ALL_DEVICES = "TNT_TENSORBOARD_ON_ALL_DEVICES"
TIMELINE = "TNT_TIMELINE"  # where rank 0 writes the job's trace (tnt-keras' timeline.py)
REPORT_FD = "TNT_REPORT_FD"  # a pipe where tnt-comm writes the exception the rank ends with, as JSON

# -- Threads: no variable of tnt's. tnt-launch sets each rank's share of the CPUs in the variables
# the frameworks read at start (plan.THREAD_VARIABLES: OMP_NUM_THREADS, MKL_NUM_THREADS,
# TF_NUM_INTRAOP_THREADS); PyTorch sizes its intra-op pool (torch.get_num_threads) from
# MKL_NUM_THREADS, else OMP_NUM_THREADS, so tnt-keras' torch backend need not call
# torch.set_num_threads, and a value the user set reaches torch as it would without tnt-launch.
