"""An elastic fit (tnt-launch --elastic) that loses ranks, each killed (SIGKILL) at a point the
arguments name, and what the survivors end with, against serial Keras on the same global batches:
weights, optimizer state, every epoch's logs (History, validation included) and a later evaluate.

Arguments: kills as MEMBER@EPOCH:WHERE[:BATCH[:GENERATION]], MEMBER being the rank in the job's
first generation, GENERATION the job's generation the kill is made in (default 0, the first),
WHERE one of "batch" (before training batch BATCH of epoch EPOCH), "stop" (there, but stopped by
SIGSTOP instead: the others time out, and tnt-launch ends it), "metrics" (inside
training batch BATCH of epoch EPOCH, after its gradient sum, before its metric sum), "epoch_end" (at
the end of epoch EPOCH, after its validation), "checkpoint" (with "files", in the ModelCheckpoint's
save at the end of epoch EPOCH, before the master writes), "validation" (before validation batch BATCH of epoch
EPOCH), "evaluate" (before batch BATCH of the evaluate after the fit), "predict" (before batch
BATCH of the predict after that), "nested" (before batch BATCH of a predict that every rank makes
at the end of epoch EPOCH, inside the fit), "fit_end" or "evaluate_end" (in the closing collective of the fit
or of the evaluate after it, which the job then makes of sends and receives: member MEMBER takes
every rank's part, answers the first BATCH other ranks, which go on to the next call, and is killed
before it answers the rest, which fail in it; in whatever generation it then is), "end_exchange" (the
same, in a collective of epoch EPOCH's end that a callback makes through tnt's epoch-end journal: the
ranks answered go on to the next one, the others take its result from them; in the kill's
GENERATION), "healed" (torch, or JAX with "model=syncbn": in training batch BATCH of epoch EPOCH,
the step's last sum, which member MEMBER answers for the first other rank only before it is killed:
that rank finishes the step, the others take it from that one: ScriptedLastSum); or MEMBER@step:K:F, killed
F times the length of its last step after its K-th training batch began (redone ones counted too),
wherever it is then. "epochs=N" trains N epochs (default 4); "first_fit=E" trains them in two
fits, the first to epoch E, the second on from there (the History reported is the second's, which
must not be disturbed by what the first left behind); "data=tfdata|pydataset|stream" trains on
the arrays' global batches in one of those (stream: a torch DataLoader over an IterableDataset);
"data=pydataset-reordered" on a PyDataset that puts them in a new order at every epoch's end;
"data=dataloader" on a torch DataLoader that shuffles them anew every epoch from a seeded
generator, read ahead by a worker (serial Keras on the same loader); "data=own-sampler" on a
DataLoader whose batch sampler of the user's own shuffles from a numpy state (tnt cannot read
it), read ahead by a worker; "data=tfdata-shuffled" on a tf.data pipeline that shuffles the
arrays anew every epoch (seeded), and validates on one (serial Keras on the same pipelines, in one
fit); "model=syncbn" puts a SyncBatchNormalization into the
model; "class_weight" weights class 1 three times class 0; "files" adds a CSVLogger, a ModelCheckpoint
that keeps the best epoch's model by its validation loss and a BackupAndRestore, whose files the
ranks' master writes (a lost rank 0 hands them on to the new one), against serial Keras' own, a
ReduceLROnPlateau and an EarlyStopping (file_callbacks), and prints a line per epoch (verbose=2).
"wait@EPOCH[:BATCH]": every rank waits at the start of epoch EPOCH (or of its training batch BATCH)
until a replacement rank (tnt-launch --elastic MIN:MAX) has asked the job's store to join, so that
it joins the fit there.
Every rank that is left writes its report."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import os

import signal
import sys
import threading
import time

import keras
import numpy as np
import tnt_comm
import tnt_keras as tnt
from _job import report
from tnt_keras import call_boundary

EPOCHS, BATCH, FIRST_FIT, DATA, MODEL, WEIGHTS, STEPS = 4, 24, 0, "arrays", "dense", None, None
FILES = "files" in sys.argv[1:]
for arg in sys.argv[1:]:
    if arg.startswith("epochs="):
        EPOCHS = int(arg.split("=")[1])
    if arg.startswith("first_fit="):
        FIRST_FIT = int(arg.split("=")[1])
    if arg.startswith("data="):
        DATA = arg.split("=")[1]
    if arg.startswith("model="):
        MODEL = arg.split("=")[1]
    if arg.startswith("steps_per_epoch="):
        STEPS = int(arg.split("=")[1])
    if arg == "class_weight":
        WEIGHTS = {0: 1.0, 1: 3.0}
x = np.random.RandomState(0).rand(96, 8).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 4).astype("float32")
x_val, y_val = x[:48] * 0.5, y[:48]

kills, wait_at = [], None
in_generation = {}  # a kill's generation of the job, where not its first (MEMBER@EPOCH:WHERE:BATCH:GENERATION)
for arg in [a for a in sys.argv[1:] if "@" in a]:
    member, rest = arg.split("@")
    if member == "wait":
        epoch, _, batch = rest.partition(":")
        wait_at = (int(epoch), int(batch or 0))
        continue
    epoch, where, *batch = rest.split(":")
    if epoch == "step":
        kills.append((int(member), int(where), "step", float(batch[0])))
        continue
    kills.append((int(member), int(epoch), where, int(batch[0]) if batch else 0))
    if len(batch) > 1:
        in_generation[kills[-1]] = int(batch[1])
member = tnt_comm.membership()[1][tnt_comm.rank()]  # its rank in the first generation, or its id as a replacement
CLOSING = {"fit_end": 0, "evaluate_end": 1}  # the calls whose closing collective a kill may name, by count
real_closing = call_boundary._closing_collective


def scripted_closing(count: int) -> None:
    """The closing collective of the call a kill names, as sends and receives whose order the test
    sets (it still passes on a rank only once every rank entered it); any other, the real one."""
    members = tnt_comm.membership()[1]
    named = [(who, answered) for who, _, at, answered in kills if CLOSING.get(at) == count and who in members]
    if not named:
        return real_closing(count)
    who, answered = named[0]
    victim = members.index(who)
    others = [r for r in range(tnt_comm.size()) if r != victim]
    part = np.zeros(1, np.int64)
    if tnt_comm.rank() != victim:
        tnt_comm.send(np.array([count], np.int64), victim)
        tnt_comm.recv(part, victim)  # the ranks not answered fail here
        tnt_comm.send(part, victim)  # received: the victim may die
        return None
    for r in others:
        tnt_comm.recv(part, r)
    for r in others[:answered]:
        tnt_comm.send(part, r)
    for r in others[:answered]:
        tnt_comm.recv(part, r)
    os.kill(os.getpid(), signal.SIGKILL)


call_boundary._closing_collective = scripted_closing


class EndExchange(keras.callbacks.Callback):
    """A collective at every epoch's end, through tnt's journal of them (tnt_keras/epoch_end.py): where
    a kill names it, in the kill's generation, made of sends and receives whose order the test sets
    (as scripted_closing's); elsewhere an allreduce. Either way its result is 100 + the epoch, which
    every rank records: one that took it from another survivor records the same."""

    def __init__(self) -> None:
        super().__init__()
        self.results = []

    def on_epoch_end(self, epoch, logs=None):
        from tnt_keras import epoch_end

        self.results.append(int(epoch_end.collective(lambda: self._exchange(epoch))[0]))

    def _exchange(self, epoch):
        generation, members = tnt_comm.membership()
        named = [(kill[0], kill[3]) for kill in kills if kill[2] == "end_exchange" and kill[1] == epoch
                 and kill[0] in members and generation == in_generation.get(kill, 0)]
        if not named:
            return tnt_comm.allreduce(np.array([100 + epoch], np.int64), op="max")
        who, answered = named[0]
        victim = members.index(who)
        part = np.array([100 + epoch], np.int64)
        if tnt_comm.rank() != victim:
            tnt_comm.send(part, victim)
            tnt_comm.recv(part, victim)  # the ranks not answered fail here
            return part
        for r in range(tnt_comm.size()):
            if r != victim:
                tnt_comm.recv(part, r)
        for r in [r for r in range(tnt_comm.size()) if r != victim][:answered]:
            tnt_comm.send(part, r)
        time.sleep(0.5)  # the answered ranks go on to the next collective of the epoch's end
        os.kill(os.getpid(), signal.SIGKILL)


end_exchange = EndExchange()


class WatchedMae(keras.metrics.MeanAbsoluteError):
    """Keras' MAE, whose update (after the step's gradient sum) is a place to be killed at."""

    def update_state(self, *args, **kwargs):
        if keras.backend.backend() == "tensorflow":  # traced once: the call is put into the step's graph
            import tensorflow as tf

            tf.py_function(killer.in_metrics, [], [])
        else:
            killer.in_metrics()
        return super().update_state(*args, **kwargs)


class Rows(keras.metrics.Sum):
    """The rows a step (or an epoch) took, over all ranks: a batch counted twice, or a slice that is
    not this rank's (every rank validating whole batches), shows in the logs."""

    def update_state(self, y_true, y_pred, sample_weight=None):
        return super().update_state(keras.ops.ones_like(y_true[:, 0]))

    def result(self):  # Keras-torch's is the state itself, which the validation after an epoch overwrites
        return keras.ops.copy(super().result())


