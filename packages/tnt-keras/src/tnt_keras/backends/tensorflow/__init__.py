"""The TensorFlow backend: tnt-keras' TensorFlow op sums gradients inside the traced train step
(``gradients.py``, ``ops/``), ``tf.data`` pipelines are sliced per rank inside the graph (``inputs.py``),
and a step on an empty slice is undone by graph conditionals (``steps.py``). In an elastic job,
arrays are dealt batch by batch in host memory instead (``host_inputs.py``), and a fit's ``tf.data``
pipelines hand over their global batches whole, each sliced as the step draws it, so that a batch
can be dealt again over the ranks left."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import keras
import tensorflow as tf

from .. import host_inputs, reraised, without_xla
from . import gradients, inputs, steps

# Where tnt-keras' TensorFlow op puts tnt-comm's error, as data (ops/tnt_ops.cc: kErrorPayload).
_ERROR_PAYLOAD = "tnt_comm.error"

synced_sum = gradients.synced_sum
reshuffles = host_inputs.reshuffles  # a tf.data pipeline's answer; tnt's slices of arrays do not
order_state = host_inputs.order_state  # a tf.data shuffle's state cannot be read
set_order_state = host_inputs.set_order_state
unshared_order = host_inputs.unshared_order


def prepare() -> None:
    """``Dataset.shuffle`` without a seed takes the seed every rank shares (inputs.py)."""
    inputs.install_shuffle_seed()


def _tnt_comm_error(error: tf.errors.OpError) -> dict[str, Any] | None:
    """tnt-comm's error behind a TensorFlow error, as data, if there is one."""
    payloads = getattr(error, "experimental_payloads", None) or {}
    payload = payloads.get(_ERROR_PAYLOAD.encode(), payloads.get(_ERROR_PAYLOAD))  # bytes in TF 2.21
    if payload is None:
        return None
    found = json.loads(payload.decode() if isinstance(payload, bytes) else payload)
    return found if isinstance(found, dict) else None


@contextlib.contextmanager
def explain_errors(what: str) -> Iterator[None]:
    """Turns tnt-comm's errors inside a Keras loop, which TensorFlow wraps in its own, back into
    tnt_comm's types (PeerFailure, Timeout, CollectiveMismatch) with their data (``ranks``, the
    call) and TensorFlow's error as the cause; a mismatch also says the usual causes."""
    try:
        yield
    except tf.errors.OpError as error:
        found = _tnt_comm_error(error)
        if found is None:
            raise
        raise reraised(what, found) from error


def is_dataset(x: Any) -> bool:
    return isinstance(x, tf.data.Dataset)


def distribute(
    x: Any,
    y: Any,
    sample_weight: Any,
    batch_size: int | None,
    *,
    rank: int,
    size: int,
    shuffle: bool,
    distribute: bool,
    micro_batch_size: int | None,
    what: str,
    redealt: bool = False,
    whole_batches: bool = False,
) -> Any:
    if redealt and _in_host_memory(x, y, sample_weight):
        return host_inputs.distribute(
            x, y, sample_weight, batch_size, rank=rank, size=size, shuffle=shuffle, distribute=distribute,
            micro_batch_size=micro_batch_size, what=what,
        )
    if isinstance(x, tf.data.Dataset):
        if batch_size is not None:
            raise ValueError(
                f"tnt: batch_size={batch_size} was given together with a tf.data.Dataset. Batch the dataset "
                "itself with the GLOBAL batch size (ds.batch(B)) and leave batch_size unset."
            )
        if y is not None or sample_weight is not None:
            raise ValueError("tnt: with a tf.data.Dataset, y and sample_weight come from the dataset")
    elif inputs.is_array_like(x):
        if micro_batch_size is not None:
            batch_size = micro_batch_size * size
            micro_batch_size = None
        x = inputs.arrays_to_dataset(x, y, sample_weight, batch_size, shuffle)
    else:
        raise TypeError(
            f"tnt: {what} takes a tf.data.Dataset batched with the global batch size, or numpy arrays with "
            f"batch_size; got {type(x).__name__}. Wrap generators with tf.data.Dataset.from_generator."
        )
    return inputs.prepare(x, rank, size, distribute=distribute, micro_batch_size=micro_batch_size, what=what,
                          whole_batches=whole_batches)


def drawn_slicer(ds: Any) -> Callable[[Any, int, int], Any] | None:
    """``inputs.slice_of`` where ``ds`` is a pipeline handed over with its global batches whole."""
    return inputs.slice_of if isinstance(ds, tf.data.Dataset) and ds in inputs.whole else None


def _in_host_memory(*parts: Any) -> bool:
    """Arrays (numpy, lists, dicts of them) that no TensorFlow tensor is among."""
    leaves = [leaf for leaf in tf.nest.flatten(parts) if leaf is not None]
    return bool(leaves) and inputs.is_array_like(parts[0]) and not any(tf.is_tensor(leaf) for leaf in leaves)


def global_batch_size(ds: Any) -> int | None:
    if not isinstance(ds, tf.data.Dataset):
        return host_inputs.global_batch_size(ds)
    if ds in inputs.whole:
        return inputs.static_batch_size(ds)
    return inputs.static_batch_size(ds._input_dataset) if hasattr(ds, "_input_dataset") else None


def build(model: keras.Model, ds: Any) -> None:
    if not isinstance(ds, tf.data.Dataset):
        host_inputs.build(model, ds)
        return
    model._symbolic_build(data_batch=ds.element_spec)


def build_for_predict(model: keras.Model, ds: Any) -> None:
    """Creates the variables of a model that is not built yet from the dataset's shapes, as Keras'
    ``_symbolic_build`` does, but without compiling or building an optimizer."""
    if not isinstance(ds, tf.data.Dataset):
        host_inputs.build_for_predict(model, ds)
        return
    if all(layer.built for layer in model._flatten_layers()):
        return
    from keras.src import backend as keras_backend

    x, _, _ = keras.utils.unpack_x_y_sample_weight(ds.element_spec)
    symbolic = tf.nest.map_structure(lambda s: keras.KerasTensor(s.shape, keras.backend.standardize_dtype(s.dtype)), x)
    keras_backend.compute_output_spec(model, symbolic, training=False)


def install_hooks(model: keras.Model, size: int) -> None:
    gradients.install_gradient_sum(model, size)
    steps.install(model, size)


def summed_values(variables: list[Any]) -> list[Any]:
    """The values of ``variables`` (metric states) summed over ranks, one fused collective per dtype;
    a rank whose slice of this step is empty adds the values from before the step."""
    values = steps.contributed(variables)
    by_dtype: dict[tf.DType, list[int]] = {}
    for i, value in enumerate(values):
        by_dtype.setdefault(value.dtype, []).append(i)
    return gradients.sum_buckets(values, list(by_dtype.values()))


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


update_at_step_end = gradients.update_at_step_end


def forget_collectives(model: keras.Model) -> None:
    """Nothing to drop: the step's calls name the world, which is the new one, and are traced again."""
