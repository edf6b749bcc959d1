"""Sums gradients across ranks on the torch backend, overlapped with backward.

Keras' torch train step runs ``loss.backward()`` and then hands the gradients to the optimizer's
``apply``. tnt registers a post-accumulate-grad hook on every trainable parameter: as soon as a
gradient is complete, the hook scales it by this rank's share of the global batch (``b_r / B``, so
uneven and partial batches stay exact; 0 on an empty slice, which turns NaN into 0) and hands it to
its fusion bucket, and a bucket starts its non-blocking allreduce once it is full and every earlier
bucket has started (so all ranks start them in one order). ``apply`` then waits for the buckets and
gives the original ``apply`` the sums.

- CPU tensors go through tnt-comm's ``FusedAllreduce``: it copies each gradient, scaled in the same
  pass, into its bucket in the shared arena and writes the sum back into the gradient's own memory
  (numpy views of the tensors, no further copy).
- CUDA tensors are packed into one device buffer per bucket, copied to pinned host memory on a side
  stream once the compute stream has produced them (ordered by CUDA events), summed there, and
  copied back on the compute stream: one device-to-host and one host-to-device copy per bucket.

The plan (which variables, in which buckets) is made by the first ``apply`` of a variable list; the
hooks start buckets from the second step on, so the first step sums after backward.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import keras
import ml_dtypes
import numpy as np
import tnt_comm
import torch

from ... import state as model_state
from ...runtime import fusion_threshold_bytes
from ...variables import check_optimizer, model_optimizers, numpy_dtype


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """A numpy array sharing ``tensor``'s memory (a contiguous CPU tensor), bfloat16 included."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


class StepState:
    """This rank's share of the current global batch while a train step runs: the rows are summed
    by an allreduce started at the top of the step, waited for when the first gradient needs it.

    Not thread-local: autograd runs the hooks of CUDA tensors on a thread of its own, while the
    step's thread waits in ``backward``."""

    active = False
    local = 0.0
    pending: tnt_comm.Work | None = None
    value: float | None = None

    def begin(self, rows: int) -> None:
        self.active, self.local, self.value = True, float(rows), None
        self.pending = tnt_comm.iallreduce(np.array([rows], dtype=np.float64))

    def fraction(self) -> float | None:
        if self.pending is not None:
            total = float(self.pending.wait()[0])
            self.pending = None
            self.value = self.local / total if total > 0 else 0.0
        return self.value

    def end(self) -> None:
        self.fraction()  # a started collective must finish, even in a step that applied nothing
        self.active, self.value = False, None

    def abandon(self) -> None:
        self.active, self.value, self.pending = False, None, None


class _HostBuckets:
    """Buckets of CPU gradients, through tnt-comm's ``FusedAllreduce``."""

    def __init__(self, shapes: list[tuple[int, ...]], dtypes: list[torch.dtype], threshold: int) -> None:
        declared = [(s, numpy_dtype(d)) for s, d in zip(shapes, dtypes, strict=True)]
        self.fused = tnt_comm.FusedAllreduce(declared, threshold)
        self.held: dict[int, torch.Tensor] = {}  # position -> the tensor handed over (its result lands there)

    def start(self, position: int, grad: torch.Tensor, fraction: float) -> None:
        """Copies ``fraction * grad`` into its bucket (tnt-comm scales in the copy: one pass)."""
        grad = grad if grad.is_contiguous() else grad.contiguous()
        self.held[position] = grad
        self.fused.start(position, numpy_view(grad), scale=None if fraction == 1.0 else fraction)

    def poll(self) -> None:
        pass  # the progress engine moves host buckets on its own

    def finish(self, position: int) -> torch.Tensor:
        grad = self.held.pop(position)
        self.fused.wait(position, out=numpy_view(grad))
        return grad


class _Registered:
    """Page-locks host memory that CUDA did not allocate (an array in tnt-comm's shared arena) for as
    long as the arrays over it live, so that copies to and from the GPU run asynchronously."""

    def __init__(self, array: np.ndarray) -> None:
        self.array, self.pointer = array, array.ctypes.data
        status = torch.cuda.cudart().cudaHostRegister(self.pointer, array.nbytes, 0)
        if int(status) != 0:
            raise RuntimeError(f"cudaHostRegister failed ({status})")

    def __del__(self) -> None:
        torch.cuda.cudart().cudaHostUnregister(self.pointer)


_registered: weakref.WeakKeyDictionary[torch.Tensor, _Registered] = weakref.WeakKeyDictionary()
"""Each host tensor in the shared arena, with its CUDA registration: unregistered when the tensor goes."""


