"""What importing tnt_keras needs: tnt-comm, Keras and the backend's framework, never tnt-launch, and
on JAX neither TensorFlow nor torch (where both are installed, as here)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src"


def python(code: str, backend: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(SRC), "TF_CPP_MIN_LOG_LEVEL": "2"}
    for name in [n for n in env if n.startswith("TNT_")]:  # a single rank of its own
        env.pop(name)
    argv = [sys.executable, "-c", code]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.timeout(150)
def test_tnt_keras_imports_without_the_launcher_installed() -> None:
    # None in sys.modules makes every import of tnt_launch fail, as if it were not installed.
    code = "import sys; sys.modules['tnt_launch'] = None; import tnt_keras; print(tnt_keras.get_size())"
    done = python(code, "torch")
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr[-3000:]


@pytest.mark.timeout(150)
def test_the_jax_backend_imports_neither_tensorflow_nor_torch() -> None:
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed (pip install 'jax[cpu]', or nox's keras session)")
    code = (
        "import sys, keras, numpy as np, tnt_keras as tnt\n"
        "m = tnt.Model(keras.Sequential([keras.Input((3,)), tnt.SyncBatchNormalization(), keras.layers.Dense(2)]))\n"
        "m.compile(optimizer='sgd', loss='mse')\n"
        "m.fit(np.ones((8, 3), 'float32'), np.ones((8, 2), 'float32'), batch_size=4, verbose=0)\n"
        "print(sorted(n for n in ('tensorflow', 'torch') if n in sys.modules))\n"
    )
    done = python(code, "jax")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
