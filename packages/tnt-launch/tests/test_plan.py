"""Plan building as a pure function: hosts, slots, GPUs, pinning and environment as inputs."""

from __future__ import annotations

import errno
import io
import math
import os
import random
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tnt_launch import gpi2, jobs
from tnt_launch.agents import SshSettings, remote_command, request_line, ssh_argv
from tnt_launch.config import LaunchConfig, LaunchError
from tnt_launch.display import (
    describe_start_timeout,
    describe_timeout,
    environment_lines,
    environment_rows,
    write_plan,
)
from tnt_launch.hosts import Host
from tnt_launch.plan import HostFacts, JobIdentity, PlanError, build_plan, gpi2_sockets

PY = ("/usr/bin/python3",)
ID = JobIdentity("0123456789ab", "f" * 32, 29500)
LOCAL = [Host("localhost", local=True)]
TWO = [Host("node1"), Host("node2")]


def cfg(**kw: object) -> LaunchConfig:
    kw.setdefault("script", "train.py")
    kw.setdefault("python_interpreter", PY)
    return LaunchConfig(**kw)  # type: ignore[arg-type]


def facts(gpus: int = 0, cpus: int = 8, numa: int = 1, numactl: bool = True) -> HostFacts:
    return HostFacts(
        gpus=tuple(str(i) for i in range(gpus)),
        cpus=cpus,
        numa_nodes=tuple((n, cpus // numa) for n in range(numa)),
        has_numactl=numactl,
    )


def plan_for(config: LaunchConfig, hosts: list[Host], host_facts: HostFacts, environ=None):
    return build_plan(config, hosts, {h.name: host_facts for h in hosts}, ID, environ or {})


def test_local_cpu_job_gets_the_whole_contract() -> None:
    plan = plan_for(cfg(nprocs=4, no_gpu=True, script_args=("--lr", "0.1")), LOCAL, facts(cpus=8))
    assert plan.size == 4 and plan.warnings == ()
    for r, spec in enumerate(plan.ranks):
        assert (spec.rank, spec.local_rank, spec.node_rank, spec.local_size) == (r, r, 0, 4)
        assert spec.env == {
            "TNT_RANK": str(r),
            "TNT_SIZE": "4",
            "TNT_LOCAL_RANK": str(r),
            "TNT_LOCAL_SIZE": "4",
            "TNT_NODE_RANK": "0",
            "TNT_MASTER_ADDR": "127.0.0.1",
            "TNT_MASTER_PORT": "29500",
            "TNT_JOB_ID": "0123456789ab",
            "TNT_JOB_TOKEN": "f" * 32,
            "TNT_TRANSPORT": "auto",
            "TNT_LOG_LEVEL": "WARNING",
            "TNT_LOG_ON_ALL_DEVICES": "false",
            "TNT_OUTPUT_ON_ALL_DEVICES": "false",
            "TNT_STDOUT_TTY": "false",
            "TNT_TENSORBOARD_ON_ALL_DEVICES": "false",
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": "2",
            "MKL_NUM_THREADS": "2",
            "TF_NUM_INTRAOP_THREADS": "2",
            "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }
        assert spec.argv == ("/usr/bin/python3", "train.py", "--lr", "0.1")
        assert spec.device == "CPU" and spec.pinning == "-"


def test_only_the_rank_shown_as_it_comes_is_told_of_a_terminal() -> None:
    def told(config: LaunchConfig, hosts: list[Host] = LOCAL, tty: bool = True) -> list[str]:
        plan = build_plan(config, hosts, {h.name: facts() for h in hosts}, ID, {}, stdout_tty=tty)
        return [spec.env["TNT_STDOUT_TTY"] for spec in plan.ranks]

    assert told(cfg(nprocs=3)) == ["true", "false", "false"]
    assert told(cfg(nprocs=1), TWO) == ["true", "false"]  # rank 0 over ssh, too
    assert told(cfg(nprocs=3), tty=False) == ["false"] * 3
    # Lines prefixed '[rank N]' are no terminal, not even for rank 0.
    assert told(cfg(nprocs=3, output_on_all_devices=True)) == ["false"] * 3
    # -x has the last word.
    assert told(cfg(nprocs=2, exports=(("TNT_STDOUT_TTY", "true"),)), tty=False) == ["true"] * 2


def test_one_rank_per_gpu_by_default() -> None:
    plan = plan_for(cfg(), LOCAL, facts(gpus=4, cpus=16))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.ranks] == ["0", "1", "2", "3"]
    assert [s.device for s in plan.ranks] == ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]
    assert plan.ranks[0].env["OMP_NUM_THREADS"] == "4"
    assert plan.warnings == ()


def test_gpu_ids_come_from_the_host() -> None:
    host = HostFacts(gpus=("GPU-aa", "GPU-bb"), cpus=4)
    plan = build_plan(cfg(), LOCAL, {"localhost": host}, ID, {})
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.ranks] == ["GPU-aa", "GPU-bb"]


def test_more_ranks_than_gpus_runs_on_cpus_with_a_warning() -> None:
    plan = plan_for(cfg(nprocs=3), LOCAL, facts(gpus=2))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.ranks] == ["", "", ""]
    assert plan.warnings == (
        (
            "running all ranks on CPUs: localhost has 2 GPU(s) for 3 rank(s) "
            "(--ranks-per-gpu 2 lets 2 ranks share each GPU; "
            "--no-gpu runs on CPUs without this warning)"
        ),
    )


def test_no_gpus_at_all_is_a_note_not_a_warning() -> None:
    plan = plan_for(cfg(), LOCAL, facts())
    assert plan.warnings == ()
    assert plan.notes == ("running all ranks on CPUs: no GPUs found on localhost",)
    assert plan_for(cfg(no_gpu=True), LOCAL, facts()).warnings == ()
    assert plan_for(cfg(no_gpu=True), LOCAL, facts()).notes == ()
    with_gpus = plan_for(cfg(no_gpu=True, nprocs=2), LOCAL, facts(gpus=2))
    assert [s.device for s in with_gpus.ranks] == ["CPU", "CPU"]
    assert with_gpus.ranks[0].env["CUDA_VISIBLE_DEVICES"] == ""


