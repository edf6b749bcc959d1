"""The torch backend: Keras runs every step eagerly, so tnt's hooks are Python around it. Gradients
are summed by autograd hooks as backward produces them (``gradients.py``), inputs are sliced per
rank before Keras sees them (``inputs.py``), and a step on an empty slice is undone (``steps.py``).
Tensors on CUDA devices are summed through pinned host memory."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from .. import explain_python_errors as explain_errors
from . import gradients, steps
from .inputs import ArraySlices, distribute, is_dataset

__all__ = [
    "build",
    "build_for_predict",
    "distribute",
    "explain_errors",
    "global_batch_size",
    "install_hooks",
    "is_dataset",
    "summed_values",
]

summed_values = steps.summed_values


def prepare() -> None:
    """Nothing of torch's to change when tnt_keras is imported."""


def _first_batch(ds: Any, drawn: bool = True) -> Any:
    """The first batch of ``ds``, for building a model from its shapes. A tf.data pipeline's is
    ``drawn`` from a pass of its own, as Keras-torch's ``fit`` and ``evaluate`` build an unbuilt
    model (TensorFlow's read the element_spec instead): a pipeline that reshuffles each pass then
    trains its first epoch on its second order under tnt as in serial Keras-torch. Its predict
    builds on the first batch it predicts: no pass of its own, the element_spec."""
    if isinstance(ds, keras.utils.PyDataset):
        return ds[0]
    if hasattr(ds, "element_spec"):  # tf.data
        return keras.tree.map_structure(np.asarray, next(iter(ds))) if drawn else ds.element_spec
    return next(iter(ds))


def global_batch_size(ds: Any) -> int | None:
    """The global batch size where the input states it (arrays with batch_size), else None."""
    return ds.batch_size if isinstance(ds, ArraySlices) else None


def build(model: keras.Model, ds: Any) -> None:
    model._symbolic_build(data_batch=_first_batch(ds))


def build_for_predict(model: keras.Model, ds: Any) -> None:
    """Creates the variables of a model that is not built yet from the first batch's shapes, without
    compiling or building an optimizer."""
    if all(layer.built for layer in model._flatten_layers()):
        return
    from keras.src import backend as keras_backend

    x, _, _ = keras.utils.unpack_x_y_sample_weight(_first_batch(ds, drawn=False))
    symbolic = keras.tree.map_structure(
        lambda a: None if a is None else keras.KerasTensor(a.shape, keras.backend.standardize_dtype(a.dtype)), x
    )
    keras_backend.compute_output_spec(model, symbolic, training=False)


def install_hooks(model: keras.Model, size: int) -> None:
    gradients.install_gradient_sum(model, size)
    steps.install(model, size)