def build(serial: bool = False) -> keras.Model:
    """Dense, Dense; with "model=syncbn" a SyncBatchNormalization between them (its serial reference:
    BatchNormalization), whose moving statistics a lost step's forward pass has already changed."""
    keras.utils.set_random_seed(7)
    if MODEL == "syncbn":
        norm = keras.layers.BatchNormalization(momentum=0.8) if serial else tnt.SyncBatchNormalization(momentum=0.8)
        hidden = [keras.layers.Dense(16, use_bias=False), norm, keras.layers.Activation("relu")]
    else:
        hidden = [keras.layers.Dense(16, activation="relu")]
    model = keras.Sequential([keras.Input((8,)), *hidden, keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse",
                  metrics=[WatchedMae(name="mae"), Rows(name="rows")])
    return model


def replacement_waits() -> bool:
    """Whether a replacement asked the job's store (tnt-launch's) to join: its ``joiners`` count."""
    import socket
    import struct

    token = os.environ["TNT_JOB_TOKEN"].encode()
    key = f"{os.environ['TNT_JOB_ID']}/elastic/joiners".encode()
    with socket.create_connection((os.environ["TNT_MASTER_ADDR"], int(os.environ["TNT_MASTER_PORT"])), 5) as s:
        s.sendall(b"TNT1" + struct.pack("<I", len(token)) + token)
        assert s.recv(1) == b"K"
        s.sendall(b"T" + struct.pack("<I", len(key)) + key + struct.pack("<I", 0))
        (length,) = struct.unpack("<I", s.recv(4, socket.MSG_WAITALL))
        return s.recv(length, socket.MSG_WAITALL).startswith(b"1")


class Killer(keras.callbacks.Callback):
    """Kills this rank where the arguments say, in the job's first generation (or the one a kill names)."""

    def __init__(self) -> None:
        super().__init__()
        self.epoch, self.batch, self.evaluating, self.training, self.armed = -1, 0, False, False, True
        self.began, self.last_began, self.step_seconds = 0, None, 0.0
        self.nested = False
        self.ends = []  # the epochs whose end this callback saw, in order

    def _maybe(self, where: str, batch: int = 0) -> None:
        if not self.armed:
            return
        generation = tnt_comm.membership()[0]
        for kill in kills:
            who, epoch, at, at_batch = kill
            if generation != in_generation.get(kill, 0):
                continue
            after_fit = where in ("evaluate", "predict")
            if who == member and at == where and at_batch == batch and (after_fit or epoch == self.epoch):
                os.kill(os.getpid(), signal.SIGKILL)
            if who == member and at == "stop" and where == "batch" and at_batch == batch and epoch == self.epoch:
                os.kill(os.getpid(), signal.SIGSTOP)

    def _wait_for_a_replacement(self, epoch, batch):
        if (epoch, batch) == wait_at and "TNT_JOIN" not in os.environ and tnt_comm.size() < 4:
            deadline = time.monotonic() + 120
            while not replacement_waits() and time.monotonic() < deadline:
                time.sleep(0.05)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self._wait_for_a_replacement(epoch, 0)

    def on_train_batch_begin(self, batch, logs=None):
        self.batch, self.training = batch, True
        if scripted_sum is not None:
            scripted_sum.batch_begins()
        self._maybe("batch", batch)
        if batch > 0:
            self._wait_for_a_replacement(self.epoch, batch)
        now = time.monotonic()
        if self.last_began is not None:
            self.step_seconds = now - self.last_began
        self.began, self.last_began = self.began + 1, now
        for who, k, at, fraction in kills:
            if who == member and at == "step" and k == self.began:
                timer = threading.Timer(fraction * self.step_seconds, os.kill, (os.getpid(), signal.SIGKILL))
                timer.daemon = True
                timer.start()

    def on_train_batch_end(self, batch, logs=None):
        self.training = False

    def in_metrics(self):
        if self.training:
            self._maybe("metrics", self.batch)

    def on_epoch_end(self, epoch, logs=None):
        self._maybe("epoch_end")
        if any(at == "nested" and at_epoch == epoch for _, at_epoch, at, _ in kills):
            self.nested = True  # a predict inside the fit, on every rank: part of the fit
            watched = [tnt.callbacks.Callback(self, aggregate_logs=False)]
            model.predict(x_val, batch_size=BATCH, verbose=0, callbacks=watched)
            self.nested = False
        self.ends.append(epoch)  # a callback that counts epochs (EarlyStopping) must see each end once

    def on_predict_batch_begin(self, batch, logs=None):
        self._maybe("nested" if self.nested else "predict", batch)

    def on_test_batch_begin(self, batch, logs=None):
        self._maybe("evaluate" if self.evaluating else "validation", batch)


killer = Killer()
model = tnt.Model(build())


class ScriptedLastSum:
    """With a "healed" kill: the step's last sum, of its metric states, in the training batch the
    kill names, as sends and receives. The member named takes every rank's part, answers the first
    other rank with the sum (which finishes the step and goes on into the next) and is killed before
    it answers the rest, which fail in it. Every other sum is the real one. On torch that sum is the
    metric states' (``summed_values``), made eagerly; on JAX with "model=syncbn" every sum of a step
    goes through tnt's Python callback (not XLA's handler), the metric states' last."""

    def __init__(self) -> None:
        self.made = 0  # the sums made since the training batch began
        self.per_step: int | None = None  # how many a step makes (JAX): counted in the fit's first step
        if keras.backend.backend() == "jax":
            from tnt_keras.backends.jax import collectives

            self.real = collectives._sum_on_host
            collectives._sum_on_host = self._on_host  # before any step is traced: the callbacks call it by name
        else:
            from tnt_keras.backends import torch as backend

            self.real, self.per_step = backend.summed_values, 1  # the step's first: its metric states'
            backend.summed_values = self._metric_states

    def batch_begins(self) -> None:
        if self.per_step is None and killer.began == 1:  # the sums of the fit's first step, nothing else
            self.per_step = self.made
        self.made = 0

    def _victim(self) -> int | None:
        """The rank that answers this sum, where it is the one a kill names."""
        self.made += 1
        generation, members = tnt_comm.membership()
        named = [who for kill in kills for who, epoch, at, batch in [kill]
                 if at == "healed" and (epoch, batch) == (killer.epoch, killer.batch) and killer.training
                 and generation == in_generation.get(kill, 0) and who in members and self.made == self.per_step]
        return members.index(named[0]) if named else None

    def _on_host(self, threshold, rows, *arrays):
        victim = self._victim()
        if victim is None:
            return self.real(threshold, rows, *arrays)
        from tnt_keras.backends.jax import collectives

        try:
            return self._split(self._answered_by(victim, [np.asarray(a) for a in arrays]), arrays)
        except tnt_comm.TntError as error:  # as the real one keeps it, for tnt to raise as tnt-comm's
            found = tnt_comm.error_data(error)
            if isinstance(found, dict):
                collectives._failure.keep(found)
            raise

    def _metric_states(self, variables):
        victim = self._victim()
        if victim is None:
            return self.real(variables)
        from tnt_keras.backends.torch import steps

        values = [v.detach().to("cpu").numpy() for v in steps.contributed(variables)]
        sums = self._split(self._answered_by(victim, values), values)
        return [keras.ops.convert_to_tensor(total).to(v.value.device) for total, v in zip(sums, variables, strict=True)]

    @staticmethod
    def _split(total, like):
        sums, offset = [], 0
        for a in like:
            size = int(np.prod(np.shape(a)))
            sums.append(total[offset:offset + size].reshape(np.shape(a)).astype(a.dtype))
            offset += size
        return sums

    @staticmethod
    def _answered_by(victim: int, host: list):
        assert all(a.dtype == np.float32 for a in host), [a.dtype for a in host]
        flat = np.concatenate([a.reshape(-1) for a in host])
        others = [r for r in range(tnt_comm.size()) if r != victim]
        total, ack = np.empty_like(flat), np.zeros(1, np.int64)
        if tnt_comm.rank() != victim:
            tnt_comm.send(flat, victim)
            tnt_comm.recv(total, victim)  # the ranks not answered fail here
            tnt_comm.send(ack, victim)  # received: the victim may die
            return total
        parts = {tnt_comm.rank(): flat}
        for r in others:
            parts[r] = np.empty_like(flat)
            tnt_comm.recv(parts[r], r)
        total = np.sum([parts[r] for r in range(tnt_comm.size())], axis=0, dtype=np.float32)
        tnt_comm.send(total, others[0])
        tnt_comm.recv(ack, others[0])
        os.kill(os.getpid(), signal.SIGKILL)


scripted_sum = ScriptedLastSum() if any(at == "healed" for _, _, at, _ in kills) else None


class Batches(keras.utils.PyDataset):
    """The training arrays' batches, in order."""

    def __len__(self):
        return len(x) // BATCH

    def __getitem__(self, i):
        return x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]


