"""An installed wheel that was built with TensorFlow importable carries the compiled op and loads it
without compiling (``pip install --no-build-isolation``; nox's keras session installs it so)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest


def installed_prebuilt_dir() -> Path | None:
    spec = importlib.util.find_spec("tnt_keras")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "backends" / "tensorflow" / "ops" / "prebuilt"
    return folder if folder.is_dir() else None


@pytest.mark.timeout(120)
def test_the_op_built_at_install_time_is_the_one_loaded(tmp_path: Path) -> None:
    folder = installed_prebuilt_dir()
    if folder is None:
        pytest.skip(
            "this tnt_keras was not built with TensorFlow importable, so it has no op built at install time "
            "(pip install --no-build-isolation ./packages/tnt-keras builds it in)"
        )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(TNT_KERAS_CACHE_DIR=str(tmp_path / "empty-cache"), TF_CPP_MIN_LOG_LEVEL="2")
    code = (
        "import tensorflow as tf, tnt_keras\n"
        "from tnt_keras.backends.tensorflow import ops\n"
        "print(ops.backend(), float(ops.allreduce(tf.constant(2.5)).numpy()))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["async-op", "2.5"], proc.stdout
    # Nothing was compiled: the cache it would have compiled into was never created.
    assert not (tmp_path / "empty-cache").exists()
    command = [sys.executable, "-m", "tnt_keras.backends.tensorflow.ops"]
    listed = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100, check=True)
    assert Path(listed.stdout.strip().splitlines()[-1]).parent == folder, listed.stdout


def test_the_op_exports_only_its_two_entry_points() -> None:
    """The op library shares its process with TensorFlow's C++ runtime; it must export nothing else
    (a compiler that links libstdc++ statically would otherwise leak a second runtime into it)."""
    import shutil

    folder = installed_prebuilt_dir()
    libraries = sorted(folder.glob("*.so")) if folder is not None else []
    if not libraries:
        pytest.skip("this tnt_keras has no op built at install time to inspect")
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed, so exported symbols cannot be listed")
    for library in libraries:
        out = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
        names = {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}
        assert {"tnt_ops_set_api", "tnt_ops_api_version"} <= names, names
        assert names <= {"tnt_ops_set_api", "tnt_ops_api_version", "_init", "_fini"}, names
