"""Each rank's slice of every global batch, for the inputs Keras' torch backend takes.

- numpy arrays (and lists, tuples and dicts of them): a ``PyDataset`` that indexes only this rank's
  rows of each global batch, in an order shuffled alike on every rank (seeded per epoch);
- a ``keras.utils.PyDataset`` yielding global batches: each batch is loaded and this rank's rows kept
  (a ``PyDataset`` hands out whole batches, so it cannot load fewer);
- a ``torch.utils.data.DataLoader`` with a batch size: the same loader over this rank's indices of
  every global batch (a batch sampler of our own), so each rank loads only its rows;
- a ``tf.data.Dataset``, where TensorFlow is installed: sliced as on the TensorFlow backend.

The rule (``slicing.py``) is the TensorFlow backend's: rank r takes rows ``[start_r, start_r + b_r)``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from ...runtime import logger
from ...slicing import DEFAULT_SHUFFLE_SEED, rank_rows, too_small


def _is_tf_dataset(x: Any) -> bool:
    tf = sys.modules.get("tensorflow")  # a tf.data pipeline exists only where TensorFlow was imported
    return tf is not None and isinstance(x, tf.data.Dataset)


def is_dataset(x: Any) -> bool:
    return isinstance(x, (keras.utils.PyDataset, DataLoader)) or _is_tf_dataset(x)


def is_array_like(x: Any) -> bool:
    return isinstance(x, (np.ndarray, torch.Tensor, list, tuple, dict))


def _rows(data: Any) -> int:
    return len(next(a for a in keras.tree.flatten(data) if a is not None))


def _take(data: Any, index: np.ndarray) -> Any:
    return keras.tree.map_structure(lambda a: None if a is None else a[index], data)


class ArraySlices(keras.utils.PyDataset):
    """This rank's rows of every global batch of in-memory arrays."""

    def __init__(self, data: Any, batch_size: int, rank: int, size: int, shuffle: bool) -> None:
        super().__init__()
        self.data = keras.tree.map_structure(
            lambda a: a if a is None or isinstance(a, torch.Tensor) else np.asarray(a), data
        )
        self.batch_size, self.rank, self.size, self.shuffle = batch_size, rank, size, shuffle
        self.rows = _rows(self.data)
        self.epoch = 0
        self.order = self._order()

    def _order(self) -> np.ndarray | None:
        if not self.shuffle:
            return None
        return np.random.default_rng([DEFAULT_SHUFFLE_SEED, self.epoch]).permutation(self.rows)

    def __len__(self) -> int:
        return math.ceil(self.rows / self.batch_size)

    def __getitem__(self, i: int) -> Any:
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


class DatasetSlices(keras.utils.PyDataset):
    """This rank's rows of every global batch a user's ``PyDataset`` yields."""

    def __init__(self, dataset: keras.utils.PyDataset, rank: int, size: int, shuffle: bool) -> None:
        super().__init__()
        self.dataset, self.rank, self.size, self.shuffle = dataset, rank, size, shuffle
        self.epoch = 0
        self.order = self._order()

    def _order(self) -> np.ndarray | None:
        """The order of the batches in this epoch: shuffled alike on every rank where fit shuffles (as
        Keras shuffles the batches of a ``PyDataset``), else the dataset's own."""
        if not self.shuffle:
            return None
        return np.random.default_rng([DEFAULT_SHUFFLE_SEED, self.epoch]).permutation(len(self.dataset))

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        batch = self.dataset[int(self.order[i]) if self.order is not None else i]
        rows = _rows(batch)
        if i == 0 and rows < self.size:
            raise ValueError(too_small(rows, self.size))
        start, count = rank_rows(rows, self.rank, self.size)
        return keras.tree.map_structure(lambda a: a[start : start + count], batch)

    def on_epoch_end(self) -> None:
        self.dataset.on_epoch_end()
        self.epoch += 1
        self.order = self._order()


class RankBatchSampler(torch.utils.data.Sampler[list[tuple[Any, bool]]]):
    """This rank's indices of every global batch that ``batches`` yields, each marked to be kept.

    A slice may be empty (a last batch of fewer rows than ranks), but a DataLoader cannot collate
    nothing into a batch of the right structure: such a slice loads the batch's first row, marked,
    and ``_collate_marked`` cuts the collated batch to 0 rows."""

    def __init__(self, batches: Any, rank: int, size: int) -> None:
        self.batches, self.rank, self.size = batches, rank, size

    def __iter__(self) -> Iterator[list[tuple[Any, bool]]]:
        for batch in self.batches:
            indices = list(batch)
            start, count = rank_rows(len(indices), self.rank, self.size)
            if count == 0:
                yield [(indices[0], False)]
            else:
                yield [(i, True) for i in indices[start : start + count]]

    def __len__(self) -> int:
        return len(self.batches)


