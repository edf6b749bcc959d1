"""What Keras callbacks keep of a fit, through an elastic job's re-formings (``callbacks.Callback``
calls these).

Three things change under a callback there. Rank 0 may be lost: what ran on it alone (a
``CSVLogger``, your callbacks with ``run_on_all_ranks=False``) begins on the new rank 0 in the middle
of the fit (``take_over``), and the checkpoint callbacks, which decide on every rank and write on
the master only, go on writing from the new one (``checkpoints_on_master``, ``backs_up_on_master``).
An epoch may be begun again: the checkpoint callbacks are put back as it found them, so that they
decide again from there (``epoch_begins``). A replacement may join: the Keras callbacks that decide
from what they saw so far take rank 0's state as the first epoch begins there (``epoch_begins``).
"""

from __future__ import annotations

import weakref
from typing import Any

import keras
import numpy as np

from . import epoch_end, runtime
from .runtime import logger

# The checkpoint callbacks: they decide on every rank, write on the master and share the outcome.
CHECKPOINTS = (keras.callbacks.ModelCheckpoint, keras.callbacks.BackupAndRestore)

# Keras callbacks whose decisions rest on what they saw of the fit so far (a best value, a count of
# epochs or batches): a replacement that joins an elastic fit takes their state from rank 0.
STATEFUL = (
    keras.callbacks.EarlyStopping,
    keras.callbacks.ReduceLROnPlateau,
    *CHECKPOINTS,
)

_begun_here: weakref.WeakSet[keras.callbacks.Callback] = weakref.WeakSet()
"""The callbacks whose training began on this rank (their on_train_begin ran here, their on_train_end
not yet)."""

_at_epoch_start: weakref.WeakKeyDictionary[keras.callbacks.Callback, tuple[int, dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)
"""A checkpoint callback's attributes as the epoch it is in began (the epoch, a shallow copy), in a
fit: an elastic fit that begins that epoch again puts them back, so that the callback decides again
from where it decided first (the best value so far, the batches since the last save): a checkpoint
whose writer was lost is written again, and none is written that serial training would not write."""

_given_verbose: weakref.WeakKeyDictionary[keras.callbacks.Callback, Any] = weakref.WeakKeyDictionary()
"""The ``verbose`` a callback came with, where ``silence`` set it to 0 on a rank that does not print."""


def began(callback: keras.callbacks.Callback) -> None:
    _begun_here.add(callback)


def ended(callback: keras.callbacks.Callback) -> None:
    _begun_here.discard(callback)
    _at_epoch_start.pop(callback, None)


def began_here(callback: keras.callbacks.Callback) -> bool:
    return callback in _begun_here


def silence(callback: keras.callbacks.Callback) -> None:
    """``verbose = 0``, on a rank that does not print; ``take_over`` gives it back."""
    _given_verbose.setdefault(callback, callback.verbose)
    callback.verbose = 0


def epoch_begins(callback: keras.callbacks.Callback, epoch: int, *, resuming: bool, joined: bool) -> None:
    """As ``epoch`` begins, for a callback of ``STATEFUL``: where an elastic fit that goes on after its
    job re-formed (``resuming``) begins that epoch again, puts a checkpoint callback's attributes back
    as they were when it began first; where replacements ``joined``, every rank takes the state rank 0
    has then (collective: two broadcasts); then keeps a checkpoint callback's attributes for an epoch
    begun again."""
    checkpoints = isinstance(callback, CHECKPOINTS)
    kept = _at_epoch_start.get(callback)
    if checkpoints and resuming and kept is not None and kept[0] == epoch:
        vars(callback).update(kept[1])
    if joined:
        state = epoch_end.broadcast_object(_state_of(callback) if runtime.get_rank() == 0 else None, 0)
        if runtime.get_rank() != 0:
            vars(callback).update(state)
    if checkpoints:
        _at_epoch_start[callback] = (epoch, dict(vars(callback)))


def take_over(callback: keras.callbacks.Callback, model: keras.Model, params: dict[str, Any], hook: str,
              epoch: int | None) -> None:
    """Begins ``callback`` on this rank, which is the master now that the one it ran on was lost in the
    middle of the fit (an elastic job re-formed): as the fit began it there, with its output back on,
    and where ``hook`` comes inside an ``epoch``, that epoch begun. A ``CSVLogger`` goes on with the
    file the lost master wrote (where this host sees it), its rows kept."""
    if callback in _given_verbose:
        callback.verbose = _given_verbose.pop(callback)
    callback.set_model(model)
    callback.set_params(params)
    appends = isinstance(callback, keras.callbacks.CSVLogger) and not callback.append
    if appends:
        callback.append = True
    try:
        callback.on_train_begin(logs=None)
    finally:
        if appends:
            callback.append = False
    if epoch is not None and hook != "on_epoch_begin":
        callback.on_epoch_begin(epoch, logs=None)
    began(callback)
    what = "the progress bar" if isinstance(callback, keras.callbacks.ProgbarLogger) else type(callback).__name__
    logger.warning("%s goes on on this rank, the master now", what)


def _is_data(value: Any) -> bool:
    """Whether ``value`` is plain data a callback keeps (a number, a string, an array, or a list of those)."""
    if isinstance(value, (list, tuple)):
        return all(_is_data(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str, np.generic, np.ndarray))


def _state_of(callback: keras.callbacks.Callback) -> dict[str, Any]:
    """What a Keras callback keeps of the fit so far: its attributes that are plain data (not its
    model, its functions or its ``verbose``, which each rank sets for itself)."""
    return {k: v for k, v in vars(callback).items() if k != "verbose" and _is_data(v)}


def checkpoints_on_master(callback: keras.callbacks.ModelCheckpoint) -> bool:
    """Makes ``callback`` save on the master rank only, checked at each save, and returns True: it
    then runs on every rank, each deciding as the master does (its best value so far, its batches
    since the last save), so that a rank that becomes the master (an elastic job that lost rank 0)
    saves what the lost one would have. Where this Keras has no ``_should_save_model`` (before 3.10)
    to decide without saving, returns False: the callback runs on the master rank only."""
    decide = getattr(callback, "_should_save_model", None)
    if decide is None:
        return False
    if getattr(callback, "_tnt_saves_on_master", False):
        return True
    save = callback._save_model

    def save_on_master(epoch: int, batch: int | None, logs: dict[str, Any] | None) -> None:
        if runtime.is_master_rank():
            save(epoch, batch, logs)
        else:
            decide(epoch, batch, logs, callback._get_file_path(epoch, batch, logs))

    callback._save_model = save_on_master
    callback._tnt_saves_on_master = True
    return True


def backs_up_on_master(callback: keras.callbacks.BackupAndRestore) -> None:
    """Every rank restores from the backup; the master rank alone writes and deletes it, the rank
    that is the master at the time (after an elastic job lost rank 0, the new one)."""
    if getattr(callback, "_tnt_backs_up_on_master", False):
        return
    save, end = callback._save_model, callback.on_train_end

    def save_on_master() -> None:
        if runtime.is_master_rank():
            save()

    def end_on_master(logs: dict[str, Any] | None = None) -> None:
        if runtime.is_master_rank():
            end(logs)  # deletes the backup where delete_checkpoint is set

    callback._save_model = save_on_master
    callback.on_train_end = end_on_master
    callback._tnt_backs_up_on_master = True
