"""One process of the training benchmark; started by training.py, never by hand.

``python _training_worker.py MODE --model NAME [--steps M --rounds R --batch B --seed S --samples N]``
trains one of the benchmark's models (see ``MODELS``: a LeNet-5-like CNN, Keras' ResNet-50, a
Transformer encoder) on synthetic data for ``1 + R`` epochs of ``M`` steps each, in one ``fit``:
epoch 0 is the warm-up (tracing, first touches of memory; tnt broadcasts before it) and is not
reported; epochs 1..R are the timed rounds. Keras' backend is ``KERAS_BACKEND`` (the driver sets it:
``tensorflow`` or ``torch``). MODE is one of

- ``keras``: plain Keras, one process, no tnt and no distribution strategy;
- ``tnt``: ``tnt_keras.Model`` around the same model; started by ``tnt-launch`` (1 or 2 ranks), or
  without the launcher's environment as a single rank;
- ``mwms`` (TensorFlow only): ``tf.distribute.MultiWorkerMirroredStrategy``; the driver sets
  ``TF_CONFIG``.
- ``ddp`` (torch only): the same Keras model (a ``torch.nn.Module`` on the torch backend) wrapped in
  ``torch.nn.parallel.DistributedDataParallel`` over Gloo, trained by a plain torch loop (Keras'
  recipe in its guide "Multi-GPU distributed training with PyTorch"): forward, the Keras loss,
  backward, ``torch.optim.SGD``; each process on its half of every global batch. The driver sets
  ``torch.distributed``'s ``env://`` variables (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
  ``WORLD_SIZE``).
- ``solo``: plain Keras on this process's share of every global batch (the rows rank ``BENCH_RANK``
  of ``BENCH_SIZE`` would get), with no communication at all. The driver starts ``BENCH_SIZE`` of
  them at once: what the machine can do for that many ranks when communication were free.

Rank 0 (MWMS: worker 0) prints one line ``TRAINING_RESULT {json}`` with its measurements, which the
driver parses. Every process also writes ``BENCH_DIR/<mode>.r<rank>.json`` (its CPU time, for the
cores-used column), appends a line to ``BENCH_DIR/<mode>.r<rank>.jsonl`` after every epoch (the
driver's progress signal for its stall timeout) and its PID to ``BENCH_DIR/<mode>.r<rank>.pid`` (so
that the driver can kill it even when a launcher in between is gone).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The driver looks for this in /proc/PID/cmdline before it kills a PID a worker reported.
MARKER = "_training_worker.py"
RESULT_PREFIX = "TRAINING_RESULT "

CLASSES = 10
LEARNING_RATE = 0.01  # SGD, every configuration
# The Transformer encoder: about as many parameters as ResNet-50 (23.0M against 23.6M).
VOCAB, SEQUENCE, WIDTH, HEADS, FEED_FORWARD, BLOCKS = 8000, 32, 512, 8, 2048, 6


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["keras", "tnt", "mwms", "ddp", "dp", "solo"])
    parser.add_argument("--model", choices=list(MODELS), default="lenet")
    parser.add_argument("--steps", type=int, default=100, help="steps per epoch (per round)")
    parser.add_argument("--rounds", type=int, default=5, help="timed epochs after the warm-up epoch")
    parser.add_argument("--batch", type=int, default=256, help="global batch size")
    parser.add_argument("--samples", type=int, default=4096, help="synthetic samples, cached in memory")
    parser.add_argument("--seed", type=int, default=1234)
    return parser.parse_args(argv)


def configure_threads(tf: object) -> None:
    """Applies TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS where set (tnt-launch sets the
    intra-op count, and OMP_NUM_THREADS, to the cores per rank; the driver does the same for the
    MWMS workers). TensorFlow reads these variables itself; setting them here as well makes the
    choice explicit and independent of the TF version. Unset, TF's defaults (all cores) apply."""
    threading = tf.config.threading  # type: ignore[attr-defined]
    intra = os.environ.get("TF_NUM_INTRAOP_THREADS")
    inter = os.environ.get("TF_NUM_INTEROP_THREADS")
    try:
        if intra:
            threading.set_intra_op_parallelism_threads(int(intra))
        if inter:
            threading.set_inter_op_parallelism_threads(int(inter))
    except RuntimeError as error:  # the context was initialised already: TF's env reading applies
        print(f"worker: could not set TF thread counts: {error}", file=sys.stderr)


