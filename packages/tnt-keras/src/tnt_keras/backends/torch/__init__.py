"""The torch backend: Keras runs every step eagerly, so tnt's hooks are Python around it. Gradients
are summed by autograd hooks as backward produces them (``gradients.py``), inputs are sliced per
rank before Keras sees them (``inputs.py``), and a step on an empty slice is undone (``steps.py``).
Tensors on CUDA devices are summed through pinned host memory."""

from __future__ import annotations

from typing import Any

import keras

from .. import explain_python_errors as explain_errors
from .. import host_inputs, without_xla
from . import gradients, steps
from .inputs import distribute, is_dataset, order_state, reshuffles, set_order_state, unshared_order

__all__ = [
    "build",
    "build_for_predict",
    "distribute",
    "drawn_slicer",
    "explain_errors",
    "forget_collectives",
    "global_batch_size",
    "install_hooks",
    "is_dataset",
    "jit_compile",
    "order_state",
    "predicted_outputs",
    "pure_train_function",
    "reshuffles",
    "set_order_state",
    "summed_values",
    "synced_sum",
    "unshared_order",
    "update_at_step_end",
    "waits_for_redoable_steps",
]

summed_values = steps.summed_values
synced_sum = gradients.synced_sum
update_at_step_end = gradients.update_at_step_end


def prepare() -> None:
    """Nothing of torch's to change when tnt_keras is imported."""


global_batch_size = host_inputs.global_batch_size
build = host_inputs.build
drawn_slicer = host_inputs.drawn_slicer
build_for_predict = host_inputs.build_for_predict


def install_hooks(model: keras.Model, size: int) -> None:
    gradients.install_gradient_sum(model, size)
    steps.install(model, size)


def predicted_outputs(returned: Any) -> Any:
    """Keras' predict function returns the outputs alone."""
    return returned


# The held update costs about 1% of a step: an elastic fit redoes the step by default.
waits_for_redoable_steps = False


def pure_train_function(model: keras.Model) -> None:  # noqa: ARG001
    """Keras' train step here changes the model's variables itself: none (``update_at_step_end``)."""
    return None


def jit_compile(asked: Any) -> bool:
    return without_xla(asked)


def forget_collectives(model: keras.Model) -> None:
    gradients.forget_collectives(model)
