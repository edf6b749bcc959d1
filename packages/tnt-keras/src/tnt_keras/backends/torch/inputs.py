"""Each rank's slice of every global batch, for the inputs Keras' torch backend takes: those in host
memory as on every such backend (``backends/host_inputs.py``: numpy arrays, PyDatasets, tf.data),
torch tensors among the arrays, and a ``torch.utils.data.DataLoader`` with a batch size: the same
loader over this rank's indices of every global batch (a batch sampler of our own), so each rank
loads only its rows.

The rule (``slicing.py``) is the TensorFlow backend's: rank r takes rows ``[start_r, start_r + b_r)``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import keras
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from ...runtime import logger
from ...slicing import DEFAULT_SHUFFLE_SEED, rank_rows
from .. import host_inputs


def is_dataset(x: Any) -> bool:
    native = isinstance(x, (keras.utils.PyDataset, DataLoader))
    return native or host_inputs.is_tf_dataset(x) or host_inputs.is_generator(x)


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


def reshuffles(ds: Any) -> bool:
    """A DataLoader that shuffles (its sampler draws each epoch's order from a generator that goes
    on), or a ``tf.data`` pipeline that does."""
    if isinstance(ds, DataLoader):
        batches = getattr(ds.batch_sampler, "batches", ds.batch_sampler)
        return isinstance(getattr(batches, "sampler", None), RandomSampler)
    return host_inputs.reshuffles(ds)


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


# The shared slicing of host-memory inputs, with torch's own: tensors kept as they are, and a
# DataLoader given a batch sampler of this rank's rows.
distribute = functools.partial(
    host_inputs.distribute,
    native_datasets=(DataLoader,),
    native_slices=_loader_slices,
    native_arrays=(torch.Tensor,),
    accepted="numpy arrays with batch_size, a keras.utils.PyDataset or a torch DataLoader",
)
