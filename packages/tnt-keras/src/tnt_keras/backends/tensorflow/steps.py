"""Makes a step change nothing on a rank whose slice of the global batch is empty.

A partial last batch of ``B`` samples on ``N > B`` ranks leaves ranks ``B..N-1`` without a row.
They still run the step, since every rank must issue the same collectives in the same order, but
a forward pass over no samples computes NaN in places: BatchNormalization takes the moments of
nothing and writes them into its moving statistics, a loss that is a plain mean over nothing is
NaN, and so are some gradients. So on such a rank, and for that step only:

- its gradients enter the sum multiplied by its share of the batch, 0, by the rule of
  ``tf.math.multiply_no_nan`` (``gradients.py``, ``ops.start_fused_sum``): zero even where a gradient is NaN;
- its metric states enter the global sums (``metrics.py``) with their values from before the step;
- after the step, the model's non-trainable variables (BatchNormalization's moving statistics,
  random seed states, ...) and its metric variables take their values from before the step back.

Serial training of that batch is then exactly what the ranks with rows compute. On every step,
every rank pays for reading those variables at the top of the step (a read copies nothing; the
variables the step updates, small ones such as moving statistics and metric states, are then copied
once) and for a few conditionals. Predict steps need none of this: they run in inference mode,
update no state and issue no collective, and an empty slice predicts no rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

from ...sync_batch_norm import synced_variables
from ...variables import unique_variables
from .. import guard_steps


class _Step(threading.local):
    """The step being traced or run: whether this rank's slice is empty, and the values from before it."""

    empty: tf.Tensor | None = None  # scalar bool
    before: dict[int, tf.Tensor] | None = None  # id(variable) -> its value at the top of the step


_step = _Step()


def local_rows(data: Any) -> tf.Tensor:
    """The number of rows of this rank's slice ``data`` (an int32 scalar)."""
    leaves = [t for t in tf.nest.flatten(data) if t is not None]
    return tf.shape(leaves[0])[0]


def contributed(variables: Sequence[Any]) -> list[tf.Tensor]:
    """The values of ``variables`` (metric states) that this rank adds to global sums: as they are,
    or, within a step on an empty slice, as they were at the top of that step."""
    current = [tf.convert_to_tensor(v.value) for v in variables]
    if _step.empty is None or _step.before is None:
        return current
    before = [_step.before.get(id(v), c) for v, c in zip(variables, current, strict=True)]
    return list(tf.cond(_step.empty, lambda: before, lambda: current))


def install(model: keras.Model, size: int) -> None:
    """Wraps ``model``'s train and test steps (idempotent; one rank needs nothing)."""
    guard_steps(model, size, _guarded)


def _guarded(model: keras.Model, step: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def guarded(data: Any) -> Any:
        # Why all non-trainable variables: the layers that update state in the forward pass are not
        # known, and reading a variable that nothing assigns costs no copy.
        variables = unique_variables(list(model.non_trainable_variables) + list(model.metrics_variables))
        empty = tf.equal(local_rows(data), 0)
        before = [tf.convert_to_tensor(v.value) for v in variables]
        outer = _step.empty, _step.before
        _step.empty, _step.before = empty, {id(v): b for v, b in zip(variables, before, strict=True)}
        try:
            outputs = step(data)
        finally:
            _step.empty, _step.before = outer
        # A synchronized BatchNormalization's moving statistics keep the global batch's update.
        kept = [(v, b) for v, b in zip(variables, before, strict=True) if v not in synced_variables]
        if kept:
            # Ordered after the step's own updates of these variables: TensorFlow runs stateful ops
            # on one variable in program order.
            tf.cond(empty, lambda: _restore(*zip(*kept, strict=True)), tf.no_op)
        return outputs

    return guarded


def _restore(variables: Sequence[Any], values: Sequence[tf.Tensor]) -> tf.Operation:
    return tf.group([v.assign(value) for v, value in zip(variables, values, strict=True)])
