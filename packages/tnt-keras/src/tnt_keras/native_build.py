"""Compiling a small C++ library of tnt-keras against what is installed, once per host, into a cache.

tnt-keras' native pieces (the TensorFlow op, the JAX backend's XLA handler) must match the framework
they run in (its headers and C++ ABI), so each is built on the machine that runs it, into a cache
keyed by everything that shapes the binary. Several ranks of a job start at the same moment: a file
lock makes exactly one of them compile while the others wait and then load its result, or reuse its
failure instead of failing the same way again.

Standard library only: the wheel's build hook (hatch_build.py) loads the TensorFlow op's build, and
this module with it, by path.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("tnt_keras")

COMPILE_TIMEOUT_S = 600


class BuildError(RuntimeError):
    """A library could not be compiled or loaded; the message says why (the compiler's stderr tail)."""


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


def compile_into(target: Path, commands: Callable[[str], list[list[str]]], cwd: Path, what: str) -> None:
    """Runs ``commands(output)`` (compiling, then linking: a compiler cache keeps only objects) in
    ``cwd`` and puts the library at ``target`` atomically: a reader sees no library or a whole one."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.stem + ".", suffix=".tmp")
    os.close(fd)
    try:
        t0 = time.monotonic()
        for command in commands(tmp):
            try:
                # From the source's folder, not the caller's: ccache with a base_dir keys the paths
                # relative to where the compiler runs, so a job's own temporary folder would miss.
                proc = subprocess.run(
                    command, cwd=cwd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                raise BuildError(f"{command[0]} failed to run: {e}") from None
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout)[-2000:].strip()
                raise BuildError(f"{command[0]} exited with {proc.returncode}" + (f":\n{tail}" if tail else ""))
        os.replace(tmp, target)
        log.info("tnt_keras: compiled %s in %.1f s: %s", what, time.monotonic() - t0, target)
    finally:
        for leftover in (tmp, tmp + ".o"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def build_once(target: Path, compile_to: Callable[[Path], None], announce: str) -> Path:
    """Returns ``target``, calling ``compile_to(target)`` first unless it exists. Exactly one process
    per cache directory compiles (logging ``announce`` as a warning first); the others block on the
    lock meanwhile, and reuse its failure."""
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
            log.info("tnt_keras: waiting for another process compiling %s", target.name)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another process built it while we waited
            return target
        # Reuse a failure that another process met while we waited; an older one is retried.
        if failed.exists() and failed.stat().st_mtime >= asked - 1.0:
            raise BuildError(failed.read_text())
        for pattern in (".*.tmp", ".*.tmp.o"):  # left by a compile that was killed
            for stale in target.parent.glob(target.stem + pattern):
                stale.unlink(missing_ok=True)
        log.warning(announce)
        try:
            compile_to(target)
        except BuildError as e:
            with contextlib.suppress(OSError):  # only an optimisation for the waiting processes
                failed.write_text(str(e))
            raise
        failed.unlink(missing_ok=True)
    return target


def c_api_pointer() -> int:
    """The address of tnt_comm's C ABI table, from the capsule its extension module exports, for a
    native piece to share the process' one tnt-comm runtime."""
    import tnt_comm._core

    get = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi)
    )
    pointer = get(tnt_comm._core._C_API, b"tnt_comm._C_API")
    if not pointer:
        raise BuildError("tnt_comm._core._C_API is not a tnt_comm C API capsule")
    return int(pointer)
