"""Saving and loading on 2 real ranks: whole model, weights, config, json, clone, export."""

import pytest
from launch import run


@pytest.mark.timeout(360)
def test_save_load_round_trips() -> None:
    result = run("saving_job", 2, timeout=340)
    r0, r1 = result.ranks
    for r in (r0, r1):
        for kind in ("functional", "sequential", "subclassed", "custom_step"):
            k = r[kind]
            assert k["whole_is_tnt"] and k["whole_compiled"], kind
            assert k["whole_err"] == 0, (kind, k["whole_err"])  # same state, same steps: bitwise equal
            assert k["weights_err"] == 0 and k["load_weights_err"] == 0, kind
            for name in ("config", "from_config", "json", "clone"):
                assert k[f"{name}_is_tnt"] and k[f"{name}_err"] == 0, (kind, name)
        assert r["mixed_optimizer"] == "LossScaleOptimizer"
        assert r["mixed_err"] < 1e-2, r["mixed_err"]
    assert r0["mixed_weights"] == r1["mixed_weights"]
    assert r0["exported"]
    assert not [f for f in r0["files"] if "tnt-tmp" in f]
