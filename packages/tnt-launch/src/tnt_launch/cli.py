"""The `tnt-launch` command line: its arguments become a LaunchConfig, which `job.py` carries out
(a launch, a dry run, or --cleanup); --check-build and --timeline-summary answer at once."""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from tnt_launch import __version__, check_build, job, jobs, timeline_summary
from tnt_launch.command import EXECUTABLE, PYTHON, SCRIPT, classify, python_target
from tnt_launch.config import (
    FOREVER_S,
    LOG_LEVELS,
    RESERVED_ENV,
    TRANSPORTS,
    LaunchConfig,
    LaunchError,
    UsageError,
)
from tnt_launch.hosts import LAUNCHERS

USAGE = "tnt-launch [options] -- SCRIPT [ARGS ...]"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

DESCRIPTION = """\
Start a tnt job: SCRIPT runs once per rank, with the environment that tnt_keras and tnt_comm
read to find each other. A .py script runs under Python; a command that starts with a Python
interpreter (python3 train.py) or names a program (./my_benchmark, hostname) runs as given.
Ranks run on this host (-n), on the hosts of a hostfile (reached over ssh), or inside a Slurm
allocation on its nodes, started as the tasks of one srun step.
Only rank 0's output is shown unless --output-on-all-devices is given; the first rank to fail
stops the job, and tnt-launch exits with its status.
"""

EPILOG = """\
examples:
  tnt-launch -n 4 -- train.py --epochs 3
  tnt-launch -n 2 -- python3 -u train.py
  tnt-launch --hostfile hosts --n-per-node 2 --no-gpu -- train.py
  tnt-launch --hostfile hosts --npernode 2 --pin-to-socket -x DATASET=/scratch/data -- train.py
  tnt-launch --hostfile hosts --dry-run -- train.py
  tnt-launch --hostfile hosts --cleanup -- train.py
  tnt-launch -n 2 --timeline trace.json -- train.py && tnt-launch --timeline-summary trace.json
  salloc -N 2 --ntasks-per-node 4 tnt-launch -- train.py     # 8 ranks, started by srun

environment:
  TNT_SSH_OPTS         extra ssh options for reaching other hosts, e.g. "-i ~/.ssh/tnt -l alice"
  TNT_LAUNCH_REGISTRY  folder of the job registry on every host (default /tmp/tnt-launch-UID)
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def _ranks_per_gpu(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f"expected a positive whole number of ranks that share one GPU, got {text!r} "
            "(1, the default, gives every rank a GPU of its own; --no-gpu runs on CPUs)"
        )
    return int(text)


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def _elastic(text: str) -> tuple[int, int | None]:
    """--elastic MIN[:MAX]: the fewest ranks the job may go on with (at least 1), and the most it may
    have with the replacements tnt-launch starts for lost ones (None: no replacements)."""
    low, colon, high = text.partition(":")
    if not low.isdigit() or int(low) < 1 or (colon and (not high.isdigit() or int(high) < int(low))):
        raise argparse.ArgumentTypeError(
            f"expected MIN or MIN:MAX, whole numbers with 1 <= MIN <= MAX, got {text!r}"
        )
    return int(low), int(high) if colon else None


def _timeout(text: str) -> float:
    """--timeout: a positive number of seconds; `inf`, `infinity` or anything >= FOREVER_S means
    no timeout at all and becomes math.inf."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a positive number of seconds, or 'inf' to wait forever, got {text!r}"
        )
    return math.inf if value >= FOREVER_S else value


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port (1-65535), got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tnt-launch",
        usage=USAGE,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"tnt-launch {__version__}")
    _placement_options(parser)
    _output_options(parser)
    _runtime_options(parser)
    _control_options(parser)
    return parser


