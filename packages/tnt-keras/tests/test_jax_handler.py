"""The JAX backend's XLA handler where it cannot be built: a warning and the ordered callbacks, or,
with TNT_KERAS_JAX_SUM=ffi, the build's error every time it is asked (no rank falls back silently)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import skip_unless_installed

SCRIPT = """
import json, os
from tnt_keras.backends.jax import native
found = {"default": [native.chosen(), native.chosen()]}
os.environ["TNT_KERAS_JAX_SUM"] = "ffi"
errors = []
for _ in range(2):
    try:
        native.chosen()
        errors.append(None)
    except native.BuildError as e:
        errors.append(str(e))
found["ffi"] = errors
os.environ["TNT_KERAS_JAX_SUM"] = "callback"
found["callback"] = native.chosen()
print("RESULT", json.dumps(found))
"""


@pytest.mark.timeout(120)
def test_a_handler_that_cannot_be_built_falls_back_or_fails_as_asked(tmp_path: Path) -> None:
    skip_unless_installed("jax")
    env = {**os.environ, "KERAS_BACKEND": "jax", "CXX": str(tmp_path / "no-compiler"),
           "TNT_KERAS_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    env.pop("TNT_KERAS_JAX_SUM", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=100,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert found["default"] == [False, False]
    assert "handler is unavailable" in done.stderr and "no-compiler" in done.stderr, done.stderr[-3000:]
    assert done.stderr.count("handler is unavailable") == 1  # said once, not at every step
    assert len(found["ffi"]) == 2 and all(e is not None and "no-compiler" in e for e in found["ffi"]), found
    assert found["callback"] is False