def patch_keras_for_mwms() -> None:
    """Works around two bugs of Keras 3.15's TensorFlow trainer under MultiWorkerMirroredStrategy
    (both are in keras/src/backend/tensorflow/trainer.py; gradients are not affected by either):

    1. ``TensorFlowTrainer._maybe_symbolic_build`` takes the first batch from the distributed
       iterator and calls ``strategy.reduce("MEAN", batch, axis=None)`` on the per-replica *data*
       to get shapes for building the model, which fails under MWMS with "Attempt to convert a
       value (PerReplica...". ``build_from_shapes`` below builds the model, loss, metrics and
       optimizer state from the per-replica shapes before ``fit`` instead, and the per-model patch
       there makes ``_maybe_symbolic_build`` a no-op.
    2. ``reduce_per_replica(..., reduction="auto")`` (the per-step logs of ``train_function``) calls
       ``strategy.reduce("MEAN", v, axis=0)`` for every value under MWMS; the logs are scalar
       losses and metric results, for which that fails with "Invalid reduction dimension 0". The
       wrapper below reduces scalars with ``axis=None`` (the cross-replica mean of the scalar)
       and leaves everything else to the original function. ``_make_function`` looks the function
       up in the module at trace time, so replacing the module attribute is enough.
    """
    import tensorflow as tf
    from keras import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original = tf_trainer.reduce_per_replica
    if getattr(original, "_bench_patched", False):
        return

    def scalar_rank(value: object) -> int | None:
        if isinstance(value, tf.distribute.DistributedValues):
            local = value.values[0]  # type: ignore[attr-defined]
        else:
            local = value
        shape = getattr(local, "shape", None)
        return None if shape is None else shape.rank

    def reduce_per_replica(values: object, strategy: object, reduction: str) -> object:
        multi_worker = tf_trainer._collective_all_reduce_multi_worker(strategy)
        if not (multi_worker and reduction in ("auto", "mean")):
            return original(values, strategy, reduction)

        def reduce_one(value: object) -> object:
            if scalar_rank(value) == 0:
                return strategy.reduce("MEAN", value, axis=None)  # type: ignore[attr-defined]
            return original(value, strategy, reduction)

        return tree.map_structure(reduce_one, values)

    reduce_per_replica._bench_patched = True  # type: ignore[attr-defined]
    tf_trainer.reduce_per_replica = reduce_per_replica


def training_setup(keras: Any) -> dict[str, Any]:
    """compile()'s arguments for every configuration that trains through Keras: SGD, the loss, accuracy."""
    return {
        "optimizer": keras.optimizers.SGD(learning_rate=LEARNING_RATE),
        "loss": "sparse_categorical_crossentropy",
        "metrics": ["accuracy"],
    }


def build_from_shapes(model: object, spec: ModelSpec, per_replica_batch: int) -> None:
    """Workaround 1 of ``patch_keras_for_mwms``: build from shapes, then skip Keras' own build step."""
    import keras

    x = keras.KerasTensor((per_replica_batch, *spec.input_shape), spec.input_dtype)
    y = keras.KerasTensor((per_replica_batch,), "int64")
    model._symbolic_build(data_batch=(x, y))  # type: ignore[attr-defined]
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None  # type: ignore[attr-defined]


def lenet(keras: object) -> object:
    """conv 6@5x5, avg-pool, conv 16@5x5, avg-pool, dense 120, 84, 10: 61.7k parameters."""
    layers = keras.layers  # type: ignore[attr-defined]
    return keras.Sequential(  # type: ignore[attr-defined]
        [
            keras.Input((28, 28, 1)),  # type: ignore[attr-defined]
            layers.Conv2D(6, 5, padding="same", activation="relu"),
            layers.AveragePooling2D(2),
            layers.Conv2D(16, 5, activation="relu"),
            layers.AveragePooling2D(2),
            layers.Flatten(),
            layers.Dense(120, activation="relu"),
            layers.Dense(84, activation="relu"),
            layers.Dense(CLASSES, activation="softmax"),
        ],
        name="lenet5",
    )


