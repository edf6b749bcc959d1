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
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tnt_comm
from tnt_launch import contract

VARIABLE = contract.TIMELINE
_ROUND_TRIPS = 8
_KERAS_TID, _WAIT_TID, _COMM_TID = 1, 2, 3

_state: dict[str, Any] = {"path": None, "spans": [], "comm": [], "fitting": False}


def active() -> bool:
    return _state["path"] is not None


def start(path: str | os.PathLike[str]) -> None:
    """Record from now on; rank 0 writes ``path`` (call it on every rank)."""
    _state["path"] = os.path.abspath(os.fspath(path))
    _state["spans"] = []
    _state["comm"] = []
    tnt_comm.timeline_start()


def stop() -> None:
    """Write the trace (collective: call it on every rank) and stop recording."""
    if not active():
        return
    write()
    tnt_comm.timeline_stop()
    _state["path"] = None


def start_from_environment() -> None:
    """TNT_TIMELINE=FILE: record from the start of the process."""
    path = os.environ.get(VARIABLE, "").strip()
    if path:
        start(path)


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


def _clock_offset() -> int:
    """Nanoseconds to add to this rank's clock to read rank 0's (collective)."""
    rank, size = tnt_comm.rank(), tnt_comm.size()
    if size == 1:
        return 0
    stamp = np.zeros(1, np.int64)
    best = (None, 0)
    for peer in range(1, size):
        for _ in range(_ROUND_TRIPS):
            if rank == 0:
                tnt_comm.recv(stamp, peer)
                stamp[0] = tnt_comm.timeline_now_ns()
                tnt_comm.send(stamp, peer)
            elif rank == peer:
                sent = tnt_comm.timeline_now_ns()
                stamp[0] = sent
                tnt_comm.send(stamp, 0)
                tnt_comm.recv(stamp, 0)
                back = tnt_comm.timeline_now_ns()
                # Rank 0 read its clock about halfway through the round trip: the shortest trip says it best.
                if best[0] is None or back - sent < best[0]:
                    best = (back - sent, int(stamp[0]) - (sent + back) // 2)
    return best[1]


def _events(rank: int, offset: int) -> list[dict[str, Any]]:
    """This rank's events in the trace's form, on rank 0's clock, in microseconds."""

    def us(ns: int) -> float:
        return (ns + offset) / 1000.0

    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": _KERAS_TID, "args": {"name": "tnt-keras"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": _WAIT_TID, "args": {"name": "blocked waiting"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": _COMM_TID, "args": {"name": "collectives"}},
    ]
    for name, begin, end, args in _state["spans"]:
        events.append({"ph": "X", "cat": "tnt-keras", "name": name, "pid": rank, "tid": _KERAS_TID,
                       "ts": us(begin), "dur": (end - begin) / 1000.0, "args": args})
    for i, e in enumerate(_state["comm"]):
        if e["name"] == "wait":
            events.append({"ph": "X", "cat": "wait", "name": "wait", "pid": rank, "tid": _WAIT_TID,
                           "ts": us(e["submitted_ns"]), "dur": (e["ended_ns"] - e["submitted_ns"]) / 1000.0,
                           "args": {"group": f"{e['group']:#x}", "call": e["call"]}})
            continue
        # id2.local: the id is the rank's own, so viewers keep the span on the rank's process (a plain
        # "id" is global: Perfetto puts such spans on tracks of no process).
        common = {"cat": "tnt-comm", "pid": rank, "tid": _COMM_TID, "id2": {"local": str(i)}}
        args = {"bytes": e["bytes"], "group": f"{e['group']:#x}", "call": e["call"],
                "blocking": e["blocking"], "failed": e["failed"]}
        if e.get("algorithm"):
            args["algorithm"] = e["algorithm"]
        events += [
            {**common, "ph": "b", "name": e["name"], "ts": us(e["submitted_ns"]), "args": args},
            {**common, "ph": "b", "name": "queued", "ts": us(e["submitted_ns"])},
            {**common, "ph": "e", "name": "queued", "ts": us(e["started_ns"])},
            {**common, "ph": "b", "name": "running", "ts": us(e["started_ns"])},
            *_phases(common, e, us),
            {**common, "ph": "e", "name": "running", "ts": us(e["ended_ns"])},
            {**common, "ph": "e", "name": e["name"], "ts": us(e["ended_ns"])},
        ]
    return events


def _phases(common: dict[str, Any], e: dict[str, Any], us: Callable[[int], float]) -> list[dict[str, Any]]:
    """The algorithm's phases, one after another inside "running": each ends where the next begins."""
    marks = e.get("phases", [])
    if not marks:
        return []
    ends = [begin for _, begin in marks[1:]] + [e["ended_ns"]]
    out: list[dict[str, Any]] = []
    for (name, begin), end in zip(marks, ends, strict=True):
        begin = min(max(begin, e["started_ns"]), end)
        out.append({**common, "ph": "b", "name": name, "ts": us(begin)})
        out.append({**common, "ph": "e", "name": name, "ts": us(end)})
    return out


def write() -> None:
    """Collective: every rank's events since the start go to rank 0, which writes the trace."""
    if not active():
        return
    _state["comm"].extend(tnt_comm.timeline_events())
    rank, size = tnt_comm.rank(), tnt_comm.size()
    offset = _clock_offset()
    mine = json.dumps(_events(rank, offset)).encode()
    payload = np.frombuffer(mine, np.uint8)
    if size > 1:
        lengths = tnt_comm.allgather(np.array([payload.size], np.int64))
        payload = tnt_comm.allgatherv(payload)
    else:
        lengths = np.array([payload.size], np.int64)
    tnt_comm.timeline_events()  # what the clock check and the gathering recorded: not the job's own
    if rank != 0:
        return
    events: list[dict[str, Any]] = []
    at = 0
    for length in lengths.reshape(-1).tolist():
        events.extend(json.loads(payload[at : at + length].tobytes()))
        at += length
    path = _state["path"]
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"ranks": size}}, f)
    os.replace(temporary, path)
