"""Redoing the step a rank was lost in, instead of its epoch (an elastic fit on any backend, of
tnt's slices of arrays, a ``PyDataset`` or a torch ``DataLoader``, or on torch and TensorFlow a
TensorFlow pipeline handed over whole, with Keras' own train step).

A train step changes the model in three places: its forward pass changes the small state (the
non-trainable variables: moving statistics, dropout seeds; the loss tracker), the optimizer's update
follows the gradient sum, and the metric states follow the update. The backend holds the update back
until the step's last collective, the sum of the metric states, is done (``update_at_step_end``), so
a step that fails has changed no weight on any rank, only the small state, which is copied before
every step (on the device, no host transfer). On JAX, whose train step is a pure function of its
state, the step is compiled without giving that state up, so a step that fails changes nothing at
all (``Backend.pure_train_function``). The global metric states that a step's logs were computed
from are kept, by the step itself (``metrics.StepSums``: a traced step too; on JAX returned beside
the new state): no survivor needs anything the lost rank held.

When a collective of the step raises ``PeerFailure`` or ``Timeout``, the survivors re-form the job
and agree on how far it got. A survivor may have finished the step (its last collective completed
before the failure reached it) while others failed in it; if so, the first of those hands its
variables and metric sums to the others (one broadcast), who count the step as done. Otherwise every
survivor puts its small state back, takes the step's global batch dealt over the ranks left, and runs
the step again. Either way each global batch enters the fit once, so it still equals serial
training. A failure at an epoch's end (its collectives after the last validation batch, up to the
next epoch's first step) is finished there instead (``epoch_end.py``, whose survivors ``agree`` with
the others on where each was); failures elsewhere outside a train step (in validation, a
checkpoint's outcome between steps), and fits this cannot redo, go back to the epoch's start (``elastic.py``).

Every ``TNT_ELASTIC_ADMIT_STEPS`` steps the ranks also admit replacements that wait (``Grown``):
the fit then begins the epoch again with them, passes over the steps done (``Resume``: no
collective, their logs from the global metric states, which rank 0 hands on) and goes on.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tnt_comm
from keras.src.backend.common.stateless_scope import StatelessScope
from keras.src.trainers.data_adapters import data_adapter_utils

from . import backends, elastic, epoch_end, metrics, short_epochs, state, timeline
from . import variables as shared_variables
from .runtime import logger

_FURTHEST = 1 << 40  # above any step count: agree() finds the furthest step as a minimum
_RANKS = 1 << 20  # above any rank
# Where each survivor was, for agree(): at an epoch's end, in the first step after one, elsewhere.
AT_END, AFTER_END, ELSEWHERE = 0, 1, 2
ADMIT_STEPS = "TNT_ELASTIC_ADMIT_STEPS"
"""Every this many steps of a fit (default 100; 0: never) replacements that wait are admitted there,
not only at an epoch's start: a store look-up on rank 0 and one broadcast."""
REDO = "TNT_ELASTIC_REDO"
"""What an elastic fit redoes after a lost rank, where it can redo either: ``step`` or ``epoch``. The
default is the step where the backend holds the update back (TensorFlow, torch: about 1% of a step);
on JAX the epoch, since redoing the step means waiting for each step before the next is dispatched
(1-13% of LeNet-5's epoch on 2 CPU ranks, by the machine; docs/benchmarks.md) and holding the
state twice while a step runs."""


def redoes_by_default() -> bool:
    """Whether, unless ``TNT_ELASTIC_REDO`` says otherwise, an elastic fit redoes lost steps: not
    where steps are pure functions that would be waited for one by one (JAX)."""
    return not backends.current().waits_for_redoable_steps


def redoes_steps(tnt_model: keras.Model) -> bool:
    """Whether an elastic fit of ``tnt_model`` can redo a lost step on inputs that can deal a batch
    again (``dealt_again``): more than one rank, Keras' own train step (one update, after which
    nothing reads the weights), one step per call, and a backend that holds the update back to the
    step's end. Asked before the fit's inputs are prepared: a ``tf.data`` pipeline is then handed
    over with its global batches whole (``backends.Backend.distribute``)."""
    asked = os.environ.get(REDO, "").strip().lower()
    if asked not in ("", "step", "epoch"):
        raise ValueError(f"tnt: {REDO}={asked!r} is not understood; set it to step or epoch (or leave it unset)")
    if asked == "epoch" or (not asked and not redoes_by_default()):
        return False
    model = tnt_model.model
    defined_in = next(c for c in type(model).__mro__ if "train_step" in vars(c))
    return (
        state.of(tnt_model).size > 1
        and defined_in.__module__.startswith("keras.")
        and getattr(model, "steps_per_execution", 1) == 1
        and backends.current().update_at_step_end(model)
    )


