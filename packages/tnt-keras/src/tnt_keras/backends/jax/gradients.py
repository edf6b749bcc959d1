"""Sums gradients across ranks inside Keras-JAX's compiled train step.

The model's ``train_step(state, data)`` is wrapped: it learns this rank's share of the global batch,
``b_r / B`` (``b_r`` is static inside a traced step, ``B`` the sum of every rank's, one small
collective at the top of the step), and the optimizers' ``stateless_apply`` (which Keras-JAX's
train step calls) is replaced on the instance: every gradient is scaled by that share and
summed across ranks before the original. Clipping, loss scaling, weight decay and
schedules therefore see the gradient of the global batch, exactly as in serial training. A rank with
an empty slice contributes zeros (its gradients of a mean over no rows are NaN).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import keras

from ... import state as model_state
from ...runtime import fusion_threshold_bytes
from ...variables import check_optimizer, model_optimizers
from ..host_inputs import local_rows
from . import collectives


class StepState(threading.local):
    """This rank's part of the global batch of the step being traced (None outside a step): its share
    ``fraction``, or where the step's sums go through the handler, which learns the share itself in
    the gradients' call, its ``rows``."""

    fraction: Any = None
    rows: int | None = None
    empty: bool = False


class _Active(threading.local):
    step: StepState | None = None  # the train step being traced in this thread


_active = _Active()


def active_step() -> StepState | None:
    """The state of the train step being traced, for what else scales by this rank's share
    (``synced_sum``'s gradient); None outside one."""
    return _active.step


def install_gradient_sum(model: keras.Model, size: int) -> None:
    """Wraps ``model.train_step``, and ``stateless_apply`` of every optimizer of the model, to sum gradients
    over ranks (idempotent; a recompiled model's new optimizer gets wrapped too). One rank needs neither."""
    if size == 1:
        return
    mine = model_state.of(model)
    if mine.step_state is None:
        mine.step_state = StepState()
        model.train_step = _with_share(model.train_step, mine.step_state)
    threshold = fusion_threshold_bytes()
    for optimizer in model_optimizers(model):
        check_optimizer(optimizer)
        if optimizer not in model_state.reduced_optimizers:
            _sum_before_apply(optimizer, mine.step_state, size, threshold)


def _with_share(train_step: Callable[[Any, Any], Any], step: StepState) -> Callable[[Any, Any], Any]:
    def shared_train_step(state: Any, data: Any) -> Any:
        local = local_rows(data)
        if collectives.through_handler():
            step.rows = local  # the gradients' call sums the row counts too
        else:
            (total,) = collectives.summed([jnp.full((1,), local, jnp.float32)])
            step.fraction = local / total[0]
        step.empty = local == 0
        outer, _active.step = _active.step, step
        try:
            return train_step(state, data)
        finally:
            step.fraction, step.rows, step.empty = None, None, False
            _active.step = outer

    return shared_train_step


def _sum_before_apply(optimizer: keras.optimizers.Optimizer, step: StepState, size: int, threshold: int) -> None:
    """Replaces ``stateless_apply``, which Keras-JAX's train step calls (and a LossScaleOptimizer's
    passes straight to its inner optimizer's, past ``apply``), on the instance."""
    original = optimizer.stateless_apply

    def stateless_apply(optimizer_variables: Any, grads: Sequence[Any], trainable_variables: Any) -> Any:
        return original(optimizer_variables, summed_gradients(grads, step, size, threshold), trainable_variables)

    optimizer.stateless_apply = stateless_apply
    model_state.reduced_optimizers.add(optimizer)


def summed_gradients(grads: Sequence[Any], step: StepState, size: int, threshold: int) -> list[Any]:
    """``sum over ranks of fraction * grad`` for every gradient, in one ordered collective."""
    if step.rows is not None:  # the handler scales by the share it sums (a share of 0 gives zeros)
        sums = iter(collectives.summed([g for g in grads if g is not None], threshold, rows=step.rows))
        return [None if g is None else next(sums) for g in grads]
    fraction = 1.0 / size if step.fraction is None else step.fraction  # outside a step: equal shares
    scaled = [None if g is None else jnp.zeros_like(g) if step.empty else (g * fraction).astype(g.dtype) for g in grads]
    sums = iter(collectives.summed([g for g in scaled if g is not None], threshold))
    return [None if g is None else next(sums) for g in scaled]


@jax.custom_vjp
def synced_sum(x: Any) -> Any:
    """``x`` summed over ranks, differentiably (SyncBatchNormalization's statistics): the gradient
    that reaches this rank's ``x`` is that of the global batch's loss. Each rank's loss is its own
    slice's mean, and its gradients are scaled by its share ``w_r = b_r / B`` only when they are
    summed (``summed_gradients``); so the cotangents are summed weighted by each rank's share, and
    divided by this rank's, which the gradient sum multiplies back. A rank with an empty slice
    adds nothing (its cotangent may be NaN) and gets zeros (no rows need them)."""
    if collectives.through_handler():
        # The data chain that orders the handler's calls cannot reach into a custom VJP's backward pass.
        raise RuntimeError(
            "tnt: a synchronized sum in a step whose sums go through XLA's handler; tnt chooses the "
            "ordered callbacks for models with tnt.SyncBatchNormalization layers (steps.py)"
        )
    return collectives.summed([x])[0]


def _synced_sum_forward(x: Any) -> tuple[Any, None]:
    return synced_sum(x), None


def _synced_sum_backward(_: None, cotangent: Any) -> tuple[Any]:
    step = active_step()
    if step is None or step.fraction is None:  # outside a train step: equal shares
        return (collectives.summed([cotangent])[0],)
    if step.empty:
        collectives.summed([jnp.zeros_like(cotangent)])
        return (jnp.zeros_like(cotangent),)
    weight = step.fraction.astype(cotangent.dtype)
    return (collectives.summed([cotangent * weight])[0] / weight,)


synced_sum.defvjp(_synced_sum_forward, _synced_sum_backward)
