"""The job's trace, in Chrome's trace-event JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing
open: one process per rank with every collective from submission to completion, its bytes and
algorithm, in two phases (queued behind earlier operations, then running, inside which an
algorithm's parts follow one another), the waits in which a caller was blocked on one, and the spans
a library above adds on a track of its own (tnt-keras: steps, epochs, saving).

Recording starts at ``import tnt_comm`` where TNT_TIMELINE names a file (``tnt-launch --timeline
FILE``), or at ``timeline_start(path)``. ``write`` is collective: every rank's events go to rank 0,
moved onto rank 0's clock (each rank measures its offset by round trips, the shortest of several
counts, so ranks on other hosts line up), and rank 0 writes the file with everything recorded since
the start. tnt-keras writes at the end of every ``fit``, after saves and at ``tnt.timeline.stop()``;
a script of tnt-comm alone calls ``tnt_comm.timeline_write()``. Nothing is written at exit (that would
be a collective no rank asked for), but rank 0 says so where a trace was asked for and none written.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import _core, contract

VARIABLE = contract.TIMELINE  # tnt-launch --timeline FILE: the trace's path, absolute
_ROUND_TRIPS = 8
_SPANS_TID, _WAIT_TID, _COMM_TID = 1, 2, 3
# "algorithm": how an allreduce ran ("direct", "host-aware", ...; "" where there is no choice);
# "phases": its parts that run one after another, as (name, begin_ns), each ending where the next
# begins and the last at "ended_ns" (empty where the algorithm runs as one piece).
FIELDS = (
    "name", "group", "call", "bytes", "submitted_ns", "started_ns", "ended_ns", "blocking", "failed", "algorithm",
    "phases",
)

Span = tuple[str, int, int, dict[str, Any]]
"""(name, begin_ns, end_ns, args) on the steady clock, as time.monotonic_ns()."""

_state: dict[str, Any] = {"path": None, "comm": [], "written": None}


def events() -> list[dict[str, Any]]:
    """The events recorded since the last call (oldest first), as dicts of ``FIELDS``."""
    return [dict(zip(FIELDS, event, strict=True)) for event in _core.timeline_take()]


def start(path: str | os.PathLike[str] | None = None) -> None:
    """Record from now on; ``path``, where given, is where ``write`` puts the trace."""
    if path is not None:
        _state["path"] = os.path.abspath(os.fspath(path))
    _state["comm"] = []
    _core.timeline_set(True)


def stop() -> list[dict[str, Any]]:
    """Stop recording; the events not taken yet. The path is forgotten."""
    _core.timeline_set(False)
    _state["path"] = None
    return events()


def path() -> str | None:
    """Where the trace goes: TNT_TIMELINE, or the path given to ``start``; None while off."""
    return _state["path"]


def start_from_environment() -> None:
    """TNT_TIMELINE=FILE: record from the start of the process."""
    named = os.environ.get(VARIABLE, "").strip()
    if named:
        start(named)


def _clock_offset(rank: int, size: int) -> int:
    """Nanoseconds to add to this rank's clock to read rank 0's (collective)."""
    from . import recv, send  # the package's collectives; imported here, as the package imports us

    if size == 1:
        return 0
    stamp = np.zeros(1, np.int64)
    best: tuple[int | None, int] = (None, 0)
    for peer in range(1, size):
        for _ in range(_ROUND_TRIPS):
            if rank == 0:
                recv(stamp, peer)
                stamp[0] = _core.timeline_now_ns()
                send(stamp, peer)
            elif rank == peer:
                sent = _core.timeline_now_ns()
                stamp[0] = sent
                send(stamp, 0)
                recv(stamp, 0)
                back = _core.timeline_now_ns()
                # Rank 0 read its clock about halfway through the round trip: the shortest trip says it best.
                if best[0] is None or back - sent < best[0]:
                    best = (back - sent, int(stamp[0]) - (sent + back) // 2)
    return best[1]


def _rank_events(rank: int, offset: int, spans: Sequence[Span], track: str) -> list[dict[str, Any]]:
    """This rank's events in the trace's form, on rank 0's clock, in microseconds."""

    def us(ns: int) -> float:
        return (ns + offset) / 1000.0

    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": _SPANS_TID, "args": {"name": track}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": _WAIT_TID, "args": {"name": "blocked waiting"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": _COMM_TID, "args": {"name": "collectives"}},
    ]
    for name, begin, end, args in spans:
        out.append({"ph": "X", "cat": track, "name": name, "pid": rank, "tid": _SPANS_TID,
                    "ts": us(begin), "dur": (end - begin) / 1000.0, "args": args})
    for i, e in enumerate(_state["comm"]):
        if e["name"] == "wait":
            out.append({"ph": "X", "cat": "wait", "name": "wait", "pid": rank, "tid": _WAIT_TID,
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
        out += [
            {**common, "ph": "b", "name": e["name"], "ts": us(e["submitted_ns"]), "args": args},
            {**common, "ph": "b", "name": "queued", "ts": us(e["submitted_ns"])},
            {**common, "ph": "e", "name": "queued", "ts": us(e["started_ns"])},
            {**common, "ph": "b", "name": "running", "ts": us(e["started_ns"])},
            *_phases(common, e, us),
            {**common, "ph": "e", "name": "running", "ts": us(e["ended_ns"])},
            {**common, "ph": "e", "name": e["name"], "ts": us(e["ended_ns"])},
        ]
    return out


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


def write(rank: int, size: int, spans: Sequence[Span] = (), track: str = "spans") -> None:
    """Collective: every rank's events since the start, and its ``spans`` on the track named
    ``track``, go to rank 0, which writes the trace to ``path()``. Raises OSError on rank 0 where the
    file cannot be written (every other rank returns); does nothing while the timeline is off."""
    from . import allgather, allgatherv

    if path() is None:
        return
    _state["comm"].extend(events())
    offset = _clock_offset(rank, size)
    mine = json.dumps(_rank_events(rank, offset, spans, track)).encode()
    payload = np.frombuffer(mine, np.uint8)
    if size > 1:
        lengths = allgather(np.array([payload.size], np.int64))
        payload = allgatherv(payload)
    else:
        lengths = np.array([payload.size], np.int64)
    events()  # what the clock check and the gathering recorded: not the job's own
    if rank != 0:
        return
    gathered: list[dict[str, Any]] = []
    at = 0
    for length in lengths.reshape(-1).tolist():
        gathered.extend(json.loads(payload[at : at + length].tobytes()))
        at += length
    target = path()
    assert target is not None
    temporary = f"{target}.tmp{os.getpid()}"
    try:
        with open(temporary, "w") as f:
            json.dump({"traceEvents": gathered, "displayTimeUnit": "ms", "otherData": {"ranks": size}}, f)
        os.replace(temporary, target)
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    _state["written"] = target


def say_if_unwritten(rank: Callable[[], int]) -> None:
    """At exit: where a trace was asked for (TNT_TIMELINE) and none was written, rank 0 says so and
    how to write one; not after an uncaught exception, whose traceback says enough."""
    named = os.environ.get(VARIABLE, "").strip()
    if not named or _state["written"] is not None or getattr(sys, "last_value", None) is not None:
        return
    try:
        if rank() != 0:
            return
    except Exception:  # noqa: BLE001 - a runtime that cannot start at exit: say nothing
        return
    print(
        f"tnt_comm: warning: no timeline was written to {named} (--timeline): the trace is written by "
        "tnt-keras at the end of fit, after a save and at tnt.timeline.stop(), and by a call of "
        "tnt_comm.timeline_write() on every rank in a script of tnt-comm alone",
        file=sys.stderr,
    )
