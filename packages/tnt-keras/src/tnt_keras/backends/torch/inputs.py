"""Each rank's slice of every global batch, for the inputs Keras' torch backend takes: those in host
memory as on every such backend (``backends/host_inputs.py``: numpy arrays, PyDatasets, tf.data),
torch tensors among the arrays, and a ``torch.utils.data.DataLoader`` with a batch size: the same
loader over this rank's indices of every global batch (a batch sampler of our own), so each rank
loads only its rows, and which deals a batch again by index for the ranks left after an elastic
job re-formed (``LoaderSlices``), and where its batch sampler draws its order from state tnt
cannot read, logs the batches of each pass to read them again for an epoch begun again
(``PassLog``); over an ``IterableDataset``, which has no indices, the user's loader as it is, each
rank keeping its rows of every batch (``StreamSlices``).

The rule (``slicing.py``) is the TensorFlow backend's: rank r takes rows ``[start_r, start_r + b_r)``.
"""

from __future__ import annotations

import copy
import functools
import itertools
import weakref
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

from ...runtime import logger
from ...slicing import DEFAULT_SHUFFLE_SEED, rank_rows, too_small
from .. import host_inputs


def is_dataset(x: Any) -> bool:
    native = isinstance(x, (keras.utils.PyDataset, DataLoader))
    return native or host_inputs.is_tf_dataset(x) or host_inputs.is_generator(x)


def _marked(indices: list[Any], rank: int, size: int) -> list[tuple[Any, bool]]:
    """This rank's indices of a global batch, each marked to be kept. A slice may be empty (a last
    batch of fewer rows than ranks), but a DataLoader cannot collate nothing into a batch of the right
    structure: such a slice loads the batch's first row, marked, and ``_CollateMarked`` cuts the
    collated batch to 0 rows."""
    start, count = rank_rows(len(indices), rank, size)
    return [(i, True) for i in indices[start : start + count]] if count else [(indices[0], False)]


class _Pass:
    """One pass over a batch sampler of the user's, logged: the global batches drawn from it so far,
    and the rest to draw. Read again, it gives the batches it gave, then draws on."""

    def __init__(self, batches: Any) -> None:
        self.drawn: list[list[Any]] = []
        self.rest = iter(batches)

    def __iter__(self) -> Iterator[list[Any]]:
        for number in itertools.count():
            if number == len(self.drawn):
                batch = next(self.rest, None)
                if batch is None:
                    return
                self.drawn.append(list(batch))
            yield self.drawn[number]


class PassLog:
    """The passes over one batch sampler of the user's that tnt's loaders made (``_Pass``), numbered
    as the loaders make their iterators (two per iterator of a loader with workers, as torch asks
    for two), kept across the fits and attempts that slice it: the order of a sampler whose state
    tnt cannot read. Each asking (``ask``, at an epoch's start) keeps how many passes were made
    before it, and which pass and batch were read first after it (-1 until then); ``again`` makes
    the passes made after it be read again, batch for batch, before any is drawn anew."""

    def __init__(self, batches: Any) -> None:
        self.batches = batches
        self.passes: dict[int, _Pass] = {}
        self.opened = 0  # the number the next pass gets
        self.begun: dict[int, tuple[int, int, int]] = {}
        self.asked: list[int] = []  # asked for, no batch read since

    def open(self) -> tuple[int, _Pass]:
        number, self.opened = self.opened, self.opened + 1
        return number, self.passes.setdefault(number, _Pass(self.batches))  # made as the user's loader makes it

    def ask(self) -> int:
        """Numbers an asking (an epoch's start): the passes made from now on are its to read again."""
        token = max(self.begun, default=-1) + 1
        self.begun[token], self.asked = (self.opened, -1, -1), [*self.asked, token]
        for old in sorted(self.begun)[:-3]:  # an elastic fit sets back one of the last two epochs
            del self.begun[old]
        first = min(opened for opened, _, _ in self.begun.values())
        for old in [n for n in self.passes if n < first]:  # never read again
            del self.passes[old]
        return token

    def read(self, pass_number: int, batch: int) -> None:
        for token in self.asked:
            self.begun[token] = (self.begun[token][0], pass_number, batch)
        self.asked = []

    def again(self, token: int) -> bool:
        """Makes the passes after asking ``token`` be read again; False where the batch read first
        after it came from a pass made before it (steps_per_epoch: an epoch that began inside a pass)."""
        opened, pass_number, batch = self.begun[token]
        if pass_number >= 0 and (pass_number < opened or batch > 0):
            return False
        self.opened = opened
        return True


