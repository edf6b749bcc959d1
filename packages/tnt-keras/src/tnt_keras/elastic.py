"""Elastic training (``tnt-launch --elastic MIN``): a ``fit`` that loses ranks goes on with the
survivors, and still equals serial training.

Every epoch begins with a copy of the model's and optimizers' variables in host memory
(``EpochStart``): the one cost of elasticity while nothing fails. When a collective of the step
raises ``PeerFailure`` or ``Timeout``, the survivors re-form the job (``tnt_comm.shrink``), agree on
the earliest epoch any of them was in, put back the variables they had when it began, deal every
global batch over the ranks that are left, and run that epoch again, to the end of the fit. Its
metrics start from zero, as at any epoch's start; the epochs before it stay in ``History`` once; the
callbacks see the epoch begin a second time, but not the training begin (an ``EarlyStopping`` keeps
its count). Up to one epoch of work is lost. Where the backend holds each step's update back to the
step's end (torch), a rank lost inside a train step costs only that step (``step_redo.py``); this
module is what every other loss falls back to.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tnt_comm
from tnt_comm import contract

from . import call_boundary, epoch_end, short_epochs, state, timeline
from . import variables as shared_variables
from .runtime import logger

FAILURES = (tnt_comm.PeerFailure, tnt_comm.Timeout)
_NOBODY = 1 << 40  # above any rank
JOIN = contract.JOIN  # set in tnt-launch's replacement ranks: the member id each joins as
_joined = False  # this replacement's first fit has learnt the epoch it joins at


class Reformed(Exception):
    """The job re-formed inside a train step (``step_redo.py``), but the survivors go back to the
    epoch's start: the failure reached one of them elsewhere. ``fit`` catches it."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"the job re-formed after {type(error).__name__}; the epoch is redone")
        self.error = error


class Grown(Exception):
    """Replacement ranks were admitted as step ``step`` of ``epoch`` was about to begin (0: the
    epoch's start; later steps: ``step_redo.py``): the fit goes on from there with them (not an
    error: ``fit`` catches it)."""

    def __init__(self, epoch: int, step: int = 0) -> None:
        super().__init__(f"the job grew at epoch {epoch}, step {step}")
        self.epoch, self.step = epoch, step


def enabled() -> bool:
    """Whether this job may go on after losing ranks (TNT_ELASTIC, which tnt-launch --elastic sets)."""
    value = os.environ.get(contract.ELASTIC, "")
    return value.isdigit() and int(value) > 0


def why_no_replacements(backend: Any, ds: Any) -> str | None:
    """Why replacements cannot join a fit on ``ds`` (what ``backend.distribute`` returned), for the
    fit's one warning: they could not read the order the others read, as ``ds`` changes its order
    from state tnt cannot set back (``reshuffles``) or cannot hand a new rank (``unshared_order``);
    else None."""
    ds = short_epochs.inner(ds)  # the slices behind epochs made whole
    unshared = backend.unshared_order(ds)
    if unshared is not None:
        return f"in this elastic fit {unshared}."
    if not backend.reshuffles(ds):
        return None
    return (
        "the training dataset may change its order each time it is read (tf.data's shuffle with "
        "reshuffle_each_iteration=True, a shuffling DataLoader that tnt does not slice, or a PyDataset "
        "with an on_epoch_end of its own), from state tnt cannot set back: in this elastic fit a lost "
        "step is redone in its order, but an epoch begun again (a rank lost outside a train step) reads "
        "another order than serial training, and replacement ranks are not admitted (they would read "
        "another order than the others). For exact recovery everywhere pass arrays or a PyDataset with "
        "fit(shuffle=True) (tnt shuffles them per epoch from a seed) or a DataLoader (tnt sets its "
        "generator back), or shuffle with reshuffle_each_iteration=False."
    )