class _MarkedRows(torch.utils.data.Dataset):
    """A map-style dataset indexed by ``(index, keep)``: the row, and the mark."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, marked: tuple[Any, bool]) -> tuple[Any, bool]:
        index, keep = marked
        return self.dataset[index], keep


class _CollateMarked:
    """The loader's own collate function over the rows, then 0 rows where the slice is empty (picklable,
    for loaders with worker processes)."""

    def __init__(self, collate: Any) -> None:
        self.collate = collate

    def __call__(self, items: list[tuple[Any, bool]]) -> Any:
        batch = self.collate([row for row, _ in items])
        if items[0][1]:
            return batch
        return keras.tree.map_structure(lambda t: t[:0] if hasattr(t, "__getitem__") else t, batch)


def _loader_slices(loader: DataLoader, rank: int, size: int) -> DataLoader:
    batches = loader.batch_sampler
    if batches is None:
        raise ValueError(
            "tnt: the DataLoader has no batch size (batch_size=None), so tnt cannot tell its global batches. "
            "Give it the GLOBAL batch size: DataLoader(dataset, batch_size=B)."
        )
    if isinstance(batches, BatchSampler) and isinstance(batches.sampler, RandomSampler):
        sampler = batches.sampler
        if sampler.generator is None:
            # Every rank must draw the same order: a generator of our own, seeded alike.
            generator = torch.Generator().manual_seed(DEFAULT_SHUFFLE_SEED)
            sampler = RandomSampler(sampler.data_source, sampler.replacement, sampler._num_samples, generator)
            logger.info("DataLoader shuffled without a generator: using seed %d on every rank", DEFAULT_SHUFFLE_SEED)
        batches = BatchSampler(sampler, batches.batch_size, batches.drop_last)
    return DataLoader(
        _MarkedRows(loader.dataset),
        batch_sampler=RankBatchSampler(batches, rank, size),
        num_workers=loader.num_workers,
        collate_fn=_CollateMarked(loader.collate_fn),
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
        persistent_workers=loader.persistent_workers,
    )


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
) -> Any:
    if _is_tf_dataset(x):
        from ..tensorflow import distribute as tf_distribute

        return tf_distribute(
            x,
            y,
            sample_weight,
            batch_size,
            rank=rank,
            size=size,
            shuffle=shuffle,
            distribute=distribute,
            micro_batch_size=micro_batch_size,
            what=what,
        )
    if micro_batch_size is not None and micro_batch_size <= 0:
        raise ValueError(f"tnt: tnt_micro_batch_size must be positive, got {micro_batch_size}")
    if is_dataset(x):
        if batch_size is not None or micro_batch_size is not None:
            raise ValueError(
                f"tnt: a batch size was given together with a {type(x).__name__}, which is batched already. Batch "
                "it with the GLOBAL batch size and leave batch_size and tnt_micro_batch_size unset."
            )
        if y is not None or sample_weight is not None:
            raise ValueError(f"tnt: with a {type(x).__name__}, y and sample_weight come from the dataset")
        if not distribute or size == 1:
            return x
        if isinstance(x, DataLoader):
            return _loader_slices(x, rank, size)
        return DatasetSlices(x, rank, size, shuffle)
    if not is_array_like(x):
        raise TypeError(
            f"tnt: {what} takes numpy arrays with batch_size, a keras.utils.PyDataset or a torch DataLoader "
            f"batched with the global batch size; got {type(x).__name__}."
        )
    if micro_batch_size is not None:
        batch_size = micro_batch_size * size
    batch_size = batch_size or 32
    data = (x, y, sample_weight) if sample_weight is not None else (x, y) if y is not None else (x,)
    if not distribute:
        logger.info("the %s is not distributed: every rank reads all of it as its local batches", what)
        return ArraySlices(data, batch_size, 0, 1, shuffle)
    if batch_size < size and _rows(data) >= size:
        raise ValueError(too_small(batch_size, size))
    return ArraySlices(data, batch_size, rank, size, shuffle)
