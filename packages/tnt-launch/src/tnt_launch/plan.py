"""From a launch configuration to one specification per rank: the plan `--dry-run` prints.

`build_plan` is a pure function: everything it needs about the hosts (their GPUs, CPUs, NUMA nodes)
and about the job (its id, token and master port) comes in as arguments, so it can be tested and
printed without starting or contacting anything.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tnt_launch import contract, gpi2
from tnt_launch.config import FOREVER_S, LaunchConfig, LaunchError
from tnt_launch.hosts import Host, is_loopback

# Each rank's share of its host's CPUs, unless the user set the variable. Frameworks read them at
# start: OpenMP and TensorFlow's intra-op pool; MKL and PyTorch's intra-op pool (torch.get_num_threads)
# take MKL_NUM_THREADS, else OMP_NUM_THREADS. So no variable of tnt's carries the count, and
# tnt-keras' torch backend need not call torch.set_num_threads.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")
THREAD_FALLBACKS = {"MKL_NUM_THREADS": "OMP_NUM_THREADS"}
# XLA (Keras' JAX backend) sizes its CPU pool from the process's CPUs and has no flag for another
# count, only for one: a rank whose share is one CPU gets it, unless the user set XLA_FLAGS (LeNet-5
# on 2 cores, 2 ranks: tnt 3,884 -> 4,341 samples/s, docs/benchmarks.md).
XLA_ONE_THREAD = ("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
"""A variable the reader falls back on: set by the user, it is the count, and tnt-launch leaves
MKL_NUM_THREADS unset so that MKL and PyTorch take the user's OMP_NUM_THREADS, as they would
without tnt-launch."""

# Ranks that share a GPU (--ranks-per-gpu K > 1): TensorFlow takes nearly all of a GPU's memory at
# start, and JAX 75% of it, so the second rank would find none; with these set they take memory as
# they need it. PyTorch's caching allocator grows on demand already.
GPU_SHARING_VARIABLES = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

# TensorFlow's C++ start-up lines (cpu_feature_guard, absl) on every rank: hidden unless the user
# sets the variable, and shown again with --log-level DEBUG.
TF_LOG_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
TF_LOG_QUIET = "2"
TF_LOG_DEBUG = "0"

# What ranks on other hosts get from tnt-launch's own environment (ranks on this host inherit all
# of it): where the software is, and the settings of the libraries a training script uses (Keras
# and its backend, TensorFlow or PyTorch, and CUDA's libraries). docs/launch.md lists them.
CARRIED_VARIABLES = (
    "PATH",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV",
    "LANG",
    "LC_ALL",
)
CARRIED_PREFIXES = (
    "TNT_",
    "KERAS_",  # KERAS_BACKEND, KERAS_HOME, ...
    "TF_",
    "TORCH_",
    "TORCHDYNAMO_",  # torch.compile (Keras' jit_compile on the torch backend)
    "TORCHINDUCTOR_",
    "PYTORCH_",
    "OMP_",
    "KMP_",
    "MKL_",
    "XLA_",  # XLA_FLAGS, XLA_PYTHON_CLIENT_PREALLOCATE, ...
    "JAX_",  # JAX_PLATFORMS, JAX_ENABLE_X64, ...
    "CUDA_",
    "CUBLAS_",
    "CUDNN_",
    "NCCL_",
    "PYTHON",
)
NOT_CARRIED = (
    "TNT_SSH_OPTS",
    "TNT_LAUNCH_REGISTRY",
    "CUDA_VISIBLE_DEVICES",  # set per rank (RESERVED_ENV)
)

class PlanError(LaunchError):
    """The configuration cannot be carried out on these hosts."""

    exit_code = 2


@dataclass(frozen=True)
class HostFacts:
    """What a job needs to know about one host."""

    gpus: tuple[str, ...] = ()
    cpus: int = 1
    numa_nodes: tuple[tuple[int, int], ...] = ()
    """(node id, number of CPUs) of each NUMA node that has CPUs."""
    has_numactl: bool = False

    @classmethod
    def from_probe(cls, probe: Mapping[str, Any]) -> HostFacts:
        return cls(
            gpus=tuple(str(g) for g in probe.get("gpus", ())),
            cpus=max(1, int(probe.get("cpus", 1))),
            numa_nodes=tuple((int(n), int(c)) for n, c in probe.get("numa", ())),
            has_numactl=bool(probe.get("numactl")),
        )


@dataclass(frozen=True)
class JobIdentity:
    job_id: str
    token: str
    master_port: int
    gpi2_port_base: int | None = None
    """TNT_GPI2_PORT_BASE picked for --transport gpi2; None leaves the choice to tnt-comm."""
    gpi2_machinefile: str | None = None
    """Where the launcher writes the GPI-2 machinefile; needed for --transport gpi2."""
    master_addr: str | None = None
    """Where the store listens when it is not rank 0's: an elastic job's, which tnt-launch holds."""


@dataclass(frozen=True)
class RankSpec:
    """Everything about starting one rank."""

    rank: int
    host: str
    local: bool
    node_rank: int
    local_rank: int
    local_size: int
    gpu: str | None
    numa_node: int | None
    pinning: str
    threads: int
    env: dict[str, str]
    argv: tuple[str, ...]
    way: str = "local"
    """How it starts (the starter of `starters/` by that name): "local", "ssh" or "srun"."""

    @property
    def device(self) -> str:
        return f"GPU {self.gpu}" if self.gpu is not None else "CPU"


@dataclass(frozen=True)
class Plan:
    ranks: tuple[RankSpec, ...]
    hosts: tuple[Host, ...]
    job_id: str
    master_addr: str
    master_port: int
    warnings: tuple[str, ...]
    timeout: str | None = None
    """TNT_TIMEOUT_S as the ranks see it ("inf": no timeout); None: unset, the library's default."""
    start_timeout: str | None = None
    """TNT_START_TIMEOUT_S as the ranks see it; None: unset, the library's default."""
    notes: tuple[str, ...] = ()
    """Facts worth an INFO line but not a warning (all ranks on CPUs where no host has a GPU)."""
    gpi2_machinefile: str | None = None
    """The GPI-2 machinefile the launcher writes when the job starts; None: it writes none."""
    gpi2_machines: tuple[str, ...] = ()
    """Its lines: rank r's host on line r."""
    gpi2_port_base: int | None = None
    """The TNT_GPI2_PORT_BASE the launcher picked and set (not one of the user's)."""
    hide_tf_startup: bool = False
    """Whether the supervisor drops TensorFlow's known start-up lines from the ranks' stderr
    (quiet.py): unless --log-level DEBUG or the user set TF_CPP_MIN_LOG_LEVEL."""
    gpi2: str | None = None
    """With --transport gpi2: one line on what tnt-launch set up for GPI-2, or why it did not."""
    launcher: str = "local"
    """How the ranks start (hosts.LAUNCHERS): "local", "ssh" (this host's ranks directly), or
    "srun" (all of them as the tasks of one srun step)."""
    cpus_per_task: int | None = None
    """srun's --cpus-per-task, from the allocation (SLURM_CPUS_PER_TASK)."""
    cwd: str = "."
    script: str | None = None
    """What names the job in every host's registry, for --cleanup (LaunchConfig.registered_script)."""
    script_path: str | None = None
    registry: str | None = None
    """TNT_LAUNCH_REGISTRY: the registry folder on every host; None: the default."""
    spares: tuple[RankSpec, ...] = ()
    """A rank's place on each slot of the hostfile's spare hosts, for an elastic job's replacements
    whose own host is gone (the supervisor sets the rank, TNT_RANK and TNT_JOIN)."""

    @property
    def size(self) -> int:
        return len(self.ranks)

    def rank_request(self, spec: RankSpec, grace: float) -> dict[str, Any]:
        """What the agent beside rank `spec` is told: everything its start needs (`_agent.run_rank`)."""
        return {
            "mode": "run",
            "rank": spec.rank,
            "job_id": self.job_id,
            "cwd": self.cwd,
            "env": spec.env,
            "argv": list(spec.argv),
            "registry": self.registry,
            "grace": grace,
            "script": self.script,
            "script_path": self.script_path,
        }