def test_one_host_short_of_gpus_moves_the_whole_job_to_cpus() -> None:
    hosts = [Host("a"), Host("b")]
    plan = build_plan(cfg(n_per_node=2), hosts, {"a": facts(gpus=2), "b": facts(gpus=1)}, ID, {})
    assert {s.device for s in plan.ranks} == {"CPU"}
    assert "b has 1 GPU(s) for 2 rank(s)" in plan.warnings[0]


def test_ranks_share_gpus() -> None:
    # A one-GPU machine runs two ranks on its GPU.
    plan = plan_for(cfg(nprocs=2, ranks_per_gpu=2), LOCAL, facts(gpus=1, cpus=8))
    assert plan.warnings == () and plan.notes == ()
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.ranks] == ["0", "0"]
    assert [s.device for s in plan.ranks] == ["GPU 0", "GPU 0"]
    assert [s.env["TF_FORCE_GPU_ALLOW_GROWTH"] for s in plan.ranks] == ["true", "true"]
    assert [s.env["XLA_PYTHON_CLIENT_PREALLOCATE"] for s in plan.ranks] == ["false", "false"]  # JAX's share
    assert plan.ranks[0].env["OMP_NUM_THREADS"] == "4"  # threads are shared by ranks, not GPUs

    # Local rank i gets GPU i // K; the last GPU may run fewer ranks.
    host = HostFacts(gpus=("GPU-aa", "GPU-bb"), cpus=6)
    plan = build_plan(cfg(nprocs=3, ranks_per_gpu=2), LOCAL, {"localhost": host}, ID, {})
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.ranks] == ["GPU-aa", "GPU-aa", "GPU-bb"]
    plan = plan_for(cfg(nprocs=4, ranks_per_gpu=3), LOCAL, facts(gpus=2))
    assert [s.gpu for s in plan.ranks] == ["0", "0", "0", "1"]

    # Without -n, --n-per-node or slots, a host runs K ranks per GPU.
    plan = plan_for(cfg(ranks_per_gpu=2), LOCAL, facts(gpus=2))
    assert [(s.local_rank, s.local_size, s.gpu) for s in plan.ranks] == [
        (0, 4, "0"), (1, 4, "0"), (2, 4, "1"), (3, 4, "1")
    ]
    plan = plan_for(cfg(ranks_per_gpu=2), TWO, facts(gpus=1))
    assert [(s.host, s.local_rank, s.gpu) for s in plan.ranks] == [
        ("node1", 0, "0"), ("node1", 1, "0"), ("node2", 0, "0"), ("node2", 1, "0")
    ]
    assert [s.env["TNT_RANK"] for s in plan.ranks] == ["0", "1", "2", "3"]

    # More GPUs than needed: the first ones are used.
    plan = plan_for(cfg(nprocs=2, ranks_per_gpu=2), LOCAL, facts(gpus=4))
    assert [s.gpu for s in plan.ranks] == ["0", "0"]

    # K = 1 is today's behaviour, and sets nothing more.
    plan = plan_for(cfg(nprocs=2, ranks_per_gpu=1), LOCAL, facts(gpus=2))
    assert [s.gpu for s in plan.ranks] == ["0", "1"]
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in plan.ranks[0].env


def test_shared_gpus_keep_the_users_memory_growth_setting() -> None:
    config = cfg(nprocs=2, ranks_per_gpu=2)
    mine = plan_for(config, LOCAL, facts(gpus=1), {"TF_FORCE_GPU_ALLOW_GROWTH": "false"})
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in mine.ranks[0].env  # inherited as it is
    config = cfg(nprocs=2, ranks_per_gpu=2, exports=(("TF_FORCE_GPU_ALLOW_GROWTH", "false"),))
    assert plan_for(config, LOCAL, facts(gpus=1)).ranks[1].env["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"


def test_too_few_gpus_to_share_runs_on_cpus_with_a_warning() -> None:
    plan = plan_for(cfg(nprocs=3, ranks_per_gpu=2), LOCAL, facts(gpus=1))
    assert [s.device for s in plan.ranks] == ["CPU"] * 3
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.ranks] == ["", "", ""]
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in plan.ranks[0].env
    assert plan.warnings == (
        (
            "running all ranks on CPUs: localhost has 1 GPU(s) for 3 rank(s) at 2 per GPU "
            "(--ranks-per-gpu 3 lets 3 ranks share each GPU; "
            "--no-gpu runs on CPUs without this warning)"
        ),
    )
    # The hint names the K that fits every host short of GPUs.
    hosts = [Host("a"), Host("b"), Host("c")]
    host_facts = {"a": facts(gpus=4), "b": facts(gpus=2), "c": facts(gpus=1)}
    plan = build_plan(cfg(n_per_node=4), hosts, host_facts, ID, {})
    assert plan.warnings[0].startswith(
        "running all ranks on CPUs: b has 2 GPU(s) for 4 rank(s); c has 1 GPU(s) for 4 rank(s) "
        "(--ranks-per-gpu 4 lets 4 ranks share each GPU;"
    )
    # No hint where sharing cannot help: a host without GPUs.
    host_facts["c"] = facts()
    plan = build_plan(cfg(n_per_node=4, ranks_per_gpu=2), hosts, host_facts, ID, {})
    assert plan.warnings == (
        "running all ranks on CPUs: no GPUs found on c (--no-gpu runs on CPUs without this warning)",
    )
    # No host with a GPU: a note, as without --ranks-per-gpu.
    plan = plan_for(cfg(nprocs=2, ranks_per_gpu=2), LOCAL, facts())
    assert plan.warnings == ()
    assert plan.notes == ("running all ranks on CPUs: no GPUs found on localhost",)


