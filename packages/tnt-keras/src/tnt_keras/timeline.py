"""A trace of the whole job, in Chrome's trace-event JSON, which Perfetto (ui.perfetto.dev) and
chrome://tracing open: one process per rank with its training steps, epochs, the broadcast at the
start of ``fit`` and saving (from tnt-keras, on every backend), and every collective from submission
to completion with its bytes and algorithm, in two phases (queued behind earlier operations, then
running, inside which an algorithm's parts follow one another), and the waits in which a caller was
blocked on one (from tnt-comm's timeline).

It records from ``import tnt_keras`` on where TNT_TIMELINE names a file (``tnt-launch --timeline
FILE`` sets it for every rank), or between ``tnt.timeline.start(FILE)`` and ``tnt.timeline.stop()``,
both called on every rank. Rank 0 writes the file at the end of every ``fit``, after every save
outside ``fit``, and at ``stop()``, each time with everything recorded since the start; every
rank's times are moved onto rank 0's clock, whose offset each rank measures against rank 0 by round
trips (the shortest of several counts), so ranks on other hosts line up too. Off, nothing is
recorded and no callback is added.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import keras
import tnt_comm
from tnt_comm import _trace

from .runtime import logger

TRACK = "tnt-keras"
_state: dict[str, Any] = {"spans": [], "fitting": False}


def active() -> bool:
    return _trace.path() is not None


def start(path: str | os.PathLike[str]) -> None:
    """Record from now on; rank 0 writes ``path`` (call it on every rank)."""
    _state["spans"] = []
    tnt_comm.timeline_start(path)


def stop() -> None:
    """Write the trace (collective: call it on every rank) and stop recording."""
    if not active():
        return
    write()
    tnt_comm.timeline_stop()


@contextlib.contextmanager
def span(name: str, **args: Any) -> Iterator[None]:
    """Records what runs inside as one event of tnt-keras' track, where the timeline is on."""
    if not active():
        yield
        return
    begin = time.monotonic_ns()
    try:
        yield
    finally:
        _state["spans"].append((name, begin, time.monotonic_ns(), args))


class Steps(keras.callbacks.Callback):
    """Added last to ``fit``'s callbacks while the timeline is on: every step and epoch, and the trace
    written at the end of ``fit``."""

    def __init__(self) -> None:
        super().__init__()
        self._step: tuple[int, int] | None = None
        self._epoch: tuple[int, int] | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        _state["fitting"] = True

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = (epoch, time.monotonic_ns())

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._epoch is not None:
            _state["spans"].append(("epoch", self._epoch[1], time.monotonic_ns(), {"epoch": epoch}))

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._step = (batch, time.monotonic_ns())

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._step is not None:
            epoch = self._epoch[0] if self._epoch is not None else None
            _state["spans"].append(("step", self._step[1], time.monotonic_ns(), {"epoch": epoch, "batch": batch}))

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        _state["fitting"] = False
        write()


def saved() -> None:
    """After a save that every rank made together: outside ``fit`` (a save after the last one), the
    trace is written again, so that it holds the save without ``stop()``. Inside ``fit`` (a
    checkpoint callback) the end of ``fit`` writes it."""
    if active() and not _state["fitting"]:
        write()


def callbacks() -> list[keras.callbacks.Callback]:
    """What ``fit`` adds for the timeline: the step recorder where it is on, else nothing."""
    return [Steps()] if active() else []


def write() -> None:
    """Collective: every rank's steps, epochs and collectives since the start go to rank 0, which
    writes the trace; where it cannot, rank 0 warns and the job goes on."""
    if not active():
        return
    try:
        _trace.write(tnt_comm.rank(), tnt_comm.size(), _state["spans"], TRACK)
    except OSError as e:
        logger.warning("could not write the timeline to %s (%s); training goes on without it", _trace.path(), e)