class ReorderedBatches(Batches):
    """The same batches, put in a new order at every epoch's end from a numpy state of its own (tnt
    cannot set it back)."""

    def __init__(self):
        super().__init__()
        self.state, self.order = np.random.RandomState(5), np.arange(len(self))

    def __getitem__(self, i):
        return super().__getitem__(int(self.order[i]))

    def on_epoch_end(self):
        self.order = self.state.permutation(len(self))


# One for both fits (its order goes on from the first to the second), as serial Keras' one fit.
REORDERED = ReorderedBatches() if DATA == "pydataset-reordered" else None


def training_data() -> dict:
    """What fit trains and validates on: the arrays themselves, or their global batches in order as
    a tf.data pipeline, a PyDataset or a torch DataLoader over an IterableDataset
    ("data=tfdata|pydataset|stream"), shuffled by a torch DataLoader
    ("data=dataloader"), or a tf.data pipeline that shuffles them anew every epoch
    ("data=tfdata-shuffled")."""
    validation = {"validation_data": (x_val, y_val)}
    if DATA == "tfdata-shuffled":
        import tensorflow as tf

        assert not FIRST_FIT, "one fit: the serial fit's shuffles go on from epoch to epoch"
        shuffled = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=5).batch(BATCH)
        return {"x": shuffled, "validation_data": tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(BATCH)}
    if DATA == "tfdata":
        import tensorflow as tf

        return {"x": tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH), **validation}
    if DATA == "tfdata-repeated":
        import tensorflow as tf

        return {"x": tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat(), **validation}
    if DATA == "pydataset":
        return {"x": Batches(), **validation}
    if DATA == "pydataset-reordered":
        return {"x": REORDERED, **validation}
    if DATA in LOADERS:
        return {"x": LOADER, **validation}
    if DATA == "stream":
        import torch

        class Stream(torch.utils.data.IterableDataset):
            def __iter__(self):
                for row in range(len(x)):
                    yield torch.from_numpy(x[row]), torch.from_numpy(y[row])

        return {"x": torch.utils.data.DataLoader(Stream(), batch_size=BATCH), **validation}
    return {"x": x, "y": y, "batch_size": BATCH, **validation}


