"""Allreduce as TensorFlow ops, so communication overlaps with the computation of a step.

``start_allreduce(x)`` hands `x` to tnt_comm's engine and returns at once; ``finish(p)`` is the
tensor that becomes ready when the collective completes. Both work eagerly and inside
``tf.function``. Every rank must start the same collectives in the same order: inside a
``tf.function`` the starts are stateful ops, which TensorFlow runs in program order, so that holds
whenever all ranks run the same program. Finishes may come in any order.

    p1 = start_allreduce(grad1)   # the order of starts is the order of collectives
    p2 = start_allreduce(grad2)
    g2 = finish(p2)               # waits only for what it needs
    g1 = finish(p1)

``start_fused_sum(tensors, scale)`` sums a list of tensors (each times ``scale``) in one collective,
and ``finish_fused`` gives the sums back in the tensors' shapes: gradient fusion without copies
beyond the one into the collective's buffer.

The op (``tnt_ops.cc``) is compiled against the installed TensorFlow on first import, into a cache
shared by all processes of a host (``python -m tnt_keras.backends.tensorflow.ops`` prebuilds it); the compiling process
logs one warning before it starts and an INFO line with the time it took. Without a compiler, or
if that fails, a warning is logged and a ``tf.numpy_function`` fallback does the same, blocking a
thread per call. ``TNT_KERAS_OPS=numpy`` forces the fallback, ``TNT_KERAS_OPS=async-op`` makes a
failed build an error. XLA cannot compile either: steps that use them run with ``jit_compile=False``.
"""

from __future__ import annotations

import functools
import logging
import os
from types import ModuleType

import numpy as np
import tensorflow as tf
import tnt_comm

from . import _build

__all__ = [
    "REDUCTIONS",
    "SUPPORTED_DTYPES",
    "FusedPending",
    "Pending",
    "allgatherv",
    "allreduce",
    "backend",
    "finish",
    "finish_fused",
    "start_allreduce",
    "start_fused_sum",
]

log = logging.getLogger("tnt_keras")

SUPPORTED_DTYPES: tuple[tf.DType, ...] = (
    tf.float16,
    tf.bfloat16,
    tf.float32,
    tf.float64,
    tf.int32,
    tf.int64,
    tf.uint8,
)
REDUCTIONS: tuple[str, ...] = ("sum", "prod", "min", "max", "avg")


class Pending:
    """An allreduce in flight, returned by ``start_allreduce``; ``finish`` it exactly once.

    Its tensors are not for reading: the result is valid only once ``finish`` returns it.
    """

    __slots__ = ("_handle", "_result", "_input", "_finished", "shape", "dtype")

    def __init__(self, handle: tf.Tensor | None, result: tf.Tensor, source: tf.Tensor) -> None:
        self._handle: tf.Tensor | None = handle  # None: the numpy_function fallback, already complete
        self._result: tf.Tensor | None = result
        self._input: tf.Tensor | None = source
        self._finished = False
        self.shape: tf.TensorShape = source.shape
        self.dtype: tf.DType = source.dtype

    def __repr__(self) -> str:
        state = "finished" if self._finished else "pending"
        return f"<Pending allreduce {state} shape={self.shape} dtype={self.dtype.name}>"


class FusedPending:
    """A fused sum in flight, returned by ``start_fused_sum``; ``finish_fused`` it exactly once."""

    __slots__ = ("_handle", "_result", "_shapes", "_finished")

    def __init__(self, handle: tf.Tensor | None, result: tf.Tensor | list[tf.Tensor], shapes: list[tf.TensorShape]):
        self._handle = handle  # None: the numpy_function fallback, whose ``_result`` is the list of sums
        self._result: tf.Tensor | list[tf.Tensor] | None = result
        self._shapes = shapes
        self._finished = False

    def __repr__(self) -> str:
        state = "finished" if self._finished else "pending"
        return f"<FusedPending sum of {len(self._shapes)} tensors {state}>"


_loaded: ModuleType | None = None  # the op library, once loaded (loading is once per process)
_lib: ModuleType | None = None  # the op library while the async-op backend is in use
_runtime_started = False


