"""Wheel build hook: compiles the TensorFlow op into the wheel when TensorFlow is importable.

That is the case with ``pip install --no-build-isolation`` in an environment that has TensorFlow and
tnt-comm: the wheel then carries ``tnt_keras/backends/tensorflow/ops/prebuilt/tnt_ops-<tf>-<python>-<abi>.so`` and
is tagged for this platform, and no rank compiles at start-up. Otherwise (the default isolated
build has no TensorFlow) the wheel stays pure Python and the op is compiled on first import.
``TNT_KERAS_BUILD_OP=0`` skips the compile. A failed compile never fails the install.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

BUILD_MODULE = Path(__file__).parent / "src" / "tnt_keras" / "backends" / "tensorflow" / "ops" / "_build.py"


def _say(message: str) -> None:
    print(f"tnt-keras build: {message}", file=sys.stderr, flush=True)


class OpBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        self._tmp: str | None = None
        if self.target_name != "wheel" or version == "editable":
            return
        if os.environ.get("TNT_KERAS_BUILD_OP", "1").strip().lower() in ("0", "false", "no", "off"):
            _say("TNT_KERAS_BUILD_OP=0: the op will be compiled on first import")
            return
        if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("tnt_comm") is None:
            _say(
                "TensorFlow or tnt-comm is not importable here, so the op will be compiled on first import "
                "(pip install --no-build-isolation in an environment with both builds it in)"
            )
            return
        try:
            spec = importlib.util.spec_from_file_location("_tnt_keras_op_build", BUILD_MODULE)
            assert spec is not None and spec.loader is not None
            build = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(build)
            name = build.prebuilt_path().name
            self._tmp = tempfile.mkdtemp(prefix="tnt-keras-op-")
            target = Path(self._tmp) / name
            build.compile_to(target)
        except Exception as e:  # noqa: BLE001 - the first-import build is the fallback
            _say(f"could not compile the op ({e}); it will be compiled on first import")
            return
        build_data["force_include"][str(target)] = f"tnt_keras/backends/tensorflow/ops/prebuilt/{name}"
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        _say(f"compiled the TensorFlow op into the wheel: {name}")

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if getattr(self, "_tmp", None):
            shutil.rmtree(self._tmp, ignore_errors=True)
