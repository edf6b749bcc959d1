"""Global metric results: every metric's state is summed across ranks before its result is computed.

Metric states are sums (totals, counts, confusion matrices), so the result on the summed state equals
the serial result over the global batch: exact for the loss tracker, accuracy, top-k, AUC, precision,
recall, F1, R2 and MeanIoU. Metrics whose state is a per-batch value (PearsonCorrelation) are not.
Only the values used for the result are reduced; the variables themselves stay rank-local.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
from keras.src.backend.common.stateless_scope import StatelessScope

from . import backends, state


class _Reducing(threading.local):
    active = False


_reducing = _Reducing()
_global_metrics = state.Marked()  # metrics whose result() is global already

sums_observer: Callable[[Sequence[Any], Sequence[Any]], None] | None = None
"""Told each sum of metric states (variables, their sums): an elastic fit that redoes lost steps
keeps its train steps' (``step_redo.py``)."""


@contextlib.contextmanager
def _summed(variables: Sequence[Any]) -> Iterator[None]:
    """Within the block, reads of ``variables`` see their sums across ranks."""
    if _reducing.active or not variables:
        yield
        return
    summed = backends.current().summed_values(variables)  # an empty slice adds nothing from its step
    if sums_observer is not None:
        sums_observer(variables, summed)
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
