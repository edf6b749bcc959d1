"""Gives each rank its slice of every global batch.

Rank ``r`` of ``N`` takes rows ``[start_r, start_r + b_r)`` of a batch of ``B`` rows, with
``b_r = B//N + (r < B%N)`` and ``start_r = r*(B//N) + min(r, B%N)``, computed from the size of each
batch as it comes: partial last batches and ``B`` not divisible by ``N`` stay exact, and every rank
runs the same number of steps. (``rebatch().shard()`` would give wrong rows and unequal step counts
whenever the last batch is partial.) A partial last batch of fewer than ``N`` samples leaves ranks
``B..N-1`` an empty slice; ``steps.py`` makes such a step change nothing there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from ... import state
from ...runtime import logger
from ...slicing import DEFAULT_SHUFFLE_SEED, rank_rows, too_small

# Transformations that keep the batch structure of their input; we look through them for a batch.
_ELEMENTWISE = (
    "_PrefetchDataset",
    "_MapDataset",
    "_ParallelMapDataset",
    "_OptionsDataset",
    "_CacheDataset",
    "_MemoryCacheDataset",
    "_RepeatDataset",
    "_TakeDataset",
    "_SkipDataset",
    "_ShuffleDataset",
    "_FilterDataset",
    "_ShardDataset",
    "_AssertCardinalityDataset",
)
_BATCH = ("_BatchDataset", "_ParallelBatchDataset", "_PaddedBatchDataset")


def _inputs(ds: tf.data.Dataset) -> list[tf.data.Dataset]:
    """The datasets ``ds`` reads (all of them for zip and concatenate)."""
    try:
        found = list(ds._inputs())  # every tf.data dataset type implements it
    except (AttributeError, NotImplementedError, TypeError):
        found = getattr(ds, "_input_datasets", None)
        if found is None:
            single = getattr(ds, "_input_dataset", None)
            found = [single] if single is not None else []
    return [d for d in found if isinstance(d, tf.data.Dataset)]


def find_batch(ds: tf.data.Dataset) -> tf.data.Dataset | None:
    """The batch transformation that shapes ``ds``'s elements, looking through element-wise ones."""
    while ds is not None:
        name = type(ds).__name__
        if name in _BATCH:
            return ds
        if name not in _ELEMENTWISE:
            return None
        ds = getattr(ds, "_input_dataset", None)
    return None


def _upstream(ds: tf.data.Dataset, through: Callable[[str], bool] | None = None) -> Iterator[tf.data.Dataset]:
    """``ds`` and every dataset it reads, each once; only the inputs of those whose type name
    ``through`` accepts are followed (all, without it)."""
    seen: set[int] = set()
    stack = [ds]
    while stack:
        d = stack.pop()
        if id(d) in seen:
            continue
        seen.add(id(d))
        yield d
        if through is None or through(type(d).__name__):
            stack.extend(_inputs(d))


def batched_upstream(ds: tf.data.Dataset) -> bool:
    """Whether a batch transformation feeds ``ds`` through zips, concatenations and element-wise
    transformations only: its elements are then batches, though ``find_batch`` (one input at a
    time) cannot tell. Other transformations (unbatch, flat_map, interleave, ...) may change what
    an element is, so the search stops there."""
    keeps_elements = _ELEMENTWISE + ("_ZipDataset", "_ConcatenateDataset")
    return any(type(d).__name__ in _BATCH for d in _upstream(ds, keeps_elements.__contains__))


def reshuffles(ds: tf.data.Dataset) -> bool:
    """Whether ``ds`` shuffles anew each time it is read (``reshuffle_each_iteration``): each reading
    draws its order from a generator inside the pipeline, which cannot be set back."""
    return any(
        type(d).__name__ == "_ShuffleDataset" and bool(getattr(d, "_reshuffle_each_iteration", False))
        for d in _upstream(ds)
    )


def static_batch_size(ds: tf.data.Dataset) -> int | None:
    batch = find_batch(ds)
    if batch is None:
        return None
    size = tf.get_static_value(getattr(batch, "_batch_size", None))
    return int(size) if size is not None else None


def _unseeded(shuffle: tf.data.Dataset) -> bool:
    # TF stores (0, 0) when neither an op seed nor a global seed was set: a fresh random order.
    seeds = [tf.get_static_value(getattr(shuffle, name, None)) for name in ("_seed", "_seed2")]
    return all(s is None or int(s) == 0 for s in seeds)