def resnet50(keras: object) -> object:
    """Keras' own ResNet-50, randomly initialised, on the smallest images it accepts (32x32x3): 23.6M
    parameters, 53 BatchNormalization layers; with BENCH_SYNC_BN=1 (training.py's tnt2sbn) each of
    them a tnt.SyncBatchNormalization of the same configuration."""
    model = keras.applications.ResNet50(  # type: ignore[attr-defined]
        weights=None, input_shape=(32, 32, 3), classes=CLASSES
    )
    if os.environ.get("BENCH_SYNC_BN") != "1":
        return model
    import tnt_keras as tnt

    def synchronized(layer: object) -> object:
        if isinstance(layer, keras.layers.BatchNormalization):  # type: ignore[attr-defined]
            return tnt.SyncBatchNormalization.from_config(layer.get_config())
        return layer.__class__.from_config(layer.get_config())

    return keras.models.clone_model(model, clone_function=synchronized)  # type: ignore[attr-defined]


def transformer(keras: object) -> object:
    """A BERT-style (post-LayerNorm) encoder: token embedding plus a learned position embedding,
    ``BLOCKS`` blocks of multi-head self-attention and a ReLU feed-forward layer, each added to its
    input and layer-normalised, then mean pooling and a softmax classifier: 23.0M parameters, a
    third of them in the token embedding (whose gradients are sparse). No dropout."""
    layers = keras.layers  # type: ignore[attr-defined]

    class AddPositions(layers.Layer):
        def build(self, input_shape: tuple) -> None:
            self.positions = self.add_weight(
                shape=tuple(input_shape[1:]), initializer="random_normal", name="positions"
            )

        def call(self, x: object) -> object:
            return x + self.positions

    tokens = keras.Input((SEQUENCE,), dtype="int32")  # type: ignore[attr-defined]
    h = AddPositions(name="positions")(layers.Embedding(VOCAB, WIDTH, name="tokens")(tokens))
    for i in range(BLOCKS):
        attention = layers.MultiHeadAttention(HEADS, WIDTH // HEADS, name=f"attention{i}")(h, h)
        h = layers.LayerNormalization(epsilon=1e-6, name=f"norm{i}a")(h + attention)
        hidden = layers.Dense(FEED_FORWARD, activation="relu", name=f"ff{i}a")(h)
        h = layers.LayerNormalization(epsilon=1e-6, name=f"norm{i}b")(h + layers.Dense(WIDTH, name=f"ff{i}b")(hidden))
    pooled = layers.GlobalAveragePooling1D()(h)
    outputs = layers.Dense(CLASSES, activation="softmax", name="classes")(pooled)
    return keras.Model(tokens, outputs, name="transformer")  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ModelSpec:
    """What the worker needs to know of a model: how to build it and what its inputs are."""

    build: Callable[[object], object]  # keras -> an uncompiled keras.Model
    input_shape: tuple[int, ...]  # one sample
    input_dtype: str  # float32: uniform [0, 1) values; int32: token ids in [0, VOCAB)


MODELS = {
    "lenet": ModelSpec(lenet, (28, 28, 1), "float32"),
    "resnet50": ModelSpec(resnet50, (32, 32, 3), "float32"),
    "transformer": ModelSpec(transformer, (SEQUENCE,), "int32"),
}


def synthetic(spec: ModelSpec, args: argparse.Namespace) -> tuple[object, object]:
    """``args.samples`` inputs (uniform [0, 1) floats, or uniform token ids) and random labels, from a
    fixed seed: the same for every configuration and backend."""
    import numpy as np

    rng = np.random.default_rng(args.seed)
    if spec.input_dtype == "int32":
        x = rng.integers(0, VOCAB, size=(args.samples, *spec.input_shape), dtype=np.int32)
    else:
        x = rng.random((args.samples, *spec.input_shape), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=args.samples, dtype=np.int64)
    return x, y


def dataset(tf: object, spec: ModelSpec, args: argparse.Namespace, shard_policy: object = None) -> object:
    """The same synthetic data for every configuration: inputs (uniform [0, 1) floats, or uniform
    token ids) and random labels from a fixed seed, batched with the GLOBAL batch size, cached in
    memory and repeated."""
    x, y = synthetic(spec, args)
    data = tf.data  # type: ignore[attr-defined]
    ds = data.Dataset.from_tensor_slices((x, y)).batch(args.batch, drop_remainder=True).cache().repeat()
    if shard_policy is not None:
        options = data.Options()
        options.experimental_distribute.auto_shard_policy = shard_policy
        ds = ds.with_options(options)
    return ds.prefetch(data.AUTOTUNE)


def machine_busy_seconds() -> float:
    """CPU time all processes of the machine have used since boot (from /proc/stat; NaN elsewhere), so
    that the driver can tell how much of a round's CPU went to work other than the benchmark's."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return math.nan
    # user nice system idle iowait irq softirq steal (guest time is counted in user already)
    busy = sum(fields[:8]) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")


class EpochClock:
    """Wall, process CPU and machine CPU time of one epoch after another: ``begin()`` at its start,
    ``end(loss)`` at its end, which appends the epoch's record to ``records`` and a line to
    ``BENCH_DIR/<tag>.jsonl`` (the driver's progress signal)."""

    def __init__(self, bench_dir: Path | None, tag: str) -> None:
        self.bench_dir, self.tag = bench_dir, tag
        self.records: list[dict[str, float]] = []
        self.start = (0.0, 0.0, 0.0)

    def begin(self) -> None:
        self.start = time.perf_counter(), time.process_time(), machine_busy_seconds()

    def end(self, loss: float | None) -> None:
        wall, cpu, busy = time.perf_counter(), time.process_time(), machine_busy_seconds()
        record = {
            "seconds": wall - self.start[0],
            "cpu_seconds": cpu - self.start[1],
            "machine_busy_seconds": busy - self.start[2],
            "loss": math.nan if loss is None else float(loss),
        }
        self.records.append(record)
        if self.bench_dir is not None:
            with (self.bench_dir / f"{self.tag}.jsonl").open("a") as out:
                out.write(json.dumps({"epoch": len(self.records) - 1, **record}) + "\n")


def time_epochs(keras: object, bench_dir: Path | None, tag: str) -> list[dict[str, float]]:
    """Records wall, process CPU and machine CPU time of every epoch of the ``fit`` that follows.

    Not a callback passed to ``fit``: any such callback changes what is measured. Keras dispatches
    per-batch callbacks on a background thread only while no callback defines a batch hook, and
    tnt's callback wrapper defines all of them, so a timer passed to ``fit`` would switch tnt (and
    only tnt) to Keras' synchronous dispatch. Instead, ``CallbackList.on_epoch_begin/end`` (the
    container ``fit`` builds around its callbacks) are wrapped for this process: ``fit`` runs as
    with ``verbose=0`` and no callbacks in every configuration. The epoch ends after Keras' own
    ``on_epoch_end``, which first waits for the asynchronous batch callbacks of the epoch.
    """
    clock = EpochClock(bench_dir, tag)
    callback_list = keras.callbacks.CallbackList  # type: ignore[attr-defined]
    begin, end = callback_list.on_epoch_begin, callback_list.on_epoch_end

    def on_epoch_begin(self: object, epoch: int, logs: dict | None = None) -> None:
        clock.begin()
        begin(self, epoch, logs)

    def on_epoch_end(self: object, epoch: int, logs: dict | None = None) -> None:
        end(self, epoch, logs)
        clock.end((logs or {}).get("loss"))

    callback_list.on_epoch_begin = on_epoch_begin
    callback_list.on_epoch_end = on_epoch_end
    return clock.records


def env_rank(mode: str) -> int:
    """This process's rank from its environment, before any framework has started."""
    if mode == "tnt":
        return int(os.environ.get("TNT_RANK", "0"))
    if mode == "solo":
        return int(os.environ.get("BENCH_RANK", "0"))
    if mode == "mwms":
        return int(json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0))
    if mode in ("ddp", "dp"):
        return int(os.environ.get("RANK", "0"))
    return 0


def backend() -> str:
    """Keras' backend for this process, from the environment (the driver always sets it)."""
    return os.environ.get("KERAS_BACKEND", "tensorflow")


def main() -> int:
    args = parse_args()
    started = time.perf_counter()
    bench_dir = Path(os.environ["BENCH_DIR"]) if os.environ.get("BENCH_DIR") else None
    if bench_dir is not None:
        # First thing, so that the driver can always find and stop this process.
        (bench_dir / f"{args.mode}.r{env_rank(args.mode)}.pid").write_text(str(os.getpid()))
    # Keras warns on every fit that shuffle=True does not apply to a tf.data.Dataset.
    warnings.filterwarnings("ignore", message=".*`shuffle=True` was passed.*")
    if backend() == "torch":
        return main_torch(args, bench_dir, started)
    if backend() == "jax":
        return main_jax(args, bench_dir, started)
    if args.mode == "dp":
        raise SystemExit("worker: mode dp needs KERAS_BACKEND=jax")
    if args.mode == "ddp":
        raise SystemExit("worker: mode ddp needs KERAS_BACKEND=torch")

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    configure_threads(tf)

    strategy = None
    rank, size = 0, 1
    if args.mode == "mwms":
        # Must exist before any other TF op runs (collectives are configured at context start).
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank = int(strategy.cluster_resolver.task_id)
        size = int(strategy.num_replicas_in_sync)
        patch_keras_for_mwms()

    import keras

    tnt = None
    if args.mode == "tnt":
        import tnt_keras as tnt

        rank, size = int(tnt.get_rank()), int(tnt.get_size())
    if args.mode == "solo":
        rank, size = env_rank("solo"), int(os.environ.get("BENCH_SIZE", "1"))

    tag = f"{args.mode}.r{rank}"

    spec = MODELS[args.model]
    keras.utils.set_random_seed(args.seed)
    compile_args = training_setup(keras)
    if strategy is not None:
        with strategy.scope():
            model = spec.build(keras)
            model.compile(**compile_args)
            build_from_shapes(model, spec, args.batch // size)
        ds = dataset(tf, spec, args, tf.data.experimental.AutoShardPolicy.DATA)
    else:
        model = spec.build(keras)
        if tnt is not None:
            model = tnt.Model(model)
        model.compile(**compile_args)
        # solo: batches of this rank's slice size (the slicing rule of docs/design.md), so the work per process
        # is what a tnt rank does, without the slicing map and without communication.
        local_batch = args.batch // size + (rank < args.batch % size) if args.mode == "solo" else args.batch
        ds = dataset(tf, spec, argparse.Namespace(**{**vars(args), "batch": local_batch}))

    epochs = time_epochs(keras, bench_dir, tag)
    fit_start = time.perf_counter()
    model.fit(ds, epochs=1 + args.rounds, steps_per_epoch=args.steps, verbose=0)
    fit_seconds = time.perf_counter() - fit_start
    result = run_result(args, model, rank, size, epochs, fit_seconds, started)
    result["threads"] = {
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "TF_NUM_INTRAOP_THREADS": os.environ.get("TF_NUM_INTRAOP_THREADS"),
        "intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
        "cpus": len(os.sched_getaffinity(0)),
    }
    result["jit_compile"] = bool(getattr(model, "jit_compile", False))
    result["versions"] = versions(keras, tnt, tensorflow=tf.__version__)
    publish(result, bench_dir, tag, rank)
    if strategy is not None and rank == 0:
        wait_for_other_workers(bench_dir, args.mode, size)
    return 0


# --- the torch backend -----------------------------------------------------------------------------


def configure_torch_threads(torch: object) -> None:
    """Sets torch's intra-op pool to ``MKL_NUM_THREADS``, else ``OMP_NUM_THREADS``, where set (what
    torch reads at start anyway; tnt-launch sets both to the cores per rank, the driver does the same
    for the DDP and ceiling processes). Unset, torch's default applies (one thread per core)."""
    count = os.environ.get("MKL_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
    if count:
        torch.set_num_threads(int(count))  # type: ignore[attr-defined]


def cached_batches(keras: object, x: object, y: object, args: argparse.Namespace, rank: int, size: int) -> object:
    """A ``keras.utils.PyDataset`` of ``args.steps`` batches: the global batches of ``args.batch``
    rows of ``(x, y)`` in order, repeated, each cut to the rows rank ``rank`` of ``size`` takes (the
    slicing rule of docs/design.md; all of them for ``size`` 1). Batches are views of the arrays, so
    that input costs next to nothing, as with the TensorFlow backend's cached ``tf.data``."""
    per_pass = len(x) // args.batch  # type: ignore[arg-type]
    base, extra = divmod(args.batch, size)
    start, count = rank * base + min(rank, extra), base + (1 if rank < extra else 0)

    class CachedBatches(keras.utils.PyDataset):  # type: ignore[attr-defined, name-defined, misc]
        def __len__(self) -> int:
            return args.steps

        def __getitem__(self, i: int) -> tuple[object, object]:
            begin = (i % per_pass) * args.batch + start
            return x[begin : begin + count], y[begin : begin + count]  # type: ignore[index]

    return CachedBatches()


def train_ddp(
    keras: object, torch: object, model: object, batches: object, args: argparse.Namespace, clock: EpochClock
) -> None:
    """Keras' DDP recipe: the Keras model in ``DistributedDataParallel`` (which broadcasts rank 0's
    weights when it wraps it), a plain loop of ``zero_grad``, forward, the Keras loss, backward
    (where DDP averages the gradients over the ranks, overlapped with backward, in 25 MB buckets),
    ``torch.optim.SGD.step``. Epochs are timed like ``fit``'s; an epoch's loss is the mean over its
    steps and the ranks (one allreduce after the epoch's clock stopped)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model)
    trainable = [p for p in model.parameters() if p.requires_grad]  # type: ignore[attr-defined]
    optimizer = torch.optim.SGD(trainable, lr=LEARNING_RATE)  # type: ignore[attr-defined]
    loss_fn = keras.losses.SparseCategoricalCrossentropy()  # type: ignore[attr-defined]
    data = [
        tuple(torch.from_numpy(a) for a in batches[i])  # type: ignore[attr-defined, index]
        for i in range(len(batches))  # type: ignore[arg-type]
    ]
    for _ in range(1 + args.rounds):
        total = torch.zeros((), dtype=torch.float64)  # type: ignore[attr-defined]
        clock.begin()
        for step in range(args.steps):
            x, y = data[step % len(data)]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(y, ddp(x, training=True))
            loss.backward()
            optimizer.step()
            total += loss.detach()
        clock.end(None)
        dist.all_reduce(total)
        clock.records[-1]["loss"] = float(total) / (args.steps * dist.get_world_size())


def main_torch(args: argparse.Namespace, bench_dir: Path | None, started: float) -> int:
    """The worker on Keras' torch backend: modes keras, tnt, ddp and solo."""
    if args.mode == "mwms":
        raise SystemExit("worker: MultiWorkerMirroredStrategy needs KERAS_BACKEND=tensorflow")
    import torch

    configure_torch_threads(torch)
    import keras

    tnt = None
    rank, size = 0, 1
    if args.mode == "tnt":
        import tnt_keras as tnt

        rank, size = int(tnt.get_rank()), int(tnt.get_size())
    elif args.mode == "solo":
        rank, size = env_rank("solo"), int(os.environ.get("BENCH_SIZE", "1"))
    elif args.mode == "ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://")
        rank, size = dist.get_rank(), dist.get_world_size()
    tag = f"{args.mode}.r{rank}"

    spec = MODELS[args.model]
    keras.utils.set_random_seed(args.seed)
    x, y = synthetic(spec, args)
    model = spec.build(keras)
    # keras and tnt: global batches (tnt slices them per rank itself); solo and ddp: this process's rows
    # of every global batch.
    sliced = args.mode in ("solo", "ddp")
    batches = cached_batches(keras, x, y, args, rank if sliced else 0, size if sliced else 1)
    clock = EpochClock(bench_dir, tag)
    fit_start = time.perf_counter()
    if args.mode == "ddp":
        train_ddp(keras, torch, model, batches, args, clock)
        records = clock.records
    else:
        if tnt is not None:
            model = tnt.Model(model)
        model.compile(**training_setup(keras))
        records = time_epochs(keras, bench_dir, tag)
        model.fit(batches, epochs=1 + args.rounds, steps_per_epoch=args.steps, shuffle=False, verbose=0)
    fit_seconds = time.perf_counter() - fit_start
    result = {"backend": "torch", **run_result(args, model, rank, size, records, fit_seconds, started)}
    result["threads"] = {
        "backend": "torch",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS"),
        "intra_op": torch.get_num_threads(),
        "inter_op": torch.get_num_interop_threads(),
        "cpus": len(os.sched_getaffinity(0)),
    }
    result["tensorflow_imported"] = "tensorflow" in sys.modules
    result["versions"] = versions(keras, tnt, torch=torch.__version__)
    publish(result, bench_dir, tag, rank)
    if args.mode == "ddp":
        dist.destroy_process_group()
    return 0


def main_jax(args: argparse.Namespace, bench_dir: Path | None, started: float) -> int:
    """The worker on Keras' JAX backend: modes keras, tnt, solo and dp. ``dp`` is Keras' own recipe
    for several processes: ``jax.distributed`` (coordinator at ``MASTER_ADDR:MASTER_PORT``, JAX's
    gloo collectives between CPU processes) and ``keras.distribution.DataParallel`` over every
    process's device, with ``auto_shard_dataset=False``: each process feeds its own rows of every
    global batch, which Keras assembles into the global batch of the compiled step."""
    if args.mode in ("mwms", "ddp"):
        raise SystemExit(f"worker: mode {args.mode} needs another KERAS_BACKEND")
    import jax

    rank, size = 0, 1
    if args.mode == "dp":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        rank, size = env_rank("dp"), int(os.environ["WORLD_SIZE"])
        coordinator = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        jax.distributed.initialize(coordinator, num_processes=size, process_id=rank)
    import keras

    tnt = None
    if args.mode == "tnt":
        import tnt_keras as tnt

        rank, size = int(tnt.get_rank()), int(tnt.get_size())
    elif args.mode == "solo":
        rank, size = env_rank("solo"), int(os.environ.get("BENCH_SIZE", "1"))
    if args.mode == "dp":
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=jax.devices(), auto_shard_dataset=False)
        )
    tag = f"{args.mode}.r{rank}"
    spec = MODELS[args.model]
    keras.utils.set_random_seed(args.seed)
    x, y = synthetic(spec, args)
    model = spec.build(keras)
    sliced = args.mode in ("solo", "dp")
    batches = cached_batches(keras, x, y, args, rank if sliced else 0, size if sliced else 1)
    if tnt is not None:
        model = tnt.Model(model)
    model.compile(**training_setup(keras))
    records = time_epochs(keras, bench_dir, tag)
    fit_start = time.perf_counter()
    model.fit(batches, epochs=1 + args.rounds, steps_per_epoch=args.steps, shuffle=False, verbose=0)
    fit_seconds = time.perf_counter() - fit_start
    result = {"backend": "jax", **run_result(args, model, rank, size, records, fit_seconds, started)}
    result["threads"] = {
        "backend": "jax",
        "XLA_FLAGS": os.environ.get("XLA_FLAGS"),
        "cpus": len(os.sched_getaffinity(0)),
    }
    result["tensorflow_imported"] = "tensorflow" in sys.modules
    result["versions"] = versions(keras, tnt, jax=jax.__version__)
    publish(result, bench_dir, tag, rank)
    if args.mode == "dp":
        jax.distributed.shutdown()
    return 0


