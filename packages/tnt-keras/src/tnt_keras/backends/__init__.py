"""What differs between Keras backends, behind one interface (`Backend`); everything else in
tnt-keras is shared.

``current()`` is the module of the backend Keras runs on (``keras.backend.backend()``), imported
only when first asked for, so that a job on one backend never imports another's framework. Each
backend is a package here (``tensorflow/``, ``torch/``) whose module implements `Backend`; adding
one is a new package and one line in ``_MODULES``. Nothing outside ``backends/`` asks which backend
runs: it asks `current()` for what differs.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol, cast

import keras
import tnt_comm

from .. import state

_MODULES = {"jax": "jax", "tensorflow": "tensorflow", "torch": "torch"}


class Backend(Protocol):
    """What a backend module provides (each function at its module's top level)."""

    def prepare(self) -> None:
        """Once, when tnt_keras is imported: what the backend changes of its framework (TensorFlow:
        ``Dataset.shuffle`` without a seed takes one shared by every rank)."""
        ...

    def jit_compile(self, asked: Any) -> Any:
        """What ``compile(jit_compile=asked)`` hands Keras, or a ``ValueError`` where the backend's
        gradient sum cannot run under that compiler."""
        ...

    def is_dataset(self, x: Any) -> bool:
        """Whether ``x`` is an input of the backend's own that arrives batched with the global batch
        size (``tf.data.Dataset``; a torch ``DataLoader`` or a ``keras.utils.PyDataset``)."""
        ...

    def distribute(
        self, x: Any, y: Any, sample_weight: Any, batch_size: int | None, *, rank: int, size: int, shuffle: bool,
        distribute: bool, micro_batch_size: int | None, what: str, redealt: bool = False,
        whole_batches: bool = False,
    ) -> Any:
        """What this rank hands to Keras: its slice of every global batch (``slicing.py`` states the
        rule). ``redealt``: an elastic job, whose batches may have to be dealt again over fewer ranks
        within an epoch (``step_redo.py``): inputs in host memory are then dealt by tnt batch by batch
        (``host_inputs.py``), as the torch and JAX backends always do, not by a pipeline that reads
        ahead (TensorFlow's ``tf.data``). ``whole_batches``: a fit whose steps can be redone, where
        such a pipeline is then handed over with its global batches whole, each to be sliced as the
        step draws it (``drawn_slicer``)."""
        ...

    def reshuffles(self, ds: Any) -> bool:
        """Whether what ``distribute`` returned draws a new order each time it is read, from a state
        that goes on and that tnt cannot set back (a ``tf.data`` shuffle with
        ``reshuffle_each_iteration``, a DataLoader handed to Keras as it is): an epoch begun again on
        it reads the batches in another order than it had."""
        ...

    def unshared_order(self, ds: Any) -> str | None:
        """Where a replacement rank could not draw the order the others draw from what ``distribute``
        returned (a torch DataLoader's sampler whose state tnt cannot read), why, for the warning
        that no replacement is admitted; else None."""
        ...

    def order_state(self, ds: Any) -> Any:
        """Where what ``distribute`` returned draws each pass's order from a state tnt can read and
        set (a torch DataLoader's generators), that state as a numpy array of bytes; else None. An
        elastic fit keeps it at each epoch's start, and sets it back to begin an epoch again in
        the order it had (``elastic.EpochStart``)."""
        ...

    def set_order_state(self, ds: Any, state: Any) -> None:
        """Sets ``ds``'s order back to ``state`` (``order_state``)."""
        ...

    def drawn_slicer(self, ds: Any) -> Callable[[Any, int, int], Any] | None:
        """Where ``ds`` is what ``distribute(whole_batches=True)`` handed over whole, the function that
        cuts rank r of n's slice from a batch drawn from it (``slicer(batch, r, n)``); else None."""
        ...

    def global_batch_size(self, ds: Any) -> int | None:
        """The global batch size of what ``distribute`` returned, where known."""
        ...

    def build(self, model: keras.Model, ds: Any) -> None:
        """Creates the model's variables from the data's shapes, for training."""
        ...

    def build_for_predict(self, model: keras.Model, ds: Any) -> None:
        """Creates the model's variables from the data's shapes, for predict."""
        ...

    def install_hooks(self, model: keras.Model, size: int) -> None:
        """The gradient sum and the empty-slice guard (idempotent)."""
        ...

    def forget_collectives(self, model: keras.Model) -> None:
        """After the job re-formed (an elastic job lost ranks: ``elastic.py``), drops what the hooks
        keep of the old job's collectives (fused buckets), to be made again on the new one."""
        ...

    def update_at_step_end(self, model: keras.Model) -> bool:
        """Makes every train step of ``model`` apply its optimizer update only once the step's last
        collective is done, so a step that fails changes no weight (``step_redo.py``); False where
        the backend cannot."""
        ...

    def pure_train_function(self, model: keras.Model) -> Callable[[Any, Any], tuple[Any, Any, Any]] | None:
        """Where Keras' train step is a pure function of its state (Keras-JAX), the train function of
        an elastic fit that redoes lost steps: ``(logs, state, sums) = train(state, data)``, which
        leaves ``state`` as it was where the step fails, returns the step's global metric states
        (``sums``) and returns once the step has run; None where Keras' train step changes the
        model's variables itself (``update_at_step_end`` holds its update back)."""
        ...

    waits_for_redoable_steps: bool
    """Whether redoing lost steps makes an elastic fit wait for each step before it dispatches the
    next (JAX: ``pure_train_function``), which costs more than the backend's steps can spare: it
    then redoes the epoch unless ``TNT_ELASTIC_REDO=step`` (``step_redo.py``)."""

    def predicted_outputs(self, returned: Any) -> Any:
        """The outputs of one batch in what Keras' predict function ``returned`` (Keras-JAX's also
        returns its state)."""
        ...

    def summed_values(self, variables: list[Any]) -> list[Any]:
        """The values of metric states summed over ranks (``metrics.py``)."""
        ...

    def synced_sum(self, x: Any) -> Any:
        """``x`` summed over ranks inside a step, differentiably: the gradient reaching this rank's
        ``x`` is the global batch's, weighted for the gradient sum (``sync_batch_norm.py``)."""
        ...

    def explain_errors(self, what: str) -> AbstractContextManager[None]:
        """A context in which tnt-comm's errors reach the user as tnt-comm's types."""
        ...


@functools.cache  # a process runs on one backend; metrics ask for it on every step
def current() -> Backend:
    """The module of the Keras backend this process runs on."""
    name = keras.backend.backend()
    module = _MODULES.get(name)
    if module is None:
        raise NotImplementedError(
            f"tnt: Keras' {name!r} backend is not supported yet; tnt runs on {', '.join(sorted(_MODULES))}. "
            "Set KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch."
        )
    return cast(Backend, importlib.import_module(f"{__name__}.{module}"))


def guard_steps(model: keras.Model, size: int, guarded: Callable[[keras.Model, Any], Any]) -> None:
    """Wraps ``model``'s train and test steps in a backend's empty-slice guard, ``guarded(model,
    step)`` (idempotent; one rank needs none)."""
    if size == 1 or state.of(model).empty_slices_guarded:
        return
    for name in ("train_step", "test_step"):
        setattr(model, name, guarded(model, getattr(model, name)))
    state.of(model).empty_slices_guarded = True


def without_xla(asked: Any) -> bool:
    """``jit_compile`` for the backends whose collectives run outside XLA (TensorFlow's op, torch's
    hooks): True is refused, anything else becomes False."""
    if asked is True:
        raise ValueError(
            "tnt: jit_compile=True is not supported on this backend: XLA cannot run tnt's gradient "
            "collective. Leave jit_compile unset (tnt compiles the step with jit_compile=False)."
        )
    return False


def mismatch_advice(what: str, message: str) -> str:
    return (
        f"tnt: the ranks fell out of step in {what}: {message}\n"
        "Every rank must run the same steps in the same order. Usual causes: datasets of different "
        "lengths on different ranks (with tnt_distribute_dataset=False each rank's dataset must give the "
        "same number of batches; a distributed dataset must not depend on the rank), different models, or "
        "a custom train_step that takes rank-dependent branches."
    )


def reraised(what: str, found: dict[str, Any]) -> tnt_comm.TntError:
    """tnt-comm's error ``found`` (as data), as the tnt-comm type to raise from ``what`` (fit, ...);
    a mismatch also says its usual causes."""
    if isinstance(tnt_comm.error_from_data(found), tnt_comm.CollectiveMismatch):
        message = mismatch_advice(what, found["message"])
    else:
        message = f"tnt: {what} stopped: {found['message']}"
    return tnt_comm.error_from_data(found, message)


_explained = state.Marked()  # errors explain_python_errors raised already: passed on as they are


@contextlib.contextmanager
def explain_python_errors(what: str) -> Iterator[None]:
    """For backends whose steps call tnt-comm from Python: its errors arrive as they are raised, and
    get the same message as on TensorFlow."""
    try:
        yield
    except tnt_comm.TntError as error:
        found = tnt_comm.error_data(error)
        if not isinstance(found, dict) or "message" not in found or error in _explained:
            raise
        rebuilt = reraised(what, found)
        _explained.add(rebuilt)
        raise rebuilt from error
