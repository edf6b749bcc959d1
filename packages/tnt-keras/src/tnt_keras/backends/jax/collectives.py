"""tnt-comm's allreduce inside JAX's compiled steps.

Keras-JAX runs each train and test step as one jitted program, so a sum across ranks must be a
call XLA makes from inside that program: an ``io_callback`` into tnt-comm. Every call is *ordered*
(``ordered=True``): JAX threads one token through all ordered effects of a program, so XLA runs them
in the order the step issued them, whatever its scheduler would otherwise choose, and every rank
issues the same calls in the same order (the deadlock of two ranks waiting in two different
collectives cannot happen). One call sums a whole list of arrays (all the gradients of a step),
fused into buckets by tnt-comm's planner (``tnt_comm.plan_buckets``): every bucket starts before
any is waited for.

On CPUs a step's sums take a shorter way where they can: XLA calls tnt-comm itself through the
handler of ``native/`` (an FFI custom call, no Python, the arrays read where they lie). Such calls
carry no JAX effect, so the order is kept by data instead: every call of a step takes the previous
call's ``order`` scalar and hands on its own (``step_order``), so each one depends on the one made
before it. A step uses one way for all its sums: the handler, or where a model's
SyncBatchNormalization sums inside a custom VJP (whose backward pass a data chain of the step cannot
reach), the ordered callbacks.

A tnt-comm error inside a call reaches the step's caller wrapped in JAX's own error, without its
type: it is kept (``take_failure``) so that ``explain_errors`` can raise it as tnt-comm's.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tnt_comm
from jax.experimental import io_callback

from . import native


class _Failure:
    """tnt-comm's last error in a callback, as data. Not thread-local: XLA runs callbacks on threads of
    its own, while the caller waits on another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found: dict[str, Any] | None = None

    def keep(self, found: dict[str, Any]) -> None:
        with self._lock:
            self._found = found

    def take(self) -> dict[str, Any] | None:
        with self._lock:
            found, self._found = self._found, None
            return found


_failure = _Failure()


def take_failure() -> dict[str, Any] | None:
    """tnt-comm's last error in a call of a step (a callback's or the handler's), once."""
    return _failure.take() or native.take_failure()


class _Order(threading.local):
    """The step being traced (or run eagerly) in this thread: which way its sums go, and the order
    scalar of its last call through the handler."""

    active: bool = False
    handler: bool = False
    last: Any = None


_order = _Order()
traced_calls = {"handler": 0, "callback": 0}  # the sums traced inside steps, by way (for tests)


@contextlib.contextmanager
def step_order(handler: bool) -> Iterator[None]:
    """Within: one step's sums, through the handler where ``handler`` and XLA can call it on this
    platform (CPUs), each depending on the one before. A step inside a step keeps the outer one's."""
    if _order.active:
        yield
        return
    _order.active, _order.last = True, None
    _order.handler = handler and jax.default_backend() == "cpu" and native.chosen()
    try:
        yield
    finally:
        _order.active, _order.handler, _order.last = False, False, None


def through_handler() -> bool:
    """Whether the sums of the step being traced go through the handler."""
    return _order.handler


def _sum_on_host(threshold: int, rows: int | None, *arrays: Any) -> list[np.ndarray]:
    try:
        host = [np.asarray(a) for a in arrays]
        if rows is not None:  # scaled by this rank's share, as the handler does (a share of 0: zeros)
            total = int(tnt_comm.allreduce(np.array([rows], np.int64))[0])
            share = np.float32(rows) / np.float32(max(total, 1))
            host = [np.zeros_like(a) if rows == 0 else (a * share).astype(a.dtype) for a in host]
        plan = tnt_comm.plan_buckets([a.size for a in host], [a.dtype for a in host], threshold)
        started = []
        for bucket in plan:
            # One contiguous buffer per bucket: the collective reads it, and writes the sum to its own.
            packed = np.concatenate([host[i].reshape(-1) for i in bucket])
            started.append((bucket, tnt_comm.iallreduce(packed)))
        out: list[np.ndarray] = [np.empty(0)] * len(host)
        for bucket, work in started:
            total, offset = work.wait(), 0
            for i in bucket:
                out[i] = total[offset : offset + host[i].size].reshape(host[i].shape)
                offset += host[i].size
        return out
    except tnt_comm.TntError as error:
        found = tnt_comm.error_data(error)
        if isinstance(found, dict):
            _failure.keep(found)
        raise


def summed(arrays: Sequence[Any], threshold: int = 0, rows: int | None = None) -> list[Any]:
    """``arrays`` summed across ranks (traced inside a step, or eagerly), fused into buckets of at
    least ``threshold`` bytes. With ``rows``, each array is first scaled by this rank's share of the
    global batch, ``rows`` over every rank's, which the same call sums."""
    if not arrays:
        return []
    if not any(isinstance(a, jax.core.Tracer) for a in arrays):
        # Eagerly (outside a compiled step, or a step run eagerly): here and now, once the arrays are
        # computed. A collective dispatched to run later could meet one that tnt makes on this thread.
        return [jnp.asarray(total) for total in _sum_on_host(threshold, rows, *arrays)]
    if _order.active:
        traced_calls["handler" if _order.handler else "callback"] += 1
    if _order.handler:
        return _summed_by_handler(arrays, threshold, -1 if rows is None else rows)
    shapes = [jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in arrays]
    return list(io_callback(functools.partial(_sum_on_host, threshold, rows), shapes, *arrays, ordered=True))


def _summed_by_handler(arrays: Sequence[Any], threshold: int, rows: int) -> list[Any]:
    # The handler sums contiguous runs of its arguments: the planner's buckets, in its order.
    plan = tnt_comm.plan_buckets([int(np.prod(np.shape(a))) for a in arrays], [np.dtype(a.dtype) for a in arrays],
                                 threshold)
    order = [i for bucket in plan for i in bucket]
    ends = np.cumsum([len(bucket) for bucket in plan], dtype=np.int64)
    last = jnp.zeros((), jnp.float32) if _order.last is None else _order.last
    placed = [arrays[i] for i in order]
    results = [jax.ShapeDtypeStruct(last.shape, last.dtype)] + [
        jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in placed
    ]
    outputs = jax.ffi.ffi_call(native.TARGET, results, has_side_effect=True)(
        last, *placed, bucket_ends=ends, rows=np.int64(rows)
    )
    _order.last = outputs[0]
    sums: list[Any] = [None] * len(arrays)
    for i, total in zip(order, outputs[1:], strict=True):
        sums[i] = total
    return sums

