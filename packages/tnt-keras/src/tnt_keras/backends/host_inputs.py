"""Each rank's slice of every global batch, for inputs held in host memory, on the backends whose
Keras trainer iterates Python batches (torch, JAX):

- numpy arrays (and lists, tuples and dicts of them): a ``PyDataset`` that indexes only this rank's
  rows of each global batch, in an order shuffled alike on every rank (seeded per epoch);
- a ``keras.utils.PyDataset`` yielding global batches: each batch is loaded and this rank's rows kept
  (a ``PyDataset`` hands out whole batches, so it cannot load fewer);
- a Python generator (or any iterator) yielding global batches: each batch is drawn and this rank's
  rows kept;
- a ``tf.data.Dataset``, where TensorFlow is installed: sliced as on the TensorFlow backend (in an
  elastic fit that redoes steps, handed over whole and cut as each step draws a batch: ``drawn_slicer``).

A backend adds its own kinds (torch: ``DataLoader``) through ``distribute``'s ``native`` arguments. A model
not built yet is built from the first batch's shapes (``build``, ``build_for_predict``).
The rule (``slicing.py``) is the same on every backend: rank r takes rows ``[start_r, start_r + b_r)``.
"""

from __future__ import annotations

import inspect
import math
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np

from ..runtime import logger
from ..slicing import DEFAULT_SHUFFLE_SEED, rank_rows, too_small


def is_generator(x: Any) -> bool:
    """A Python generator or other iterator of global batches (not an array, which iterates rows)."""
    return isinstance(x, Iterator)


def is_tf_dataset(x: Any) -> bool:
    tf = sys.modules.get("tensorflow")  # a tf.data pipeline exists only where TensorFlow was imported
    return tf is not None and isinstance(x, tf.data.Dataset)


def rows(data: Any) -> int:
    return len(next(a for a in keras.tree.flatten(data) if a is not None))


def local_rows(data: Any) -> int:
    """The rows of one batch as a step gets it (0 for a batch of nothing): static shapes on torch and
    inside a traced JAX step."""
    leaves = [t for t in keras.tree.flatten(data) if t is not None]
    return int(leaves[0].shape[0]) if leaves else 0


def _take(data: Any, index: np.ndarray) -> Any:
    return keras.tree.map_structure(lambda a: None if a is None else a[index], data)


class ArraySlices(keras.utils.PyDataset):
    """This rank's rows of every global batch of in-memory arrays (those of ``native`` types stay
    as they are, the rest become numpy arrays)."""

    def __init__(
        self, data: Any, batch_size: int, rank: int, size: int, shuffle: bool, native: tuple[type, ...] = ()
    ) -> None:
        super().__init__()
        self.data = keras.tree.map_structure(lambda a: a if a is None or isinstance(a, native) else np.asarray(a), data)
        self.batch_size, self.rank, self.size, self.shuffle = batch_size, rank, size, shuffle
        self.rows = rows(self.data)
        self.epoch = 0
        self.order = self._order()
        self.last_index = 0  # the batch fetched last: the one in training (Keras fetches one at a time)

    def _order(self) -> np.ndarray | None:
        if not self.shuffle:
            return None
        return np.random.default_rng([DEFAULT_SHUFFLE_SEED, self.epoch]).permutation(self.rows)

    def __len__(self) -> int:
        return math.ceil(self.rows / self.batch_size)

    def __getitem__(self, i: int) -> Any:
        self.last_index = i
        begin = i * self.batch_size
        batch = min(self.batch_size, self.rows - begin)
        start, count = rank_rows(batch, self.rank, self.size)
        index = np.arange(begin + start, begin + start + count)
        if self.order is not None:
            index = self.order[index]
        return _take(self.data, index)

    def on_epoch_end(self) -> None:
        self.epoch += 1
        self.order = self._order()

    def start_at(self, epoch: int) -> None:
        """Deals the batches as its ``epoch``-th epoch did (an elastic fit trains an epoch again)."""
        self.epoch = epoch
        self.order = self._order()


class DatasetSlices(keras.utils.PyDataset):
    """This rank's rows of every global batch a user's ``PyDataset`` yields."""

    def __init__(self, dataset: keras.utils.PyDataset, rank: int, size: int, shuffle: bool) -> None:
        super().__init__()
        self.dataset, self.rank, self.size, self.shuffle = dataset, rank, size, shuffle
        self.epoch = 0
        self.order = self._order()
        self.last_index = 0  # the batch fetched last: the one in training (Keras fetches one at a time)

    def _order(self) -> np.ndarray | None:
        """The order of the batches in this epoch: shuffled alike on every rank where fit shuffles (as
        Keras shuffles the batches of a ``PyDataset``), else the dataset's own."""
        if not self.shuffle:
            return None
        return np.random.default_rng([DEFAULT_SHUFFLE_SEED, self.epoch]).permutation(len(self.dataset))

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        self.last_index = i
        batch = self.dataset[int(self.order[i]) if self.order is not None else i]
        found = rows(batch)
        if i == 0 and found < self.size:
            raise ValueError(too_small(found, self.size))
        start, count = rank_rows(found, self.rank, self.size)
        return keras.tree.map_structure(lambda a: a[start : start + count], batch)

    def on_epoch_end(self) -> None:
        self.dataset.on_epoch_end()
        self.epoch += 1
        self.order = self._order()

    def start_at(self, epoch: int) -> None:
        """Deals the batches as its ``epoch``-th epoch did (an elastic fit trains an epoch again)."""
        self.epoch = epoch
        self.order = self._order()