_logs: weakref.WeakKeyDictionary[Any, PassLog] = weakref.WeakKeyDictionary()
"""The log of each batch sampler of the users' whose order tnt cannot set back."""


class RankBatchSampler(torch.utils.data.Sampler[list[tuple[Any, bool]]]):
    """This rank's indices of every global batch that ``batches`` yields, for the ranks there are
    as it yields it (``rank`` and ``size`` change where an elastic job re-forms). ``dealt`` keeps,
    for each batch of this pass not yet trained on, its global indices and the ranks it was dealt
    for: the loader reads ahead (worker processes), so a batch may have been dealt for the job
    before it re-formed. With a ``log``, the passes over ``batches`` go through it (``PassLog``);
    ``pass_number`` is the one made last."""

    def __init__(self, batches: Any, rank: int, size: int, log: PassLog | None = None) -> None:
        self.batches, self.rank, self.size, self.log = batches, rank, size, log
        self.dealt: dict[int, tuple[list[Any], int, int]] = {}
        self.pass_number = -1

    def __iter__(self) -> Iterator[list[tuple[Any, bool]]]:
        if self.log is None:
            return self._deal(list(batch) for batch in self.batches)
        self.pass_number, logged = self.log.open()
        return self._deal(iter(logged))

    def _deal(self, batches: Iterator[list[Any]]) -> Iterator[list[tuple[Any, bool]]]:
        self.dealt = {}
        for number, indices in enumerate(batches):
            self.dealt[number] = (indices, self.rank, self.size)
            yield _marked(indices, self.rank, self.size)

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


def _options_of(loader: DataLoader) -> dict[str, Any]:
    """What a loader of tnt's takes over from the user's: its workers, their start and seeding (the
    generator the loader draws their seed from), memory pinning and timeout."""
    return {
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "prefetch_factor": loader.prefetch_factor if loader.num_workers > 0 else None,
        "persistent_workers": loader.persistent_workers,
    }