@pytest.mark.parametrize("bad", [0, -1, True, "2", 1.5])
def test_ranks_per_gpu_must_be_a_positive_whole_number(bad: object) -> None:
    with pytest.raises(PlanError) as error:
        plan_for(cfg(nprocs=2, ranks_per_gpu=bad), LOCAL, facts(gpus=1))
    assert str(error.value) == (
        f"--ranks-per-gpu {bad!r}: expected a positive whole number of ranks that share one GPU "
        "(1, the default, gives every rank a GPU of its own)"
    )


def test_hosts_slots_and_n_per_node() -> None:
    hosts = [Host("a", slots=3), Host("b"), Host("c", slots=1)]
    plan = plan_for(cfg(no_gpu=True), hosts, facts(cpus=6))
    layout = [(s.rank, s.host, s.node_rank, s.local_rank, s.local_size) for s in plan.ranks]
    assert layout == [
        (0, "a", 0, 0, 3), (1, "a", 0, 1, 3), (2, "a", 0, 2, 3),
        (3, "b", 1, 0, 1),
        (4, "c", 2, 0, 1),
    ]
    assert [s.env["OMP_NUM_THREADS"] for s in plan.ranks] == ["2", "2", "2", "6", "6"]
    assert {s.env["TNT_SIZE"] for s in plan.ranks} == {"5"}
    assert {s.env["TNT_MASTER_ADDR"] for s in plan.ranks} == {"a"}

    # --n-per-node wins over slots and GPU counts.
    plan = plan_for(cfg(n_per_node=2), hosts, facts(gpus=4))
    assert [(s.host, s.local_rank) for s in plan.ranks] == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0), ("c", 1)
    ]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan.ranks] == ["0", "1"] * 3


CARRIED = {
    "KERAS_BACKEND": "torch",
    "KERAS_HOME": "/scratch/keras",
    "TORCH_HOME": "/scratch/torch",
    "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor",
    "TORCHDYNAMO_VERBOSE": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "CUDA_HOME": "/usr/local/cuda",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "CUDA_LAUNCH_BLOCKING": "1",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "CUDNN_LOGINFO_DBG": "1",
    "MKL_NUM_THREADS": "3",
    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    "XLA_FLAGS": "--xla_gpu_autotune_level=0",
    "JAX_PLATFORMS": "cpu",
    "JAX_ENABLE_X64": "1",
}


def test_remote_ranks_carry_keras_torch_and_cuda_settings() -> None:
    environ = {
        **CARRIED,
        "CUDA_VISIBLE_DEVICES": "4,5",
        "CUDAHOSTCXX": "g++",
        "TORCHVISION_X": "y",
        "HOME": "/home/me",
    }
    hosts = [Host("127.0.0.1", local=True), Host("127.0.0.2")]
    facts_ = {h.name: HostFacts(gpus=("4", "5"), cpus=4) for h in hosts}
    plan = build_plan(cfg(n_per_node=1), hosts, facts_, ID, environ)
    local, remote = plan.ranks
    for name, value in CARRIED.items():
        assert remote.env[name] == value, name
        assert name not in local.env, name  # inherited from tnt-launch's environment as it is
    for name in ("CUDAHOSTCXX", "TORCHVISION_X", "HOME"):
        assert name not in remote.env
    # CUDA_VISIBLE_DEVICES is the rank's own GPU, never tnt-launch's list.
    assert (local.env["CUDA_VISIBLE_DEVICES"], remote.env["CUDA_VISIBLE_DEVICES"]) == ("4", "4")
    # The user's MKL_NUM_THREADS is kept; the other thread variables are set.
    assert remote.env["OMP_NUM_THREADS"] == local.env["OMP_NUM_THREADS"] == "4"
    # In the dry run, the carried variables are marked as such.
    rows = dict(environment_rows(plan))
    assert rows["KERAS_BACKEND"] == "torch  [ranks on other hosts; ranks on this host inherit it]"
    assert "KERAS_BACKEND=torch  [ranks on other hosts; ranks on this host inherit it]" in (
        environment_lines(plan)
    )


def test_remote_ranks_carry_the_environment_and_local_ranks_inherit_it() -> None:
    environ = {
        "PATH": "/opt/venv/bin:/usr/bin",
        "PYTHONPATH": "/src",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "HOME": "/home/me",
        "TNT_SSH_OPTS": "-p 22",
        "TNT_LAUNCH_REGISTRY": "/tmp/x",
    }
    hosts = [Host("127.0.0.1", local=True), Host("127.0.0.2")]
    plan = plan_for(cfg(no_gpu=True), hosts, facts(), environ)
    local, remote = plan.ranks
    assert "PATH" not in local.env
    assert remote.env["PATH"] == "/opt/venv/bin:/usr/bin"
    assert remote.env["PYTHONPATH"] == "/src"
    assert remote.env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    for name in ("HOME", "TNT_SSH_OPTS", "TNT_LAUNCH_REGISTRY"):
        assert name not in remote.env
    assert remote.env["TNT_MASTER_ADDR"] == "127.0.0.1"
    assert remote.env["TNT_RANK"] == "1"


def test_options_and_exports_become_environment() -> None:
    exports = (
        ("A", "1"),
        ("SPACES", "a b  c"),
        ("EQUALS", "x=y=z"),
        ("QUOTES", "it's \"q\" $HOME `x` \\"),
        ("TNT_LOG_LEVEL", "DEBUG"),
        ("A", "2"),
    )
    config = cfg(
        nprocs=1, no_gpu=True, log_level="INFO", log_on_all_devices=True,
        output_on_all_devices=True, fusion_threshold_kb=0, timeout_s=2.5, transport="tcp",
        exports=exports,
    )
    env = plan_for(config, LOCAL, facts(), {"TNT_TENSORBOARD_ON_ALL_DEVICES": "true"}).ranks[0].env
    assert env["TNT_TRANSPORT"] == "tcp"
    assert env["TNT_FUSION_THRESHOLD_KB"] == "0"
    assert env["TNT_TIMEOUT_S"] == "2.5"
    assert env["TNT_LOG_ON_ALL_DEVICES"] == "true"
    assert env["TNT_OUTPUT_ON_ALL_DEVICES"] == "true"
    assert env["TNT_TENSORBOARD_ON_ALL_DEVICES"] == "true"
    # -x is applied last and in order.
    assert env["TNT_LOG_LEVEL"] == "DEBUG"
    assert env["A"] == "2"
    assert env["SPACES"] == "a b  c" and env["EQUALS"] == "x=y=z"
    assert env["QUOTES"] == "it's \"q\" $HOME `x` \\"
    assert list(env)[-4:] == ["A", "SPACES", "EQUALS", "QUOTES"]


