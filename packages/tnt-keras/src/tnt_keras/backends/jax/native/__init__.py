"""The JAX backend's XLA handler (``tnt_sum.cc``): tnt-comm's allreduce called by XLA itself from a
compiled step on CPUs, without a Python callback.

It is compiled against the installed jaxlib's FFI headers and tnt-comm's C ABI header on first use,
into tnt-keras' cache (``tnt_keras.native_build``: one rank of a host compiles, about 10 s), loaded,
handed tnt-comm's C ABI table and registered with XLA as ``tnt_sum``. Where that fails (no compiler,
say), a warning says why and the steps keep calling tnt-comm through ``io_callback``.
``TNT_KERAS_JAX_SUM=callback`` chooses the callbacks, ``=ffi`` makes a failed build an error.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import jax
import tnt_comm

from ....native_build import BuildError, build_once, c_api_pointer, cache_dir, compile_into, compiler

log = logging.getLogger("tnt_keras")

SOURCE = Path(__file__).with_name("tnt_sum.cc")
EXPORTS = Path(__file__).with_name("tnt_sum.map")
TARGET = "tnt_sum"
CHOICE = "TNT_KERAS_JAX_SUM"


def _commands(cxx: list[str], output: str) -> list[list[str]]:
    obj = output + ".o"
    includes = ["-isystem", jax.ffi.include_dir(), "-I", tnt_comm.get_include()]
    compile_ = [*cxx, "-std=c++17", "-O2", "-fPIC", "-c", str(SOURCE), "-o", obj, *includes]
    # Export only the handler and the three functions below: no symbol of a statically linked C++
    # runtime leaves the library.
    link = [*cxx, "-shared", obj, "-o", output, "-Wl,--exclude-libs,ALL", f"-Wl,--version-script={EXPORTS}"]
    return [compile_, link]


def library_path(cxx: list[str]) -> Path:
    """Named for jaxlib, Python, the source, tnt-comm's C ABI headers and the commands."""
    import jaxlib

    digest = hashlib.sha256()
    headers = Path(tnt_comm.get_include()) / "tnt_comm"
    for path in (SOURCE, EXPORTS, *(headers / name for name in ("c_api.h", "codes.h", "error_data.hpp"))):
        digest.update(path.read_bytes())
    for command in _commands(cxx, "OUT"):
        digest.update("\0".join(command).encode())
    name = f"tnt_sum-jaxlib{jaxlib.__version__}-{sys.implementation.cache_tag}-{digest.hexdigest()[:16]}.so"
    return cache_dir() / name


def _load(path: Path) -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise BuildError(f"cannot load {path}: {e}") from None
    lib.tnt_jax_set_api.argtypes = [ctypes.c_void_p]
    lib.tnt_jax_set_api.restype = ctypes.c_int
    lib.tnt_jax_take_failure.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.tnt_jax_take_failure.restype = ctypes.c_size_t
    rc = lib.tnt_jax_set_api(c_api_pointer())
    if rc == 2:
        built_for = lib.tnt_jax_api_version()
        raise BuildError(f"tnt_comm's C API is not version {built_for}, which {path.name} was built for")
    if rc != 0:
        raise BuildError(f"tnt_jax_set_api failed with code {rc}")
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.TntSum), platform="cpu")
    return lib


class _Library:
    """The loaded handler library, once per process; None where the callbacks serve instead."""

    def __init__(self) -> None:
        self.tried = False
        self.lib: ctypes.CDLL | None = None
        self.failure: BuildError | None = None

    def get(self) -> ctypes.CDLL | None:
        choice = os.environ.get(CHOICE, "").strip().lower()
        if self.tried:
            if self.failure is not None and choice == "ffi":
                raise self.failure
            return self.lib
        self.tried = True
        try:
            cxx = compiler()
            path = build_once(
                library_path(cxx),
                lambda target: compile_into(target, lambda out: _commands(cxx, out), SOURCE.parent, "tnt_sum"),
                "tnt_keras: compiling the JAX backend's XLA handler (once per host, about 10 s)",
            )
            self.lib = _load(path)
        except BuildError as e:
            self.failure = e
            if choice == "ffi":
                raise
            log.warning("tnt_keras: the JAX backend's XLA handler is unavailable (%s); the steps call "
                        "tnt-comm through io_callback instead (slower)", e)
        return self.lib


_library = _Library()


def chosen() -> bool:
    """Whether steps on CPUs should sum through ``tnt_sum``: not where ``TNT_KERAS_JAX_SUM=callback``
    (read at every step's trace), and where it builds and loads (on first use)."""
    if os.environ.get(CHOICE, "").strip().lower() == "callback":
        return False
    return _library.get() is not None


def take_failure() -> dict[str, Any] | None:
    """The last tnt-comm error a ``tnt_sum`` call failed with, as data (tnt_comm.error_data's fields),
    once; None where there is none."""
    lib = _library.lib
    if lib is None:
        return None
    size = lib.tnt_jax_take_failure(None, 0)
    if size == 0:
        return None
    buffer = ctypes.create_string_buffer(size + 1)
    if lib.tnt_jax_take_failure(buffer, size + 1) == 0:
        return None
    found = json.loads(buffer.value.decode(errors="replace"))
    return found if isinstance(found, dict) else None
