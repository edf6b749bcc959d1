"""The JAX backend: Keras-JAX compiles every train and test step, so tnt's collectives are ordered
callbacks into tnt-comm inside that program (``collectives.py``). Gradients are summed before the
optimizer applies them (``gradients.py``), inputs held in host memory are sliced per rank before
Keras sees them (``host_inputs.py``, shared with torch), and a step on an empty slice hands its state
back untouched (``steps.py``). Neither TensorFlow nor torch is imported."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import jax
import keras
import tnt_comm
from jax._src import dispatch  # the runtime tokens of ordered effects (_forget_failed_effects)

from .. import explain_python_errors, host_inputs, reraised
from . import collectives, gradients, redo, steps

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
global_batch_size = host_inputs.global_batch_size
build = host_inputs.build
drawn_slicer = host_inputs.drawn_slicer
reshuffles = host_inputs.reshuffles
order_state = host_inputs.order_state
set_order_state = host_inputs.set_order_state
unshared_order = host_inputs.unshared_order
build_for_predict = host_inputs.build_for_predict
pure_train_function = redo.pure_train_function


def prepare() -> None:
    """Nothing of JAX's to change when tnt_keras is imported."""


def is_dataset(x: Any) -> bool:
    return isinstance(x, keras.utils.PyDataset) or host_inputs.is_tf_dataset(x) or host_inputs.is_generator(x)


# Arrays and PyDatasets are sliced in host memory as on torch; jax.Arrays are kept as they are.
distribute = functools.partial(host_inputs.distribute, native_arrays=(jax.Array,))


@contextlib.contextmanager
def explain_errors(what: str) -> Iterator[None]:
    """tnt-comm's errors inside a compiled step reach the user as tnt-comm's types (JAX wraps what a
    callback raises in an error of its own); those raised in Python as on torch."""
    collectives.take_failure()  # a failure of an earlier call was explained then
    try:
        with explain_python_errors(what):
            yield
    except tnt_comm.TntError:
        raise
    except Exception as error:
        found = collectives.take_failure()
        if found is None:
            raise
        _forget_failed_effects()
        raise reraised(what, found) from error


def _forget_failed_effects() -> None:
    """JAX keeps the token of the last program with ordered effects (the callbacks of a step) that
    ran, and waits on it as the process exits: where that program failed, it printed the failure
    again there, as an error, in a job that went on and succeeded (elastic). The failure is
    explained now; the tokens of programs that ran are waited for, and the failed one forgotten."""
    tokens = getattr(dispatch, "runtime_tokens", None)
    if tokens is None:  # another JAX: nothing kept where this one keeps it
        return
    with contextlib.suppress(Exception):
        tokens.block_until_ready()
    tokens.clear()


def install_hooks(model: keras.Model, size: int) -> None:
    gradients.install_gradient_sum(model, size)
    steps.install(model, size)


def predicted_outputs(returned: Any) -> Any:
    """Keras-JAX's predict function returns ``(outputs, state)``."""
    return returned[0]


def jit_compile(asked: Any) -> Any:
    """Keras' own choice: every step is one XLA program (``auto``), the collectives ordered callbacks
    inside it; False runs the steps eagerly, the callbacks called as they come."""
    return asked


# Each step is waited for where steps are redone (redo.py): by default an elastic fit redoes the epoch.
waits_for_redoable_steps = True


def update_at_step_end(model: keras.Model) -> bool:  # noqa: ARG001
    """A step is a pure function of its state, which an elastic fit's train function does not donate
    (``pure_train_function``): a step that fails changes nothing, with no update to hold back."""
    return True


def forget_collectives(model: keras.Model) -> None:
    """Nothing to drop: the step's calls name the world, which is the new one, and are traced again."""
