"""Whole-model and architecture functions that return ``tnt.Model``s (as ``keras.models``)."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import keras

from . import variables
from .configs import from_bare_config, is_wrapper_config
from .forwarding import NO_CLASS
from .model import Model


def _as_tnt(model: keras.Model) -> Model:
    return model if isinstance(model, Model) else Model(model)


def save_model(
    model: keras.Model,
    filepath: str | os.PathLike[str],
    overwrite: bool = True,
    tnt_save_all_devices: bool = False,
    **kwargs: Any,
) -> None:
    """Saves a ``tnt.Model`` or a plain ``keras.Model`` to a ``.keras`` file, on the master rank only.
    The file holds the Keras model (the wrapped one of a ``tnt.Model``): plain Keras loads it too."""
    _as_tnt(model).save(filepath, overwrite=overwrite, tnt_save_all_devices=tnt_save_all_devices, **kwargs)


def load_model(
    filepath: str | os.PathLike[str], custom_objects: Any = None, compile: bool = True, **kwargs: Any
) -> Model:
    """Loads a ``.keras`` file as a ``tnt.Model``: compiled, with its optimizer state, if it was saved
    compiled and ``compile`` is True; uncompiled with ``compile=False``. The file may come from
    ``tnt.Model.save`` or from plain Keras; Keras loads the model and tnt wraps it.

    Collective: call it on every rank. It first waits for all ranks, so a file that rank 0 has
    just written (``save``, ``ModelCheckpoint``) is complete before anyone reads it; every rank
    then reads the file, and all take rank 0's weights and optimizer state.
    """
    variables.barrier()
    loaded = keras.saving.load_model(filepath, custom_objects=custom_objects, compile=compile, **kwargs)
    model = _as_tnt(loaded)
    variables.broadcast_variables(variables.model_and_optimizer_variables(model.model))
    return model


def model_from_config(config: dict[str, Any], custom_objects: Any = None) -> Model:
    """A new, uncompiled ``tnt.Model`` around the model that Keras rebuilds from ``config``.

    ``config`` is a serialized model, ``{"class_name": ..., "config": ...}`` as
    ``keras.saving.serialize_keras_object(model)`` and ``json.loads(model.to_json())`` give it (of a
    tnt or a Keras model), or the bare ``get_config()`` of a Functional or Sequential model (wrapped
    or not). A subclassed model's bare ``get_config()`` does not name its class: wrap what the class
    rebuilds, ``tnt.Model(MyModel.from_config(config))``.
    """
    if "class_name" not in config:  # the bare output of get_config()
        if is_wrapper_config(config):  # of an earlier tnt version
            return Model.from_config(config, custom_objects=custom_objects)
        inner = from_bare_config(config, custom_objects)
        if inner is None:
            raise ValueError(NO_CLASS)
        return Model(inner)
    # Keras would compile the model from the serialized compile settings; an architecture is uncompiled.
    # Keras also consumes the dict it deserializes: the caller's config stays reusable.
    config = copy.deepcopy({k: v for k, v in config.items() if k != "compile_config"})
    model = keras.saving.deserialize_keras_object(config, custom_objects=custom_objects)
    if not isinstance(model, keras.Model):
        raise TypeError(f"tnt: the config describes a {type(model).__name__}, not a keras.Model")
    return _as_tnt(model)


def model_from_json(json_string: str, custom_objects: Any = None) -> Model:
    """A new, uncompiled ``tnt.Model`` from ``to_json()`` output (of a tnt or a Keras model)."""
    return model_from_config(json.loads(json_string), custom_objects=custom_objects)


def clone_model(model: keras.Model, *args: Any, **kwargs: Any) -> Model:
    """A ``tnt.Model`` with the same architecture and fresh weights, as ``keras.models.clone_model``."""
    inner = model.model if isinstance(model, Model) else model
    return Model(keras.models.clone_model(inner, *args, **kwargs))
