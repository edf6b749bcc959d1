"""The per-rank slice of every global batch (one process: slices for each rank are computed here)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest

# TensorFlow (and tnt_keras, which imports it) come with the `tf` fixture and inside the tests, not
# at collection (conftest.py).


def slices(ds: Any, size: int) -> list[list[object]]:
    """For every rank, the list of its batches."""
    from tnt_keras.backends.tensorflow import inputs as data

    return [list(data.slice_batches(ds, rank, size).as_numpy_iterator()) for rank in range(size)]


# (9, 4, 2) and (7, 3, 3) end with a batch of 1 sample: ranks past it get an empty slice.
@pytest.mark.parametrize(
    ("rows", "batch", "size"), [(12, 4, 4), (10, 10, 4), (11, 4, 3), (7, 7, 2), (9, 4, 2), (7, 3, 3)]
)
def test_slices_cover_every_batch_once_in_order(tf: ModuleType, rows: int, batch: int, size: int) -> None:
    ds = tf.data.Dataset.range(rows).batch(batch)
    per_rank = slices(ds, size)
    assert len({len(batches) for batches in per_rank}) == 1  # every rank runs the same number of steps
    for step, global_batch in enumerate(ds.as_numpy_iterator()):
        parts = [per_rank[r][step] for r in range(size)]
        np.testing.assert_array_equal(np.concatenate(parts), global_batch)
        b = len(global_batch)
        assert [len(p) for p in parts] == [b // size + (r < b % size) for r in range(size)]


def test_ragged_sparse_and_dict_elements_are_sliced_alike(tf: ModuleType) -> None:
    from tnt_keras.backends.tensorflow import inputs as data

    ragged = tf.ragged.constant([[1], [2, 2], [3, 3, 3], [4], [5, 5]])
    sparse = tf.sparse.from_dense(np.diag(np.arange(1, 6, dtype=np.float32)))
    ds = tf.data.Dataset.from_tensor_slices(({"r": ragged, "s": sparse}, tf.range(5))).batch(5)
    (first,), (second,) = (list(data.slice_batches(ds, rank, 2)) for rank in range(2))
    assert first[0]["r"].to_list() == [[1], [2, 2], [3, 3, 3]] and second[0]["r"].to_list() == [[4], [5, 5]]
    np.testing.assert_array_equal(first[1], [0, 1, 2])
    dense = [tf.sparse.to_dense(part[0]["s"]).numpy() for part in (first, second)]
    np.testing.assert_array_equal(np.concatenate(dense), np.diag(np.arange(1, 6, dtype=np.float32)))


def test_a_batch_size_smaller_than_the_ranks_is_refused_up_front(tf: ModuleType) -> None:
    from tnt_keras.backends.tensorflow import inputs as data

    with pytest.raises(ValueError, match="cannot be split over 3 ranks"):
        data.slice_batches(tf.data.Dataset.range(4).batch(2), 0, 3)


def test_a_partial_batch_smaller_than_the_ranks_leaves_empty_slices(tf: ModuleType) -> None:
    from tnt_keras.backends.tensorflow import inputs as data

    dense, ragged = np.arange(10.0).reshape(5, 2), tf.ragged.constant([[1]] * 5)
    sparse = tf.sparse.from_dense(np.eye(5, dtype=np.float32))
    ds = tf.data.Dataset.from_tensor_slices((dense, ragged, sparse)).batch(4)  # a last batch of 1 on 3 ranks
    last = [list(data.slice_batches(ds, rank, 3))[-1] for rank in range(3)]
    assert [part[0].shape[0] for part in last] == [1, 0, 0]
    assert [int(part[1].nrows()) for part in last] == [1, 0, 0]
    assert [int(part[2].dense_shape[0]) for part in last] == [1, 0, 0]
    np.testing.assert_array_equal(last[0][0], dense[4:])


def test_a_whole_pipeline_cut_as_its_batches_are_drawn_gives_each_rank_its_slice(tf: ModuleType) -> None:
    """An elastic fit's pipeline comes whole (``prepare(whole_batches=True)``) and each step cuts its
    rank's rows from the batch it drew: the same rows as the pipeline's own slicing, for any number
    of ranks the job re-forms to (a partial last batch and a dict element among them)."""
    from tnt_keras.backends.tensorflow import inputs as data

    ds = tf.data.Dataset.from_tensor_slices(({"a": np.arange(22.0).reshape(11, 2)}, np.arange(11))).batch(4)
    whole = data.prepare(ds, 0, 4, whole_batches=True)
    assert whole is not ds and whole in data.whole and ds not in data.whole  # the user's pipeline stays plain
    assert data.prepare(ds, 0, 4) not in data.whole
    drawn = list(whole)
    for size in (4, 3, 2):
        for rank in range(size):
            cut = [data.slice_of(batch, rank, size) for batch in drawn]
            for mine, theirs in zip(cut, data.slice_batches(ds, rank, size), strict=True):
                np.testing.assert_array_equal(mine[0]["a"], theirs[0]["a"])
                np.testing.assert_array_equal(mine[1], theirs[1])
    with pytest.raises(ValueError, match="cannot be split over 5 ranks"):
        data.prepare(ds, 0, 5, whole_batches=True)


def test_a_pipeline_that_reshuffles_each_reading_is_told_apart(tf: ModuleType) -> None:
    """Where an epoch read again would get another order (an elastic fit then neither begins an epoch
    again in its order nor admits replacements)."""
    from tnt_keras.backends.tensorflow import inputs as data

    rows = tf.data.Dataset.range(8)
    assert data.reshuffles(rows.shuffle(8, seed=1).batch(2).map(lambda b: b * 2).prefetch(1))
    assert not data.reshuffles(rows.shuffle(8, seed=1, reshuffle_each_iteration=False).batch(2))
    assert not data.reshuffles(rows.batch(2))
    assert data.reshuffles(data.prepare(rows.shuffle(8, seed=1).batch(4), 1, 2))  # seen through tnt's slicing
