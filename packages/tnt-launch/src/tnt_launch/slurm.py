"""Slurm: what an allocation offers, and the srun line that starts a job's ranks in it.

Inside an allocation (`salloc`, or an `sbatch` script) tnt-launch starts every rank with one srun
step: one task per rank, each running tnt-launch's agent (`_agent.py`), which picks its rank's
request by SLURM_PROCID. `--distribution=arbitrary` with SLURM_HOSTFILE (one node per line, task
i on line i) puts rank r on the node the plan gave it, `--label` lets the supervisor tell the
ranks' output apart, and `--input=all` hands every agent the same request line and control bytes.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tnt_launch.config import LaunchError, UsageError

_LABEL = re.compile(rb"^ *(\d+): ")


@dataclass(frozen=True)
class Allocation:
    """The Slurm job tnt-launch runs in: its nodes and how many tasks each may run."""

    job_id: str
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...] | None = None
    """SLURM_TASKS_PER_NODE, one count per node; None where the allocation gave no task count."""
    cpus_per_task: int | None = None
    """SLURM_CPUS_PER_TASK (`-c`), where set."""

    @property
    def tasks(self) -> int | None:
        return None if self.tasks_per_node is None else sum(self.tasks_per_node)


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _expand_range_list(body: str, nodelist: str) -> list[str]:
    values = []
    for item in body.split(","):
        low, dash, high = item.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise LaunchError(f"cannot read Slurm node list {nodelist!r}: bad range {item!r}")
        if not dash:
            values.append(low)
            continue
        if int(high) < int(low):
            raise LaunchError(f"cannot read Slurm node list {nodelist!r}: bad range {item!r}")
        width = len(low)
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand Slurm's compact node list, e.g. 'gpu[01-03,07],cpu-a[1-2]b[1-2],login'."""
    names: list[str] = []
    for part in _split_top_level(nodelist.strip()):
        if not part:
            continue
        pieces = re.split(r"(\[[^\]]*\])", part)
        choices = []
        for piece in pieces:
            if piece.startswith("["):
                choices.append(_expand_range_list(piece[1:-1], nodelist))
            elif "[" in piece or "]" in piece:
                raise LaunchError(f"cannot read Slurm node list {nodelist!r}: unbalanced brackets")
            else:
                choices.append([piece])
        names.extend("".join(combo) for combo in itertools.product(*choices))
    return names


