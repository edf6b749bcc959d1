"""Keras callbacks under tnt on 2 real ranks: same decisions as serial, output only on rank 0."""

import pytest
from launch import run

# Its jobs run in their backend's bundles (launch.BUNDLES).
pytestmark = pytest.mark.bundled

TOL = 1e-6


@pytest.mark.timeout(300)
def test_callbacks_on_two_ranks(backend: str) -> None:
    result = run("callbacks_job", 2, timeout=280, backend=backend)
    r0, r1 = result.ranks
    for r in (r0, r1):
        h = r["history"]
        # EarlyStopping stops both at the serial epoch; the schedules give serial's learning rate.
        assert h["epochs_tnt"] == h["epochs_serial"] < 8
        assert h["history_err"] < TOL and h["weights_err"] < TOL
        assert r["checkpoint_is_tnt"] and r["checkpoint_err"] == 0
        assert abs(h["lr"] - h["lr_serial"]) < 1e-9
        assert r["nan"]["stopped"] and r["nan"]["tnt_epochs"] == r["nan"]["serial_epochs"] == 1
        assert r["backup"]["resumed_epochs"] == 2  # epochs 3 and 4 after the crash in epoch 3
        assert r["backup"]["weights_err"] < TOL
        c = r["custom"]
        assert c["lambda_calls"] == 2 and c["plain_model"] == "Model" and c["plain_logs_err"] < TOL
        assert c["averaged_local"] == [0.5, 0.5]  # averaged over ranks 0 and 1
        assert c["plain_batches"] == 2 * 6
    assert r0["history"]["printed_progress"] and r0["history"]["printed_early_stopping"]
    assert not r1["history"]["printed_progress"] and not r1["history"]["printed_early_stopping"]
    assert r0["custom"]["local_local"] == [0.0, 0.0] and r1["custom"]["local_local"] == [1.0, 1.0]
    assert r0["custom"]["master_only_epochs"] == 2 and r1["custom"]["master_only_epochs"] == 0
    assert r1["custom"]["master_only_batches"] == 0
    assert r0["csv_equal"] and r0["csv_err"] < TOL
    assert r0["remote_posts"] == 2 and r1["remote_posts"] == 0
    assert r0["tensorboard_dirs"] == r1["tensorboard_dirs"] and "train" in r0["tensorboard_dirs"]
    assert not any(d.startswith("rank_") for d in r0["tensorboard_dirs"])
    assert not r0["backup"]["backup_left"]
    assert not [f for f in r0["files"] if "tnt-tmp" in f]  # atomic writes leave no temporaries
    assert r0["weights"] == r1["weights"]
    for r in (r0, r1):
        a = r["async"]  # [train, test, predict] as Keras' CallbackList decides them
        assert a["plain_early_stopping"] == a["early_stopping"] == a["no_batch_hooks"] == [True, True, True]
        assert a["record"] == a["terminate_on_nan"] == a["checkpoint_every_5"] == [False, True, True]


@pytest.mark.timeout(200)
def test_tensorboard_on_all_devices() -> None:
    result = run("tensorboard_job", 2, timeout=180, env={"TNT_TENSORBOARD_ON_ALL_DEVICES": "true"})
    dirs = result.ranks[0]["dirs"]
    assert any(d.startswith("rank_0") for d in dirs) and any(d.startswith("rank_1") for d in dirs)
    # The same callback in two fits and an evaluate gets its rank folder once, not rank_0/rank_0.
    assert {d.split("/")[0] for d in dirs} == {"rank_0", "rank_1"}
    assert not any(d.count("rank_") > 1 for d in dirs), dirs
    for rank, r in enumerate(result.ranks):
        assert r["log_dir"] == str(result.out_dir / "tb" / f"rank_{rank}")