def _flag(value: bool) -> str:
    return "true" if value else "false"


def timeout_value(seconds: float) -> str:
    """TNT_TIMEOUT_S (TNT_START_TIMEOUT_S) for a --timeout (--start-timeout) of `seconds`: `inf`
    (no timeout) for infinite or huge values, else the number, written so that it reads back
    exactly (30, 2.5, 0.001)."""
    if math.isnan(seconds) or seconds <= 0:
        raise PlanError(f"invalid timeout {seconds!r}: expected a positive number of seconds")
    if seconds >= FOREVER_S:
        return "inf"
    return repr(float(seconds)).removesuffix(".0")


def _carried(environ: Mapping[str, str]) -> dict[str, str]:
    return {
        name: value
        for name, value in environ.items()
        if (name in CARRIED_VARIABLES or name.startswith(CARRIED_PREFIXES))
        and name not in NOT_CARRIED
    }


def _user_set(config: LaunchConfig, environ: Mapping[str, str]) -> set[str]:
    """Variables the user set: in tnt-launch's environment or with -x."""
    return set(environ) | {name for name, _ in config.exports}


def _master_addr(hosts: Sequence[Host]) -> str:
    if all(h.local for h in hosts):
        return "127.0.0.1"
    master_addr = hosts[0].name
    if is_loopback(master_addr) and not all(is_loopback(h.name) for h in hosts):
        raise PlanError(
            f"the first host, {master_addr!r}, hosts rank 0, but ranks on other hosts cannot "
            "reach it by that name: list it by a name or address the other hosts can reach"
        )
    return master_addr


