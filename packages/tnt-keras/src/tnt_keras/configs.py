"""Rebuilding a wrapped model from a config: a bare Functional or Sequential config, or the configs
earlier tnt versions wrote."""

from __future__ import annotations

import copy
from typing import Any

import keras


def is_wrapper_config(config: dict[str, Any]) -> bool:
    """A config written by tnt before its configs were the wrapped model's: ``{"model": ..., "name": ...}``."""
    inner = config.get("model")
    return isinstance(inner, dict) and "class_name" in inner and "layers" not in config


SEQUENTIAL_KEYS = frozenset({"name", "trainable", "dtype", "layers", "build_input_shape"})


def from_bare_config(config: dict[str, Any], custom_objects: Any = None) -> keras.Model | None:
    """The Functional or Sequential model that a bare ``get_config()`` describes, rebuilt as Keras
    does (from a copy: Keras consumes the config); None for any other config (a subclassed model's
    does not name its class)."""
    if all(key in config for key in ("name", "layers", "input_layers", "output_layers")):
        return keras.Model.from_config(copy.deepcopy(config), custom_objects=custom_objects)
    layers = config.get("layers")
    if (
        "name" in config
        and set(config) <= SEQUENTIAL_KEYS
        and isinstance(layers, list)
        and all(isinstance(layer, dict) and "class_name" in layer for layer in layers)
    ):
        return keras.Sequential.from_config(copy.deepcopy(config), custom_objects=custom_objects)
    return None