def shuffled_loader():
    """A torch DataLoader of the arrays that shuffles them anew every epoch from a seeded generator of
    its own, its worker reading two batches ahead."""
    import torch

    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=BATCH, shuffle=True,
        generator=torch.Generator().manual_seed(5), num_workers=1, prefetch_factor=2)


class OwnShuffle:
    """A batch sampler of the user's own that shuffles from a numpy state of its own, which tnt
    cannot read or set: a new order each pass, drawn as the pass begins."""

    def __init__(self, rows: int, seed: int) -> None:
        self.rows, self.state = rows, np.random.RandomState(seed)

    def __len__(self) -> int:
        return -(-self.rows // BATCH)

    def __iter__(self):
        order = self.state.permutation(self.rows)
        for start in range(0, self.rows, BATCH):
            yield order[start:start + BATCH].tolist()


def own_sampler_loader():
    """A torch DataLoader of the arrays batched by ``OwnShuffle``, its worker reading two batches ahead."""
    import torch

    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)),
        batch_sampler=OwnShuffle(len(x), 5), num_workers=1, prefetch_factor=2)


# One loader for both fits (its generator goes on from the first to the second), as serial Keras' one fit.
LOADERS = {"dataloader": shuffled_loader, "own-sampler": own_sampler_loader}
LOADER = LOADERS[DATA]() if DATA in LOADERS else None


class WatchedCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keras' ModelCheckpoint, whose save (on the job's master, before it writes) is a place to be killed at."""

    def _save_model(self, epoch, batch, logs):
        killer._maybe("checkpoint")
        return super()._save_model(epoch, batch, logs)


def file_callbacks(folder: str, checkpoint=keras.callbacks.ModelCheckpoint) -> list:
    """A CSV of every epoch's logs, the model of the epoch with the least validation loss, a backup,
    and two callbacks that decide from what they saw so far: one that halves the learning rate at
    every epoch's end after the first (the validation loss never rises: it waits for a rise), and
    an EarlyStopping that waits for a rise too (never stopping), whose count and best value are
    reported."""
    os.makedirs(folder, exist_ok=True)
    return [keras.callbacks.CSVLogger(os.path.join(folder, "log.csv")),
            checkpoint(os.path.join(folder, "best.keras"), save_best_only=True),
            keras.callbacks.BackupAndRestore(os.path.join(folder, "backup"), delete_checkpoint=False),
            keras.callbacks.ReduceLROnPlateau(mode="max", patience=1, factor=0.5),
            keras.callbacks.EarlyStopping(mode="max", patience=100)]


def waited(callbacks: list) -> list:
    """The EarlyStopping's count of epochs without a rise, its best value and the epoch of it."""
    early = callbacks[-1]
    return [early.wait, float(early.best), early.best_epoch]


