"""Saving and loading on 2 real ranks: whole model, weights, config, json, clone, export."""

import pytest
from launch import run

# Its jobs run in their backend's bundles (launch.BUNDLES).
pytestmark = pytest.mark.bundled


@pytest.mark.timeout(360)
def test_save_load_round_trips(backend: str) -> None:
    result = run("saving_job", 2, timeout=340, backend=backend)
    r0, r1 = result.ranks
    for r in (r0, r1):
        for kind in ("functional", "sequential", "subclassed", "custom_step"):
            k = r[kind]
            assert k["whole_is_tnt"] and k["whole_compiled"], kind
            assert k["whole_err"] == 0, (kind, k["whole_err"])  # same state, same steps: bitwise equal
            assert k["bare_is_tnt"] and not k["bare_compiled"] and k["bare_err"] == 0, kind  # compile=False
            assert k["weights_err"] == 0 and k["load_weights_err"] == 0, kind
            for name in ("config", "from_config", "json", "serialized", "plain_config", "plain_json", "clone"):
                assert k[f"{name}_is_tnt"] and k[f"{name}_err"] == 0, (kind, name)
            for name in ("config", "from_config", "json", "serialized", "plain_config", "plain_json"):
                assert not k[f"{name}_compiled"], (kind, name)  # built from a config: uncompiled, as in Keras
        assert r["mixed_optimizer"] == "LossScaleOptimizer"
        assert r["mixed_err"] < 1e-2, r["mixed_err"]
    assert r0["mixed_weights"] == r1["mixed_weights"]
    if backend == "tensorflow":  # see saving_job.py: Keras' export on torch fails alone, too
        assert r0["exported"]
    assert not [f for f in r0["files"] if "tnt-tmp" in f]


@pytest.mark.timeout(240)
def test_weights_names_shards_and_overwrite(backend: str) -> None:
    result = run("saving_files_job", 2, timeout=220, backend=backend)
    r0, r1 = result.ranks
    for rank, r in enumerate(result.ranks):
        # Refused before anything is written, on every rank, naming the fix and not our temporary file.
        for key, fix in (
            ("weights_keras", "w.weights.h5"),
            ("weights_json_unsharded", "max_shard_size"),
            ("weights_h5_sharded", "w.weights.json"),
            ("whole_h5", ".keras"),
        ):
            assert r[key] is not None and r[key].startswith("ValueError"), (rank, key, r[key])
            assert fix in r[key] and "tnt-tmp" not in r[key], (rank, key, r[key])
        assert "save(" in r["weights_keras"], r["weights_keras"]
        assert r["w_files"] == [], r["w_files"]
        assert r["keras_load_weights_err"] == 0  # load_weights of a whole-model .keras file
        # Sharded weights: Keras' shard names, bitwise round trip of weights and optimizer state.
        shards = [f for f in r["sharded_files"] if f != "sharded.weights.json"]
        assert "sharded.weights.json" in r["sharded_files"] and len(shards) >= 2, r["sharded_files"]
        assert shards == [f"sharded_{i:05d}.weights.h5" for i in range(len(shards))], shards
        assert r["sharded_err"] == 0 and r["sharded_state_err"] == 0
        assert r["resharded_files"] == ["sharded.weights.json", "sharded_00000.weights.h5"], r["resharded_files"]
        assert r["resharded_err"] == 0
        # overwrite=False on an existing file: the same error on both ranks, not only on rank 0.
        for key in ("save_exists", "weights_exists", "sharded_exists"):
            assert r[key] is not None and r[key].startswith("FileExistsError"), (rank, key, r[key])
            assert "overwrite=True" in r[key], r[key]
        assert r["save_new"] is None and r["new_loads"] == 0
        assert r["in_step"] == 2.0  # no rank is left behind in a collective
        assert not [f for f in r["files"] if "tnt-tmp" in f], r["files"]
    assert r0["save_exists"] == r1["save_exists"] and r0["weights_exists"] == r1["weights_exists"]
    # With tnt_save_all_devices each rank checks its own file: rank 0's existed, rank 1's did not. Rank 1
    # writes its file, then raises as well, naming rank 0.
    assert r0["own_exists"] is not None and r0["own_exists"].startswith("FileExistsError: tnt: "), r0["own_exists"]
    assert r1["own_exists"] is not None and "own-rank1.keras" in r1["files"]
    assert r1["own_exists"].startswith("FileExistsError: tnt: rank 0 failed to save '"), r1["own_exists"]
