"""The inputs of the backends that slice in host memory (torch, JAX): arrays, a PyDataset and, on
torch, a DataLoader, each sliced by the global-batch rule; each rank loads only its own rows where
the input allows it; no TensorFlow imported. Then, where TensorFlow is installed, a tf.data pipeline
on the backend."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import importlib.util
import sys
import zlib

import keras
import numpy as np
import tnt_comm
import tnt_keras as tnt
from _job import BACKEND, CLASSES, FEATURES, arrays, build, compile_args, history_diff, max_diff, report
from tnt_keras.backends import current
from tnt_keras.slicing import rank_rows

distribute = current().distribute

rank, size = tnt.get_rank(), tnt.get_size()
ROWS, BATCH = 23, 5  # 5 global batches: 4 of 5 rows, the last of 3 (fewer than 4 ranks: empty slices)
results: dict = {"tensorflow_imported_at_start": "tensorflow" in sys.modules}


def expected_rows(order: np.ndarray) -> list[list[int]]:
    """This rank's rows of every global batch of ``order`` by the rule."""
    out = []
    for begin in range(0, len(order), BATCH):
        batch = order[begin : begin + BATCH]
        start, count = rank_rows(len(batch), rank, size)
        out.append([int(i) for i in batch[start : start + count]])
    return out


ids = np.arange(ROWS, dtype=np.float32)[:, None]  # each row holds its own index

# Arrays, in order and shuffled: the rule's rows; the shuffled order is one permutation, alike on every rank.
plain = distribute(ids, None, None, BATCH, rank=rank, size=size, shuffle=False, distribute=True,
                   micro_batch_size=None, what="test")
results["arrays"] = [[int(v) for v in plain[i][0][:, 0]] for i in range(len(plain))]
results["arrays_expected"] = expected_rows(np.arange(ROWS))
shuffled = distribute(ids, None, None, BATCH, rank=rank, size=size, shuffle=True, distribute=True,
                      micro_batch_size=None, what="test")
epochs, orders = [], []
for _ in range(2):
    epochs.append([int(v) for i in range(len(shuffled)) for v in shuffled[i][0][:, 0]])
    orders.append(shuffled.order.tolist())
    shuffled.on_epoch_end()
results["shuffled"] = epochs