def dealt_again(ds: Any) -> bool:
    """Whether a batch of ``ds`` can be dealt again over fewer ranks within an epoch: tnt's slices of
    arrays, of a ``PyDataset`` or of a ``DataLoader`` (by index), or a pipeline whose global batches
    the step slices."""
    return hasattr(ds, "last_index") or backends.current().drawn_slicer(ds) is not None


class Agreement:
    """How the survivors go on, from one allreduce (``agree``)."""

    def __init__(
        self, in_step: bool, healable: bool, furthest: int, healer: int, slowest: int, phases: tuple[int, int],
        holder: int,
    ) -> None:
        self.in_step, self.healable = in_step, healable
        self.furthest, self.healer, self.slowest = furthest, healer, slowest
        self.phases = phases  # the earliest and the latest place a survivor was (AT_END, ...)
        self.holder = holder  # the survivor with the most results of the epoch's end (epoch_end.py)

    @property
    def redo_step(self) -> bool:
        """Every survivor was in a train step, knows the global metric states it began with and can
        deal its batch again."""
        return self.in_step and self.healable

    @property
    def finish_end(self) -> bool:
        """Some survivor was at an epoch's end, and every other there too or in the step after it,
        each with the same steps done: the epoch's end is finished, that step redone."""
        return self.phases[0] == AT_END and self.phases[1] <= AFTER_END and self.healable and (
            self.furthest == self.slowest)


def agree(in_step: bool, healable: bool, done: int, phase: int = ELSEWHERE, results: int = 0) -> Agreement:
    """Collective over the survivors: whether each was in a train step, how many steps each had
    done, where each was (``phase``) and, at an epoch's end, how many of its collectives' results it
    holds. Every rank of an elastic fit that can redo steps calls it after a re-forming."""
    rank = tnt_comm.rank()
    key = (_FURTHEST - done) * _RANKS + rank  # the lowest: the furthest, then the first rank
    holder = (_FURTHEST - results) * _RANKS + rank
    mine = np.array([int(in_step), int(healable), key, done, phase, -phase, holder], np.int64)
    found = [int(v) for v in tnt_comm.allreduce(mine, op="min")]
    return Agreement(bool(found[0]), bool(found[1]), _FURTHEST - found[2] // _RANKS, found[2] % _RANKS, found[3],
                     (found[4], -found[5]), found[6] % _RANKS)


