"""The order tnt's slices of a torch DataLoader keep for an elastic fit, in one process: a batch
sampler of the user's whose state tnt cannot read has its passes logged and read again from an
epoch's start; one that draws from a `generator` attribute is set back through it instead."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import skip_unless_installed

ROWS, BATCH = 10, 4


class OwnShuffle:
    """A batch sampler that shuffles from a numpy state of its own; with ``generator``, from a
    torch.Generator it keeps as its ``generator`` attribute instead."""

    def __init__(self, seed: int, generator: Any = None) -> None:
        self.state, self.generator = np.random.RandomState(seed), generator

    def __len__(self) -> int:
        return -(-ROWS // BATCH)

    def __iter__(self) -> Any:
        import torch

        if self.generator is not None:
            order = torch.randperm(ROWS, generator=self.generator).tolist()
        else:
            order = self.state.permutation(ROWS).tolist()
        for start in range(0, ROWS, BATCH):
            yield order[start : start + BATCH]


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("drawn_from", ["own-state", "generator"])
def test_an_epoch_begun_again_reads_the_batches_it_read_and_the_next_goes_on(workers: int, drawn_from: str) -> None:
    skip_unless_installed("torch")
    import torch
    from tnt_keras.backends.torch import inputs

    rows = torch.utils.data.TensorDataset(torch.arange(ROWS))

    def loader(seed: int) -> Any:
        generator = torch.Generator().manual_seed(seed) if drawn_from == "generator" else None
        ahead = {"prefetch_factor": 2} if workers else {}
        batches = OwnShuffle(seed, generator)
        return torch.utils.data.DataLoader(rows, batch_sampler=batches, num_workers=workers, **ahead)

    def keras_epoch(read: Any) -> list[list[int]]:
        batches = [batch[0].flatten().tolist() for batch in read]
        iter(read)  # Keras makes the next epoch's iterator at an epoch's end (its workers read ahead)
        return batches

    def rank_0_of_2(batches: list[list[int]]) -> list[list[int]]:
        return [batch[: inputs.rank_rows(len(batch), 0, 2)[1]] for batch in batches]

    plain = loader(3)
    serial = [rank_0_of_2(keras_epoch(plain)) for _ in range(3)]  # the user's loader in serial Keras, rank 0's rows
    user = loader(3)

    def sliced() -> Any:
        return inputs.distribute(user, None, None, None, rank=0, size=2, shuffle=False, distribute=True,
                                 micro_batch_size=None, what="fit", redealt=True)

    slices = sliced()
    assert isinstance(slices, inputs.LoaderSlices)
    asked: list[Any] = []
    for number in range(2):
        asked.append(slices.order_state())  # kept at the epoch's start
        assert keras_epoch(slices) == serial[number]
    again = sliced()  # the second epoch begun again, in a new attempt
    inputs.set_order_state(again, asked[1])
    again.order_state()
    assert keras_epoch(again) == serial[1]
    again.order_state()
    assert keras_epoch(again) == serial[2]  # ... and the next epoch draws on from where serial Keras is
    # Only the sampler whose state tnt cannot read keeps replacements out (they could not draw its order).
    refused = inputs.unshared_order(again)
    assert (refused is not None) == (drawn_from == "own-state"), refused
    if refused is not None:
        assert "(OwnShuffle), whose state tnt cannot read" in refused and "`generator` attribute" in refused
    # Outside an elastic job no pass is read again: none is logged.
    plain_slices = inputs.distribute(user, None, None, None, rank=0, size=2, shuffle=False, distribute=True,
                                     micro_batch_size=None, what="fit")
    assert plain_slices.ranks.log is None


def test_an_elastic_job_left_with_one_rank_still_slices_a_loader() -> None:
    """Its slices keep the order an epoch begun again reads: the loader as it is would not."""
    skip_unless_installed("torch")
    import torch
    from tnt_keras.backends.torch import inputs

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(ROWS)), batch_size=BATCH,
                                         shuffle=True, generator=torch.Generator().manual_seed(1))
    one = {"rank": 0, "size": 1, "shuffle": False, "distribute": True, "micro_batch_size": None, "what": "fit"}
    assert inputs.distribute(loader, None, None, None, **one) is loader
    assert isinstance(inputs.distribute(loader, None, None, None, **one, redealt=True), inputs.LoaderSlices)


def test_torch_samplers_are_followed_by_their_generators_not_logged() -> None:
    skip_unless_installed("torch")
    import torch
    from tnt_keras.backends.torch import inputs

    rows = torch.utils.data.TensorDataset(torch.arange(ROWS))
    for loader in (torch.utils.data.DataLoader(rows, batch_size=BATCH),
                   torch.utils.data.DataLoader(rows, batch_size=BATCH, shuffle=True)):
        slices = inputs.distribute(loader, None, None, None, rank=0, size=2, shuffle=False, distribute=True,
                                   micro_batch_size=None, what="fit", redealt=True)
        assert slices.ranks.log is None and inputs.unshared_order(slices) is None
