"""``tnt.Model``: a Keras model that trains data-parallel over all ranks, on any supported backend.

The wrapper keeps the user's model whole and lets Keras run it: ``fit``, ``evaluate`` and ``predict``
hand each rank its slice of every global batch and then call the wrapped model's own methods, whose
train step (Keras' or the user's override) has been given three hooks: gradients summed across
ranks before the optimizer applies them, metric results on states summed across ranks
(``metrics.py``), and callbacks that run, print and write per rank policy (``callbacks.py``). A step
on a rank whose slice of a partial last batch is empty changes nothing there. What depends on the
Keras backend (the gradient sum, slicing the inputs, the empty-slice guard) lives in ``backends/``.
"""

from __future__ import annotations

import copy
import inspect
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tnt_comm

from . import backends, metrics, outcome, runtime
from . import callbacks as tnt_callbacks
from . import variables as shared_variables
from .runtime import logger

_BN_WARN_BELOW = 16


def _exists_error(path: str) -> FileExistsError:
    return FileExistsError(f"tnt: {path} exists and overwrite=False; pass overwrite=True to replace it")


def _refuse_existing(path: str, overwrite: bool, tnt_save_all_devices: bool) -> None:
    """With ``overwrite=False``, raises the same ``FileExistsError`` on every rank if ``path`` exists.

    The master rank looks and tells the others, since a rank that looked itself might already see
    the file the master is writing. When every rank writes its own file, each looks at its own as
    it writes (``_write_atomically``), and a refusal reaches every rank as any failed write does.
    """
    if overwrite or tnt_save_all_devices:
        return
    exists = os.path.exists(path)
    if not outcome.is_alone():
        flag = np.array([int(exists)], dtype=np.int32)
        exists = bool(tnt_comm.broadcast(flag, root=runtime.get_master_rank())[0])
    if exists:
        raise _exists_error(path)


