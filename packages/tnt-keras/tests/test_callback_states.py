"""What tnt keeps of Keras callbacks through an elastic job's re-formings (tnt_keras/callback_states.py),
in one process: the state handed to a replacement is the callback's plain data, and a checkpoint
callback is put back as it was when an epoch began only where that epoch is begun again in a fit
that goes on."""

from __future__ import annotations

import keras
import numpy as np
from tnt_keras import callback_states


def test_the_state_handed_on_is_plain_data_without_the_model_or_verbose() -> None:
    early = keras.callbacks.EarlyStopping(patience=3, restore_best_weights=True, verbose=1)
    early.set_model(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    early.on_train_begin()
    early.wait, early.best, early.best_weights = 2, np.float32(0.25), [np.ones((2, 1)), np.zeros(1)]
    state = callback_states._state_of(early)
    assert state["wait"] == 2 and state["best"] == np.float32(0.25) and len(state["best_weights"]) == 2
    assert "verbose" not in state and "_model" not in state and "model" not in state
    assert all(not callable(v) for v in state.values())


def test_a_checkpoint_is_put_back_only_where_its_epoch_is_begun_again_in_a_fit_that_goes_on() -> None:
    checkpoint = keras.callbacks.ModelCheckpoint("unused.keras", save_best_only=True)
    checkpoint.best = 0.5
    callback_states.epoch_begins(checkpoint, 3, resuming=False, joined=False)
    checkpoint.best = 0.4  # what epoch 3's end decided
    callback_states.epoch_begins(checkpoint, 3, resuming=False, joined=False)  # a new fit: no put-back
    assert checkpoint.best == 0.4
    checkpoint.best = 0.3
    callback_states.epoch_begins(checkpoint, 4, resuming=True, joined=False)  # another epoch: kept as it is
    assert checkpoint.best == 0.3
    checkpoint.best = 0.2
    callback_states.epoch_begins(checkpoint, 4, resuming=True, joined=False)  # epoch 4 begun again
    assert checkpoint.best == 0.3
    callback_states.ended(checkpoint)  # the fit is over: nothing is kept into the next one
    checkpoint.best = 0.1
    callback_states.epoch_begins(checkpoint, 4, resuming=True, joined=False)
    assert checkpoint.best == 0.1


def test_off_the_master_a_checkpoint_decides_without_writing(tmp_path, monkeypatch) -> None:
    from tnt_keras import runtime

    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "sub" / "best.keras"), save_best_only=True)
    assert callback_states.checkpoints_on_master(checkpoint), "Keras 3.10+ decides apart from saving"
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    checkpoint.set_model(model)
    monkeypatch.setattr(runtime, "is_master_rank", lambda: False)
    checkpoint.on_epoch_end(0, logs={"val_loss": 0.5})
    assert checkpoint.best == 0.5 and not (tmp_path / "sub").exists()  # decided, wrote nothing (no folder)
    monkeypatch.setattr(runtime, "is_master_rank", lambda: True)
    checkpoint.on_epoch_end(1, logs={"val_loss": 0.4})
    assert checkpoint.best == 0.4 and (tmp_path / "sub" / "best.keras").exists()
