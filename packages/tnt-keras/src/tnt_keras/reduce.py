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
import zlib
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf
import tnt_comm

from . import ops
from .runtime import fusion_threshold_bytes


class StepState(threading.local):
    """This rank's share of the current global batch, while a train step is traced or run.

    The batch sizes are summed by an allreduce started at the top of the step and waited for only
    when the first gradient needs scaling, so it adds no synchronisation point before the forward pass.
    """

    local: tf.Tensor | None = None  # this rank's batch size, float32 of shape [1]
    pending: ops.Pending | None = None  # the allreduce of the batch sizes, in flight
    value: tf.Tensor | None = None  # local / global, once the allreduce is finished

    def fraction(self) -> tf.Tensor | None:
        if self.pending is not None:
            self.value = tf.reshape(self.local / ops.finish(self.pending), [])
            self.pending = None
        return self.value


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


def sum_buckets(tensors: Sequence[Any], buckets: Sequence[Sequence[int]], scale: Any = None) -> list[Any]:
    """Sums ``tensors`` (each times ``scale``, if given) across ranks, one fused collective per
    bucket of indices (all of one dtype); other entries come back unchanged.

    Every bucket starts before any is waited for, so each starts as soon as its tensors exist.
    """
    pending = [(b, ops.start_fused_sum([tensors[i] for i in b], scale)) for b in buckets]
    out = list(tensors)
    for bucket, started in pending:
        for i, summed in zip(bucket, ops.finish_fused(started), strict=True):
            out[i] = summed
    return out