def check_seeded_shuffles(ds: tf.data.Dataset) -> None:
    """Raises if ``ds`` shuffles without a seed (made before ``import tnt_keras`` patched shuffle)."""
    for d in _upstream(ds):
        if type(d).__name__ == "_ShuffleDataset" and _unseeded(d):
            raise ValueError(
                "tnt: the dataset is shuffled without a seed, so every rank would draw a different order. "
                "Pass a seed (ds.shuffle(n, seed=42)) or import tnt_keras before building the dataset: it then "
                f"gives unseeded shuffles the fixed seed {DEFAULT_SHUFFLE_SEED}."
            )


def default_shuffle_seed() -> int:
    """The seed tnt gives a shuffle made without one: the same on every rank.

    With a global seed (``tf.random.set_seed``, ``keras.utils.set_random_seed``) it is derived from
    that seed, so runs with different global seeds shuffle differently and runs with the same one
    alike; without one it is ``DEFAULT_SHUFFLE_SEED``. It depends on nothing else (not on how many
    random ops or shuffles a rank made before), so ranks agree even where one does extra work.
    """
    from tensorflow.python.eager import context

    global_seed = context.global_seed() if tf.executing_eagerly() else tf.compat.v1.get_default_graph().seed
    if global_seed is None:
        return DEFAULT_SHUFFLE_SEED
    return (int(global_seed) * 1_000_003 + 7_919) % (2**31 - 1)


_seeded = state.Marked()  # Dataset.shuffle as install_shuffle_seed replaced it


def install_shuffle_seed() -> None:
    """Makes ``Dataset.shuffle`` without a seed use ``default_shuffle_seed()`` (logged at INFO)."""
    from tensorflow.python.data.ops import dataset_ops

    original = dataset_ops.DatasetV2.shuffle
    if original in _seeded:
        return

    def shuffle(self: Any, buffer_size: Any, seed: Any = None, reshuffle_each_iteration: Any = True, name: Any = None):
        if seed is None:
            seed = default_shuffle_seed()
            logger.info("Dataset.shuffle without a seed: using seed %d so that every rank shuffles alike", seed)
        return original(self, buffer_size, seed=seed, reshuffle_each_iteration=reshuffle_each_iteration, name=name)

    _seeded.add(shuffle)
    shuffle.__doc__ = original.__doc__
    dataset_ops.DatasetV2.shuffle = shuffle


def slice_batches(ds: tf.data.Dataset, rank: int, size: int) -> tf.data.Dataset:
    """Maps every global batch of ``ds`` to this rank's contiguous slice of it.

    Raises:
        ValueError: the dataset's own batch size is smaller than ``size``. A batch that turns out
            smaller as it comes (a partial last batch) is fine: ranks past its last sample get
            an empty slice and contribute nothing to that step.
    """
    _check_batch_size(ds, size)
    if size == 1:
        return ds
    return ds.map(lambda *element: slice_of(element[0] if len(element) == 1 else element, rank, size))


def _check_batch_size(ds: tf.data.Dataset, size: int) -> None:
    """Raises where the dataset's own batch size is smaller than ``size``. Why only the static size:
    every batch that small leaves ranks idle on every step, which is a mistake in the batch size; a
    partial last batch that small is just the end of the data."""
    static = static_batch_size(ds)
    if static is not None and static < size:
        raise ValueError(too_small(static, size))


def slice_of(batch: Any, rank: int, size: int) -> Any:
    """Rank ``rank``'s rows of one global ``batch`` of ``size`` ranks (in a pipeline, or eagerly on
    a batch drawn from one)."""
    leaves = [t for t in tf.nest.flatten(batch) if t is not None]
    static = leaves[0].shape[0] if isinstance(leaves[0], tf.Tensor) else None
    if static is not None and tf.executing_eagerly():  # a batch drawn: its rows found in Python
        start, count = rank_rows(int(static), rank, size)
        parts = [start, count, int(static) - start - count]
        # One eager op per dense tensor (a split: half the dispatch of a strided slice, which a step pays).
        return tf.nest.map_structure(
            lambda t: tf.split(t, parts)[1] if isinstance(t, tf.Tensor) else _rows(t, start, count), batch)
    rows = tf.shape(leaves[0])[0]
    base = rows // size
    extra = rows % size
    count = base + tf.cast(rank < extra, rows.dtype)
    start = rank * base + tf.minimum(rank, extra)
    return tf.nest.map_structure(lambda t: _rows(t, start, count), batch)