def expand_counts(text: str, variable: str) -> list[int]:
    """Expand Slurm's compact counts per node, e.g. SLURM_TASKS_PER_NODE='2(x3),1' -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in text.strip().split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if match is None:
            raise LaunchError(f"cannot read {variable}={text!r}: {item!r} is not N or N(xK)")
        counts.extend([int(match[1])] * int(match[2] or 1))
    return counts


def allocation(environ: Mapping[str, str]) -> Allocation | None:
    """The Slurm allocation we run in, or None outside one."""
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not job_id or not nodelist:
        return None
    nodes = tuple(expand_nodelist(nodelist))
    per_node = environ.get("SLURM_TASKS_PER_NODE", "").strip()
    tasks = None
    if per_node:
        counts = expand_counts(per_node, "SLURM_TASKS_PER_NODE")
        if len(counts) != len(nodes):
            raise LaunchError(
                f"SLURM_TASKS_PER_NODE={per_node!r} gives {len(counts)} node(s) a task count, but "
                f"SLURM_JOB_NODELIST names {len(nodes)}"
            )
        tasks = tuple(counts)
    elif (uniform := environ.get("SLURM_NTASKS_PER_NODE", "")).isdigit() and int(uniform) > 0:
        tasks = (int(uniform),) * len(nodes)
    cpus = environ.get("SLURM_CPUS_PER_TASK", "")
    return Allocation(job_id, nodes, tasks, int(cpus) if cpus.isdigit() and int(cpus) > 0 else None)


def refuse_multitask_step(environ: Mapping[str, str]) -> None:
    """tnt-launch started by `srun -n N` (N > 1) would start N jobs: refuse, saying what to do."""
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "")
    if environ.get("SLURM_STEP_ID") is None or not tasks.isdigit() or int(tasks) < 2:
        return
    raise UsageError(
        f"tnt-launch runs as one of {tasks} tasks of a Slurm step (srun -n {tasks}): each task would "
        "start a job of its own. Start tnt-launch once, in the salloc shell or the sbatch script (it "
        "starts the ranks with srun itself), or start the script with srun alone: `srun -n "
        f"{tasks} python train.py` forms one job from Slurm's variables"
    )


def counts(allocation: Allocation, ranks: int | None) -> list[int | None]:
    """Ranks per node: for `-n ranks`, the nodes filled in order (`fill`); else each node's task
    count, or None (one per GPU, else one) where the allocation gives none."""
    if ranks is not None:
        return list(fill(allocation, ranks))
    if allocation.tasks_per_node is not None:
        return list(allocation.tasks_per_node)
    return [None] * len(allocation.nodes)


def fill(allocation: Allocation, ranks: int) -> list[int]:
    """Ranks per node for `-n ranks` in an allocation: the nodes in order, each up to its tasks."""
    if allocation.tasks_per_node is None:
        raise UsageError(
            f"-n {ranks}: the Slurm allocation gives no task count per node (SLURM_TASKS_PER_NODE); "
            "use --n-per-node, or ask Slurm for tasks (salloc -n/--ntasks-per-node)"
        )
    if ranks > sum(allocation.tasks_per_node):
        raise UsageError(
            f"-n {ranks}: the Slurm allocation has {sum(allocation.tasks_per_node)} task(s); ask "
            f"Slurm for {ranks} (salloc -n {ranks}), or start fewer ranks"
        )
    counts, left = [], ranks
    for tasks in allocation.tasks_per_node:
        counts.append(min(tasks, left))
        left -= counts[-1]
    return counts


def srun_argv(
    ranks: int, cpus_per_task: int | None, program: Sequence[str], overlap: bool = False, no_kill: bool = False
) -> list[str]:
    """The srun line that starts one task per rank, placed by SLURM_HOSTFILE; ``overlap`` for a
    step beside the job's first (an elastic job's replacement), on CPUs that step holds; ``no_kill``
    for an elastic job's steps: where slurmctld finds a node failed, it kills a step on that node
    unless the step asked for --no-kill, and the survivors on the other nodes go on."""
    argv = [
        "srun",
        f"--ntasks={ranks}",
        "--distribution=arbitrary",
        "--label",
        "--input=all",
        # tnt-launch stops the job when a rank fails, after asking the others whether they are stuck.
        "--kill-on-bad-exit=0",
        # Every rank's environment travels in the agent's request; the agents get tnt-launch's own.
        "--export=ALL",
        "--quiet",
    ]
    if overlap:
        argv.append("--overlap")
    if no_kill:
        argv.append("--no-kill")
    if cpus_per_task is not None:
        argv.append(f"--cpus-per-task={cpus_per_task}")
    return [*argv, "--", *program]


def query_argv(nodes: int, program: Sequence[str]) -> list[str]:
    """The srun line of a short query (probe, tidy-up) run once on each node, placed by SLURM_HOSTFILE."""
    return [
        "srun", f"--ntasks={nodes}", "--distribution=arbitrary", "--label", "--input=all",
        "--kill-on-bad-exit=0", "--export=ALL", "--quiet", "--overlap", "--cpus-per-task=1", "--", *program,
    ]


def split_label(line: bytes) -> tuple[int, bytes] | None:
    """(task, the line without srun's label) of a line srun wrote with --label, or None."""
    match = _LABEL.match(line)
    if match is None:
        return None
    return int(match[1]), line[match.end() :]