def _pinned_host(count: int, dtype: torch.dtype, shared: bool) -> torch.Tensor:
    """Page-locked host memory for a bucket: in the shared arena where there is one (tnt-comm's
    single-copy allreduce then reads the other ranks' buckets in place), else pinned by torch."""
    if shared:
        array = tnt_comm.shared_empty(count, numpy_dtype(dtype))
        if array.base is not None:  # in the arena (a plain numpy.empty where there is none)
            try:
                keep = _Registered(array)
            except RuntimeError:
                pass
            else:
                host = torch.from_numpy(array.view(np.int16) if dtype == torch.bfloat16 else array)
                host = host.view(torch.bfloat16) if dtype == torch.bfloat16 else host
                _registered[host] = keep  # unregistered when the tensor goes
                return host
    return torch.empty(count, dtype=dtype, pin_memory=True)


class _CudaBuckets:
    """Buckets of CUDA gradients, staged through pinned host memory."""

    def __init__(
        self, shapes: list[tuple[int, ...]], dtypes: list[torch.dtype], threshold: int, device: Any, shared: bool = True
    ) -> None:
        counts = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        self.shapes = shapes
        self.plan = tnt_comm.plan_buckets(counts, [numpy_dtype(d) for d in dtypes], threshold)
        self.where: dict[int, tuple[int, int, int]] = {}  # position -> (bucket, offset, count)
        self.device, self.host, self.host_np, self.dev = [], [], [], []
        for b, positions in enumerate(self.plan):
            offset = 0
            for p in positions:
                self.where[p] = (b, offset, counts[p])
                offset += counts[p]
            dtype = dtypes[positions[0]]
            self.dev.append(torch.empty(offset, dtype=dtype, device=device))
            host = _pinned_host(offset, dtype, shared)
            self.host.append(host)
            self.host_np.append(numpy_view(host))
        self.copy_stream = torch.cuda.Stream(device=device)
        self.reset()

    def reset(self) -> None:
        self.filled = [0] * len(self.plan)
        self.copied: list[torch.cuda.Event | None] = [None] * len(self.plan)
        self.work: list[tnt_comm.Work | None] = [None] * len(self.plan)
        self.next_copy = 0  # buckets start their copies, and their allreduces, in plan order
        self.next_sum = 0
        self.results: dict[int, torch.Tensor] = {}

    def start(self, position: int, grad: torch.Tensor, fraction: float) -> None:
        """Packs ``fraction * grad`` into its bucket's device buffer (0 makes NaN 0: an empty slice)."""
        b, offset, count = self.where[position]
        packed = self.dev[b][offset : offset + count]
        if fraction == 0.0:
            packed.zero_()
        else:
            torch.mul(grad.reshape(-1), fraction, out=packed)
        self.filled[b] += 1
        while self.next_copy < len(self.plan) and self.filled[self.next_copy] == len(self.plan[self.next_copy]):
            self._copy_out(self.next_copy)
            self.next_copy += 1
        self.poll()

    def _copy_out(self, b: int) -> None:
        packed = torch.cuda.Event()
        packed.record(torch.cuda.current_stream(self.dev[b].device))
        self.copy_stream.wait_event(packed)
        with torch.cuda.stream(self.copy_stream):
            self.host[b].copy_(self.dev[b], non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.copy_stream)
        self.copied[b] = copied

    def poll(self) -> None:
        """Starts, in plan order, the allreduces of buckets whose copies to the host are done."""
        while self.next_sum < self.next_copy and self.copied[self.next_sum].query():
            self._sum(self.next_sum)

    def _sum(self, b: int) -> None:
        self.work[b] = tnt_comm.iallreduce(self.host_np[b], out=self.host_np[b])
        self.next_sum += 1

    def finish(self, position: int) -> torch.Tensor:
        b, offset, count = self.where[position]
        if b not in self.results:
            while self.next_sum <= b:
                self.copied[self.next_sum].synchronize()
                self._sum(self.next_sum)
            self.work[b].wait()
            self.dev[b].copy_(self.host[b], non_blocking=True)  # on the compute stream: ordered before use
            self.results[b] = self.dev[b]
        return self.results[b][offset : offset + count].view(self.shapes[position])


