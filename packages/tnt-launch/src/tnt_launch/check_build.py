"""`tnt-launch --check-build`: what the tnt packages of this Python can do, before a job needs it.

Reports tnt_comm's transports (GPI-2 included or not) and compiler, and whether tnt_keras' TensorFlow
op is ready (built at install time, compiled into the cache, or still to be compiled by the first
job). Imports neither tnt_keras' package (which would start building the op) nor TensorFlow unless
tnt_keras is installed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, TextIO


def comm_info() -> dict[str, Any] | None:
    """tnt_comm.build_info() of this Python, or None if tnt_comm is not installed."""
    try:
        import tnt_comm
    except ImportError:
        return None
    return tnt_comm.build_info()


def _keras_op_status() -> str:
    spec = importlib.util.find_spec("tnt_keras")
    if spec is None or not spec.submodule_search_locations:
        return "tnt_keras: not installed (only Keras training needs it)"
    folder = Path(next(iter(spec.submodule_search_locations)))
    if importlib.util.find_spec("tensorflow") is None:
        return f"tnt_keras ({folder}): TensorFlow is not installed"
    # _build.py alone, without the package's __init__ (which would load, and so build, the op).
    build_spec = importlib.util.spec_from_file_location("_tnt_keras_ops_build", folder / "backends" / "tensorflow" / "ops" / "_build.py")
    assert build_spec is not None and build_spec.loader is not None
    build = importlib.util.module_from_spec(build_spec)
    build_spec.loader.exec_module(build)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up lines, unless asked for
    import tensorflow as tf

    head = f"tnt_keras ({folder}), TensorFlow {tf.__version__}: allreduce op"
    prebuilt = build.prebuilt_path()
    if prebuilt.exists():
        return f"{head} built at install time ({prebuilt})"
    try:
        cached = build.library_path(build.compiler())
    except build.BuildError as e:
        return f"{head} cannot be built ({e}): training falls back to tf.numpy_function, which is slower"
    if cached.exists():
        return f"{head} compiled into the cache ({cached})"
    return (
        f"{head} not built yet: the first job compiles it once for this host (about 10 s); "
        "`python -m tnt_keras.backends.tensorflow.ops` does it now"
    )


def report(out: TextIO) -> int:
    """Prints what this installation has; 1 if tnt_comm is missing, else 0."""
    info = comm_info()
    if info is None:
        print(f"tnt_comm: not installed for {sys.executable}", file=out)
        code = 1
    else:
        gpi2 = info.get("gpi2")
        gpi2_text = (
            f"GPI-2 {gpi2.get('version')} ({gpi2.get('network')}) from {gpi2.get('prefix')}"
            if isinstance(gpi2, dict)
            else "not built in (this build has no GPI-2 transport)"
        )
        print(
            f"tnt_comm {info['version']} ({info['path']}): transports {', '.join(info['transports'])}; "
            f"gpi2: {gpi2_text}; compiled by {info['compiler']}",
            file=out,
        )
        code = 0
    print(_keras_op_status(), file=out)
    return code