def _shard_names(index: str) -> set[str]:
    """The shard files that the Keras ``.weights.json`` index at ``index`` names (none if unreadable)."""
    try:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        names = [n for v in weight_map.values() for n in (v if isinstance(v, list) else [v])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()
    # Plain shard names only: an index must never lead us to delete other files or leave the folder.
    return {n for n in names if isinstance(n, str) and n == os.path.basename(n) and n.endswith(".weights.h5")}


def _write_atomically(filepath: str | os.PathLike[str], write: Callable[[str], None], overwrite: bool = True) -> None:
    """Has ``write`` save under the same name in a new folder beside ``filepath``, then moves what
    it wrote into place. The name must stay: Keras names the shards of a sharded save after it.

    Each file is replaced in one step, so a crash leaves the old file whole, never a half-written
    one. For a sharded save the old index goes first and the new one last, so an index never
    names a mix of old and new shards; shards that only the old index named are then removed.
    With ``overwrite=False``, an existing file is left alone and ``FileExistsError`` raised.
    """
    if not overwrite and os.path.exists(filepath):
        raise _exists_error(os.fspath(filepath))
    path = os.path.abspath(os.fspath(filepath))
    directory, name = os.path.split(path)
    os.makedirs(directory, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(prefix=f".{name}.tnt-tmp-", dir=directory)
    try:
        write(os.path.join(tmp_dir, name))
        shards = sorted(f for f in os.listdir(tmp_dir) if f != name)
        stale = _shard_names(path) - set(shards) if shards else set()
        if shards and os.path.lexists(path):
            os.remove(path)
        for shard in shards:
            os.replace(os.path.join(tmp_dir, shard), os.path.join(directory, shard))
        os.replace(os.path.join(tmp_dir, name), path)
        for shard in stale:
            try:
                os.remove(os.path.join(directory, shard))
            except FileNotFoundError:
                pass
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _check_weights_path(path: str, sharded: bool) -> None:
    """Refuses, on every rank alike and before writing, a name Keras 3 would refuse or change."""
    stem = path
    for suffix in (".weights.json", ".weights.h5", ".keras", ".h5", ".hdf5"):
        if path.endswith(suffix):
            stem = path[: -len(suffix)]
            break
    if sharded:
        if not path.endswith(".weights.json"):
            raise ValueError(
                "tnt: with max_shard_size, Keras 3 writes a .weights.json index and .weights.h5 shards beside it, "
                f"so the name must end in .weights.json (got {path!r}): save_weights({stem + '.weights.json'!r}, "
                "max_shard_size=...)"
            )
        return
    if path.endswith(".weights.h5"):
        return
    h5 = stem + ".weights.h5"
    if path.endswith(".weights.json"):
        fix = f"a .weights.json file is a sharded save: pass max_shard_size (in GB), or save to {h5!r}"
    elif path.endswith(".keras"):
        fix = f"a .keras file holds the whole model: use save({path!r}), or save_weights({h5!r}) for the weights"
    else:
        fix = f"use save_weights({h5!r})"
    raise ValueError(f"tnt: Keras 3 weights files end in .weights.h5 (got {path!r}); {fix}")


def _accepts_keyword(function: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


class _RowCounter:
    """Wraps a model's predict function and counts the rows each batch yields, to put every rank's
    slices back in order.

    It reads the outputs as the predict function returns them: callbacks see them only through
    logs that Keras flattens (dict outputs lose the ``outputs`` key), and a batch-end callback
    would count as one more callback with a batch hook in Keras' check for asynchronous dispatch.
    """

    def __init__(self, function: Callable[[Any], Any]) -> None:
        self.function = function
        self.rows: list[int] = []

    def __call__(self, data: Any) -> Any:
        outputs = self.function(data)
        leaves = [t for t in keras.tree.flatten(outputs) if t is not None]
        self.rows.append(int(leaves[0].shape[0]) if leaves else 0)
        return outputs


def _sync_for_predict(model: keras.Model) -> None:
    """Gives every rank rank 0's model variables (not the optimizer's: predict needs none).

    Collective. Ranks may differ before predict: a model that was never fit has each rank's own
    random initial weights, and fit updates BatchNormalization's moving statistics from each rank's
    own slices. Only variables whose checksums differ somewhere are broadcast, so repeated
    predictions on weights that are already equal cost two small allgathers.
    """
    variables = shared_variables.unique_variables(model.variables)
    if tnt_comm.size() == 1:
        return
    shared_variables.check_same_variables(variables, "model variables")
    if not variables:
        return
    differ = shared_variables.differing_variables(variables)
    if any(differ):
        stale = [v for v, d in zip(variables, differ, strict=True) if d]
        shared_variables.broadcast_variables(stale, checked=True)


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


# The public names of ``keras.Model`` that ``tnt.Model`` does not hand to the wrapped model, and why.
# Every other public name of ``keras.Model``, and the attributes in ``_FORWARDED_ATTRIBUTES``, is the
# wrapped model's own: read, called and set there.
INTERCEPTED: dict[str, str] = {
    "fit": "slices every global batch over the ranks, gives every rank rank 0's variables first, "
    "and applies tnt's callback policy",
    "evaluate": "slices every global batch over the ranks and gives every rank rank 0's variables first",
    "predict": "slices every global batch over the ranks and gathers all predictions, in input order, on every rank",
    "compile": "refuses jit_compile=True and Ftrl, and installs the gradient sum and the global metrics",
    "compile_from_config": "compiles through tnt's compile",
    "save": "writes the wrapped model's .keras file, on rank 0 only and atomically; collective: a failed write "
    "raises on every rank",
    "save_weights": "writes on rank 0 only and atomically, after checking the name on every rank; collective: a "
    "failed write raises on every rank",
    "load_weights": "collective: waits for every rank, then every rank takes rank 0's values",
    "set_weights": "collective: every rank takes rank 0's values",
    "set_state_tree": "collective: every rank takes rank 0's values",
    "export": "exports on rank 0 only; collective: a failed export raises on every rank",
    "from_config": "wraps the model that Keras rebuilds from the wrapped model's config",
    "get_build_config": "adds the wrapped model's class, which a subclassed model's config does not name",
    "build_from_config": "rebuilds the wrapped model of that class when Keras deserializes a tnt.Model",
    "call": "the wrapper is a Keras layer of its own, and calling it calls the wrapped model",
    "compute_output_spec": "forwards, leaving out the training and mask arguments that the wrapped model's call "
    "does not take (as calling the wrapped model would)",
    "symbolic_call": "Keras' machinery for calling the wrapper itself as a layer",
    "quantized_call": "Keras' machinery for calling the wrapper itself as a layer",
    "rematerialized_call": "Keras' machinery for calling the wrapper itself as a layer",
    "save_own_variables": "Keras' saving walks the wrapper itself: it has no variables of its own, and the wrapped "
    "model's are saved beneath it",
    "load_own_variables": "Keras' saving walks the wrapper itself (as save_own_variables)",
}

# Attributes that Keras documents but sets on each model instance, not on the class; the wrapper's own
# Keras initialisation would otherwise hide the wrapped model's.
_FORWARDED_ATTRIBUTES = ("compiled", "optimizer", "steps_per_execution", "stop_training")

_NO_CLASS = (
    "tnt: this config does not name the model's class (a subclassed model's get_config() holds only its own "
    "arguments), so no model can be rebuilt from it. Rebuild it with its class and wrap it, "
    "tnt.Model(MyModel.from_config(config)), or keep a config that names the class: model.to_json() or "
    "keras.saving.serialize_keras_object(model)."
)


def _wrapped(obj: Any) -> keras.Model | None:
    """The wrapped model, without going through attribute lookup (which forwards to it). On the torch
    backend a Keras model is a torch module, which keeps the modules assigned to it in ``_modules``."""
    model = obj.__dict__.get("_model")
    if model is None:
        model = obj.__dict__.get("_modules", {}).get("_model")
    return model


def _awaiting(obj: Any) -> bool:
    local = obj.__dict__.get("_tnt_local")
    return bool(local) and "awaiting" in local


class _Forwarded:
    """The wrapped model's attribute ``name``: read, called, set and deleted on the wrapped model.

    Until a wrapped model is attached (while Keras initialises the wrapper as a layer of its own), it
    is the wrapper's own attribute, as ``keras.Model`` defines it.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.base = inspect.getattr_static(keras.Model, name, None)
        self.__doc__ = getattr(self.base, "__doc__", None)

    def _base_get(self, obj: Any, owner: Any) -> Any:
        if self.base is None:
            raise AttributeError(self.name)
        return self.base.__get__(obj, owner) if hasattr(self.base, "__get__") else self.base

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:  # on the class: Keras' attribute, for help() and inspect
            return self._base_get(None, owner)
        model = _wrapped(obj)
        if model is not None:
            return getattr(model, self.name)
        if _awaiting(obj):
            raise AttributeError(f"{self.name}: {_NO_CLASS}")
        if self.name in obj.__dict__:
            return obj.__dict__[self.name]
        return self._base_get(obj, owner)

    def __set__(self, obj: Any, value: Any) -> None:
        model = _wrapped(obj)
        if model is not None:
            setattr(model, self.name, value)
        elif hasattr(self.base, "__set__"):
            self.base.__set__(obj, value)
        else:
            obj.__dict__[self.name] = value

    def __delete__(self, obj: Any) -> None:
        model = _wrapped(obj)
        if model is not None:
            delattr(model, self.name)
        elif self.name in obj.__dict__:
            del obj.__dict__[self.name]
        else:
            raise AttributeError(self.name)


def _is_wrapper_config(config: dict[str, Any]) -> bool:
    """A config written by tnt before its configs were the wrapped model's: ``{"model": ..., "name": ...}``."""
    inner = config.get("model")
    return isinstance(inner, dict) and "class_name" in inner and "layers" not in config


_SEQUENTIAL_KEYS = frozenset({"name", "trainable", "dtype", "layers", "build_input_shape"})


def _from_bare_config(config: dict[str, Any], custom_objects: Any = None) -> keras.Model | None:
    """The Functional or Sequential model that a bare ``get_config()`` describes, rebuilt as Keras
    does (from a copy: Keras consumes the config); None for any other config (a subclassed model's
    does not name its class)."""
    if all(key in config for key in ("name", "layers", "input_layers", "output_layers")):
        return keras.Model.from_config(copy.deepcopy(config), custom_objects=custom_objects)
    layers = config.get("layers")
    if (
        "name" in config
        and set(config) <= _SEQUENTIAL_KEYS
        and isinstance(layers, list)
        and all(isinstance(layer, dict) and "class_name" in layer for layer in layers)
    ):
        return keras.Sequential.from_config(copy.deepcopy(config), custom_objects=custom_objects)
    return None


def _is_wrapper_file(path: str) -> bool:
    """Whether a ``.keras`` file holds a serialized ``tnt.Model`` (whose weights lie beneath the
    wrapper) rather than a Keras model (as ``tnt.Model.save`` writes)."""
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return False
    return isinstance(config, dict) and config.get("registered_name") == "tnt>Model"


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
        self._tnt_local: dict[str, Any] = {}
        keras.Model.__init__(self, **kwargs)
        self._tnt_rank = runtime.get_rank()
        self._tnt_size = runtime.get_size()
        self._backend = backends.current()

    def _adopt(self, model: keras.Model) -> None:
        self._model = model
        self.built = True
        if model.compiled:
            self._install_hooks()

    # -- the wrapped model shows through ---------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        model = _wrapped(self)
        if model is None or name.startswith("__"):
            if model is None and _awaiting(self) and (name == "_model" or not name.startswith("_")):
                raise AttributeError(f"{name}: {_NO_CLASS}")
            raise AttributeError(name)
        if name == "_model":  # on torch, kept among the torch module's submodules
            return model
        return getattr(model, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # Straight to the wrapped model, without tracking the value in the wrapper first.
        model = _wrapped(self)
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
        model = _wrapped(self)
        return model._initial_epoch if model is not None else self._tnt_local.get("_initial_epoch")

    @_initial_epoch.setter
    def _initial_epoch(self, value: Any) -> None:
        model = _wrapped(self)
        if model is None:
            self._tnt_local["_initial_epoch"] = value
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
        if _is_wrapper_config(config):
            # Earlier tnt versions' configs, {"model": <serialized model>, "name": ...}, some with the
            # wrapped model's compile settings, which a config leaves out. Keras consumes what it
            # deserializes: the caller's config stays reusable.
            inner_config = {k: v for k, v in config["model"].items() if k != "compile_config"}
            inner = keras.saving.deserialize_keras_object(copy.deepcopy(inner_config), custom_objects=custom_objects)
            return cls(inner, name=config.get("name"))
        inner = _from_bare_config(config, custom_objects)
        if inner is not None:
            return cls(inner)
        # Keras' deserialization calls build_from_config next, with the class; until then the wrapper
        # has no wrapped model, and using it raises an error that says so.
        wrapper = cls.__new__(cls)
        wrapper._start(name=f"tnt_{config.get('name', 'model')}")
        wrapper._tnt_local["awaiting"] = (copy.deepcopy(config), custom_objects)
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
        awaiting = self._tnt_local.pop("awaiting", None)
        if awaiting is not None:
            if not named:
                raise ValueError(_NO_CLASS)
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
        arguments); XLA is refused since the collective op cannot run under it."""
        if jit_compile is True:
            raise ValueError(
                "tnt: jit_compile=True is not supported: XLA cannot run tnt's gradient collective. "
                "Leave jit_compile unset (tnt compiles the step with jit_compile=False)."
            )
        inner = self._model
        if _accepts_keyword(inner.compile, "jit_compile"):
            inner.compile(*args, jit_compile=False, **kwargs)
        else:  # a compile override with arguments of its own (several optimizers, say)
            inner.compile(*args, **kwargs)
            inner.jit_compile = False
        for optimizer in shared_variables.model_optimizers(inner):
            shared_variables.check_optimizer(optimizer)
        self._warn_inexact_losses()
        self.compiled = True
        self._install_hooks()

    def _warn_inexact_losses(self) -> None:
        """Gradients are scaled by each rank's share of the batch, which is exact for losses that are
        means over the batch; not for sums, nor for means divided by the summed sample weights."""
        if self._tnt_size == 1:
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
        self._backend.install_hooks(self._model, self._tnt_size)
        metrics.install_global_metrics(self._model, self._tnt_size)

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
    ) -> Any:
        """What this rank hands to Keras: its slice of every global batch of the input."""
        return self._backend.distribute(
            x,
            y,
            sample_weight,
            batch_size,
            rank=self._tnt_rank,
            size=self._tnt_size,
            shuffle=shuffle,
            distribute=distribute,
            micro_batch_size=micro_batch_size,
            what=what,
        )

    def _verbose(self, verbose: Any) -> Any:
        if not runtime.prints_here():
            return 0
        if isinstance(verbose, str) and verbose == "auto" and not runtime.live_progress():
            # What Keras chooses for output that is not interactive: one line per epoch.
            return 2
        return verbose

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
            self._backend.build(inner, ds)
        metrics.install_global_metrics(inner, self._tnt_size)
        shared_variables.broadcast_variables(shared_variables.model_and_optimizer_variables(inner))
        self._warn_small_batch_norm(ds)

    def _warn_small_batch_norm(self, ds: Any) -> None:
        if self._tnt_size == 1 or self._tnt_local.get("bn_warned"):
            return
        global_batch = self._backend.global_batch_size(ds)
        if global_batch is None:
            return
        micro = global_batch // self._tnt_size
        has_bn = any(isinstance(layer, keras.layers.BatchNormalization) for layer in self._model._flatten_layers())
        if has_bn and micro < _BN_WARN_BELOW:
            logger.warning(
                "BatchNormalization normalises over each rank's micro-batch of %d samples (global batch %d over "
                "%d ranks); statistics over fewer than %d samples are noisy. Use a larger global batch.",
                micro,
                global_batch,
                self._tnt_size,
                _BN_WARN_BELOW,
            )
            self._tnt_local["bn_warned"] = True

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
        ds = self._dataset(
            x,
            y,
            sample_weight,
            batch_size,
            shuffle=shuffle,
            distribute=tnt_distribute_dataset,
            micro_batch_size=tnt_micro_batch_size,
            what="training dataset",
        )
        val_ds = None
        if validation_data is not None:
            if self._backend.is_dataset(validation_data):
                val = (validation_data, None, None)
            else:
                val = tuple(validation_data) + (None,) * (3 - len(validation_data))
            val_ds = self._dataset(
                *val,
                None if self._backend.is_dataset(validation_data) else (validation_batch_size or batch_size),
                shuffle=False,
                distribute=tnt_distribute_validation_dataset,
                micro_batch_size=tnt_validation_micro_batch_size,
                what="validation dataset",
            )
        self._prepare_variables(ds)
        with self._backend.explain_errors("fit"):
            history = self._model.fit(
                ds,
                epochs=epochs,
                verbose=self._verbose(verbose),
                callbacks=tnt_callbacks.wrap_all(callbacks, self),
                validation_data=val_ds,
                class_weight=class_weight,
                initial_epoch=initial_epoch,
                steps_per_epoch=steps_per_epoch,
                validation_steps=validation_steps,
                validation_freq=validation_freq,
                shuffle=False,  # the dataset is already in the order every rank agrees on
            )
            _warn_if_diverged(self._model)
        return history

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
        """As ``keras.Model.evaluate``; each rank evaluates its slice, results are global."""
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
        so the predictions come from one set of weights even for a model that was never fit.
        """
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
        _sync_for_predict(inner)
        wrapped = tnt_callbacks.wrap_all(callbacks, self)
        if self._tnt_size == 1 or not tnt_distribute_dataset:
            with self._backend.explain_errors("predict"):
                return inner.predict(ds, verbose=self._verbose(verbose), steps=steps, callbacks=wrapped)
        steps_per_execution = inner.steps_per_execution
        if steps_per_execution != 1:  # one call per global batch keeps the reassembly simple
            inner.steps_per_execution, inner.predict_function = 1, None
        inner.make_predict_function()  # returns nothing when it makes a new one
        counter = _RowCounter(inner.predict_function)
        inner.predict_function = counter
        try:
            with self._backend.explain_errors("predict"):
                local = inner.predict(ds, verbose=self._verbose(verbose), steps=steps, callbacks=wrapped)
        finally:
            # The traced function stays for the next call, unless it was traced for one step only.
            inner.predict_function = counter.function if steps_per_execution == 1 else None
            inner.steps_per_execution = steps_per_execution
        rows = tnt_comm.allgather(np.asarray(counter.rows, dtype=np.int64))  # (ranks, batches)
        return _reassemble(local, rows)

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
        _refuse_existing(path, overwrite, tnt_save_all_devices)
        outcome.write_and_agree(
            f"save {path!r}",
            self._writes_here(tnt_save_all_devices),
            lambda: _write_atomically(path, lambda tmp: keras.saving.save_model(self._model, tmp, **kwargs), overwrite),
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
        _check_weights_path(path, sharded=max_shard_size is not None)
        _refuse_existing(path, overwrite, tnt_save_all_devices)
        outcome.write_and_agree(
            f"save weights to {path!r}",
            self._writes_here(tnt_save_all_devices),
            lambda: _write_atomically(
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
        target = self if path.endswith(".keras") and _is_wrapper_file(path) else self._model
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
    | set(_FORWARDED_ATTRIBUTES)
)
for _name in sorted(_FORWARDED):
    setattr(Model, _name, _Forwarded(_name))
del _name


def _reassemble(local: Any, rows: np.ndarray) -> Any:
    """Every rank's slices of every batch, back in the order of the global batches, for every
    array of the output structure (one allgatherv per array, in the same order on every rank)."""
    order = _global_order(rows)

    def gather(array: Any) -> Any:
        if array is None:
            return None
        return tnt_comm.allgatherv(np.ascontiguousarray(array))[order]

    return keras.tree.map_structure(gather, local)


def _global_order(rows: np.ndarray) -> np.ndarray:
    """Indices into the ranks' concatenated outputs (rank 0's batches, then rank 1's, ...) that put
    them in input order: batch 0 of every rank, then batch 1, ... ``rows`` is (ranks, batches)."""
    per_rank = rows.sum(axis=1)
    begins = (np.cumsum(per_rank) - per_rank)[:, None] + np.cumsum(rows, axis=1) - rows
    pieces = [np.arange(b, b + c) for b, c in zip(begins.T.ravel(), rows.T.ravel(), strict=True)]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