@pytest.mark.parametrize(
    ("seconds", "value"),
    [(30.0, "30"), (2.5, "2.5"), (0.001, "0.001"), (123456.7, "123456.7"),
     (999999999.0, "999999999"), (1e9, "inf"), (1e10, "inf"), (1e300, "inf"), (math.inf, "inf")],
)
def test_timeouts_reach_the_ranks_exactly_and_huge_ones_as_inf(seconds: float, value: str) -> None:
    hosts = [Host("127.0.0.1", local=True), Host("127.0.0.2")]
    plan = plan_for(cfg(n_per_node=1, no_gpu=True, timeout_s=seconds), hosts, facts())
    assert [spec.env["TNT_TIMEOUT_S"] for spec in plan.ranks] == [value, value]
    assert plan.timeout == value
    assert dict(environment_rows(plan))["TNT_TIMEOUT_S"] == value


def test_dry_run_states_the_timeout() -> None:
    forever = plan_for(cfg(nprocs=1, no_gpu=True, timeout_s=math.inf), LOCAL, facts())
    assert describe_timeout(forever.timeout) == (
        "Collective timeout: none, collectives wait forever (TNT_TIMEOUT_S=inf)."
    )
    thirty = plan_for(cfg(nprocs=1, no_gpu=True, timeout_s=30.0), LOCAL, facts())
    assert describe_timeout(thirty.timeout) == (
        "Collective timeout: 30 s without progress (TNT_TIMEOUT_S=30)."
    )
    unset = plan_for(cfg(nprocs=1, no_gpu=True), LOCAL, facts())
    assert unset.timeout is None and "TNT_TIMEOUT_S" not in unset.ranks[0].env
    assert describe_timeout(None).startswith("Collective timeout: the library's default")
    # Local ranks inherit a TNT_TIMEOUT_S of tnt-launch's environment.
    inherited = plan_for(cfg(nprocs=1, no_gpu=True), LOCAL, facts(), {"TNT_TIMEOUT_S": "45"})
    assert inherited.timeout == "45"


def test_start_timeout_reaches_the_ranks_and_the_dry_run_states_it() -> None:
    hosts = [Host("127.0.0.1", local=True), Host("127.0.0.2")]
    plan = plan_for(cfg(n_per_node=1, no_gpu=True, timeout_s=2.0, start_timeout_s=90.0), hosts, facts())
    assert [spec.env["TNT_START_TIMEOUT_S"] for spec in plan.ranks] == ["90", "90"]
    assert [spec.env["TNT_TIMEOUT_S"] for spec in plan.ranks] == ["2", "2"]
    assert plan.start_timeout == "90" and dict(environment_rows(plan))["TNT_START_TIMEOUT_S"] == "90"
    assert describe_start_timeout(plan.start_timeout) == (
        "Start timeout: 90 s for every rank to start and meet (TNT_START_TIMEOUT_S=90)."
    )
    forever = plan_for(cfg(nprocs=1, no_gpu=True, start_timeout_s=math.inf), LOCAL, facts())
    assert forever.ranks[0].env["TNT_START_TIMEOUT_S"] == "inf"
    assert describe_start_timeout(forever.start_timeout) == (
        "Start timeout: none, ranks wait forever for each other (TNT_START_TIMEOUT_S=inf)."
    )
    unset = plan_for(cfg(nprocs=1, no_gpu=True), LOCAL, facts())
    assert unset.start_timeout is None and "TNT_START_TIMEOUT_S" not in unset.ranks[0].env
    assert describe_start_timeout(None).startswith("Start timeout: the library's default, the collective timeout")
    inherited = plan_for(cfg(nprocs=1, no_gpu=True), LOCAL, facts(), {"TNT_START_TIMEOUT_S": "120"})
    assert inherited.start_timeout == "120"
    out = io.StringIO()
    write_plan(plan, out)
    lines = out.getvalue().splitlines()
    assert lines[lines.index("Collective timeout: 2 s without progress (TNT_TIMEOUT_S=2).") + 1] == (
        "Start timeout: 90 s for every rank to start and meet (TNT_START_TIMEOUT_S=90)."
    )


def test_user_thread_counts_are_kept() -> None:
    config = cfg(nprocs=2, no_gpu=True)
    env = plan_for(config, LOCAL, facts(), {"OMP_NUM_THREADS": "3"}).ranks[0].env
    assert "OMP_NUM_THREADS" not in env  # inherited from tnt-launch's environment as it is
    assert env["TF_NUM_INTRAOP_THREADS"] == "4"
    config = cfg(nprocs=2, no_gpu=True, exports=(("TF_NUM_INTRAOP_THREADS", "1"),))
    env = plan_for(config, LOCAL, facts()).ranks[0].env
    assert env["TF_NUM_INTRAOP_THREADS"] == "1" and env["OMP_NUM_THREADS"] == "4"


