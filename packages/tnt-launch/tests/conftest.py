"""Helpers for running the real tnt-launch command, and a throwaway sshd for multi-host tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from job_leftovers import assert_job_gone, processes_of_job, running  # noqa: F401 - the tests take them from here

TESTS = Path(__file__).resolve().parent
RANK = str(TESTS / "rank_report.py")
STOPPED_RANK = str(TESTS / "stopped_rank.py")


@dataclass
class Launcher:
    """Runs `python -m tnt_launch` with a job registry of its own, so that no test can see or
    stop jobs that are not its own."""

    env: dict[str, str]
    cwd: Path

    def argv(self, args: Sequence[str]) -> list[str]:
        return [sys.executable, "-m", "tnt_launch", *args]

    def run(
        self, args: Sequence[str], timeout: float = 60, **kw: object
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(args), cwd=self.cwd, env=self.env, capture_output=True, text=True,
            timeout=timeout, check=False, **kw,  # type: ignore[arg-type]
        )

    def run_as_if_gpi2(
        self, args: Sequence[str], timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """`run` under a tnt-launch told that tnt_comm has GPI-2, which it refuses --transport
        gpi2 without: for ranks that never start GPI-2 (rank_report.py imports nothing of tnt),
        so that the launcher's part of GPI-2 is tested whatever tnt_comm is installed."""
        code = (
            "import sys; from tnt_launch import check_build, cli; "
            "check_build.comm_info = lambda: {'transports': ['shm', 'tcp', 'gpi2']}; "
            "sys.exit(cli.main(sys.argv[1:]))"
        )
        return subprocess.run(
            [sys.executable, "-c", code, *args], cwd=self.cwd, env=self.env, capture_output=True,
            text=True, timeout=timeout, check=False,
        )

    def start(self, args: Sequence[str], **kw: object) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(args), cwd=self.cwd, env=self.env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, **kw,  # type: ignore[call-overload]
        )


@pytest.fixture
def launcher(tmp_path: Path) -> Launcher:
    env = dict(os.environ)
    env["TNT_LAUNCH_REGISTRY"] = str(tmp_path / "registry")
    for name in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                 "TF_NUM_INTRAOP_THREADS", "TF_FORCE_GPU_ALLOW_GROWTH", "XLA_PYTHON_CLIENT_PREALLOCATE",
                 "XLA_FLAGS", "TNT_SSH_OPTS"):
        env.pop(name, None)
    for name in [n for n in env if n.startswith("SLURM_")]:  # run inside an allocation, as outside
        env.pop(name)
    work = tmp_path / "work"
    work.mkdir()
    return Launcher(env, work)


@pytest.fixture
def reports(tmp_path: Path) -> Path:
    path = tmp_path / "reports"
    path.mkdir()
    return path


def read_reports(folder: Path, count: int, timeout: float = 30) -> list[dict]:
    """The reports of ranks 0..count-1, waiting for them to appear."""
    deadline = time.monotonic() + timeout
    while True:
        paths = [folder / f"rank-{r}.json" for r in range(count)]
        if all(p.exists() for p in paths):
            return [json.loads(p.read_text()) for p in paths]
        if time.monotonic() > deadline:
            missing = [p.name for p in paths if not p.exists()]
            raise AssertionError(f"rank reports missing after {timeout} s: {missing}")
        time.sleep(0.05)


def tree(pid: int) -> list[int]:
    """`pid` and its descendants right now."""
    try:
        proc = psutil.Process(pid)
        return [pid] + [c.pid for c in proc.children(recursive=True)]
    except psutil.Error:
        return [pid]


# ---------------------------------------------------------------------------------------------
# A throwaway ssh server on 127.0.0.1 and 127.0.0.2