class Plan:
    """The gradient sum of one list of variables (what one optimizer's ``apply`` receives)."""

    def __init__(self, variables: Sequence[Any], threshold: int) -> None:
        self.variables = list(variables)
        # Start order: last variables first, as backward produces their gradients.
        self.order = list(reversed(range(len(self.variables))))
        self.position = {index: p for p, index in enumerate(self.order)}
        params = [self.variables[i].value for i in self.order]
        shapes = [tuple(p.shape) for p in params]
        dtypes = [p.dtype for p in params]
        device = params[0].device if params else torch.device("cpu")
        if device.type == "cuda":
            self.buckets: _HostBuckets | _CudaBuckets = _CudaBuckets(shapes, dtypes, threshold, device)
        else:
            self.buckets = _HostBuckets(shapes, dtypes, threshold)
        self.started: dict[int, torch.Tensor] = {}  # position -> the gradient tensor it started with
        self.started_in_backward = 0  # gradients handed over by hooks, during backward (over all steps)

    def on_gradient(self, index: int, grad: torch.Tensor, fraction: float) -> None:
        position = self.position[index]
        if position in self.started:  # a second backward before apply: apply starts what remains
            return
        self.started_in_backward += 1
        self._start(position, grad, fraction)

    def sum(self, grads: Sequence[Any], fraction: float) -> list[Any]:
        """The sums of ``grads`` (this plan's variables' gradients, in their order) over ranks."""
        if any(grads[self.order[p]] is not g for p, g in self.started.items()):
            # The step hands apply other tensors than the ones backward accumulated (a custom
            # train_step that changed them): the sums the hooks started are finished and dropped.
            self.drain()
        for p, index in enumerate(self.order):
            if p not in self.started:
                grad = grads[index]
                self._start(p, self._zeros(index) if grad is None else grad.detach(), fraction)
        out: list[Any] = list(grads)
        for p, index in enumerate(self.order):
            summed = self.buckets.finish(p)
            if grads[index] is not None:  # an unused variable added zeros, and keeps no gradient
                out[index] = summed
        self._clear()
        return out

    def drain(self) -> None:
        """Completes and drops the sums that hooks started (in a step that then applied nothing, or
        applied other tensors): every bucket is filled (with zeros) and finished, as on every rank."""
        if not self.started:
            return
        for p, index in enumerate(self.order):
            if p not in self.started:
                self._start(p, self._zeros(index), 0.0)
        for p in range(len(self.order)):
            self.buckets.finish(p)
        self._clear()

    def abandon(self) -> None:
        """Forgets this step's sums without waiting (the step failed; so does the job)."""
        if isinstance(self.buckets, _HostBuckets):
            self.buckets.held.clear()
        self._clear()

    def _start(self, position: int, grad: torch.Tensor, fraction: float) -> None:
        self.started[position] = grad
        self.buckets.start(position, grad, fraction)

    def _zeros(self, index: int) -> torch.Tensor:
        value = self.variables[index].value
        return torch.zeros(tuple(value.shape), dtype=value.dtype, device=value.device)

    def _clear(self) -> None:
        self.started.clear()
        if isinstance(self.buckets, _CudaBuckets):
            self.buckets.reset()


_active: list[StepState] = []  # the train steps running (not thread-local: see StepState)


def _sum_on_host(tensor: torch.Tensor) -> torch.Tensor:
    host = tensor.detach().to("cpu").contiguous()
    return torch.from_numpy(tnt_comm.allreduce(numpy_view(host).copy())).to(tensor.device)


