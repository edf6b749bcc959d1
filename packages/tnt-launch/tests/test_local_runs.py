"""Real local jobs of 1-4 ranks: what every rank receives, and where output goes."""

from __future__ import annotations

import os
import pty
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import RANK, Launcher, assert_job_gone, read_reports


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [1, 2, 4])
def test_every_rank_receives_the_contract(launcher: Launcher, reports: Path, size: int) -> None:
    done = launcher.run(["-n", str(size), "--no-gpu", "--", RANK, str(reports), "--", "a b", "c=d"])
    assert done.returncode == 0, done.stderr
    assert done.stderr == "stderr line of rank 0\n"
    assert done.stdout == "stdout line 0 of rank 0\n"

    got = read_reports(reports, size)
    cpus = len(os.sched_getaffinity(0))
    first = got[0]["env"]
    assert re.fullmatch(r"[A-Za-z0-9]{12}", first["TNT_JOB_ID"])
    assert re.fullmatch(r"[0-9a-f]{32}", first["TNT_JOB_TOKEN"])
    assert 1 <= int(first["TNT_MASTER_PORT"]) <= 65535
    for rank, report in enumerate(got):
        env = report["env"]
        assert report["argv"] == [str(reports), "--", "a b", "c=d"]
        assert report["cwd"] == str(launcher.cwd)
        assert {k: env[k] for k in ("TNT_RANK", "TNT_SIZE", "TNT_LOCAL_RANK", "TNT_LOCAL_SIZE",
                                    "TNT_NODE_RANK", "TNT_MASTER_ADDR")} == {
            "TNT_RANK": str(rank),
            "TNT_SIZE": str(size),
            "TNT_LOCAL_RANK": str(rank),
            "TNT_LOCAL_SIZE": str(size),
            "TNT_NODE_RANK": "0",
            "TNT_MASTER_ADDR": "127.0.0.1",
        }
        for name in ("TNT_MASTER_PORT", "TNT_JOB_ID", "TNT_JOB_TOKEN"):
            assert env[name] == first[name]
        assert env["TNT_TRANSPORT"] == "auto"
        assert env["TNT_LOG_LEVEL"] == "WARNING"
        for name in ("TNT_LOG_ON_ALL_DEVICES", "TNT_OUTPUT_ON_ALL_DEVICES",
                     "TNT_TENSORBOARD_ON_ALL_DEVICES"):
            assert env[name] == "false"
        assert "TNT_TIMEOUT_S" not in env and "TNT_FUSION_THRESHOLD_KB" not in env
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        share = str(max(1, cpus // size))
        assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == env["TF_NUM_INTRAOP_THREADS"] == share
        assert "TF_FORCE_GPU_ALLOW_GROWTH" not in env
        # Ranks on this host inherit tnt-launch's whole environment.
        assert env["TNT_LAUNCH_REGISTRY"] == launcher.env["TNT_LAUNCH_REGISTRY"]
    assert_job_gone(first["TNT_JOB_ID"], [r["pid"] for r in got])


@pytest.mark.timeout(60)
def test_options_and_exports_reach_every_rank(launcher: Launcher, reports: Path) -> None:
    awkward = "it's \"quoted\" $HOME `x` \\ ; | & ü\nsecond line"
    launcher.env.update(KEEP="kept value", OMP_NUM_THREADS="7",
                        TNT_TENSORBOARD_ON_ALL_DEVICES="true")
    done = launcher.run([
        "-n", "2", "--no-gpu", "--log-level", "info", "--log-on-all-devices",
        "--fusion-threshold", "64", "--timeout", "2.5", "--start-timeout", "40", "--transport", "tcp",
        "-x", "A=1", "SPACES=a  b", "EQUALS=x=y=z", f"AWKWARD={awkward}", "KEEP",
        "-x", "A=2", "TF_NUM_INTRAOP_THREADS=5", "--", RANK, str(reports),
    ])
    assert done.returncode == 0, done.stderr
    for report in read_reports(reports, 2):
        env = report["env"]
        assert env["TNT_LOG_LEVEL"] == "INFO"
        assert env["TNT_LOG_ON_ALL_DEVICES"] == "true"
        assert env["TNT_FUSION_THRESHOLD_KB"] == "64"
        assert env["TNT_TIMEOUT_S"] == "2.5" and env["TNT_START_TIMEOUT_S"] == "40"
        assert env["TNT_TRANSPORT"] == "tcp"
        assert env["TNT_TENSORBOARD_ON_ALL_DEVICES"] == "true"
        assert env["A"] == "2"
        assert env["SPACES"] == "a  b" and env["EQUALS"] == "x=y=z"
        assert env["AWKWARD"] == awkward
        assert env["KEEP"] == "kept value"
        assert env["OMP_NUM_THREADS"] == "7" and env["TF_NUM_INTRAOP_THREADS"] == "5"
        # MKL and PyTorch fall back on the user's OMP_NUM_THREADS, so MKL_NUM_THREADS stays unset.
        assert "MKL_NUM_THREADS" not in env


@pytest.mark.timeout(60)
def test_each_job_gets_its_own_id_port_and_token(launcher: Launcher, tmp_path: Path) -> None:
    seen = []
    for attempt in range(2):
        folder = tmp_path / f"reports{attempt}"
        folder.mkdir()
        assert launcher.run(["-n", "1", "--no-gpu", "--", RANK, str(folder)]).returncode == 0
        seen.append(read_reports(folder, 1)[0]["env"])
    assert seen[0]["TNT_JOB_ID"] != seen[1]["TNT_JOB_ID"]
    assert seen[0]["TNT_JOB_TOKEN"] != seen[1]["TNT_JOB_TOKEN"]


@pytest.mark.timeout(60)
def test_output_on_all_devices_prefixes_every_line(launcher: Launcher, reports: Path) -> None:
    done = launcher.run(["-n", "3", "--no-gpu", "--output-on-all-devices", "--", RANK,
                         str(reports), "--lines", "2"])
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == sorted(
        f"[rank {r}] stdout line {i} of rank {r}" for r in range(3) for i in range(2)
    )
    assert sorted(done.stderr.splitlines()) == [f"[rank {r}] stderr line of rank {r}"
                                                for r in range(3)]
    assert read_reports(reports, 3)[1]["env"]["TNT_OUTPUT_ON_ALL_DEVICES"] == "true"


@pytest.mark.timeout(60)
def test_output_dir_keeps_every_ranks_streams(launcher: Launcher, reports: Path,
                                              tmp_path: Path) -> None:
    out = tmp_path / "logs" / "run1"
    done = launcher.run(["-n", "2", "--no-gpu", "--output-dir", str(out), "--", RANK,
                         str(reports), "--lines", "3"])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "".join(f"stdout line {i} of rank 0\n" for i in range(3))
    for rank in range(2):
        assert (out / f"rank-{rank}.out").read_text() == "".join(
            f"stdout line {i} of rank {rank}\n" for i in range(3)
        )
        assert (out / f"rank-{rank}.err").read_text() == f"stderr line of rank {rank}\n"


@pytest.mark.timeout(60)
def test_interpreter_with_arguments(launcher: Launcher, reports: Path) -> None:
    interpreter = f"env TNT_TEST_WRAPPED=yes {sys.executable} -u"
    done = launcher.run(["-n", "1", "--no-gpu", "--python-interpreter", interpreter, "--", RANK,
                         str(reports)])
    assert done.returncode == 0, done.stderr
    assert read_reports(reports, 1)[0]["env"]["TNT_TEST_WRAPPED"] == "yes"


@pytest.mark.timeout(60)
def test_empty_interpreter_runs_the_script_itself(launcher: Launcher, reports: Path) -> None:
    program = launcher.cwd / "rank program"
    program.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{RANK}" "$@"\n')
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    done = launcher.run(["-n", "2", "--no-gpu", "--python-interpreter", "", "--",
                         "./rank program", str(reports)])
    assert done.returncode == 0, done.stderr
    assert [r["argv"] for r in read_reports(reports, 2)] == [[str(reports)]] * 2

    done = launcher.run(["-n", "1", "--no-gpu", "--python-interpreter", "", "--",
                         "./not-there"])
    assert done.returncode == 2
    assert done.stderr == "tnt-launch: error: ./not-there is not an executable file\n"


@pytest.mark.timeout(60)
def test_a_python_command_runs_as_given(launcher: Launcher, reports: Path) -> None:
    """`-- python3 script.py` (the mpirun habit) runs python3, not `python python3 script.py`."""
    done = launcher.run(["-n", "2", "--no-gpu", "--", "python3", "-u", RANK, str(reports),
                         "--", "a b"])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "stdout line 0 of rank 0\n"
    assert [r["argv"] for r in read_reports(reports, 2)] == [[str(reports), "--", "a b"]] * 2

    done = launcher.run(["-n", "1", "--no-gpu", "--", "python3", "missing.py"])
    assert done.returncode == 2
    assert done.stderr == f"tnt-launch: error: script missing.py not found in {launcher.cwd}\n"


@pytest.mark.timeout(60)
def test_a_program_runs_as_given(launcher: Launcher) -> None:
    """A shell script or compiled program runs itself, without --python-interpreter ''."""
    program = launcher.cwd / "show_rank"
    program.write_text('#!/bin/sh\necho "rank $TNT_RANK of $TNT_SIZE: $*"\n')
    program.chmod(0o755)
    for command in ("./show_rank", "show_rank"):
        done = launcher.run(["-n", "2", "--no-gpu", "--output-on-all-devices", "--", command,
                             "x  y"])
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.splitlines()) == [
            "[rank 0] rank 0 of 2: x  y", "[rank 1] rank 1 of 2: x  y"
        ]

    done = launcher.run(["-n", "1", "--no-gpu", "--", "no-such-command-anywhere"])
    assert done.returncode == 2
    assert done.stderr.startswith("tnt-launch: error: script no-such-command-anywhere not found")


@pytest.mark.timeout(60)
def test_dry_run_into_a_pipe_keeps_commands_and_values_whole(launcher: Launcher) -> None:
    long_arg = "--data=" + "/a/very/long/folder" * 30
    long_value = "x" * 400 + " y"
    launcher.env["COLUMNS"] = "60"
    done = launcher.run(["-n", "2", "--no-gpu", "-x", f"LONG={long_value}", "--dry-run", "--",
                         "python3", "train.py", long_arg])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for rank in range(2):
        assert (f"rank {rank} host localhost local_rank {rank}/2 device CPU pinning - cmd: "
                f"python3 train.py {long_arg}") in lines
    assert f"LONG={long_value}" in lines
    assert not any(c in done.stdout for c in "│┃━─")


@pytest.mark.timeout(60)
def test_dry_run_on_a_terminal_draws_tables(launcher: Launcher) -> None:
    main, tty = pty.openpty()
    launcher.env["COLUMNS"] = "250"
    proc = subprocess.Popen(
        launcher.argv(["-n", "2", "--no-gpu", "--dry-run", "--", "train.py"]), cwd=launcher.cwd,
        env=launcher.env, stdin=subprocess.DEVNULL, stdout=tty, stderr=subprocess.PIPE,
    )
    os.close(tty)
    seen = b""
    try:
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            seen += chunk
        assert proc.wait(timeout=30) == 0
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = seen.decode()
    assert re.search(r"│ 1 +│ localhost +│ 1/2 +│ CPU +│ - +│ .*train\.py", text)
    assert re.search(r"│ TNT_RANK +│ per rank: 0, 1 ", text)


@pytest.mark.timeout(60)
def test_gpus_from_cuda_visible_devices(launcher: Launcher, reports: Path) -> None:
    launcher.env["CUDA_VISIBLE_DEVICES"] = "3,5"
    done = launcher.run(["--", RANK, str(reports)])
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
    assert [r["env"]["CUDA_VISIBLE_DEVICES"] for r in read_reports(reports, 2)] == ["3", "5"]


@pytest.mark.timeout(60)
def test_ranks_share_gpus(launcher: Launcher, reports: Path) -> None:
    # Two GPUs, two ranks on each: without -n the host runs K ranks per GPU.
    launcher.env["CUDA_VISIBLE_DEVICES"] = "3,5"
    done = launcher.run(["--ranks-per-gpu", "2", "--", RANK, str(reports)])
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
    got = [r["env"] for r in read_reports(reports, 4)]
    assert [env["CUDA_VISIBLE_DEVICES"] for env in got] == ["3", "3", "5", "5"]
    assert {env["TF_FORCE_GPU_ALLOW_GROWTH"] for env in got} == {"true"}

    # One GPU, two ranks: the dry run shows the GPU of each rank.
    launcher.env["CUDA_VISIBLE_DEVICES"] = "7"
    done = launcher.run(["-n", "2", "--ranks-per-gpu", "2", "--dry-run", "--", "t.py"])
    assert done.returncode == 0, done.stderr
    ranks = [line for line in done.stdout.splitlines() if line.startswith("rank ")]
    assert [line.split(" cmd: ")[0] for line in ranks] == [
        "rank 0 host localhost local_rank 0/2 device GPU 7 pinning -",
        "rank 1 host localhost local_rank 1/2 device GPU 7 pinning -",
    ]
    lines = done.stdout.splitlines()
    assert "CUDA_VISIBLE_DEVICES=7" in lines and "TF_FORCE_GPU_ALLOW_GROWTH=true" in lines


@pytest.mark.timeout(60)
def test_gpus_from_nvidia_smi_and_too_few_gpus(launcher: Launcher, tmp_path: Path) -> None:
    # A stand-in nvidia-smi that lists two GPUs, the way the real one answers this query.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\n[ "$1" = "--query-gpu=index" ] || exit 9\nprintf "0\\n1\\n"\n')
    smi.chmod(0o755)
    launcher.env["PATH"] = f"{bin_dir}:{launcher.env['PATH']}"

    first = tmp_path / "first"
    first.mkdir()
    done = launcher.run(["--", RANK, str(first)])
    assert done.returncode == 0, done.stderr
    assert [r["env"]["CUDA_VISIBLE_DEVICES"] for r in read_reports(first, 2)] == ["0", "1"]

    second = tmp_path / "second"
    second.mkdir()
    done = launcher.run(["-n", "3", "--", RANK, str(second)])
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(
        "tnt-launch: warning: running all ranks on CPUs: localhost has 2 GPU(s) for 3 rank(s)"
    )
    assert [r["env"]["CUDA_VISIBLE_DEVICES"] for r in read_reports(second, 3)] == ["", "", ""]


@pytest.mark.timeout(60)
def test_a_rank_may_finish_before_the_others(launcher: Launcher, reports: Path) -> None:
    done = launcher.run(["-n", "3", "--no-gpu", "--", RANK, str(reports), "--sleep", "1",
                         "--sleep-rank", "2"])
    assert done.returncode == 0, done.stderr
    assert len(read_reports(reports, 3)) == 3


@pytest.mark.timeout(60)
def test_dry_run_starts_nothing(launcher: Launcher, reports: Path) -> None:
    hostfile = launcher.cwd / "hosts"
    here = socket.gethostname()
    hostfile.write_text(f"{here}\nnode-b slots=2\n")
    done = launcher.run(["--hostfile", str(hostfile), "--no-gpu", "-x", "DATASET=/data",
                         "--dry-run", "--", "train.py", "--epochs", "3"])
    assert done.returncode == 0, done.stderr
    text = done.stdout
    lines = text.splitlines()
    assert f"3 rank(s) on 2 host(s); rank 0 listens on {here}:" in lines[0]
    assert lines[1] == (f"rank 0 host {here} local_rank 0/1 device CPU pinning - "
                        f"cmd: {sys.executable} train.py --epochs 3")
    assert lines[3].startswith("rank 2 host node-b (ssh) local_rank 1/2 device CPU pinning - cmd:")
    assert "TNT_RANK=per rank: 0, 1, 2" in lines
    assert "DATASET=/data" in lines
    assert "assumed to have this host's GPUs, CPUs and NUMA nodes: node-b" in text
    assert "Dry run: nothing was started." in text
    assert not list(reports.iterdir())
    assert not list(Path(launcher.env["TNT_LAUNCH_REGISTRY"]).glob("*.json"))


@pytest.mark.timeout(60)
def test_an_infinite_timeout_reaches_the_ranks_and_shows_in_the_dry_run(
    launcher: Launcher, reports: Path
) -> None:
    done = launcher.run(["-n", "2", "--no-gpu", "--timeout", "1e10", "--", RANK, str(reports)])
    assert done.returncode == 0, done.stderr
    assert [r["env"]["TNT_TIMEOUT_S"] for r in read_reports(reports, 2)] == ["inf", "inf"]
    done = launcher.run(["-n", "2", "--no-gpu", "--timeout", "inf", "--dry-run", "--", "t.py"])
    assert done.returncode == 0, done.stderr
    assert "TNT_TIMEOUT_S=inf" in done.stdout.splitlines()
    assert "Collective timeout: none, collectives wait forever (TNT_TIMEOUT_S=inf)." in done.stdout


@pytest.mark.timeout(60)
def test_unfinished_lines_of_rank_0_show_at_once(launcher: Launcher, reports: Path) -> None:
    """A progress bar redrawn with carriage returns is shown before its line ends."""
    proc = launcher.start(["-n", "2", "--no-gpu", "--", RANK, str(reports), "--progress",
                           "--sleep", "60"])
    try:
        assert proc.stderr is not None
        os.set_blocking(proc.stderr.fileno(), False)
        seen = b""
        deadline = time.monotonic() + 30
        while b"progress of rank 0: 50%\r" not in seen and time.monotonic() < deadline:
            seen += proc.stderr.buffer.read1(65536) or b""  # type: ignore[attr-defined]
            time.sleep(0.05)
        assert seen == b"stderr line of rank 0\nprogress of rank 0: 50%\r"
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        assert proc.returncode == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.timeout(90)
def test_a_gpi2_job_gets_its_machinefile_and_ports_and_leaves_nothing(
    launcher: Launcher, reports: Path
) -> None:
    registry = Path(launcher.env["TNT_LAUNCH_REGISTRY"])
    done = launcher.run_as_if_gpi2(["-n", "3", "--no-gpu", "--transport", "gpi2", "--", RANK,
                                    str(reports)])
    assert done.returncode == 0, done.stderr
    got = read_reports(reports, 3)
    first = got[0]["env"]
    machinefile = Path(first["GASPI_MFILE"])
    assert machinefile == registry / f"{first['TNT_JOB_ID']}.gpi2-machines"
    # Rank 0 read it while the job ran: one line per rank, the last one ending too.
    assert got[0]["machinefile"] == "127.0.0.1\n" * 3
    base = int(first["TNT_GPI2_PORT_BASE"])
    assert 10240 <= base <= 31744 and base % 1024 == 0
    # The launcher claimed the base for the job's life (tnt_launch/gpi2.py: PortClaim).
    assert got[0]["gpi2_base_claimed"] is True
    for rank, report in enumerate(got):
        env = report["env"]
        assert (env["GASPI_RANK"], env["GASPI_SOCKET"], env["GASPI_NRANKS"]) == (
            str(rank), str(rank), "3")
        assert env["GASPI_MFILE"] == (str(machinefile) if rank == 0 else "/dev/null")
        assert env["TNT_GPI2_PORT_BASE"] == str(base)
    assert not machinefile.exists()
    assert list(registry.iterdir()) == []

    # A failing job removes it too; a user's TNT_GPI2_PORT_BASE is kept (one above the bases
    # tnt-launch and tnt-comm pick, so that no job beside this test claims it).
    failed = reports / "failed"
    failed.mkdir()
    launcher.env["TNT_GPI2_PORT_BASE"] = "40960"
    done = launcher.run_as_if_gpi2(["-n", "2", "--no-gpu", "--transport", "gpi2", "--", RANK,
                                    str(failed), "--fail-rank", "1", "--code", "4"])
    assert done.returncode == 4, done.stderr
    got = read_reports(failed, 2)
    assert got[0]["machinefile"] == "127.0.0.1\n" * 2
    assert {r["env"]["TNT_GPI2_PORT_BASE"] for r in got} == {"40960"}
    assert got[0]["gpi2_base_claimed"] is False  # the user's base is the user's to keep apart
    assert not Path(got[0]["env"]["GASPI_MFILE"]).exists()
    assert list(registry.iterdir()) == []


@pytest.mark.timeout(60)
def test_a_gpi2_dry_run_shows_gpi2s_variables_and_writes_nothing(launcher: Launcher) -> None:
    registry = Path(launcher.env["TNT_LAUNCH_REGISTRY"])
    done = launcher.run_as_if_gpi2(["-n", "3", "--no-gpu", "--transport", "gpi2", "--dry-run",
                                    "--", "train.py"])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    job = lines[0].split()[3].rstrip(":")
    machinefile = registry / f"{job}.gpi2-machines"
    for line in ("TNT_TRANSPORT=gpi2", "GASPI_RANK=per rank: 0, 1, 2",
                 "GASPI_SOCKET=per rank: 0, 1, 2", "GASPI_NRANKS=3",
                 f"GASPI_MFILE=per rank: {machinefile}, /dev/null, /dev/null"):
        assert line in lines, done.stdout
    base = [line for line in lines if line.startswith("TNT_GPI2_PORT_BASE=")]
    assert len(base) == 1 and int(base[0].split("=")[1]) % 1024 == 0
    assert any(line.startswith(f"GPI-2: machinefile {machinefile} (3 line(s)") for line in lines)
    assert not registry.exists() or list(registry.iterdir()) == []
