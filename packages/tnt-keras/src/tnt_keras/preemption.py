"""A warning before the end of a job (preemption, a time limit) turns into a checkpoint.

Slurm sends it when asked (`#SBATCH --signal=USR1@300`: SIGUSR1 to every task of the job's steps, 300
s before its time limit; `scancel --signal=USR1 JOB` at once), and tnt-launch passes SIGUSR1 on to
every rank (its agents, and tnt-launch itself when the batch shell forwards it). From ``import
tnt_keras`` on, the signal only sets a flag on the rank that gets it, for the rest of the process (so
a warning that comes before or between fits is not lost, and does not end the rank as SIGUSR1 would
by default). At the end of every epoch the ranks agree
whether any of them got one (one allreduce of a number per epoch, so a job without a signal pays
nothing measurable): if so, every rank stops after that epoch, together. A ``BackupAndRestore`` passed
to ``fit`` has saved that epoch as always, and keeps its checkpoint instead of deleting it at the
end of ``fit``, so the next run of the same script resumes at the next epoch, exactly where an
uninterrupted run would be (given data in the same order every epoch).

The signals are SIGUSR1, or those named in TNT_PREEMPTION_SIGNALS (e.g. ``USR1,TERM``; ``none``
turns this off). SIGTERM is not among them by default: tnt-launch stops ranks with it (Ctrl+C, a
failed rank), which must not wait for an epoch to end, and Slurm kills a cancelled job KillWait
seconds (often 30) after its SIGTERM.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import keras
import numpy as np
import tnt_comm

from . import epoch_end

logger = logging.getLogger("tnt_keras")

SIGNALS_VARIABLE = "TNT_PREEMPTION_SIGNALS"
DEFAULT_SIGNALS = "USR1"

_state = {"requested": False, "preempted": False}
_previous: dict[signal.Signals, Any] = {}


def requested() -> bool:
    """Whether this rank got a preemption signal during the current (or last) ``fit``."""
    return _state["requested"]


def preempted() -> bool:
    """Whether the last ``fit`` stopped early because a rank got a preemption signal."""
    return _state["preempted"]


def signals() -> list[signal.Signals]:
    """The signals that ask for a checkpoint (TNT_PREEMPTION_SIGNALS, default SIGUSR1)."""
    text = os.environ.get(SIGNALS_VARIABLE, DEFAULT_SIGNALS).strip()
    if text.lower() in ("", "none", "off"):
        return []
    chosen = []
    for word in text.replace(" ", ",").split(","):
        if not word:
            continue
        name = word.upper() if word.upper().startswith("SIG") else f"SIG{word.upper()}"
        try:
            chosen.append(signal.Signals[name])
        except KeyError:
            raise ValueError(
                f"{SIGNALS_VARIABLE}={text!r}: {word!r} is not a signal name (e.g. USR1,TERM; none turns it off)"
            ) from None
    return chosen


def _on_signal(signum: int, frame: Any) -> None:
    if not _state["requested"]:
        logger.warning("got %s: training stops, on every rank, at the end of this epoch", signal.Signals(signum).name)
    _state["requested"] = True
    previous = _previous.get(signal.Signals(signum))
    if callable(previous):
        previous(signum, frame)


def install() -> None:
    """Handle the preemption signals from now on (once per process; from the main thread only, where
    Python runs signal handlers). A handler set before is called after ours."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in signals():
        if sig not in _previous:
            _previous[sig] = signal.signal(sig, _on_signal)


class Agreement(keras.callbacks.Callback):
    """Added first to every ``fit``'s callbacks: agrees at each epoch's end whether any rank got a
    preemption signal, for the ``Watch`` at the end of the list to act on. First, so that in an
    elastic job the epoch's end begins here (``epoch_end.py``), and a rank lost in this collective
    sends the survivors back to the epoch's start, where they cannot finish the end, before any
    callback of the user has seen it (seeing it twice, a ReduceLROnPlateau or an EarlyStopping would
    count the epoch twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.anyone = False  # whether a rank got a signal, as agreed at the last epoch's end

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        epoch_end.begin(epoch)  # the epoch's end, which an elastic fit finishes on the ranks left (epoch_end.py)
        flag = np.array([1 if _state["requested"] else 0], np.int32)
        flag = epoch_end.collective(lambda: tnt_comm.allreduce(flag, op="max") if tnt_comm.size() > 1 else flag)
        self.anyone = bool(flag[0])

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        epoch_end.end()


class Watch(keras.callbacks.Callback):
    """Added last to every ``fit``'s callbacks: stops training after an epoch at whose end any rank
    had got a preemption signal (``agreement``, first in the list, asks). ``backups`` are the
    BackupAndRestore callbacks of that ``fit``."""

    def __init__(self, backups: list[keras.callbacks.BackupAndRestore]) -> None:
        super().__init__()
        self.backups = backups
        self.agreement = Agreement()
        self._kept: list[tuple[keras.callbacks.BackupAndRestore, bool]] = []

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        _state["preempted"] = False
        install()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.agreement.anyone:
            return
        _state["preempted"] = True
        self.model.stop_training = True
        for backup in self.backups:
            # Kept for the next run, which resumes from it (BackupAndRestore deletes it at the end of a fit).
            self._kept.append((backup, backup.delete_checkpoint))
            backup.delete_checkpoint = False
        saved = (
            " (BackupAndRestore saved it)"
            if self.backups
            else " without a checkpoint: pass keras.callbacks.BackupAndRestore to fit to resume from it"
        )
        logger.warning("a rank got a preemption signal: training stops after epoch %d%s", epoch + 1, saved)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        # After BackupAndRestore's own on_train_end (this callback comes last): it kept the checkpoint.
        for backup, delete in self._kept:
            backup.delete_checkpoint = delete
        self._kept.clear()


def watch(callbacks: list[keras.callbacks.Callback]) -> Watch:
    """The preemption watch for a ``fit`` with ``callbacks`` (as handed to Keras, wrapped or not)."""
    backups = []
    for callback in callbacks:
        inner = getattr(callback, "callback", callback)
        if isinstance(inner, keras.callbacks.BackupAndRestore):
            backups.append(inner)
    return Watch(backups)
