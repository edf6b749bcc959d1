"""The plain configuration of one tnt-launch invocation, and the errors shown to users."""

from __future__ import annotations

from dataclasses import dataclass

from tnt_launch import contract

TRANSPORTS = ("auto", "shm", "tcp", "gpi2")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FOREVER_S = 1e9
"""A --timeout of this many seconds (about 32 years) or more means "wait forever": it is passed to
the ranks as TNT_TIMEOUT_S=inf, so that no deadline computed from it can overflow."""

# Variables tnt-launch computes for every rank; `-x` may not set them.
RESERVED_ENV = (*contract.IDENTITY, contract.ELASTIC, contract.JOIN, "CUDA_VISIBLE_DEVICES")


class LaunchError(Exception):
    """A problem the user can fix. Printed as one line; `exit_code` is tnt-launch's status."""

    exit_code = 1


class UsageError(LaunchError):
    """The command line itself is wrong."""

    exit_code = 2


@dataclass(frozen=True)
class LaunchConfig:
    """Everything the command line says, with defaults applied and combinations checked."""

    script: str | None = None
    script_args: tuple[str, ...] = ()
    nprocs: int | None = None
    hostfile: str | None = None
    n_per_node: int | None = None
    no_gpu: bool = False
    ranks_per_gpu: int = 1
    """--ranks-per-gpu K: K ranks share each GPU; local rank i gets the host's GPU i // K."""
    pin_to_socket: bool = False
    pin_memory_to_socket: bool = False
    log_level: str = "WARNING"
    log_on_all_devices: bool = False
    output_on_all_devices: bool = False
    output_dir: str | None = None
    timeline: str | None = None
    """--timeline: where rank 0 writes the job's trace (an absolute path), as TNT_TIMELINE."""
    fusion_threshold_kb: int | None = None
    timeout_s: float | None = None
    """Seconds a collective may make no progress; math.inf: never time out; None: the library's."""
    start_timeout_s: float | None = None
    """Seconds the ranks may take to meet at start; math.inf: no limit; None: the library's."""
    elastic_min: int | None = None
    """--elastic MIN: the job goes on while MIN ranks are left; None: it ends with its first lost rank."""
    elastic_max: int | None = None
    """--elastic MIN:MAX: replacements for lost ranks, up to MAX ranks; None: no replacements."""
    max_restarts: int = 3
    """--max-restarts: the most replacements in the whole job (with a MAX)."""
    transport: str = "auto"
    exports: tuple[tuple[str, str], ...] = ()
    python_interpreter: tuple[str, ...] = ()
    """What SCRIPT runs under; empty: SCRIPT runs itself (a Python command line, a program)."""
    command_kind: str = "script"
    """"script" (SCRIPT [ARGS] under the interpreter), "python" (a Python command line such as
    `python3 train.py`, run as given) or "executable" (a program, run as given)."""
    job_script: str | None = None
    """What names the job in the registry and for --cleanup when that is not `script`: the script
    (or `-m` module) of a Python command line."""
    dry_run: bool = False
    cleanup: bool = False
    force: bool = False
    launcher: str | None = None
    """--launcher: "local", "ssh" or "srun"; None: chosen from the hosts (hosts.resolve_hosts)."""
    ssh_port: int | None = None
    ssh_options: tuple[str, ...] = ()
    cwd: str = "."

    @property
    def registered_script(self) -> str | None:
        """The script that names the job for --cleanup: `train.py` for both `-- train.py` and
        `-- python3 train.py`."""
        return self.job_script if self.job_script is not None else self.script

    @property
    def pinning(self) -> bool:
        return self.pin_to_socket or self.pin_memory_to_socket
