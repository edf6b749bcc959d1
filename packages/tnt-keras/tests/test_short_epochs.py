"""Epochs of steps_per_epoch that read on through the data, made whole for an elastic fit
(tnt_keras/short_epochs.py), in one process: the view of tnt's slices trains as Keras' one iterator
does, also an epoch begun again; a pipeline that repeats for ever is skipped past the epochs before;
and an input whose epochs cannot be made whole is named in a warning (the jobs of test_elastic.py's
short-epochs case lose ranks in such fits)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from tnt_keras import short_epochs
from tnt_keras.backends.host_inputs import ArraySlices

x = np.random.RandomState(0).rand(96, 8).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 4).astype("float32")


def build() -> keras.Model:
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


class Begins(keras.callbacks.Callback):
    """What elastic.EpochStart tells the view as each epoch begins."""

    def __init__(self, view: short_epochs.EpochsOf) -> None:
        super().__init__()
        self.view = view

    def on_epoch_begin(self, epoch, logs=None):
        self.view.begins(epoch)


def largest_difference(a: keras.Model, b: keras.Model) -> float:
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a.get_weights(), b.get_weights(), strict=True))


def test_the_view_trains_as_keras_one_iterator_does_also_an_epoch_begun_again() -> None:
    serial = build()
    serial.fit(x, y, batch_size=24, epochs=4, steps_per_epoch=2, shuffle=False, verbose=0)  # 4 batches, 2 an epoch
    view = short_epochs.whole(ArraySlices((x, y), 24, 0, 1, shuffle=False), 2, 0)
    assert isinstance(view, short_epochs.EpochsOf) and len(view) == 2
    whole = build()
    whole.fit(view, epochs=4, shuffle=False, verbose=0, callbacks=[Begins(view)])
    assert largest_difference(serial, whole) == 0.0  # the same batches in the same order: the same sums
    # Two epochs, then epochs 1-3 again from the weights after epoch 0, in a fit of their own (as an
    # elastic fit begins an epoch again): epoch 1 reads batches 2 and 3, as it did.
    again = build()
    view = short_epochs.whole(ArraySlices((x, y), 24, 0, 1, shuffle=False), 2, 0)
    again.fit(view, epochs=1, shuffle=False, verbose=0, callbacks=[Begins(view)])
    view = short_epochs.whole(ArraySlices((x, y), 24, 0, 1, shuffle=False), 2, 0)
    view.start_at(1)
    again.fit(view, epochs=4, initial_epoch=1, shuffle=False, verbose=0, callbacks=[Begins(view)])
    assert largest_difference(serial, again) == 0.0


def test_epochs_keras_cuts_short_or_whole_passes_are_left_as_they_are() -> None:
    slices = ArraySlices((x, y), 24, 0, 1, shuffle=False)
    assert short_epochs.whole(slices, 3, 0) is slices  # 3 does not divide 4 batches: Keras cuts epochs short
    assert short_epochs.whole(slices, 4, 0) is slices and short_epochs.whole(slices, None, 0) is slices
    warning = short_epochs.why_not(x, slices, 3)
    assert warning is not None and "steps_per_epoch=3 reads on through the 4 batches" in warning
    assert "divides the batches" in warning and "ds.repeat()" in warning
    assert short_epochs.why_not(x, slices, 4) is None and short_epochs.why_not(x, slices, None) is None
    assert short_epochs.why_not(x, short_epochs.whole(slices, 2, 0), 2) is None


def test_a_pipeline_that_repeats_for_ever_is_skipped_past_the_epochs_before() -> None:
    tf = pytest.importorskip("tensorflow", reason="tf.data pipelines need TensorFlow")
    batches = tf.data.Dataset.range(4).batch(1)
    repeated = batches.repeat()
    assert [int(b[0]) for b in short_epochs.skipped(repeated, 3, 2).take(4)] == [2, 3, 0, 1]  # past 6 batches
    assert short_epochs.skipped(repeated, 3, 0) is repeated and short_epochs.skipped(batches, 3, 2) is batches
    assert short_epochs.why_not(repeated, repeated, 3) is None
    warning = short_epochs.why_not(batches, batches, 3)
    assert warning is not None and "the 4 batches of the data" in warning
