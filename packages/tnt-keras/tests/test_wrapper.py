"""tnt.Model is indistinguishable from the model it wraps, except where tnt intercepts (one rank)."""

import pytest
from conftest import BACKENDS, skip_unless_installed
from launch import run

# Its jobs run in their backend's bundles (launch.BUNDLES).
pytestmark = pytest.mark.bundled

KINDS = ("functional", "sequential", "subclassed")
CLASSES = {"functional": "Functional", "sequential": "Sequential", "subclassed": "Subclassed"}


@pytest.fixture(scope="module", params=BACKENDS)
def result(request: pytest.FixtureRequest) -> dict:
    """The job's report on each backend (once per module and backend: every test reads it)."""
    skip_unless_installed(request.param)
    return run("wrapper_job", 1, timeout=280, backend=request.param).ranks[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", KINDS)
def test_every_public_name_is_the_wrapped_models_or_intercepted(result: dict, kind: str) -> None:
    r = result[kind]
    assert r["problems"] == [], "\n".join(r["problems"])
    kinds = r["kinds"]
    assert set(kinds) >= set(result["public"]) - {"fit"}  # every public name was looked at
    # The names the issue named are forwarded values and methods.
    assert kinds["input_spec"] == "value" and kinds["layers"] == "value" and kinds["optimizer"] == "value"
    for name in ("compute_output_shape", "count_params", "get_weights", "summary", "get_config", "to_json"):
        assert kinds[name] == "method", name


def test_the_intercepted_names_are_few_and_explained(result: dict) -> None:
    assert all(result["reasons"].values())
    assert set(result["not_forwarded"]) == set(result["intercepted"]) & set(result["public"])
    for name in ("fit", "evaluate", "predict", "compile", "save", "save_weights", "load_weights", "set_weights"):
        assert name in result["intercepted"]
    for name in ("input_spec", "compute_output_shape", "get_config", "to_json", "summary", "get_weights"):
        assert name not in result["intercepted"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", KINDS)
def test_representative_methods_give_the_wrapped_models_results(result: dict, kind: str) -> None:
    c = result[kind]["calls"]
    assert c["input_spec"][0] == c["input_spec"][1]
    if kind == "functional":
        assert c["input_spec"][0] == "[InputSpec(shape=(None, 6), ndim=2)]"  # the example: was None
    if kind == "subclassed":
        assert c["output_shape"] == "both raise"  # as plain Keras for a subclassed model without it
    else:
        assert c["output_shape"] == [[None, 3], [None, 3]]
    assert c["output_spec"][0] == c["output_spec"][1] == [[None, 3], "float32"]
    assert c["symbolic_shape"] == [None, 3]
    assert c["count_params"][0] == c["count_params"][1] > 0
    assert c["weights_equal"] and c["summary_equal"] and c["layer"] and c["state_tree_equal"]
    assert c["call_equal"] and c["predict_on_batch_equal"] and c["set_state_tree_kept"]
    assert c["trainable_set"] == [False, False, 0] and c["trainable_reset"] is True


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", KINDS)
def test_config_and_json_are_the_wrapped_models(result: dict, kind: str) -> None:
    c = result[kind]["calls"]
    assert c["config_equal"] and c["json_equal"]
    assert c["keras_from_json"] == c["keras_from_config"] == CLASSES[kind]  # plain Keras rebuilds a plain model
    assert c["keras_clone"] == ["Model", CLASSES[kind], CLASSES[kind]]  # Keras clones a tnt.Model as a tnt.Model
    for name, (is_tnt, cls, same_config) in c["rebuilt"].items():
        assert is_tnt and cls == CLASSES[kind] and same_config, name
    if kind == "subclassed":
        assert not c["config_has_layers"]
        # A subclassed model's bare config does not name its class: refused, with the fix.
        assert "MyModel.from_config(config)" in c["bare_config_refused"]
        assert "does not name the model's class" in c["from_config_awaiting"]
    else:
        assert c["config_has_layers"] and c["last_layer_name"]
        assert c["keras_class_from_config"] == CLASSES[kind]
        assert set(c["rebuilt"]) >= {"bare_config", "from_config"}
