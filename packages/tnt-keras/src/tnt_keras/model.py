"""``tnt.Model``: a Keras model that trains data-parallel over all ranks, on any supported backend.

The wrapper keeps the user's model whole and lets Keras run it: ``fit``, ``evaluate`` and ``predict``
hand each rank its slice of every global batch and then call the wrapped model's own methods, whose
train step (Keras' or the user's override) has been given three hooks: gradients summed across
ranks before the optimizer applies them, metric results on states summed across ranks
(``metrics.py``), and callbacks that run, print and write per rank policy (``callbacks.py``). A step
on a rank whose slice of a partial last batch is empty changes nothing there. What depends on the
Keras backend (the gradient sum, slicing the inputs, the empty-slice guard) lives in ``backends/``;
the wrapper's forwarding in ``forwarding.py``, its files in ``files.py``, configs in ``configs.py``,
and putting predictions back in order in ``predictions.py``.
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tnt_comm

from . import (
    backends,
    call_boundary,
    configs,
    elastic,
    epoch_end,
    files,
    metrics,
    outcome,
    predictions,
    preemption,
    runtime,
    short_epochs,
    state,
    step_redo,
    sync_batch_norm,
    timeline,
)
from . import callbacks as tnt_callbacks
from . import variables as shared_variables
from .forwarding import FORWARDED_ATTRIBUTES, INTERCEPTED, NO_CLASS, Forwarded, awaiting, wrapped
from .runtime import logger

_BN_WARN_BELOW = 16


def _accepts_keyword(function: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _with_preemption_watch(callbacks: list[keras.callbacks.Callback]) -> list[keras.callbacks.Callback]:
    """``fit``'s callbacks between the ranks' agreement on a preemption signal at each epoch's end
    (first) and the watch that turns it into a stop after the epoch on every rank (last;
    preemption.py), then the timeline's step recorder where it is on."""
    watch = preemption.watch(callbacks)
    return [watch.agreement, *callbacks, watch, *timeline.callbacks()]


def _warn_if_diverged(model: keras.Model) -> None:
    """Warns when the trainable variables are not bitwise equal on every rank after ``fit``.

    Collective. Summed gradients keep the ranks identical; a variable that differs was changed by
    something else (a custom ``train_step`` assigning it, an optimizer that is not an attribute of
    the model), and from then on the ranks train different models.
    """
    variables = shared_variables.unique_variables(model.trainable_variables)
    if tnt_comm.size() == 1 or not variables:
        return
    differ = shared_variables.differing_variables(variables)
    if any(differ):
        names = [str(getattr(v, "path", v.name)) for v, d in zip(variables, differ, strict=True) if d]
        logger.warning(
            "after fit, %d trainable variable(s) differ between ranks (%s): something changed them without tnt's "
            "gradient sum, such as a custom train_step that assigns variables itself or applies an optimizer the "
            "model does not hold as an attribute. The ranks now hold different models; rank 0's is the one saved.",
            len(names),
            ", ".join(names[:3]) + (", ..." if len(names) > 3 else ""),
        )