class EpochStart(keras.callbacks.Callback):
    """Keeps the variables as they were when each of the last two epochs began (the survivors may be
    one epoch apart when a rank is lost at an epoch's end), and the state the training input drew
    that epoch's order from, where the backend can read and set it (``order_state(inputs)``: a
    torch DataLoader's generators), so that an epoch begun again, or joined, reads the order it had."""

    def __init__(
        self, variables: Callable[[], list[Any]], order_state: Callable[[Any], Any],
        set_order_state: Callable[[Any, Any], None],
    ) -> None:
        super().__init__()
        self.variables = variables
        self.order_state, self.set_order_state = order_state, set_order_state
        self.inputs: Any = None  # what the attempt trains on (fit sets it)
        self.epoch: int | None = None
        self.saved: dict[int, list[np.ndarray]] = {}
        self.orders: dict[int, np.ndarray] = {}  # the input's order state as each epoch began
        self.order: np.ndarray | None = None  # the one the next epoch begins with: set back there
        self.resume: tuple[int, int] = (-1, 0)  # (epoch, step) the next attempt goes on from
        self.admits = True  # replacements that wait join at an epoch's start (not where the data reshuffles)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch
        if isinstance(self.inputs, short_epochs.EpochsOf):  # its epochs read on through the data
            self.inputs.begins(epoch)
        resume, self.resume = self.resume, (-1, 0)
        if self.order is not None:  # before Keras reads the epoch's first batch
            self.set_order_state(self.inputs, self.order)
            self.order = None
        if resume[0] == epoch and resume[1] > 0:
            return  # an attempt that goes on in the epoch's middle: the epoch began before, and its copy stands
        order = self.order_state(self.inputs)  # before the admission: the replacements take it
        if order is not None:
            self.orders[epoch] = order
        # Replacements that wait are admitted where every rank is alike: here (one broadcast).
        if self.admits and epoch_end.collective(tnt_comm.admit):
            raise Grown(epoch)
        self.saved[epoch] = [np.array(keras.ops.convert_to_numpy(v.value)) for v in self.variables()]
        for kept in (self.saved, self.orders):
            for old in [e for e in kept if e < epoch - 1]:
                del kept[old]

    def restore(self, epoch: int) -> None:
        """Puts back the variables ``epoch`` began with, and the input's order state for the epoch
        begun again. Collective: a replacement that joined in the epoch's middle has no copy of
        them, and takes the first survivor's."""
        values = self.saved.get(epoch)
        have = np.array([tnt_comm.rank() if values is not None else _NOBODY, 0 if values is not None else -1])
        holder, lacking = (int(v) for v in tnt_comm.allreduce(have, op="min"))
        if holder == _NOBODY:
            return  # the fit had not begun that epoch anywhere: the start's broadcast is the state
        if values is not None:
            for variable, value in zip(self.variables(), values, strict=True):
                variable.assign(value)
            self.order = self.orders.get(epoch)
        if lacking:
            shared_variables.broadcast_variables(self.variables(), root=holder, checked=True)
            self._take_order(epoch, holder)

    def share_order(self, epoch: int) -> None:
        """After replacements joined at ``epoch``: every rank begins it in the order rank 0 began it
        with (collective: one broadcast, where the input has an order state)."""
        self._take_order(epoch, 0)

    def _take_order(self, epoch: int, holder: int) -> None:
        mine = self.order_state(self.inputs)  # the same kind of input on every rank: the same size
        if mine is None:
            return
        held = self.orders.get(epoch, mine) if tnt_comm.rank() == holder else mine
        self.order = np.asarray(tnt_comm.broadcast(np.ascontiguousarray(held), root=holder))


def _follow_the_job(tnt_model: keras.Model, retrace: bool = True) -> None:
    """Points the model's hooks at the job as it is now, after it re-formed: the rank and size the
    wrapper keeps, the collectives the backend keeps, the traced step functions (unless a train
    function that goes on runs untraced: ``retrace`` False)."""
    mine = state.of(tnt_model)
    mine.rank, mine.size = tnt_comm.rank(), tnt_comm.size()
    inner = tnt_model.model
    state.of(inner).rank, state.of(inner).size = mine.rank, mine.size
    tnt_model._backend.forget_collectives(inner)
    if retrace:  # traced with the old job's collectives in flight: traced again
        inner.train_function = inner.test_function = inner.predict_function = None


