"""The pieces of tnt-launch's srun launch that need no Slurm: one request for every task, srun's
labels, and the rank a process started by plain srun reads from its environment. The launch itself
runs under a real Slurm in integration/test_slurm.py."""

from __future__ import annotations

import pytest

from tnt_launch import _agent, contract, slurm
from tnt_launch.starters.srun import step_request


def _request(rank: int, gpu: str) -> dict[str, object]:
    return {
        "mode": "run", "rank": rank, "job_id": "j", "cwd": "/w", "grace": 5.0, "argv": ["python", "t.py"],
        "env": {"TNT_SIZE": "3", "TNT_RANK": str(rank), "CUDA_VISIBLE_DEVICES": gpu, "OMP_NUM_THREADS": "4"},
    }


def test_every_task_takes_its_own_rank_out_of_one_request(monkeypatch: pytest.MonkeyPatch) -> None:
    requests = [_request(0, "0"), _request(1, "1"), _request(2, "1")]
    step = step_request(requests)
    # What the ranks share travels once.
    assert step["common"]["env"] == {"TNT_SIZE": "3", "OMP_NUM_THREADS": "4"}
    assert step["ranks"][2] == {"rank": 2, "env": {"TNT_RANK": "2", "CUDA_VISIBLE_DEVICES": "1"}}
    for rank, request in enumerate(requests):
        monkeypatch.setenv("SLURM_PROCID", str(rank))
        assert _agent.task_request(step) == {**request, "task": rank}  # its task: commands addressed to it


def test_queries_without_environment_share_one_request(monkeypatch: pytest.MonkeyPatch) -> None:
    step = step_request([{"mode": "probe", "want_port": True, "rank": 0}, {"mode": "probe", "want_port": False, "rank": 1}])
    monkeypatch.setenv("SLURM_PROCID", "1")
    assert _agent.task_request(step) == {"mode": "probe", "want_port": False, "rank": 1, "env": {}, "task": 1}


def test_a_stop_addressed_to_one_task_reaches_its_agent_alone() -> None:
    # Every agent of a step reads the same stdin: job-wide bytes reach all, '@TASK:C;' one of them,
    # also where a read ends inside it.
    stream = b"S@2:T;U@10:K;@1"
    assert _agent._own_commands(stream, 2) == (b"SU", b"T", b"@1")
    assert _agent._own_commands(stream, 10) == (b"SU", b"K", b"@1")
    assert _agent._own_commands(stream, 1) == (b"SU", b"", b"@1")
    assert _agent._own_commands(b"@1" + b":T;S", 1) == (b"S", b"T", b"")
    # An agent that is not a step's task (ssh, local) takes none of them.
    assert _agent._own_commands(stream, None) == (b"SU", b"", b"@1")


def test_an_elastic_jobs_steps_outlive_a_failed_node() -> None:
    assert "--no-kill" in slurm.srun_argv(4, None, ["agent"], no_kill=True)
    assert "--no-kill" not in slurm.srun_argv(4, None, ["agent"])


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"0: hello\n", (0, b"hello\n")),
        (b" 7: \x1eTNT-AGENT {}\n", (7, b"\x1eTNT-AGENT {}\n")),
        (b"12: 3: nested\n", (12, b"3: nested\n")),
        (b"srun: error: vm: task 1: Killed\n", None),
    ],
)
def test_srun_labels_name_the_task(line: bytes, expected: tuple[int, bytes] | None) -> None:
    assert slurm.split_label(line) == expected


def test_n_fills_the_allocations_nodes_in_order() -> None:
    allocation = slurm.Allocation("1", ("a", "b", "c"), (4, 2, 2))
    assert slurm.fill(allocation, 5) == [4, 1, 0]
    assert slurm.fill(allocation, 8) == [4, 2, 2]


@pytest.mark.parametrize(
    ("environ", "rank"),
    [
        ({"TNT_RANK": "3", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "5"}, 3),
        ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "5"}, 5),
        # TNT_SIZE=1 runs every task as a job of its own; one task is one rank; a batch script no step.
        ({"TNT_SIZE": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "5"}, 0),
        ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}, 0),
        ({"SLURM_NTASKS": "8", "SLURM_PROCID": "0"}, 0),
        ({}, 0),
    ],
)
def test_the_rank_a_process_reads_before_tnt_comm_starts(environ: dict[str, str], rank: int) -> None:
    assert contract.rank_from_environment(environ) == rank
