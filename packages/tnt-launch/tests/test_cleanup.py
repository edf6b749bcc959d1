"""`--cleanup` stops earlier jobs found in the registry, by PID, and nothing else."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RANK, Launcher, assert_job_gone, read_reports, running, tree


@pytest.mark.timeout(90)
def test_cleanup_stops_registered_jobs_and_nothing_else(launcher: Launcher, tmp_path: Path) -> None:
    folders = {name: tmp_path / name for name in ("a", "b", "bystander")}
    for folder in folders.values():
        folder.mkdir()
    other_script = str(tmp_path / "other_rank.py")
    shutil.copy(RANK, other_script)

    job_a = launcher.start(["-n", "2", "--no-gpu", "--", RANK, str(folders["a"]), "--sleep",
                            "120"])
    job_b = launcher.start(["-n", "1", "--no-gpu", "--", other_script, str(folders["b"]),
                            "--sleep", "120"])
    # The same script, started by hand: same name and arguments, but no job of tnt-launch.
    bystander = subprocess.Popen(
        [sys.executable, RANK, str(folders["bystander"]), "--sleep", "120"],
        env={**os.environ, "TNT_RANK": "0", "TNT_JOB_ID": "bystander"},
    )
    try:
        reports_a = read_reports(folders["a"], 2)
        reports_b = read_reports(folders["b"], 1)
        read_reports(folders["bystander"], 1)
        processes_a = tree(job_a.pid)
        processes_b = tree(job_b.pid)
        id_a = reports_a[0]["env"]["TNT_JOB_ID"]
        id_b = reports_b[0]["env"]["TNT_JOB_ID"]

        done = launcher.run(["--cleanup", "--", "rank_report.py"])
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"localhost: stopped job {id_a} ({RANK}, 5 process(es))\n"
        job_a.communicate(timeout=30)
        assert_job_gone(id_a, processes_a)
        assert job_b.poll() is None and all(running(p) for p in processes_b)
        assert running(bystander.pid)

        # By path, at once.
        done = launcher.run(["--cleanup", "--force", "--", other_script])
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"localhost: stopped job {id_b} ({other_script}, 3 process(es))\n"
        job_b.communicate(timeout=30)
        assert_job_gone(id_b, processes_b)
        assert running(bystander.pid)

        done = launcher.run(["--cleanup"])
        assert (done.returncode, done.stdout) == (0, "localhost: no running tnt-launch jobs\n")
        assert not list(Path(launcher.env["TNT_LAUNCH_REGISTRY"]).glob("*.json"))
    finally:
        for proc in (job_a, job_b):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()


@pytest.mark.timeout(60)
def test_cleanup_without_a_script_stops_every_job(launcher: Launcher, tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    job = launcher.start(["-n", "2", "--no-gpu", "--", RANK, str(folder), "--sleep", "120",
                          "--ignore-sigterm", "--spawn-child"])
    try:
        reports = read_reports(folder, 2)
        processes = tree(job.pid)
        done = launcher.run(["--cleanup"])
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"localhost: stopped job {reports[0]['env']['TNT_JOB_ID']}")
        job.communicate(timeout=30)
        pids = processes + [r["child_pid"] for r in reports]
        assert_job_gone(reports[0]["env"]["TNT_JOB_ID"], pids)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