def _placement_options(parser: argparse.ArgumentParser) -> None:
    single = parser.add_argument_group("single-host execution")
    single.add_argument("-n", dest="nprocs", type=_positive_int, metavar="N",
                        help="start N ranks on this host (default: one per GPU, else one); inside "
                             "a Slurm allocation, N ranks on its nodes (default: its tasks)")

    multi = parser.add_argument_group("multi-host execution")
    multi.add_argument("--hostfile", metavar="FILE",
                       help="run on the hosts listed in FILE, one 'HOST' or 'HOST slots=K' a "
                            "line; inside a Slurm allocation its nodes are used by default")
    multi.add_argument("--n-per-node", "--devices-per-node", "--npernode", dest="n_per_node",
                       type=_positive_int, metavar="N",
                       help="start N ranks on every host (default: the host's slots, else one "
                            "per GPU, else one)")
    multi.add_argument("--ssh-port", type=_port, metavar="PORT",
                       help="port of the ssh servers of the other hosts")
    multi.add_argument("--launcher", choices=LAUNCHERS,
                       help="how ranks start: local (this host), ssh, or srun (one Slurm job step; "
                            "the default inside a Slurm allocation, where -n N places N ranks on "
                            "its nodes); default: srun inside an allocation, else ssh for a "
                            "hostfile's hosts, else local")

    devices = parser.add_argument_group("devices and pinning")
    devices.add_argument("--no-gpu", action="store_true",
                         help="run every rank on CPUs, even where GPUs are found")
    devices.add_argument("--ranks-per-gpu", type=_ranks_per_gpu, metavar="K",
                         help="let K ranks share each GPU: local rank i gets the host's GPU i // "
                              "K, so a host needs one GPU for every K of its ranks, and a host "
                              "without -n, --n-per-node or slots runs K ranks per GPU (default: "
                              "1, a GPU per rank)")
    devices.add_argument("--pin-to-socket", action="store_true",
                         help="bind each rank to the CPUs of one NUMA node (socket) with numactl, "
                              "preferring that node's memory")
    devices.add_argument("--pin-memory-to-socket", action="store_true",
                         help="bind each rank's memory to one NUMA node with numactl")


def _output_options(parser: argparse.ArgumentParser) -> None:
    logging = parser.add_argument_group("logging and output")
    logging.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="WARNING",
                         help="log level of the tnt libraries (default: %(default)s)")
    logging.add_argument("--log-on-all-devices", action="store_true",
                         help="let every rank log, not only rank 0")
    logging.add_argument("--output-on-all-devices", action="store_true",
                         help="show the output of every rank, each line prefixed '[rank N]', "
                              "and let every rank print training progress")
    logging.add_argument("--timeline", metavar="FILE",
                         help="write a trace of the job to FILE: every rank's training steps and "
                              "collectives, in Chrome's trace-event JSON, which Perfetto opens "
                              "(rank 0 writes it, at the end of every fit; its folder must exist)")
    logging.add_argument("--output-dir", metavar="DIR",
                         help="also write each rank's output to DIR/rank-N.out and DIR/rank-N.err")


def _runtime_options(parser: argparse.ArgumentParser) -> None:
    runtime = parser.add_argument_group("runtime settings")
    runtime.add_argument("--fusion-threshold", dest="fusion_threshold_kb",
                         type=_non_negative_int, metavar="KB",
                         help="smallest size of a gradient fusion bucket in KiB; 0 sends each "
                              "tensor alone (default: the library's)")
    runtime.add_argument("--transport", choices=TRANSPORTS, default="auto",
                         help="how ranks exchange data (default: %(default)s: shared memory on a "
                              "host, TCP between hosts, or GPI-2 where tnt_comm is built for "
                              "InfiniBand/RoCE; gpi2: GPI-2 between all ranks)")
    runtime.add_argument("--timeout", dest="timeout_s", type=_timeout, metavar="SECONDS",
                         help="give up on a collective operation that makes no progress for "
                              "SECONDS; 'inf' (or any value of 1e9 or more) waits forever "
                              "(default: the library's)")
    runtime.add_argument("--start-timeout", dest="start_timeout_s", type=_timeout, metavar="SECONDS",
                         help="give up when the ranks have not all started and met within SECONDS; "
                              "'inf' waits forever (default: the library's, the collective timeout "
                              "but at least 60 s)")
    runtime.add_argument("--elastic", dest="elastic", type=_elastic, metavar="MIN[:MAX]",
                         help="keep the job going when ranks are lost (killed, their host gone), as "
                              "long as MIN ranks are left: the survivors re-form the job and a "
                              "tnt-keras fit goes on, still equal to serial training; with MAX, "
                              "tnt-launch starts a replacement for each lost rank (on its host, up to "
                              "MAX ranks and --max-restarts replacements), which joins at the next "
                              "epoch. tnt-launch then holds the job's rendezvous store itself "
                              "(default: the job ends with its first lost rank)")
    runtime.add_argument("--max-restarts", dest="max_restarts", type=_non_negative_int, metavar="N",
                         help="with --elastic MIN:MAX: the most replacement ranks tnt-launch starts "
                              "in the whole job (default: 3)")
    runtime.add_argument("-x", dest="exports", action="extend", nargs="+", default=[],
                         metavar="KEY=VALUE",
                         help="export KEY=VALUE (or KEY with its current value) to every rank; "
                              "repeatable, applied in order")
    runtime.add_argument("--python-interpreter", metavar="COMMAND",
                         help="command that runs SCRIPT, may include arguments; '' runs SCRIPT "
                              "as an executable (default: a Python script runs under "
                              f"{sys.executable}; a command starting with a Python interpreter, "
                              "or a program, runs as given)")


