"""A step on a rank whose slice of the global batch is empty changes nothing there (torch backend).

Such a rank still runs the step, since every rank must issue the same collectives in the same
order, but a forward pass over no rows computes NaN in places (BatchNormalization's moments of
nothing, a loss that is a mean over nothing). So, for that step only: its gradients enter the sum
scaled by its share, 0, which makes NaN 0 (``gradients.py``); its metric states enter the global
sums with their values from before the step (``contributed``); and afterwards its non-trainable
variables and metric states take those values back. Steps run eagerly here, so the guard is plain
Python around the step (the TensorFlow backend needs graph conditionals for the same).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tnt_comm
import torch

from ...sync_batch_norm import synced_variables
from ...variables import unique_variables
from .. import guard_steps
from ..host_inputs import local_rows


class _Step(threading.local):
    before: dict[int, torch.Tensor] | None = None  # on an empty slice: id(variable) -> its value before the step


_step = _Step()


def contributed(variables: Sequence[Any]) -> list[torch.Tensor]:
    """The values of ``variables`` (metric states) that this rank adds to global sums: as they are,
    or, within a step on an empty slice, as they were at the top of that step."""
    before = _step.before or {}
    return [before.get(id(v), v.value) for v in variables]


def summed_values(variables: Sequence[Any]) -> list[torch.Tensor]:
    """The values of ``variables`` summed over ranks: one allreduce per dtype, through the host."""
    values = [v.detach().to("cpu") for v in contributed(variables)]
    summed: list[torch.Tensor | None] = [None] * len(values)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, value in enumerate(values):
        by_dtype.setdefault(value.dtype, []).append(i)
    for indices in by_dtype.values():
        flat = torch.cat([values[i].reshape(-1) for i in indices]).numpy()
        total = torch.from_numpy(tnt_comm.allreduce(np.ascontiguousarray(flat)))
        offset = 0
        for i in indices:
            count = values[i].numel()
            device = variables[i].value.device
            summed[i] = total[offset : offset + count].reshape(values[i].shape).to(device)
            offset += count
    return summed  # type: ignore[return-value]


def install(model: keras.Model, size: int) -> None:
    """Wraps ``model``'s train and test steps (idempotent; one rank needs nothing)."""
    guard_steps(model, size, _guarded)


def _guarded(model: keras.Model, step: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def guarded(data: Any) -> Any:
        if local_rows(data) > 0:
            return step(data)
        variables = unique_variables(list(model.non_trainable_variables) + list(model.metrics_variables))
        before = {id(v): v.value.detach().clone() for v in variables}
        outer = _step.before
        _step.before = before
        # Keras' losses over no rows are empty tensors, and backward needs a scalar: their sum, 0.
        compute_loss = model.compute_loss

        def scalar_loss(*args: Any, **kwargs: Any) -> Any:
            loss = compute_loss(*args, **kwargs)
            return loss.sum() if isinstance(loss, torch.Tensor) and loss.ndim else loss

        model.compute_loss = scalar_loss
        try:
            return step(data)
        finally:
            del model.compute_loss
            _step.before = outer
            for v in variables:
                if v not in synced_variables:  # a synchronized BatchNormalization keeps the global update
                    v.assign(before[id(v)])

    return guarded