def backend() -> str:
    """Which implementation runs: "async-op" (the compiled op) or "numpy_function" (the fallback)."""
    return "async-op" if _lib is not None else "numpy_function"


def _select(mode: str | None = None) -> None:
    """Picks the backend; `mode` (default $TNT_KERAS_OPS) is auto, async-op or numpy."""
    global _lib, _loaded
    mode = (os.environ.get("TNT_KERAS_OPS", "") if mode is None else mode).strip().lower() or "auto"
    if mode in ("numpy", "numpy_function"):
        _lib = None
        return
    if mode not in ("auto", "async-op"):
        log.warning("tnt_keras: ignoring TNT_KERAS_OPS=%r (use auto, async-op or numpy)", mode)
        mode = "auto"
    try:
        if _loaded is None:
            _loaded = _build.load_best()
        _lib = _loaded
    except tnt_comm.TntError:
        raise  # the job itself is broken (e.g. a peer never arrived): a fallback would only hide it
    except Exception as e:
        if mode == "async-op":
            raise
        # A broken build must not stop training: it only costs speed, so warn and go on.
        log.warning(
            "tnt_keras: the TensorFlow allreduce op is unavailable, falling back to tf.numpy_function "
            "(slower: it blocks a thread for every allreduce). Reason: %s",
            e,
        )
        _lib = None


def _start_runtime() -> None:
    """Connects through the Python API on first use, which also registers the finalizer."""
    global _runtime_started
    if not _runtime_started:
        tnt_comm.init()
        _runtime_started = True


def _check(x: tf.Tensor, op: str) -> None:
    _check_dtype(x, "allreduce")
    if op not in REDUCTIONS:
        raise ValueError(f"unknown reduction op {op!r}; use one of {', '.join(REDUCTIONS)}")


def _check_dtype(x: tf.Tensor, what: str) -> None:
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{what} does not support dtype {x.dtype.name}; supported dtypes: "
            f"{', '.join(d.name for d in SUPPORTED_DTYPES)} (cast with tf.cast)"
        )


def _numpy_allreduce(a: np.ndarray, op: str) -> np.ndarray:
    return tnt_comm.allreduce(np.asarray(a, order="C"), op=op)


def start_allreduce(x: tf.Tensor, op: str = "sum") -> Pending:
    """Submits an allreduce of `x` over all ranks (sum, prod, min, max or avg) and returns at once.

    All ranks must start the same allreduces (dtype, shape, op) in the same order; a mismatch or a
    dead peer makes ``finish`` raise a ``tf.errors.OpError`` instead of hanging.
    """
    x = tf.convert_to_tensor(x)
    _check(x, op)
    _start_runtime()
    if _lib is not None:
        result, handle = _lib.tnt_allreduce_start(x, reduction=op)
        return Pending(handle, result, x)
    # Scalars travel as shape (1,): eager numpy_function cannot hand over a 0-d bfloat16 (TF 2.21).
    flat = tf.reshape(x, [1]) if x.shape.rank == 0 else x
    result = tf.numpy_function(
        functools.partial(_numpy_allreduce, op=op), [flat], Tout=x.dtype, stateful=True, name="TntAllreduceNumpy"
    )
    result = tf.reshape(result, []) if x.shape.rank == 0 else result
    result.set_shape(x.shape)
    return Pending(None, result, x)


def finish(p: Pending) -> tf.Tensor:
    """The result of the allreduce `p`, ready when the collective completes.

    With the compiled op no thread waits meanwhile, so finishes may come in any order and
    computation that does not need the result runs on.
    """
    if not isinstance(p, Pending):
        raise TypeError(f"finish() takes the Pending returned by start_allreduce, not {type(p).__name__}")
    if p._finished:
        raise RuntimeError("this allreduce was already finished; call finish() once per start_allreduce()")
    p._finished = True
    handle, result, source = p._handle, p._result, p._input
    p._handle = p._result = p._input = None  # eager tensors: free them as soon as the caller does
    if handle is None:
        return result
    if _loaded is None:  # only a Pending of the op backend has a handle, so the library is loaded
        raise RuntimeError("the allreduce op library is not loaded")
    return _loaded.tnt_allreduce_wait(handle, result, source)


_FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def scaled(x: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
    """``scale * x``, and 0 wherever ``scale`` is 0 even if ``x`` is NaN or infinite (the rule of
    ``start_fused_sum``; ``scale`` is rounded to x's dtype first)."""
    scale = tf.cast(scale, x.dtype)
    if x.dtype in (tf.float16, tf.float32, tf.float64):
        return tf.math.multiply_no_nan(x, scale)
    # multiply_no_nan has no bfloat16 GPU kernel in some TensorFlow builds.
    return tf.where(tf.not_equal(scale, 0), x * scale, tf.zeros_like(x))


def start_fused_sum(tensors: list[tf.Tensor], scale: tf.Tensor | float | None = None) -> FusedPending:
    """Submits one allreduce (sum over ranks) of all ``tensors``, each first multiplied by
    ``scale`` (this rank's weight; 0 contributes zeros even for NaN values), and returns at once.

    The tensors must share one dtype; a scale needs a floating-point dtype. With the compiled op
    the tensors are copied (and scaled) straight into the collective's buffer, and
    ``finish_fused`` returns views into it: one pass over the data besides the collective itself.
    """
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("start_fused_sum needs at least one tensor")
    dtype = tensors[0].dtype
    for t in tensors:
        _check_dtype(t, "start_fused_sum")
        if t.dtype != dtype:
            raise TypeError(f"start_fused_sum sums tensors of one dtype, got {dtype.name} and {t.dtype.name}")
    if scale is not None and dtype not in _FLOATS:
        raise TypeError(f"start_fused_sum: a scale needs floating-point tensors, not {dtype.name}")
    _start_runtime()
    shapes = [t.shape for t in tensors]
    if _lib is not None:
        weight = tf.constant(1.0) if scale is None else tf.reshape(tf.cast(scale, tf.float32), [])
        result, handle = _lib.tnt_fused_sum_start(tensors, weight, scaled=scale is not None)
        return FusedPending(handle, result, shapes)
    parts = [tf.reshape(t if scale is None else scaled(t, scale), [-1]) for t in tensors]
    flat = tf.concat(parts, axis=0)
    summed = tf.numpy_function(
        functools.partial(_numpy_allreduce, op="sum"), [flat], Tout=dtype, stateful=True, name="TntFusedSumNumpy"
    )
    pieces = tf.split(summed, [tf.size(t) for t in tensors])
    return FusedPending(None, [tf.reshape(p, tf.shape(t)) for p, t in zip(pieces, tensors, strict=True)], shapes)


def finish_fused(p: FusedPending) -> list[tf.Tensor]:
    """The sums of a ``start_fused_sum``, in the order and shapes of its tensors."""
    if not isinstance(p, FusedPending):
        raise TypeError(f"finish_fused() takes the FusedPending returned by start_fused_sum, not {type(p).__name__}")
    if p._finished:
        raise RuntimeError("this fused sum was already finished; call finish_fused() once per start_fused_sum()")
    p._finished = True
    handle, result, shapes = p._handle, p._result, p._shapes
    p._handle = p._result = None
    if handle is None:
        assert isinstance(result, list)
        return result
    if _loaded is None:
        raise RuntimeError("the allreduce op library is not loaded")
    return list(_loaded.tnt_fused_sum_wait(handle, result, N=len(shapes), shapes=shapes))


def allgatherv(x: tf.Tensor) -> tf.Tensor:
    """Every rank's `x` concatenated along the first axis, in rank order; the ranks' first
    dimensions may differ. Blocking (through tf.numpy_function): it serves sparse gradients,
    whose row counts are known only at run time. Stateful, so it keeps its place in the order
    of collectives like every start_allreduce."""
    x = tf.convert_to_tensor(x)
    _check_dtype(x, "allgatherv")
    _start_runtime()
    result = tf.numpy_function(
        lambda a: tnt_comm.allgatherv(np.ascontiguousarray(a)), [x], Tout=x.dtype, stateful=True, name="TntAllgatherv"
    )
    result.set_shape([None, *x.shape[1:]])
    return result


def allreduce(x: tf.Tensor, op: str = "sum") -> tf.Tensor:
    """``finish(start_allreduce(x, op))``: the allreduce of `x` over all ranks."""
    return finish(start_allreduce(x, op))


_select()
