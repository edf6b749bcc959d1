"""Real two-host jobs: 127.0.0.1 (this host, started directly) and 127.0.0.2 (over ssh to the
test's own sshd). Both are this machine, so psutil sees every process of the job."""

from __future__ import annotations

import re
import shutil
import signal
import time
from pathlib import Path

import pytest
from conftest import (
    RANK,
    STOPPED_RANK,
    Launcher,
    SshServer,
    assert_job_gone,
    read_reports,
    running,
    tree,
)


@pytest.fixture
def two_hosts(launcher: Launcher, sshd: SshServer) -> Path:
    launcher.env["TNT_SSH_OPTS"] = sshd.options
    return sshd.hostfile(launcher.cwd)


def _args(sshd: SshServer, hostfile: Path, *more: str) -> list[str]:
    return ["--hostfile", str(hostfile), "--ssh-port", str(sshd.port), "--no-gpu", *more]


def _pids(reports: list[dict]) -> list[int]:
    return [r["pid"] for r in reports] + [r["child_pid"] for r in reports if r["child_pid"]]


@pytest.mark.timeout(90)
def test_two_hosts_receive_the_contract(launcher: Launcher, sshd: SshServer, two_hosts: Path,
                                        reports: Path) -> None:
    awkward = "it's \"quoted\" $HOME `x` \\ ; | & ü\nsecond line"
    done = launcher.run(_args(sshd, two_hosts, "--n-per-node", "2", "-x", f"AWKWARD={awkward}",
                              "--", RANK, str(reports), "two words", "$HOME"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "stdout line 0 of rank 0\n"
    got = read_reports(reports, 4)
    first = got[0]["env"]
    for rank, report in enumerate(got):
        env = report["env"]
        assert (env["TNT_RANK"], env["TNT_SIZE"], env["TNT_LOCAL_RANK"], env["TNT_LOCAL_SIZE"],
                env["TNT_NODE_RANK"]) == (str(rank), "4", str(rank % 2), "2", str(rank // 2))
        assert env["TNT_MASTER_ADDR"] == "127.0.0.1"
        for name in ("TNT_MASTER_PORT", "TNT_JOB_ID", "TNT_JOB_TOKEN"):
            assert env[name] == first[name]
        assert env["AWKWARD"] == awkward
        assert report["argv"] == [str(reports), "two words", "$HOME"]
        assert report["cwd"] == str(launcher.cwd)
        assert env["PATH"] == launcher.env["PATH"]
        # Ranks 2 and 3 really came through ssh; ranks 0 and 1 did not.
        assert ("SSH_CONNECTION" in env) == (rank >= 2)
    assert got[2]["env"]["SSH_CONNECTION"].split()[2] == "127.0.0.2"
    assert_job_gone(first["TNT_JOB_ID"], _pids(got))


@pytest.mark.timeout(90)
def test_remote_failure_brings_down_both_hosts(launcher: Launcher, sshd: SshServer,
                                               two_hosts: Path, reports: Path) -> None:
    done = launcher.run(_args(sshd, two_hosts, "--n-per-node", "2", "--", RANK, str(reports),
                              "--fail-rank", "3", "--code", "7", "--sleep", "60",
                              "--spawn-child", "--touch-shm"))
    assert done.returncode == 7, done.stderr
    assert ("tnt-launch: rank 3 (host 127.0.0.2, local rank 1) exited with code 7; stopping the "
            "job (3 other rank(s) still running)") in done.stderr
    assert "    rank 3 fails on purpose with code 7\n" in done.stderr
    got = read_reports(reports, 4)
    # Includes /dev/shm/tnt-<job>-test-2 and -3, left by ranks on 127.0.0.2.
    assert_job_gone(got[0]["env"]["TNT_JOB_ID"], _pids(got))


@pytest.mark.timeout(90)
def test_a_stopped_remote_rank_is_named_first(launcher: Launcher, sshd: SshServer,
                                              two_hosts: Path, tmp_path: Path) -> None:
    """The agent on 127.0.0.2 finds rank 3 stopped; the launcher here cannot see that itself."""
    pids = tmp_path / "pids"
    pids.mkdir()
    done = launcher.run(_args(sshd, two_hosts, "--n-per-node", "2", "--", STOPPED_RANK,
                              str(pids), "3"))
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    first = next(line for line in lines if " failed: " in line)
    assert re.fullmatch(
        r"tnt-launch: job \w+ failed: rank 3 on host 127\.0\.0\.2 made no progress \(process stopped, e\.g\. by "
        r"SIGSTOP or a debugger\); rank [012] exited with code 1 after timing out", first
    ), done.stderr
    stopped = int((pids / "rank-3.pid").read_text())
    assert lines[lines.index(first) + 1] == (
        f"tnt-launch: rank 3 (host 127.0.0.2, local rank 1) made no progress: stopped "
        f"process(es) {stopped} (stopped)"
    )
    assert_job_gone(first.split()[2], [int(p.read_text()) for p in pids.glob("*.pid")])


@pytest.mark.timeout(90)
def test_ctrl_c_stops_both_hosts(launcher: Launcher, sshd: SshServer, two_hosts: Path,
                                 reports: Path) -> None:
    proc = launcher.start(_args(sshd, two_hosts, "--", RANK, str(reports), "--sleep", "60",
                                "--spawn-child", "--touch-shm"))
    got = read_reports(reports, 2)
    processes = tree(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert_job_gone(got[0]["env"]["TNT_JOB_ID"], processes + _pids(got))


@pytest.mark.timeout(90)
def test_remote_ranks_die_with_a_killed_launcher(launcher: Launcher, sshd: SshServer,
                                                 two_hosts: Path, reports: Path) -> None:
    proc = launcher.start(_args(sshd, two_hosts, "--", RANK, str(reports), "--sleep", "60",
                                "--spawn-child"))
    got = read_reports(reports, 2)
    left = tree(proc.pid) + _pids(got)
    proc.kill()
    proc.communicate(timeout=30)
    # The ssh connection closes, the remote agent's stdin ends, and it stops its rank.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and left:
        left = [p for p in left if running(p)]
        time.sleep(0.05)
    assert left == []


@pytest.mark.timeout(90)
def test_pinning_on_both_hosts(launcher: Launcher, sshd: SshServer, two_hosts: Path,
                               reports: Path) -> None:
    if shutil.which("numactl") is None:
        print("SKIP: numactl is not installed (Debian: apt-get install numactl)")
        pytest.skip("numactl is not installed")
    done = launcher.run(_args(sshd, two_hosts, "--pin-to-socket", "--", RANK, str(reports)))
    assert done.returncode == 0, done.stderr
    node0 = Path("/sys/devices/system/node/node0/cpulist").read_text().strip()
    for report in read_reports(reports, 2):
        assert report["cpus_allowed"] == node0
        assert "preferred node: 0" in report["numactl_show"]


@pytest.mark.timeout(90)
def test_cleanup_on_both_hosts(launcher: Launcher, sshd: SshServer, two_hosts: Path,
                               reports: Path) -> None:
    proc = launcher.start(_args(sshd, two_hosts, "--", RANK, str(reports), "--sleep", "120"))
    try:
        got = read_reports(reports, 2)
        processes = tree(proc.pid)
        done = launcher.run(["--hostfile", str(two_hosts), "--ssh-port", str(sshd.port),
                             "--cleanup", "--", "rank_report.py"])
        assert done.returncode == 0, done.stderr
        job = got[0]["env"]["TNT_JOB_ID"]
        assert f"stopped job {job}" in done.stdout
        proc.communicate(timeout=30)
        assert_job_gone(job, processes + _pids(got))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.timeout(60)
def test_unreachable_host_is_a_clear_error(launcher: Launcher, sshd: SshServer,
                                           reports: Path) -> None:
    launcher.env["TNT_SSH_OPTS"] = sshd.options
    hostfile = sshd.hostfile(launcher.cwd, "127.0.0.1", "127.0.0.3")  # no sshd listens there
    done = launcher.run(_args(sshd, hostfile, "--", RANK, str(reports)))
    assert done.returncode == 1
    assert done.stderr.startswith("tnt-launch: error: cannot reach host 127.0.0.3 over ssh: ")
    assert "Connection refused" in done.stderr and done.stderr.count("\n") == 1
    assert not list(reports.iterdir())


@pytest.mark.timeout(90)
def test_many_ranks_on_one_host_stay_within_sshds_connection_limit(
    launcher: Launcher, sshd: SshServer, reports: Path
) -> None:
    launcher.env["TNT_SSH_OPTS"] = sshd.options
    hostfile = sshd.hostfile(launcher.cwd, "127.0.0.2 slots=14")
    done = launcher.run(["--hostfile", str(hostfile), "--ssh-port", str(sshd.port), "--no-gpu",
                         "--", RANK, str(reports)])
    assert done.returncode == 0, done.stderr
    got = read_reports(reports, 14)
    assert [r["env"]["TNT_LOCAL_RANK"] for r in got] == [str(r) for r in range(14)]
    assert {r["env"]["TNT_MASTER_ADDR"] for r in got} == {"127.0.0.2"}


@pytest.mark.timeout(90)
def test_job_only_on_another_host_tidies_up_there(launcher: Launcher, sshd: SshServer,
                                                  reports: Path) -> None:
    """No rank runs here, so the shm files the ranks leave are removed on 127.0.0.2 itself."""
    launcher.env["TNT_SSH_OPTS"] = sshd.options
    hostfile = sshd.hostfile(launcher.cwd, "127.0.0.2 slots=2")
    done = launcher.run(["--hostfile", str(hostfile), "--ssh-port", str(sshd.port), "--no-gpu",
                         "--", RANK, str(reports), "--touch-shm", "--fail-rank", "0",
                         "--code", "4", "--sleep", "60"])
    assert done.returncode == 4, done.stderr
    assert "rank 0 (host 127.0.0.2, local rank 0) exited with code 4" in done.stderr
    got = read_reports(reports, 2)
    assert_job_gone(got[0]["env"]["TNT_JOB_ID"], _pids(got), timeout=0)


@pytest.mark.timeout(90)
def test_slurm_allocation_over_ssh(launcher: Launcher, sshd: SshServer, reports: Path) -> None:
    """--launcher ssh inside an allocation: its nodes and task counts, reached over ssh (srun's own
    launch is tested under a real Slurm: integration/test_slurm.py)."""
    launcher.env.update(TNT_SSH_OPTS=sshd.options, SLURM_JOB_ID="77", SLURM_JOB_NODELIST="127.0.0.[1-2]",
                        SLURM_TASKS_PER_NODE="2(x2)")
    done = launcher.run(["--launcher", "ssh", "--ssh-port", str(sshd.port), "--no-gpu", "--", RANK, str(reports)])
    assert done.returncode == 0, done.stderr
    got = read_reports(reports, 4)
    assert [(r["env"]["TNT_NODE_RANK"], r["env"]["TNT_LOCAL_RANK"]) for r in got] == [
        ("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")
    ]
    assert ["SSH_CONNECTION" in r["env"] for r in got] == [False, False, True, True]


@pytest.mark.timeout(90)
def test_gpi2_across_two_hosts(launcher: Launcher, sshd: SshServer, two_hosts: Path,
                               reports: Path) -> None:
    """127.0.0.2 is this machine too, so the machinefile names every rank 127.0.0.1 and GPI-2's
    sockets (its ports) run on across both hosts; the rank over ssh reads no machinefile."""
    done = launcher.run_as_if_gpi2(_args(sshd, two_hosts, "--n-per-node", "2", "--transport",
                                         "gpi2", "--", RANK, str(reports)), timeout=80)
    assert done.returncode == 0, done.stderr
    got = read_reports(reports, 4)
    assert got[0]["machinefile"] == "127.0.0.1\n" * 4
    assert [r["env"]["GASPI_SOCKET"] for r in got] == ["0", "1", "2", "3"]
    assert [r["env"]["GASPI_MFILE"] for r in got][1:] == ["/dev/null"] * 3
    assert len({r["env"]["TNT_GPI2_PORT_BASE"] for r in got}) == 1
    assert not Path(got[0]["env"]["GASPI_MFILE"]).exists()

    # Rank 0 on the other host: tnt-comm derives GPI-2's variables there; none are set.
    elsewhere = reports / "elsewhere"
    elsewhere.mkdir()
    hostfile = sshd.hostfile(launcher.cwd, "127.0.0.2", "127.0.0.1")
    done = launcher.run_as_if_gpi2(_args(sshd, hostfile, "--transport", "gpi2", "--", RANK,
                                         str(elsewhere)), timeout=80)
    assert done.returncode == 0, done.stderr
    for report in read_reports(elsewhere, 2):
        assert report["env"]["TNT_TRANSPORT"] == "gpi2"
        assert not {"GASPI_RANK", "GASPI_MFILE", "TNT_GPI2_PORT_BASE"} & set(report["env"])
    assert list(Path(launcher.env["TNT_LAUNCH_REGISTRY"]).iterdir()) == []
