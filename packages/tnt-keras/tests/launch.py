"""Runs a job script under tnt-launch with real ranks and collects what each rank reported."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOBS = Path(__file__).parent / "jobs"
DATA = Path(__file__).parent / "data"
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


@dataclass(frozen=True)
class Job:
    """One start of a job script: what ``run`` is asked for, and what a bundle runs."""

    script: str
    ranks: int
    args: tuple[str, ...] = ()
    backend: str = "tensorflow"
    env: tuple[tuple[str, str], ...] = ()


def _jobs(backend: str, ranks: int, *jobs: tuple[str, tuple[str, ...], dict[str, str]] | str) -> tuple[Job, ...]:
    found = []
    for job in jobs:
        script, args, env = (job, (), {}) if isinstance(job, str) else job
        found.append(Job(script, ranks, args, backend, tuple(sorted(env.items()))))
    return tuple(found)


# Jobs that run in one launch, one after another in the same ranks (jobs/_bundle.py says why): those
# on the same backend and number of ranks, with no launcher options, the default collective timeout,
# and no look at the whole job's output. The tests that read them are marked `bundled` (conftest.py
# keeps each backend's on one pytest-xdist worker, where the bundle runs once). What stays apart:
# the training over GPI-2 and TCP (launcher options), the large models (a longer timeout), failures
# (they end the job), and the tests of printed output (progress bars, the optimizers' warnings).
# Two jobs look at what happened before tnt_keras was imported, and come first in their bundles: the
# datasets job builds a shuffle that tnt has not seeded yet, and the host inputs job checks that tnt
# imported no TensorFlow (the other jobs do, through Keras' set_random_seed, which seeds TensorFlow
# too wherever it is installed).
# The 2-rank jobs that every backend runs.
ON_EVERY_BACKEND_2 = (
    "sync_bn_job",
    "callbacks_job",
    "predict_job",
    ("save_failure_job", ("two",), {}),
    "saving_job",
    "saving_files_job",
    ("plain_files_job", (str(DATA),), {}),
)
# On 3 ranks every gradient is a bucket of its own (test_sync_batch_norm.py says why).
SYNC_BN_3 = ("sync_bn_job", (), {"TNT_FUSION_THRESHOLD_KB": "0"})
BUNDLES: dict[str, tuple[Job, ...]] = {
    "tensorflow-1": _jobs(
        "tensorflow", 1, "data_job", "train_equal", ("plain_files_job", (str(DATA),), {}), "wrapper_job"
    ),
    "tensorflow-2": _jobs(
        "tensorflow",
        2,
        "data_job",
        *ON_EVERY_BACKEND_2,
        ("tensorboard_job", (), {"TNT_TENSORBOARD_ON_ALL_DEVICES": "true"}),
    ),
    "tensorflow-3": _jobs("tensorflow", 3, "data_job", "predict_job", ("save_failure_job", ("three",), {}), SYNC_BN_3),
    "torch-2": _jobs("torch", 2, "train_equal", *ON_EVERY_BACKEND_2),
    "torch-3": _jobs("torch", 3, "host_inputs_job", "train_equal", ("save_failure_job", ("three",), {}), SYNC_BN_3),
    "jax-2": _jobs("jax", 2, "train_equal", *ON_EVERY_BACKEND_2),
    "jax-3": _jobs("jax", 3, "host_inputs_job", "train_equal", ("save_failure_job", ("three",), {}), SYNC_BN_3),
}
BUNDLED = {job: name for name, jobs in BUNDLES.items() for job in jobs}
# Each job of a bundle gets at most this long (under load on 2 cores they take 10-50 s).
SECONDS_PER_BUNDLED_JOB = 150


def bundles_enabled() -> bool:
    """TNT_TEST_BUNDLES=0 starts every job alone (to run one test without its bundle's other jobs)."""
    return os.environ.get("TNT_TEST_BUNDLES", "1") != "0"


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
    TensorFlow, where not given). A job of BUNDLES comes from its bundle's one launch in this process."""
    on = backend or os.environ.get("KERAS_BACKEND", "tensorflow")
    wanted = Job(job, ranks, args, on, tuple(sorted((env or {}).items())))
    if check and not launcher_args and wanted in BUNDLED and bundles_enabled():
        finished, failure = _bundled(BUNDLED[wanted])
        if wanted not in finished:
            raise AssertionError(f"{job} on {ranks} ranks did not finish in its bundle; {failure}")
        return finished[wanted]
    return _launch(
        job, ranks, args, timeout=timeout, env=env, check=check, launcher_args=launcher_args, backend=backend
    )