def test_thread_variables_reach_torch_too() -> None:
    # PyTorch sizes its intra-op pool from MKL_NUM_THREADS, else OMP_NUM_THREADS: both are set.
    env = plan_for(cfg(nprocs=4, no_gpu=True), LOCAL, facts(cpus=16)).ranks[0].env
    assert [env[name] for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")] == [
        "4", "4", "4"
    ]
    # The user's MKL_NUM_THREADS is kept (torch takes it over OMP_NUM_THREADS).
    env = plan_for(cfg(nprocs=4, no_gpu=True), LOCAL, facts(cpus=16), {"MKL_NUM_THREADS": "2"}).ranks[0].env
    assert "MKL_NUM_THREADS" not in env and env["OMP_NUM_THREADS"] == "4"
    # The user's OMP_NUM_THREADS, in tnt-launch's environment or with -x, is what MKL and torch
    # fall back on: tnt-launch sets no MKL_NUM_THREADS that would override it.
    env = plan_for(cfg(nprocs=4, no_gpu=True), LOCAL, facts(cpus=16), {"OMP_NUM_THREADS": "1"}).ranks[0].env
    assert "OMP_NUM_THREADS" not in env and "MKL_NUM_THREADS" not in env
    assert env["TF_NUM_INTRAOP_THREADS"] == "4"
    config = cfg(nprocs=4, no_gpu=True, exports=(("OMP_NUM_THREADS", "2"),))
    env = plan_for(config, LOCAL, facts(cpus=16)).ranks[0].env
    assert env["OMP_NUM_THREADS"] == "2" and "MKL_NUM_THREADS" not in env
    # With pinning, the NUMA node's CPUs.
    config = cfg(n_per_node=2, pin_to_socket=True, no_gpu=True)
    env = plan_for(config, TWO, facts(cpus=16, numa=2)).ranks[1].env
    assert env["MKL_NUM_THREADS"] == env["OMP_NUM_THREADS"] == "8"


def test_threads_are_at_least_one() -> None:
    env = plan_for(cfg(nprocs=4, no_gpu=True), LOCAL, facts(cpus=2)).ranks[3].env
    assert env["OMP_NUM_THREADS"] == "1"
    # XLA's one-thread flag (its only count), where the share is one CPU and XLA_FLAGS is the user's own.
    assert env["XLA_FLAGS"] == "--xla_cpu_multi_thread_eigen=false"
    assert "XLA_FLAGS" not in plan_for(cfg(nprocs=2, no_gpu=True), LOCAL, facts(cpus=8)).ranks[0].env
    mine = plan_for(cfg(nprocs=4, no_gpu=True), LOCAL, facts(cpus=2), {"XLA_FLAGS": "--xla_dump_to=/tmp/x"})
    assert "XLA_FLAGS" not in mine.ranks[0].env  # inherited from tnt-launch's environment as it is


def test_pinning_ranks_to_numa_nodes() -> None:
    plan = plan_for(cfg(n_per_node=2, pin_to_socket=True, no_gpu=True), TWO, facts(cpus=16, numa=2))
    assert [s.numa_node for s in plan.ranks] == [0, 1, 0, 1]
    assert plan.ranks[1].argv == (
        "numactl", "--cpunodebind=1", "--preferred=1", "/usr/bin/python3", "train.py"
    )
    assert plan.ranks[1].pinning == "NUMA node 1: cpus, memory preferred"
    assert plan.ranks[1].env["OMP_NUM_THREADS"] == "8"

    plan = plan_for(
        cfg(nprocs=2, pin_to_socket=True, pin_memory_to_socket=True, no_gpu=True),
        LOCAL, facts(cpus=16, numa=4),
    )
    assert plan.ranks[0].argv[:3] == ("numactl", "--cpunodebind=0", "--membind=0")
    assert plan.ranks[1].pinning == "NUMA node 1: cpus, memory bound"
    assert plan.ranks[1].env["OMP_NUM_THREADS"] == "4"

    # Memory alone: no CPU binding, threads shared as without pinning.
    plan = plan_for(cfg(nprocs=2, pin_memory_to_socket=True, no_gpu=True), LOCAL, facts(numa=2))
    assert plan.ranks[1].argv[:2] == ("numactl", "--membind=1")
    assert plan.ranks[1].env["OMP_NUM_THREADS"] == "4"


def test_pinning_errors() -> None:
    with pytest.raises(PlanError, match=r"--pin-to-socket needs numactl, which is not installed "
                                        r"on host localhost"):
        plan_for(cfg(pin_to_socket=True, no_gpu=True), LOCAL, facts(numactl=False))
    with pytest.raises(PlanError, match=r"--pin-to-socket: 2 ranks on host node1, which has only "
                                        r"1 NUMA node\(s\); start at most 1 rank\(s\) per host"):
        plan_for(cfg(n_per_node=2, pin_to_socket=True), TWO, facts(numa=1))
    with pytest.raises(PlanError, match="--pin-memory-to-socket: host localhost reports no NUMA"):
        plan_for(cfg(pin_memory_to_socket=True), LOCAL, facts(numa=0))


def test_a_loopback_first_host_cannot_serve_other_hosts() -> None:
    hosts = [Host("localhost", local=True), Host("node2")]
    with pytest.raises(PlanError, match="ranks on other hosts cannot reach it by that name"):
        plan_for(cfg(no_gpu=True), hosts, facts())


def test_interpreter_with_arguments_and_none() -> None:
    valgrind = ("valgrind", "--leak-check=yes", "python")
    plan = plan_for(cfg(nprocs=1, python_interpreter=valgrind), LOCAL, facts())
    assert plan.ranks[0].argv == ("valgrind", "--leak-check=yes", "python", "train.py")
    plan = plan_for(cfg(nprocs=1, script="./a.out", python_interpreter=()), LOCAL, facts())
    assert plan.ranks[0].argv == ("./a.out",)


def test_dry_run_environment_rows_hide_the_token_and_list_differences() -> None:
    hosts = [Host("127.0.0.1", local=True), Host("127.0.0.2")]
    plan = plan_for(cfg(n_per_node=2, no_gpu=True), hosts, facts(), {"PATH": "/bin"})
    rows = dict(environment_rows(plan))
    assert rows["TNT_RANK"] == "per rank: 0, 1, 2, 3"
    assert rows["TNT_SIZE"] == "4"
    assert "f" * 32 not in rows["TNT_JOB_TOKEN"]
    assert rows["PATH"].startswith("/bin  [ranks on other hosts")
    assert rows["CUDA_VISIBLE_DEVICES"] == '"" (empty)'


# ---------------------------------------------------------------------------------------------
# GPI-2: --transport gpi2

