"""Failure propagation with real processes: the first failing rank, a killed rank, Ctrl+C,
SIGTERM and a killed launcher all leave nothing of the job behind (checked with psutil)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import RANK, STOPPED_RANK, Launcher, assert_job_gone, read_reports, running, tree

from tnt_launch import _agent


def _pids(reports: list[dict]) -> list[int]:
    return [r["pid"] for r in reports] + [r["child_pid"] for r in reports if r["child_pid"]]


@pytest.mark.timeout(60)
def test_first_failing_rank_stops_the_job_and_sets_the_exit_code(
    launcher: Launcher, reports: Path
) -> None:
    started = time.monotonic()
    done = launcher.run(["-n", "3", "--no-gpu", "--", RANK, str(reports), "--fail-rank", "1",
                         "--code", "3", "--sleep", "60", "--spawn-child", "--touch-shm"])
    elapsed = time.monotonic() - started
    assert done.returncode == 3, done.stderr
    assert elapsed < 20  # the sleeping ranks were stopped, not waited for
    lines = done.stderr.splitlines()
    assert "tnt-launch: rank 1 (host localhost, local rank 1) exited with code 3; stopping the " \
           "job (2 other rank(s) still running)" in lines
    summary = lines.index(
        "tnt-launch: job failed: rank 1 (host localhost, local rank 1) exited with code 3"
        .replace("job failed", f"job {read_reports(reports, 3)[0]['env']['TNT_JOB_ID']} failed")
    )
    assert lines[summary + 1:] == [
        "tnt-launch: last lines rank 1 wrote to stderr:",
        "    stderr line of rank 1",
        "    rank 1 fails on purpose with code 3",
        "tnt-launch: exit code 3",
    ]
    got = read_reports(reports, 3)
    assert_job_gone(got[0]["env"]["TNT_JOB_ID"], _pids(got))


@pytest.mark.timeout(60)
def test_a_rank_killed_by_a_signal_fails_the_job(launcher: Launcher, reports: Path) -> None:
    done = launcher.run(["-n", "3", "--no-gpu", "--", RANK, str(reports), "--kill-rank", "2",
                         "--sleep", "60"])
    assert done.returncode == 128 + signal.SIGKILL, done.stderr
    assert ("rank 2 (host localhost, local rank 2) was killed by signal 9 (SIGKILL)"
            in done.stderr)
    assert "    stderr line of rank 2\n" in done.stderr
    got = read_reports(reports, 3)
    assert_job_gone(got[0]["env"]["TNT_JOB_ID"], _pids(got))


@pytest.mark.timeout(60)
def test_the_rank_that_raised_is_named_though_the_others_exit_first(launcher: Launcher, reports: Path) -> None:
    # Ranks 0 and 2 report a PeerFailure naming rank 1 and exit at once; rank 1 reports its own
    # ValueError half a second later and would exit 3 s after that. The summary names rank 1, with
    # its error and its last lines; its exit was cut short by the stop, so the job's code is 1.
    done = launcher.run(["-n", "3", "--no-gpu", "--", RANK, str(reports), "--raise-rank", "1"])
    assert done.returncode == 1, done.stderr
    job_id = read_reports(reports, 3)[0]["env"]["TNT_JOB_ID"]
    lines = done.stderr.splitlines()
    where = "rank 1 (host localhost, local rank 1)"
    raised = "raised ValueError: planted on rank 1 ..."
    # (Followed by how many other ranks still run, which depends on how fast ranks 0 and 2 exit.)
    assert any(line.startswith(f"tnt-launch: {where} {raised} and is exiting; stopping the job") for line in lines), (
        done.stderr
    )
    summary = lines.index(f"tnt-launch: job {job_id} failed: {where} {raised} (stopped by tnt-launch while exiting)")
    assert lines[summary + 1:] == [
        "tnt-launch: last lines rank 1 wrote to stderr:",
        "    stderr line of rank 1",
        "    ValueError: planted on rank 1",
        "tnt-launch: rank 0, rank 2 failed as a consequence (PeerFailure)",
        "tnt-launch: exit code 1",
    ], done.stderr
    assert_job_gone(job_id, _pids(read_reports(reports, 3)))


@pytest.mark.timeout(60)
def test_a_rank_that_says_nothing_is_named_by_its_exit(launcher: Launcher, reports: Path) -> None:
    # As above, but rank 1 reports nothing (no tnt-comm in it) and exits with code 5 after the others:
    # the PeerFailures that name it keep the job waiting for its exit, which then names it.
    done = launcher.run(["-n", "3", "--no-gpu", "--", RANK, str(reports), "--raise-rank", "1", "--silent",
                         "--code", "5"])
    assert done.returncode == 5, done.stderr
    job_id = read_reports(reports, 3)[0]["env"]["TNT_JOB_ID"]
    assert f"tnt-launch: job {job_id} failed: rank 1 (host localhost, local rank 1) exited with code 5" in (
        done.stderr.splitlines()
    ), done.stderr
    assert "    rank 1 exits with code 5" in done.stderr.splitlines()


def _start_and_wait(launcher: Launcher, reports: Path, size: int,
                    *extra: str) -> tuple[subprocess.Popen[str], list[dict], list[int]]:
    # In a session of its own, like a command started from a terminal.
    proc = launcher.start(["-n", str(size), "--no-gpu", "--", RANK, str(reports), "--sleep",
                           "60", *extra], start_new_session=True)
    got = read_reports(reports, size)
    return proc, got, tree(proc.pid)


@pytest.mark.timeout(60)
def test_ctrl_c_stops_every_rank(launcher: Launcher, reports: Path) -> None:
    proc, got, processes = _start_and_wait(launcher, reports, 3, "--spawn-child")
    assert len(processes) >= 1 + 3 * 3  # launcher, then agent, rank and grandchild per rank
    # Ctrl+C in a terminal signals the whole foreground process group.
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "tnt-launch: got SIGINT: stopping 3 rank(s)" in err
    assert f"tnt-launch: job {got[0]['env']['TNT_JOB_ID']} stopped after SIGINT" in err
    assert_job_gone(got[0]["env"]["TNT_JOB_ID"], processes + _pids(got))


@pytest.mark.timeout(60)
def test_sigterm_escalates_to_sigkill_for_ranks_that_ignore_it(
    launcher: Launcher, reports: Path
) -> None:
    proc, got, processes = _start_and_wait(launcher, reports, 2, "--ignore-sigterm")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    elapsed = time.monotonic() - started
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert 4.5 <= elapsed < 15  # the grace period (5 s), then SIGKILL
    assert_job_gone(got[0]["env"]["TNT_JOB_ID"], processes + _pids(got))


WAIT_FOR_USR1 = """\
import os, signal, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
open(os.path.join(sys.argv[1], "ready-" + os.environ["TNT_RANK"]), "w").close()
deadline = time.monotonic() + 30
while not got and time.monotonic() < deadline:
    time.sleep(0.05)
