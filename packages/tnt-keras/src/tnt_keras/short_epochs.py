"""Epochs of ``steps_per_epoch`` steps that read on through the data (an elastic fit).

With ``steps_per_epoch`` shorter than the data, Keras keeps one iterator from epoch to epoch: epoch
e reads the batches after those epoch e-1 read, and a new pass over the data begins only once the
last one ran out. An elastic fit that trains an epoch again (or that a replacement joins at an
epoch's start) begins a new ``fit``, whose iterator would begin at the data's first batch: the
epoch would read other batches than serial training read there, and the weights would end away
from serial Keras' (0.04 in a 4-rank torch job losing a rank in epoch 1's validation), silently.

So an elastic fit makes such epochs whole instead, where it can:

- tnt's slices of arrays and of a ``PyDataset`` (indexed by batch): a view of ``steps_per_epoch``
  batches per epoch (``EpochsOf``), epoch e's batch i being the data's batch (e * S + i) mod N, as
  Keras reads them where S divides the N batches (Keras then never cuts an epoch short). Keras is
  handed whole epochs of the view, without ``steps_per_epoch``: an epoch begun again reads the
  batches it read, and the step redo, the epoch ends and the replacements' admission work as in
  any fit.
- a ``tf.data`` pipeline that repeats for ever (``repeat()``): every attempt of the fit skips the
  batches the epochs before its first one read (``skipped``), as one iterator through them
  would have; its order is the same where the pipeline's is (a seeded shuffle).

Elsewhere (S does not divide N, a finite pipeline, a generator or a ``DataLoader``) the fit warns
as it begins that an epoch trained again may read other batches (``why_not``).
"""

from __future__ import annotations

from typing import Any

import keras

from .backends import host_inputs


class EpochsOf(keras.utils.PyDataset):
    """``steps`` batches an epoch of ``slices`` (tnt's ``ArraySlices`` or ``DatasetSlices``), read on
    through its batches from epoch to epoch as Keras' one iterator reads them."""

    def __init__(self, slices: Any, steps: int, first_epoch: int) -> None:
        super().__init__()
        self.slices, self.steps, self.first_epoch = slices, steps, first_epoch
        self.epoch = 0  # the epoch being read, counted from the fit's first (``begins``)
        self.last_index = 0  # the step fetched last, within the epoch (the step redo deals it again)

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> Any:
        self.last_index = i
        return self.slices[(self.epoch * self.steps + i) % len(self.slices)]

    def begins(self, epoch: int) -> None:
        """Keras' ``epoch`` begins (``elastic.EpochStart``, before Keras reads its first batch). Counted
        here, not from the adapter's ``on_epoch_end``: Keras calls that once more as a fit begins."""
        self.epoch = epoch - self.first_epoch

    def on_epoch_end(self) -> None:
        self.slices.on_epoch_end()  # the data hears of every epoch's end, as from Keras' one iterator

    def start_at(self, epoch: int) -> None:
        """Deals the batches as its ``epoch``-th epoch did (an elastic fit trains an epoch again)."""
        self.slices.start_at(epoch)
        self.epoch = epoch


def whole(ds: Any, steps: int | None, first_epoch: int) -> Any:
    """``ds`` with epochs of ``steps`` made whole (``EpochsOf``) for a fit whose first epoch is
    ``first_epoch``, where it is tnt's slices read on through from epoch to epoch; else ``ds``."""
    if not steps or not isinstance(ds, host_inputs.ArraySlices | host_inputs.DatasetSlices):
        return ds
    batches = len(ds)
    if steps >= batches or batches % steps:
        return ds  # whole passes already, or epochs Keras cuts short: ``why_not``
    return EpochsOf(ds, steps, first_epoch)


def skipped(x: Any, steps: int | None, epochs_before: int) -> Any:
    """A ``tf.data`` pipeline ``x`` that repeats for ever, past the batches of ``epochs_before``
    epochs of ``steps``: where the epochs of this attempt of the fit begin; else ``x`` itself."""
    if not steps or not epochs_before or not _repeats_for_ever(x):
        return x
    return x.skip(steps * epochs_before)


def why_not(x: Any, ds: Any, steps: int | None) -> str | None:
    """Why an epoch of ``steps`` of ``ds`` (made from the user's ``x``) trained again may read other
    batches than serial training read there; None where it reads the same (or where the input
    keeps its passes itself: tnt's slices of a torch ``DataLoader``)."""
    if not steps or isinstance(ds, EpochsOf) or _repeats_for_ever(x):
        return None
    sliced = isinstance(ds, host_inputs.ArraySlices | host_inputs.DatasetSlices)
    if not (sliced or host_inputs.is_tf_dataset(x) or host_inputs.is_generator(x)):
        return None
    batches = len(ds) if sliced else _cardinality(x)
    if batches is not None and steps >= batches:
        return None  # every epoch a whole pass (or cut short at the pass's end, as serial Keras cuts it)
    of = f"the {batches} batches of the data" if batches is not None else f"this input ({type(x).__name__})"
    return (
        f"steps_per_epoch={steps} reads on through {of} from epoch to epoch; an epoch that an elastic fit "
        "trains again after a lost rank begins that input anew and reads other batches than serial training "
        "read there. Give steps_per_epoch a value that divides the batches of arrays or a PyDataset, or "
        "repeat a tf.data pipeline for ever (ds.repeat())"
    )


def inner(ds: Any) -> Any:
    """The slices behind ``ds`` where it is a view of them (``EpochsOf``), else ``ds``."""
    return ds.slices if isinstance(ds, EpochsOf) else ds


def _cardinality(x: Any) -> int | None:
    """The batches of a ``tf.data`` pipeline where it knows them (a finite count), else None."""
    if not host_inputs.is_tf_dataset(x):
        return None
    count = int(x.cardinality())
    return count if count >= 0 else None


def _repeats_for_ever(x: Any) -> bool:
    if not host_inputs.is_tf_dataset(x):
        return False
    import tensorflow as tf

    return int(x.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