def sum_gradients(grads: Sequence[Any], fraction: Any, threshold: int) -> list[Any]:
    """``sum over ranks of fraction * grad`` for every gradient: dense ones in fused buckets (the
    scaling happens in the copy into the collective's buffer), sparse ones (``tf.IndexedSlices``,
    from embedding lookups) by gathering every rank's rows.

    A rank with an empty slice has ``fraction`` 0 and may have NaN gradients (BatchNormalization
    over no samples, see ``empty_slices.py``): its contribution is 0, never 0 * NaN.
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


def check_optimizer(optimizer: Any) -> None:
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if isinstance(inner, keras.optimizers.Ftrl):
        raise ValueError(
            "tnt: the Ftrl optimizer is not supported: it is made for online learning on one example at a "
            "time, not for data-parallel training on global batches, and tnt does not validate it. Use another "
            "optimizer (Adam, AdamW, SGD, RMSprop, Adagrad, ...)."
        )


def model_optimizers(model: keras.Model) -> list[keras.optimizers.Optimizer]:
    """``model.optimizer`` and any other optimizer the model holds as an attribute (a custom
    ``train_step`` may update parts of the model with optimizers of their own, as GANs do)."""
    found: list[keras.optimizers.Optimizer] = []
    for value in [getattr(model, "optimizer", None), *vars(model).values()]:
        if isinstance(value, keras.optimizers.Optimizer) and all(value is not f for f in found):
            found.append(value)
    return found


def install_gradient_sum(model: keras.Model, size: int) -> None:
    """Wraps ``model.train_step``, and ``apply`` of every optimizer of the model, to sum gradients
    over ranks.

    Idempotent; a recompiled model's new optimizer gets wrapped too. One rank needs neither.
    """
    if size == 1:
        return
    state = model.__dict__.get("_tnt_step_state")
    if state is None:
        state = StepState()
        original_train_step = model.train_step

        def train_step(data: Any) -> Any:
            # The global batch size of this step, for the b_r / B scaling (last batches may be partial).
            leaves = [t for t in tf.nest.flatten(data) if t is not None]
            state.local = tf.cast(tf.reshape(tf.shape(leaves[0])[0], [1]), tf.float32)
            state.pending, state.value = ops.start_allreduce(state.local), None
            try:
                logs = original_train_step(data)
                if state.pending is not None:  # no optimizer step ran: a started collective must still finish
                    with tf.control_dependencies([state.fraction()]):
                        logs = tf.nest.map_structure(tf.identity, logs)
                return logs
            finally:
                state.local = state.pending = state.value = None

        model.train_step = train_step
        model._tnt_step_state = state

    threshold = fusion_threshold_bytes()
    for optimizer in model_optimizers(model):
        check_optimizer(optimizer)
        if not getattr(optimizer, "_tnt_reduced", False):
            _sum_before_apply(optimizer, state, size, threshold)


def _sum_before_apply(optimizer: keras.optimizers.Optimizer, state: StepState, size: int, threshold: int) -> None:
    original_apply = optimizer.apply

    def apply(grads: Sequence[Any], trainable_variables: Any = None) -> Any:
        fraction = state.fraction()
        if fraction is None:  # apply() outside a train step: equal shares
            fraction = tf.constant(1.0 / size)
        return original_apply(sum_gradients(list(grads), fraction, threshold), trainable_variables)

    optimizer.apply = apply
    optimizer._tnt_reduced = True


def unique_variables(variables: Sequence[Any]) -> list[Any]:
    """``variables`` in order, each once (layers and optimizers may share a variable)."""
    return list({id(v): v for v in variables}.values())


def _dtypes_and_sizes(variables: Sequence[Any]) -> tuple[list[tf.DType], list[int]]:
    """The dtype and the size in bytes of each of ``variables``."""
    dtypes = [tf.as_dtype(v.dtype) for v in variables]  # also bfloat16, which numpy cannot name
    return dtypes, [int(np.prod(v.shape)) * d.size for v, d in zip(variables, dtypes, strict=True)]


def _signature(variables: Sequence[Any]) -> np.ndarray:
    """Count, total bytes and a checksum of the shapes and dtypes of ``variables``."""
    dtypes, sizes = _dtypes_and_sizes(variables)
    layout = ";".join(f"{d.name}{tuple(v.shape)}" for v, d in zip(variables, dtypes, strict=True))
    return np.array([len(variables), sum(sizes), zlib.crc32(layout.encode())], dtype=np.int64)


def check_same_variables(variables: Sequence[Any], what: str = "model and optimizer variables") -> None:
    """Raises on every rank, naming a rank that differs, unless all ranks hold variables of the same
    shapes and dtypes (a different model on one rank would otherwise surface as a bare mismatch)."""
    if tnt_comm.size() == 1:
        return
    everyone = tnt_comm.allgather(_signature(variables))  # (ranks, 3)
    differ = [r for r in range(everyone.shape[0]) if (everyone[r] != everyone[0]).any()]
    if differ:
        r = differ[0]
        raise ValueError(
            f"tnt: the ranks hold different {what}: rank 0 has {everyone[0][0]} variables of {everyone[0][1]} bytes, "
            f"rank {r} has {everyone[r][0]} of {everyone[r][1]} bytes (equal counts mean different shapes or dtypes). "
            "Every rank must build the same model and compile it with the same optimizer."
        )


def differing_variables(variables: Sequence[Any]) -> list[bool]:
    """Collective: for each of ``variables`` (the same layout on every rank), whether its value is
    not bitwise equal on all ranks. Compares 64-bit checksums (crc32 and adler32 of the bytes),
    which costs about one copy of the values and one small allgather."""
    sums = np.empty((len(variables), 2), dtype=np.int64)  # tnt_comm has no uint32
    for i, variable in enumerate(variables):
        raw = np.ascontiguousarray(variable.numpy()).reshape(-1).view(np.uint8)
        sums[i] = zlib.crc32(raw), zlib.adler32(raw)
    everyone = tnt_comm.allgather(sums)  # (ranks, variables, 2)
    return [bool(d) for d in np.any(everyone != everyone[0], axis=(0, 2))]


def broadcast_variables(variables: Sequence[Any], root: int = 0, *, checked: bool = False) -> None:
    """Overwrites ``variables`` on every rank with the root's values, in one fused broadcast.

    First makes sure every rank holds the same layout, unless the caller has (``checked``). Only the
    root reads its values and only the others assign: ResNet-50 with SGD's momentum is 189 MB, and
    each copy of it costs a rank ~0.1 s (0.15 s on the root and 0.3-0.4 s on the other of 2 ranks,
    against 0.3-0.9 s on both where every rank read and assigned all).
    """
    if tnt_comm.size() == 1:
        return
    if not checked:
        check_same_variables(variables)
    if not variables:
        return
    dtypes, sizes = _dtypes_and_sizes(variables)
    bounds = np.cumsum([0, *sizes]).tolist()
    payload = np.empty(bounds[-1], np.uint8)
    sending = tnt_comm.rank() == root
    if sending:
        for variable, start, end in zip(variables, bounds[:-1], bounds[1:], strict=True):
            payload[start:end] = np.ascontiguousarray(variable.numpy()).reshape(-1).view(np.uint8)
    tnt_comm.broadcast(payload, root=root)
    if sending:
        return
    for variable, dtype, start, end in zip(variables, dtypes, bounds[:-1], bounds[1:], strict=True):
        variable.assign(payload[start:end].view(dtype.as_numpy_dtype).reshape(tuple(variable.shape)))


def barrier() -> None:
    """Waits for every rank (e.g. for rank 0 to finish writing a file the others will read)."""
    if tnt_comm.size() > 1:
        tnt_comm.barrier()


def model_and_optimizer_variables(model: keras.Model) -> list[Any]:
    variables = list(model.variables)
    for optimizer in model_optimizers(model):
        if getattr(optimizer, "built", False):
            variables += list(optimizer.variables)
    return unique_variables(variables)