class LoaderSlices(DataLoader):
    """This rank's rows of every global batch of a user's ``DataLoader``: a loader of the same
    dataset, workers and collate function over this rank's indices of each batch
    (``RankBatchSampler``), drawing from the user's generator as the user's loader would (the same
    order as serial Keras on it).

    Like tnt's slices of arrays, it deals a batch again by index (``self[i]``: batch ``i`` of this
    pass, for the ranks there are now, loaded here), and knows the batch in training
    (``last_index``): an elastic fit redoes a lost step on it. A batch that the workers loaded
    before the job re-formed is loaded again for the ranks left."""

    def __init__(self, loader: DataLoader, batches: Any, rank: int, size: int, elastic: bool = False) -> None:
        self.ranks = RankBatchSampler(batches, rank, size)
        if elastic and not self._follows_its_order():  # an elastic fit may read a pass again
            self.ranks.log = _logs.setdefault(batches, PassLog(batches))
        self.last_index = 0
        super().__init__(_MarkedRows(loader.dataset), batch_sampler=self.ranks,
                         collate_fn=_CollateMarked(loader.collate_fn), **_options_of(loader))

    @property
    def rank(self) -> int:
        return self.ranks.rank

    @rank.setter
    def rank(self, rank: int) -> None:
        self.ranks.rank = rank

    @property
    def size(self) -> int:
        return self.ranks.size

    @size.setter
    def size(self, size: int) -> None:
        self.ranks.size = size

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        # The loader's iterator made now, as a DataLoader's: its making draws from the generator
        # (the workers' seed), and Keras makes the next epoch's at the end of the one before.
        loaded = super().__iter__()
        return self._dealt(loaded, self.ranks.pass_number)  # the pass made last is the one it reads

    def _dealt(self, loaded: Iterator[Any], pass_number: int) -> Iterator[Any]:
        for number, batch in enumerate(loaded):
            self.last_index = number
            if self.ranks.log is not None:
                self.ranks.log.read(pass_number, number)
            _, rank, size = self.ranks.dealt[number]
            for done in [n for n in self.ranks.dealt if n < number]:
                del self.ranks.dealt[done]  # trained on: never dealt again
            yield batch if (rank, size) == (self.rank, self.size) else self[number]

    def __getitem__(self, number: int) -> Any:
        """Batch ``number`` of this pass, this rank's slice of it among the ranks there are now."""
        indices, _, _ = self.ranks.dealt[number]
        return self.collate_fn([self.dataset[m] for m in _marked(indices, self.rank, self.size)])

    def _sampler_generators(self) -> list[torch.Generator]:
        """The generators the batch sampler draws its order from: its own, or its sampler's."""
        batches = self.ranks.batches
        found = [getattr(batches, "generator", None), getattr(getattr(batches, "sampler", None), "generator", None)]
        return [g for g in found if isinstance(g, torch.Generator)]

    def _follows_its_order(self) -> bool:
        """Whether every pass's order follows from state tnt reads and sets: the generators the
        sampler draws from, or none (torch's sequential order)."""
        batches = self.ranks.batches
        sequential = isinstance(batches, BatchSampler) and isinstance(batches.sampler, SequentialSampler)
        return sequential or bool(self._sampler_generators())

    def unshared_order(self) -> str | None:
        """Why a new rank could not draw the order the others draw (a batch sampler that draws from
        state tnt cannot read), or None."""
        if self.ranks.log is None:
            return None
        batches = self.ranks.batches
        named = type(getattr(batches, "sampler", None) if isinstance(batches, BatchSampler) else batches).__name__
        return (
            f"the DataLoader's order comes from its sampler ({named}), whose state tnt cannot read: an epoch "
            "begun again reads the batches it read, but replacement ranks are not admitted, as they could not "
            "draw the order the others draw. Give the sampler a `generator` attribute, a torch.Generator it "
            "draws every order from (as torch's RandomSampler), and tnt keeps it alike on every rank, new ones too"
        )

    def _generators(self) -> list[torch.Generator]:
        """What each pass draws from: the sampler's generators (its order) and the loader's (its
        workers' seed), each once."""
        found: list[torch.Generator] = []
        for generator in (*self._sampler_generators(), self.generator):
            if generator is not None and all(generator is not g for g in found):
                found.append(generator)
        return found

    def order_state(self) -> np.ndarray | None:
        """The state of the generators the next pass draws from, as bytes; where the passes are
        logged, first the number of this asking (8 bytes), which names the pass and batch read next
        (None: nothing to keep). Each such call is an asking: an elastic fit makes one at every
        epoch's start (the sharing with replacements makes more, but they are refused on it)."""
        states = [g.get_state().numpy() for g in self._generators()]
        if self.ranks.log is not None:
            states.insert(0, np.frombuffer(np.int64(self.ranks.log.ask()).tobytes(), np.uint8))
        return np.concatenate(states) if states else None

    def set_order_state(self, state: np.ndarray) -> None:
        """Sets the generators back to ``state`` (``order_state``): the next pass reads the order the
        pass after that state read. Where the passes are logged, the loader reads again the pass the
        asking named, and those after it, batch for batch."""
        offset = 0
        if self.ranks.log is not None:
            token, offset = int(np.frombuffer(np.array(state[:8], np.uint8).tobytes(), np.int64)[0]), 8
            if not self.ranks.log.again(token):
                logger.warning("the epoch begun again began inside a pass over the DataLoader (steps_per_epoch): "
                               "it reads another order than serial training (a sampler whose state tnt cannot read)")
        for generator in self._generators():
            length = generator.get_state().numel()
            generator.set_state(torch.from_numpy(np.array(state[offset : offset + length], np.uint8)))
            offset += length


