"""Keras callbacks in a multi-rank job: who runs them, what logs they see, and who prints.

Logs that ``fit``/``evaluate`` produce are already global (metric states are summed across ranks), so
Keras callbacks decide the same thing on every rank. What differs is side effects: only the master
rank prints progress, writes CSV/TensorBoard/checkpoint files or talks to a remote monitor, unless
``--output-on-all-devices`` or ``TNT_TENSORBOARD_ON_ALL_DEVICES`` asks otherwise. A checkpoint
callback that fails on the master rank makes its hook raise on every rank, so no rank trains on alone.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable
from typing import Any

import keras
import numpy as np
import tnt_comm

from . import callback_states, elastic, epoch_end, outcome, runtime

_HOOKS = (
    "on_batch_begin",
    "on_batch_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_test_batch_begin",
    "on_test_batch_end",
    "on_predict_batch_begin",
    "on_predict_batch_end",
    "on_train_begin",
    "on_train_end",
    "on_test_begin",
    "on_test_end",
    "on_predict_begin",
    "on_predict_end",
)


# Keras' default train-batch hooks call the older batch hooks.
_DELEGATES = {"on_train_batch_begin": "on_batch_begin", "on_train_batch_end": "on_batch_end"}


# Keras callbacks that write checkpoints on the master rank only. Their on_train_batch_end does nothing
# when they save once per epoch.
_EPOCH_SAVERS = callback_states.CHECKPOINTS


def _saves_per_epoch_only(callback: keras.callbacks.Callback) -> bool:
    kind = next((k for k in _EPOCH_SAVERS if isinstance(callback, k)), None)
    return (
        kind is not None
        and getattr(callback, "save_freq", None) == "epoch"
        and "on_train_batch_end" not in vars(callback)
        and type(callback).on_train_batch_end is kind.on_train_batch_end
    )


def _overrides(callback: keras.callbacks.Callback, hook: str) -> bool:
    """Whether ``callback`` does something in ``hook``, beyond the no-op of ``keras.callbacks.Callback``."""
    if hook == "on_train_batch_end" and _saves_per_epoch_only(callback):
        return False
    if hook in vars(callback) or getattr(type(callback), hook, None) is not getattr(keras.callbacks.Callback, hook):
        return True
    return hook in _DELEGATES and _overrides(callback, _DELEGATES[hook])


# Hooks every rank's wrapper hears of a callback that runs on the master only, or keeps state (where
# it defines none, they do nothing): each knows where the fit is, so that a rank that becomes the
# master mid-fit (an elastic job that lost rank 0) can begin the callback there, and an epoch begun
# again or joined by a replacement finds the callback's state as it should (callback_states.py).
_FIT_MARKS = ("on_train_begin", "on_epoch_begin", "on_train_end")

def average_logs(logs: dict[str, Any] | None) -> dict[str, Any] | None:
    """Numeric logs averaged over ranks (in float64, so values already equal everywhere stay exact)."""
    if not logs or (tnt_comm.size() == 1 and not epoch_end.journaling()):
        return logs
    keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number))
    if not keys:
        return logs
    values = np.array([float(np.asarray(logs[k])) for k in keys], dtype=np.float64)

    def mean() -> np.ndarray:
        return tnt_comm.allreduce(values) / tnt_comm.size() if tnt_comm.size() > 1 else values

    # At an epoch's end of an elastic fit, made again on the ranks left if one is lost in it (epoch_end.py).
    means = epoch_end.collective(mean)
    if means is values:
        return logs  # one rank: nothing to average, the logs as they were
    averaged = dict(logs)
    for key, value in zip(keys, means, strict=True):
        averaged[key] = float(value)
    return averaged


class Callback(keras.callbacks.Callback):
    """Runs a Keras callback in a multi-rank job.

    Args:
        callback: any ``keras.callbacks.Callback``.
        aggregate_logs: the callback sees numeric logs averaged over all ranks (default True). The
            logs of ``fit``/``evaluate`` are already global; this matters for values a custom
            ``train_step`` or an earlier callback computed on one rank's data.
        run_on_all_ranks: run the callback on every rank (default True), or only on the master rank.

    Example::

        cb = tnt.callbacks.Callback(MyTimer(), aggregate_logs=False, run_on_all_ranks=False)
        model.fit(ds, callbacks=[cb])

    Plain Keras callbacks passed to ``fit`` are wrapped automatically (see ``wrap``).
    """

    def __init__(
        self, callback: keras.callbacks.Callback, aggregate_logs: bool = True, run_on_all_ranks: bool = True
    ) -> None:
        super().__init__()
        if not isinstance(callback, keras.callbacks.Callback):
            raise TypeError(f"tnt.callbacks.Callback wraps a keras.callbacks.Callback, got {type(callback).__name__}")
        self.callback = callback
        self.aggregate_logs = aggregate_logs
        self.run_on_all_ranks = run_on_all_ranks
        self.tnt_model: keras.Model | None = None
        self.resuming = False  # an elastic fit goes on (wrap_all): on_train_begin is not passed on
        self.joined = False  # replacements joined the elastic fit (wrap_all): the state of rank 0's is taken
        self._fitting = False  # inside a fit, from its on_train_begin to its on_train_end
        self._epoch: int | None = None  # the epoch begun last in this fit
        # A checkpoint callback writes on the master rank only; every rank must learn whether it failed.
        self._shares_outcome = isinstance(callback, _EPOCH_SAVERS)
        # Only the hooks the callback overrides get a dispatcher; the others stay Keras' marked
        # defaults, so Keras keeps running batch-end hooks asynchronously when no callback has one.
        marks = not run_on_all_ranks or isinstance(callback, callback_states.STATEFUL)  # _FIT_MARKS heard on every rank
        self._passed_on = {hook for hook in _HOOKS if _overrides(callback, hook)}
        for hook in _HOOKS:
            if hook in self._passed_on or (marks and hook in _FIT_MARKS):
                setattr(self, hook, self._dispatcher(hook))

    @property
    def async_safe(self) -> bool:
        """Passes on a callback's ``async_safe`` unless its logs are averaged: Keras then runs
        batch-end hooks on a thread pool, where collectives could run in a different order per rank;
        nor for a checkpoint callback, whose hooks share their outcome."""
        return (
            bool(getattr(self.callback, "async_safe", False)) and not self.aggregate_logs and not self._shares_outcome
        )

    @property
    def runs_here(self) -> bool:
        return self.run_on_all_ranks or runtime.is_master_rank()

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        if self.runs_here:
            self.callback.set_model(self.tnt_model if self.tnt_model is not None else model)

    def set_params(self, params: dict[str, Any]) -> None:
        super().set_params(params)
        if self.runs_here:
            self.callback.set_params(params)

    def _dispatcher(self, hook: str) -> Any:
        takes_index = "batch" in hook or "epoch" in hook

        def dispatch(*args: Any, **kwargs: Any) -> None:
            # Keras passes logs positionally or by keyword; hooks with an index take it first.
            head, rest = (args[:1], args[1:]) if takes_index else ((), args)
            logs = kwargs.pop("logs", rest[0] if rest else None)
            if not self._follow_the_fit(hook, head):
                return
            # The collective runs on every rank, even where the callback itself does not.
            if self.aggregate_logs:
                logs = average_logs(logs)
            if not self._shares_outcome:
                if self.runs_here:
                    getattr(self.callback, hook)(*head, logs=logs)
                return
            if epoch_end.journaling() and hook in ("on_epoch_end", "on_epoch_begin"):
                # At an elastic fit's epoch end: where a rank is lost before every survivor has the
                # outcome, the survivors put the callback back as it was and run the hook again on
                # the ranks left (the new master writes what the lost one may not have), instead of
                # training the epoch again (epoch_end.py).
                before, runs = dict(vars(self.callback)), 0

                def hook_and_outcome() -> None:
                    nonlocal runs
                    if runs:
                        vars(self.callback).update(before)
                    runs += 1
                    self._hook_and_outcome(hook, head, logs)

                epoch_end.collective(hook_and_outcome)
            else:
                self._hook_and_outcome(hook, head, logs)

        return dispatch

    def _follow_the_fit(self, hook: str, head: tuple[Any, ...]) -> bool:
        """Notes where the fit is, and what an elastic job's re-forming changed for the callback
        (callback_states.py); whether ``hook`` is passed on to the callback."""
        if hook == "on_train_begin":
            self._fitting = True
        elif hook == "on_epoch_begin":
            self._epoch = int(head[0])
            if isinstance(self.callback, callback_states.STATEFUL):
                callback_states.epoch_begins(self.callback, self._epoch, resuming=self.resuming, joined=self.joined)
                self.joined = False
        # A master-only callback that began on another rank (the master now, inside the fit); every
        # other callback pays one test here, at every hook it hears.
        if (
            not self.run_on_all_ranks
            and self._fitting
            and (hook != "on_train_begin" or self.resuming)
            and self.runs_here
            and not callback_states.began_here(self.callback)
        ):
            model = self.tnt_model if self.tnt_model is not None else self.model
            callback_states.take_over(self.callback, model, self.params, hook, self._epoch)
            if hook == "on_train_begin":
                return False
        if hook == "on_train_begin":
            restores = isinstance(self.callback, keras.callbacks.BackupAndRestore)
            if self.resuming or (self.joined and restores):
                return False  # training has begun: a replacement's state comes from rank 0, not from the backup
            if self.runs_here:
                callback_states.began(self.callback)
        elif hook == "on_train_end":
            self._fitting = False
            callback_states.ended(self.callback)
        return hook in self._passed_on  # the others are heard for the notes above only

    def _hook_and_outcome(self, hook: str, head: tuple[Any, ...], logs: Any) -> None:
        """A checkpoint callback's hook. It saves through tnt.Model's methods on the master rank only:
        they must not start collectives there, and every rank learns here whether the hook failed,
        and raises if it did, before any rank goes on training."""
        error = None
        if self.runs_here:
            try:
                with outcome.writes_alone():
                    getattr(self.callback, hook)(*head, logs=logs)
            except Exception as e:  # shared with every rank, then raised here unchanged
                error = e
        outcome.agree_on_outcome(error, f"run {type(self.callback).__name__}.{hook}")


# Callbacks whose only effects are output or files: they run where output is wanted.
_OUTPUT_ONLY = (keras.callbacks.CSVLogger, keras.callbacks.RemoteMonitor)


def wrap(callback: keras.callbacks.Callback, tnt_model: keras.Model) -> Callback:
    """The tnt policy for one callback passed to ``fit``/``evaluate``/``predict``."""
    if isinstance(callback, Callback):
        wrapped = callback
    elif isinstance(callback, keras.callbacks.ProgbarLogger):  # wrap_all hands it to Keras unwrapped
        wrapped = Callback(callback, aggregate_logs=False, run_on_all_ranks=runtime.output_on_all_devices())
    elif isinstance(callback, keras.callbacks.TensorBoard):
        on_all = runtime.tensorboard_on_all_devices()
        if on_all and tnt_comm.size() > 1:
            _rank_log_dir(callback)
        wrapped = Callback(callback, aggregate_logs=False, run_on_all_ranks=on_all)
    elif isinstance(callback, _OUTPUT_ONLY):
        wrapped = Callback(callback, aggregate_logs=False, run_on_all_ranks=False)
    elif isinstance(callback, keras.callbacks.ModelCheckpoint):
        everywhere = callback_states.checkpoints_on_master(callback)
        wrapped = Callback(callback, aggregate_logs=False, run_on_all_ranks=everywhere)
    elif isinstance(callback, keras.callbacks.BackupAndRestore):
        callback_states.backs_up_on_master(callback)
        wrapped = Callback(callback, aggregate_logs=False, run_on_all_ranks=True)
    elif isinstance(
        callback,
        (
            keras.callbacks.EarlyStopping,
            keras.callbacks.ReduceLROnPlateau,
            keras.callbacks.LearningRateScheduler,
            keras.callbacks.TerminateOnNaN,
            keras.callbacks.History,
        ),
    ):
        # Global logs make these decide alike everywhere; they must run everywhere to keep ranks in step.
        wrapped = Callback(callback, aggregate_logs=False, run_on_all_ranks=True)
    else:
        wrapped = Callback(callback)
    if not runtime.prints_here() and hasattr(wrapped.callback, "verbose"):
        callback_states.silence(wrapped.callback)
    wrapped.tnt_model = tnt_model
    return wrapped


def verbose_of_a_printing_rank(verbose: Any) -> Any:
    """The ``verbose`` Keras gets on a rank that prints: ``"auto"`` where the output is not
    interactive gives what Keras chooses there, one line per epoch."""
    if isinstance(verbose, str) and verbose == "auto" and not runtime.live_progress():
        return 2
    return verbose


class _StandbyProgress(keras.callbacks.ProgbarLogger):
    """The progress bar of a rank that does not print, in an elastic fit: a rank that becomes rank 0
    in the middle of the fit takes it over (``callback_states.take_over``), with the ``verbose`` the
    fit was given, so that the progress goes on being printed."""

    def __init__(self, verbose: Any) -> None:
        super().__init__()
        self.given = verbose

    def set_params(self, params: dict[str, Any]) -> None:
        super().set_params({**params, "verbose": self.given})


def standby_progress(verbose: Any) -> list[keras.callbacks.Callback]:
    """For an elastic ``fit``'s callbacks, on a rank that does not print: a progress bar for it to take
    over where it becomes rank 0 (none where ``verbose`` asks for none)."""
    if runtime.prints_here() or not elastic.enabled():
        return []
    given = verbose_of_a_printing_rank(verbose)
    if not given:
        return []
    return [Callback(_StandbyProgress(given), aggregate_logs=False, run_on_all_ranks=False)]


def wrap_all(
    callbacks: Iterable[keras.callbacks.Callback] | None,
    tnt_model: keras.Model,
    resuming: bool = False,
    joined: bool = False,
) -> list[keras.callbacks.Callback]:
    """The callbacks to hand to the wrapped model's ``fit``/``evaluate``/``predict``.

    A ``ProgbarLogger`` or ``History`` passed by the user goes to Keras unwrapped, since Keras adds
    its default one only when the list holds none (a wrapped one would be a second progress bar or
    history). The progress bar is left out on ranks that do not print, where Keras, told
    ``verbose=0``, adds none either. ``resuming``: the fit goes on after its job re-formed
    (elastic.py), and the callbacks' training has begun already: they do not hear it begin again.
    ``joined``: replacements joined the fit, here or on this rank (it is one): as the first epoch
    begins, the Keras callbacks that keep state (``callback_states.STATEFUL``) take rank 0's, and a replacement's
    ``BackupAndRestore`` restores nothing (the weights came from rank 0).
    """
    handed: list[keras.callbacks.Callback] = []
    for callback in callbacks or []:
        bare = callback.callback if isinstance(callback, Callback) else callback
        if isinstance(bare, keras.callbacks.ProgbarLogger):
            if runtime.prints_here():
                handed.append(bare)
        elif isinstance(callback, keras.callbacks.History):
            handed.append(callback)  # the same on every rank: the logs are global
        else:
            wrapped = wrap(callback, tnt_model)
            wrapped.resuming, wrapped.joined = resuming, joined
            handed.append(wrapped)
    return handed


_rank_log_dirs: weakref.WeakKeyDictionary[keras.callbacks.TensorBoard, str] = weakref.WeakKeyDictionary()
"""The rank folder each TensorBoard callback writes to (its log_dir as _rank_log_dir made it)."""


def _rank_log_dir(callback: keras.callbacks.TensorBoard) -> None:
    """Moves ``log_dir`` into this rank's ``rank_<r>`` folder, once: the same callback passed to a
    second ``fit`` (or to ``evaluate``) must not end up in ``rank_0/rank_0``."""
    if _rank_log_dirs.get(callback) == callback.log_dir:
        return
    callback.log_dir = os.path.join(str(callback.log_dir), f"rank_{runtime.get_rank()}")
    _rank_log_dirs[callback] = callback.log_dir  # a log_dir changed later gets its own rank folder
