"""tnt-comm jobs started by tnt-launch: the environment contract end to end, and failures."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = [sys.executable, "-m", "tnt_launch"]


def launch(args: list[str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(LAUNCH + args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_example_under_launch(n: int) -> None:
    out = launch(["-n", str(n), "--output-on-all-devices", "--", "examples/allreduce.py"])
    assert out.returncode == 0, out.stderr
    for r in range(n):
        assert f"rank {r} of {n}" in out.stdout
    assert f"sum of ranks = {n * (n - 1) // 2}" in out.stdout


@pytest.mark.timeout(120)
def test_crashed_rank_brings_job_down(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(
        "import os, signal, numpy as np, tnt_comm as tc\n"
        "x = np.ones(1000, np.float32)\n"
        "tc.allreduce(x)\n"
        "if tc.rank() == 1:\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "while True:\n"
        "    tc.allreduce(x)\n"
    )
    before = set(os.listdir("/dev/shm"))
    out = launch(["-n", "3", "--", str(script)])
    assert out.returncode != 0
    assert "rank 1" in (out.stdout + out.stderr)
    # Segments of tnt-comm are named tnt-<job id>-<rank>.
    leftovers = [f for f in set(os.listdir("/dev/shm")) - before if re.fullmatch(r"tnt-\w+-\d+", f)]
    assert not leftovers, leftovers


def launch_or_dump(
    args: list[str], timeout: float, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """As ``launch``, but a job still running after ``timeout`` does not vanish without a trace: every
    rank is sent SIGABRT, which makes Python's faulthandler print each thread's stack, and the test
    fails with that output."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        env = {**os.environ, "PYTHONFAULTHANDLER": "1", "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        proc = subprocess.Popen(LAUNCH + args, stdout=out, stderr=err, text=True, cwd=ROOT, env=env)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            ranks = psutil.Process(proc.pid).children(recursive=True)
            for rank in ranks:
                with contextlib.suppress(psutil.Error):
                    rank.send_signal(signal.SIGABRT)
            psutil.wait_procs(ranks, timeout=10)
            proc.kill()
            proc.wait()
            out.seek(0)
            err.seek(0)
            stacks = f"{out.read()[-3000:]}\n{err.read()[-12000:]}"
            pytest.fail(f"the job hung for {timeout} s; the ranks' stacks:\n{stacks}")
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


def example_env() -> dict[str, str]:
    """PYTHONPATH with the folder the nox session installs the example's scikit-learn into
    (TNT_TEST_EXAMPLE_DEPS), for this job only: Keras imports scikit-learn and SciPy at start
    wherever they are importable, which would cost every other rank of these tests seconds."""
    deps = os.environ.get("TNT_TEST_EXAMPLE_DEPS")
    if not deps:
        return {}
    return {"PYTHONPATH": os.pathsep.join(p for p in (deps, os.environ.get("PYTHONPATH")) if p)}


@pytest.mark.timeout(240)
def test_keras_example_under_launch() -> None:
    """The README's main command: the digits example trains on two ranks and reaches its accuracy.
    A collective stalled for 60 s fails with the stalled rank named (tnt-comm's default is 300 s)."""
    # Where only tnt-comm and tnt-launch are installed (a node where they alone were built), the
    # example cannot run: the rest of this file still tests the launcher's contract there.
    needs = ["tensorflow", "keras", "tnt_keras"] + ([] if example_env() else ["sklearn"])
    for module in needs:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the Keras example needs {module}, which is not installed here "
                        "(pip install './packages/tnt-keras[cpu]' scikit-learn)")
    args = ["-n", "2", "--timeout", "60", "--", "examples/keras_digits.py"]
    out = launch_or_dump(args, timeout=200, extra_env=example_env())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    match = re.search(r"test accuracy (\d\.\d+)", out.stdout)
    assert match, out.stdout[-2000:]
    assert float(match.group(1)) > 0.9


@pytest.mark.timeout(60)
def test_process_exits_after_peer_failure(tmp_path: Path) -> None:
    """After a PeerFailure the survivor still exits normally (the progress thread must not spin on)."""
    script = tmp_path / "survivor.py"
    script.write_text(
        "import os, numpy as np, tnt_comm as tc\n"
        "x = np.ones(10, np.float32)\n"
        "tc.allreduce(x)\n"
        "if tc.rank() == 1:\n"
        "    os._exit(0)\n"
        "try:\n"
        "    tc.iallreduce(x).wait()\n"
        "except tc.PeerFailure:\n"
        "    print('survivor saw PeerFailure')\n"
    )
    out = launch(["-n", "2", "--", str(script)], timeout=50)
    assert "survivor saw PeerFailure" in out.stdout, out.stdout + out.stderr
    assert out.returncode == 0, out.stderr


