"""verbose="auto" as in plain Keras: on a terminal rank 0 draws the live progress bar; into a pipe
every rank that prints writes one line per epoch (verbose=2), with no control characters."""

import os
import re
import subprocess
from pathlib import Path

import pytest
from launch import JOBS, SRC, run, tnt_launch
from pty_reader import read_terminal

SUMMARY = r"^\d+/\d+ - .*loss: "
"""The line verbose=2 ends an epoch (and an evaluation) with: "4/4 - 0s - 5ms/step - ... loss: ..."."""


@pytest.mark.timeout(240)
def test_into_a_pipe_auto_prints_plain_lines() -> None:
    result = run("progress_tty_job", 2, timeout=220)
    out = result.output
    assert "\r" not in out and "\b" not in out, repr(out)
    assert len(re.findall(SUMMARY, out, re.M)) == 2, out  # fit's epoch and evaluate, rank 0 only
    assert [r["stdout_tty"] for r in result.ranks] == ["false", "false"]


@pytest.mark.timeout(240)
def test_on_a_terminal_rank_0_draws_the_live_bar(tmp_path: Path, backend: str) -> None:
    env = dict(os.environ)
    env.update(
        {
            "KERAS_BACKEND": backend,
            "TNT_TEST_OUT": str(tmp_path),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONPATH": os.pathsep.join([str(JOBS), str(SRC), env.get("PYTHONPATH", "")]),
            "TNT_TIMEOUT_S": "60",
        }
    )
    outputs = tmp_path / "out"
    cmd = [*tnt_launch(), "-n", "2", "--no-gpu", "--output-dir", str(outputs), "--", str(JOBS / "progress_tty_job.py")]
    master, slave = os.openpty()
    with open(tmp_path / "stderr", "wb") as err:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=err)
    os.close(slave)
    try:
        shown = read_terminal(master, proc, 220)
        code = proc.wait(timeout=30)
    finally:
        os.close(master)
    assert code == 0, (tmp_path / "stderr").read_text()
    # The bar is redrawn in place ("\r" not part of the terminal's "\r\n"), as by plain Keras.
    assert re.search(rb"\r(?!\n)", shown), shown
    assert b"\r" in (outputs / "rank-0.out").read_bytes()
    assert (outputs / "rank-1.out").read_bytes() == b""  # the other rank draws nothing
    assert [(tmp_path / f"rank{r}.json").read_text() for r in range(2)] == [
        '{"stdout_tty": "true"}',
        '{"stdout_tty": "false"}',
    ]