MFILE = "/tmp/tnt-launch-1000/0123456789ab.gpi2-machines"
GPI2_ID = JobIdentity("0123456789ab", "f" * 32, 29500, gpi2_port_base=12288, gpi2_machinefile=MFILE)
GPI2_NAMES = ("GASPI_RANK", "GASPI_SOCKET", "GASPI_NRANKS", "GASPI_MFILE", "TNT_GPI2_PORT_BASE")


def gpi2_plan(config: LaunchConfig, hosts: list[Host], environ=None, identity=GPI2_ID):
    return build_plan(config, hosts, {h.name: facts() for h in hosts}, identity, environ or {})


def test_gpi2_ranks_get_gaspi_variables_a_machinefile_and_a_port_base() -> None:
    config = cfg(nprocs=3, no_gpu=True, transport="gpi2")
    assert gpi2_sockets(config, LOCAL, {"localhost": facts()}, {}) == 3
    base = gpi2.free_port_base(3).base
    assert gpi2.PORT_BASE_LOW <= base <= 31744 and base % 1024 == 0
    identity = JobIdentity("0123456789ab", "f" * 32, 29500, base, MFILE)
    plan = gpi2_plan(config, LOCAL, identity=identity)
    for r, spec in enumerate(plan.ranks):
        assert {name: spec.env[name] for name in GPI2_NAMES} == {
            "GASPI_RANK": str(r),
            "GASPI_SOCKET": str(r),
            "GASPI_NRANKS": "3",
            # GPI-2 reads the machinefile on rank 0 only.
            "GASPI_MFILE": MFILE if r == 0 else "/dev/null",
            "TNT_GPI2_PORT_BASE": str(base),
        }
        assert spec.env["TNT_TRANSPORT"] == "gpi2"
    # Lines as TNT_MASTER_ADDR names this host.
    assert plan.gpi2_machines == ("127.0.0.1",) * 3
    assert (plan.gpi2_machinefile, plan.gpi2_port_base) == (MFILE, base)
    assert plan.gpi2 is not None and MFILE in plan.gpi2
    assert f"TNT_GPI2_PORT_BASE={base}" in plan.gpi2


@pytest.mark.parametrize("transport", ["auto", "shm", "tcp"])
def test_other_transports_get_no_gpi2_variables(transport: str) -> None:
    hosts = [Host("127.0.0.1", local=True), Host("127.0.0.2")]
    config = cfg(n_per_node=2, no_gpu=True, transport=transport)
    plan = gpi2_plan(config, hosts)
    for spec in plan.ranks:
        assert not set(GPI2_NAMES) & set(spec.env)
    assert (plan.gpi2, plan.gpi2_machinefile, plan.gpi2_machines, plan.gpi2_port_base) == (
        None, None, (), None
    )
    assert gpi2_sockets(config, hosts, {h.name: facts() for h in hosts}, {}) == 0


def test_a_users_gpi2_port_base_is_kept() -> None:
    config = cfg(nprocs=2, no_gpu=True, transport="gpi2")
    environ = {"TNT_GPI2_PORT_BASE": "20480"}
    # No range is picked: ranks on this host inherit the user's, ranks elsewhere carry it.
    assert gpi2_sockets(config, LOCAL, {"localhost": facts()}, environ) == 0
    plan = gpi2_plan(config, LOCAL, environ, JobIdentity("0123456789ab", "t", 1, None, MFILE))
    assert all("TNT_GPI2_PORT_BASE" not in spec.env for spec in plan.ranks)
    assert all("GASPI_RANK" in spec.env for spec in plan.ranks)
    assert plan.gpi2_port_base is None and "as you set it" in (plan.gpi2 or "")
    hosts = [Host("127.0.0.1", local=True), Host("127.0.0.2")]
    remote = gpi2_plan(cfg(no_gpu=True, transport="gpi2"), hosts, environ).ranks[1]
    assert remote.env["TNT_GPI2_PORT_BASE"] == "20480"
    # -x wins over the launcher's pick too.
    exports = (("TNT_GPI2_PORT_BASE", "11264"),)
    exported = cfg(nprocs=2, no_gpu=True, transport="gpi2", exports=exports)
    assert gpi2_sockets(exported, LOCAL, {"localhost": facts()}, {}) == 0
    assert {s.env["TNT_GPI2_PORT_BASE"] for s in gpi2_plan(exported, LOCAL).ranks} == {"11264"}


def test_gpi2_on_several_hosts_numbers_sockets_per_machine() -> None:
    hosts = [Host("node1", local=True), Host("node2", slots=3)]
    config = cfg(no_gpu=True, transport="gpi2")
    plan = gpi2_plan(config, hosts)
    assert plan.gpi2_machines == ("node1", "node2", "node2", "node2")
    assert [s.env["GASPI_SOCKET"] for s in plan.ranks] == ["0", "0", "1", "2"]
    assert [s.env["GASPI_MFILE"] for s in plan.ranks] == [MFILE] + ["/dev/null"] * 3
    assert {s.env["TNT_GPI2_PORT_BASE"] for s in plan.ranks} == {"12288"}
    assert gpi2_sockets(config, hosts, {h.name: facts() for h in hosts}, {}) == 3

    # 127.0.0.2 over ssh is this machine too: one name, so GPI-2's sockets (its ports) differ.
    hosts = [Host("127.0.0.1", local=True), Host("127.0.0.2")]
    config = cfg(n_per_node=2, no_gpu=True, transport="gpi2")
    plan = gpi2_plan(config, hosts)
    assert plan.gpi2_machines == ("127.0.0.1",) * 4
    assert [s.env["GASPI_SOCKET"] for s in plan.ranks] == ["0", "1", "2", "3"]
    assert [s.env["TNT_LOCAL_RANK"] for s in plan.ranks] == ["0", "1", "0", "1"]
    assert gpi2_sockets(config, hosts, {h.name: facts() for h in hosts}, {}) == 4