def first_batch(ds: Any, drawn: bool = True) -> Any:
    """The first batch of ``ds``, for building a model from its shapes. A tf.data pipeline's is
    ``drawn`` from a pass of its own, as Keras-torch's and Keras-JAX's ``fit`` and ``evaluate``
    build an unbuilt model (TensorFlow's read the element_spec instead): a pipeline that reshuffles
    each pass then trains its first epoch on its second order under tnt as in serial Keras. Its predict
    builds on the first batch it predicts: no pass of its own, the element_spec."""
    if isinstance(ds, keras.utils.PyDataset):
        return ds[0]
    if inspect.isgenerator(ds) and ds in _generated:
        return _generated[ds].peek()
    if hasattr(ds, "element_spec"):  # tf.data
        return keras.tree.map_structure(np.asarray, next(iter(ds))) if drawn else ds.element_spec
    return next(iter(ds))


def build(model: keras.Model, ds: Any) -> None:
    model._symbolic_build(data_batch=first_batch(ds))


def build_for_predict(model: keras.Model, ds: Any) -> None:
    """Creates the variables of a model that is not built yet from the first batch's shapes, without
    compiling or building an optimizer."""
    if all(layer.built for layer in model._flatten_layers()):
        return
    from keras.src import backend as keras_backend

    x, _, _ = keras.utils.unpack_x_y_sample_weight(first_batch(ds, drawn=False))
    symbolic = keras.tree.map_structure(
        lambda a: None if a is None else keras.KerasTensor(a.shape, keras.backend.standardize_dtype(a.dtype)), x
    )
    keras_backend.compute_output_spec(model, symbolic, training=False)


class GeneratorSlices(Iterator[Any]):
    """This rank's rows of every global batch an iterator yields (a generator, as Keras takes one).
    ``peek`` shows the first without losing it: tnt builds an unbuilt model from it, as Keras does."""

    def __init__(self, batches: Iterator[Any], rank: int, size: int) -> None:
        self.batches, self.rank, self.size = batches, rank, size
        self.drawn = 0
        self.head: list[Any] = []

    def peek(self) -> Any:
        if not self.head:
            self.head.append(self._draw())
        return self.head[0]

    def __next__(self) -> Any:
        return self.head.pop() if self.head else self._draw()

    def _draw(self) -> Any:
        batch = next(self.batches)
        found = rows(batch)
        if self.drawn == 0 and self.size > 1 and found < self.size:
            raise ValueError(too_small(found, self.size))
        self.drawn += 1
        return rank_slice(batch, self.rank, self.size)


_generated: weakref.WeakKeyDictionary[Any, GeneratorSlices] = weakref.WeakKeyDictionary()
"""The slices behind each generator ``distribute`` returned (Keras takes generators, not iterators)."""


def _as_generator(slices: GeneratorSlices) -> Any:
    def generate() -> Iterator[Any]:
        yield from slices

    generator = generate()
    _generated[generator] = slices
    return generator


def _rows_of(batch: Any, start: int, count: int) -> Any:
    return keras.tree.map_structure(lambda a: None if a is None else a[start : start + count], batch)


def reshuffles(ds: Any) -> bool:
    """A ``tf.data`` pipeline's answer (``tensorflow/inputs.py``); tnt's slices shuffle each epoch
    from a seed of its own (``start_at`` begins any epoch again in its order), but a ``PyDataset``
    with an ``on_epoch_end`` of its own may change its order there, from state tnt cannot set back."""
    if isinstance(ds, DatasetSlices):
        return type(ds.dataset).on_epoch_end is not keras.utils.PyDataset.on_epoch_end
    if not is_tf_dataset(ds):
        return False
    from .tensorflow.inputs import reshuffles as pipeline_reshuffles

    return pipeline_reshuffles(ds)


def order_state(ds: Any) -> None:  # noqa: ARG001
    """None: tnt's slices shuffle from a seed per epoch (``start_at``); a ``tf.data`` shuffle's state
    cannot be read."""
    return None


def set_order_state(ds: Any, state: Any) -> None:  # noqa: ARG001
    """Nothing to set (``order_state``)."""


