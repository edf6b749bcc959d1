"""How the command after `--` runs: a .py script under Python, a Python command line or a program
as given, `--python-interpreter` as an override; and the plain dry-run output."""

from __future__ import annotations

import io
import os
import shlex
import sys
from pathlib import Path

import pytest
from rich.console import Console

from tnt_launch.cli import parse_args
from tnt_launch.command import (
    EXECUTABLE,
    PYTHON,
    SCRIPT,
    classify,
    has_python_shebang,
    looks_like_python,
    python_target,
)
from tnt_launch.config import LaunchConfig
from tnt_launch.display import command_line, one_line, render_plan, write_plan
from tnt_launch.hosts import Host
from tnt_launch.plan import HostFacts, JobIdentity, Plan, build_plan

ID = JobIdentity("0123456789ab", "f" * 32, 29500)
LOCAL = [Host("localhost", local=True)]


def _plan(config: LaunchConfig, hosts: list[Host] | None = None) -> Plan:
    hosts = hosts or LOCAL
    facts = {h.name: HostFacts(cpus=4) for h in hosts}
    return build_plan(config, hosts, facts, ID, {})


def _file(path: Path, text: str | bytes, executable: bool) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    path.chmod(0o755 if executable else 0o644)
    return path


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with one of each kind of command, and a PATH of our own."""
    folder = tmp_path / "work"
    folder.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _file(bin_dir / "mytool", "#!/bin/sh\necho tool\n", executable=True)
    # A Python interpreter under a name that does not look like one.
    (bin_dir / "py").symlink_to(os.path.realpath(sys.executable))
    _file(folder / "train.py", "print('hi')\n", executable=False)
    _file(folder / "tool.py", "#!/usr/bin/env python3\nprint('hi')\n", executable=True)
    _file(folder / "my_collective", b"\x7fELF\x02\x01\x01\x00", executable=True)
    _file(folder / "run.sh", "#!/bin/sh\necho $TNT_RANK\n", executable=True)
    _file(folder / "pyprog", "#!/usr/bin/env -S python3 -u\nprint('hi')\n", executable=True)
    _file(folder / "noext", "#!/usr/bin/python3.12\nprint('hi')\n", executable=False)
    _file(folder / "data", "not a program\n", executable=False)
    monkeypatch.chdir(folder)
    return folder


def _config(work: Path, *argv: str) -> LaunchConfig:
    path = f"{work.parent / 'bin'}:/usr/bin:/bin"
    return parse_args(["-n", "2", "--no-gpu", *argv], {"PATH": path})


@pytest.mark.parametrize(
    ("command", "kind", "argv"),
    [
        # mpirun / horovodrun habit: the interpreter is part of the command.
        (["python3", "train.py", "-e", "3"], PYTHON, ("python3", "train.py", "-e", "3")),
        (["python", "-u", "train.py"], PYTHON, ("python", "-u", "train.py")),
        (["/opt/py/bin/python3.12", "train.py"], PYTHON, ("/opt/py/bin/python3.12", "train.py")),
        (["pypy3", "-m", "pkg.train"], PYTHON, ("pypy3", "-m", "pkg.train")),
        (["py", "train.py"], PYTHON, ("py", "train.py")),  # found on PATH, resolves to python
        # Programs run as given; a bare name in the working directory gets ./ so that exec finds it.
        (["./my_collective", "--size", "4"], EXECUTABLE, ("./my_collective", "--size", "4")),
        (["my_collective"], EXECUTABLE, ("./my_collective",)),
        (["./run.sh"], EXECUTABLE, ("./run.sh",)),
        (["mytool", "-v"], EXECUTABLE, ("mytool", "-v")),  # on PATH, like `hostname`
        # Python scripts run under tnt-launch's interpreter, as before.
        (["train.py", "--epochs", "3"], SCRIPT, (sys.executable, "train.py", "--epochs", "3")),
        (["tool.py"], SCRIPT, (sys.executable, "tool.py")),  # .py, even though executable
        (["./pyprog"], SCRIPT, (sys.executable, "./pyprog")),  # executable, python shebang
        (["noext"], SCRIPT, (sys.executable, "noext")),  # python shebang, not executable
        (["data"], SCRIPT, (sys.executable, "data")),  # a file that cannot be executed
        (["missing"], SCRIPT, (sys.executable, "missing")),  # nothing by that name: as before
        (["-m", "pkg.train"], SCRIPT, (sys.executable, "-m", "pkg.train")),
    ],
)
def test_the_command_decides_how_it_runs(
    work: Path, command: list[str], kind: str, argv: tuple[str, ...]
) -> None:
    config = _config(work, "--", *command)
    assert config.command_kind == kind
    plan = _plan(config)
    assert [spec.argv for spec in plan.ranks] == [argv, argv]


def test_python_interpreter_is_an_explicit_override(work: Path) -> None:
    config = _config(work, "--python-interpreter", "", "--", "train.py", "-x")
    assert _plan(config).ranks[0].argv == ("train.py", "-x")
    config = _config(work, "--python-interpreter", "python3 -X dev", "--", "./my_collective")
    assert _plan(config).ranks[0].argv == ("python3", "-X", "dev", "./my_collective")
    config = _config(work, "--python-interpreter", "/venv/bin/python", "--", "python3", "t.py")
    assert _plan(config).ranks[0].argv == ("/venv/bin/python", "python3", "t.py")
    # '' runs the word as typed: no ./ is added.
    config = _config(work, "--python-interpreter", "", "--", "my_collective")
    assert _plan(config).ranks[0].argv == ("my_collective",)


def test_pinning_wraps_commands_that_run_as_given(work: Path) -> None:
    config = _config(work, "--pin-to-socket", "--", "python3", "train.py")
    facts = {"localhost": HostFacts(cpus=4, numa_nodes=((0, 2), (1, 2)), has_numactl=True)}
    plan = build_plan(config, LOCAL, facts, ID, {})
    assert plan.ranks[1].argv == ("numactl", "--cpunodebind=1", "--preferred=1", "python3",
                                  "train.py")


def test_the_script_of_a_python_command_names_the_job(work: Path) -> None:
    """`--cleanup -- train.py` finds jobs started as `-- python3 train.py`, and the other way."""
    assert _config(work, "--", "python3", "-u", "train.py", "-n", "3").registered_script == (
        "train.py"
    )
    assert _config(work, "--", "python3", "-m", "pkg.train").registered_script == "pkg.train"
    assert _config(work, "--", "python3", "-c", "print(1)").registered_script == "python3"
    assert _config(work, "--", "train.py").registered_script == "train.py"
    assert _config(work, "--", "my_collective").registered_script == "./my_collective"
    cleanup = parse_args(["--cleanup", "--", "python3", "train.py"], {"PATH": "/usr/bin"})
    assert cleanup.registered_script == "train.py"


@pytest.mark.parametrize(
    ("args", "target"),
    [
        (["train.py", "-n", "2"], ("train.py", True)),
        (["-u", "-W", "error", "-X", "dev", "train.py"], ("train.py", True)),
        (["-Werror", "-Xdev", "-B", "train.py"], ("train.py", True)),
        (["--", "train.py"], ("train.py", True)),
        (["-m", "pkg.train", "x.py"], ("pkg.train", False)),
        (["-um", "pkg.train"], ("pkg.train", False)),
        (["-mpkg"], ("pkg", False)),
        (["-c", "import x", "x.py"], None),
        (["-Bc", "pass"], None),
        (["-"], None),
        ([], None),
        (["-u"], None),
    ],
)
def test_what_a_python_command_runs(args: list[str], target: tuple[str, bool] | None) -> None:
    assert python_target(args) == target


@pytest.mark.parametrize(
    "word",
    ["python", "python3", "python3.12", "python3.13t", "pypy", "pypy3", "pypy3.10",
     "/usr/bin/python3", "./venv/bin/python", "python3-dbg"],
)
def test_names_of_python_interpreters(word: str) -> None:
    assert looks_like_python(word, lambda _: None)


@pytest.mark.parametrize(
    "word", ["train", "python.py", "python3-config", "ipython", "mypython", "pythonista", "./a.out"]
)
def test_names_that_are_not_python_interpreters(word: str) -> None:
    assert not looks_like_python(word, lambda _: None)


def test_python_shebangs(tmp_path: Path) -> None:
    cases = {
        "#!/usr/bin/env python3\n": True,
        "#!/usr/bin/python3.12 -u\n": True,
        "#! /usr/bin/env -S PYTHONHASHSEED=0 python3 -u\n": True,
        "#!/bin/sh\n": False,
        "#!/usr/bin/env bash\n": False,
        "print('no shebang')\n": False,
        "": False,
    }
    for n, (first, expected) in enumerate(cases.items()):
        path = tmp_path / f"f{n}"
        path.write_text(first + "x = 1\n")
        assert has_python_shebang(str(path)) is expected, first
    assert not has_python_shebang(str(tmp_path / "missing"))


def test_classify_looks_in_the_working_directory_not_the_current_one(tmp_path: Path) -> None:
    _file(tmp_path / "prog", b"\x7fELF", executable=True)
    decision = classify(["prog"], str(tmp_path), path="/nonexistent")
    assert (decision.kind, decision.program) == (EXECUTABLE, "./prog")
    assert classify(["prog"], "/", path="/nonexistent").kind == SCRIPT


# ---------------------------------------------------------------------------------------------
# The dry run: plain lines into a file or pipe, tables on a terminal


def _long_plan() -> Plan:
    long_arg = "--config=" + "/very/long/path" * 40
    exports = (("LONG", "v" * 500), ("SPACES", "a  b = c"), ("NL", "first\nsecond"))
    config = LaunchConfig(
        script="python3", script_args=("train.py", long_arg, "it's here"), n_per_node=2,
        no_gpu=True, command_kind=PYTHON, exports=exports,
    )
    hosts = [Host("node1", local=True), Host("node2")]
    return build_plan(config, hosts, {h: HostFacts(cpus=4) for h in ("node1", "node2")}, ID,
                      {"PATH": "/usr/bin:/bin"})


def test_plain_dry_run_keeps_every_command_and_value_on_one_line() -> None:
    plan = _long_plan()
    out = io.StringIO()
    write_plan(plan, out, ["node2"])
    lines = out.getvalue().splitlines()
    command = command_line(plan.ranks[0].argv)
    assert len(command) > 600 and shlex.split(command) == list(plan.ranks[0].argv)
    assert lines[0] == (
        "Plan of job 0123456789ab: 4 rank(s) on 2 host(s); rank 0 listens on node1:29500"
    )
    assert lines[1:5] == [
        f"rank {r} host {host} local_rank {r % 2}/2 device CPU pinning - cmd: {command}"
        for r, host in enumerate(["node1", "node1", "node2 (ssh)", "node2 (ssh)"])
    ]
    assert lines[5] == "Environment exported to the ranks:"
    assert "LONG=" + "v" * 500 in lines
    assert "SPACES=a  b = c" in lines
    assert "NL=$'first\\nsecond'" in lines
    assert "TNT_RANK=per rank: 0, 1, 2, 3" in lines
    assert "CUDA_VISIBLE_DEVICES=" in lines
    assert "PATH=/usr/bin:/bin  [ranks on other hosts; ranks on this host inherit it]" in lines
    assert not [line for line in lines if "f" * 32 in line]
    assert lines[-1] == "Dry run: nothing was started."
    assert not any(c in out.getvalue() for c in "│┃━─")


def test_plain_dry_run_lists_every_rank_of_a_per_rank_value() -> None:
    config = LaunchConfig(script="t.py", python_interpreter=("python3",), nprocs=12, no_gpu=True)
    out = io.StringIO()
    write_plan(_plan(config), out)
    assert "TNT_RANK=per rank: " + ", ".join(str(r) for r in range(12)) in out.getvalue()


def test_one_line_quoting() -> None:
    assert one_line("plain value with 'quotes' and ü") == "plain value with 'quotes' and ü"
    assert one_line("a\nb\tc\\d'e\x1bf") == "$'a\\nb\\tc\\\\d\\'e\\x1bf'"
    assert command_line(["python3", "a b", "x\ny", ""]) == "python3 'a b' $'x\\ny' ''"


def test_terminal_dry_run_draws_tables() -> None:
    out = io.StringIO()
    render_plan(_long_plan(), Console(file=out, width=250), ["node2"])
    text = out.getvalue()
    assert "┃ rank ┃ host" in text and "│ TNT_SIZE " in text
    assert "Dry run: nothing was started." in text