class _SyncedSum(torch.autograd.Function):
    """``synced_sum``: an allreduce forward, and backward the cotangents summed weighted by each
    rank's share of the global batch and divided by this rank's (the gradient sum multiplies it back):
    the gradient through the sum is the global batch's (``sync_batch_norm.py``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        return _sum_on_host(x)

    @staticmethod
    def backward(ctx: Any, cotangent: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        fraction = _active[-1].fraction() if _active else None
        if fraction is None:  # outside a train step: equal shares
            return _sum_on_host(cotangent)
        if fraction == 0.0:  # an empty slice adds nothing (its cotangent may be NaN) and needs nothing
            _sum_on_host(torch.zeros_like(cotangent))
            return torch.zeros_like(cotangent)
        return _sum_on_host(cotangent * fraction) / fraction


def synced_sum(x: torch.Tensor) -> torch.Tensor:
    """``x`` summed over ranks, differentiably (``_SyncedSum``)."""
    return _SyncedSum.apply(x)


class GradientSum:
    """The hooks of one model: its train step, its optimizers' ``apply`` and its parameters."""

    def __init__(self, model: keras.Model, size: int) -> None:
        self.model, self.size = model, size
        self.state = StepState()
        self.threshold = fusion_threshold_bytes()
        self.plans: dict[tuple[int, ...], Plan] = {}
        self.by_param: dict[int, tuple[Plan, int]] = {}  # id(parameter) -> its plan and index there
        self.hooked: set[int] = set()
        self.held: tuple[Any, list[Any], Any] | None = None  # (apply, summed gradients, variables)
        self.updating = False
        original_train_step = model.train_step

        def train_step(data: Any) -> Any:
            leaves = [t for t in keras.tree.flatten(data) if t is not None]
            self.state.begin(int(leaves[0].shape[0]) if leaves else 0)
            _active.append(self.state)
            try:
                logs = original_train_step(data)
            except BaseException:
                # The job is failing (a peer died, a bad step): no further collective, the error goes up.
                self.state.abandon()
                self.held = None
                for plan in self.plans.values():
                    plan.abandon()
                raise
            finally:
                _active.pop()
            self.state.end()
            for plan in self.plans.values():
                plan.drain()
            self._apply_held()
            return logs

        model.train_step = train_step
        self.wrap_optimizers()

    def wrap_optimizers(self) -> None:
        for optimizer in model_optimizers(self.model):
            check_optimizer(optimizer)
            if optimizer not in model_state.reduced_optimizers:
                self._sum_before_apply(optimizer)

    def _sum_before_apply(self, optimizer: Any) -> None:
        original_apply = optimizer.apply

        def apply(grads: Sequence[Any], trainable_variables: Any = None) -> Any:
            if self.updating:  # the held update, reaching a wrapped inner optimizer: summed already
                return original_apply(grads, trainable_variables)
            variables = trainable_variables if trainable_variables is not None else optimizer._trainable_variables
            fraction = self.state.fraction() if self.state.active else None
            if fraction is None:  # apply() outside a train step: equal shares
                fraction = 1.0 / self.size
            with torch.no_grad():
                summed = self.plan(variables).sum(list(grads), fraction)
            # An elastic fit that redoes lost steps (step_redo.py) holds each step's update back until
            # the step's last collective is done: a step that fails then changed no weight anywhere.
            if self.state.active and model_state.of(self.model).update_at_step_end:
                self._apply_held()  # a second update in one step keeps its order after the first
                self.held = (original_apply, summed, trainable_variables)
                return None
            return original_apply(summed, trainable_variables)

        optimizer.apply = apply
        model_state.reduced_optimizers.add(optimizer)

    def _apply_held(self) -> None:
        if self.held is None:
            return
        original_apply, summed, variables = self.held
        self.held, self.updating = None, True
        try:
            with torch.no_grad():
                original_apply(summed, variables)
        finally:
            self.updating = False

    def plan(self, variables: Sequence[Any]) -> Plan:
        key = tuple(id(v) for v in variables)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = Plan(variables, self.threshold)
            for index, variable in enumerate(plan.variables):
                self.by_param[id(variable.value)] = (plan, index)
                self._hook(variable.value)
        return plan

    def _hook(self, param: torch.Tensor) -> None:
        if id(param) in self.hooked or not param.requires_grad:
            return
        self.hooked.add(id(param))

        def on_grad(p: torch.Tensor) -> None:
            entry = self.by_param.get(id(p))
            if entry is None or not self.state.active or p.grad is None:
                return
            fraction = self.state.fraction()
            plan, index = entry
            plan.on_gradient(index, p.grad, fraction if fraction is not None else 1.0 / self.size)

        param.register_post_accumulate_grad_hook(on_grad)


def install_gradient_sum(model: keras.Model, size: int) -> None:
    """Installs the gradient sum on ``model`` (idempotent; a recompiled model's new optimizer gets
    wrapped too). One rank needs none."""
    if size == 1:
        return
    mine = model_state.of(model)
    if mine.gradient_sum is None:
        mine.gradient_sum = GradientSum(model, size)
    else:
        mine.gradient_sum.wrap_optimizers()


def update_at_step_end(model: keras.Model) -> bool:
    """Holds every train step's optimizer update back until the step returns (after its metric
    sum): see ``GradientSum``."""
    model_state.of(model).update_at_step_end = True
    return True


def forget_collectives(model: keras.Model) -> None:
    """Drops the fused buckets of the old job (their FusedAllreduce objects raise once it is gone);
    the next step plans them again over the new one. The parameters' hooks stay."""
    gradient_sum = model_state.of(model).gradient_sum
    if gradient_sum is not None:
        gradient_sum.plans.clear()
        gradient_sum.by_param.clear()
        gradient_sum.size = tnt_comm.size()
