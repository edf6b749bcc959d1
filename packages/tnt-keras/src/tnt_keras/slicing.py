"""The rule that gives each rank its slice of a global batch, the same on every backend.

Rank ``r`` of ``N`` takes rows ``[start_r, start_r + b_r)`` of a batch of ``B`` rows, with
``b_r = B//N + (r < B%N)`` and ``start_r = r*(B//N) + min(r, B%N)``: B not divisible by N and
partial last batches stay exact, and every rank runs the same number of steps. A batch of fewer than
``N`` rows leaves the last ranks an empty slice (the backends' empty-slice guards handle those).
"""

from __future__ import annotations

# Seed of the shuffles that tnt makes, or gives a shuffle made without one, so that every rank draws
# the same order.
DEFAULT_SHUFFLE_SEED = 4242


def rank_rows(batch: int, rank: int, size: int) -> tuple[int, int]:
    """``(start, count)`` of rank ``rank``'s rows in a global batch of ``batch`` rows."""
    base, extra = divmod(batch, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def too_small(batch: int, size: int) -> str:
    return (
        f"tnt: a global batch of {batch} samples cannot be split over {size} ranks: the dataset's batch size is "
        f"the GLOBAL batch size and must be at least the number of ranks, or some ranks would never get a sample. "
        f"Batch the dataset with at least {size} samples (only a partial last batch may hold fewer)."
    )
