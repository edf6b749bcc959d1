"""What tnt-keras keeps about the Keras objects it works with, here, instead of attributes stamped on
them: one `ModelState` per model (a wrapper's rank, size and own attributes; which of tnt's hooks a
wrapped model has, so each is installed once), and `Marked`, the objects of one kind that tnt has
already changed (a metric made global, an optimizer whose apply sums gradients). Held weakly: a
model, optimizer or metric that goes takes its entry with it."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class ModelState:
    """tnt-keras' state of one Keras model: a `tnt.Model` wrapper, or the model it wraps."""

    rank: int = 0
    size: int = 1
    local: dict[str, Any] = field(default_factory=dict)
    """A wrapper's own attributes while it wraps no model yet (forwarding.py): `awaiting`,
    `_initial_epoch`; and `bn_warned`."""
    empty_slices_guarded: bool = False
    """Its train and test steps skip nothing on an empty slice (backends.guard_steps)."""
    global_metrics: bool = False
    """Its metrics sum their state over ranks (metrics.install_global_metrics)."""
    step_state: Any = None
    """The TensorFlow or JAX backend's state of its train step (backends/*/gradients.py)."""
    gradient_sum: Any = None
    """The torch backend's gradient sum of it (backends/torch/gradients.py)."""
    update_at_step_end: bool = False
    """Its train steps apply their update after their last collective (step_redo.py)."""
    step_sums: Any = None
    """Where its train steps keep their global metric states (metrics.keep_step_sums)."""
    pure_train: tuple[Any, Any] | None = None
    """The JAX backend's train function for elastic fits that redo steps, and what it was made from
    (the train step, run_eagerly, jit_compile: backends/jax/redo.py), kept for every attempt."""


_models: weakref.WeakKeyDictionary[Any, ModelState] = weakref.WeakKeyDictionary()


def of(model: Any) -> ModelState:
    """The state of `model`, new (rank 0 of 1, no hooks) the first time it is asked for."""
    found = _models.get(model)
    if found is None:
        found = _models[model] = ModelState()
    return found


class Marked:
    """The objects of one kind that tnt has changed once already (weakly held)."""

    def __init__(self) -> None:
        self._objects: weakref.WeakSet[Any] = weakref.WeakSet()

    def __contains__(self, obj: Any) -> bool:
        return obj in self._objects

    def add(self, obj: Any) -> None:
        self._objects.add(obj)


reduced_optimizers = Marked()
"""Optimizers whose `apply` sums gradients over ranks first (either backend)."""