def run_result(
    args: argparse.Namespace, model: Any, rank: int, size: int, epochs: list, fit_seconds: float, started: float
) -> dict[str, Any]:
    """What every worker reports of its run, on any backend (each adds its threads and versions)."""
    return {
        "mode": args.mode,
        "model": args.model,
        "parameters": int(model.count_params()),
        "rank": rank,
        "size": size,
        "pid": os.getpid(),
        "batch": args.batch,
        "steps": args.steps,
        "warmup": epochs[:1],
        "rounds": epochs[1:],
        "fit_seconds": fit_seconds,
        "process_seconds": time.perf_counter() - started,
    }


def versions(keras: Any, tnt: Any, **framework: str) -> dict[str, str]:
    found = {**framework, "keras": keras.__version__}
    if tnt is not None:
        found["tnt_keras"] = getattr(tnt, "__version__", "?")
    return found


def publish(result: dict[str, Any], bench_dir: Path | None, tag: str, rank: int) -> None:
    """Leaves the result for the driver: in the bench folder, and on rank 0's output."""
    if bench_dir is not None:
        (bench_dir / f"{tag}.json").write_text(json.dumps(result))
    if rank == 0:
        print(RESULT_PREFIX + json.dumps(result), flush=True)


def wait_for_other_workers(bench_dir: Path | None, mode: str, size: int, limit_s: float = 30.0) -> None:
    """MWMS worker 0 hosts TF's coordination service; when it exits first, the other workers' heartbeats
    fail during their shutdown ("Failed to send RPC to coordination service") and they may exit with
    an error. So it waits (at most ``limit_s``) until the others' processes are gone."""
    if bench_dir is None:
        return
    deadline = time.monotonic() + limit_s
    for rank in range(1, size):
        pid_file = bench_dir / f"{mode}.r{rank}.pid"
        while time.monotonic() < deadline:
            try:
                os.kill(int(pid_file.read_text().strip()), 0)
            except (OSError, ValueError):
                break  # gone (or never started: nothing to wait for)
            time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