@dataclass
class SshServer:
    port: int
    options: str
    """What TNT_SSH_OPTS must say to reach it."""

    def hostfile(self, folder: Path, *lines: str) -> Path:
        path = folder / "hostfile"
        path.write_text("\n".join(lines or ("127.0.0.1", "127.0.0.2")) + "\n")
        return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    sshd_bin = "/usr/sbin/sshd"
    for tool, path in (("sshd", sshd_bin), ("ssh", shutil.which("ssh")),
                       ("ssh-keygen", shutil.which("ssh-keygen"))):
        if not path or not os.path.exists(path):
            reason = f"{tool} is not installed (Debian: apt-get install openssh-server)"
            print(f"SKIP multi-host tests: {reason}")
            pytest.skip(reason)
    folder = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)],
                       check=True, capture_output=True)
    (folder / "authorized_keys").write_text((folder / "client_key.pub").read_text())
    os.chmod(folder / "authorized_keys", 0o600)
    port = _free_port()
    user = psutil.Process().username()
    config = folder / "sshd_config"
    config.write_text(
        f"Port {port}\n"
        "ListenAddress 127.0.0.1\n"
        "ListenAddress 127.0.0.2\n"
        f"HostKey {folder / 'host_key'}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\n"
        f"PidFile {folder / 'sshd.pid'}\n"
        f"AllowUsers {user}\n"
        "StrictModes no\n"
        "PermitRootLogin yes\n"
        "UsePAM no\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "X11Forwarding no\n"
        # OpenSSH's defaults, stated: tnt-launch must start many ranks on one host within them.
        "MaxStartups 10:30:100\n"
        "LogLevel ERROR\n"
    )
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    log = open(folder / "sshd.log", "w")  # noqa: SIM115
    server = subprocess.Popen([sshd_bin, "-D", "-e", "-f", str(config)], stdout=log, stderr=log)
    options = (
        f"-i {folder / 'client_key'} -F /dev/null -o IdentitiesOnly=yes "
        "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            probe = subprocess.run(
                ["ssh", *options.split(), "-p", str(port), "-o", "BatchMode=yes",
                 "127.0.0.2", "true"],
                capture_output=True, text=True, timeout=15, check=False,
            )
            if probe.returncode == 0:
                break
            if server.poll() is not None or time.monotonic() > deadline:
                reason = (f"could not start a test sshd: {probe.stderr.strip()} "
                          f"{(folder / 'sshd.log').read_text().strip()}")
                print(f"SKIP multi-host tests: {reason}")
                pytest.skip(reason)
            time.sleep(0.2)
        yield SshServer(port, options)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


# The slowest tests, slowest first (seconds on one of 4 workers on 2 cores, 2026-11-24): they start
# first, and the hundreds of quick ones fill in around them, so that no worker is left with a slow
# one at the end while the others idle. nox hands the tests out one at a time (--maxschedchunk 1);
# pytest-xdist would otherwise send each worker a run of 14 consecutive tests at the start.
SLOWEST = [
    "test_cleanup_without_a_script_stops_every_job",  # 6.5 s
    "test_many_ranks_on_one_host_stay_within_sshds_connection_limit",  # 5.9
    "test_sigterm_escalates_to_sigkill_for_ranks_that_ignore_it",  # 5.5
    "test_in_a_terminal_an_unfinished_line_shows_at_once[ssh]",  # 5.2
    "test_remote_failure_brings_down_both_hosts",  # 5.1
    "test_check_build_reports_this_installation",  # 4.3
    "test_pinning_on_both_hosts",  # 3.7
    "test_a_stopped_remote_rank_is_named_first",  # 3.6
    "test_gpi2_across_two_hosts",  # 3.1
    "test_remote_ranks_die_with_a_killed_launcher",  # 2.9
    "test_job_only_on_another_host_tidies_up_there",  # 2.7
    "test_cleanup_on_both_hosts",  # 2.6
    "test_ctrl_c_stops_both_hosts",  # 2.3
    "test_two_hosts_receive_the_contract",  # 2.3
    "test_cleanup_stops_registered_jobs_and_nothing_else",  # 2.1
    "test_slurm_allocation_without_a_hostfile",  # 2.1
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A stable sort: the other tests keep their order.
    rank = {name: i for i, name in enumerate(SLOWEST)}
    items.sort(key=lambda item: rank.get(item.name, len(SLOWEST)))
