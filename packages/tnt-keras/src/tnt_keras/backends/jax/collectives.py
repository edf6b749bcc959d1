"""tnt-comm's allreduce inside JAX's compiled steps.

Keras-JAX runs each train and test step as one jitted program, so a sum across ranks must be a
call XLA makes from inside that program: an ``io_callback`` into tnt-comm. Every call is *ordered*
(``ordered=True``): JAX threads one token through all ordered effects of a program, so XLA runs them
in the order the step issued them, whatever its scheduler would otherwise choose, and every rank
issues the same calls in the same order (the deadlock of two ranks waiting in two different
collectives cannot happen). One call sums a whole list of arrays (all the gradients of a step),
fused into buckets by tnt-comm's planner (``tnt_comm.plan_buckets``): every bucket starts before
any is waited for.

A tnt-comm error inside the callback reaches the step's caller wrapped in JAX's own error, without
its type: it is kept here (``take_failure``) so that ``explain_errors`` can raise it as tnt-comm's.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import tnt_comm
from jax.experimental import io_callback


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
take_failure = _failure.take


def _sum_on_host(threshold: int, *arrays: Any) -> list[np.ndarray]:
    try:
        host = [np.asarray(a) for a in arrays]
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


def summed(arrays: Sequence[Any], threshold: int = 0) -> list[Any]:
    """``arrays`` summed across ranks (traced inside a step, or eagerly), fused into buckets of at
    least ``threshold`` bytes."""
    if not arrays:
        return []
    shapes = [jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in arrays]
    return list(io_callback(functools.partial(_sum_on_host, threshold), shapes, *arrays, ordered=True))