def hold_up_rank_1(tmp_path: Path, hold: str, elements: int, timeout_s: int) -> tuple[str, str]:
    """Three ranks make two allreduces, rank 1 runs `hold` (imports: os, signal, time) between
    them, the others time out after `timeout_s`; returns the job's first summary line and all its
    output."""
    script = tmp_path / "hold.py"
    script.write_text(
        "import os, signal, time, numpy as np, tnt_comm as tc\n"
        f"x = np.ones({elements}, np.float32)\n"
        "tc.allreduce(x)\n"
        "if tc.rank() == 1:\n"
        f"    {hold}\n"
        "tc.allreduce(x)\n"
    )
    out = launch(["-n", "3", "--timeout", str(timeout_s), "--", str(script)], timeout=100)
    assert out.returncode != 0
    summary = [line for line in (out.stdout + out.stderr).splitlines() if " failed: " in line]
    assert summary, out.stdout[-2000:] + out.stderr[-3000:]
    return summary[0], out.stdout + out.stderr


@pytest.mark.timeout(120)
def test_stopped_rank_is_blamed_first(tmp_path: Path) -> None:
    """SIGSTOP one rank of three: the others time out, and the summary leads with the stopped one,
    not with whichever victim exited first."""
    first, output = hold_up_rank_1(tmp_path, "os.kill(os.getpid(), signal.SIGSTOP)", 100_000, 4)
    assert re.search(r"failed: rank 1 made no progress", first), first
    # The victims' own messages blame rank 1 too.
    assert "made no progress: rank 1" in output


@pytest.mark.timeout(120)
def test_rank_elsewhere_is_blamed_from_the_reports(tmp_path: Path) -> None:
    """A rank busy elsewhere in its program (not stopped, so no host can see it): the others time
    out, their reports (tnt_comm's errors as data) blame it, and the summary leads with it."""
    first, _ = hold_up_rank_1(tmp_path, "time.sleep(60)", 1000, 3)
    assert re.search(r"failed: rank 1 made no progress \(named by the timeout messages? of rank [02]", first), first


@pytest.mark.timeout(120)
@pytest.mark.parametrize("value", ["inf", "1e10"])
def test_unbounded_timeout_under_launch(value: str) -> None:
    out = launch(["-n", "2", "--timeout", value, "--", "examples/allreduce.py"])
    assert out.returncode == 0, out.stderr
    assert "sum of ranks = 1" in out.stdout


TIMELINE_SCRIPT = (
    "import sys, numpy as np, tnt_comm as tc\n"
    "for _ in range(3):\n"
    "    tc.allreduce(np.ones(1000, np.float32))\n"
    "if sys.argv[1] == 'write':\n"
    "    tc.timeline_write()\n"
)


@pytest.mark.timeout(120)
def test_timeline_of_a_job_of_tnt_comm_alone(tmp_path: Path) -> None:
    """--timeline with a script of tnt-comm alone: the trace holds its collectives where it calls
    tnt_comm.timeline_write(); where it does not, rank 0 says, once, that none was written and how."""
    script = tmp_path / "sums.py"
    script.write_text(TIMELINE_SCRIPT)
    trace = tmp_path / "trace.json"
    out = launch(["-n", "2", "--timeline", str(trace), "--", str(script), "write"])
    assert out.returncode == 0, out.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    for rank in (0, 1):
        sums = [e for e in events if e.get("pid") == rank and e.get("name") == "allreduce" and e["ph"] == "b"]
        assert len(sums) == 3 and all(e["args"]["bytes"] == 4000 for e in sums), sums
    assert "no timeline was written" not in out.stderr

    silent = tmp_path / "silent.json"
    out = launch(["-n", "2", "--timeline", str(silent), "--", str(script), "no"])
    assert out.returncode == 0, out.stderr
    assert not silent.exists()
    said = [line for line in out.stderr.splitlines() if "no timeline was written" in line]
    assert len(said) == 1 and str(silent) in said[0] and "tnt_comm.timeline_write()" in said[0], out.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["missing-folder", "a-folder"])
def test_a_timeline_that_cannot_be_written_is_refused_before_the_job_starts(where: str, tmp_path: Path) -> None:
    script = tmp_path / "mark.py"
    script.write_text("open(__import__('sys').argv[1], 'w').close()\n")
    marker = tmp_path / "started"
    target = tmp_path / "no" / "such" / "t.json" if where == "missing-folder" else tmp_path
    out = launch(["-n", "2", "--timeline", str(target), "--", str(script), str(marker)])
    assert out.returncode == 2, out.stderr
    expected = "does not exist; create it first" if where == "missing-folder" else "is a folder"
    assert out.stderr.startswith(f"tnt-launch: error: --timeline {target}: ") and expected in out.stderr, out.stderr
    assert not marker.exists()
