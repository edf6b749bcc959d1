"""A step on a rank whose slice of the global batch is empty changes nothing there (JAX backend).

Such a rank still runs the step, since every rank must issue the same collectives in the same
order, but a forward pass over no rows computes NaN in places (BatchNormalization's moments of
nothing, a loss that is a mean over nothing). Keras-JAX's steps are pure functions of their state,
traced once per shape, so an empty slice is known when the step is traced: its gradients enter the
sum as zeros (``gradients.py``), its metric states enter the global sums with their values from
before the step (``contributed``), and the step hands back its non-trainable variables and metric
states as they came in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import keras

from ...sync_batch_norm import has_synchronized, synced_variables
from .. import guard_steps
from ..host_inputs import local_rows
from . import collectives


class _Step(threading.local):
    before: dict[int, Any] | None = None  # on an empty slice: id(metric variable) -> its value before the step


_step = _Step()


def contributed(variables: Sequence[Any]) -> list[Any]:
    """The values of ``variables`` (metric states) that this rank adds to global sums: as they are,
    or, within a step on an empty slice, as they were at the top of that step."""
    before = _step.before or {}
    return [before.get(id(v), v.value) for v in variables]


def summed_values(variables: Sequence[Any]) -> list[Any]:
    """The values of ``variables`` summed over ranks, in one ordered collective."""
    return collectives.summed(contributed(variables))


def install(model: keras.Model, size: int) -> None:
    """Wraps ``model``'s train and test steps (idempotent; one rank needs nothing)."""
    guard_steps(model, size, _guarded)


def _guarded(model: keras.Model, step: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def guarded(state: Any, data: Any) -> Any:
        # A model with synchronized BatchNormalization sums inside custom VJPs: ordered callbacks.
        with collectives.step_order(handler=not has_synchronized(model)):
            return _step_or_nothing(state, data)

    def _step_or_nothing(state: Any, data: Any) -> Any:
        if local_rows(data) > 0:
            return step(state, data)
        # Keras-JAX's states: (trainable, non_trainable, optimizer, metrics) for a train step,
        # (trainable, non_trainable, metrics) for a test step.
        non_trainable, metrics = state[1], state[-1]
        outer = _step.before
        _step.before = {id(v): value for v, value in zip(model.metrics_variables, metrics, strict=True)}
        # Keras' losses over no rows are empty arrays, and jax.grad needs a scalar: their sum, 0.
        compute_loss = model.compute_loss

        def scalar_loss(*args: Any, **kwargs: Any) -> Any:
            loss = compute_loss(*args, **kwargs)
            return loss.sum() if getattr(loss, "ndim", 0) else loss

        model.compute_loss = scalar_loss
        try:
            logs, new_state = step(state, data)
        finally:
            del model.compute_loss
            _step.before = outer
        # A synchronized BatchNormalization's moving statistics keep the global batch's update.
        kept = [
            new if v in synced_variables else old
            for v, old, new in zip(model.non_trainable_variables, non_trainable, new_state[1], strict=True)
        ]
        new_state = (new_state[0], kept, *new_state[2:-1], metrics)
        return logs, new_state

    return guarded