class StreamSlices(DataLoader):
    """This rank's rows of every global batch of a user's ``DataLoader`` over an ``IterableDataset``,
    which yields its rows (or batches) in an order of its own, not by index: a loader like the
    user's, whose every batch each rank loads whole, keeping its rows (as of a ``PyDataset``). The
    batch drawn last is kept, so that an elastic fit can deal it again over the ranks left
    (``self[last_index]``)."""

    def __init__(self, loader: DataLoader, rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self.last_index = 0
        self.whole: Any = None  # the global batch drawn last
        super().__init__(loader.dataset, batch_size=loader.batch_size, drop_last=loader.drop_last,
                         collate_fn=loader.collate_fn, **_options_of(loader))

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return self._cut(super().__iter__())  # made now, as LoaderSlices' (the workers' seed drawn)

    def _cut(self, loaded: Iterator[Any]) -> Iterator[Any]:
        for number, batch in enumerate(loaded):
            if number == 0 and (found := host_inputs.rows(batch)) < self.size:
                raise ValueError(too_small(found, self.size))
            self.whole, self.last_index = batch, number
            yield self[number]

    def __getitem__(self, number: int) -> Any:
        """This rank's slice of the batch drawn last (``number``), among the ranks there are now."""
        if number != self.last_index:
            raise IndexError(f"tnt: batch {number} of an IterableDataset's loader is gone (last: {self.last_index})")
        return host_inputs.rank_slice(self.whole, self.rank, self.size)


def reshuffles(ds: Any) -> bool:
    """A DataLoader that shuffles from a state tnt cannot set back (one handed to Keras as it is: its
    sampler draws each epoch's order from a generator that goes on), or a ``tf.data`` pipeline
    that does. tnt's slices of a DataLoader do not: their generators' state is kept at each epoch's
    start and set back (``order_state``)."""
    if isinstance(ds, LoaderSlices):
        return False
    if isinstance(ds, DataLoader):
        return _draws_its_order(getattr(ds.batch_sampler, "sampler", None))
    return host_inputs.reshuffles(ds)


def _draws_its_order(sampler: Any) -> bool:
    """A sampler that draws each pass's order from a generator: torch's ``RandomSampler``,
    ``SubsetRandomSampler`` and ``WeightedRandomSampler`` (a ``generator`` of None: torch's global one)."""
    return sampler is not None and hasattr(sampler, "generator")


_seeded: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
"""The seeded sampler that draws in place of each of the users' that has no generator."""


def unshared_order(ds: Any) -> str | None:
    """Why a replacement rank could not draw the order the others draw from ``ds`` (what
    ``distribute`` returned), or None."""
    return ds.unshared_order() if isinstance(ds, LoaderSlices) else None


def order_state(ds: Any) -> np.ndarray | None:
    """Where ``ds`` (what ``distribute`` returned) draws each pass's order from generators tnt can
    set back (its slices of a DataLoader), their state; else None."""
    return ds.order_state() if isinstance(ds, LoaderSlices) else None


def set_order_state(ds: Any, state: np.ndarray) -> None:
    """Sets ``ds``'s generators back to ``state`` (``order_state``)."""
    if isinstance(ds, LoaderSlices):
        ds.set_order_state(state)


def _loader_slices(loader: DataLoader, rank: int, size: int, elastic: bool) -> DataLoader:
    if isinstance(loader.dataset, IterableDataset):  # no indices to deal: every rank loads every batch
        return StreamSlices(loader, rank, size)
    batches = loader.batch_sampler
    if batches is None:
        raise ValueError(
            "tnt: the DataLoader has no batch size (batch_size=None), so tnt cannot tell its global batches. "
            "Give it the GLOBAL batch size: DataLoader(dataset, batch_size=B)."
        )
    if isinstance(batches, BatchSampler) and _draws_its_order(batches.sampler):
        sampler = batches.sampler
        if sampler.generator is None:
            # Without one it would draw from torch's global generator, which differs from rank to rank
            # unless seeded alike. Every rank must draw the same order: a copy of the sampler with a
            # generator of our own, seeded alike, one per sampler of the user's (its order goes on from
            # one fit to the next, as the global generator's would).
            if sampler not in _seeded:
                seeded = copy.copy(sampler)
                seeded.generator = torch.Generator().manual_seed(DEFAULT_SHUFFLE_SEED)
                _seeded[sampler] = seeded
                logger.info("DataLoader's %s has no generator: using seed %d on every rank",
                            type(sampler).__name__, DEFAULT_SHUFFLE_SEED)
            sampler = _seeded[sampler]
        batches = BatchSampler(sampler, batches.batch_size, batches.drop_last)
    return LoaderSlices(loader, batches, rank, size, elastic)


# The shared slicing of host-memory inputs, with torch's own: tensors kept as they are, and a
# DataLoader given a batch sampler of this rank's rows.
distribute = functools.partial(
    host_inputs.distribute,
    native_datasets=(DataLoader,),
    native_slices=_loader_slices,
    native_arrays=(torch.Tensor,),
    accepted="numpy arrays with batch_size, a keras.utils.PyDataset or a torch DataLoader",
)