def test_gpi2_is_left_to_tnt_comm_where_the_launcher_cannot_write_rank_0s_machinefile() -> None:
    # Rank 0 on another host: tnt-comm's rank 0 writes the machinefile there and picks the ports.
    config = cfg(no_gpu=True, transport="gpi2")
    plan = gpi2_plan(config, TWO)
    for spec in plan.ranks:
        assert not set(GPI2_NAMES) & set(spec.env)
        assert spec.env["TNT_TRANSPORT"] == "gpi2"
    assert plan.gpi2_machinefile is None and plan.gpi2_machines == ()
    assert plan.gpi2 is not None and "rank 0 runs on node1, not on this host" in plan.gpi2
    assert "tnt-comm derives GASPI_*" in plan.gpi2
    assert gpi2_sockets(config, TWO, {h.name: facts() for h in TWO}, {}) == 0

    # A name GPI-2 would skip (a machinefile line of 64 bytes or more).
    hosts = [Host("node1", local=True), Host("n" * 63)]
    plan = gpi2_plan(config, hosts)
    assert not any("GASPI_RANK" in spec.env for spec in plan.ranks)
    assert "longer than the 62 characters" in (plan.gpi2 or "")


def test_gpi2_in_the_dry_run_one_line_per_value() -> None:
    plan = gpi2_plan(cfg(nprocs=3, no_gpu=True, transport="gpi2"), LOCAL)
    lines = environment_lines(plan)
    for line in ("GASPI_RANK=per rank: 0, 1, 2", "GASPI_SOCKET=per rank: 0, 1, 2",
                 "GASPI_NRANKS=3", f"GASPI_MFILE=per rank: {MFILE}, /dev/null, /dev/null",
                 "TNT_GPI2_PORT_BASE=12288"):
        assert line in lines
    out = io.StringIO()
    write_plan(plan, out)
    text = out.getvalue()
    assert text.endswith("\n") and "GASPI_RANK=per rank: 0, 1, 2\n" in text
    assert f"GPI-2: machinefile {MFILE} (3 line(s)" in text


def test_gpi2_port_base_skips_taken_and_busy_ranges() -> None:
    bases = list(range(10240, 31744 + 1, 1024))
    assert len(bases) == 22
    for seed in range(40):
        base = gpi2.free_port_base(2, rng=random.Random(seed)).base
        assert base in bases
        assert all(gpi2.port_free(base + offset + s) for offset in (0, 256, 512) for s in range(2))
    # A range another running job holds is passed over, though its ports are still free.
    first = gpi2.free_port_base(1, rng=random.Random(7)).base
    assert gpi2.free_port_base(1, taken={first}, rng=random.Random(7)).base != first
    # A port in use (here: socket 1's service port) makes the whole range busy. SO_REUSEADDR as
    # GPI-2 binds: a connection an earlier job left in TIME_WAIT on that port must not fail the
    # bind (it did once in CI, after the GPI-2 tests).
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("", first + 256 + 1))
        busy.listen()
        assert gpi2.free_port_base(2, rng=random.Random(7)).base != first
        assert not gpi2.port_free(first + 256 + 1)
    with pytest.raises(LaunchError, match="at most 256"):
        gpi2.free_port_base(257)
    with pytest.raises(LaunchError, match="no free range of GPI-2 ports"):
        gpi2.free_port_base(1, taken=set(bases))


def test_a_claimed_gpi2_port_base_is_passed_over_until_its_holder_lets_go() -> None:
    """A base another process picked a moment ago, its ports not bound yet, is claimed: the
    claim, not the free ports, must keep a second job off it, from any user and from tnt-comm."""
    first = gpi2.free_port_base(2, rng=random.Random(11))
    ports = [first.base + offset + s for offset in (0, 256, 512) for s in range(2)]
    assert all(gpi2.port_free(p) for p in ports)  # nothing is bound: only the claim holds them
    assert gpi2.PortClaim.take(first.base, 2) is None
    # The names are the contract with tnt-comm's rank 0 (src/transport/gpi2_ports.hpp).
    assert gpi2.claim_name(first.base + 257) == f"tnt-gpi2-ports:{first.base + 256}"
    with socket.socket(socket.AF_UNIX) as other, pytest.raises(OSError):
        other.bind("\0" + gpi2.claim_name(first.base + 512 + 1))
    second = gpi2.free_port_base(2, rng=random.Random(11))
    assert second.base != first.base
    second.close()
    first.close()
    # A claim is all or none: a base one of whose blocks is held elsewhere is refused, and the
    # blocks taken before that one are let go. Above the bases anyone picks (the highest block
    # claimed is below 32768), so no job beside this test claims these blocks.
    spare = 48000 + 8 * random.randrange(1000)  # test_local_runs.py sets 40960 as a user's base
    with socket.socket(socket.AF_UNIX) as block:
        block.bind("\0" + gpi2.claim_name(spare + 512))
        assert gpi2.PortClaim.take(spare, 2) is None
        # spare-256, spare and spare+256: free again after the refused claim.
        whole = gpi2.PortClaim.take(spare - 256, 2)
        assert whole is not None
        # Held until let go.
        assert gpi2.PortClaim.take(spare, 1) is None
        whole.close()
    assert gpi2.PortClaim.take(spare, 2) is not None