FOLDER = os.path.join(os.environ["TNT_TEST_OUT"], "files")  # one for the job: its master writes there
JOB_FILES = file_callbacks(FOLDER, WatchedCheckpoint) if FILES else []
for first, last in ([(0, FIRST_FIT)] if FIRST_FIT else []) + [(FIRST_FIT, EPOCHS)]:
    history = model.fit(**training_data(), epochs=last, initial_epoch=first, shuffle=False, verbose=2 if FILES else 0,
                        steps_per_epoch=STEPS,
                        class_weight=WEIGHTS,
                        callbacks=[*JOB_FILES,
                                   tnt.callbacks.Callback(end_exchange, aggregate_logs=False),
                                   tnt.callbacks.Callback(killer, aggregate_logs=False)])
killer.evaluating = True
evaluated = model.evaluate(x_val, y_val, batch_size=BATCH, verbose=0, return_dict=True,
                           callbacks=[tnt.callbacks.Callback(killer, aggregate_logs=False)])
predicted = model.predict(x_val, batch_size=BATCH, verbose=0,
                          callbacks=[tnt.callbacks.Callback(killer, aggregate_logs=False)])
killer.armed = False

serial = build(serial=True)
serial_data = {"x": x, "y": y, "batch_size": BATCH, "validation_data": (x_val, y_val)}
if DATA == "tfdata-shuffled":
    serial_data = training_data()
