"""How ``tnt.Model`` shows the wrapped model through: which names it intercepts (and why), and the
descriptor that reads, calls and sets every other public name on the wrapped model."""

from __future__ import annotations

import inspect
from typing import Any

import keras

from . import state

# The public names of ``keras.Model`` that ``tnt.Model`` does not hand to the wrapped model, and why.
# Every other public name of ``keras.Model``, and the attributes in ``FORWARDED_ATTRIBUTES``, is the
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
    # On the torch backend, where a Keras model is a torch module: torch's call of the wrapper runs its
    # forward, which must be the wrapper's own (it calls the wrapped model as a layer, with Keras'
    # handling of training=, dtypes and masks), not the wrapped model's run on the wrapper's arguments.
    "forward": "the wrapper is a torch module of its own (torch backend), whose forward calls the wrapped model",
}

# Attributes that Keras documents but sets on each model instance, not on the class; the wrapper's own
# Keras initialisation would otherwise hide the wrapped model's.
FORWARDED_ATTRIBUTES = ("compiled", "optimizer", "steps_per_execution", "stop_training")

NO_CLASS = (
    "tnt: this config does not name the model's class (a subclassed model's get_config() holds only its own "
    "arguments), so no model can be rebuilt from it. Rebuild it with its class and wrap it, "
    "tnt.Model(MyModel.from_config(config)), or keep a config that names the class: model.to_json() or "
    "keras.saving.serialize_keras_object(model)."
)


def wrapped(obj: Any) -> keras.Model | None:
    """The wrapped model, without going through attribute lookup (which forwards to it). On the torch
    backend a Keras model is a torch module, which keeps the modules assigned to it in ``_modules``."""
    model = obj.__dict__.get("_model")
    if model is None:
        model = obj.__dict__.get("_modules", {}).get("_model")
    return model


def awaiting(obj: Any) -> bool:
    return "awaiting" in state.of(obj).local


class Forwarded:
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
        model = wrapped(obj)
        if model is not None:
            return getattr(model, self.name)
        if awaiting(obj):
            raise AttributeError(f"{self.name}: {NO_CLASS}")
        if self.name in obj.__dict__:
            return obj.__dict__[self.name]
        return self._base_get(obj, owner)

    def __set__(self, obj: Any, value: Any) -> None:
        model = wrapped(obj)
        if model is not None:
            setattr(model, self.name, value)
        elif hasattr(self.base, "__set__"):
            self.base.__set__(obj, value)
        else:
            obj.__dict__[self.name] = value

    def __delete__(self, obj: Any) -> None:
        model = wrapped(obj)
        if model is not None:
            delattr(model, self.name)
        elif self.name in obj.__dict__:
            del obj.__dict__[self.name]
        else:
            raise AttributeError(self.name)
