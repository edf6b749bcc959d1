"""The command line: parsing into a LaunchConfig, help, version and one-line errors."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from conftest import Launcher

from tnt_launch import __version__
from tnt_launch.cli import parse_args
from tnt_launch.config import UsageError


def test_script_and_its_arguments_follow_the_double_dash() -> None:
    config = parse_args(["-n", "2", "--", "train.py", "--epochs", "3", "-n", "7", "--"], {})
    assert config.nprocs == 2
    assert config.script == "train.py"
    assert config.script_args == ("--epochs", "3", "-n", "7", "--")
    assert config.python_interpreter == (sys.executable,)


def test_options_of_the_reference_cli() -> None:
    config = parse_args(
        [
            "--hostfile", "hosts", "--npernode", "2", "--no-gpu", "--pin-to-socket",
            "--pin-memory-to-socket", "--log-level", "info", "--log-on-all-devices",
            "--output-on-all-devices", "--fusion-threshold", "64", "--dry-run",
            "--", "train.py",
        ],
        {},
    )
    assert config.hostfile == "hosts" and config.n_per_node == 2
    assert config.no_gpu and config.pin_to_socket and config.pin_memory_to_socket
    assert config.log_level == "INFO" and config.log_on_all_devices
    assert config.output_on_all_devices and config.fusion_threshold_kb == 64 and config.dry_run
    for alias in ("--n-per-node", "--devices-per-node", "--npernode"):
        assert parse_args([alias, "3", "--", "t.py"], {}).n_per_node == 3


def test_ranks_per_gpu() -> None:
    assert parse_args(["--", "t.py"], {}).ranks_per_gpu == 1
    assert parse_args(["-n", "2", "--ranks-per-gpu", "2", "--", "t.py"], {}).ranks_per_gpu == 2
    assert parse_args(["--ranks-per-gpu=3", "--", "t.py"], {}).ranks_per_gpu == 3


def test_exports_keep_order_spaces_and_equals() -> None:
    config = parse_args(
        ["-x", "DATASET=/scratch/data", "TF_CPP_MIN_LOG_LEVEL=1", "-x", "MSG=a b=c ", "-x", "HOME",
         "EMPTY=", "--", "t.py"],
        {"HOME": "/home/me"},
    )
    assert config.exports == (
        ("DATASET", "/scratch/data"),
        ("TF_CPP_MIN_LOG_LEVEL", "1"),
        ("MSG", "a b=c "),
        ("HOME", "/home/me"),
        ("EMPTY", ""),
    )


def test_interpreter_transport_timeout_and_ssh_settings() -> None:
    config = parse_args(
        ["--python-interpreter", "valgrind --leak-check=yes python", "--transport", "tcp",
         "--timeout", "30", "--start-timeout", "90", "--ssh-port", "2222", "--", "t.py"],
        {"TNT_SSH_OPTS": "-i '/keys/my key' -l alice"},
    )
    assert config.python_interpreter == ("valgrind", "--leak-check=yes", "python")
    assert config.transport == "tcp" and config.timeout_s == 30.0 and config.ssh_port == 2222
    assert config.start_timeout_s == 90.0
    assert config.ssh_options == ("-i", "/keys/my key", "-l", "alice")
    assert parse_args(["--python-interpreter", "", "--", "./a.out"], {}).python_interpreter == ()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("inf", math.inf), ("infinity", math.inf), ("Infinity", math.inf), ("INF", math.inf),
     ("1e10", math.inf), ("1e9", math.inf), ("1e400", math.inf), ("999999999", 999999999.0),
     ("0.5", 0.5), ("600", 600.0)],
)
def test_huge_and_infinite_timeouts_mean_wait_forever(text: str, seconds: float) -> None:
    assert parse_args(["--timeout", text, "--", "t.py"], {}).timeout_s == seconds
    assert parse_args(["--start-timeout", text, "--", "t.py"], {}).start_timeout_s == seconds


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-n", "2", "--n-per-node", "2", "--", "t.py"], "-n and --n-per-node cannot be combined"),
        (["-n", "2", "--hostfile", "h", "--", "t.py"], "-n starts ranks on this host only"),
        (["--force", "--", "t.py"], "--force only applies to --cleanup"),
        (["--cleanup", "--dry-run"], "--dry-run cannot be combined with --cleanup"),
        (["-n", "2"], "no script given"),
        (["-n", "2", "--"], "no script given"),
        (["-n", "2", "t.py"], "unexpected argument 't.py': put the script after '--'"),
        (["-n", "0", "--", "t.py"], "argument -n: expected a positive whole number, got '0'"),
        (["--fusion-threshold", "-1", "--", "t.py"], "argument --fusion-threshold: expected"),
        (["--ranks-per-gpu", "0", "--", "t.py"],
         ("argument --ranks-per-gpu: expected a positive whole number of ranks that share one GPU, "
          "got '0' (1, the default, gives every rank a GPU of its own; --no-gpu runs on CPUs)")),
        (["--ranks-per-gpu", "-2", "--", "t.py"], "argument --ranks-per-gpu: expected a positive"),
        (["--ranks-per-gpu", "1.5", "--", "t.py"], "argument --ranks-per-gpu: expected a positive"),
        (["--ranks-per-gpu", "two", "--", "t.py"], "argument --ranks-per-gpu: expected a positive"),
        (["--ranks-per-gpu", "--", "t.py"], "argument --ranks-per-gpu: expected one argument"),
        (["--no-gpu", "--ranks-per-gpu", "2", "--", "t.py"],
         "--ranks-per-gpu and --no-gpu cannot be combined: --no-gpu runs every rank on CPUs"),
        (["--timeout", "0", "--", "t.py"], "argument --timeout: expected a positive number"),
        (["--timeout", "nan", "--", "t.py"], "argument --timeout: expected a positive number"),
        (["--timeout", "-5", "--", "t.py"], "argument --timeout: expected a positive number"),
        (["--timeout=-inf", "--", "t.py"], "argument --timeout: expected a positive number"),
        (["--timeout", "1e-400", "--", "t.py"], "argument --timeout: expected a positive number"),
        (["--timeout", "forever", "--", "t.py"], "argument --timeout: expected a positive number"),
        (["--start-timeout", "0", "--", "t.py"], "argument --start-timeout: expected a positive number"),
        (["--start-timeout", "soon", "--", "t.py"], "argument --start-timeout: expected a positive number"),
        (["--transport", "mpi", "--", "t.py"], "argument --transport: invalid choice: 'mpi'"),
        (["--log-level", "loud", "--", "t.py"], "argument --log-level: invalid choice: 'LOUD'"),
        (["-x", "train.py", "--", "t.py"], "-x train.py: expected KEY=VALUE or KEY"),
        (["-x", "TNT_RANK=3", "--", "t.py"], "-x TNT_RANK: tnt-launch sets it for every rank"),
        (["-x", "CUDA_VISIBLE_DEVICES=1", "--", "t.py"], "-x CUDA_VISIBLE_DEVICES: set"),
        (["-x", "NOT_SET_ANYWHERE", "--", "t.py"], "-x NOT_SET_ANYWHERE: NOT_SET_ANYWHERE is not"),
        (["--bogus", "--", "t.py"], "unrecognized option --bogus"),
        (["--n", "2", "--", "t.py"], "unrecognized option --n"),
    ],
)
def test_bad_command_lines(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as error:
        parse_args(argv, {})
    assert str(error.value).startswith(message)


@pytest.mark.timeout(60)
def test_errors_are_one_line_and_exit_2(launcher: Launcher) -> None:
    for argv in (["-n", "2", "--n-per-node", "2", "--", "t.py"], ["--force"], ["-n", "2"],
                 ["-n", "1", "--", "missing.py"]):
        done = launcher.run(argv)
        assert done.returncode == 2, done
        assert done.stdout == ""
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("tnt-launch: error: ")
    assert "script missing.py not found in" in done.stderr


@pytest.mark.timeout(60)
def test_help_groups_and_version(launcher: Launcher) -> None:
    done = launcher.run(["--help"])
    assert done.returncode == 0
    text = done.stdout
    assert text.startswith("usage: tnt-launch [options] -- SCRIPT [ARGS ...]")
    groups = ["single-host execution:", "multi-host execution:", "devices and pinning:",
              "logging and output:", "runtime settings:", "job control:"]
    assert [text.index(g) for g in groups] == sorted(text.index(g) for g in groups)
    for option in ("-n N", "--hostfile FILE", "--n-per-node N, --devices-per-node N, --npernode N",
                   "--no-gpu", "--ranks-per-gpu K", "--pin-to-socket", "--pin-memory-to-socket", "--log-level",
                   "--log-on-all-devices", "--output-on-all-devices", "--output-dir DIR",
                   "--fusion-threshold KB", "--transport", "--timeout SECONDS", "--start-timeout SECONDS", "-x KEY=VALUE",
                   "--python-interpreter COMMAND", "--dry-run", "--cleanup", "--force",
                   "--ssh-port PORT", "TNT_SSH_OPTS"):
        assert option in text, option
    done = launcher.run(["--version"])
    assert (done.returncode, done.stdout) == (0, f"tnt-launch {__version__}\n")
    assert __version__ == "0.1.0"


def test_check_build_reports_this_installation(launcher: Launcher) -> None:
    done = launcher.run(["--check-build"])
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout + done.stderr
    try:
        import tnt_comm
    except ImportError:
        assert done.returncode == 1 and lines[0].startswith("tnt_comm: not installed")
    else:
        assert done.returncode == 0, done.stderr
        assert lines[0].startswith(f"tnt_comm {tnt_comm.__version__} (")
        gpi2 = tnt_comm.build_info().get("gpi2")
        if gpi2 is None:
            assert "transports shm, tcp;" in lines[0] and "gpi2: not built in" in lines[0]
        else:  # a tnt_comm built with GPI-2
            assert "transports shm, tcp, gpi2;" in lines[0]
            assert f"gpi2: GPI-2 {gpi2['version']}" in lines[0]
    assert lines[1].startswith("tnt_keras"), lines[1]
    assert "cpu_feature_guard" not in done.stderr  # TensorFlow's start-up lines stay quiet


def test_gpi2_transport_is_refused_where_tnt_comm_lacks_it(launcher: Launcher) -> None:
    tnt_comm = pytest.importorskip("tnt_comm", reason="tnt_comm is not installed beside tnt-launch")
    if "gpi2" in tnt_comm.build_info()["transports"]:
        pytest.skip("the tnt_comm installed here has GPI-2")
    done = launcher.run(["-n", "1", "--transport", "gpi2", "--", "x.py"])
    assert done.returncode == 2
    assert "--transport gpi2: the tnt_comm installed here has no GPI-2 transport" in done.stderr


def test_the_launcher_never_loads_tnt_comms_library() -> None:
    """The environment contract lives in tnt-comm; tnt-launch reads that file by its path, so a login
    node needs tnt-comm's files only, and the launcher's own process never loads its library."""
    code = (
        "import sys, tnt_launch.cli\n"
        "from tnt_launch import agents, contract\n"
        "assert contract.RANK == 'TNT_RANK' and contract.__file__.endswith('tnt_comm/contract.py'), contract.__file__\n"
        "assert [name for name, _ in agents._module_sources()] == ['contract', 'jobs', '_agent']\n"
        "print(sorted(n for n in sys.modules if n.startswith('tnt_comm')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
