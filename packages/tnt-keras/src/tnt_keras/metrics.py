"""Global metric results: every metric's state is summed across ranks before its result is computed.

Metric states are sums (totals, counts, confusion matrices), so the result on the summed state equals
the serial result over the global batch: exact for the loss tracker, accuracy, top-k, AUC, precision,
recall, F1, R2 and MeanIoU. Metrics whose state is a per-batch value (PearsonCorrelation) are not.
Only the values used for the result are reduced; the variables themselves stay rank-local.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import keras
from keras.src.backend.common.stateless_scope import StatelessScope

from . import backends, state


class _Reducing(threading.local):
    active = False
    kept: StepSums | TracedSums | None = None  # where the train step running keeps its sums (.keeping)


_reducing = _Reducing()
_global_metrics = state.Marked()  # metrics whose result() is global already



@contextlib.contextmanager
def _summed(variables: Sequence[Any]) -> Iterator[None]:
    """Within the block, reads of ``variables`` see their sums across ranks."""
    if _reducing.active or not variables:
        yield
        return
    summed = backends.current().summed_values(variables)  # an empty slice adds nothing from its step
    if _reducing.kept is not None:
        _reducing.kept.keep(variables, summed)
    _reducing.active = True
    try:
        with StatelessScope(state_mapping=list(zip(variables, summed, strict=True))):
            yield
    finally:
        _reducing.active = False


@contextlib.contextmanager
def local() -> Iterator[None]:
    """Within the block, metric results are this rank's own, with no collective: for a model's
    symbolic build, whose results nobody reads, and which a replacement rank of an elastic job runs
    alone while the others are built already."""
    before = _reducing.active
    _reducing.active = True
    try:
        yield
    finally:
        _reducing.active = before


@contextlib.contextmanager
def _kept_by(sums: StepSums | TracedSums) -> Iterator[None]:
    """Within the block, the sums of metric states go to ``sums.keep``."""
    outer, _reducing.kept = _reducing.kept, sums
    try:
        yield
    finally:
        _reducing.kept = outer


class StepSums:
    """The global metric states of the last train step that completed on this rank, for an elastic
    fit that redoes lost steps (``step_redo.py``): the lost rank's share is in them.

    The step itself assigns them to variables of their own as its sum completes, so a traced step
    (TensorFlow) keeps them too; the sum is the step's last collective, so a step that fails assigns
    none. ``prepare`` makes those variables beforehand, outside any trace.
    """

    def __init__(self) -> None:
        self.copies: dict[int, tuple[Any, Any]] = {}  # id(metric variable) -> (it, its copy)
        self.covered: set[int] = set()  # the metric variables the step's sum covered (when last run or traced)

    def prepare(self, variables: Sequence[Any]) -> None:
        for v in variables:
            if id(v) not in self.copies:
                copy = keras.Variable(keras.ops.zeros(v.shape, v.dtype), dtype=v.dtype, trainable=False)
                self.copies[id(v)] = (v, copy)

    def keeping(self) -> contextlib.AbstractContextManager[None]:
        """Within the block (a train step, run or traced), the sums of metric states are kept."""
        self.covered = set()
        return _kept_by(self)

    def keep(self, variables: Sequence[Any], summed: Sequence[Any]) -> None:
        for v, value in zip(variables, summed, strict=True):
            found = self.copies.get(id(v))
            if found is not None:
                found[1].assign(value)
                self.covered.add(id(v))

    def values(self, variables: Sequence[Any]) -> list[Any] | None:
        """The kept sums of ``variables``, or None where the step does not keep all of them."""
        if not all(id(v) in self.covered for v in variables):
            return None
        return [self.copies[id(v)][1].value for v in variables]


class TracedSums:
    """The global metric states of a train step that is a pure function of its state (Keras-JAX's),
    as values of that step: the step returns them beside its logs (``pure_train_function`` of the
    backend), for an elastic fit that redoes lost steps."""

    def __init__(self) -> None:
        self.found: dict[int, Any] = {}  # id(metric variable) -> its global state, in the step

    def keeping(self) -> contextlib.AbstractContextManager[None]:
        """Within the block (the step, traced or run), the sums of metric states are kept."""
        self.found = {}
        return _kept_by(self)

    def keep(self, variables: Sequence[Any], summed: Sequence[Any]) -> None:
        self.found.update((id(v), value) for v, value in zip(variables, summed, strict=True))

    def values(self, variables: Sequence[Any]) -> list[Any] | None:
        """The kept sums of ``variables``, or None where the step did not sum all of them."""
        if not all(id(v) in self.found for v in variables):
            return None
        return [self.found[id(v)] for v in variables]


def keep_step_sums(model: keras.Model) -> tuple[StepSums, bool]:
    """Makes ``model``'s train step keep its global metric states (idempotent); returns where, and
    whether the train step changed just now (a train function made before must be made again)."""
    mine = state.of(model)
    if mine.step_sums is not None:
        return mine.step_sums, False
    sums = mine.step_sums = StepSums()
    inner = model.train_step

    def train_step(data: Any) -> Any:
        with sums.keeping():
            return inner(data)

    model.train_step = train_step
    return sums, True


def _global_result(metric: keras.metrics.Metric) -> None:
    if metric in _global_metrics:
        return
    original = metric.result

    def result() -> Any:
        with _summed(list(metric.variables)):
            return original()

    metric.result = result
    _global_metrics.add(metric)


def install_global_metrics(model: keras.Model, size: int) -> None:
    """Makes ``model.get_metrics_result`` and every metric's ``result`` global (idempotent).

    ``get_metrics_result`` reduces all metrics in one fused collective; the per-metric hook covers
    custom ``train_step``s that call ``metric.result()`` themselves.
    """
    if size == 1:
        return
    for metric in model.metrics:
        _global_result(metric)
    if state.of(model).global_metrics:
        return
    original = model.get_metrics_result

    def get_metrics_result() -> Any:
        for metric in model.metrics:
            _global_result(metric)
        with _summed([v for m in model.metrics for v in m.variables]):
            return original()

    model.get_metrics_result = get_metrics_result
    state.of(model).global_metrics = True