class Batches(keras.utils.PyDataset):
    def __init__(self) -> None:
        super().__init__()

    def __len__(self) -> int:
        return -(-ROWS // BATCH)

    def __getitem__(self, i: int) -> tuple[np.ndarray]:
        return (ids[i * BATCH : (i + 1) * BATCH],)


sliced = distribute(Batches(), None, None, None, rank=rank, size=size, shuffle=False, distribute=True,
                    micro_batch_size=None, what="test")
results["pydataset"] = [[int(v) for v in sliced[i][0][:, 0]] for i in range(len(sliced))]

# A DataLoader (torch only): this rank's rows, loaded once each.
if BACKEND == "torch":
    import torch
    from torch.utils.data import DataLoader, Dataset, SubsetRandomSampler, WeightedRandomSampler

    class Counting(Dataset):
        """Rows that count how often each is loaded."""

        def __init__(self) -> None:
            self.loaded = np.zeros(ROWS, dtype=np.int64)

        def __len__(self) -> int:
            return ROWS

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            self.loaded[i] += 1
            return torch.tensor([float(i)]), torch.tensor(0)

    counting = Counting()
    loader = distribute(DataLoader(counting, batch_size=BATCH), None, None, None, rank=rank, size=size, shuffle=False,
                        distribute=True, micro_batch_size=None, what="test")
    results["loader"] = [[int(v) for v in x[:, 0]] for x, _ in loader]
    results["loader_loaded"] = counting.loaded.tolist()  # only this rank's rows, once each
    shuffled_loader = distribute(DataLoader(Counting(), batch_size=BATCH, shuffle=True), None, None, None, rank=rank,
                                 size=size, shuffle=False, distribute=True, micro_batch_size=None, what="test")
    results["loader_shuffled"] = [int(v) for x, _ in shuffled_loader for v in x[:, 0]]

    def rows_of(batch: np.ndarray, r: int, s: int) -> list[int]:
        start, count = rank_rows(len(batch), r, s)
        return [int(i) for i in batch[start : start + count]]

    def loader_with(seed: int) -> DataLoader:
        """A loader that shuffles from a generator of its own, its worker reading two batches ahead."""
        generator = torch.Generator().manual_seed(seed)
        return DataLoader(Counting(), batch_size=BATCH, shuffle=True, generator=generator, num_workers=1,
                          prefetch_factor=2)

    def ids_of(batch: torch.Tensor) -> list[int]:
        return [int(v) for v in batch[:, 0]]

    def sliced(loader: DataLoader) -> DataLoader:
        return distribute(loader, None, None, None, rank=rank, size=size, shuffle=False, distribute=True,
                          micro_batch_size=None, what="test")

    # Three passes of such a loader (the third sliced anew, as a second fit slices it): each rank's slices
    # of the global batches the same loader gives serially.
    serial = loader_with(9)
    serial_batches = [np.array(ids_of(x)) for _ in range(3) for x, _ in serial]
    users = loader_with(9)
    first_fit = sliced(users)
    results["loader_generator"] = [ids_of(x) for loader in (first_fit, first_fit, sliced(users)) for x, _ in loader]
    results["loader_generator_expected"] = [rows_of(b, rank, size) for b in serial_batches]
    # Torch's other random samplers without a generator draw from its global one, here unlike on every
    # rank (as in processes nobody seeded): tnt's seeded copy deals each rank its rows of one order.
    global_state = torch.get_rng_state()
    torch.manual_seed(1000 + rank)
    for name, sampler in (("subset", SubsetRandomSampler(range(ROWS))),
                          ("weighted", WeightedRandomSampler([1.0] * ROWS, ROWS, replacement=False))):
        loader = sliced(DataLoader(Counting(), batch_size=BATCH, sampler=sampler))
        results[f"loader_{name}"] = [int(v) for x, _ in loader for v in x[:, 0]]
    torch.set_rng_state(global_state)
    # A loader over an IterableDataset (no indices): each rank keeps its rows of every batch.
    class CountingStream(torch.utils.data.IterableDataset):
        def __iter__(self):
            for i in range(ROWS):
                yield torch.tensor([float(i)]), torch.tensor(0)

    results["loader_stream"] = [ids_of(x) for x, _ in sliced(DataLoader(CountingStream(), batch_size=BATCH))]
    # A loader that shuffles without a generator: tnt's seeded one goes on from one slicing to the next.
    once = sliced(DataLoader(Counting(), batch_size=BATCH, shuffle=True))
    results["loader_seeded_expected"] = [ids_of(x) for _ in range(2) for x, _ in once]
    users = DataLoader(Counting(), batch_size=BATCH, shuffle=True)
    results["loader_seeded"] = [ids_of(x) for _ in range(2) for x, _ in sliced(users)]
    # The ranks change after the first batch (an elastic job re-forming on 2 ranks): the batches the
    # worker read ahead for 3 are dealt again for 2, and the first batch again by its index.
    serial_batches = [np.array(ids_of(x)) for x, _ in loader_with(11)]
    redealt = distribute(loader_with(11), None, None, None, rank=rank, size=size, shuffle=False, distribute=True,
                         micro_batch_size=None, what="test")
    after = (min(rank, 1), 2)
    got = []
    for number, (x, _) in enumerate(redealt):
        got.append(ids_of(x))
        if number == 0:
            redealt.rank, redealt.size = after
            got.append(ids_of(redealt[0][0]))
    results["loader_redealt"] = got
    first = serial_batches[0]
    results["loader_redealt_expected"] = [rows_of(first, rank, size), rows_of(first, *after)] + [
        rows_of(b, *after) for b in serial_batches[1:]]


# Up to here only tnt ran: no TensorFlow. (Keras' own set_random_seed, which build() calls, imports
# TensorFlow wherever it is installed, on any backend.)
results["tensorflow_imported"] = "tensorflow" in sys.modules

if BACKEND == "torch":  # fit on a DataLoader equals serial Keras-torch on the same loader.
    x, y = arrays(ROWS * 4, seed=3)
    data = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y.astype(np.int64)))
    serial = build("functional")
    serial.compile(**compile_args("sgd"))
    serial.fit(DataLoader(data, batch_size=BATCH * 2), epochs=2, verbose=0)
    model = tnt.Model(build("functional"))
    model.compile(**compile_args("sgd"))
    model.fit(DataLoader(data, batch_size=BATCH * 2), epochs=2, verbose=0)
    results["loader_fit_err"] = max_diff(serial.get_weights(), model.get_weights())

    class Stream(torch.utils.data.IterableDataset):
        """The same rows, yielded in order (no indices)."""

        def __iter__(self):
            yield from data

    serial = build("functional")
    serial.compile(**compile_args("sgd"))
    serial.fit(DataLoader(Stream(), batch_size=BATCH * 2), epochs=2, verbose=0)
    model = tnt.Model(build("functional"))
    model.compile(**compile_args("sgd"))
    model.fit(DataLoader(Stream(), batch_size=BATCH * 2), epochs=2, verbose=0)
    results["stream_fit_err"] = max_diff(serial.get_weights(), model.get_weights())
    results["features"] = (FEATURES, CLASSES)