def unshared_order(ds: Any) -> None:  # noqa: ARG001
    """None: a replacement draws the order of tnt's slices from their seed, and a ``tf.data``
    pipeline's that reshuffles is refused as such (``reshuffles``)."""
    return None


def drawn_slicer(ds: Any) -> Callable[[Any, int, int], Any] | None:
    """Where ``ds`` is a ``tf.data`` pipeline handed over with its global batches whole (the
    TensorFlow backend's ``inputs.whole``: an elastic fit that redoes steps), the cut of rank r of
    n's rows from a batch drawn from it, as it reaches the step (the backend's tensors); else None:
    the other inputs come dealt already."""
    if not is_tf_dataset(ds):
        return None
    from .tensorflow import inputs as pipelines

    return rank_slice if ds in pipelines.whole else None


def rank_slice(batch: Any, rank: int, size: int) -> Any:
    """Rank ``rank``'s rows of a global ``batch`` among ``size`` ranks (the rule, on host tensors)."""
    return _rows_of(batch, *rank_rows(rows(batch), rank, size))


def global_batch_size(ds: Any) -> int | None:
    """The global batch size where the input states it (arrays with batch_size), else None."""
    return ds.batch_size if isinstance(ds, ArraySlices) else None


def distribute(
    x: Any,
    y: Any,
    sample_weight: Any,
    batch_size: int | None,
    *,
    rank: int,
    size: int,
    shuffle: bool,
    distribute: bool,
    micro_batch_size: int | None,
    what: str,
    redealt: bool = False,
    whole_batches: bool = False,
    native_datasets: tuple[type, ...] = (),
    native_slices: Callable[[Any, int, int, bool], Any] | None = None,
    native_arrays: tuple[type, ...] = (),
    accepted: str = "numpy arrays with batch_size or a keras.utils.PyDataset",
) -> Any:
    """This rank's input: a ``tf.data`` pipeline goes to the TensorFlow backend's slicing; a dataset
    of ``native_datasets`` types to ``native_slices(x, rank, size, redealt)``; a ``PyDataset`` and arrays
    (those of ``native_arrays`` types kept as they are) are sliced here."""
    if is_tf_dataset(x):
        from .tensorflow import distribute as tf_distribute

        # whole_batches: handed over with its global batches whole, each cut as the step draws it
        # (drawn_slicer); what is dealt here is dealt by index anyway.
        return tf_distribute(
            x, y, sample_weight, batch_size, rank=rank, size=size, shuffle=shuffle, distribute=distribute,
            micro_batch_size=micro_batch_size, what=what, whole_batches=whole_batches,
        )
    if micro_batch_size is not None and micro_batch_size <= 0:
        raise ValueError(f"tnt: tnt_micro_batch_size must be positive, got {micro_batch_size}")
    if isinstance(x, (keras.utils.PyDataset, *native_datasets)):
        if batch_size is not None or micro_batch_size is not None:
            raise ValueError(
                f"tnt: a batch size was given together with a {type(x).__name__}, which is batched already. Batch "
                "it with the GLOBAL batch size and leave batch_size and tnt_micro_batch_size unset."
            )
        if y is not None or sample_weight is not None:
            raise ValueError(f"tnt: with a {type(x).__name__}, y and sample_weight come from the dataset")
        # One rank reads the dataset as it is; not in an elastic job, which may have shrunk to one: its
        # slices keep the order an epoch begun again reads (a DataLoader's generators, tnt's shuffle).
        if not distribute or (size == 1 and not redealt):
            return x
        if native_slices is not None and isinstance(x, native_datasets):
            return native_slices(x, rank, size, redealt)
        return DatasetSlices(x, rank, size, shuffle)
    if is_generator(x):
        if batch_size is not None or micro_batch_size is not None or y is not None or sample_weight is not None:
            raise ValueError(
                "tnt: a generator yields its batches (x, y[, sample_weight]) already batched with the GLOBAL batch "
                "size: leave batch_size, tnt_micro_batch_size, y and sample_weight unset."
            )
        return _as_generator(GeneratorSlices(x, rank, size) if distribute else GeneratorSlices(x, 0, 1))
    if not isinstance(x, (np.ndarray, list, tuple, dict, *native_arrays)):
        raise TypeError(f"tnt: {what} takes {accepted} batched with the global batch size; got {type(x).__name__}.")
    if micro_batch_size is not None:
        batch_size = micro_batch_size * size
    batch_size = batch_size or 32
    data = (x, y, sample_weight) if sample_weight is not None else (x, y) if y is not None else (x,)
    if not distribute:
        logger.info("the %s is not distributed: every rank reads all of it as its local batches", what)
        return ArraySlices(data, batch_size, 0, 1, shuffle, native_arrays)
    if batch_size < size and rows(data) >= size:
        raise ValueError(too_small(batch_size, size))
    return ArraySlices(data, batch_size, rank, size, shuffle, native_arrays)
