"""Rank-local actions whose outcome every rank shares: a write on rank 0 that fails raises on all ranks.

Rank 0 writes files (``save``, checkpoints) while the other ranks wait for nothing, so a failed write
used to stop rank 0 alone while the others trained on into collectives rank 0 never joined. Here every
rank learns every rank's outcome before any rank goes on.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tnt_comm

from . import runtime, timeline

# While a callback runs on some ranks only (ModelCheckpoint runs on the master rank), the saving methods
# it calls must not start collectives that the other ranks never join: they just write where this rank
# writes, and the callback's wrapper tells every rank the outcome instead (callbacks.py).
_alone = threading.local()


@contextlib.contextmanager
def writes_alone() -> Iterator[None]:
    """Within it, this thread's ``save``, ``save_weights`` and ``export`` use no collective."""
    previous = getattr(_alone, "active", False)
    _alone.active = True
    try:
        yield
    finally:
        _alone.active = previous


def is_alone() -> bool:
    return runtime.get_size() == 1 or getattr(_alone, "active", False)


# A failing rank's error text is cut to this many characters before it is sent to the other ranks.
_MAX_REPORTED = 4000


def _tf_errors() -> Any:
    """TensorFlow's ``tf.errors`` where this process has imported TensorFlow, else None: on other
    backends no error can be one of its classes, and importing it would cost seconds."""
    tf = sys.modules.get("tensorflow")
    return getattr(tf, "errors", None)


def _portable_classes(error: BaseException) -> list[str]:
    """The classes of ``error``, nearest first, that another rank can rebuild from a message alone:
    Python's built-in exceptions and TensorFlow's ``tf.errors`` (not ``Exception`` itself)."""
    names = []
    errors = _tf_errors()
    for cls in type(error).__mro__:
        if cls in (Exception, BaseException, object):
            break
        if cls.__module__ == "builtins":
            names.append(cls.__name__)
        elif (
            errors is not None
            and issubclass(cls, errors.OpError)
            and cls is not errors.OpError
            and getattr(errors, cls.__name__, None) is cls
        ):
            names.append(f"tf.errors.{cls.__name__}")
    return names


def _failure_sentence(rank: int, report: dict[str, Any]) -> str:
    text = f"{report['type']}: {report['message']}" if report["message"] else report["type"]
    return f"tnt: rank {rank} failed to {report['doing']}: {text}"


def _rebuild(reports: dict[int, dict[str, Any]]) -> Exception:
    """The error a rank that did not fail raises: of the first failing rank's class where it can be
    rebuilt (see ``_portable_classes``; ``OSError`` keeps its ``errno``), else ``RuntimeError``, with
    one line per failing rank that names it and quotes its error."""
    first = reports[min(reports)]
    message = "\n".join(_failure_sentence(rank, report) for rank, report in sorted(reports.items()))
    for name in first["classes"]:
        try:
            if name.startswith("tf.errors."):
                # A TensorFlow error of a rank of a TensorFlow job: this rank has TensorFlow too.
                errors = _tf_errors()
                cls = getattr(errors, name.removeprefix("tf.errors."), None) if errors is not None else None
                if isinstance(cls, type) and issubclass(cls, errors.OpError):
                    return cls(None, None, message)
            else:
                cls = getattr(builtins, name, None)
                if isinstance(cls, type) and issubclass(cls, Exception):
                    rebuilt = cls(message)
                    if isinstance(rebuilt, OSError):
                        rebuilt.errno = first["errno"]  # not strerror or filename: str() would drop the message
                    return rebuilt
        except TypeError:  # a class that takes more than a message (UnicodeDecodeError): try its base
            continue
    return RuntimeError(message)


def agree_on_outcome(error: Exception | None, doing: str) -> None:
    """Collective: every rank learns which ranks failed to ``doing`` (``error`` is this rank's
    failure, or None), and if any did, every rank raises, so that no rank moves on.

    A rank that failed raises its own error, unchanged; where Python has exception notes, each other
    failing rank's error is added as a note. Every other rank raises an error that names each failing
    rank and quotes its error (see ``_rebuild``), and lists them in its ``ranks``. On one rank,
    raises ``error`` if there is one. Costs one small allgather when no rank failed.
    """
    if runtime.get_size() == 1:
        if error is not None:
            raise error
        return
    rank = runtime.get_rank()
    mine = b""
    if error is not None:
        report = {
            "doing": doing,
            "type": type(error).__name__,
            "message": str(error)[:_MAX_REPORTED],
            "classes": _portable_classes(error),
            "errno": error.errno if isinstance(error, OSError) else None,
        }
        mine = json.dumps(report).encode()
    lengths = tnt_comm.allgather(np.array([len(mine)], dtype=np.int64)).ravel()
    reports: dict[int, dict[str, Any]] = {}
    for failed in (int(r) for r in np.flatnonzero(lengths)):
        if failed == rank:
            buffer = np.frombuffer(mine, dtype=np.uint8).copy()
        else:
            buffer = np.empty(int(lengths[failed]), dtype=np.uint8)
        tnt_comm.broadcast(buffer, root=failed)
        reports[failed] = json.loads(buffer.tobytes().decode())
    if error is not None:
        if hasattr(error, "add_note"):  # Python 3.11+
            for other, report in sorted(reports.items()):
                if other != rank:
                    error.add_note(_failure_sentence(other, report))
        raise error
    if reports:
        rebuilt = _rebuild(reports)
        # As data, as tnt-comm's errors name them: the ranks whose failure this error reports (so
        # tnt-launch blames them, not this rank, which only learnt of it).
        rebuilt.ranks = sorted(reports)  # type: ignore[attr-defined]
        raise rebuilt from None


def write_and_agree(doing: str, writes: bool, write: Callable[[], Any]) -> Any:
    """Runs ``write`` if this rank ``writes``, then every rank learns every rank's outcome
    (``agree_on_outcome``): every rank returns, once every write is done, or every rank raises.

    Collective, unless inside ``writes_alone``, where a rank that writes raises its own error and
    the others return at once. Returns what ``write`` returned, or None where this rank did not write.
    """
    with timeline.span("save", doing=doing):
        if is_alone():
            return write() if writes else None
        result, error = None, None
        if writes:
            try:
                result = write()
            except Exception as e:  # shared with every rank, then raised here unchanged
                error = e
        agree_on_outcome(error, doing)
    timeline.saved()  # every rank is here, together: the trace may be written (collective)
    return result