def gpi2_sockets(
    config: LaunchConfig,
    hosts: Sequence[Host],
    facts: Mapping[str, HostFacts],
    environ: Mapping[str, str],
) -> int:
    """How many GPI-2 sockets (ranks on one host) the TNT_GPI2_PORT_BASE that the launcher picks
    must leave room for; 0 when it picks none: another transport, the user's own
    TNT_GPI2_PORT_BASE, or GPI-2's set-up left to tnt-comm (see `gpi2.skipped`)."""
    if config.transport != "gpi2" or gpi2.PORT_BASE_VARIABLE in _user_set(config, environ):
        return 0
    counts = [_ranks_per_host(config, h, facts[h.name]) for h in hosts]
    return gpi2.sockets_needed(hosts, counts, _master_addr(hosts))


def _ranks_per_host(config: LaunchConfig, host: Host, facts: HostFacts) -> int:
    if host.spare:
        return 0
    return _slots(config, host, facts)


def _slots(config: LaunchConfig, host: Host, facts: HostFacts) -> int:
    """The ranks a host runs (a spare host: the replacements it may take)."""
    if config.nprocs is not None:
        # In a Slurm allocation, -n N filled its nodes in order (hosts.py): each its share, a spare
        # node its tasks; elsewhere -n N runs on this host alone.
        return host.slots if host.slots is not None else config.nprocs
    if config.n_per_node is not None:
        return config.n_per_node
    if host.slots is not None:
        return host.slots
    if not config.no_gpu and facts.gpus:
        return len(facts.gpus) * _ranks_per_gpu(config)
    return 1


def _ranks_per_gpu(config: LaunchConfig) -> int:
    per_gpu = config.ranks_per_gpu
    if isinstance(per_gpu, bool) or not isinstance(per_gpu, int) or per_gpu < 1:
        raise PlanError(
            f"--ranks-per-gpu {per_gpu!r}: expected a positive whole number of ranks that share "
            "one GPU (1, the default, gives every rank a GPU of its own)"
        )
    return per_gpu