print("rank", os.environ["TNT_RANK"], "got SIGUSR1" if got else "got nothing", flush=True)
"""


@pytest.mark.timeout(60)
def test_a_sigusr1_that_comes_before_the_agent_knows_its_ranks_pid_still_reaches_the_rank(tmp_path: Path) -> None:
    """The rank may run (and look ready) before its agent has recorded the PID: a signal to pass on
    that comes in between is held until then, not dropped (it once was, under CI's load)."""
    rank = subprocess.Popen([sys.executable, "-c", WAIT_FOR_USR1, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "TNT_RANK": "0"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready-0").exists():
            assert time.monotonic() < deadline and rank.poll() is None
            time.sleep(0.05)
        stopper = _agent._Stopper(grace=5)
        stopper.forward(signal.SIGUSR1)  # before attach: held
        stopper.attach(rank.pid)
        out, _ = rank.communicate(timeout=40)
    finally:
        if rank.poll() is None:
            rank.kill()
    assert out.strip() == "rank 0 got SIGUSR1", out


@pytest.mark.timeout(60)
def test_sigusr1_reaches_every_rank_and_the_job_goes_on(launcher: Launcher, tmp_path: Path) -> None:
    """A preemption warning (sbatch --signal=B:USR1@T reaches the batch shell, which passes it on to
    tnt-launch): every rank gets it, and nothing stops."""
    script = tmp_path / "wait_usr1.py"
    script.write_text(WAIT_FOR_USR1)
    proc = launcher.start(["-n", "3", "--no-gpu", "--output-on-all-devices", "--", str(script), str(tmp_path)])
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"ready-{r}").exists() for r in range(3)):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=40)
    assert proc.returncode == 0, err
    assert sorted(line.split("] ", 1)[1] for line in out.splitlines()) == [
        f"rank {r} got SIGUSR1" for r in range(3)
    ], out + err


