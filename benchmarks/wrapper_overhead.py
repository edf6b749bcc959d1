"""What wrapping a model in ``tnt.Model`` costs on one rank, where nothing is communicated.

One process builds the same model of benchmarks/training.py twice, plain and wrapped in
``tnt.Model``, warms both up, then alternates their epochs (ABBA), so that both see the same machine
and the same moment of its load; it prints the median ratio of their step times. Measured between
processes, as training.py's ``keras`` and ``tnt1`` configurations do, the same plain Keras run
varies by more than the bar of 3% on a shared machine.

    tnt-launch -n 1 -- benchmarks/wrapper_overhead.py --backend jax [--model lenet]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BACKENDS = ("tensorflow", "torch", "jax")
BATCHES = {"lenet": 256, "resnet50": 16, "transformer": 16}  # training.py's global batches (its BENCHES)


def measure(keras: Any, tnt: Any, worker: Any, args: argparse.Namespace) -> str:
    """The ABBA rounds of ``args.model``, as one line of text."""
    if tnt.get_size() != 1:
        raise SystemExit("the overhead is measured on one rank: tnt-launch -n 1")
    data = argparse.Namespace(
        batch=args.batch or BATCHES[args.model], steps=args.steps, samples=4096, seed=1, model=args.model
    )
    spec = worker.MODELS[args.model]

    def compiled(wrap: bool) -> Any:
        keras.utils.set_random_seed(1)
        model = spec.build(keras)
        model = tnt.Model(model) if wrap else model
        model.compile(**worker.training_setup(keras))
        return model

    models = {"plain": compiled(wrap=False), "tnt": compiled(wrap=True)}
    if keras.backend.backend() == "tensorflow":  # training.py's input there: a cached tf.data of global batches
        import tensorflow as tf

        batches = worker.dataset(tf, spec, data)
    else:
        x, y = worker.synthetic(spec, data)
        batches = worker.cached_batches(keras, x, y, data, 0, 1)
    for model in models.values():
        model.fit(batches, epochs=1, steps_per_epoch=args.steps, shuffle=False, verbose=0)  # warm-up
    ratios: list[float] = []
    times: dict[str, list[float]] = {name: [] for name in models}
    for round_ in range(2 * args.rounds):
        order = list(models) if round_ % 2 == 0 else list(reversed(models))  # ABBA
        for name in order:
            start = time.perf_counter()
            models[name].fit(batches, epochs=1, steps_per_epoch=args.steps, shuffle=False, verbose=0)
            times[name].append((time.perf_counter() - start) * 1000 / args.steps)
        ratios.append(times["tnt"][-1] / times["plain"][-1])
    return (
        f"{args.model} B={data.batch}, Keras on {keras.backend.backend()}, 1 process, {len(ratios)} rounds of "
        f"{args.steps} steps: plain Keras {statistics.median(times['plain']):.1f} ms/step, tnt.Model "
        f"{statistics.median(times['tnt']):.1f}; tnt/plain median {statistics.median(ratios):.3f} "
        f"(min {min(ratios):.3f}, max {max(ratios):.3f})"
    )


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=BACKENDS, default=os.environ.get("KERAS_BACKEND", "tensorflow"))
    parser.add_argument("--model", choices=sorted(BATCHES), default="lenet")
    parser.add_argument("--batch", type=int, help="global batch (default: the benchmark's for the model)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3, help="ABBA pairs: 2 x rounds ratios")
    return parser


def main() -> None:
    args = arguments().parse_args()
    os.environ["KERAS_BACKEND"] = args.backend  # before Keras is imported
    import keras
    import tnt_keras as tnt

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _training_worker as worker

    print(measure(keras, tnt, worker, args), flush=True)


if __name__ == "__main__":
    main()
