"""Batch normalization over the whole global batch, on every backend.

A plain ``BatchNormalization`` normalises each rank's slice with that slice's moments, so a model
with it trains on N ranks differently from serial training (docs/datasets.md). ``SyncBatchNormalization``
computes the moments of the global batch: every rank's sum and count per channel are summed over the
ranks, then the sum of squared deviations from the global mean (two passes, as Keras' own moments,
so that the variance is as exact as serial training's). The sums are differentiable
(``backends.current().synced_sum``): the gradient through the statistics is the global batch's, so
a model built with it trains on N ranks as the same model with ``BatchNormalization`` trains
serially. On one rank it is ``BatchNormalization``. Its moving statistics come from the global
moments, so they are the same on every rank, a rank with an empty slice included.

On TensorFlow, Keras' ``BatchNormalization(synchronized=True)`` in a ``tnt.Model`` gets the same
moments (``synchronize_batch_norms``): Keras would otherwise reduce them over a ``tf.distribute``
strategy's replicas, which a tnt rank has one of.
"""

from __future__ import annotations

import weakref
from typing import Any

import keras
from keras import ops

from . import backends, runtime, state


class _SyncedVariables:
    """The moving statistics of synchronized layers: a step on an empty slice keeps their update (it
    is the global batch's) where it takes back the other non-trainable variables (backends'
    steps.py). Keras variables cannot be hashed: they are found by identity, through their layer,
    which is held weakly."""

    def __init__(self) -> None:
        self._layers: dict[int, weakref.ref[Any]] = {}  # id(variable) -> its layer

    def add(self, layer: keras.layers.BatchNormalization) -> None:
        for variable in (layer.moving_mean, layer.moving_variance):
            self._layers[id(variable)] = weakref.ref(layer)

    def __contains__(self, variable: Any) -> bool:
        found = self._layers.get(id(variable))
        layer = found() if found is not None else None
        return layer is not None and any(variable is v for v in (layer.moving_mean, layer.moving_variance))


synced_variables = _SyncedVariables()


def global_moments(inputs: Any, mask: Any, axes: list[int]) -> tuple[Any, Any]:
    """The mean and (biased) variance over ``axes`` of every rank's ``inputs`` together; where
    ``mask`` is given, over the entries it keeps."""
    synced_sum = backends.current().synced_sum
    if mask is None:
        weights = ops.ones_like(inputs)
    else:
        weights = ops.cast(ops.broadcast_to(ops.expand_dims(mask, axis=-1), ops.shape(inputs)), inputs.dtype)
    local_sum = ops.sum(inputs * weights, axis=axes)
    local_count = ops.sum(weights, axis=axes)
    channels = ops.shape(local_sum)[0]
    totals = synced_sum(ops.concatenate([local_sum, local_count]))
    count = totals[channels:]
    mean = totals[:channels] / count
    shape = [1] * len(inputs.shape)
    for axis in range(len(inputs.shape)):
        if axis not in axes:
            shape[axis] = inputs.shape[axis]
    deviations = ops.sum(ops.square(inputs - ops.reshape(mean, shape)) * weights, axis=axes)
    variance = synced_sum(deviations) / count
    return mean, variance


@keras.saving.register_keras_serializable(package="tnt")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` whose batch statistics are those of the whole global
    batch, summed over every rank's slice (empty slices included), with gradients through them: a
    model built with it trains on N ranks exactly as the same model with ``BatchNormalization``
    trains serially. It takes BatchNormalization's arguments; on one rank it is BatchNormalization.
    Keras' ``synchronized`` argument is not needed (and ignored): it always is."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.pop("synchronized", None)
        super().__init__(**kwargs)

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        if runtime.get_size() == 1:
            return super()._moments(inputs, mask)
        synced_variables.add(self)
        return global_moments(inputs, mask, self._reduction_axes)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.pop("synchronized", None)  # loadable on every backend, where Keras refuses it
        return config


def is_synchronized(layer: keras.layers.BatchNormalization) -> bool:
    """Whether ``layer`` normalises over the global batch (no warning about small slices then)."""
    return isinstance(layer, SyncBatchNormalization) or bool(getattr(layer, "synchronized", False))


def has_synchronized(model: keras.Model) -> bool:
    """Whether any layer of ``model``, nested ones included, normalises over the global batch."""
    return any(
        isinstance(layer, keras.layers.BatchNormalization) and is_synchronized(layer)
        for layer in model._flatten_layers(include_self=False, recursive=True)
    )


def synchronize_batch_norms(model: keras.Model, size: int) -> None:
    """Gives every ``BatchNormalization(synchronized=True)`` of ``model`` the global batch's moments
    (only TensorFlow lets Keras build one); idempotent, nothing on one rank."""
    if size == 1:
        return
    for layer in model._flatten_layers():
        if type(layer) is keras.layers.BatchNormalization and layer.synchronized and layer not in _synchronized:
            layer._moments = _synchronized_moments(layer)
            _synchronized.add(layer)


def _synchronized_moments(layer: keras.layers.BatchNormalization) -> Any:
    def moments(inputs: Any, mask: Any) -> tuple[Any, Any]:
        synced_variables.add(layer)
        return global_moments(inputs, mask, layer._reduction_axes)

    return moments


_synchronized = state.Marked()