class StepRedo:
    """Wraps ``model.train_function`` for one attempt of an elastic fit; ``ds`` is what the attempt
    trains on (``ArraySlices``/``DatasetSlices``/``LoaderSlices``), ``val_ds`` what it validates on (re-dealt too,
    where it is tnt's), ``class_weight`` the fit's."""

    def __init__(
        self, tnt_model: keras.Model, ds: Any, val_ds: Any, class_weight: Any, epoch_start: elastic.EpochStart,
        resume: Resume, admit_every: int, finish_ends: bool = False,
    ) -> None:
        self.tnt_model, self.model, self.class_weight = tnt_model, tnt_model.model, class_weight
        self.ds, self.val_ds, self.epoch_start = ds, val_ds, epoch_start
        self.done = 0  # train steps this attempt finished here (or passed over, going on mid-epoch)
        self.skip, self.share_sums = resume.step, resume.step > 0
        self.admit_every = admit_every  # replacements are admitted every this many steps (0: never)
        self.sums: list[Any] | None = None  # the global metric states after them (None: not known)
        self.carried = resume.sums  # those of the attempt before, where this one goes on mid-epoch
        self.reset = False  # the metrics were reset since the last step: their global states are 0
        self.metric_variables: list[Any] = []  # known once the fit built the model and its metrics
        self.small: list[Any] = []
        self.step_sums: metrics.StepSums | None = None
        self.original: Callable[..., Any] | None = None  # Keras' train function, which install() wraps
        self.wrapper: Callable[..., Any] | None = None
        # Where the backend's train step is a pure function of its state (JAX): that function, and the
        # state the step running was handed (the one it goes on from after a loss, or that it hands on).
        self.pure = backends.current().pure_train_function(self.model)
        self.state: Any = None
        # Where Keras hands the step its epoch's iterator (TensorFlow), the batch is drawn here:
        self.iterator: Any = None  # the epoch's iterator
        self.drawn = 0  # how many batches of it were drawn
        self.counted_in: int | None = None  # the epoch whose batches ``drawn`` counts, where Keras hands them over
        self.dealt_here = False  # the job re-formed this epoch: the iterator's next batches are dealt for the old one
        # Keras goes on with one iterator across epochs (steps_per_epoch shorter than the data), whose
        # pipeline may have read a batch ahead in the order of the epoch before: not dealt again (but a
        # pipeline whose batches come whole is cut as each step draws its batch: its steps are redone).
        self.spans_epochs = False
        # A pipeline handed over with its global batches whole: each step slices the batch it draws.
        self.slicer = backends.current().drawn_slicer(ds)
        self.whole: Any = None  # the global batch the step drew
        self.val_slicer = backends.current().drawn_slicer(val_ds) if val_ds is not None else None
        self.test_original: Callable[[Any], Any] | None = None  # Keras' test function, where validation slices
        self.test_wrapper: Callable[[Any], Any] | None = None
        self.validating = False  # in the fit's validation (not an evaluate a callback makes)
        # A rank lost at an epoch's end: the survivors finish it (epoch_end.py), where the epochs'
        # batches are dealt anew at each epoch's start (not with steps_per_epoch: one iterator on).
        self.journal = epoch_end.Journal(self._recover_at_end) if finish_ends else None
        self.deal_next = False  # the next epoch's iterator, made before the job re-formed, is dealt here

    def _collect(self) -> None:
        if self.pure is not None:  # the state's metric part, in its order; nothing else to put back
            self.metric_variables = list(self.model.metrics_variables)
            return
        self.metric_variables = [v for m in self.model.metrics for v in m.variables]
        # What a failed step's forward pass may have changed; its metric states are set anew anyway.
        metric_ids = {id(v) for v in self.metric_variables}
        self.small = [v for v in shared_variables.unique_variables(self.model.non_trainable_variables)
                      if id(v) not in metric_ids]
        assert self.step_sums is not None
        self.step_sums.prepare(self.metric_variables)  # before the step is traced

    def install(self) -> None:
        if self.pure is not None:  # Keras-JAX calls train_function(state, iterator)
            self.original = self.model.train_function
            self.wrapper = self._run_pure
            self.model.train_function = self.wrapper
            self._install_common()
            return
        self.step_sums, changed = metrics.keep_step_sums(self.model)
        if changed:  # a train function made before calls the train step as it was
            self.model.train_function = None
        self.model.make_train_function()
        original = self.model.train_function
        self.original = original
        self.wrapper = lambda data: self._run(original, data)
        self.model.train_function = self.wrapper
        self._install_common()

    def _install_common(self) -> None:
        reset_metrics = self.model.reset_metrics

        def reset() -> None:  # each epoch (and its validation) starts the metrics from zero
            reset_metrics()
            self.reset = True

        self.model.reset_metrics = reset
        if self.val_slicer is not None:
            self._slice_validation()
        epoch_end.active = self.journal

    def _slice_validation(self) -> None:
        """The fit's validation pipeline comes whole too: its test steps slice each batch drawn, for
        the ranks there are at the time. Only the fit's validation: Keras makes it with the pipeline
        as ``x`` (an evaluate elsewhere gets tnt's slices)."""
        self.model.make_test_function()
        test = self.model.test_function
        evaluate = self.model.evaluate
        assert self.val_slicer is not None
        slicer = self.val_slicer

        def sliced(data: Any) -> Any:
            if not self.validating:
                return test(data)
            batch = data[0] if isinstance(data, list) else next(data)  # handed over (torch) or drawn here
            return test([slicer(batch, tnt_comm.rank(), tnt_comm.size())])

        def validate(*args: Any, **kwargs: Any) -> Any:
            before, self.validating = self.validating, kwargs.get("x", args[0] if args else None) is self.val_ds
            try:
                return evaluate(*args, **kwargs)
            finally:
                self.validating = before

        self.test_original, self.test_wrapper = test, sliced
        self.model.test_function = sliced
        self.model.evaluate = validate

    def uninstall(self) -> None:
        """Puts Keras' train function back, for the next attempt or the next fit to wrap anew. Left
        in place (Keras keeps a train function across fits, and a rank whose failure in a step sent
        the job back to the epoch's start keeps the one it had: that re-forming did not retrace
        it), it would run inside the next wrapper and catch the step failures that one must see,
        then redo them with this attempt's data and count of steps."""
        vars(self.model).pop("reset_metrics", None)
        vars(self.model).pop("evaluate", None)
        if self.journal is not None and epoch_end.active is self.journal:
            self.journal.close()
            epoch_end.active = None
        if self.model.train_function is self.wrapper:
            self.model.train_function = self.original
        if self.test_wrapper is not None and self.model.test_function is self.test_wrapper:
            self.model.test_function = self.test_original

    def _batch(self, data: Any) -> tuple[list[Any], int]:
        """The step's batches, as the train function takes them, and the index of its global batch.
        Keras-torch hands them over, fetched by index (``ds.last_index``), or a pipeline's whole ones,
        which are cut here; Keras-TensorFlow hands over the epoch's iterator, whose pipeline reads
        ahead: the batch is drawn from it here, and where the pipeline's batches come whole
        (``slicer``) or the job re-formed since the epoch began, dealt here for the ranks there are
        now."""
        if isinstance(data, list):
            if self.slicer is None:
                return data, self.ds.last_index
            # A pipeline's global batch, whole, as Keras-torch draws it: cut here, counted per epoch.
            if self.counted_in != self.epoch_start.epoch:
                self.counted_in, self.drawn = self.epoch_start.epoch, 0
            self.whole, self.drawn = data[0], self.drawn + 1
            return self._deal(self.drawn - 1), self.drawn - 1
        if data is not self.iterator:  # a new epoch
            self.iterator, self.drawn, self.dealt_here, self.deal_next = data, 0, self.deal_next, False
        elif self.reset:  # a new epoch, drawing on from the last one's iterator
            self.spans_epochs = True
        drawn = next(data)  # StopIteration: the data ran out, which Keras takes as the epoch's end
        self.drawn += 1
        if self.slicer is not None:
            self.whole = drawn
        return (self._deal(self.drawn - 1) if self.dealt_here or self.slicer else [drawn]), self.drawn - 1

    def _run_pure(self, state: Any, data: Any) -> tuple[Any, Any]:
        """Keras-JAX's train function: ``(logs, state)`` of one step on ``data`` (the epoch's iterator)."""
        assert self.pure is not None
        pure = self.pure
        self.state = state

        def step(batches: list[Any]) -> Any:
            logs, self.state, sums = pure(self.state, batches[0])
            return logs, sums

        logs = self._run(step, data)
        return logs, self.state

    def _run(self, original: Callable[[Any], Any], data: Any) -> Any:
        if self.done == 0:
            self._collect()
        batches, index = self._batch(data)
        if self.reset:  # (the variables' values may be elsewhere: Keras-JAX's state during an epoch)
            self.sums, self.reset = [keras.ops.zeros(v.shape, v.dtype) for v in self.metric_variables], False
        if self.share_sums:  # going on mid-epoch: the epoch's metric states so far, from rank 0
            self.share_sums, self.sums = False, self.carried
            self._hand_on(0, metrics_only=True)
            self._share_out_sums()
        if self.skip > 0:  # the steps of the epoch done before the replacements joined
            self.skip -= 1
            self.done += 1
            return self._logs()
        if self.admit_every and self.done % self.admit_every == 0 and index > 0 and self.sums is not None:
            if tnt_comm.admit():  # replacements wait: the attempt goes on with them from this step
                raise elastic.Grown(self.epoch_start.epoch or 0, index)
        while True:
            before = [keras.ops.copy(v.value) for v in self.small]
            try:
                with backends.current().explain_errors("fit"):
                    logs = original(batches)
            except elastic.FAILURES as error:
                if self._recover(error, before):
                    self._step_done()
                    return self._logs()  # a survivor had finished this step: it counts as done
                batches = self._deal(index)
                continue
            self.done += 1
            if self.pure is not None:
                logs, self.sums = logs
            else:
                assert self.step_sums is not None
                self.sums = self.step_sums.values(self.metric_variables)
            self._step_done()
            return logs

    def _step_done(self) -> None:
        if self.journal is not None and self.journal.is_open:
            self.journal.close()  # an epoch's end before this step is over everywhere

    def _follow(self, error: BaseException, what: str) -> None:
        """Re-forms the job after ``error`` and deals the batches to come over the ranks left."""
        elastic.reform(self.tnt_model, error, what, retrace=False)
        for dealt in (short_epochs.inner(self.ds), self.val_ds):
            # tnt's slices: the next batches are dealt anew (not those every rank reads whole)
            if hasattr(dealt, "last_index") and dealt.size > 1:
                dealt.rank, dealt.size = tnt_comm.rank(), tnt_comm.size()
        self.dealt_here = self.iterator is not None

    def _recover_at_end(self, error: BaseException) -> int:
        """After ``error`` in a collective of an epoch's end: re-forms the job; returns the survivor
        whose results of it the others take (``epoch_end.Journal``), or raises ``elastic.Reformed``
        where the survivors go back to the epoch's start instead."""
        assert self.journal is not None
        self._follow(error, "agrees on what to redo")
        self.deal_next = True  # Keras may have made the next epoch's iterator already
        how = agree(False, True, self.done, AT_END, len(self.journal.entries))
        if not how.finish_end:
            raise elastic.Reformed(error) from error
        self._end_finished(how.holder)
        return how.holder

    def _end_finished(self, holder: int) -> None:
        assert self.journal is not None
        with timeline.span("epoch end finished", epoch=self.journal.epoch, holder=holder):
            logger.warning("the end of epoch %d is finished on %d rank(s)", self.journal.epoch + 1, tnt_comm.size())

    def _recover(self, error: BaseException, before: list[Any]) -> bool:
        """Re-forms the job after ``error`` in a step; True where another survivor had finished the
        step (this rank now holds its state), False where the step is to run again. Raises
        ``elastic.Reformed`` where the survivors go back to the epoch's start instead."""
        for variable, value in zip(self.small, before, strict=True):
            variable.assign(value)
        self._follow(error, "agrees on what to redo")
        known = (self.sums is not None or not self.metric_variables) and not (self.spans_epochs and self.slicer is None)
        after_end = self.journal is not None and self.journal.is_open
        how = agree(True, known, self.done, AFTER_END if after_end else ELSEWHERE,
                    len(self.journal.entries) if self.journal is not None else 0)
        if how.finish_end:  # the others were at the epoch's end before this step: they finish it, then join in
            assert self.journal is not None
            self.journal.take_from(how.holder)
            self._end_finished(how.holder)  # and this step runs again (every survivor has done as many)
        elif not how.redo_step:
            raise elastic.Reformed(error) from error
        with timeline.span("lost step redone", step=how.furthest, healer=how.healer):
            if how.slowest < how.furthest:  # some finished it: the first of them hands on its state
                self._hand_on(how.healer)
            self._share_out_sums()
        finished_elsewhere = self.done < how.furthest
        self.done = how.furthest
        logger.warning(
            "step %d of this fit %s on %d rank(s)", how.furthest + (0 if finished_elsewhere else 1),
            "was finished by a survivor; taken from it" if finished_elsewhere else "runs again",
            tnt_comm.size(),
        )
        return finished_elsewhere

    def _hand_on(self, healer: int, metrics_only: bool = False) -> None:
        """Every rank takes ``healer``'s variables and global metric states (one broadcast)."""
        if self.pure is not None:
            self._hand_on_state(healer, metrics_only)
            return
        if tnt_comm.rank() == healer:
            for variable, value in zip(self.metric_variables, self.sums or [], strict=True):
                variable.assign(value)
        everything = [] if metrics_only else shared_variables.model_and_optimizer_variables(self.model)
        ids = {id(v) for v in everything}
        everything += [v for v in self.metric_variables if id(v) not in ids]
        shared_variables.broadcast_variables(everything, root=healer, checked=True)
        self.sums = [keras.ops.copy(v.value) for v in self.metric_variables]

    def _hand_on_state(self, healer: int, metrics_only: bool) -> None:
        """``_hand_on`` of a pure step's state (JAX): the state's arrays, and the metric sums for its
        metric part."""
        *variables, metric_states = self.state
        values = [] if metrics_only else [value for part in variables for value in part]
        values += list(self.sums or []) if tnt_comm.rank() == healer else list(metric_states)
        taken = [keras.ops.convert_to_tensor(v) for v in shared_variables.broadcast_values(values, root=healer)]
        parts, start = [], 0
        for part in [] if metrics_only else variables:
            parts.append(taken[start:start + len(part)])
            start += len(part)
        self.sums = taken[start:]
        self.state = (*(parts or variables), self.sums)

    def _share_out_sums(self) -> None:
        """The metric states summed over the ranks left are the global ones: rank 0 holds them."""
        shared = [value if tnt_comm.rank() == 0 else keras.ops.zeros_like(value) for value in self.sums or []]
        if self.pure is not None:
            self.state = (*self.state[:-1], shared)
            return
        for variable, value in zip(self.metric_variables, shared, strict=True):
            variable.assign(value)

    def _logs(self) -> Any:
        """The logs of a step finished elsewhere: its metric results, from the global states."""
        mapping = list(zip(self.metric_variables, self.sums or [], strict=True))
        with metrics.local(), StatelessScope(state_mapping=mapping):
            return self.model.get_metrics_result()

    def _deal(self, index: int) -> list[Any]:
        """Global batch ``index``, this rank's slice of it among the ranks there are now, as Keras
        hands it to the train function (standardized, class weights added, as tensors); of a pipeline
        whose batches come whole, the one the step drew."""
        if self.slicer is not None:
            return [self.slicer(self.whole, tnt_comm.rank(), tnt_comm.size())]
        batch = self.ds[index]
        if isinstance(batch, list | np.ndarray):
            batch = tuple(batch) if isinstance(batch, list) else (batch,)
        if self.class_weight is not None and isinstance(batch, tuple) and len(batch) == 2:
            batch = (*batch, data_adapter_utils.class_weight_to_sample_weights(batch[1], self.class_weight))
        return [keras.tree.map_structure(keras.ops.convert_to_tensor, batch, none_is_leaf=False)]


