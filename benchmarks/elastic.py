"""What an elastic job costs: the recovery time after a rank is killed (from its death to the
survivors' first collective in the re-formed job) and the steady-state cost of TNT_ELASTIC on an
allreduce loop, each against the same job without it, in one run; then, with --keras BACKEND, the
recovery of a Keras fit under tnt-launch --elastic (from the death to the end of the first training
step of the re-formed job: re-forming, restoring the epoch's variables, tracing the step again);
with --keras-steady BACKEND, a Keras fit's step time while nothing fails, with and without --elastic
(LeNet-5 on numpy arrays, 2 ranks: the inputs an elastic fit redoes steps of; --steady-input tfdata:
a tf.data pipeline of them; dataloader: a torch DataLoader of them; --redo step|epoch: what the
elastic fit redoes, TNT_ELASTIC_REDO; --steady-verbose 0|1|2: the fit's verbose, rank 0's progress
bar, which on JAX makes Keras wait for each step's logs); with --keras-calls
BACKEND, whole evaluate and predict calls with and without --elastic (each elastic call ends with a
closing collective: tnt_keras/call_boundary.py).

    python benchmarks/elastic.py [--ranks 4] [--trials 5] [--keras torch tensorflow]
                                 [--keras-steady tensorflow torch] [--keras-calls torch]
                                 [--keras-steady jax --redo step --steady-verbose 2]
                                 (nox -s bench_elastic)

Each trial starts N ranks over shared memory (one host) or TCP (every rank a host of its own) with
`python -m tnt_comm.store` as the store that outlives them. Rank N-1 kills itself (SIGKILL) after
writing the time; every survivor notes when its first allreduce after `tnt_comm.shrink()` returned.
Recovery is the last survivor's time minus the death. Medians over the trials are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RANK = r"""
import json, os, signal, sys, time, numpy as np, tnt_comm as tc
out, kill, calls = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
x = np.ones(1 << 16, np.float32)
member = tc.rank()
for _ in range(20):
    tc.allreduce(x)
t0 = time.perf_counter()
for _ in range(calls):
    tc.allreduce(x)
per_call = (time.perf_counter() - t0) / calls
if kill and member == tc.size() - 1:
    open(out + ".death", "w").write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)
recovered = None
if kill:
    try:
        while True:
            tc.allreduce(x)
    except (tc.PeerFailure, tc.Timeout):
        tc.shrink()
        tc.allreduce(x)
        recovered = time.time()
open(f"{out}.{member}", "w").write(json.dumps({"per_call": per_call, "recovered": recovered}))
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trial(n: int, transport: str, elastic: bool, kill: bool, calls: int, folder: Path) -> dict[str, float]:
    token, job = secrets.token_hex(16), secrets.token_hex(6)
    script = folder / "rank.py"
    script.write_text(RANK)
    out = folder / job
    store = None
    if elastic:
        store = subprocess.Popen([sys.executable, "-m", "tnt_comm.store", "--host", "127.0.0.1"],
                                 env={**os.environ, "TNT_JOB_TOKEN": token}, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        assert store.stdout is not None
        port = int(store.stdout.readline())
    else:
        port = free_port()
    procs = []
    for r in range(n):
        env = {**os.environ, "TNT_RANK": str(r), "TNT_SIZE": str(n), "TNT_MASTER_ADDR": "127.0.0.1",
               "TNT_MASTER_PORT": str(port), "TNT_JOB_ID": job, "TNT_JOB_TOKEN": token,
               "TNT_NODE_RANK": str(r if transport == "tcp" else 0),
               "TNT_LOCAL_RANK": str(0 if transport == "tcp" else r),
               "TNT_LOCAL_SIZE": str(1 if transport == "tcp" else n), "TNT_TIMEOUT_S": "30",
               "OMP_NUM_THREADS": "1"}
        if elastic:
            env["TNT_ELASTIC"] = "1"
        procs.append(subprocess.Popen([sys.executable, str(script), str(out), "1" if kill else "0", str(calls)],
                                      env=env))
    try:
        for p in procs:
            p.wait(120)
    finally:
        if store is not None:
            store.terminate()
            store.wait(10)
    survivors = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(n - (1 if kill else 0))]
    result = {"per_call_us": statistics.median(s["per_call"] for s in survivors) * 1e6}
    if kill:
        death = float(Path(f"{out}.death").read_text())
        result["recovery_ms"] = (max(s["recovered"] for s in survivors) - death) * 1e3
    return result