def gpus_needed(ranks: int, per_gpu: int) -> int:
    """The GPUs a host needs for `ranks` ranks, `per_gpu` of them on each GPU."""
    return -(-ranks // per_gpu)


def _gpu_shortage(
    hosts: Sequence[Host], counts: Sequence[int], facts: Mapping[str, HostFacts], per_gpu: int
) -> tuple[list[str], list[str]]:
    """(warnings, notes) when some host has too few GPUs for its ranks, and all ranks go to CPUs;
    both empty when every host has enough."""
    short = [
        (h, n) for h, n in zip(hosts, counts) if len(facts[h.name].gpus) < gpus_needed(n, per_gpu)
    ]
    if not short:
        return [], []
    sharing = f" at {per_gpu} per GPU" if per_gpu > 1 else ""
    details = "; ".join(
        f"{h.name} has {len(facts[h.name].gpus)} GPU(s) for {n} rank(s){sharing}"
        if facts[h.name].gpus
        else f"no GPUs found on {h.name}"
        for h, n in short
    )
    if not any(facts[h.name].gpus for h in hosts):
        return [], [f"running all ranks on CPUs: {details}"]
    hint = "--no-gpu runs on CPUs without this warning"
    if all(facts[h.name].gpus for h, _ in short):
        # Sharing would fit every host: say how many ranks each GPU would then run.
        fit = max(gpus_needed(n, len(facts[h.name].gpus)) for h, n in short)
        hint = f"--ranks-per-gpu {fit} lets {fit} ranks share each GPU; {hint}"
    return [f"running all ranks on CPUs: {details} ({hint})"], []


def _pinning(
    config: LaunchConfig, host: Host, facts: HostFacts, count: int
) -> tuple[tuple[int, int], ...]:
    flag = "--pin-to-socket" if config.pin_to_socket else "--pin-memory-to-socket"
    if not facts.has_numactl:
        raise PlanError(
            f"{flag} needs numactl, which is not installed on host {host.name} "
            "(Debian/Ubuntu: apt-get install numactl)"
        )
    nodes = facts.numa_nodes
    if not nodes:
        raise PlanError(f"{flag}: host {host.name} reports no NUMA nodes with CPUs")
    if count > len(nodes):
        raise PlanError(
            f"{flag}: {count} ranks on host {host.name}, which has only {len(nodes)} NUMA "
            f"node(s); start at most {len(nodes)} rank(s) per host or leave out {flag}"
        )
    return nodes


def build_plan(
    config: LaunchConfig,
    hosts: Sequence[Host],
    facts: Mapping[str, HostFacts],
    identity: JobIdentity,
    environ: Mapping[str, str],
    stdout_tty: bool = False,
    launcher: str | None = None,
    cpus_per_task: int | None = None,
) -> Plan:
    """Decide every rank's host, local rank, device, pinning, environment and command.

    `stdout_tty` says whether tnt-launch's stdout is a terminal: then the rank whose stdout is
    shown as it comes (rank 0, unless every rank's output is shown) is told TNT_STDOUT_TTY=true,
    and may draw live progress bars.

    Ranks are numbered host by host, in the order the hosts are listed. A host runs `-n` or
    `--n-per-node` ranks if given, else its hostfile slots, else K per GPU (K: --ranks-per-gpu,
    default 1), else one. Unless `--no-gpu` is given, ranks use GPUs when every host has one GPU
    for every K of its ranks: local rank i gets the host's GPU i // K. Otherwise all ranks run on
    CPUs, with a warning when some host has GPUs that go unused (only a note when no host has any
    GPU). Raises PlanError when pinning is asked for and cannot be done, or K is not a positive
    whole number.

    With `--transport gpi2` and rank 0 on this host, ranks also get GPI-2's GASPI_* variables for
    the machinefile `identity.gpi2_machinefile` (whose lines are `Plan.gpi2_machines`; the caller
    writes it) and `identity.gpi2_port_base` as TNT_GPI2_PORT_BASE, unless the user set one.

    `launcher` (default: "local" when every host is this one, else "ssh") says how ranks start:
    ranks started by srun inherit tnt-launch's environment wherever they run, and get
    `cpus_per_task` threads where the allocation sets it.
    """
    if config.script is None:
        raise PlanError("no script given")
    launcher = launcher or ("local" if all(h.local for h in hosts) else "ssh")
    per_gpu = _ranks_per_gpu(config)
    counts = [_ranks_per_host(config, h, facts[h.name]) for h in hosts]
    if config.elastic_min is not None and config.elastic_min > sum(counts):
        raise PlanError(f"--elastic {config.elastic_min} asks for more ranks than the job's {sum(counts)}")
    if config.elastic_max is not None and config.elastic_max < sum(counts):
        raise PlanError(f"--elastic {config.elastic_min}:{config.elastic_max}: MAX is below the job's {sum(counts)} ranks")
    warnings, notes = ([], []) if config.no_gpu else _gpu_shortage(hosts, counts, facts, per_gpu)
    use_gpus = not config.no_gpu and not warnings and not notes
    master_addr = identity.master_addr or _master_addr(hosts)
    user_set = _user_set(config, environ)
    log_level = next((v.strip().upper() for n, v in reversed(config.exports) if n == contract.LOG_LEVEL),
                     config.log_level)
    # --transport gpi2: GPI-2's own variables, from a machinefile the launcher writes on this host.
    setup = None if config.transport != "gpi2" else gpi2.plan(
        hosts, counts, master_addr, identity.gpi2_machinefile, identity.gpi2_port_base,
        users_port_base=gpi2.PORT_BASE_VARIABLE in user_set,
    )
    job = _JobEnv(
        config, environ, user_set, identity, master_addr, sum(counts), stdout_tty,
        TF_LOG_DEBUG if log_level == "DEBUG" else TF_LOG_QUIET, setup.rank_envs if setup is not None else [],
    )
    started = [(h, c) for h, c in zip(hosts, counts, strict=True) if not h.spare]
    ranks = _rank_specs(config, [h for h, _ in started], [c for _, c in started], facts, job,
                        per_gpu if use_gpus else 0, launcher, cpus_per_task)
    spares = _spare_specs(config, hosts, facts, job, per_gpu if use_gpus else 0, launcher, len(started))
    return Plan(
        ranks=tuple(ranks),
        hosts=tuple(hosts),
        job_id=identity.job_id,
        master_addr=master_addr,
        master_port=identity.master_port,
        warnings=tuple(warnings),
        notes=tuple(notes),
        timeout=ranks[0].env.get("TNT_TIMEOUT_S", environ.get("TNT_TIMEOUT_S")) if ranks else None,
        start_timeout=ranks[0].env.get("TNT_START_TIMEOUT_S", environ.get("TNT_START_TIMEOUT_S")) if ranks else None,
        gpi2_machinefile=setup.machinefile if setup is not None else None,
        gpi2_machines=setup.machines if setup is not None else (),
        gpi2_port_base=setup.port_base if setup is not None else None,
        gpi2=setup.note if setup is not None else None,
        hide_tf_startup=log_level != "DEBUG" and TF_LOG_VARIABLE not in user_set,
        launcher=launcher,
        cpus_per_task=cpus_per_task if launcher == "srun" else None,
        cwd=config.cwd,
        script=config.registered_script,
        script_path=(
            None if config.registered_script is None
            else os.path.realpath(os.path.join(config.cwd, config.registered_script))
        ),
        registry=environ.get("TNT_LAUNCH_REGISTRY") or None,
        spares=tuple(spares),
    )


def _spare_specs(
    config: LaunchConfig, hosts: Sequence[Host], facts: Mapping[str, HostFacts], job: _JobEnv, per_gpu: int,
    launcher: str, first_node: int,
) -> list[RankSpec]:
    """A rank's place on every slot of the spare hosts (node ranks after the job's hosts'), planned
    as the job's own ranks are; on CPUs where a spare host has too few GPUs."""
    spares = [h for h in hosts if h.spare]
    places: list[RankSpec] = []
    for i, host in enumerate(spares):
        slots = _slots(config, host, facts[host.name])
        gpus = per_gpu if per_gpu and len(facts[host.name].gpus) >= gpus_needed(slots, per_gpu) else 0
        for spec in _rank_specs(config, [host], [slots], facts, job, gpus, launcher, None):
            node = first_node + i
            env = {**spec.env, contract.NODE_RANK: str(node)}
            places.append(dataclasses.replace(spec, node_rank=node, env=env))
    return places


def _rank_specs(
    config: LaunchConfig,
    hosts: Sequence[Host],
    counts: Sequence[int],
    facts: Mapping[str, HostFacts],
    job: _JobEnv,
    per_gpu: int,
    launcher: str,
    cpus_per_task: int | None,
) -> list[RankSpec]:
    """Every rank, host by host: its GPU (local rank i gets GPU i // `per_gpu`; 0: CPUs), threads,
    pinning, environment and command."""
    assert config.script is not None
    ranks: list[RankSpec] = []
    for node_rank, (host, count) in enumerate(zip(hosts, counts)):
        nodes = _pinning(config, host, facts[host.name], count) if config.pinning else ()
        for local_rank in range(count):
            gpu = facts[host.name].gpus[local_rank // per_gpu] if per_gpu else None
            threads = max(1, facts[host.name].cpus // count)
            if launcher == "srun" and cpus_per_task is not None:
                threads = cpus_per_task
            numa_node, pin_argv, pinning, threads = _pin(config, nodes, local_rank, threads)
            rank = len(ranks)
            env = job.env(rank, local_rank, count, node_rank, gpu, per_gpu, threads,
                          inherits=host.local or launcher == "srun")
            ranks.append(RankSpec(
                rank=rank, host=host.name, local=host.local, node_rank=node_rank, local_rank=local_rank,
                local_size=count, gpu=gpu, numa_node=numa_node, pinning=pinning, threads=threads, env=env,
                argv=(*pin_argv, *config.python_interpreter, config.script, *config.script_args),
                way="srun" if launcher == "srun" else "local" if host.local else "ssh",
            ))
    return ranks


def _pin(
    config: LaunchConfig, nodes: Sequence[tuple[int, int]], local_rank: int, threads: int
) -> tuple[int | None, list[str], str, int]:
    """(NUMA node, numactl's words, what the pinning is, threads) of one rank; no pinning where
    `nodes` is empty."""
    if not nodes:
        return None, [], "-", threads
    numa_node, node_cpus = nodes[local_rank % len(nodes)]
    pin_argv = ["numactl"]
    what = []
    if config.pin_to_socket:
        pin_argv.append(f"--cpunodebind={numa_node}")
        what.append("cpus")
        threads = node_cpus
    if config.pin_memory_to_socket:
        pin_argv.append(f"--membind={numa_node}")
        what.append("memory bound")
    else:
        pin_argv.append(f"--preferred={numa_node}")
        what.append("memory preferred")
    return numa_node, pin_argv, f"NUMA node {numa_node}: " + ", ".join(what), threads


@dataclass(frozen=True)
class _JobEnv:
    """What every rank's environment is made of: the job's identity and settings, and the user's."""

    config: LaunchConfig
    environ: Mapping[str, str]
    user_set: set[str]
    identity: JobIdentity
    master_addr: str
    size: int
    stdout_tty: bool
    tf_log_level: str
    gpi2_envs: list[dict[str, str]]

    def env(self, rank: int, local_rank: int, count: int, node_rank: int, gpu: str | None, per_gpu: int,
            threads: int, inherits: bool) -> dict[str, str]:
        """Rank `rank`'s environment: the variables carried from tnt-launch's own (unless it
        `inherits` all of it: ranks on this host, and srun's), the contract, the launcher's
        settings, then the user's -x."""
        config, identity, user_set = self.config, self.identity, self.user_set
        env = {} if inherits else _carried(self.environ)
        env.update(
            {
                contract.RANK: str(rank),
                contract.SIZE: str(self.size),
                contract.LOCAL_RANK: str(local_rank),
                contract.LOCAL_SIZE: str(count),
                contract.NODE_RANK: str(node_rank),
                contract.MASTER_ADDR: self.master_addr,
                contract.MASTER_PORT: str(identity.master_port),
                contract.JOB_ID: identity.job_id,
                contract.JOB_TOKEN: identity.token,
                contract.TRANSPORT: config.transport,
            }
        )
        if self.gpi2_envs:
            env.update(self.gpi2_envs[rank])
        if config.elastic_min is not None:
            env[contract.ELASTIC] = str(config.elastic_min)
        if config.fusion_threshold_kb is not None:
            env[contract.FUSION_THRESHOLD_KB] = str(config.fusion_threshold_kb)
        if config.timeout_s is not None:
            env[contract.TIMEOUT_S] = timeout_value(config.timeout_s)
        if config.start_timeout_s is not None:
            env[contract.START_TIMEOUT_S] = timeout_value(config.start_timeout_s)
        env[contract.LOG_LEVEL] = config.log_level
        env[contract.LOG_ON_ALL_DEVICES] = _flag(config.log_on_all_devices)
        env[contract.OUTPUT_ON_ALL_DEVICES] = _flag(config.output_on_all_devices)
        # Lines prefixed '[rank N]' and hidden output reach no terminal as they are written.
        env[contract.STDOUT_TTY] = _flag(self.stdout_tty and rank == 0 and not config.output_on_all_devices)
        env[contract.TENSORBOARD_ON_ALL_DEVICES] = self.environ.get(contract.TENSORBOARD_ON_ALL_DEVICES, "false")
        if config.timeline is not None:
            env[contract.TIMELINE] = config.timeline
        # An empty list hides every GPU, so CPU ranks stay on CPUs.
        env["CUDA_VISIBLE_DEVICES"] = gpu if gpu is not None else ""
        for name in THREAD_VARIABLES:
            if name not in user_set and THREAD_FALLBACKS.get(name) not in user_set:
                env[name] = str(threads)
        if threads == 1 and XLA_ONE_THREAD[0] not in user_set:
            env[XLA_ONE_THREAD[0]] = XLA_ONE_THREAD[1]
        if gpu is not None and per_gpu > 1:
            for name, value in GPU_SHARING_VARIABLES.items():
                if name not in user_set:
                    env[name] = value
        if "PYTHONUNBUFFERED" not in user_set:
            env["PYTHONUNBUFFERED"] = "1"
        if TF_LOG_VARIABLE not in user_set:
            env[TF_LOG_VARIABLE] = self.tf_log_level
        env.update(config.exports)
        return env