def test_where_abstract_sockets_are_forbidden_bases_are_picked_by_free_ports_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A security policy may refuse abstract Unix sockets: a job must still start, as before the
    claims, rather than fail for a claim it cannot make."""
    real_socket = socket.socket

    class Forbidden(real_socket):
        def bind(self, address: object) -> None:
            if self.family == socket.AF_UNIX:
                raise PermissionError(errno.EACCES, "Permission denied")
            super().bind(address)  # type: ignore[arg-type]

    monkeypatch.setattr(gpi2.socket, "socket", Forbidden)
    claim = gpi2.free_port_base(2, rng=random.Random(5))
    assert claim.base in range(10240, 31744 + 1, 1024)
    assert all(gpi2.port_free(claim.base + offset + s) for offset in (0, 256, 512) for s in range(2))
    claim.close()


def test_gpi2_machinefile_is_written_private_and_removed_with_the_job(tmp_path: Path) -> None:
    registry = jobs.registry_dir(str(tmp_path / "registry"))
    path = jobs.machinefile_path(registry, "0123456789ab")
    assert path == os.path.join(registry, "0123456789ab.gpi2-machines")
    jobs.write_machinefile(path, ["node1", "node1", "node2"])
    assert Path(path).read_text() == "node1\nnode1\nnode2\n"  # the last line ends too
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(registry) == ["0123456789ab.gpi2-machines"]  # no temporary file left
    # The end of the job on this host (finish) removes it, beside the job's entries.
    jobs.write_entry(registry, "0123456789ab.launcher.json",
                     {"job_id": "0123456789ab", "processes": [], "gpi2_port_base": 12288})
    jobs.finish_job(registry, "0123456789ab", shm=False)
    assert os.listdir(registry) == []

    # --cleanup removes the machinefile of a job whose launcher was killed (SIGKILL).
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    jobs.write_entry(registry, "fedcba987654.launcher.json", {
        "job_id": "fedcba987654", "processes": [{"pid": dead.pid, "start": 1}],
        "gpi2_port_base": 13312,
    })
    jobs.write_machinefile(jobs.machinefile_path(registry, "fedcba987654"), ["127.0.0.1"])
    assert jobs.gpi2_port_bases(registry) == set()  # only running jobs hold their range
    assert jobs.cleanup(registry) == []
    assert os.listdir(registry) == []


def test_running_jobs_hold_their_gpi2_port_base(tmp_path: Path) -> None:
    registry = jobs.registry_dir(str(tmp_path / "registry"))
    jobs.write_entry(registry, "0123456789ab.launcher.json", {
        "job_id": "0123456789ab", "processes": [jobs.process_entry(os.getpid())],
        "gpi2_port_base": 12288,
    })
    jobs.write_entry(registry, "fedcba987654.launcher.json", {
        "job_id": "fedcba987654", "processes": [jobs.process_entry(os.getpid())],
        "gpi2_port_base": None,
    })
    assert jobs.gpi2_port_bases(registry) == {12288}
    for seed in range(40):
        assert gpi2.free_port_base(1, jobs.gpi2_port_bases(registry), random.Random(seed)).base != 12288


# ---------------------------------------------------------------------------------------------
# Reaching other hosts: argv and quoting


def test_ssh_argv_puts_user_options_first() -> None:
    argv = ssh_argv("node1", SshSettings(2222, ("-o", "ConnectTimeout=3", "-l", "me")), "CMD")
    assert argv == [
        "ssh", "-o", "ConnectTimeout=3", "-l", "me", "-p", "2222",
        "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=15",
        "-o", "ServerAliveCountMax=4", "-T", "-x", "--", "node1", "CMD",
    ]


@pytest.mark.timeout(30)
def test_remote_command_survives_a_shell_with_an_awkward_interpreter_path(tmp_path: Path) -> None:
    """The command string ssh hands to the remote shell, run by a real shell: an interpreter path
    with spaces, quotes and $ still starts the agent, which answers a probe."""
    folder = tmp_path / "it's a \"dir\" $HOME"
    folder.mkdir()
    python = folder / "py thon"
    python.symlink_to(sys.executable)
    command = remote_command(str(python))
    assert shlex.split(command)[0] == f"P={python};"
    done = subprocess.run(["sh", "-c", command], input=request_line({"mode": "probe"}),
                          capture_output=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert b'"cpus"' in done.stdout

    # A missing interpreter falls back to python3 on the PATH.
    done = subprocess.run(["sh", "-c", remote_command(str(folder / "missing"))],
                          input=request_line({"mode": "probe"}), capture_output=True,
                          timeout=30, check=False)
    assert done.returncode == 0, done.stderr


def test_a_spare_host_starts_no_rank_but_has_a_place_for_each_slot() -> None:
    hosts = [Host("node1", slots=2), Host("node2", slots=2, spare=True), Host("node3", slots=1)]
    plan = plan_for(cfg(elastic_min=1, elastic_max=3), hosts, facts(cpus=8))
    assert [(s.rank, s.host, s.node_rank, s.local_rank) for s in plan.ranks] == [
        (0, "node1", 0, 0), (1, "node1", 0, 1), (2, "node3", 1, 0)
    ]
    assert plan.size == 3 and all(s.env["TNT_SIZE"] == "3" for s in plan.ranks)
    # Node ranks after the job's hosts'; the rest as a rank of its own host would have it.
    assert [(s.host, s.node_rank, s.local_rank, s.local_size, s.way) for s in plan.spares] == [
        ("node2", 2, 0, 2, "ssh"), ("node2", 2, 1, 2, "ssh")
    ]
    assert [s.env["TNT_NODE_RANK"] for s in plan.spares] == ["2", "2"]
    assert [s.env["TNT_LOCAL_RANK"] for s in plan.spares] == ["0", "1"]
    assert all(s.env["OMP_NUM_THREADS"] == "4" and s.env["TNT_ELASTIC"] == "1" for s in plan.spares)
    out = io.StringIO()
    write_plan(plan, out)
    assert "3 rank(s) on 2 host(s)" in out.getvalue()
    assert "Spare hosts, for replacements of ranks whose host is gone (--elastic MIN:MAX): node2 (2 slot(s))" in out.getvalue()


def test_n_in_a_slurm_allocation_plans_each_nodes_share_and_a_spare_nodes_tasks() -> None:
    # hosts.py: -n 3 in an allocation of 2+2 tasks fills c1 (2) and c2 (1); c3 is an elastic job's spare.
    hosts = [Host("c1", 2), Host("c2", 1), Host("c3", 2, spare=True)]
    config = cfg(nprocs=3, no_gpu=True, launcher="srun", elastic_min=2, elastic_max=5)
    plan = build_plan(config, hosts, {h.name: facts() for h in hosts}, ID, {}, launcher="srun")
    assert [(spec.host, spec.local_rank) for spec in plan.ranks] == [("c1", 0), ("c1", 1), ("c2", 0)]
    assert [(spec.host, spec.local_rank) for spec in plan.spares] == [("c3", 0), ("c3", 1)]
