"""``predict`` over ranks: every rank predicts its slices, and every rank gets all predictions back in
the order of the input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tnt_comm

from . import variables as shared_variables


class RowCounter:
    """Wraps a model's predict function and counts the rows each batch yields, to put every rank's
    slices back in order.

    It reads the outputs as the predict function returns them: callbacks see them only through
    logs that Keras flattens (dict outputs lose the ``outputs`` key), and a batch-end callback
    would count as one more callback with a batch hook in Keras' check for asynchronous dispatch.
    """

    def __init__(self, function: Callable[..., Any], outputs_of: Callable[[Any], Any]) -> None:
        self.function, self.outputs_of = function, outputs_of
        self.rows: list[int] = []

    def __call__(self, *args: Any) -> Any:
        returned = self.function(*args)
        leaves = [t for t in keras.tree.flatten(self.outputs_of(returned)) if t is not None]
        self.rows.append(int(leaves[0].shape[0]) if leaves else 0)
        return returned


def sync_variables(model: keras.Model) -> None:
    """Gives every rank rank 0's model variables (not the optimizer's: predict needs none).

    Collective. Ranks may differ before predict: a model that was never fit has each rank's own
    random initial weights, and fit updates BatchNormalization's moving statistics from each rank's
    own slices. Only variables whose checksums differ somewhere are broadcast, so repeated
    predictions on weights that are already equal cost two small allgathers.
    """
    variables = shared_variables.unique_variables(model.variables)
    if tnt_comm.size() == 1:
        return
    shared_variables.check_same_variables(variables, "model variables")
    if not variables:
        return
    differ = shared_variables.differing_variables(variables)
    if any(differ):
        stale = [v for v, d in zip(variables, differ, strict=True) if d]
        shared_variables.broadcast_variables(stale, checked=True)


def reassemble(local: Any, rows: np.ndarray) -> Any:
    """Every rank's slices of every batch, back in the order of the global batches, for every
    array of the output structure (one allgatherv per array, in the same order on every rank)."""
    order = global_order(rows)

    def gather(array: Any) -> Any:
        if array is None:
            return None
        return tnt_comm.allgatherv(np.ascontiguousarray(array))[order]

    return keras.tree.map_structure(gather, local)


def global_order(rows: np.ndarray) -> np.ndarray:
    """Indices into the ranks' concatenated outputs (rank 0's batches, then rank 1's, ...) that put
    them in input order: batch 0 of every rank, then batch 1, ... ``rows`` is (ranks, batches)."""
    per_rank = rows.sum(axis=1)
    begins = (np.cumsum(per_rank) - per_rank)[:, None] + np.cumsum(rows, axis=1) - rows
    pieces = [np.arange(b, b + c) for b, c in zip(begins.T.ravel(), rows.T.ravel(), strict=True)]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
