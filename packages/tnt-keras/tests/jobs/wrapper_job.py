"""tnt.Model shows the wrapped model through: every public name of keras.Model is the wrapped
model's, or one of the few that tnt intercepts (tnt_keras.model.INTERCEPTED)."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import inspect
import json
from typing import Any

import keras
import numpy as np
import tnt_keras as tnt
from _job import build, compile_args, dataset, report
from tnt_keras.model import INTERCEPTED

PUBLIC = sorted(name for name in dir(keras.Model) if not name.startswith("_"))
# Keras-documented attributes set on each instance rather than on the class.
INSTANCE = ["compiled", "optimizer", "steps_per_execution", "stop_training"]


def same(a: Any, b: Any) -> bool:
    """The same object, or equal values (element by element for lists and tuples)."""
    if a is b:
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except Exception:
        return False


def lookup(obj: Any, name: str) -> tuple[str, Any]:
    try:
        return "value", getattr(obj, name)
    except Exception as error:  # noqa: BLE001 - the kind of error is what is compared
        return "error", type(error)


def walk(wrapper: tnt.Model, inner: keras.Model) -> tuple[list[str], dict[str, str]]:
    """Checks every public name; returns the problems and how each name was found."""
    problems: list[str] = []
    kinds: dict[str, str] = {}
    for name in PUBLIC + INSTANCE:
        (how_w, w), (how_i, i) = lookup(wrapper, name), lookup(inner, name)
        if name in INTERCEPTED:
            kinds[name] = "intercepted"
            if how_w != "value" or not callable(w):
                problems.append(f"{name}: intercepted but not a method of the wrapper")
            continue
        if how_w != how_i:
            problems.append(f"{name}: the wrapper gives {how_w} {w}, the wrapped model {how_i} {i}")
            continue
        if how_w == "error":
            kinds[name] = "same error"
            if w is not i:
                problems.append(f"{name}: the wrapper raises {w.__name__}, the wrapped model {i.__name__}")
            continue
        if inspect.ismethod(i) or inspect.isfunction(i):
            kinds[name] = "method"
            # A forwarded method is the wrapped model's own bound method (or its per-instance function).
            if not (w == i and (not inspect.ismethod(w) or w.__self__ is inner)):
                problems.append(f"{name}: the wrapper's method {w} is not the wrapped model's {i}")
            continue
        kinds[name] = "value"
        if not same(i, getattr(inner, name)):
            # Made afresh on every read (input_spec; the compiled_metrics shim, of a class made afresh
            # too): the same kind of value, and the same text unless that shows an address.
            if type(w).__qualname__ != type(i).__qualname__ or (repr(w) != repr(i) and " at 0x" not in repr(i)):
                problems.append(f"{name}: the wrapper gives {w!r:.80}, the wrapped model {i!r:.80}")
        elif not same(w, i):
            problems.append(f"{name}: the wrapper gives {w!r:.80}, the wrapped model {i!r:.80}")
    return problems, kinds


def as_json(config: dict[str, Any]) -> str:
    """A config as JSON: a rebuilt model's configs hold lists where the original's hold tuples."""
    return json.dumps(config, sort_keys=True)


def summary_lines(model: keras.Model) -> list[str]:
    lines: list[str] = []
    model.summary(print_fn=lambda line, *args, **kwargs: lines.append(line))
    return lines


def calls(wrapper: tnt.Model, inner: keras.Model, kind: str) -> dict[str, Any]:
    """A few representative methods called on both, and their results compared."""
    r: dict[str, Any] = {}
    try:
        r["output_shape"] = [list(wrapper.compute_output_shape((None, 6))), list(inner.compute_output_shape((None, 6)))]
    except NotImplementedError:  # a subclassed model without compute_output_shape: Keras raises on both
        try:
            inner.compute_output_shape((None, 6))
            r["output_shape"] = "wrapper only raised"
        except NotImplementedError:
            r["output_shape"] = "both raise"
    spec = [
        wrapper.compute_output_spec(keras.KerasTensor((None, 6))),
        inner.compute_output_spec(keras.KerasTensor((None, 6))),
    ]
    r["output_spec"] = [[list(s.shape), s.dtype] for s in spec]
    symbolic = wrapper(keras.Input((6,)), training=False)  # called as a layer, with an argument the call may lack
    r["symbolic_shape"] = list(symbolic.shape)
    r["count_params"] = [wrapper.count_params(), inner.count_params()]
    r["weights_equal"] = all(
        np.array_equal(a, b) for a, b in zip(wrapper.get_weights(), inner.get_weights(), strict=True)
    )
    r["summary_equal"] = summary_lines(wrapper) == summary_lines(inner) and "Total params" in "".join(
        summary_lines(inner)
    )
    r["input_spec"] = [repr(wrapper.input_spec), repr(inner.input_spec)]
    r["layer"] = wrapper.get_layer(index=len(inner.layers) - 1) is inner.layers[-1]
    r["state_tree_equal"] = json.dumps(
        {k: sorted(v) for k, v in wrapper.get_state_tree().items()}, sort_keys=True
    ) == json.dumps({k: sorted(v) for k, v in inner.get_state_tree().items()}, sort_keys=True)
    before = inner.get_weights()
    wrapper.set_state_tree(wrapper.get_state_tree())  # intercepted: every rank then takes rank 0's values
    r["set_state_tree_kept"] = all(np.array_equal(a, b) for a, b in zip(before, inner.get_weights(), strict=True))
    x = np.linspace(-1, 1, 12, dtype="float32").reshape(2, 6)
    as_numpy = keras.ops.convert_to_numpy  # a torch tensor that requires grad has no __array__
    r["call_equal"] = bool(np.array_equal(as_numpy(wrapper(x)), as_numpy(inner(x))))
    r["predict_on_batch_equal"] = bool(np.array_equal(wrapper.predict_on_batch(x), inner.predict_on_batch(x)))
    # Setting a forwarded attribute sets the wrapped model's.
    wrapper.trainable = False
    r["trainable_set"] = [wrapper.trainable, inner.trainable, len(wrapper.trainable_weights)]
    wrapper.trainable = True
    r["trainable_reset"] = inner.trainable
    # Architecture: the wrapped model's own config and JSON.
    config = wrapper.get_config()
    r["config_equal"] = config == inner.get_config()
    config_json = as_json(config)
    r["json_equal"] = wrapper.to_json() == inner.to_json()
    r["config_has_layers"] = "layers" in config
    clone = keras.models.clone_model(wrapper)
    r["keras_clone"] = [type(clone).__name__, type(getattr(clone, "model", clone)).__name__, type(inner).__name__]
    r["keras_from_json"] = type(keras.models.model_from_json(wrapper.to_json())).__name__
    # Keras 3's model_from_config: keras.saving.deserialize_keras_object of the serialized config.
    r["keras_from_config"] = type(keras.saving.deserialize_keras_object(json.loads(wrapper.to_json()))).__name__
    if kind in ("functional", "sequential"):
        r["last_layer_name"] = config["layers"][-1]["config"]["name"] == inner.layers[-1].name
        cls = keras.Sequential if kind == "sequential" else keras.Model
        r["keras_class_from_config"] = type(cls.from_config(wrapper.get_config())).__name__  # Keras consumes it
    rebuilt = {
        "model_from_config": tnt.models.model_from_config(json.loads(wrapper.to_json())),
        "model_from_json": tnt.models.model_from_json(wrapper.to_json()),
        "clone_model": tnt.models.clone_model(wrapper),
        "deserialized": keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(wrapper)),
    }
    if kind in ("functional", "sequential"):
        rebuilt["bare_config"] = tnt.models.model_from_config(config)
        rebuilt["from_config"] = tnt.Model.from_config(config)
    else:
        try:
            tnt.models.model_from_config(config)
            r["bare_config_refused"] = "no error"
        except ValueError as error:
            r["bare_config_refused"] = str(error)
        try:
            _ = tnt.Model.from_config(config).layers
            r["from_config_awaiting"] = "no error"
        except AttributeError as error:
            r["from_config_awaiting"] = str(error)
    shapes = [list(w.shape) for w in inner.weights]
    r["rebuilt"] = {
        # Keras' clone_model of a Functional model gives the clone new names: compare the weights' shapes.
        name: [
            isinstance(m, tnt.Model),
            type(m.model).__name__,
            as_json(m.model.get_config()) == config_json
            if name != "clone_model"
            else shapes == [list(w.shape) for w in m.model.weights],
        ]
        for name, m in rebuilt.items()
    }
    return r


results: dict[str, Any] = {"intercepted": sorted(INTERCEPTED), "public": PUBLIC}
for kind in ("functional", "sequential", "subclassed"):
    inner = build(kind)
    wrapper = tnt.Model(inner)
    wrapper.compile(**compile_args("adam"))
    wrapper.fit(dataset(24, 12), epochs=1, verbose=0)
    problems, kinds = walk(wrapper, inner)
    results[kind] = {"problems": problems, "kinds": kinds, "calls": calls(wrapper, inner, kind)}

# Every intercepted name is a public name of keras.Model with a reason, and only those are not forwarded.
results["reasons"] = {name: bool(reason.strip()) for name, reason in INTERCEPTED.items()}
results["not_forwarded"] = sorted(
    name for name in PUBLIC if type(inspect.getattr_static(tnt.Model, name)).__name__ != "Forwarded"
)
report(results)