# Registered so that Keras can rebuild a serialized tnt.Model (keras.models.clone_model of a tnt.Model,
# keras.saving.save_model called on one, and .keras files of earlier tnt versions). tnt.Model.save
# writes the wrapped model itself, which plain Keras loads without tnt.
@keras.saving.register_keras_serializable(package="tnt", name="Model")
class Model(keras.Model):
    """Wraps a Keras model (Functional, Sequential or subclassed) for data-parallel training.

    Args:
        model: the ``keras.Model`` to train. Its own ``train_step``, if it overrides one, is kept.

    Example::

        import tnt_keras as tnt
        model = tnt.Model(keras_model)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        model.fit(train_ds.batch(256), epochs=3)   # 256 is the GLOBAL batch size

    Start the script with ``tnt-launch -n 4 -- train.py``; without it the script runs as one rank.

    Every public attribute and method of ``keras.Model`` is the wrapped model's (``input_spec``,
    ``get_config``, ``to_json``, ``compute_output_shape``, ``layers``, ``summary``, ...), except the
    ones listed in ``tnt_keras.model.INTERCEPTED``, with the reason for each.
    """

    def __init__(self, model: keras.Model, **kwargs: Any) -> None:
        if isinstance(model, Model):
            model = model.model
        if not isinstance(model, keras.Model):
            raise TypeError(f"tnt.Model wraps a keras.Model, got {type(model).__name__}")
        kwargs.setdefault("name", f"tnt_{model.name}")
        self._start(**kwargs)
        self._adopt(model)

    def _start(self, **kwargs: Any) -> None:
        """Initialises the wrapper as a Keras model of its own, still without a wrapped model."""
        mine = state.of(self)
        keras.Model.__init__(self, **kwargs)
        mine.rank, mine.size = runtime.get_rank(), runtime.get_size()
        self._backend = backends.current()

    def _adopt(self, model: keras.Model) -> None:
        self._model = model
        self.built = True
        if model.compiled:
            self._install_hooks()

    # -- the wrapped model shows through ---------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        model = wrapped(self)
        if model is None or name.startswith("__"):
            if model is None and awaiting(self) and (name == "_model" or not name.startswith("_")):
                raise AttributeError(f"{name}: {NO_CLASS}")
            raise AttributeError(name)
        if name == "_model":  # on torch, kept among the torch module's submodules
            return model
        return getattr(model, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # Straight to the wrapped model, without tracking the value in the wrapper first.
        model = wrapped(self)
        if name in _FORWARDED and model is not None:
            setattr(model, name, value)
        else:
            super().__setattr__(name, value)

    @property
    def model(self) -> keras.Model:
        """The wrapped Keras model."""
        return self._model

    # Keras' fit loop and callbacks read and write this on the model they run on.
    @property
    def _initial_epoch(self) -> Any:
        model = wrapped(self)
        return model._initial_epoch if model is not None else state.of(self).local.get("_initial_epoch")

    @_initial_epoch.setter
    def _initial_epoch(self, value: Any) -> None:
        model = wrapped(self)
        if model is None:
            state.of(self).local["_initial_epoch"] = value
        else:
            model._initial_epoch = value

    def call(self, inputs: Any, training: Any = None) -> Any:
        return self._model(inputs, training=training)

    def compute_output_spec(self, *args: Any, **kwargs: Any) -> Any:
        model = self._model
        for name, takes in (("training", "_call_has_training_arg"), ("mask", "_call_has_mask_arg")):
            if name in kwargs and not getattr(model, takes, True):
                kwargs.pop(name)
        return model.compute_output_spec(*args, **kwargs)

    # -- configuration -----------------------------------------------------------------------------

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> Model:
        """A new, uncompiled ``tnt.Model`` around the model that Keras rebuilds from ``config``: the
        ``get_config()`` of a Functional or Sequential model, wrapped or not (Keras compiles it
        afterwards only when loading a file with ``compile=True``).

        A subclassed model's ``get_config()`` does not name its class: wrap what its class rebuilds,
        ``tnt.Model(MyModel.from_config(config))``. (When Keras itself deserializes a ``tnt.Model``,
        the class comes from the wrapper's build config, see ``get_build_config``.)
        """
        if configs.is_wrapper_config(config):
            # Earlier tnt versions' configs, {"model": <serialized model>, "name": ...}, some with the
            # wrapped model's compile settings, which a config leaves out. Keras consumes what it
            # deserializes: the caller's config stays reusable.
            inner_config = {k: v for k, v in config["model"].items() if k != "compile_config"}
            inner = keras.saving.deserialize_keras_object(copy.deepcopy(inner_config), custom_objects=custom_objects)
            return cls(inner, name=config.get("name"))
        inner = configs.from_bare_config(config, custom_objects)
        if inner is not None:
            return cls(inner)
        # Keras' deserialization calls build_from_config next, with the class; until then the wrapper
        # has no wrapped model, and using it raises an error that says so.
        wrapper = cls.__new__(cls)
        wrapper._start(name=f"tnt_{config.get('name', 'model')}")
        state.of(wrapper).local["awaiting"] = (copy.deepcopy(config), custom_objects)
        wrapper.built = False
        return wrapper

    def get_build_config(self) -> dict[str, Any]:
        """The wrapped model's build config, and its class: when Keras deserializes a ``tnt.Model``
        (``keras.models.clone_model``, ``keras.saving.save_model`` and load), the wrapped model's config
        alone does not name a subclassed model's class."""
        cls = type(self._model)
        config: dict[str, Any] = {
            "tnt_model_class": {
                "module": cls.__module__,
                "class_name": cls.__name__,
                "registered_name": keras.saving.get_registered_name(cls),
            }
        }
        inner = self._model.get_build_config()
        if inner is not None:
            config["build_config"] = inner
        return config

    def build_from_config(self, config: dict[str, Any]) -> None:
        named = config.get("tnt_model_class") if isinstance(config, dict) else None
        inner_build = config.get("build_config") if named is not None else config
        awaiting = state.of(self).local.pop("awaiting", None)
        if awaiting is not None:
            if not named:
                raise ValueError(NO_CLASS)
            inner_config, custom_objects = awaiting
            serialized = {**named, "config": copy.deepcopy(inner_config)}
            if inner_build:
                serialized["build_config"] = inner_build
            self._adopt(keras.saving.deserialize_keras_object(serialized, custom_objects=custom_objects))
            return
        if inner_build and not self._model.built:
            self._model.build_from_config(inner_build)

    def compile(self, *args: Any, jit_compile: Any = "auto", **kwargs: Any) -> None:
        """As the wrapped model's ``compile`` (Keras' or the model's own override, whatever its
        arguments), with the ``jit_compile`` the backend can sum gradients under (TensorFlow and
        torch: none, XLA is refused; JAX: Keras' own, the step stays one XLA program)."""
        jit_compile = self._backend.jit_compile(jit_compile)
        inner = self._model
        if _accepts_keyword(inner.compile, "jit_compile"):
            inner.compile(*args, jit_compile=jit_compile, **kwargs)
        else:  # a compile override with arguments of its own (several optimizers, say)
            inner.compile(*args, **kwargs)
            if jit_compile is not None and jit_compile != "auto":
                inner.jit_compile = jit_compile
        for optimizer in shared_variables.model_optimizers(inner):
            shared_variables.check_optimizer(optimizer)
        self._warn_inexact_losses()
        self.compiled = True
        self._install_hooks()

    def _warn_inexact_losses(self) -> None:
        """Gradients are scaled by each rank's share of the batch, which is exact for losses that are
        means over the batch; not for sums, nor for means divided by the summed sample weights."""
        if state.of(self).size == 1:
            return
        losses = [loss for loss in keras.tree.flatten(getattr(self._model, "loss", None)) if loss is not None]
        for loss in losses:
            reduction = getattr(loss, "reduction", None)
            if reduction in ("sum", "mean_with_sample_weight"):
                logger.warning(
                    "the loss %s has reduction=%r: tnt weights each rank's gradient by its share of the global "
                    "batch, which equals serial training for the reductions 'sum_over_batch_size' (Keras' "
                    "default) and 'mean', not for %r. Training will differ from serial training.",
                    getattr(loss, "name", type(loss).__name__),
                    reduction,
                    reduction,
                )

    def compile_from_config(self, config: dict[str, Any]) -> None:
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if self._model.built and self._model.optimizer is not None:
            self._model.optimizer.build(self._model.trainable_variables)

    def _install_hooks(self) -> None:
        self.compiled = True
        self._backend.install_hooks(self._model, state.of(self).size)
        sync_batch_norm.synchronize_batch_norms(self._model, state.of(self).size)
        metrics.install_global_metrics(self._model, state.of(self).size)

    # -- training and inference -------------------------------------------------------------------

    def _dataset(
        self,
        x: Any,
        y: Any,
        sample_weight: Any,
        batch_size: int | None,
        *,
        shuffle: bool,
        distribute: bool,
        micro_batch_size: int | None,
        what: str,
        whole_batches: bool = False,
    ) -> Any:
        """What this rank hands to Keras: its slice of every global batch of the input (of a pipeline
        that reads ahead, with ``whole_batches``, the global batches, for the step to slice)."""
        return self._backend.distribute(
            x,
            y,
            sample_weight,
            batch_size,
            rank=state.of(self).rank,
            size=state.of(self).size,
            shuffle=shuffle,
            distribute=distribute,
            micro_batch_size=micro_batch_size,
            what=what,
            redealt=elastic.enabled(),
            whole_batches=whole_batches,
        )

    def _verbose(self, verbose: Any) -> Any:
        return tnt_callbacks.verbose_of_a_printing_rank(verbose) if runtime.prints_here() else 0

    def _prepare_variables(self, ds: Any) -> None:
        """Builds model, metrics and optimizer from the data's shapes, then takes rank 0's values."""
        inner = self._model
        if not inner.compiled:
            raise RuntimeError("tnt: call compile() before fit()/evaluate()")
        self._install_hooks()
        optimizer = getattr(inner, "optimizer", None)
        unbuilt = not all(layer.built for layer in inner._flatten_layers()) or (
            optimizer is not None and not optimizer.built
        )
        if unbuilt:
            with metrics.local():
                self._backend.build(inner, ds)
        metrics.install_global_metrics(inner, state.of(self).size)
        with timeline.span("broadcast of rank 0's variables"):
            shared_variables.broadcast_variables(shared_variables.model_and_optimizer_variables(inner))
        self._warn_small_batch_norm(ds)

    def _warn_small_batch_norm(self, ds: Any) -> None:
        if state.of(self).size == 1 or state.of(self).local.get("bn_warned"):
            return
        global_batch = self._backend.global_batch_size(ds)
        if global_batch is None:
            return
        micro = global_batch // state.of(self).size
        has_bn = any(
            isinstance(layer, keras.layers.BatchNormalization) and not sync_batch_norm.is_synchronized(layer)
            for layer in self._model._flatten_layers()
        )
        if has_bn and micro < _BN_WARN_BELOW:
            logger.warning(
                "BatchNormalization normalises over each rank's micro-batch of %d samples (global batch %d over "
                "%d ranks); statistics over fewer than %d samples are noisy. Use a larger global batch, or "
                "tnt.SyncBatchNormalization, which normalises over the whole global batch as serial training does.",
                micro,
                global_batch,
                state.of(self).size,
                _BN_WARN_BELOW,
            )
            state.of(self).local["bn_warned"] = True

    def fit(
        self,
        x: Any = None,
        y: Any = None,
        batch_size: int | None = None,
        epochs: int = 1,
        verbose: Any = "auto",
        callbacks: Any = None,
        validation_split: float = 0.0,
        validation_data: Any = None,
        shuffle: bool = True,
        class_weight: Any = None,
        sample_weight: Any = None,
        initial_epoch: int = 0,
        steps_per_epoch: int | None = None,
        validation_steps: int | None = None,
        validation_batch_size: int | None = None,
        validation_freq: int = 1,
        tnt_micro_batch_size: int | None = None,
        tnt_validation_micro_batch_size: int | None = None,
        tnt_distribute_dataset: bool = True,
        tnt_distribute_validation_dataset: bool = True,
    ) -> keras.callbacks.History:
        """As ``keras.Model.fit``, on this rank's slice of every global batch.

        Args (beyond Keras'):
            tnt_micro_batch_size: batch an unbatched dataset with ``micro * get_size()`` samples.
            tnt_validation_micro_batch_size: the same for ``validation_data``.
            tnt_distribute_dataset: False gives every rank the whole dataset as its local batches.
            tnt_distribute_validation_dataset: the same for ``validation_data``.
        """
        if validation_split and validation_data is None:
            if self._backend.is_dataset(x):
                raise ValueError("tnt: validation_split needs numpy inputs; pass validation_data with a dataset")
            from keras.src.trainers.data_adapters import array_slicing

            (x, y, sample_weight), validation_data = array_slicing.train_validation_split(
                (x, y, sample_weight), validation_split=validation_split
            )

        def datasets(whole_batches: bool = False, epochs_before: int = 0) -> tuple[Any, Any]:
            """This rank's slices of the training and validation data, for the ranks there are now
            (``whole_batches``: a fit whose steps are redone, ``_dataset``), for an attempt of an
            elastic fit that begins ``epochs_before`` epochs after the fit's first (short_epochs.py)."""
            ds = self._dataset(
                short_epochs.skipped(x, steps_per_epoch, epochs_before),
                y,
                sample_weight,
                batch_size,
                shuffle=shuffle,
                distribute=tnt_distribute_dataset,
                micro_batch_size=tnt_micro_batch_size,
                what="training dataset",
                whole_batches=whole_batches,
            )
            if validation_data is None:
                return ds, None
            if self._backend.is_dataset(validation_data):
                val = (validation_data, None, None)
            else:
                val = tuple(validation_data) + (None,) * (3 - len(validation_data))
            return ds, self._dataset(
                *val,
                None if self._backend.is_dataset(validation_data) else (validation_batch_size or batch_size),
                shuffle=False,
                distribute=tnt_distribute_validation_dataset,
                micro_batch_size=tnt_validation_micro_batch_size,
                what="validation dataset",
                whole_batches=whole_batches,
            )

        def run(
            ds: Any, val_ds: Any, first_epoch: int, resuming: bool, after: list[Any], joined: bool = False,
            steps: int | None = steps_per_epoch,
        ) -> Any:
            self._prepare_variables(ds)
            with self._backend.explain_errors("fit"):
                history = self._model.fit(
                    ds,
                    epochs=epochs,
                    verbose=self._verbose(verbose),
                    # The copy of the variables an epoch begins with comes last: after the callbacks
                    # that set them for the epoch (a learning rate schedule), inside their timings.
                    callbacks=_with_preemption_watch(
                        tnt_callbacks.wrap_all(callbacks, self, resuming=resuming, joined=joined)
                        + tnt_callbacks.standby_progress(verbose)
                    )
                    + after,
                    validation_data=val_ds,
                    class_weight=class_weight,
                    initial_epoch=first_epoch,
                    steps_per_epoch=steps,
                    validation_steps=validation_steps,
                    validation_freq=validation_freq,
                    shuffle=False,  # the dataset is already in the order every rank agrees on
                )
                _warn_if_diverged(self._model)
            return history

        if not elastic.enabled():
            return run(*datasets(), initial_epoch, False, [])
        with call_boundary.nested() as inside_another:
            if inside_another:  # part of the call around it, which recovers it
                return run(*datasets(), initial_epoch, False, [])
            while True:
                try:
                    return self._fit_elastically(datasets, run, initial_epoch, class_weight, steps_per_epoch, x)
                except call_boundary.Ahead:
                    continue  # the others had not begun this fit when the job re-formed: it begins again

    def _fit_elastically(
        self, datasets: Callable[..., Any], run: Callable[..., Any], initial_epoch: int, class_weight: Any,
        steps_per_epoch: int | None, x: Any,
    ) -> Any:
        """``fit`` in an elastic job: after a lost rank the survivors re-form the job and redo the
        step it was lost in (step_redo.py), or where they cannot, the epoch, from the variables that
        epoch began with (elastic.py)."""
        epoch_start = elastic.EpochStart(
            lambda: shared_variables.model_and_optimizer_variables(self._model), self._backend.order_state,
            self._backend.set_order_state)
        done = elastic.Epochs()
        first, step, grew = elastic.joined_at(initial_epoch)
        resume = step_redo.Resume(step)
        resuming = False

        def inputs(whole_batches: bool) -> tuple[Any, Any]:
            # Epochs of steps_per_epoch that read on through the data, made whole where they can be,
            # so that an epoch begun again reads the batches it read (short_epochs.py).
            ds, val_ds = datasets(whole_batches, first - initial_epoch)
            return short_epochs.whole(ds, steps_per_epoch, initial_epoch), val_ds

        while True:
            whole = step_redo.redoes_steps(self)
            ds, val_ds = inputs(whole)
            steps = None if isinstance(ds, short_epochs.EpochsOf) else steps_per_epoch
            redo = step_redo.attach(self, ds, val_ds, class_weight, epoch_start, resume, steps)
            if redo is None and whole:  # the steps are not redone: every pipeline is sliced as it is read
                ds, val_ds = inputs(False)
            if not resuming and (unlike := short_epochs.why_not(x, ds, steps_per_epoch)):
                logger.warning(unlike)
            epoch_start.inputs = ds
            joined = grew
            if grew:  # replacements joined: every rank reads the epoch in the order rank 0 began it with
                epoch_start.share_order(first)
                grew = False
            refused = elastic.why_no_replacements(self._backend, ds)
            epoch_start.admits = refused is None
            if refused is not None and not resuming:
                logger.warning(refused)
            if first != initial_epoch and hasattr(ds, "start_at"):  # tnt's slices of arrays and PyDatasets
                ds.start_at(first - initial_epoch)  # the epoch redone (or joined) keeps the order it had
            before = getattr(self._model, "history", None)
            epoch_start.resume = (first, resume.step)
            resume = step_redo.Resume()
            finished = None
            try:
                finished = run(ds, val_ds, first, resuming, [epoch_start], joined, steps)
                call_boundary.close()
                return done.into(finished)
            except (elastic.Reformed, *elastic.FAILURES) as e:
                attempt = getattr(self._model, "history", None)
                try:
                    first = self._back_to_an_epoch(e, redo, epoch_start, first)
                except call_boundary.Behind:  # lost in the closing collective, after every rank had finished
                    assert finished is not None
                    return done.into(finished)
            except elastic.Grown as e:
                attempt = getattr(self._model, "history", None)
                first, step = elastic.grown(self, e.epoch, e.step, state.of(self).size)
                grew = True
                resume = step_redo.Resume(step, redo.sums if redo is not None else None)
            finally:
                if redo is not None:
                    redo.uninstall()
            done.keep(attempt if attempt is not before else None, first)
            resuming = True

    def _back_to_an_epoch(
        self, error: BaseException, redo: step_redo.StepRedo | None, epoch_start: elastic.EpochStart, first: int
    ) -> int:
        """After ``error`` outside a train step (or ``Reformed`` in one): re-forms the job, puts back
        the variables of the earliest epoch a survivor was in, and returns it. A rank lost meanwhile
        starts it over."""
        while True:
            try:
                if not isinstance(error, elastic.Reformed):
                    elastic.reform(self, error, "trains the epoch it was lost in again")
                    if redo is not None:  # the survivors in a train step ask where the others were
                        step_redo.agree(in_step=False, healable=False, done=redo.done)
                return elastic.epoch_to_redo(epoch_start, first)
            except elastic.FAILURES as again:
                error = again

    def evaluate(
        self,
        x: Any = None,
        y: Any = None,
        batch_size: int | None = None,
        verbose: Any = "auto",
        sample_weight: Any = None,
        steps: int | None = None,
        callbacks: Any = None,
        return_dict: bool = False,
        tnt_micro_batch_size: int | None = None,
        tnt_distribute_dataset: bool = True,
        **kwargs: Any,
    ) -> Any:
        """As ``keras.Model.evaluate``; each rank evaluates its slice, results are global. In an
        elastic job that loses a rank meanwhile, the survivors evaluate again (elastic.py)."""

        def run() -> Any:
            ds = self._dataset(
                x,
                y,
                sample_weight,
                batch_size,
                shuffle=False,
                distribute=tnt_distribute_dataset,
                micro_batch_size=tnt_micro_batch_size,
                what="evaluation dataset",
            )
            self._prepare_variables(ds)
            with self._backend.explain_errors("evaluate"):
                return self._model.evaluate(
                    ds,
                    verbose=self._verbose(verbose),
                    steps=steps,
                    callbacks=tnt_callbacks.wrap_all(callbacks, self),
                    return_dict=return_dict,
                    **kwargs,
                )

        return self._again_after_a_loss(run, "evaluates again")

    def _again_after_a_loss(self, run: Callable[[], Any], what: str) -> Any:
        """``run()``; in an elastic job that loses a rank meanwhile, the survivors re-form the job and
        run it again (``what`` they do, for the log line), unless every rank had finished it
        (call_boundary.py)."""
        if not elastic.enabled():
            return run()
        with call_boundary.nested() as inside_another:
            if inside_another:  # part of the call around it, which recovers it
                # At an elastic fit's epoch end (a callback's evaluate or predict): one entry of the
                # epoch end's journal, made again on the ranks left where a rank is lost in it and no
                # survivor finished it, instead of training the epoch again (epoch_end.py).
                return epoch_end.collective(run)
            while True:
                finished, done = None, False
                try:
                    finished = run()
                    done = True
                    call_boundary.close()
                    return finished
                except elastic.FAILURES as e:
                    error: BaseException = e
                while True:  # a rank lost while the job re-forms: it re-forms again
                    try:
                        elastic.reform(self, error, what)
                        break
                    except call_boundary.Behind:  # lost in the closing collective: every rank had finished
                        assert done
                        return finished
                    except call_boundary.Ahead:  # the others had not begun this call: it begins again
                        break
                    except elastic.FAILURES as again:
                        error = again

    def predict(
        self,
        x: Any,
        batch_size: int | None = None,
        verbose: Any = "auto",
        steps: int | None = None,
        callbacks: Any = None,
        tnt_micro_batch_size: int | None = None,
        tnt_distribute_dataset: bool = True,
    ) -> Any:
        """As ``keras.Model.predict``; each rank predicts its slice and every rank gets the whole
        result, in the order of the input, with the model's output structure (one array, or a
        list, tuple or dict of them).

        Collective: the model is built if needed and every rank first takes rank 0's variables,
        so the predictions come from one set of weights even for a model that was never fit. In an
        elastic job that loses a rank meanwhile, the survivors predict again.
        """
        args = (x, batch_size, verbose, steps, callbacks, tnt_micro_batch_size, tnt_distribute_dataset)
        return self._again_after_a_loss(lambda: self._predict(*args), "predicts again")

    def _predict(
        self, x: Any, batch_size: int | None, verbose: Any, steps: int | None, callbacks: Any,
        tnt_micro_batch_size: int | None, tnt_distribute_dataset: bool,
    ) -> Any:
        ds = self._dataset(
            x,
            None,
            None,
            batch_size,
            shuffle=False,
            distribute=tnt_distribute_dataset,
            micro_batch_size=tnt_micro_batch_size,
            what="prediction dataset",
        )
        inner = self._model
        self._backend.build_for_predict(inner, ds)
        predictions.sync_variables(inner)
        wrapped = tnt_callbacks.wrap_all(callbacks, self)
        if state.of(self).size == 1 or not tnt_distribute_dataset:
            with self._backend.explain_errors("predict"):
                return inner.predict(ds, verbose=self._verbose(verbose), steps=steps, callbacks=wrapped)
        steps_per_execution = inner.steps_per_execution
        if steps_per_execution != 1:  # one call per global batch keeps the reassembly simple
            inner.steps_per_execution, inner.predict_function = 1, None
        inner.make_predict_function()  # returns nothing when it makes a new one
        counter = predictions.RowCounter(inner.predict_function, self._backend.predicted_outputs)
        inner.predict_function = counter
        try:
            with self._backend.explain_errors("predict"):
                local = inner.predict(ds, verbose=self._verbose(verbose), steps=steps, callbacks=wrapped)
        finally:
            # The traced function stays for the next call, unless it was traced for one step only.
            inner.predict_function = counter.function if steps_per_execution == 1 else None
            inner.steps_per_execution = steps_per_execution
        rows = tnt_comm.allgather(np.asarray(counter.rows, dtype=np.int64))  # (ranks, batches)
        return predictions.reassemble(local, rows)

    # -- weights and files -------------------------------------------------------------------------

    def set_weights(self, weights: Any) -> None:
        """Sets the weights, then every rank takes rank 0's (so all ranks stay identical)."""
        self._model.set_weights(weights)
        shared_variables.broadcast_variables(self._model.weights)

    def set_state_tree(self, state_tree: dict[str, Any]) -> None:
        """As Keras' ``set_state_tree``, then every rank takes rank 0's model and optimizer variables."""
        self._model.set_state_tree(state_tree)
        shared_variables.broadcast_variables(shared_variables.model_and_optimizer_variables(self._model))

    def _writes_here(self, tnt_save_all_devices: bool) -> bool:
        return tnt_save_all_devices or runtime.is_master_rank()

    def save(
        self,
        filepath: str | os.PathLike[str],
        overwrite: bool = True,
        tnt_save_all_devices: bool = False,
        **kwargs: Any,
    ) -> None:
        """Saves the whole model to a ``.keras`` file, on the master rank only, atomically.

        The file holds the wrapped Keras model, as its own ``save`` writes it: plain Keras loads it
        without tnt, and ``tnt.models.load_model`` loads it as a ``tnt.Model``.

        Collective: call it on every rank. Every rank returns once the file is written, or raises if
        the master rank (with ``tnt_save_all_devices=True``, any rank) failed to write it: that rank
        raises its own error, the others an error that names it and quotes its error. With
        ``overwrite=False`` every rank raises ``FileExistsError`` if the file exists.

        Raises:
            OSError: (or what else the write raised) the file could not be written, on any rank.
            FileExistsError: ``overwrite=False`` and the file exists.
            ValueError: the name does not end in ``.keras``, on every rank before anything is written.
        """
        path = os.fspath(filepath)
        if path.endswith((".h5", ".hdf5")):
            raise ValueError(
                f"tnt: cannot save a tnt.Model to the legacy HDF5 file {path!r}: it could not be loaded back as a "
                "tnt.Model. Save to a .keras file (model.save('model.keras')), or only the weights "
                "(model.save_weights('model.weights.h5'))."
            )
        if not path.endswith(".keras"):
            raise ValueError(f"tnt: whole-model files end in .keras (got {path!r}); for SavedModel use export()")
        files.refuse_existing(path, overwrite, tnt_save_all_devices)
        outcome.write_and_agree(
            f"save {path!r}",
            self._writes_here(tnt_save_all_devices),
            lambda: files.write_atomically(
                path, lambda tmp: keras.saving.save_model(self._model, tmp, **kwargs), overwrite
            ),
        )

    def save_weights(
        self,
        filepath: str | os.PathLike[str],
        overwrite: bool = True,
        tnt_save_all_devices: bool = False,
        max_shard_size: float | None = None,
        **kwargs: Any,
    ) -> None:
        """Saves the wrapped model's weights (loadable by plain Keras too), on the master rank only.

        The name ends in ``.weights.h5``; with ``max_shard_size`` (GB per shard) in ``.weights.json``,
        and Keras writes the shards ``<name>_00000.weights.h5``, ... beside it. Collective, and
        raises on every rank if a rank failed to write, as ``save``.
        """
        path = os.fspath(filepath)
        files.check_weights_path(path, sharded=max_shard_size is not None)
        files.refuse_existing(path, overwrite, tnt_save_all_devices)
        outcome.write_and_agree(
            f"save weights to {path!r}",
            self._writes_here(tnt_save_all_devices),
            lambda: files.write_atomically(
                path,
                lambda tmp: self._model.save_weights(tmp, overwrite=True, max_shard_size=max_shard_size, **kwargs),
                overwrite,
            ),
        )

    def load_weights(self, filepath: str | os.PathLike[str], *args: Any, **kwargs: Any) -> None:
        """Loads weights on every rank, then all ranks take rank 0's values.

        Takes what Keras 3 takes: ``.weights.h5``, a sharded save's ``.weights.json``, a whole-model
        ``.keras`` file, or a legacy ``.h5`` file. Collective: it first waits for all ranks, so a
        file rank 0 has just written is complete.
        """
        path = os.fspath(filepath)
        shared_variables.barrier()
        # A serialized tnt.Model (an earlier tnt's save, keras.saving.save_model of a tnt.Model) keeps
        # the weights beneath the wrapper; every other file is a Keras model's.
        target = self if path.endswith(".keras") and files.is_wrapper_file(path) else self._model
        keras.Model.load_weights(target, path, *args, **kwargs)
        shared_variables.broadcast_variables(shared_variables.model_and_optimizer_variables(self._model))

    def export(self, filepath: str | os.PathLike[str], *args: Any, tnt_save_all_devices: bool = False, **kwargs: Any):
        """Exports the wrapped model (e.g. a SavedModel for serving), on the master rank only.

        Collective, and raises on every rank if a rank failed to write, as ``save``. Returns what
        Keras' ``export`` returns on the ranks that export, None on the others.
        """
        return outcome.write_and_agree(
            f"export {os.fspath(filepath)!r}",
            self._writes_here(tnt_save_all_devices),
            lambda: self._model.export(filepath, *args, **kwargs),
        )


_FORWARDED = frozenset(
    {name for name in dir(keras.Model) if not name.startswith("_") and name not in INTERCEPTED}
    | set(FORWARDED_ATTRIBUTES)
)
for _name in sorted(_FORWARDED):
    setattr(Model, _name, Forwarded(_name))
del _name
