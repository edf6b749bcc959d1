"""Sums gradients across ranks inside the training step, and broadcasts variables from rank 0.

The model's optimizer gets its ``apply`` replaced on the instance: every gradient is scaled by this
rank's share of the global batch, ``b_r / B``, summed across ranks, and handed to the original
``apply``. Clipping, loss scaling, weight decay and schedules therefore see the gradient of the global
batch, exactly as in serial training (a plain 1/N average is wrong for uneven or partial batches).
Buckets of gradients start last layers first, each as soon as its gradients exist, so communication
overlaps the rest of backprop.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf
import tnt_comm

from ... import state as model_state
from ...runtime import fusion_threshold_bytes
from ...variables import check_optimizer, model_optimizers
from . import ops


class StepState(threading.local):
    """This rank's share of the current global batch, while a train step is traced or run.

    The batch sizes are summed by an allreduce started at the top of the step and waited for only
    when the first gradient needs scaling, so it adds no synchronisation point before the forward pass.
    """

    local: tf.Tensor | None = None  # this rank's batch size, float32 of shape [1]
    pending: ops.Pending | None = None  # the allreduce of the batch sizes, in flight
    value: tf.Tensor | None = None  # local / global, once the allreduce is finished
    # The updates held back to the step's end (apply, summed gradients, variables), where they are.
    held: list[tuple[Any, list[Any], Any]] | None = None
    updating = False  # a held update runs: an inner optimizer's apply gets sums already

    def fraction(self) -> tf.Tensor | None:
        if self.pending is not None:
            self.value = tf.reshape(self.local / ops.finish(self.pending), [])
            self.pending = None
        return self.value


_active: list[StepState] = []  # the train steps being traced


def synced_sum(x: Any) -> tf.Tensor:
    """``x`` summed over ranks, differentiably: backward, the cotangents are summed weighted by each
    rank's share of the global batch and divided by this rank's (the gradient sum multiplies it back),
    so the gradient through the sum is the global batch's (``sync_batch_norm.py``). A rank with an
    empty slice adds nothing (its cotangent may be NaN) and gets zeros."""

    @tf.custom_gradient
    def summed(x: tf.Tensor) -> Any:
        def backward(cotangent: tf.Tensor) -> tf.Tensor:
            fraction = _active[-1].fraction() if _active else None
            if fraction is None:  # outside a train step: equal shares
                return ops.allreduce(cotangent)
            fraction = tf.cast(fraction, cotangent.dtype)
            weighted = tf.where(fraction > 0, cotangent * fraction, tf.zeros_like(cotangent))
            return tf.math.divide_no_nan(ops.allreduce(weighted), fraction)

        return ops.allreduce(x), backward

    return summed(tf.convert_to_tensor(x))


def plan_buckets(grads: Sequence[Any], threshold: int) -> list[list[int]]:
    """Groups gradient indices into buckets, last gradients first (backprop makes them first), each
    of one dtype and at least ``threshold`` bytes (the last one may be smaller); 0 puts every
    gradient alone. tnt-comm's planner (``tnt_comm.plan_buckets``) decides; a gradient of unknown
    size counts as a whole bucket."""
    order = [i for i in reversed(range(len(grads))) if grads[i] is not None]
    counts = []
    for i in order:
        g = grads[i]
        if g.shape.is_fully_defined():
            counts.append(int(np.prod(g.shape.as_list() or [1])))
        else:
            counts.append(max(1, -(-threshold // g.dtype.size)))
    dtypes = [grads[i].dtype.as_numpy_dtype for i in order]
    return [[order[j] for j in bucket] for bucket in tnt_comm.plan_buckets(counts, dtypes, threshold)]


def packs_buckets() -> bool:
    """Whether buckets are packed into one tensor before the op: where this process sees a GPU. The
    op has CPU kernels only, so TensorFlow copies each of its inputs to the host and each output back;
    one tensor per bucket, built (and scaled) where the gradients are, makes that one copy each way
    per bucket instead of one per gradient. On CPUs the op packs into the collective's buffer itself,
    which saves the extra pass."""
    return bool(tf.config.list_logical_devices("GPU"))


def sum_buckets(
    tensors: Sequence[Any], buckets: Sequence[Sequence[int]], scale: Any = None, pack: bool | None = None
) -> list[Any]:
    """Sums ``tensors`` (each times ``scale``, if given) across ranks, one fused collective per
    bucket of indices (all of one dtype); other entries come back unchanged. ``pack`` (default:
    ``packs_buckets()``) first concatenates each bucket into one tensor.

    Every bucket starts before any is waited for, so each starts as soon as its tensors exist.
    """
    if pack is None:
        pack = packs_buckets()
    pending = [(b, _start(tensors, b, scale, pack)) for b in buckets]
    out = list(tensors)
    for bucket, (started, shapes) in pending:
        summed = ops.finish_fused(started)
        if shapes is not None:  # packed: the one sum, cut back into the bucket's tensors
            sizes = [int(np.prod(shape)) for shape in shapes]
            summed = [tf.reshape(part, shape) for part, shape in zip(tf.split(summed[0], sizes), shapes, strict=True)]
        for i, result in zip(bucket, summed, strict=True):
            out[i] = result
    return out


def _start(tensors: Sequence[Any], bucket: Sequence[int], scale: Any, pack: bool) -> tuple[ops.FusedPending, Any]:
    chosen = [tf.convert_to_tensor(tensors[i]) for i in bucket]
    if not pack or not all(t.shape.is_fully_defined() for t in chosen):
        return ops.start_fused_sum(chosen, scale), None
    parts = [tf.reshape(t if scale is None else ops.scaled(t, scale), [-1]) for t in chosen]
    return ops.start_fused_sum([tf.concat(parts, axis=0)]), [t.shape for t in chosen]


def sum_gradients(grads: Sequence[Any], fraction: Any, threshold: int) -> list[Any]:
    """``sum over ranks of fraction * grad`` for every gradient: dense ones in fused buckets (the
    scaling happens in the copy into the collective's buffer), sparse ones (``tf.IndexedSlices``,
    from embedding lookups) by gathering every rank's rows.

    A rank with an empty slice has ``fraction`` 0 and may have NaN gradients (BatchNormalization
    over no samples, see ``steps.py``): its contribution is 0, never 0 * NaN.
    """
    dense = [None if isinstance(g, tf.IndexedSlices) or g is None else tf.convert_to_tensor(g) for g in grads]
    summed = sum_buckets(dense, plan_buckets(dense, threshold), fraction)
    return [
        _gather_rows(g, fraction) if isinstance(g, tf.IndexedSlices) else d for g, d in zip(grads, summed, strict=True)
    ]


def _gather_rows(grad: tf.IndexedSlices, fraction: Any) -> tf.IndexedSlices:
    """The sparse gradient of the global batch, with the rows serial training's gradient has.

    Keras' optimizers update only the rows a sparse gradient names (other rows keep their moments),
    and apply each listed row on its own, duplicates included. So a dense sum, or merging rows
    serial training would keep apart, changes training. A gather's gradient (``Embedding``) lists
    one row per lookup: every rank's rows are concatenated in rank order. A gradient whose rows
    went through ``tf.unique`` (``embedding_lookup_sparse``, which Keras uses for sparse inputs)
    lists each row once: the concatenation is merged the same way.
    """
    values = ops.allgatherv(ops.scaled(grad.values, fraction))
    indices = ops.allgatherv(grad.indices)
    if _from_unique(grad.indices):
        indices, position = tf.unique(indices)
        values = tf.math.unsorted_segment_sum(values, position, tf.size(indices))
    return tf.IndexedSlices(values, indices, grad.dense_shape)


_UNIQUE_OPS = frozenset({"Unique", "UniqueV2", "UniqueWithCounts", "UniqueWithCountsV2"})
_PASS_THROUGH_OPS = frozenset({"Reshape", "Identity", "Cast", "Squeeze", "ExpandDims"})


def _from_unique(indices: Any, depth: int = 0) -> bool:
    """Whether traced ``indices`` come from a ``tf.unique`` (through reshapes); False when eager."""
    op = getattr(indices, "op", None)
    if op is None or depth > 8:
        return False
    if op.type in _UNIQUE_OPS:
        return True
    return op.type in _PASS_THROUGH_OPS and bool(op.inputs) and _from_unique(op.inputs[0], depth + 1)


def install_gradient_sum(model: keras.Model, size: int) -> None:
    """Wraps ``model.train_step``, and ``apply`` of every optimizer of the model, to sum gradients
    over ranks.

    Idempotent; a recompiled model's new optimizer gets wrapped too. One rank needs neither.
    """
    if size == 1:
        return
    state = model_state.of(model).step_state
    if state is None:
        state = StepState()
        original_train_step = model.train_step

        def train_step(data: Any) -> Any:
            # The global batch size of this step, for the b_r / B scaling (last batches may be partial).
            leaves = [t for t in tf.nest.flatten(data) if t is not None]
            state.local = tf.cast(tf.reshape(tf.shape(leaves[0])[0], [1]), tf.float32)
            state.pending, state.value = ops.start_allreduce(state.local), None
            state.held = [] if model_state.of(model).update_at_step_end else None
            _active.append(state)
            try:
                logs = original_train_step(data)
                if state.pending is not None:  # no optimizer step ran: a started collective must still finish
                    with tf.control_dependencies([state.fraction()]):
                        logs = tf.nest.map_structure(tf.identity, logs)
                if state.held:
                    # After the step's last collective, the metric sum its logs come from: a step that
                    # fails in any collective changes no weight (step_redo.py).
                    with tf.control_dependencies([t for t in tf.nest.flatten(logs) if tf.is_tensor(t)]):
                        _apply_held(state)
                return logs
            finally:
                _active.pop()
                state.local = state.pending = state.value = state.held = None

        model.train_step = train_step
        model_state.of(model).step_state = state

    threshold = fusion_threshold_bytes()
    for optimizer in model_optimizers(model):
        check_optimizer(optimizer)
        if optimizer not in model_state.reduced_optimizers:
            _sum_before_apply(optimizer, state, size, threshold)


def _sum_before_apply(optimizer: keras.optimizers.Optimizer, state: StepState, size: int, threshold: int) -> None:
    original_apply = optimizer.apply

    def apply(grads: Sequence[Any], trainable_variables: Any = None) -> Any:
        if state.updating:  # the held update, reaching a wrapped inner optimizer: summed already
            return original_apply(grads, trainable_variables)
        fraction = state.fraction()
        if fraction is None:  # apply() outside a train step: equal shares
            fraction = tf.constant(1.0 / size)
        summed = sum_gradients(list(grads), fraction, threshold)
        if state.held is not None:  # an elastic fit that redoes lost steps: the update waits
            state.held.append((original_apply, summed, trainable_variables))
            return None
        return original_apply(summed, trainable_variables)

    optimizer.apply = apply
    model_state.reduced_optimizers.add(optimizer)


def _apply_held(state: StepState) -> None:
    held, state.held, state.updating = state.held or [], None, True
    try:
        for original_apply, summed, variables in held:  # in the order the step asked for them
            original_apply(summed, variables)
    finally:
        state.updating = False


def update_at_step_end(model: keras.Model) -> bool:
    """Holds every train step's optimizer update back until the step's metric sum, its last
    collective, is done (in the traced step: control dependencies on the logs). Takes effect where
    the step is traced next."""
    model_state.of(model).update_at_step_end = True
    return True