# class_weight, sample_weight and validation data, on arrays of 70 rows in global batches of 7 (which
# 3 ranks split 3/2/2): weights and every logged number equal serial Keras on the backend.
x, y = arrays(70, seed=4)
sample_weight = np.random.default_rng(5).uniform(0.5, 2.0, 70).astype("float32")
weighted = {}
for name, extra in {
    "class_weight": {"class_weight": {0: 1.0, 1: 2.0, 2: 0.5}},
    "sample_weight": {"sample_weight": sample_weight},
    "validation": {"validation_data": (x[:20], y[:20])},
}.items():
    serial = build("sequential")
    serial.compile(**compile_args("adam"))
    expected = serial.fit(x, y, batch_size=7, epochs=2, shuffle=False, verbose=0, **extra).history
    model = tnt.Model(build("sequential"))
    model.compile(**compile_args("adam"))
    got = model.fit(x, y, batch_size=7, epochs=2, shuffle=False, verbose=0, **extra).history
    weighted[name] = {
        "weights_err": max_diff(serial.get_weights(), model.get_weights()),
        "history_err": history_diff(expected, got),  # which also requires the same logged names
        "logged": sorted(got),
    }
results["weighted"] = weighted


def global_batches() -> object:
    """A Python generator of (x, y) global batches of 7 rows from 70 (3 ranks: 3/2/2), for 2 epochs."""
    for _ in range(2):
        for begin in range(0, 70, 7):
            yield x[begin : begin + 7], y[begin : begin + 7]


# A generator of global batches: each rank keeps its rows of each; fit equals serial Keras on it.
serial = build("sequential")
serial.compile(**compile_args("adam"))
expected = serial.fit(global_batches(), steps_per_epoch=10, epochs=2, verbose=0).history
model = tnt.Model(build("sequential"))
model.compile(**compile_args("adam"))
got = model.fit(global_batches(), steps_per_epoch=10, epochs=2, verbose=0).history
results["generator"] = {
    "weights_err": max_diff(serial.get_weights(), model.get_weights()),
    "history_err": history_diff(expected, got),
}

# tf.data where TensorFlow is installed (Keras' set_random_seed above has imported it by now): sliced
# by the same rule, and fit on it equals serial Keras on the same pipeline.
if importlib.util.find_spec("tensorflow") is not None:
    import tensorflow as tf

    pipeline = tf.data.Dataset.from_tensor_slices(ids).batch(BATCH)
    sliced_tf = distribute(pipeline, None, None, None, rank=rank, size=size, shuffle=False, distribute=True,
                           micro_batch_size=None, what="test")
    results["tf_data"] = [[int(v) for v in np.asarray(batch)[:, 0]] for batch in sliced_tf]
    x, y = arrays(ROWS * 4, seed=6)

    def shuffled_pipeline() -> tf.data.Dataset:
        # One per run: a pipeline that reshuffles each iteration shuffles its second iteration (the
        # next run's first epoch) otherwise than its first.
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(ROWS * 4, seed=7).batch(BATCH * 2)

    serial = build("functional")
    serial.compile(**compile_args("sgd"))
    expected = serial.fit(shuffled_pipeline(), epochs=2, verbose=0).history
    model = tnt.Model(build("functional"))
    model.compile(**compile_args("sgd"))
    got = model.fit(shuffled_pipeline(), epochs=2, verbose=0).history
    results["tf_data_fit"] = {
        "weights_err": max_diff(serial.get_weights(), model.get_weights()),
        "history_err": history_diff(expected, got),
    }
results["rank"], results["size"] = rank, size
digest = zlib.crc32(str(orders).encode())  # the permutations, alike on every rank
results["same_everywhere"] = bool(np.all(tnt_comm.allgather(np.array([digest], dtype=np.int64)) == digest))
report(results)