# What the Keras scripts share: LeNet-5 wrapped by tnt, and SAMPLES random images with labels; the
# script's first argument names its output.
LENET = r"""
import json, os, signal, sys, time
import numpy as np, keras, tnt_comm, tnt_keras as tnt

out = sys.argv[1]
x = np.random.RandomState(0).rand(SAMPLES, 28, 28, 1).astype("float32")
y = np.random.RandomState(1).randint(0, 10, SAMPLES)
keras.utils.set_random_seed(7)
model = tnt.Model(keras.Sequential([
    keras.Input((28, 28, 1)), keras.layers.Conv2D(6, 5, activation="relu"), keras.layers.MaxPooling2D(),
    keras.layers.Conv2D(16, 5, activation="relu"), keras.layers.MaxPooling2D(), keras.layers.Flatten(),
    keras.layers.Dense(120, activation="relu"), keras.layers.Dense(84, activation="relu"), keras.layers.Dense(10)]))
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
"""

FIT = LENET.replace("SAMPLES", "2048") + r"""
model.compile(optimizer="sgd", loss=loss)
member = tnt_comm.rank()


class Clock(keras.callbacks.Callback):
    epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if member == 3 and self.epoch == 1 and batch == 4 and tnt_comm.membership()[0] == 0:
            open(out + ".death", "w").write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, batch, logs=None):
        if tnt_comm.membership()[0] == 1 and not os.path.exists(f"{out}.{member}"):
            open(f"{out}.{member}", "w").write(repr(time.time()))


model.fit(x, y, batch_size=256, epochs=3, shuffle=False, verbose=0,
          callbacks=[tnt.callbacks.Callback(Clock(), aggregate_logs=False)])
"""


def keras_job(code: str, backend: str, launcher_args: tuple[str, ...], folder: Path, *args: str) -> Path:
    """Runs ``code`` under tnt-launch on Keras' ``backend``; returns the path it writes its results to
    (its first argument; more of them after it)."""
    script = folder / f"{secrets.token_hex(6)}.py"
    script.write_text(code)
    out = folder / secrets.token_hex(6)
    launch = [sys.executable, "-m", "tnt_launch", "--no-gpu", *launcher_args]
    subprocess.run([*launch, "--", str(script), str(out), *args], env={**os.environ, "KERAS_BACKEND": backend},
                   check=True, capture_output=True, timeout=600)
    return out


def two_ranks(elastic: bool) -> tuple[str, ...]:
    return ("-n", "2", *(["--elastic", "1"] if elastic else []))


def abba(trial: int) -> tuple[bool, bool]:
    """Whether a pass runs without --elastic first or second: ABBA, so that a drift reaches both alike."""
    return (False, True) if trial % 2 == 0 else (True, False)


def keras_recovery(backend: str, folder: Path) -> float:
    """Seconds from rank 3's death to the last survivor's first step in the re-formed job."""
    out = keras_job(FIT, backend, ("-n", "4", "--elastic", "2", "--timeout", "60"), folder)
    death = float(Path(f"{out}.death").read_text())
    return max(float(Path(f"{out}.{m}").read_text()) for m in range(3)) - death


STEADY = LENET.replace("SAMPLES", "4096") + r"""
model.compile(optimizer="sgd", loss=loss, metrics=["accuracy"])


class Clock(keras.callbacks.Callback):
    epoch, last, steps, began, epochs = 0, None, [], 0.0, []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self.last, self.began = epoch, None, time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if epoch > 0:
            self.epochs.append(time.perf_counter() - self.began)

    def on_train_batch_begin(self, batch, logs=None):
        now = time.perf_counter()
        if self.epoch > 0 and self.last is not None:  # the first epoch traces and warms up
            self.steps.append(now - self.last)
        self.last = now


clock = Clock()
if sys.argv[2] == "tfdata":  # a pipeline that reshuffles every epoch, handed over whole in an elastic fit
    import tensorflow as tf

    data = {"x": tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=3).batch(256).prefetch(2)}
elif sys.argv[2] == "dataloader":  # a DataLoader shuffled from a seeded generator (torch): tnt's LoaderSlices
    import torch

    rows = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    data = {"x": torch.utils.data.DataLoader(rows, batch_size=256, shuffle=True,
                                             generator=torch.Generator().manual_seed(3))}
else:
    data = {"x": x, "y": y, "batch_size": 256}
model.fit(**data, epochs=4, verbose=int(sys.argv[3]), callbacks=[tnt.callbacks.Callback(clock, aggregate_logs=False)])
if tnt_comm.rank() == 0:
    open(out, "w").write(json.dumps({"steps": clock.steps, "epochs": clock.epochs}))
"""


