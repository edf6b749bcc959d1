"""Compiling tnt_ops.cc against the installed TensorFlow, once per host, and loading it.

The op must match the TensorFlow it runs in (C++ ABI, headers), so it is built on the machine that
runs it, into a cache keyed by everything that shapes the binary. Several ranks of a job import at
the same moment: a file lock makes exactly one of them compile (7-10 s, ~650 MB) while the others
wait and then load its result, or reuse its failure instead of failing the same way again.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

log = logging.getLogger("tnt_keras")

SOURCE = Path(__file__).with_name("tnt_ops.cc")
EXPORTS = Path(__file__).with_name("tnt_ops.map")
CAPSULE_NAME = b"tnt_comm._C_API"
COMPILE_TIMEOUT_S = 600


class BuildError(RuntimeError):
    """The op could not be compiled or loaded; the message says why (the compiler's stderr tail)."""


def cache_dir() -> Path:
    """$TNT_KERAS_CACHE_DIR, else $XDG_CACHE_HOME/tnt_keras, else ~/.cache/tnt_keras."""
    if os.environ.get("TNT_KERAS_CACHE_DIR"):
        return Path(os.environ["TNT_KERAS_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tnt_keras"


def compiler() -> list[str]:
    """The C++ compiler command: $CXX (may carry words, e.g. 'ccache g++'), else c++ or g++."""
    cxx = os.environ.get("CXX")
    if cxx:
        cmd = shlex.split(cxx)
        if not cmd or shutil.which(cmd[0]) is None:
            raise BuildError(f"$CXX={cxx!r} is not an executable")
        return cmd
    for name in ("c++", "g++"):
        if shutil.which(name):
            return [name]
    raise BuildError("no C++ compiler found (install g++ or set $CXX)")


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
    (the table and the codes it includes)."""
    import tnt_comm

    digest = hashlib.sha256()
    digest.update(SOURCE.read_bytes())
    digest.update(EXPORTS.read_bytes())
    for header in ("c_api.h", "codes.h"):
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
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.stem + ".", suffix=".tmp")
    os.close(fd)
    try:
        t0 = time.monotonic()
        for command in _commands(cxx, tmp):
            try:
                # From the source's folder, not the caller's: ccache with a base_dir keys the paths
                # relative to where the compiler runs, so a job's own temporary folder would miss.
                proc = subprocess.run(
                    command,
                    cwd=SOURCE.parent,
                    capture_output=True,
                    text=True,
                    timeout=COMPILE_TIMEOUT_S,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                raise BuildError(f"{' '.join(cxx)} failed to run: {e}") from None
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout)[-2000:].strip()
                raise BuildError(f"{' '.join(cxx)} exited with {proc.returncode}" + (f":\n{tail}" if tail else ""))
        os.replace(tmp, target)  # atomic: a reader sees no library or a whole one
        log.info("tnt_keras: compiled the TensorFlow op in %.1f s: %s", time.monotonic() - t0, target)
    finally:
        for leftover in (tmp, tmp + ".o"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def _tf_version() -> str:
    """TensorFlow's major.minor version, e.g. "2.16"."""
    import tensorflow as tf

    return ".".join(tf.__version__.split(".")[:2])


def build() -> Path:
    """Returns the path of the compiled op library, compiling it first unless it is cached.

    Exactly one process per cache directory compiles; the others block on the lock meanwhile.
    """
    cxx = compiler()
    target = library_path(cxx)
    if target.exists():
        return target
    failed = target.with_suffix(".failed")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = open(target.parent / ".lock", "a+")  # held until the end of the with block
    except OSError as e:
        raise BuildError(f"cannot use the cache directory {target.parent}: {e}") from None
    with lock:
        asked = time.time()
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("tnt_keras: waiting for another process compiling the TensorFlow op")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another process built it while we waited
            return target
        # Reuse a failure that another process met while we waited; an older one is retried.
        if failed.exists() and failed.stat().st_mtime >= asked - 1.0:
            raise BuildError(failed.read_text())
        for pattern in (".*.tmp", ".*.tmp.o"):  # left by a compile that was killed
            for stale in target.parent.glob(target.stem + pattern):
                stale.unlink(missing_ok=True)
        log.warning(
            "tnt_keras: compiling the TensorFlow op for TF %s (once per host, about 10 s; "
            "`pip install --no-build-isolation` builds it at install time)",
            _tf_version(),
        )
        try:
            _compile(cxx, target)
        except BuildError as e:
            with contextlib.suppress(OSError):  # only an optimisation for the waiting processes
                failed.write_text(str(e))
            raise
        failed.unlink(missing_ok=True)
    return target


def _capsule_pointer() -> int:
    """The address of tnt_comm's C ABI table, from the capsule its extension module exports."""
    import tnt_comm._core

    get = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi)
    )
    pointer = get(tnt_comm._core._C_API, CAPSULE_NAME)
    if not pointer:
        raise BuildError("tnt_comm._core._C_API is not a tnt_comm C API capsule")
    return int(pointer)


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
    pointer = _capsule_pointer()
    rc = lib.tnt_ops_set_api(pointer)
    if rc == 2:
        have = ctypes.c_uint32.from_address(pointer).value
        raise BuildError(f"tnt_comm's C API is version {have}, the op was built for {lib.tnt_ops_api_version()}")
    if rc != 0:
        raise BuildError(f"tnt_ops_set_api failed with code {rc}")
    return module
