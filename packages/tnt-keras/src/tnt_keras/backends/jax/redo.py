"""The train function of an elastic fit that redoes lost steps, on Keras-JAX (``step_redo.py``).

Keras-JAX's train step is already a pure function of its state: ``(logs, state) = step(state,
data)``. Keras compiles it with its state *donated* (the step may write the new state over the old
one's buffers), so a step that fails leaves no state to run it again from. Here the step is compiled
without donation: a step that fails leaves the state it was handed as it was, on every rank, and
running the step again needs no copy of anything. The price is that the old and the new state are
both held while a step runs (the model's and the optimizer's variables twice, instead of once).

The function also returns the step's global metric states (the sums its logs were computed from,
``metrics.TracedSums``) and returns only once the step has run: JAX would otherwise hand back
before the step's collectives, and a lost rank would surface in a later step or a callback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import keras

from ... import metrics
from ... import state as model_state


def pure_train_function(model: keras.Model) -> Callable[[Any, Any], tuple[Any, Any, list[Any] | None]]:
    """``(logs, state, sums) = train(state, data)``, for one global batch's slice ``data`` as
    Keras-JAX's epoch iterator gives it: the model's train step (tnt's wrappers included), compiled
    as Keras compiles it but keeping ``state``; ``sums`` are the global metric states in the order
    of ``model.metrics_variables``, or None where the step did not sum them all."""
    step = model.train_step  # as tnt wrapped it: the gradient sum, the empty-slice guard
    how = (step, model.run_eagerly, model.jit_compile)
    made = model_state.of(model).pure_train
    if made is not None and made[1] == how:  # compiled once, kept for every attempt of every fit
        return made[0]
    sums = metrics.TracedSums()

    def kept_step(state: Any, data: Any) -> tuple[Any, Any, list[Any] | None]:
        with sums.keeping():
            logs, new_state = step(state, data)
        # Asked here, as the step is traced: the compiled metrics have their variables by then.
        return logs, new_state, sums.values(list(model.metrics_variables))

    compiled = kept_step if model.run_eagerly or not model.jit_compile else jax.jit(kept_step)

    def train(state: Any, data: Any) -> tuple[Any, Any, list[Any] | None]:
        return jax.block_until_ready(compiled(state, data))

    model_state.of(model).pure_train = (train, how)
    return train
