"""Runs a job script under tnt-launch with real ranks and collects what each rank reported."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOBS = Path(__file__).parent / "jobs"
# Serial references the jobs share within this test session (see jobs/_job.py: shared_references).
REFERENCE_CACHE = tempfile.mkdtemp(prefix="tnt-keras-references-")
atexit.register(shutil.rmtree, REFERENCE_CACHE, ignore_errors=True)
SRC = Path(__file__).parents[1] / "src"


@dataclass
class Result:
    returncode: int
    output: str
    ranks: list[dict[str, Any]]
    out_dir: Path


def tnt_launch() -> list[str]:
    beside = Path(sys.executable).parent / "tnt-launch"
    found = str(beside) if beside.exists() else shutil.which("tnt-launch")
    if found is None:
        raise RuntimeError("tnt-launch is not installed: pip install ./packages/tnt-launch")
    return [found]


def run(
    job: str,
    ranks: int,
    *args: str,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    check: bool = True,
    launcher_args: tuple[str, ...] = (),
    backend: str | None = None,
) -> Result:
    """Starts ``jobs/<job>.py`` on ``ranks`` ranks (``launcher_args`` go to tnt-launch); every rank
    writes ``rank<r>.json`` to TNT_TEST_OUT. ``backend`` sets KERAS_BACKEND (the environment's own, else
    TensorFlow, where not given)."""
    out_dir = Path(tempfile.mkdtemp(prefix=f"tnt-keras-{job}-"))
    # Tests read the folder after the job (reports, files the job wrote); it goes when pytest exits.
    atexit.register(shutil.rmtree, out_dir, ignore_errors=True)
    # The ranks' temporary files too (TensorFlow's autograph writes one per traced function and
    # deletes it at exit, which ranks that a test kills never reach): they go with the folder.
    (out_dir / "tmp").mkdir()
    full_env = dict(os.environ)
    full_env.update(
        {
            "TNT_TEST_OUT": str(out_dir),
            "TMPDIR": str(out_dir / "tmp"),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONPATH": os.pathsep.join([str(JOBS), str(SRC), full_env.get("PYTHONPATH", "")]),
            "TNT_TIMEOUT_S": "60",
            "TNT_TEST_CACHE": REFERENCE_CACHE,
        }
    )
    full_env.update(env or {})
    if backend is not None:
        full_env["KERAS_BACKEND"] = backend
    # Serial references differ between backends: each backend's jobs share their own.
    backend = full_env.get("KERAS_BACKEND", "tensorflow")
    full_env["TNT_TEST_CACHE"] = os.path.join(REFERENCE_CACHE, backend)
    os.makedirs(full_env["TNT_TEST_CACHE"], exist_ok=True)
    cmd = [*tnt_launch(), "-n", str(ranks), "--no-gpu", *launcher_args, "--", str(JOBS / f"{job}.py"), *args]
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout, check=False)
    output = proc.stdout + proc.stderr
    results = []
    for r in range(ranks):
        path = out_dir / f"rank{r}.json"
        results.append(json.loads(path.read_text()) if path.exists() else {})
    if check and proc.returncode != 0:
        raise AssertionError(f"job {job} on {ranks} ranks failed with code {proc.returncode}:\n{output[-6000:]}")
    return Result(proc.returncode, output, results, out_dir)