@dataclass(frozen=True)
class Resume:
    """Where an attempt of an elastic fit goes on: the step of its first epoch (0: the start) and the
    global metric states there (rank 0's count)."""

    step: int = 0
    sums: list[Any] | None = None


def attach(
    tnt_model: keras.Model, ds: Any, val_ds: Any, class_weight: Any, epoch_start: elastic.EpochStart, resume: Resume,
    steps_per_epoch: int | None,
) -> StepRedo | None:
    """The step redo of one attempt of an elastic fit, installed; None where it cannot redo steps
    (the same on every rank)."""
    if not redoes_steps(tnt_model) or not dealt_again(ds):
        return None
    slicing = [d for d in (ds, val_ds) if d is not None and backends.current().drawn_slicer(d) is not None]
    if slicing and backends.current().pure_train_function(tnt_model.model) is not None:
        return None  # a pure step (JAX) is not handed a pipeline's whole batches to slice
    if val_ds is not None and not dealt_again(val_ds):
        return None  # a validation dataset of another kind cannot be dealt over fewer ranks
    # Steps are counted within an epoch where Keras starts every epoch's batches anew; not where the
    # data reshuffles, or draws its order from state a replacement cannot have: the attempt that goes on
    # with the replacements would read another order.
    admit_every = int(os.environ.get(ADMIT_STEPS, "100") or 0) if steps_per_epoch is None else 0
    admit_every = 0 if elastic.why_no_replacements(backends.current(), ds) else admit_every
    redo = StepRedo(tnt_model, ds, val_ds, class_weight, epoch_start, resume, admit_every,
                    finish_ends=steps_per_epoch is None)
    redo.install()
    return redo
