"""Compiling tnt_ops.cc against the installed TensorFlow, once per host, and loading it.

The op must match the TensorFlow it runs in (C++ ABI, headers), so it is built on the machine that
runs it, into a cache keyed by everything that shapes the binary (tnt_keras.native_build: one rank
compiles, 7-10 s and ~650 MB, while the others wait for its result).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import logging
import sys
from pathlib import Path
from types import ModuleType


def _native_build() -> ModuleType:
    """tnt_keras.native_build; by its path where this file itself was loaded by path (hatch_build.py
    builds the op into the wheel before tnt_keras is installed)."""
    if __package__:
        from .... import native_build

        return native_build
    path = Path(__file__).parents[3] / "native_build.py"
    spec = importlib.util.spec_from_file_location("_tnt_keras_native_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


log = logging.getLogger("tnt_keras")
native_build = _native_build()
BuildError = native_build.BuildError
cache_dir = native_build.cache_dir
compiler = native_build.compiler

SOURCE = Path(__file__).with_name("tnt_ops.cc")
EXPORTS = Path(__file__).with_name("tnt_ops.map")


def _commands(cxx: list[str], output: str) -> list[list[str]]:
    """Compiling and linking, as two commands: a compiler cache (``CXX="ccache g++"``) keeps only
    objects, and passes a command that compiles and links at once to the compiler uncached."""
    import tensorflow as tf
    import tnt_comm

    obj = output + ".o"
    compile_ = [*cxx, "-O2", "-fPIC", "-c", str(SOURCE), "-o", obj, *tf.sysconfig.get_compile_flags()]
    compile_ += ["-I", tnt_comm.get_include()]
    link = [*cxx, "-shared", obj, "-o", output, *tf.sysconfig.get_link_flags()]
    # Export nothing: no symbol of a statically linked C++ runtime leaves the library.
    link += ["-Wl,--exclude-libs,ALL", f"-Wl,--version-script={EXPORTS}"]
    return [compile_, link]


def _abi_digest() -> hashlib._Hash:
    """A hash of what the binary's interface depends on: the op's source and tnt_comm's C ABI headers
    (the table, the codes it includes, the JSON of its errors)."""
    import tnt_comm

    digest = hashlib.sha256()
    digest.update(SOURCE.read_bytes())
    digest.update(EXPORTS.read_bytes())
    for header in ("c_api.h", "codes.h", "error_data.hpp"):
        digest.update((Path(tnt_comm.get_include()) / "tnt_comm" / header).read_bytes())
    return digest


def prebuilt_path() -> Path:
    """Where a wheel built with TensorFlow importable (``pip install --no-build-isolation``) keeps
    the op it compiled: beside this file, named for the TF, Python and interface it was built for,
    so that a later TF or tnt_comm simply does not find it and builds into the cache instead."""
    import tensorflow as tf

    name = f"tnt_ops-tf{tf.__version__}-{sys.implementation.cache_tag}-{_abi_digest().hexdigest()[:16]}.so"
    return Path(__file__).with_name("prebuilt") / name


def compile_to(target: Path) -> None:
    """Compiles the op into ``target`` (used by the wheel's build hook)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _compile(compiler(), target)


def load_best() -> ModuleType:
    """Loads the op the wheel brought, if it matches this TF and tnt_comm; else the cached build,
    compiling it first where needed."""
    prebuilt = prebuilt_path()
    if prebuilt.exists():
        try:
            return load(prebuilt)
        except BuildError as e:
            log.info("tnt_keras: the op built at install time does not load (%s); building it instead", e)
    return load(build())


def library_path(cxx: list[str]) -> Path:
    """Where the library for this TF, Python, source, C ABI header and flags lives in the cache."""
    import tensorflow as tf

    digest = _abi_digest()
    for command in _commands(cxx, "OUT"):
        digest.update("\0".join(command).encode())
    name = f"tnt_ops-tf{tf.__version__}-{sys.implementation.cache_tag}-{digest.hexdigest()[:16]}.so"
    return cache_dir() / name


def _compile(cxx: list[str], target: Path) -> None:
    native_build.compile_into(target, lambda output: _commands(cxx, output), SOURCE.parent, "the TensorFlow op")


def _tf_version() -> str:
    """TensorFlow's major.minor version, e.g. "2.16"."""
    import tensorflow as tf

    return ".".join(tf.__version__.split(".")[:2])


def build() -> Path:
    """Returns the path of the compiled op library, compiling it first unless it is cached.

    Exactly one process per cache directory compiles; the others block on the lock meanwhile.
    """
    cxx = compiler()
    return native_build.build_once(
        library_path(cxx),
        lambda target: _compile(cxx, target),
        f"tnt_keras: compiling the TensorFlow op for TF {_tf_version()} (once per host, about 10 s; "
        "`pip install --no-build-isolation` builds it at install time)",
    )


def load(path: Path) -> ModuleType:
    """Loads the op library into TensorFlow and hands it tnt_comm's C ABI table."""
    import tensorflow as tf

    try:
        module = tf.load_op_library(str(path))
    except Exception as e:  # any load error means: fall back, saying why
        raise BuildError(f"tf.load_op_library({path}) failed: {e}") from None
    lib = ctypes.CDLL(str(path))  # the same handle TensorFlow opened: dlopen counts references
    lib.tnt_ops_set_api.argtypes = [ctypes.c_void_p]
    lib.tnt_ops_set_api.restype = ctypes.c_int
    pointer = native_build.c_api_pointer()
    rc = lib.tnt_ops_set_api(pointer)
    if rc == 2:
        have = ctypes.c_uint32.from_address(pointer).value
        raise BuildError(f"tnt_comm's C API is version {have}, the op was built for {lib.tnt_ops_api_version()}")
    if rc != 0:
        raise BuildError(f"tnt_ops_set_api failed with code {rc}")
    return module
