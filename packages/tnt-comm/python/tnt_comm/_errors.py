"""tnt-comm's errors as data: what an error is about (the ranks to blame, the call that stopped), in
a plain dict that crosses process and library boundaries (the C ABI's tnt_comm_error, a TensorFlow
op's Status payload, tnt-launch's reports) and becomes the same exception again on the other side."""

from __future__ import annotations

import json
import os
import stat
import sys
from types import TracebackType
from typing import Any

from . import _core

# The classes by the kind codes of c_api.h (enum tnt_comm_error_kind), and back.
_BY_CODE: dict[int, type[Exception]] = {
    1: _core.TntError,
    2: _core.CollectiveMismatch,
    3: _core.PeerFailure,
    4: _core.Timeout,
    5: _core.InvalidArgument,
}
_BY_NAME = {cls.__name__: cls for cls in _BY_CODE.values()}
FIELDS = ("ranks", "operation", "group", "call", "mine", "theirs")


def error_data(error: BaseException) -> dict[str, Any]:
    """The data of a tnt-comm error: ``{"kind": "PeerFailure", "message": ..., "ranks": [2],
    "operation": "allreduce", "group": ..., "call": 4, "mine": None, "theirs": None}``."""
    data: dict[str, Any] = {"kind": type(error).__name__, "message": str(error)}
    for name in FIELDS:
        value = getattr(error, name, None)
        data[name] = list(value or ()) if name == "ranks" else value
    return data


def error_from_data(data: dict[str, Any], message: str | None = None) -> Exception:
    """The exception tnt-comm's Python API raises for ``data`` (from ``error_data``, or the C ABI's
    fields, where ``kind`` is a code and empty strings or -1 stand for none), with ``message`` in
    place of the data's own if given. Unknown kinds give a plain ``TntError``."""
    kind = data.get("kind")
    cls = _BY_CODE.get(kind, _core.TntError) if isinstance(kind, int) else _BY_NAME.get(str(kind), _core.TntError)
    error = cls(message if message is not None else data.get("message", ""))
    error.ranks = [int(r) for r in data.get("ranks") or ()]
    for name in ("operation", "mine", "theirs"):
        setattr(error, name, data.get(name) or None)
    for name in ("group", "call"):
        value = data.get(name)
        setattr(error, name, None if value is None or value == -1 or (name == "group" and value == 0) else int(value))
    if cls is _core.PeerFailure:
        error.rank = error.ranks[0] if error.ranks else None
    return error


REPORT_FD = "TNT_REPORT_FD"
"""The environment variable through which a launcher (tnt-launch's agent) hands a rank the file
descriptor where the rank reports the exception it ends with, as data: one JSON line
``{"event": "error", "error": error_data(e)}``. The launcher blames ranks from these reports."""


def install_report_hook() -> None:
    """Under a launcher that asks for it (``TNT_REPORT_FD``), report an uncaught exception before
    Python prints it; the previous hook then prints it as before.

    The variable is taken out of the environment, and only this process reports: a child (forked,
    or started with the environment) must not write to a descriptor that is not its rank's pipe.
    """
    fd = os.environ.pop(REPORT_FD, "")  # taken: a second call finds nothing to install
    if not fd.isdigit():
        return
    try:
        if not stat.S_ISFIFO(os.fstat(int(fd)).st_mode):
            return
    except OSError:
        return
    owner, previous = os.getpid(), sys.excepthook

    def report(kind: type[BaseException], value: BaseException, traceback: TracebackType | None) -> None:
        if os.getpid() == owner:
            try:
                line = json.dumps({"event": "error", "error": error_data(value)}, default=str) + "\n"
                os.write(int(fd), line.encode())
            except (OSError, ValueError, TypeError):
                pass  # the launcher is gone: the traceback still follows
        previous(kind, value, traceback)

    sys.excepthook = report