@pytest.mark.timeout(60)
def test_second_ctrl_c_kills_at_once(launcher: Launcher, reports: Path) -> None:
    proc, got, processes = _start_and_wait(launcher, reports, 2, "--ignore-sigterm")
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert time.monotonic() - started < 4
    assert "got SIGINT again: killing the ranks" in err
    assert_job_gone(got[0]["env"]["TNT_JOB_ID"], processes + _pids(got))


@pytest.mark.timeout(60)
def test_ranks_die_with_a_killed_launcher(launcher: Launcher, reports: Path) -> None:
    proc, got, processes = _start_and_wait(launcher, reports, 2, "--spawn-child")
    proc.kill()
    proc.communicate(timeout=30)
    # Each agent sees its stdin close and stops its rank; nothing can remove the registry
    # entries and shm files of a SIGKILLed launcher, so only processes are checked here.
    deadline = time.monotonic() + 15
    left = processes + _pids(got)
    while time.monotonic() < deadline:
        left = [p for p in left if running(p)]
        if not left:
            break
        time.sleep(0.05)
    assert left == []


@pytest.mark.timeout(60)
def test_a_stopped_rank_is_named_first_and_cleaned_up(launcher: Launcher, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    started = time.monotonic()
    done = launcher.run(["-n", "3", "--no-gpu", "--", STOPPED_RANK, str(pids), "1"])
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    first = next(line for line in lines if " failed: " in line)
    job_id = first.split()[2]
    assert re.fullmatch(
        rf"tnt-launch: job {job_id} failed: rank 1 made no progress \(process stopped, e\.g\. by "
        r"SIGSTOP or a debugger\); rank [02] exited with code 1 after timing out",
        first,
    ), done.stderr
    stopped_pid = int((pids / "rank-1.pid").read_text())
    detail = lines[lines.index(first) + 1]
    assert detail == (f"tnt-launch: rank 1 (host localhost, local rank 1) made no progress: "
                      f"stopped process(es) {stopped_pid} (stopped)")
    # The details of the failed rank follow, as for any failure.
    failed = first.split("; rank ")[1].split()[0]
    assert lines[lines.index(first) + 2:lines.index(first) + 5] == [
        (f"tnt-launch: rank {failed} (host localhost, local rank {failed}) exited with code 1 "
         "after timing out"),
        f"tnt-launch: last lines rank {failed} wrote to stderr:",
        f"    rank {failed} timed out: no progress for 1 s in allreduce, waiting for rank 1",
    ]
    assert lines[-1] == "tnt-launch: exit code 1"
    # SIGTERM and SIGCONT ended the stopped rank at once, not SIGKILL after the grace period.
    assert elapsed < 1 + 4.5, done.stderr
    assert_job_gone(job_id, [int(p.read_text()) for p in pids.glob("*.pid")])