def keras_steady_state(
    backend: str, elastic: bool, folder: Path, data: str = "arrays", redo: str = "", verbose: int = 0
) -> dict[str, list[float]]:
    """Step times (begin to begin) and epoch times (begin to end, validation-free), epochs 2-4, of
    LeNet-5 on numpy arrays (or ``data`` "tfdata": a tf.data pipeline of them; "dataloader": a torch
    DataLoader), 2 ranks, with or without --elastic (redoing ``redo``, where given), at ``verbose``."""
    launcher = two_ranks(elastic) + (("-x", f"TNT_ELASTIC_REDO={redo}") if elastic and redo else ())
    return json.loads(keras_job(STEADY, backend, launcher, folder, data, str(verbose)).read_text())


CALLS = LENET.replace("SAMPLES", "512") + r"""
model.compile(optimizer="sgd", loss=loss, metrics=["accuracy"])
model.evaluate(x, y, batch_size=256, verbose=0)  # traced, warmed up
evaluate, predict = [], []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    model.evaluate(x, y, batch_size=256, verbose=0)
    t1 = time.perf_counter()
    model.predict(x, batch_size=256, verbose=0)
    evaluate.append(t1 - t0)
    predict.append(time.perf_counter() - t1)
if tnt_comm.rank() == 0:
    open(out, "w").write(json.dumps({"evaluate": evaluate, "predict": predict}))
"""


