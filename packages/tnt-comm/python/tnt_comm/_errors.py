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

from . import _core, contract

# The classes by the kind codes of c_api.h (enum tnt_comm_error_kind), and back.
_BY_CODE: dict[int, type[Exception]] = {
    1: _core.TntError,
    2: _core.CollectiveMismatch,
    3: _core.PeerFailure,
    4: _core.Timeout,
    5: _core.InvalidArgument,
}
_BY_NAME = {cls.__name__: cls for cls in _BY_CODE.values()}
FIELDS = ("ranks", "operation", "group", "call", "mine", "theirs", "peer_error")


def error_data(error: BaseException) -> dict[str, Any]:
    """The data of a tnt-comm error: ``{"kind": "PeerFailure", "message": ..., "ranks": [2],
    "operation": "allreduce", "group": ..., "call": 4, "mine": None, "theirs": None, "peer_error":
    "ValueError: ..."}``. Of any other exception: its class's name and message, and the same fields
    where it has them (an error that reports other ranks' failures names them in ``ranks``)."""
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
    for name in ("operation", "mine", "theirs", "peer_error"):
        setattr(error, name, data.get(name) or None)
    for name in ("group", "call"):
        value = data.get(name)
        setattr(error, name, None if value is None or value == -1 or (name == "group" and value == 0) else int(value))
    if cls is _core.PeerFailure:
        error.rank = error.ranks[0] if error.ranks else None
    return error


REPORT_FD = contract.REPORT_FD
"""The environment variable through which a launcher (tnt-launch's agent) hands a rank the file
descriptor where the rank reports the exception it ends with, as data: one JSON line
``{"event": "error", "error": error_data(e)}``. The launcher blames ranks from these reports."""
_MAX_REPORTED = 4000  # characters of an exception's message in a report (a line of the agent's pipe)
_MAX_TOLD = 500  # characters of the error a leaving rank tells its peers


def told_error(error: BaseException) -> str:
    """What a rank that leaves because of ``error`` tells its peers: the class and the first line of
    the message ("ValueError: no such file"), short; the traceback stays in the rank's own output."""
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else ""
    if len(text) > _MAX_TOLD or len(lines) > 1:
        text = text[:_MAX_TOLD] + " ..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def install_exit_hook() -> None:
    """What this process does with an uncaught exception it is about to end with, before and after
    Python prints it (the previous hook still prints it, as before):

    1. Under a launcher that asks for it (``TNT_REPORT_FD``), it reports the exception as data first,
       so the launcher knows this rank's own failure before the failures of its peers that follow,
       and says once the traceback is printed, so that a launcher stopping the job keeps its lines.
    2. Once it is printed, the peers are told (``_core.abandon``): their calls fail at once with a
       ``PeerFailure`` that names this rank and quotes its error, instead of waiting for it or taking
       its exit for a goodbye. Nothing is told where the runtime does not run or has failed already
       (a ``PeerFailure`` of its own: the peers know).

    The variable is taken out of the environment, and only this process reports and tells: a child
    (forked, or started with the environment) must not write to a descriptor that is not its rank's
    pipe, nor speak for the rank.
    """
    fd = os.environ.pop(REPORT_FD, "")  # taken: a second call finds nothing to report to
    report_fd = int(fd) if fd.isdigit() else None
    try:
        if report_fd is not None and not stat.S_ISFIFO(os.fstat(report_fd).st_mode):
            report_fd = None
    except OSError:
        report_fd = None
    owner, previous = os.getpid(), sys.excepthook

    def on_uncaught(kind: type[BaseException], value: BaseException, traceback: TracebackType | None) -> None:
        mine = os.getpid() == owner
        if mine and report_fd is not None:
            try:
                data = error_data(value)
                data["message"] = data["message"][:_MAX_REPORTED]
                os.write(report_fd, (json.dumps({"event": "error", "error": data}, default=str) + "\n").encode())
            except (OSError, ValueError, TypeError):
                pass  # the launcher is gone: the traceback still follows
        previous(kind, value, traceback)
        if mine and report_fd is not None:
            # The traceback is out: the launcher may stop this rank now without losing its last lines.
            try:
                sys.stderr.flush()
                os.write(report_fd, b'{"event": "printed"}\n')
            except (OSError, ValueError):
                pass
        if mine:
            _core.abandon(told_error(value))

    sys.excepthook = on_uncaught