whole = state.Marked()
"""The pipelines ``prepare(whole_batches=True)`` handed over with their global batches whole: each step cuts
this rank's slice from the batch it draws (``slice_of``), so that a lost step's batch can be dealt
again over the ranks left (``step_redo.py``)."""


def _rows(t: Any, start: tf.Tensor, count: tf.Tensor) -> Any:
    """Rows ``start .. start+count`` of a dense, ragged or sparse batch."""
    if isinstance(t, tf.SparseTensor):  # not subscriptable; sliced by coordinates instead
        dense_shape = tf.cast(t.dense_shape, tf.int64)
        begin = tf.concat([[tf.cast(start, tf.int64)], tf.zeros_like(dense_shape[1:])], axis=0)
        return tf.sparse.slice(t, begin, tf.concat([[tf.cast(count, tf.int64)], dense_shape[1:]], axis=0))
    return t[start : start + count]


def prepare(
    ds: Any,
    rank: int,
    size: int,
    *,
    distribute: bool = True,
    micro_batch_size: int | None = None,
    what: str = "dataset",
    whole_batches: bool = False,
) -> tf.data.Dataset:
    """Checks a dataset given to fit/evaluate/predict and returns what this rank should read: its
    slices of the global batches, or with ``whole_batches`` the global batches themselves, for the
    step to slice (``whole``)."""
    if micro_batch_size is not None:
        if micro_batch_size <= 0:
            raise ValueError(f"tnt: tnt_micro_batch_size must be positive, got {micro_batch_size}")
        global_batch = micro_batch_size * size
        if find_batch(ds) is None:
            if batched_upstream(ds):
                raise ValueError(
                    f"tnt: the {what} is already batched (behind a zip, concatenate or similar transformation), "
                    f"so tnt_micro_batch_size={micro_batch_size} would batch its batches again. Either leave the "
                    "datasets unbatched and pass tnt_micro_batch_size, or batch the result with "
                    f"micro_batch_size * tnt.get_size() = {global_batch} samples and leave tnt_micro_batch_size out."
                )
            ds = ds.batch(global_batch)
        elif (batched := static_batch_size(ds)) is not None and batched != global_batch:
            raise ValueError(
                f"tnt: the {what} is batched with {batched} samples, but tnt_micro_batch_size={micro_batch_size} "
                f"on {size} ranks needs global batches of {global_batch}. Leave the dataset unbatched when you "
                "pass tnt_micro_batch_size, or batch it with micro_batch_size * tnt.get_size()."
            )
    if size > 1:
        check_seeded_shuffles(ds)
    if not distribute:
        logger.info("the %s is not distributed: every rank reads all of it as its local batches", what)
        return ds
    if whole_batches and size > 1:
        _check_batch_size(ds, size)
        ds = ds.take(-1)  # all of it, as an object of tnt's own: the same pipeline may be sliced elsewhere
        whole.add(ds)
        return ds
    return slice_batches(ds, rank, size)


def arrays_to_dataset(
    x: Any, y: Any, sample_weight: Any, batch_size: int | None, shuffle: bool, seed: int | None = None
) -> tf.data.Dataset:
    """Numpy/tensor inputs as a globally batched dataset, shuffled identically on every rank
    (with ``seed``, else with ``default_shuffle_seed()``)."""
    parts = tuple(p for p in (x, y, sample_weight) if p is not None)
    data = parts[0] if len(parts) == 1 else parts
    ds = tf.data.Dataset.from_tensor_slices(data)
    if shuffle:
        rows = len(tf.nest.flatten(data)[0])
        ds = ds.shuffle(rows, seed=default_shuffle_seed() if seed is None else seed, reshuffle_each_iteration=True)
    return ds.batch(batch_size or 32)


def is_array_like(x: Any) -> bool:
    return isinstance(x, (np.ndarray, tf.Tensor, list, tuple, dict)) and not isinstance(x, tf.data.Dataset)
