"""Every check of the monorepo. `nox` runs the default sessions: the README's test command."""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).parent
COMM = ROOT / "packages" / "tnt-comm"
LAUNCH = ROOT / "packages" / "tnt-launch"
KERAS = ROOT / "packages" / "tnt-keras"
TEST_DEPS = ["pytest>=8", "pytest-timeout", "hypothesis", "psutil", "rich"]

nox.options.sessions = [
    "lint",
    "comm",
    "comm_static",
    "comm_cpp",
    "comm_asan",
    "comm_tsan",
    "launch",
    "keras",
    "integration",
]
nox.options.reuse_existing_virtualenvs = True


def install_comm(session: nox.Session) -> None:
    # No build isolation: the build directory (build/{wheel_tag}, see pyproject.toml) then stays
    # valid from one session to the next and only changed files recompile.
    session.install("scikit-build-core>=0.10", "pybind11>=2.12", "cmake", "ninja", "numpy")
    session.install("--no-build-isolation", str(COMM))


def ctest(session: nox.Session, name: str, *cmake_args: str) -> None:
    build = COMM / "build" / name
    session.install("cmake", "ninja")
    session.run("cmake", "-S", str(COMM), "-B", str(build), "-G", "Ninja", "-DTNT_COMM_BUILD_TESTS=ON", *cmake_args)
    session.run("cmake", "--build", str(build))
    session.run("ctest", "--test-dir", str(build), "--output-on-failure")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over all Python code."""
    session.install("ruff")
    session.run("ruff", "check", str(ROOT))


@nox.session
def comm(session: nox.Session) -> None:
    """tnt-comm's Python tests: real ranks, every collective, failures."""
    install_comm(session)
    session.install(*TEST_DEPS, "ml_dtypes")
    session.run("pytest", str(COMM / "tests"), "-q", "-rs", *session.posargs)


@nox.session
def comm_static(session: nox.Session) -> None:
    """tnt-comm linked as HPC compiler modules link it (libstdc++ static): every Python test, exports."""
    session.install("scikit-build-core>=0.10", "pybind11>=2.12", "cmake", "ninja", "numpy")
    session.install(
        "--no-build-isolation",
        "-C", "build-dir=build/static-libstdcxx",
        "-C", "cmake.define.CMAKE_SHARED_LINKER_FLAGS=-static-libstdc++",
        "-C", "cmake.define.CMAKE_MODULE_LINKER_FLAGS=-static-libstdc++",
        str(COMM),
    )  # fmt: skip
    # The build must really carry its own C++ runtime, or this session proves nothing.
    session.run("python", str(COMM / "tests" / "static_runtime_check.py"))
    session.install(*TEST_DEPS, "ml_dtypes")
    session.run("pytest", str(COMM / "tests"), "-q", "-rs", *session.posargs)


@nox.session
def comm_cpp(session: nox.Session) -> None:
    """tnt-comm's C++ unit tests under ctest."""
    ctest(session, "ctest")


@nox.session
def comm_asan(session: nox.Session) -> None:
    """The C++ tests under AddressSanitizer and UndefinedBehaviorSanitizer."""
    ctest(session, "asan", "-DTNT_COMM_SANITIZE=address", "-DCMAKE_BUILD_TYPE=RelWithDebInfo")


@nox.session
def comm_tsan(session: nox.Session) -> None:
    """The C++ tests under ThreadSanitizer."""
    ctest(session, "tsan", "-DTNT_COMM_SANITIZE=thread", "-DCMAKE_BUILD_TYPE=RelWithDebInfo")


@nox.session
def launch(session: nox.Session) -> None:
    """tnt-launch's tests: planning, real local and ssh multi-host runs, failures, cleanup."""
    session.install(str(LAUNCH), *TEST_DEPS)
    session.run("pytest", str(LAUNCH / "tests"), "-q", "-rs", *session.posargs)


@nox.session
def keras(session: nox.Session) -> None:
    """tnt-keras's tests: real ranks under tnt-launch against serial Keras, callbacks, saving, errors."""
    install_comm(session)
    session.install(str(LAUNCH), f"{KERAS}[cpu,test]", *TEST_DEPS, "hatchling")
    # Again with TensorFlow importable at build time, as users get with --no-build-isolation: the wheel
    # then carries the compiled op (test_prebuilt_op checks that it is the one loaded).
    session.install("--no-build-isolation", "--no-deps", "--force-reinstall", str(KERAS))
    session.run("python", "-m", "tnt_keras.ops")
    # The tests' jobs import tnt_keras from the source tree, which has no prebuilt op: fill the
    # cache up front, so the first test does not pay for the compile.
    session.run("python", "-c", "from tnt_keras.ops import _build; print(_build.build())")
    session.run("pytest", str(KERAS / "tests"), "-q", "-rs", "--durations=10", *session.posargs)


@nox.session
def integration(session: nox.Session) -> None:
    """Tests across packages: collectives and the Keras example in jobs started by tnt-launch."""
    install_comm(session)
    session.install(str(LAUNCH), f"{KERAS}[cpu]", "scikit-learn", *TEST_DEPS)
    session.run("pytest", str(ROOT / "integration"), "-q", "-rs", *session.posargs)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Allreduce benchmark against Open MPI and Gloo; writes docs/allreduce.png. Posargs go to it."""
    install_comm(session)
    session.install("-r", str(ROOT / "benchmarks" / "requirements.txt"))
    session.run(
        "python",
        str(ROOT / "benchmarks" / "allreduce.py"),
        *session.posargs,
        env={"PYTHONUNBUFFERED": "1", **({"OMP_NUM_THREADS": "1"} if "OMP_NUM_THREADS" not in os.environ else {})},
    )


@nox.session(default=False)
def bench_training(session: nox.Session) -> None:
    """LeNet-5 samples/s: plain Keras, tnt on 1 and 2 ranks, MultiWorkerMirroredStrategy; docs/training.png."""
    install_comm(session)
    session.install(str(LAUNCH), f"{KERAS}[cpu]", "-r", str(ROOT / "benchmarks" / "requirements.txt"))
    session.run("python", str(ROOT / "benchmarks" / "training.py"), *session.posargs, env={"PYTHONUNBUFFERED": "1"})