def keras_calls(backend: str, elastic: bool, calls: int, folder: Path) -> dict[str, list[float]]:
    """Seconds of each of ``calls`` evaluate and predict calls (LeNet-5, 512 samples: 2 global batches),
    2 ranks, with or without --elastic: what each call's closing collective and its bookkeeping add."""
    return json.loads(keras_job(CALLS, backend, two_ranks(elastic), folder, str(calls)).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--keras", nargs="*", default=[], metavar="BACKEND",
                        help="also time a Keras fit's recovery on these backends (torch, tensorflow, jax)")
    parser.add_argument("--no-comm", action="store_true", help="skip the tnt-comm measurements")
    parser.add_argument("--keras-steady", nargs="*", default=[], metavar="BACKEND",
                        help="also time a Keras fit's steps while nothing fails (LeNet-5 on numpy arrays, "
                             "2 ranks), with and without --elastic, on these backends")
    parser.add_argument("--steady-input", choices=("arrays", "tfdata", "dataloader"), default="arrays",
                        help="what --keras-steady trains on: numpy arrays, a tf.data pipeline of them that "
                             "reshuffles every epoch, or a torch DataLoader of them that shuffles (torch)")
    parser.add_argument("--redo", choices=("step", "epoch"), default=None,
                        help="what --keras-steady's elastic fit redoes after a loss (TNT_ELASTIC_REDO; "
                             "default: the backend's own, the epoch on JAX, the step elsewhere)")
    parser.add_argument("--steady-verbose", type=int, choices=(0, 1, 2), default=0,
                        help="--keras-steady's verbose (rank 0's progress bar; default 0)")
    parser.add_argument("--keras-calls", nargs="*", default=[], metavar="BACKEND",
                        help="also time whole evaluate and predict calls (LeNet-5, 2 global batches, 2 ranks), "
                             "with and without --elastic, on these backends")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for backend in args.keras_steady:
            # Medians of every step, and of each pass.
            plain: list[float] = []
            elastic: list[float] = []
            pairs: list[float] = []  # each pair of neighbouring passes: with over without, per-pass medians
            epochs: dict[bool, list[float]] = {False: [], True: []}
            for trial in range(args.trials):
                runs = {flag: keras_steady_state(backend, flag, folder, args.steady_input, args.redo or "",
                                                 args.steady_verbose) for flag in abba(trial)}
                without, with_elastic = runs[False]["steps"], runs[True]["steps"]
                plain += without
                elastic += with_elastic
                pairs.append(statistics.median(with_elastic) / statistics.median(without) - 1)
                for flag in (False, True):
                    epochs[flag] += runs[flag]["epochs"]
            p, e = statistics.median(plain) * 1e3, statistics.median(elastic) * 1e3
            # Keras-JAX may dispatch a step before the one before has run (not in an elastic fit, which
            # waits for each): its step times are the times between dispatches; its epochs are whole.
            caveat = "; JAX: the times between dispatches, not the steps" if backend == "jax" else ""
            quartiles = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else pairs * 3
            how = f", verbose={args.steady_verbose}" + (f", TNT_ELASTIC_REDO={args.redo}" if args.redo else "")
            print(f"Keras fit on {backend}, LeNet-5 on {args.steady_input}, 2 ranks{how}: {p:.2f} ms per step without "
                  f"--elastic, "
                  f"{e:.2f} ms with --elastic 1 ({(e / p - 1) * 100:+.1f}%; medians of {len(plain)} and "
                  f"{len(elastic)} steps over {args.trials} alternating passes{caveat}); pass by pass: median "
                  f"{statistics.median(pairs) * 100:+.1f}%, quartiles {quartiles[0] * 100:+.1f}% and "
                  f"{quartiles[2] * 100:+.1f}%, range {min(pairs) * 100:+.1f}% to {max(pairs) * 100:+.1f}%", flush=True)
            pe, ee = (statistics.median(epochs[flag]) for flag in (False, True))
            print(f"  its epochs: {pe:.3f} s without --elastic, {ee:.3f} s with ({(ee / pe - 1) * 100:+.1f}%; "
                  f"medians of {len(epochs[False])} and {len(epochs[True])} epochs)", flush=True)
        for backend in args.keras_calls:
            # Passes alternate ABBA, as above; the medians of every call.
            runs: dict[bool, dict[str, list[float]]] = {False: {}, True: {}}
            for trial in range(args.trials):
                for elastic_job in abba(trial):
                    for call, seconds in keras_calls(backend, elastic_job, 100, folder).items():
                        runs[elastic_job].setdefault(call, []).extend(seconds)
            for call in ("evaluate", "predict"):
                p, e = (statistics.median(runs[flag][call]) * 1e3 for flag in (False, True))
                print(f"Keras {call} on {backend}, LeNet-5, 2 global batches, 2 ranks: {p:.2f} ms per call without "
                      f"--elastic, {e:.2f} ms with --elastic 1 ({e - p:+.2f} ms, {(e / p - 1) * 100:+.1f}%; medians of "
                      f"{len(runs[False][call])} calls each over {args.trials} alternating passes)", flush=True)
        for backend in args.keras:
            times = [keras_recovery(backend, folder) for _ in range(args.trials)]
            print(f"Keras fit on {backend}, 4 ranks, rank 3 killed in epoch 1: death to the next step "
                  f"{statistics.median(times):.2f} s (median of {len(times)}; min {min(times):.2f}, "
                  f"max {max(times):.2f})", flush=True)
        if args.no_comm:
            return
        print(f"{args.ranks} ranks, 256 KiB allreduce, medians of {args.trials} trials (cpus: {os.cpu_count()})")
        print(f"{'transport':<10} {'plain us/call':>14} {'elastic us/call':>16} {'ratio':>7} {'recovery ms':>12}")
        for transport in ("shm", "tcp"):
            plain, elastic, recovery = [], [], []
            for _ in range(args.trials):
                plain.append(trial(args.ranks, transport, False, False, args.calls, folder)["per_call_us"])
                elastic.append(trial(args.ranks, transport, True, False, args.calls, folder)["per_call_us"])
                recovery.append(trial(args.ranks, transport, True, True, 50, folder)["recovery_ms"])
            p, e, r = statistics.median(plain), statistics.median(elastic), statistics.median(recovery)
            print(f"{transport:<10} {p:>14.1f} {e:>16.1f} {e / p:>7.3f} {r:>12.0f}"
                  f"   (recovery min {min(recovery):.0f}, max {max(recovery):.0f})", flush=True)


if __name__ == "__main__":
    main()