def _control_options(parser: argparse.ArgumentParser) -> None:
    control = parser.add_argument_group("job control")
    control.add_argument("--timeline-summary", metavar="FILE",
                         help="say what a --timeline trace shows per epoch and rank (compute, "
                              "communication, communication not hidden) and draw one step, then exit")
    control.add_argument("--check-build", action="store_true",
                         help="say what the tnt packages of this Python have (transports, GPI-2, "
                              "the TensorFlow op) and exit")
    control.add_argument("--dry-run", action="store_true",
                         help="print every rank's host, device, pinning, command and environment, "
                              "then exit without starting anything")
    control.add_argument("--cleanup", action="store_true",
                         help="stop the processes of earlier tnt-launch jobs of this user on the "
                              "job's hosts (only those running SCRIPT, when given)")
    control.add_argument("--force", action="store_true",
                         help="with --cleanup: kill at once (SIGKILL) instead of SIGTERM first")


def _parse_exports(items: Sequence[str], environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    exports = []
    for item in items:
        name, eq, value = item.partition("=")
        if not _ENV_NAME.match(name):
            raise UsageError(
                f"-x {item}: expected KEY=VALUE or KEY (put the script after '--': {USAGE})"
            )
        if name in RESERVED_ENV:
            hint = (
                "set CUDA_VISIBLE_DEVICES in tnt-launch's own environment to choose GPUs"
                if name == "CUDA_VISIBLE_DEVICES"
                else "tnt-launch sets it for every rank"
            )
            raise UsageError(f"-x {name}: {hint}")
        if not eq:
            if name not in environ:
                raise UsageError(f"-x {name}: {name} is not set here; use -x {name}=VALUE")
            value = environ[name]
        exports.append((name, value))
    return tuple(exports)


def _check_combinations(args: argparse.Namespace, command: Sequence[str]) -> None:
    """Refuses options that make no sense together, or need what this installation lacks."""
    if args.nprocs is not None and args.n_per_node is not None:
        raise UsageError("-n and --n-per-node cannot be combined: -n N starts N ranks on this "
                         "host, --n-per-node N starts N ranks on every host")
    if args.nprocs is not None and args.hostfile is not None:
        raise UsageError("-n starts ranks on this host only; with --hostfile use --n-per-node")
    if args.no_gpu and args.ranks_per_gpu is not None:
        raise UsageError("--ranks-per-gpu and --no-gpu cannot be combined: --no-gpu runs every "
                         "rank on CPUs; leave out one of them")
    if args.force and not args.cleanup:
        raise UsageError("--force only applies to --cleanup")
    if args.cleanup and args.dry_run:
        raise UsageError("--dry-run cannot be combined with --cleanup")
    if not command and not args.cleanup:
        raise UsageError(f"no script given: {USAGE}")
    if args.elastic is not None and args.nprocs is not None and args.elastic[0] > args.nprocs:
        raise UsageError(f"--elastic {args.elastic[0]} asks for more ranks than -n {args.nprocs} starts")
    if args.elastic is not None and args.nprocs is not None and (args.elastic[1] or args.nprocs) < args.nprocs:
        raise UsageError(f"--elastic {args.elastic[0]}:{args.elastic[1]}: MAX is below the {args.nprocs} ranks -n starts")
    if args.max_restarts is not None and (args.elastic is None or args.elastic[1] is None):
        raise UsageError("--max-restarts counts the replacements of --elastic MIN:MAX; give a MAX")
    if args.transport == "gpi2" and not args.cleanup:
        info = check_build.comm_info()
        if info is not None and "gpi2" not in info["transports"]:
            raise UsageError(
                "--transport gpi2: the tnt_comm installed here has no GPI-2 transport (transports: "
                f"{', '.join(info['transports'])}); use auto, shm or tcp, or see `tnt-launch --check-build`"
            )


def _decide_command(
    command: Sequence[str],
    explicit: tuple[str, ...] | None,
    exports: tuple[tuple[str, str], ...],
    environ: Mapping[str, str],
    cwd: str,
) -> tuple[str | None, tuple[str, ...], str, str | None]:
    """How the command runs (command.py decides): (script, interpreter, kind, the script a Python
    command line runs)."""
    script = command[0] if command else None
    job_script = None
    if explicit is not None:
        # The user's word: SCRIPT runs under that command, or, with '', by itself.
        interpreter = explicit
        kind = SCRIPT if interpreter else EXECUTABLE
    elif command:
        # Ranks on this host look for commands on this PATH (or on the one given with -x).
        path = dict(exports).get("PATH", environ.get("PATH", os.defpath))
        decision = classify(command, cwd, path=path)
        kind, script = decision.kind, decision.program
        interpreter = (sys.executable,) if kind == SCRIPT else ()
        if kind == PYTHON:
            target = python_target(command[1:])
            job_script = target[0] if target is not None else None
    else:
        interpreter, kind = (sys.executable,), SCRIPT
    return script, tuple(interpreter), kind, job_script


def parse_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> LaunchConfig:
    """Turn tnt-launch's arguments into a LaunchConfig; raises UsageError for bad ones."""
    environ = os.environ if environ is None else environ
    argv = list(argv)
    if "--" in argv:
        at = argv.index("--")
        options, command = argv[:at], argv[at + 1 :]
    else:
        options, command = argv, []
    args, stray = build_parser().parse_known_args(options)
    if stray:
        word = stray[0]
        if word.startswith("-"):
            raise UsageError(f"unrecognized option {word}")
        raise UsageError(f"unexpected argument {word!r}: put the script after '--': {USAGE}")

    _check_combinations(args, command)

    try:
        explicit = (
            None if args.python_interpreter is None else tuple(shlex.split(args.python_interpreter))
        )
        ssh_options = tuple(shlex.split(environ.get("TNT_SSH_OPTS", "")))
    except ValueError as e:
        raise UsageError(f"cannot split --python-interpreter or TNT_SSH_OPTS: {e}") from None

    cwd = os.getcwd()
    exports = _parse_exports(args.exports, environ)
    script, interpreter, kind, job_script = _decide_command(command, explicit, exports, environ, cwd)
    return LaunchConfig(
        script=script,
        script_args=tuple(command[1:]),
        nprocs=args.nprocs,
        hostfile=args.hostfile,
        n_per_node=args.n_per_node,
        no_gpu=args.no_gpu,
        ranks_per_gpu=1 if args.ranks_per_gpu is None else args.ranks_per_gpu,
        pin_to_socket=args.pin_to_socket,
        pin_memory_to_socket=args.pin_memory_to_socket,
        log_level=args.log_level,
        log_on_all_devices=args.log_on_all_devices,
        output_on_all_devices=args.output_on_all_devices,
        output_dir=args.output_dir,
        timeline=None if args.timeline is None else os.path.join(cwd, args.timeline),
        fusion_threshold_kb=args.fusion_threshold_kb,
        timeout_s=args.timeout_s,
        start_timeout_s=args.start_timeout_s,
        elastic_min=None if args.elastic is None else args.elastic[0],
        elastic_max=None if args.elastic is None else args.elastic[1],
        max_restarts=3 if args.max_restarts is None else args.max_restarts,
        transport=args.transport,
        exports=exports,
        python_interpreter=interpreter,
        command_kind=kind,
        job_script=job_script,
        dry_run=args.dry_run,
        cleanup=args.cleanup,
        force=args.force,
        launcher=args.launcher,
        ssh_port=args.ssh_port,
        ssh_options=ssh_options,
        cwd=cwd,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tnt-launch` command."""
    argv = sys.argv[1:] if argv is None else list(argv)
    options = argv[: argv.index("--")] if "--" in argv else argv
    if "--check-build" in options:
        return check_build.report(sys.stdout)
    if options[:1] == ["--timeline-summary"]:
        return timeline_summary.main(options[1:])
    try:
        config = parse_args(argv)
        return job.run(config)
    except LaunchError as e:
        print(f"tnt-launch: error: {e}", file=sys.stderr)
        return e.exit_code
    except jobs.RegistryError as e:
        print(f"tnt-launch: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tnt-launch: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