if DATA == "pydataset-reordered":
    serial_data = {"x": ReorderedBatches(), "validation_data": (x_val, y_val)}
if DATA in LOADERS:
    serial_data = {"x": LOADERS[DATA](), "validation_data": (x_val, y_val)}
SERIAL_FOLDER = os.path.join(os.environ["TNT_TEST_OUT"], f"serial-files-{member}")
SERIAL_FILES = file_callbacks(SERIAL_FOLDER) if FILES else []
if DATA == "tfdata-repeated":
    serial_data = training_data()
serial_history = serial.fit(**serial_data, epochs=EPOCHS, shuffle=False, verbose=0, class_weight=WEIGHTS,
                            steps_per_epoch=STEPS,
                            callbacks=SERIAL_FILES)
serial_evaluated = serial.evaluate(x_val, y_val, batch_size=BATCH, verbose=0, return_dict=True)
serial_predicted = serial.predict(x_val, batch_size=BATCH, verbose=0)


def largest_difference(a, b):
    return max((float(np.max(np.abs(np.asarray(u) - np.asarray(v)))) for u, v in zip(a, b, strict=True)), default=0.0)


def values(model):
    return [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables] + model.get_weights()


def files_against_serial() -> dict:
    """The rows of the job's CSV and of serial Keras' (the job's master writes it: the one it has when a
    row is written), the largest difference of their values relative to the value, the epochs the backups hold and the
    largest difference of the best epochs' weights."""
    import csv
    import json

    rows = [list(csv.DictReader(open(os.path.join(f, "log.csv")))) for f in (FOLDER, SERIAL_FOLDER)]
    rows_error = max(abs(float(a[k]) - float(b[k])) / max(1.0, abs(float(b[k])))
                     for a, b in zip(*rows, strict=True) for k in a if k != "epoch")
    backups = [json.load(open(os.path.join(f, "backup", "training_metadata.json")))["epoch"]
               for f in (FOLDER, SERIAL_FOLDER)]
    best = [keras.saving.load_model(os.path.join(f, "best.keras"), compile=False).get_weights()
            for f in (FOLDER, SERIAL_FOLDER)]
    return {"csv_epochs": [[int(row["epoch"]) for row in r] for r in rows], "csv_error": rows_error,
            "csv_columns": [sorted(r[0]) for r in rows], "backup_epochs": backups,
            "best_error": largest_difference(*best), "waited": waited(JOB_FILES), "serial_waited": waited(SERIAL_FILES)}


generation, members = tnt_comm.membership()
report({
    **(files_against_serial() if FILES else {}),
    "member": member,
    "rank": tnt_comm.rank(),
    "size": tnt_comm.size(),
    "generation": generation,
    "members": members,
    "epochs": history.epoch,
    "ends": killer.ends,
    "end_results": end_exchange.results,
    "serial_epochs": serial_history.epoch,
    "history": history.history,
    "serial_history": serial_history.history,
    "evaluated": evaluated,
    "serial_evaluated": serial_evaluated,
    "scale": max(float(np.max(np.abs(v))) for v in values(serial)),
    "variables_error": largest_difference(values(model.model), values(serial)),
    "iterations": int(keras.ops.convert_to_numpy(model.model.optimizer.iterations)),
    "predicted_shape": list(np.shape(predicted)),
    "predict_error": largest_difference([predicted], [serial_predicted]),
    "predict_scale": float(np.max(np.abs(serial_predicted))),
})
