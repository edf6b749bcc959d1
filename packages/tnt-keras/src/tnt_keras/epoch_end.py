"""Finishing an epoch's end on the re-formed job, instead of training the epoch again, where a rank is
lost between an epoch's last validation batch and the next epoch's first finished step (an elastic
fit whose steps are redone: ``step_redo.py``).

There every survivor holds the same weights: the epoch is trained and validated. What the ranks do
there together is a handful of small collectives, made in the same order on every rank: the
agreement on a preemption signal, the averaged logs of your callbacks, the outcome of a checkpoint
callback (made again on the ranks left, the callback put back as it was, where no survivor has it:
``callbacks.Callback``), an ``evaluate`` or ``predict`` a callback makes (one entry with all its
collectives: made again on the ranks left where no survivor finished it, ``model.py``), the
admission of replacements at the next epoch's start. Each goes through
``collective`` and its result is written down (the ``Journal``). When one fails, the survivors
re-form the job and compare how far each got (``step_redo.agree``). If every one is at this epoch's
end, or already in the next epoch's first step, the one that got furthest hands its results on (one
broadcast), those behind take them instead of making the collectives whose result is known, and the
job goes on from the collective that failed, on the ranks left: every callback hears the epoch end
once and nothing is trained twice. A survivor anywhere else (in validation, in a train step not
the next epoch's first) sends them all back to the epoch's start, as before (``elastic.py``).

A result taken from another rank was computed with the lost rank's part: for the collectives here
that is what they would have given anyway (the logs are global already; a preemption signal the
lost rank got still stops the job).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import tnt_comm

_FAILURES = (tnt_comm.PeerFailure, tnt_comm.Timeout)  # elastic.FAILURES (elastic.py imports this module)


class Journal:
    """The results of one attempt's collectives at an epoch's end; ``recover(error)`` re-forms the job
    after one failed and returns the rank that holds the most results (``step_redo.StepRedo``), or
    raises ``elastic.Reformed`` where the survivors go back to the epoch's start."""

    def __init__(self, recover: Callable[[BaseException], int]) -> None:
        self.recover = recover
        self.is_open = False  # from an epoch's end to the next finished step
        self.epoch = 0  # the epoch whose end it is
        self.entries: list[Any] = []  # the results so far, in order
        self.known: list[Any] = []  # those of the rank that got furthest, taken where this one is behind
        self.making = False  # inside ``make`` of an entry: its own collectives are part of it

    def open(self, epoch: int) -> None:
        self.is_open, self.epoch, self.entries, self.known, self.making = True, epoch, [], [], False

    def close(self) -> None:
        self.is_open, self.entries, self.known = False, [], []

    def collective(self, make: Callable[[], Any]) -> Any:
        if self.making:  # a collective inside an entry (a callback's predict): the entry's to finish
            return make()
        index = len(self.entries)
        while index >= len(self.known):
            try:
                self.making = True
                try:
                    result = make()
                finally:
                    self.making = False
                break
            except _FAILURES as error:
                self.take_from(self.recover(error))
        else:
            result = self.known[index]  # another survivor finished this one before the failure
        self.entries.append(result)
        return result

    def take_from(self, holder: int) -> None:
        """Every survivor takes ``holder``'s results."""
        self.known = broadcast_object(self.entries, holder)


def broadcast_object(value: Any, root: int) -> Any:
    """``root``'s ``value`` on every rank, pickled (collective: one broadcast of its length, one of it)."""
    mine = np.frombuffer(pickle.dumps(value), np.uint8) if tnt_comm.rank() == root else None
    length = tnt_comm.broadcast(np.array([0 if mine is None else len(mine)], np.int64), root=root)
    buffer = mine.copy() if mine is not None else np.zeros(int(length[0]), np.uint8)
    tnt_comm.broadcast(buffer, root=root)
    return pickle.loads(buffer.tobytes())  # noqa: S301 (from this job's own ranks)


active: Journal | None = None
"""The journal of the elastic fit that runs (None: none, or one whose steps are not redone)."""


def begin(epoch: int) -> None:
    """At ``epoch``'s end, before any collective of it (``preemption.Agreement``, first of the callbacks)."""
    if active is not None:
        active.open(epoch)


def end() -> None:
    """Where the epoch's end is over without a step after it (the training ends)."""
    if active is not None:
        active.close()


def journaling() -> bool:
    """Whether the collectives made now are written down (an elastic fit's epoch end): a rank must
    make each, even where it is the last one left, so that the results taken stay in order. Not
    inside an entry being made: its collectives are part of that entry."""
    return active is not None and active.is_open and not active.making


def collective(make: Callable[[], Any]) -> Any:
    """``make()``, a collective every rank makes at this point; at an epoch's end of an elastic fit,
    finished on the ranks left where a rank is lost in it (above)."""
    if active is None or not active.is_open:
        return make()
    return active.collective(make)
