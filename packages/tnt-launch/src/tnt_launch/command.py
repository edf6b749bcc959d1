"""What the words after `--` are: a Python script, a Python command line, or a program.

Without `--python-interpreter`, tnt-launch decides from the command how to run it:

- `train.py ...` (a name ending in `.py`): a Python script, run under the default interpreter;
- `python3 train.py ...` (the first word is a Python interpreter): run as given;
- `./my_collective ...` (an executable file that is not a Python script) or `hostname` (a
  command found on PATH): run as given;
- any other file (a Python script without `.py`, or a file that cannot be executed): a Python
  script, as before.

The decision looks at this host's file system, relative to the job's working directory, and so
does `check_script`, which refuses a script or program that is not there before anything starts.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tnt_launch.config import LaunchConfig, UsageError
from tnt_launch.hosts import Host

SCRIPT = "script"
"""The command is SCRIPT [ARGS]: run it under the Python interpreter."""
PYTHON = "python"
"""The command starts with a Python interpreter: run it as given."""
EXECUTABLE = "executable"
"""The command is a program (a compiled executable, a shell script, a command on PATH)."""

_PYTHON_NAME = re.compile(r"(python|pypy)(\d+(\.\d+)*)?[a-z]?(-dbg)?")
# Options of the Python interpreter that take a value (`-W error`, `-X dev`).
_OPTIONS_WITH_VALUE = "WX"

Which = Callable[[str], "str | None"]


@dataclass(frozen=True)
class Decision:
    kind: str
    """SCRIPT, PYTHON or EXECUTABLE."""
    program: str
    """The first word of the command as it will run (a bare name of a program in the working
    directory becomes ./NAME, so that it is not looked for on PATH instead)."""


def looks_like_python(word: str, which: Which = shutil.which) -> bool:
    """Whether `word` names a Python interpreter: its file name is python, python3, python3.12,
    pypy3 ..., or it is found (on PATH, or as a path) and resolves to such a file."""
    if _PYTHON_NAME.fullmatch(os.path.basename(word)):
        return True
    found = which(word)
    return found is not None and bool(
        _PYTHON_NAME.fullmatch(os.path.basename(os.path.realpath(found)))
    )


def has_python_shebang(path: str) -> bool:
    """Whether the file's first line is `#!` naming a Python interpreter."""
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    if not first.startswith(b"#!"):
        return False
    words = first[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    return bool(words) and bool(_PYTHON_NAME.fullmatch(os.path.basename(words[0])))


def classify(
    command: Sequence[str], cwd: str, path: str | None = None, which: Which | None = None
) -> Decision:
    """How to run `command` (the words after `--`) when no --python-interpreter is given.

    `path` is the PATH to search (default: this process's); `which` replaces shutil.which.
    """
    if which is None:
        def which(name: str) -> str | None:
            return shutil.which(name, path=path)
    word = command[0]
    if word.endswith(".py"):
        return Decision(SCRIPT, word)
    if looks_like_python(word, which):
        return Decision(PYTHON, word)
    file = os.path.join(cwd, word)
    if os.path.isfile(file):
        if has_python_shebang(file) or not os.access(file, os.X_OK):
            return Decision(SCRIPT, word)
        return Decision(EXECUTABLE, word if "/" in word else f"./{word}")
    if "/" not in word and which(word) is not None:
        return Decision(EXECUTABLE, word)
    # Nothing here by that name: a script, as tnt-launch always took it (reported as missing
    # when the job has ranks on this host, else looked for on the other hosts).
    return Decision(SCRIPT, word)


def python_target(args: Sequence[str]) -> tuple[str, bool] | None:
    """What a Python command line (`python3 [OPTIONS] ...` without the interpreter) runs:
    (script, True) for a script file, (module, False) for `-m module`, None for `-c`, `-` or
    nothing. Short options may be grouped (`-um module`)."""
    words = iter(args)
    for word in words:
        if word == "--":
            script = next(words, None)
            return (script, True) if script else None
        if word == "-":
            return None
        if not word.startswith("-"):
            return word, True
        if word.startswith("--"):
            continue
        for at, letter in enumerate(word[1:], start=2):
            if letter == "c":
                return None
            if letter == "m":
                module = word[at:] or next(words, None)
                return (module, False) if module else None
            if letter in _OPTIONS_WITH_VALUE:
                if not word[at:]:
                    next(words, None)
                break
    return None


def check_script(config: LaunchConfig, hosts: Sequence[Host]) -> None:
    """Fail early on a script or program that is not there, where that can be seen from here."""
    script = config.script
    assert script is not None
    if script.startswith("-") or not any(h.local for h in hosts):
        return
    path = os.path.join(config.cwd, script)
    if config.command_kind == SCRIPT:
        if not os.path.isfile(path):
            raise UsageError(f"script {script} not found in {config.cwd}")
        return
    if "/" in script:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise UsageError(f"{script} is not an executable file")
    elif shutil.which(script, path=dict(config.exports).get("PATH")) is None:
        hint = f" (./{script} runs the one in this folder)" if os.path.isfile(path) else ""
        raise UsageError(f"{script}: command not found on PATH{hint}")
    if config.command_kind == PYTHON:
        target = python_target(config.script_args)
        if target is not None and target[1] and not os.path.isfile(
            os.path.join(config.cwd, target[0])
        ):
            raise UsageError(f"script {target[0]} not found in {config.cwd}")
