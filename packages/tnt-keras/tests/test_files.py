"""Whole-model files: tnt writes the wrapped Keras model, which plain Keras loads without tnt (no
lock-in) and tnt loads as a tnt.Model; files of an earlier tnt, which name the wrapper, still load.
On both backends: Keras' .keras format is the same on each."""

import functools
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import skip_unless_installed
from launch import JOBS, Result, run

# Its jobs run in their backend's bundles (launch.BUNDLES).
pytestmark = pytest.mark.bundled

DATA = Path(__file__).parent / "data"
KINDS = {"functional": "Functional", "sequential": "Sequential", "subclassed": "Subclassed"}


# The jobs each test reads: TensorFlow on 1 and 2 ranks, torch on 2 (whose job serves both tests).
CASES = [(1, "tensorflow"), (2, "tensorflow"), (2, "torch"), (2, "jax")]
LEGACY_CASES = [(1, "tensorflow"), (2, "torch"), (2, "jax")]


@functools.cache
def files_job(ranks: int, backend: str) -> Result:
    """plain_files_job on ``ranks`` ranks of ``backend``, run once per test session: one job's
    reports serve both tests below (the job writes, reloads and continues every kind of file,
    legacy ones too)."""
    skip_unless_installed(backend)
    return run("plain_files_job", ranks, str(DATA), timeout=280, backend=backend)


def load_without_tnt(paths: list[Path], out: Path, backend: str) -> dict:
    """Loads ``paths`` with keras.models.load_model in a new Python that cannot import tnt."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"PYTHONPATH": str(JOBS), "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": backend})
    cmd = [sys.executable, str(JOBS / "plain_keras_load.py"), str(out), *map(str, paths)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.timeout(420)
@pytest.mark.parametrize(("ranks", "backend"), CASES)
def test_tnt_files_load_in_plain_keras_and_as_tnt_models(ranks: int, backend: str) -> None:
    result = files_job(ranks, backend)
    files = result.out_dir / "files"
    assert not [f for f in result.ranks[0]["files"] if "tnt-tmp" in f]
    for kind, cls in KINDS.items():
        config = zipfile.ZipFile(files / f"{kind}.keras").read("config.json").decode()
        assert "tnt>" not in config and "tnt_keras" not in config, config[:300]  # nothing names tnt's classes
        for rank, r in enumerate(result.ranks):
            k = r[kind]
            assert k["tnt"] == [True, cls, True], (rank, kind)
            assert k["tnt_weights"] == k["weights"] and k["tnt_iterations"] == k["iterations"] > 0
            assert k["plain"] == [cls, True] and k["plain_weights"] == k["weights"]  # Keras alone: the plain model
            # keras.saving.save_model called on a tnt.Model itself writes a tnt.Model, which tnt loads back.
            assert k["direct"] == [True, cls, True] and k["direct_weights"] == k["weights"]
            assert k["direct_iterations"] == k["iterations"]
            assert k["continued_equal"], (rank, kind)
    r0 = result.ranks[0]
    plain = load_without_tnt([files / f"{kind}.keras" for kind in KINDS], result.out_dir / "plain.json", backend)
    for kind, cls in KINDS.items():
        p = plain[str(files / f"{kind}.keras")]
        assert p["tnt_modules"] == []
        assert p["class"] == cls and p["compiled"], kind
        assert p["weights"] == r0[kind]["weights"] and p["iterations"] == r0[kind]["iterations"], kind
        assert max(abs(a - b) for a, b in zip(p["predictions"], r0[kind]["predictions"], strict=True)) < 1e-6


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("ranks", "backend"), LEGACY_CASES)
def test_files_of_an_earlier_tnt_still_load(ranks: int, backend: str) -> None:
    """Files an earlier tnt wrote (on TensorFlow) load on every backend."""
    r = files_job(ranks, backend).ranks[0]
    for kind, cls in (("functional", "Functional"), ("subclassed", "Subclassed")):
        k = r[f"legacy_{kind}"]
        assert k["loaded"] == [True, cls, True] and k["loaded_equal"], k
        assert k["loaded_iterations"] == 4  # the optimizer state came back too
        assert k["into_equal"] and k["into_iterations"] == 4, k