def _launch(
    job: str,
    ranks: int,
    args: tuple[str, ...],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    check: bool = True,
    launcher_args: tuple[str, ...] = (),
    backend: str | None = None,
    prepare: Callable[[Path], tuple[str, ...]] | None = None,
) -> Result:
    """``run`` without bundles; ``prepare`` makes the job's arguments once its folder exists."""
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
            # JAX's compiled programs, shared by the session's JAX ranks: the jobs compile the same
            # models again and again (train_equal's 2-rank job took 110 s cold, 87 s warm).
            "JAX_COMPILATION_CACHE_DIR": os.path.join(REFERENCE_CACHE, "jax-programs"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            # XLA's CPU compiler, made cheaper where only the machine code changes: without LLVM's
            # optimisation, and with XLA's older (LLVM IR) emitters for each fusion instead of its
            # MLIR fusion emitters, the costliest part of compiling here. XLA's own passes (fusion,
            # scheduling, buffer assignment: where the order of tnt's calls in a step is decided)
            # run as they do for users, and a job's ranks and its serial reference compile alike.
            # Most of a JAX job is compiling: train_equal on 2 ranks alone took 70 s, 50 s with the
            # first flag, 31 s with both (91 -> 56 CPU-s).
            # One XLA thread per rank, as tnt-launch gives a rank whose share is one CPU (it leaves
            # an XLA_FLAGS of the user's as it is): the tests' ranks always share the cores.
            "XLA_FLAGS": " ".join(
                (
                    "--xla_backend_optimization_level=0",
                    "--xla_cpu_use_fusion_emitters=false",
                    "--xla_cpu_multi_thread_eigen=false",
                )
            ),
        }
    )
    full_env.update(env or {})
    if backend is not None:
        full_env["KERAS_BACKEND"] = backend
    # Serial references differ between backends: each backend's jobs share their own.
    backend = full_env.get("KERAS_BACKEND", "tensorflow")
    full_env["TNT_TEST_CACHE"] = os.path.join(REFERENCE_CACHE, backend)
    os.makedirs(full_env["TNT_TEST_CACHE"], exist_ok=True)
    if prepare is not None:
        args = prepare(out_dir)
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


@functools.cache
def _bundled(name: str) -> tuple[dict[Job, Result], str]:
    """Runs bundle ``name`` once in this process: the results of the jobs that finished, and what to
    tell the tests of those that did not (the launch's output); kept either way, so that a failed
    bundle is not run again for each of its tests."""
    jobs = BUNDLES[name]
    folders = [f"{i}-{job.script}" for i, job in enumerate(jobs)]  # each job's, in the launch's folder

    def prepare(out_dir: Path) -> tuple[str, ...]:
        entries = []
        for job, folder in zip(jobs, folders, strict=True):
            (out_dir / folder).mkdir()
            script, env = str(JOBS / f"{job.script}.py"), dict(job.env)
            entries.append(
                {"name": job.script, "script": script, "args": job.args, "env": env, "out": str(out_dir / folder)}
            )
        (out_dir / "bundle.json").write_text(json.dumps(entries))
        return (str(out_dir / "bundle.json"),)

    first = jobs[0]
    timeout = SECONDS_PER_BUNDLED_JOB * len(jobs)
    try:
        launched = _launch(
            "_bundle", first.ranks, (), timeout=timeout, check=False, backend=first.backend, prepare=prepare
        )
    except subprocess.TimeoutExpired as e:
        # (TimeoutExpired keeps the output as bytes, even of a text-mode run.)
        output = "".join(o.decode(errors="replace") if isinstance(o, bytes) else o or "" for o in (e.stdout, e.stderr))
        return {}, f"bundle {name} did not end within {timeout} s:\n{output[-6000:]}"
    results = {}
    for job, name_of_folder in zip(jobs, folders, strict=True):
        folder = launched.out_dir / name_of_folder
        if (folder / "done").exists():
            ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(job.ranks)]
            results[job] = Result(0, launched.output, ranks, folder)
    return results, f"bundle {name} failed with code {launched.returncode}:\n{launched.output[-6000:]}"