def reform(tnt_model: keras.Model, error: BaseException, what: str, retrace: bool = True) -> None:
    """After ``error`` (a lost rank): re-forms the job with the survivors, points the model's hooks
    at it and agrees on the call each survivor is in; ``what`` the caller does next, for the log
    line. Collective over the survivors. Raises ``call_boundary.Behind`` or ``Ahead`` where the
    survivors were not all in one call, and tnt-comm's errors where the job cannot go on (fewer than
    MIN ranks, this rank left out)."""
    before = tnt_comm.size()
    lost = list(getattr(error, "ranks", ()) or ())
    with timeline.span("job re-formed without lost ranks", lost=lost, error=type(error).__name__):
        tnt_comm.shrink()
        _follow_the_job(tnt_model, retrace)
        try:
            call_boundary.agree()
        except call_boundary.Behind:
            _tell(lost, before, error, "returns from the call every rank had finished")
            raise
        except call_boundary.Ahead:
            _tell(lost, before, error, "begins its call again: the other ranks had not begun it")
            raise
    _tell(lost, before, error, what)


def _tell(lost: list[int], before: int, error: BaseException, what: str) -> None:
    generation, members = tnt_comm.membership()
    logger.warning(
        "lost rank(s) %s of %d (%s); the job re-formed with %d rank(s) (generation %d: members %s) and %s",
        ", ".join(map(str, lost)) or "?", before, type(error).__name__, tnt_comm.size(), generation,
        ", ".join(map(str, members)), what,
    )


def grown(tnt_model: keras.Model, epoch: int, step: int, before: int) -> tuple[int, int]:
    """After replacements joined before step ``step`` of ``epoch``: points the model's hooks at the
    job, tells the new ranks where (their fit's first collective) and returns it."""
    with timeline.span("replacement ranks joined", epoch=epoch, step=step):
        _follow_the_job(tnt_model)
    generation, members = tnt_comm.membership()
    logger.warning(
        "%d replacement rank(s) joined; the job has %d rank(s) (generation %d: members %s) from epoch %d, step %d on",
        tnt_comm.size() - before, tnt_comm.size(), generation, ", ".join(map(str, members)), epoch + 1, step + 1,
    )
    here = np.array([epoch, step, call_boundary.closed()], np.int64)
    epoch, step, _ = (int(v) for v in tnt_comm.broadcast(here, root=0))
    return epoch, step


def joined_at(first_epoch: int) -> tuple[int, int, bool]:
    """In a replacement's first fit: the epoch and step the job is at, and the calls it has closed,
    from rank 0 (``grown``'s broadcast), and True; elsewhere ``first_epoch``'s start and False."""
    global _joined
    if _joined or JOIN not in os.environ:
        return first_epoch, 0, False
    _joined = True
    here = np.array([first_epoch, 0, 0], np.int64)
    epoch, step, closed = (int(v) for v in tnt_comm.broadcast(here, root=0))
    call_boundary.joined(closed)
    return epoch, step, True


def epoch_to_redo(epoch_start: EpochStart, first_epoch: int) -> int:
    """The earliest epoch any survivor was in, with the variables it began with put back.
    Collective over the survivors."""
    here = epoch_start.epoch if epoch_start.epoch is not None else first_epoch
    epoch = int(tnt_comm.allreduce(np.array([here], np.int64), op="min")[0])
    epoch_start.restore(epoch)
    logger.warning("the job trains epoch %d again, from the variables it began with", epoch + 1)
    return epoch


class Epochs:
    """The epochs of a fit's attempts that stand: each attempt's up to the epoch the next redid."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, Any]]] = []

    @staticmethod
    def _rows(history: keras.callbacks.History) -> list[tuple[int, dict[str, Any]]]:
        # An attempt lost in a callback's on_train_begin has a History that has not begun: no epoch.
        return [
            (epoch, {key: values[i] for key, values in history.history.items() if i < len(values)})
            for i, epoch in enumerate(getattr(history, "epoch", []))
        ]

    def keep(self, history: keras.callbacks.History | None, redo_from: int) -> None:
        """What a failed attempt's ``history`` finished before epoch ``redo_from``, which is redone."""
        mine = self._rows(history) if history is not None else []
        self.rows = [r for r in self.rows if r[0] < redo_from] + [r for r in mine if r[0] < redo_from]

    def into(self, last: keras.callbacks.History) -> keras.callbacks.History:
        """``last`` (the attempt that finished) with the earlier attempts' epochs before its own."""
        if self.rows:
            rows = self.rows + self._rows(last)
            keys = list(dict.fromkeys(key for _, values in rows for key in values))
            last.epoch = [epoch for epoch, _ in rows]
            last.history = {key: [values.get(key) for _, values in rows] for key in keys}
        return last
